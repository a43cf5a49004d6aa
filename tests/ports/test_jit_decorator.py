"""cudnn.jit on the host: the decorated function's graph is built and its tensors become uids."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn

F = cudnn.data_type


def _make_graph(calls, x, b):
    calls.append(1)
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    X = g.tensor_like(x)
    B = g.tensor_like(b)
    Y = g.relu(g.add(X, B)).set_output(True)
    return g, [X, B, Y]


def test_jit_builds_the_graph_and_returns_uids_in_order():
    calls = []
    make = cudnn.jit(heur_modes=[cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])(
        lambda x, b: _make_graph(calls, x, b))
    x = np.array([[-2.0, 1.0, 3.0]], np.float32)
    b = np.array([[1.0, -3.0, 0.5]], np.float32)
    g, uids = make(x, b)
    assert g.get_execution_plan_count() >= 1 and g.compiled_plan() is not None
    assert uids == [t.uid for t in (g.find_tensor(u) for u in uids)]
    y = np.empty_like(x)
    g.execute({uids[0]: x, uids[1]: b, uids[2]: y})
    np.testing.assert_array_equal(y, np.maximum(x + b, 0))


def test_jit_takes_one_mode_and_keeps_the_function_as_wrapped():
    def make(x, b):
        return _make_graph([], x, b)

    jitted = cudnn.jit(heur_modes=cudnn.heur_mode.A)(make)
    assert jitted.__wrapped__ is make and jitted.__name__ == "make"
    x = np.ones((1, 3), np.float32)
    g, uids = jitted(x, x)
    assert len(uids) == 3 and g.get_execution_plan_count() >= 1


def test_jit_does_not_build_a_graph_that_already_has_plans():
    built = cudnn.pygraph(io_data_type=F.FLOAT, device="cpu")
    t = built.tensor(name="x", dim=[1, 2], stride=[2, 1])
    y = built.relu(t).set_output(True)
    built.build([cudnn.heur_mode.A])
    g, uids = cudnn.jit()(lambda: (built, [t, y]))()     # a second build() would refuse to plan again
    assert g is built and uids == [t.uid, y.uid]


def test_jit_refuses_a_function_that_does_not_return_graph_and_tensors():
    with pytest.raises(cudnn.ArgumentTypeError, match="returns \\(graph, \\[tensors\\]\\)"):
        cudnn.jit()(lambda: None)()
