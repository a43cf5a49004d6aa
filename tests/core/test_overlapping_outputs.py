"""An output buffer whose strides make two indices address one element is refused (issue 20, item 1).

``OverlappingOutputError`` (a ``StrideMismatchError``) names the tensor; inputs with zero strides
(broadcast views) stay accepted. The test is exact for compact layouts in any axis order and sign,
and never lets a truly overlapping layout through (checked against brute force).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import cudnn_graph as cudnn
from cudnn_graph import OverlappingOutputError, PackLayout, StrideMismatchError, TensorSpec


def _layout(shape, strides=None):
    return PackLayout([TensorSpec(1, shape, "float32", device="cpu", name="x"),
                       TensorSpec(2, shape, "float32", device="cpu", name="y", is_output=True, strides=strides)])


def _view(base: np.ndarray, shape, strides):
    return as_strided(base, shape, [s * base.itemsize for s in strides])


def _overlaps(shape, strides) -> bool:
    offsets = [sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]
    return len(set(offsets)) != len(offsets)


def test_a_zero_stride_output_is_refused_naming_it():
    base = np.zeros(16, np.float32)
    with pytest.raises(OverlappingOutputError) as info:
        _layout((2, 3)).pack({"x": np.zeros((2, 3), np.float32), "y": _view(base, (2, 3), (0, 1))})
    err = info.value
    assert isinstance(err, StrideMismatchError)
    assert (err.tensor_name, err.uid, err.got) == ("y", 2, (0, 1))
    assert str(err).startswith("tensor 'y' (uid 2): strides (in elements) of an output expected")


def test_a_zero_stride_input_stays_accepted():
    x = np.broadcast_to(np.float32(1), (2, 3))
    assert _layout((2, 3)).pack({"x": x, "y": np.zeros((2, 3), np.float32)}).uids == (1, 2)


def test_declared_overlapping_output_strides_refuse_every_buffer():
    base = np.zeros(16, np.float32)
    with pytest.raises(OverlappingOutputError):
        _layout((2, 3), strides=(1, 1)).pack({"x": np.zeros((2, 3), np.float32), "y": _view(base, (2, 3), (1, 1))})


def test_extent_one_and_empty_outputs_never_overlap():
    base = np.zeros(16, np.float32)
    _layout((1, 4)).pack({"x": np.zeros((1, 4), np.float32), "y": _view(base, (1, 4), (0, 1))})
    _layout((0, 4)).pack({"x": np.zeros((0, 4), np.float32), "y": _view(base, (0, 4), (0, 0))})


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 3, 4), (2, 1, 3, 2)])
def test_compact_outputs_in_any_axis_order_and_sign_are_accepted(shape):
    size = int(np.prod(shape))
    for order in itertools.permutations(range(len(shape))):
        for signs in itertools.product((1, -1), repeat=len(shape)):
            a = np.transpose(np.zeros([shape[i] for i in order], np.float32), np.argsort(order))
            a = a[tuple(slice(None, None, s) for s in signs)]
            assert a.shape == shape and a.size == size
            _layout(shape).pack({"x": np.zeros(shape, np.float32), "y": a})


def test_no_overlapping_layout_is_accepted():
    rng = np.random.default_rng(0)
    base = np.zeros(4096, np.float32)
    refused = 0
    for _ in range(2000):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(d) for d in rng.integers(1, 5, ndim))
        strides = tuple(int(s) for s in rng.integers(0, 9, ndim))
        try:
            _layout(shape).pack({"x": np.zeros(shape, np.float32), "y": _view(base, shape, strides)})
        except OverlappingOutputError:
            refused += 1
            continue
        assert not _overlaps(shape, strides), (shape, strides)
    assert refused > 200


def test_an_overlapping_output_is_refused_by_execute_and_the_graph_stays_usable():
    F = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=F, compute_data_type=F, device="cpu")
    x = g.tensor(name="x", dim=[3, 4], stride=[4, 1])
    y = g.relu(x).set_output(True).set_name("y")
    g.build([cudnn.heur_mode.A])
    xv = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    out = np.full(12, np.nan, np.float32)
    with pytest.raises(OverlappingOutputError, match=r"^tensor 'y' \(uid \d+\)"):
        g.execute({x: xv, y: _view(out, (3, 4), (0, 1))})
    assert np.isnan(out).all()
    good = np.zeros((3, 4), np.float32)
    g.execute({x: xv, y: good})
    np.testing.assert_array_equal(good, np.maximum(xv, 0))
