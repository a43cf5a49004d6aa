"""Tensors that no node reads, and ``None`` keys, as cudnn.pygraph code leaves them: cudnn-frontend's
instancenorm test makes an epsilon its backward graph never reads and binds a buffer to it; its rmsnorm
test keys ``{bias: b}`` with ``bias = None`` when the graph has no bias. Both run there; both run here."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.errors import UnknownTensorError

F = cudnn.data_type


def relu_graph_with_a_stray_input():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[4], stride=[1])
    stray = g.tensor(name="stray", dim=[4], stride=[1])
    y = g.relu(x)
    y.set_output(True)
    g.build([cudnn.heur_mode.A])
    return g, x, stray, y


@pytest.mark.parametrize("key", ["tensor", "uid", "name"])
def test_a_buffer_for_an_input_no_node_reads_is_skipped(key):
    g, x, stray, y = relu_graph_with_a_stray_input()
    xs = np.array([-1, 2, -3, 4], np.float32)
    out = np.zeros(4, np.float32)
    stray_key = {"tensor": stray, "uid": stray.uid, "name": "stray"}[key]
    g.execute({x: xs, stray_key: np.ones(3, np.int8), y: out})     # never read, so never checked
    assert out.tolist() == [0, 2, 0, 4]


def test_an_input_no_node_reads_needs_no_buffer():
    g, x, _stray, y = relu_graph_with_a_stray_input()
    out = np.zeros(4, np.float32)
    g.execute({x: np.ones(4, np.float32), y: out})
    assert out.tolist() == [1, 1, 1, 1]


def test_a_none_key_is_skipped():
    g, x, _stray, y = relu_graph_with_a_stray_input()
    out = np.zeros(4, np.float32)
    g.execute({x: np.full(4, 2, np.float32), None: np.ones(4, np.float32), y: out})
    assert out.tolist() == [2, 2, 2, 2]


def test_a_key_naming_no_tensor_is_still_refused():
    g, x, _stray, y = relu_graph_with_a_stray_input()
    with pytest.raises(UnknownTensorError, match="no tensor named 'strey'"):
        g.execute({x: np.ones(4, np.float32), "strey": np.ones(4, np.float32), y: np.zeros(4, np.float32)})
