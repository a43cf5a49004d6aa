"""Lifecycle misuse (issue 20): every call made in a state that cannot serve it raises a typed
``GraphStateError`` that carries the state it found (``.state``) and what to call (``.next_call``),
and stays a RuntimeError for code that already catches one. Reading the plan list before planning is
also an AttributeError, so ``hasattr(graph, "plans")`` is False until then.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import AlreadyPlannedError, GraphStateError, NotBuiltError, NotPlannedError
from cudnn_graph.engines import manifest
from cudnn_graph.engines.base import BaseEngine, PlanConfig
from cudnn_graph.engines.reference import ReferenceEngine

FLOAT = cudnn.data_type.FLOAT


@pytest.fixture(autouse=True)
def reference_only(monkeypatch):
    """Machine-independent plan lists: the reference engine alone."""
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def relu_graph():
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[4], stride=[1])
    y = g.relu(x).set_output(True)
    return g, x, y


def buffers():
    return np.array([-1, 2, -3, 4], np.float32), np.zeros(4, np.float32)


def test_the_state_errors_keep_runtime_error_and_not_planned_is_an_attribute_error():
    assert issubclass(GraphStateError, cudnn.CudnnGraphError) and issubclass(GraphStateError, RuntimeError)
    for cls in (NotPlannedError, AlreadyPlannedError, NotBuiltError):
        assert issubclass(cls, GraphStateError)
    assert issubclass(NotPlannedError, AttributeError)
    assert not issubclass(AlreadyPlannedError, AttributeError) and not issubclass(NotBuiltError, AttributeError)
    for name in ("GraphStateError", "NotPlannedError", "AlreadyPlannedError", "NotBuiltError"):
        assert name in cudnn.__all__ and name in cudnn.errors.__all__


def test_hasattr_plans_is_false_before_planning_and_true_after():
    g, *_ = relu_graph()
    assert not hasattr(g, "plans") and not hasattr(g, "selected_plan")
    g.create_execution_plans()
    assert hasattr(g, "plans") and hasattr(g, "selected_plan")


@pytest.mark.parametrize("reader", ["plans", "selected_plan"])
def test_reading_the_plan_list_before_planning_says_what_to_call(reader):
    g, *_ = relu_graph()
    with pytest.raises(NotPlannedError) as info:
        getattr(g, reader)
    err = info.value
    assert err.state == "not planned" and "create_execution_plans()" in err.next_call
    assert err.action == f"graph.{reader}"
    assert "not planned" in str(err) and "call build() or create_execution_plans() first" in str(err)


@pytest.mark.parametrize("call, action", [
    (lambda g: g.get_workspace_size(), "get_workspace_size()"),
    (lambda g: g.get_workspace_size_plan_at_index(0), "get_workspace_size_plan_at_index()"),
    (lambda g: g.select_plan(0), "select_plan()"),
    (lambda g: g.get_plan_name_at_index(0), "get_plan_name_at_index()"),
    (lambda g: g.build_plan_at_index(0), "build_plan_at_index()"),
    (lambda g: g.compiled_plan(0), "compiled_plan()"),
    (lambda g: g.get_compiled_plan_at_index(0), "get_compiled_plan_at_index()"),
    (lambda g: g.check_support(), "check_support()"),
    (lambda g: g.build_plans(), "build_plans()"),
    (lambda g: g.execute_plan_at_index({}, index=0), "execute_plan_at_index()"),
])
def test_every_plan_state_reader_before_planning_names_itself(call, action):
    g, *_ = relu_graph()
    with pytest.raises(NotPlannedError, match="create_execution_plans") as info:
        call(g)
    assert info.value.action == action and info.value.state == "not planned"


def test_compiled_plan_of_the_selection_is_none_before_planning():
    # Documented: nothing planned means no selected plan, not an error (it is an introspection read).
    g, *_ = relu_graph()
    assert g.compiled_plan() is None


def test_execute_before_build_is_not_built():
    g, x, y = relu_graph()
    X, Y = buffers()
    with pytest.raises(NotBuiltError) as info:
        g.execute({x: X, y: Y})
    assert info.value.state == "not planned" and "build()" in info.value.next_call
    assert "execute(): " in str(info.value) and "no plan is built" in str(info.value)
    g.create_execution_plans()
    with pytest.raises(NotBuiltError) as info:
        g.execute({x: X, y: Y})
    assert info.value.state == "not built"
    assert not Y.any()                        # nothing ran


def test_get_workspace_size_after_planning_before_building_is_not_built():
    g, *_ = relu_graph()
    g.create_execution_plans()
    with pytest.raises(NotBuiltError, match="no plan is built yet") as info:
        g.get_workspace_size()
    assert info.value.state == "not built" and "build_plans()" in info.value.next_call


def test_build_twice_is_already_built_and_the_graph_still_executes():
    g, x, y = relu_graph()
    g.build()
    with pytest.raises(AlreadyPlannedError) as info:
        g.build()
    err = info.value
    assert err.action == "build()" and err.state == "already built"
    assert "select_plan(i)" in err.next_call and "already built" in str(err)
    X, Y = buffers()
    g.execute({x: X, y: Y})
    np.testing.assert_array_equal(Y, np.maximum(X, 0))


def test_build_after_create_execution_plans_is_already_planned_and_says_build_plans():
    g, *_ = relu_graph()
    g.create_execution_plans()
    with pytest.raises(AlreadyPlannedError) as info:
        g.build()
    assert info.value.state == "already planned" and "build_plans()" in info.value.next_call
    g.check_support()
    g.build_plans()                           # the advice works
    assert g.compiled_plan() is not None


def test_create_execution_plans_twice_is_already_planned():
    g, *_ = relu_graph()
    g.create_execution_plans()
    with pytest.raises(AlreadyPlannedError, match="create_execution_plans\\(\\) was already called") as info:
        g.create_execution_plans()
    assert info.value.action == "create_execution_plans()"
    assert isinstance(info.value, RuntimeError)


class _BrokenOnceEngine(BaseEngine):
    """Proposes one plan whose build fails (not a decline) the first time only."""

    name = "broken-once"
    engine_id = 30_418

    def __init__(self):
        self.failures = 1

    def propose_plans(self, graph):
        return [PlanConfig(self.engine_id, name="broken-once-0", priority=100.0)]

    def build_plan(self, graph, plan, ctx):
        if self.failures:
            self.failures -= 1
            raise OSError("the device went away")
        return ReferenceEngine().build_plan(graph, ReferenceEngine().propose_plans(graph)[0], ctx)


def test_a_build_that_built_nothing_lets_the_next_build_plan_afresh(monkeypatch):
    engine = _BrokenOnceEngine()
    monkeypatch.setattr(manifest, "_loaded", [engine])
    g, x, y = relu_graph()
    with pytest.raises(OSError):
        g.build()
    assert g.get_execution_plan_count() == 1  # the plan list stays readable
    g.build()                                 # no AlreadyPlannedError: nothing was built
    X, Y = buffers()
    g.execute({x: X, y: Y})
    np.testing.assert_array_equal(Y, np.maximum(X, 0))


def test_a_change_after_freezing_is_a_graph_state_error_saying_what_to_do():
    g, x, y = relu_graph()
    g.build()
    for change in (lambda: x.set_dim([8]), lambda: g.tensor(name="late", dim=[1]), lambda: g.relu(x)):
        with pytest.raises(cudnn.GraphFrozenError, match="can no longer change") as info:
            change()
        err = info.value
        assert isinstance(err, GraphStateError) and isinstance(err, RuntimeError)
        assert err.state == "frozen" and "build a new one" in err.next_call and err.next_call in str(err)


def test_the_plan_count_before_planning_is_zero_as_in_cudnn_pygraph():
    g, *_ = relu_graph()
    assert g.get_execution_plan_count() == 0
