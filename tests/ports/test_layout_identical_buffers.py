"""A buffer whose layout is byte-identical to the declared one (same elements at the same offsets, differing
only in unit dims) is accepted, as cudnn.pygraph accepts it: a (64,) buffer for a (1, 64, 1, 1) tensor.
Engines still see the declared geometry. Anything else stays a typed error naming the tensor.

CPU tests use NumPy buffers (and the exchange-API test producer for the borrowed-view path) on the
reference engine; the GPU test runs cudnn-frontend's genstats case on the cuDNN backend.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import PackLayout, Slot, TensorSpec, check
from cudnn_graph._testing import exchange_producer as ep
from cudnn_graph.engines import manifest
from cudnn_graph.engines.reference import ReferenceEngine
from cudnn_graph.errors import ReadOnlyOutputError, ShapeMismatchError, StrideMismatchError

F = cudnn.data_type


def spec(shape, strides=None, **kw):
    kw.setdefault("name", "x")
    return TensorSpec(1, shape, "float32", strides=strides, device="cpu", **kw)


# ---- the rule ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("given", [(64,), (64, 1), (1, 1, 64), (1, 64, 1, 1, 1)])
def test_unit_dims_anywhere_are_the_same_bytes(given):
    check(Slot.from_object(np.zeros(given, np.float32)), spec((1, 64, 1, 1), (64, 1, 1, 1)))


def test_a_zero_d_array_is_a_one_element_tensor():
    layout = PackLayout([spec((1, 1, 1, 1), (1, 1, 1, 1))])
    (slot,) = layout.pack({1: np.array(0.25, np.float32)}).slots
    assert slot.shape == (1, 1, 1, 1) and np.from_dlpack(slot).item() == 0.25


def test_strided_layout_that_matches_after_dropping_unit_dims_is_accepted():
    # (4, 1, 8) with strides (8, 8, 1) addresses what a packed (4, 8) addresses.
    check(Slot.from_object(np.zeros((4, 8), np.float32)), spec((4, 1, 8), (8, 8, 1)))


def test_a_transposed_buffer_is_refused_naming_the_tensor():
    transposed = np.zeros((8, 4), np.float32).T                     # (4, 8) with strides (1, 4)
    with pytest.raises(StrideMismatchError, match="'x'"):
        check(Slot.from_object(transposed), spec((4, 8), (8, 1)))
    with pytest.raises(ShapeMismatchError, match="'x'"):
        check(Slot.from_object(transposed), spec((4, 1, 8), (8, 8, 1)))


@pytest.mark.parametrize("given", [(2, 32), (32, 2), (63,), (1, 65)])
def test_other_shapes_stay_a_shape_mismatch(given):
    with pytest.raises(ShapeMismatchError, match=r"tensor 'x' \(uid 1\)"):
        check(Slot.from_object(np.zeros(given, np.float32)), spec((1, 64, 1, 1), (64, 1, 1, 1)))


def test_a_strided_vector_for_a_packed_tensor_is_refused():
    every_other = np.zeros(128, np.float32)[::2]                    # (64,) with stride 2
    with pytest.raises(ShapeMismatchError, match="'x'"):
        check(Slot.from_object(every_other), spec((1, 64, 1, 1), (64, 1, 1, 1)))


def test_without_declared_strides_only_the_extents_must_agree():
    every_other = np.zeros(128, np.float32)[::2]
    layout = PackLayout([spec((1, 64, 1, 1))])
    (slot,) = layout.pack({1: every_other}).slots
    assert slot.shape == (1, 64, 1, 1)
    assert slot.strides[1] == 2                                      # the buffer's step carries over
    assert slot.data_ptr == every_other.ctypes.data


def test_zero_size_tensors_compare_their_extents_only():
    check(Slot.from_object(np.zeros((0, 64), np.float32)), spec((0, 64, 1), (64, 1, 1)))
    with pytest.raises(ShapeMismatchError):
        check(Slot.from_object(np.zeros((64, 0), np.float32)), spec((0, 64, 1), (64, 1, 1)))


def test_the_other_checks_still_run_on_an_accepted_layout():
    ro = np.zeros(64, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ReadOnlyOutputError, match="'x'"):
        check(Slot.from_object(ro), spec((1, 64, 1, 1), (64, 1, 1, 1), is_output=True))


# ---- what engines see ------------------------------------------------------------------------------

@pytest.mark.parametrize("wrap", [lambda a: a, ep.ExchangeProducer, Slot.from_object],
                         ids=["numpy", "exchange-api view", "slot"])
def test_the_pack_hands_engines_the_declared_geometry(wrap):
    a = np.arange(64, dtype=np.float32)
    layout = PackLayout([spec((1, 64, 1, 1), (64, 1, 1, 1))])
    pack = layout.pack({1: wrap(a)})
    assert pack.data_ptrs == (a.ctypes.data,)
    (slot,) = pack.slots
    assert (slot.shape, slot.strides) == ((1, 64, 1, 1), (64, 1, 1, 1))
    np.testing.assert_array_equal(np.from_dlpack(slot).ravel(), a)


def test_an_exact_buffer_is_packed_as_given():
    a = np.zeros((1, 64, 1, 1), np.float32)
    (slot,) = PackLayout([spec((1, 64, 1, 1), (64, 1, 1, 1))]).pack({1: a}).slots
    assert slot.shape == a.shape and slot.data_ptr == a.ctypes.data


@pytest.fixture
def reference_only(monkeypatch):
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def test_a_host_graph_reads_and_writes_buffers_without_unit_dims(reference_only):
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[1, 64, 1, 1], stride=[64, 1, 1, 1])
    y = g.relu(x, name="act")
    y.set_output(True).set_dim([1, 64, 1, 1]).set_stride([64, 1, 1, 1])
    g.build([cudnn.heur_mode.A])
    a = np.linspace(-1, 1, 64, dtype=np.float32)
    out = np.full(64, 7.0, np.float32)
    g.execute({x: a, y: out})
    np.testing.assert_array_equal(out, np.maximum(a, 0))


# ---- GPU: cudnn-frontend's genstats case --------------------------------------------------------------

@pytest.mark.gpu
def test_genstats_writes_sums_into_vectors_on_cudnn():
    """genstats' (1, K, 1, 1) sum / sq_sum outputs written into (K,) device vectors: cudnn-frontend's
    test_conv_genstats graph (scale, bias, relu, conv_fprop, genstats; channels-last half)."""
    cp = pytest.importorskip("cupy")
    n, c, hw, k = 4, 32, 16, 64
    rng = np.random.default_rng(5)
    def nhwc(a):                                                          # (N, C, H, W) over NHWC storage
        return cp.asarray(a).transpose(0, 3, 1, 2)

    x = nhwc(rng.standard_normal((n, hw, hw, c)).astype(np.float16))
    w = nhwc((0.1 * rng.standard_normal((k, 3, 3, c))).astype(np.float16))
    s = nhwc((1 + 0.01 * rng.standard_normal((1, 1, 1, c))).astype(np.float16))
    b = nhwc((0.01 * rng.standard_normal((1, 1, 1, c))).astype(np.float16))
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.HALF, compute_data_type=F.FLOAT)
    X, W, S, B = (g.tensor(name=name, dim=list(a.shape), stride=[st // a.itemsize for st in a.strides],
                           data_type=F.HALF)
                  for name, a in (("X", x), ("W", w), ("S", s), ("B", b)))
    relu = g.relu(name="relu", input=g.bias(name="bias", input=g.scale(name="scale", input=X, scale=S), bias=B))
    Y = g.conv_fprop(image=relu, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True).set_stride([hw * hw * k, 1, hw * k, k])
    SUM, SQ_SUM = g.genstats(name="genstats", input=Y)
    SUM.set_output(True).set_data_type(F.FLOAT)
    SQ_SUM.set_output(True).set_data_type(F.FLOAT)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    y_dev = cp.zeros((n, hw, hw, k), cp.float16)                              # NHWC storage of Y
    sum_dev, sq_dev = cp.zeros(k, cp.float32), cp.zeros(k, cp.float32)       # (K,), not (1, K, 1, 1)
    ws = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    g.execute({X: x, W: w, S: s, B: b, Y: y_dev.transpose(0, 3, 1, 2), SUM: sum_dev, SQ_SUM: sq_dev}, ws)
    cp.cuda.runtime.deviceSynchronize()
    y = cp.asnumpy(y_dev).astype(np.float64)
    assert np.abs(y).max() > 0
    np.testing.assert_allclose(cp.asnumpy(sum_dev), y.sum(axis=(0, 1, 2)), rtol=1e-2, atol=0.5)
    np.testing.assert_allclose(cp.asnumpy(sq_dev), (y * y).sum(axis=(0, 1, 2)), rtol=1e-2, atol=0.5)
