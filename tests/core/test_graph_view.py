"""The engine-facing surface of a graph: GraphView, the per-engine state slot, the graph-method
extension point, the compiled-plan accessor, and the IR base class standing on its own."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _ir
from cudnn_graph.engines import manifest
from cudnn_graph.engines.base import BaseEngine, CompiledPlan, GraphView, PlanConfig
from cudnn_graph.graph import register_graph_method
from _helpers import registered

F = cudnn.data_type
VIEW_ID = 30_777


def _relu_graph():
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.HALF, device="cpu")
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    h = g.relu(x)
    y = g.relu(h).set_output(True)
    return g, x, h, y


class _SeeingPlan(CompiledPlan):
    def __init__(self, plan, engine):
        super().__init__(plan)
        self.engine = engine

    def execute(self, graph, variant_pack, ctx):
        self.engine.seen.append(("execute", type(graph)))


class _SeeingEngine(BaseEngine):
    """Records the type of the graph object every contract call receives."""
    name, engine_id = "seeing", VIEW_ID
    graph_methods = {"seeing_marks": lambda graph: graph.view.state("seeing", list)}

    def __init__(self):
        self.seen = []

    def propose_plans(self, graph):
        self.seen.append(("propose", type(graph)))
        graph.state(self, list).append("proposed")
        return [PlanConfig(VIEW_ID, name="seeing", priority=1e9)]

    def check_support(self, graph, plan):
        self.seen.append(("check", type(graph)))

    def build_plan(self, graph, plan, ctx):
        self.seen.append(("build", type(graph)))
        return _SeeingPlan(plan, self)


@pytest.fixture
def seeing():
    yield from registered(_SeeingEngine())


def test_the_view_reads_structure_and_resolved_data_types():
    g, x, h, y = _relu_graph()
    view = g.view
    assert isinstance(view, GraphView) and GraphView.of(view) is view and type(GraphView.of(g)) is GraphView
    assert view.nodes == g.nodes and view.tensors == g.tensors and view.node_count == 2
    assert view.tensor_by_uid(y.uid) is y
    assert (view.data_type(x), view.data_type(h), view.data_type(y)) == (F.FLOAT, F.HALF, F.FLOAT)
    assert [view.data_type(t) for t in g.tensors] == [t.data_type for t in g.tensors]
    assert view.device == ("cpu", 0) and view.device_code == g.device_code
    assert view.context is g.context and view.key() == g.key() and not view.frozen
    assert view.is_override_shape_enabled is False
    assert not hasattr(view, "tensor") and not hasattr(view, "relu")   # nothing that changes the graph


def test_an_intermediate_without_any_type_resolves_to_float_in_one_place():
    g = cudnn.pygraph(io_data_type=F.HALF, device="cpu")
    x = g.tensor(name="x", dim=[4], stride=[1])
    h = g.relu(x)
    g.relu(h).set_output(True)
    g.validate()
    assert h.data_type == g.view.data_type(h) == F.FLOAT


def test_each_engine_has_its_own_state_slot_shared_by_every_view_of_the_graph():
    g, *_ = _relu_graph()
    assert g.view.state("mine") is None
    made = g.view.state("mine", dict)
    made["x"] = 1
    assert g.view.state("mine") is made and g.view.state("theirs", list) == []

    class Named(BaseEngine):
        name = "mine"
    assert g.view.state(Named()) is made        # keyed by the engine's name
    other, *_ = _relu_graph()
    assert other.view.state("mine") is None


def test_engines_receive_a_view_at_every_step_and_methods_they_list_join_every_graph(seeing):
    g, x, _, y = _relu_graph()
    assert g.compiled_plan() is None
    g.build()
    g.execute({x: np.ones((2, 3), np.float32), y: np.empty((2, 3), np.float32)})
    assert {kind for kind, _ in seeing.seen} == {"propose", "check", "build", "execute"}
    assert {cls for _, cls in seeing.seen} == {GraphView}
    assert g.seeing_marks() == ["proposed"]                 # an engine's method, on its own state


def test_compiled_plan_reaches_the_built_plan_by_index_and_selection():
    g, x, _, y = _relu_graph()
    g.build()
    compiled = g.compiled_plan()
    assert isinstance(compiled, CompiledPlan)
    assert compiled is g.compiled_plan(g.plans.index(g.selected_plan)) is g.get_compiled_plan_at_index(0)
    with pytest.raises(IndexError):
        g.compiled_plan(len(g.plans))
    assert g.fast_executor is None
    g.execute({x: np.ones((2, 3), np.float32), y: np.empty((2, 3), np.float32)})
    assert g.fast_executor is not None


def test_append_plan_adds_a_hand_made_entry():
    g, *_ = _relu_graph()
    with pytest.raises(ValueError, match="engine"):
        g.append_plan(PlanConfig(VIEW_ID, name="nobody"))
    engine = _SeeingEngine()
    assert g.append_plan(PlanConfig(VIEW_ID, name="by-hand", engine=engine)) == 0
    assert [p.label for p in g.plans] == ["by-hand"]


def test_register_graph_method_refuses_a_name_taken_by_a_method_or_an_op():
    for taken in ("execute", "relu", "validate"):
        with pytest.raises(RuntimeError, match="shadow"):
            register_graph_method(taken, lambda graph: None)


@pytest.mark.parametrize("keyword", ["sm_count", "sm_version"])
def test_keywords_that_are_not_implemented_say_so(keyword):
    with pytest.raises(NotImplementedError, match=keyword):
        cudnn.pygraph(device="cpu", **{keyword: 1})
    cudnn.pygraph(device="cpu", **{keyword: None})


def test_register_backend_is_a_deprecated_spelling_of_register_engine():
    engine = _SeeingEngine()
    with pytest.warns(DeprecationWarning, match="register_engine"):
        manifest.register_backend(engine)
    try:
        assert engine in manifest.engines()
    finally:
        with pytest.warns(DeprecationWarning, match="unregister_engine"):
            manifest.unregister_backend(engine)
    assert engine not in manifest.engines()


def test_the_ir_base_class_infers_on_its_own_and_has_no_execute():
    base = _ir.Graph(io_data_type=F.FLOAT, device="cpu")
    t = base.tensor(name="t", dim=[2], stride=[1])
    assert t.data_type == F.FLOAT                       # inference ran without any subclass
    assert not hasattr(base, "execute") and not hasattr(base, "_execute")
    assert callable(cudnn.pygraph.execute)
