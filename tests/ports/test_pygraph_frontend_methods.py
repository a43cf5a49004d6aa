"""The cudnn.pygraph methods and keywords added for ports, on the host (reference engine)."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn

F = cudnn.data_type


def _graph():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu", name="ported")
    a = g.tensor(name="a", dim=[1, 2, 3], stride=[6, 3, 1])
    b = g.tensor(name="b", dim=[1, 3, 4], stride=[12, 4, 1])
    c = g.matmul(name="mm", A=a, B=b)
    y = g.relu(name="act", input=c).set_output(True)
    return g, a, b, c, y


def test_lookups_find_tensors_nodes_inputs_and_outputs():
    g, a, b, c, y = _graph()
    assert g.find_tensor("b") is b and g.find_tensor(a.uid) is a and g.find_tensor("nope") is None
    assert g.get_node("mm").op == "matmul" and g.get_node("nope") is None
    assert g.get_inputs() == [a, b]
    assert g.get_outputs() == [y]
    assert g.inspect() == g.to_dict()


def test_heuristics_is_the_frontends_name_for_heur_modes():
    g, a, b, c, y = _graph()
    g.build(heuristics=[cudnn.heur_mode.A])
    assert g.get_execution_plan_count() >= 1
    g2, *_ = _graph()
    g2.create_execution_plans(heuristics=[cudnn.heur_mode.A])
    assert g2.get_execution_plan_count() == g.get_execution_plan_count()
    with pytest.raises(TypeError, match="not both"):
        _graph()[0].build([cudnn.heur_mode.A], heuristics=[cudnn.heur_mode.A])


def test_plan_list_queries_after_build():
    g, *_ = _graph()
    g.build([cudnn.heur_mode.A])
    engine_id, knobs = g.get_engine_and_knobs_at_index(0)
    assert engine_id == g.plans[0].engine_id and knobs == dict(g.plans[0].knobs)
    assert g.backend_plan_entries() == []                  # no cuDNN on a host graph
    assert g.selected_engine is g.plans[0].engine          # a Python engine serves it
    assert g.get_workspace_size(handle=None) == g.get_workspace_size()
    with pytest.raises(NotImplementedError, match="fixed when it is built"):
        g.get_workspace_size(override_uids=[1], override_shapes=[[1]], override_strides=[[1]])


def test_out_dims_sets_the_output_dims():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[2, 6], stride=[6, 1])
    y = g.reshape(x, out_dims=[3, 4]).set_output(True)
    assert y.dim == (3, 4)
    z = g.reshape(x, out_dims={"Y": [12, 1]}).set_output(True)
    assert z.dim == (12, 1)
    g.build([cudnn.heur_mode.A])
    X = np.arange(12, dtype=np.float32).reshape(2, 6)
    Y, Z = np.empty((3, 4), np.float32), np.empty((12, 1), np.float32)
    g.execute({x: X, y: Y, z: Z})
    np.testing.assert_array_equal(Y, X.reshape(3, 4))
    np.testing.assert_array_equal(Z, X.reshape(12, 1))


def test_out_dims_naming_no_output_port_is_refused():
    g = cudnn.pygraph(io_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[2, 6], stride=[6, 1])
    with pytest.raises(cudnn.GraphValidationError, match="out_dims.*'nope'"):
        g.reshape(x, out_dims={"nope": [12]})


def test_unplanned_graph_has_zero_plans():
    assert _graph()[0].get_execution_plan_count() == 0
