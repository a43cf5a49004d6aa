"""A bounded hypothesis fuzz of graph.execute's variant packs on host graphs (reference engine).

Every outcome is the right result (compared with NumPy) or a typed ``CudnnGraphError`` naming the
tensor at fault; hand-made capsules' deleters run exactly once over their life (never with a NULL
deleter). The cases are ``cudnn_graph._testing.pack_fuzz``'s, which bench/fuzz_execute.py runs by the
hundred thousand: here hypothesis draws them (chains of pointwise ops, every io dtype the chains
take, every mutation), then layouts (random strides for inputs and outputs, checked against a
brute-force overlap test) and mixed key kinds and producers in one pack.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numpy.lib.stride_tricks import as_strided

import cudnn_graph as cudnn
from cudnn_graph import (CudnnGraphError, DuplicateTensorError, ForeignTensorError, MissingTensorError, Slot,
                         UnknownTensorError, VirtualTensorError)
from cudnn_graph._testing import exchange_producer as ep
from cudnn_graph._testing import pack_fuzz as pf

FUZZ = settings(deadline=None, derandomize=True, database=None)
CHAINS = 16      # graphs are built once per (chain, dtype): 16 chains keep the building to a few seconds


@settings(FUZZ, max_examples=2500)
@given(chain=st.integers(0, CHAINS - 1), seed=st.integers(0, 2**31 - 1), mutation=st.sampled_from(pf.MUTATIONS),
       dtype=st.sampled_from(sorted(pf.DTYPES)))
def test_every_mutated_pack_gives_the_right_result_or_a_typed_error_naming_the_tensor(chain, seed, mutation,
                                                                                       dtype):
    result = pf.run_host_case({"chain": chain, "seed": seed, "mutation": mutation, "dtype": dtype})
    assert result["outcome"] in ("ok", "typed"), result["detail"]


def _layout(draw, ndim):
    dims = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    strides = draw(st.lists(st.integers(-5, 5), min_size=ndim, max_size=ndim))
    return dims, strides


def _strided(dims, strides, fill, dtype):
    span = sum(abs(s) * (n - 1) for s, n in zip(strides, dims))
    base = np.full(span + 1, fill, dtype)
    start = sum(abs(s) * (n - 1) for s, n in zip(strides, dims) if s < 0)
    return as_strided(base[start:], dims, [s * base.itemsize for s in strides]), base


_ANY_LAYOUT: dict = {}


def _any_layout_graph(dims):
    """y = relu(x) + b with no declared strides for x and y: any layout reaches the engine."""
    key = tuple(dims)
    if key not in _ANY_LAYOUT:
        F = cudnn.data_type
        g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
        x = g.tensor(name="x", dim=list(dims))
        b = g.tensor(name="b", dim=list(dims), stride=[int(np.prod(dims[i + 1:])) for i in range(len(dims))])
        y = g.add(g.relu(x), b).set_output(True).set_name("y")
        g.build([cudnn.heur_mode.A])
        _ANY_LAYOUT[key] = (g, x, b, y)
    return _ANY_LAYOUT[key]


@settings(FUZZ, max_examples=700)
@given(data=st.data(), ndim=st.integers(1, 3))
def test_any_input_layout_is_read_right_and_an_overlapping_output_is_refused(data, ndim):
    dims, x_strides = _layout(data.draw, ndim)
    y_strides = data.draw(st.lists(st.integers(-5, 5), min_size=ndim, max_size=ndim))
    g, x, b, y = _any_layout_graph(dims)
    rng = np.random.default_rng(sum(dims) * 31 + sum(x_strides))
    xin, xbase = _strided(dims, x_strides, 0, np.float32)
    xbase[...] = rng.uniform(-2, 2, xbase.shape)
    bv = rng.uniform(-2, 2, dims).astype(np.float32)
    out, _ = _strided(dims, y_strides, np.nan, np.float32)
    try:
        g.execute({x: xin, b: bv, y: out})
    except cudnn.OverlappingOutputError as exc:
        assert exc.tensor_name == "y" and tuple(exc.got) == tuple(y_strides)
        # Refused: it overlaps, or it is an interleaved layout the sufficient test does not prove.
        return
    assert not pf.overlaps(dims, y_strides), (dims, y_strides)
    np.testing.assert_allclose(out, np.maximum(np.asarray(xin), 0) + bv, rtol=1e-6)


KEY_KINDS = ("tensor", "uid", "name", "numpy_uid")
BUFFER_KINDS = ("ndarray", "numpy_capsule", "slot", "hand_capsule", "hand_legacy_capsule")
BAD_KEYS = (None, "foreign", "virtual", "duplicate", "missing", "extra")


@settings(FUZZ, max_examples=800)
@given(chain=st.integers(0, CHAINS - 1), keys=st.lists(st.sampled_from(KEY_KINDS), min_size=3, max_size=3),
       buffers=st.lists(st.sampled_from(BUFFER_KINDS), min_size=2, max_size=2), bad=st.sampled_from(BAD_KEYS),
       which=st.integers(0, 2))
def test_mixed_keys_and_producers_in_one_pack(chain, keys, buffers, bad, which):
    g, x, b, y, virtuals, dims, ops = pf.chain_graph(chain)
    rng = np.random.default_rng(chain)
    xv, bv = rng.uniform(-2, 2, dims).astype(np.float32), rng.uniform(-2, 2, dims).astype(np.float32)
    out = np.full(dims, np.nan, np.float32)
    made_before, deleted_before = ep.counts()
    hand_made = 0

    def buffer(kind, array):
        nonlocal hand_made
        if kind == "numpy_capsule":
            return array.__dlpack__()
        if kind == "slot":
            return Slot.from_object(array)
        if kind.startswith("hand"):
            hand_made += 1
            return ep.make_capsule(array, versioned=kind == "hand_capsule")
        return array

    def key(kind, tensor):
        return {"tensor": tensor, "uid": tensor.uid, "name": tensor.name, "numpy_uid": np.int64(tensor.uid)}[kind]

    tensors = (x, b, y)
    pack = {key(keys[0], x): buffer(buffers[0], xv), key(keys[1], b): buffer(buffers[1], bv), key(keys[2], y): out}
    error, at_fault = None, None
    target = tensors[which]
    if bad == "foreign":
        other = pf.chain_graph((chain + 1) % CHAINS)
        pack = {(other[1 + which] if t is target else t): v for t, v in
                zip(tensors, (pack[key(keys[i], t)] for i, t in enumerate(tensors)))}
        error, at_fault = ForeignTensorError, target.name
    elif bad == "virtual" and virtuals:
        pack[virtuals[0].uid] = np.zeros(dims, np.float32)
        error, at_fault = VirtualTensorError, virtuals[0].name
    elif bad == "duplicate":
        second = "name" if keys[which] in ("uid", "numpy_uid") else "uid"   # np.int64(3) == 3: one dict key
        pack[key(second, target)] = np.zeros(dims, np.float32)
        error, at_fault = DuplicateTensorError, target.name
    elif bad == "missing":
        del pack[key(keys[which], target)]
        error, at_fault = MissingTensorError, target.name
    elif bad == "extra":
        pack[10_000 + which] = xv
        error = UnknownTensorError
    if error is None:
        g.execute(pack)
        assert pf.matches(out, pf.expected(ops, xv, bv)), (ops, keys, buffers)
    else:
        with pytest.raises(error) as info:
            g.execute(pack)
        assert isinstance(info.value, CudnnGraphError)
        if at_fault is not None:
            assert info.value.tensor_name == at_fault if hasattr(info.value, "tensor_name") else \
                f"tensor '{at_fault}'" in str(info.value)
        else:
            assert f"uid {10_000 + which}" in str(info.value)
        assert np.isnan(out).all()                       # nothing was written
        del info                                         # its traceback's frames hold the pack
    del pack
    made, deleted = ep.counts()
    assert made - made_before == hand_made and deleted - deleted_before == hand_made
