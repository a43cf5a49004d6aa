"""Every op builder, executed through ``pygraph.execute()`` on the reference engine (device="cpu"), checked
against a NumPy formula written HERE (direct loops, float64, finite differences) — never against the
engine's kernels.

Buffers come in every form a caller may hand over: NumPy arrays, non-contiguous views, raw host addresses
(``arr.ctypes.data``) for inputs and outputs, and bf16 / fp8 arrays from ml_dtypes (NumPy cannot export
those through DLPack, so they travel as raw addresses shaped by the graph's geometry).
"""
from __future__ import annotations

import itertools
import math
import pathlib
import re

import ml_dtypes
import numpy as np
from _helpers import host_address
import pytest

import cudnn_graph as cudnn
from cudnn_graph import GraphNotSupportedError, GraphValidationError, PlanEntryError
from cudnn_graph.engines import manifest
from cudnn_graph.engines.reference import ReferenceEngine
from cudnn_graph.ops import SCHEMAS
from _helpers import REPO_ROOT

FLOAT, HALF, BF16, INT32 = (cudnn.data_type.FLOAT, cudnn.data_type.HALF, cudnn.data_type.BFLOAT16,
                            cudnn.data_type.INT32)
TRAINING, INFERENCE = cudnn.norm_forward_phase.TRAINING, cudnn.norm_forward_phase.INFERENCE
RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def reference_only(monkeypatch):
    """Only the reference engine plans (whatever else this machine has)."""
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


# ------------------------------------------------------------------------------------------- helpers

def G(io=FLOAT):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=FLOAT, device="cpu")


def strides_of(a: np.ndarray) -> list:
    return [s // a.itemsize for s in a.strides]


def inp(g, name, a, **kw):
    """A graph input with the array's dims, strides (in elements) and data type."""
    return g.tensor(name=name, dim=list(a.shape), stride=strides_of(a), data_type=a.dtype, **kw)


def buf(a: np.ndarray):
    """What the caller hands over: the array, or its address when NumPy cannot export it (ml_dtypes)."""
    return host_address(a) if a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu") else a


def run(g, feeds: dict, outs: dict) -> dict:
    """Build on the reference engine and execute; ``outs`` maps output tensors to zeroed result arrays."""
    g.build()
    assert g.selected_plan.label == "reference"
    g.execute({**{t: buf(a) for t, a in feeds.items()}, **{t: buf(a) for t, a in outs.items()}})
    return outs


def out_for(t, dtype=np.float32):
    return np.zeros(t.dim, dtype)


def rand(*shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def close(got, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)


def f64(a):
    return np.asarray(a).astype(np.float64)


def num_grad(f, x, eps=1e-6):
    """Central finite differences of the scalar f at x (float64)."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f(x)
        x[idx] = old - eps
        down = f(x)
        x[idx] = old
        grad[idx] = (up - down) / (2 * eps)
    return grad


# ------------------------------------------------------------------------------------ pointwise table

def _erf(x):
    return np.vectorize(math.erf)(x)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _phi(x):
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


_C = math.sqrt(2 / math.pi)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(_C * (x + 0.044715 * x ** 3)))


def _gelu_tanh_grad(x):
    t = np.tanh(_C * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * 0.044715 * x * x)


def _relu(x, lo=0.0, hi=math.inf, slope=0.0):
    return np.where(x > lo, np.minimum(x, hi), lo + slope * (x - lo))


def _relu_grad(x, lo=0.0, hi=math.inf, slope=0.0):
    return np.where(x > lo, np.where(x < hi, 1.0, 0.0), slope)


# Input domains: any (-2, 2), pos (0.5, 2), nz (|x| in 0.5..2), small (-1, 1), bit (0 / 1), int (-3..3).
# name: (domains per port, formula(*inputs, **attrs), attrs given to the builder)
POINTWISE = {
    "add": (("any", "any"), lambda a, b: a + b, {}),
    "bias": (("any", "any"), lambda x, b: x + b, {}),
    "sub": (("any", "any"), lambda a, b: a - b, {}),
    "mul": (("any", "any"), lambda a, b: a * b, {}),
    "scale": (("any", "any"), lambda x, s: x * s, {}),
    "div": (("any", "nz"), lambda a, b: a / b, {}),
    "add_square": (("any", "any"), lambda a, b: a + b * b, {}),
    "max": (("any", "any"), np.maximum, {}),
    "min": (("any", "any"), np.minimum, {}),
    "mod": (("any", "nz"), lambda a, b: np.vectorize(math.fmod)(a, b), {}),
    "floor_mod": (("any", "nz"), lambda a, b: a - np.floor(a / b) * b, {}),
    "pow": (("pos", "any"), lambda a, b: np.exp(b * np.log(a)), {}),
    "atan2": (("any", "any"), lambda y, x: np.vectorize(math.atan2)(y, x), {}),
    "abs": (("any",), np.abs, {}),
    "ceil": (("any",), np.vectorize(math.ceil), {}),
    "floor": (("any",), np.vectorize(math.floor), {}),
    "exp": (("any",), np.exp, {}),
    "log": (("pos",), np.log, {}),
    "neg": (("any",), lambda x: -x, {}),
    "reciprocal": (("nz",), lambda x: 1.0 / x, {}),
    "rsqrt": (("pos",), lambda x: x ** -0.5, {}),
    "sqrt": (("pos",), lambda x: x ** 0.5, {}),
    "sin": (("any",), np.sin, {}),
    "cos": (("any",), np.cos, {}),
    "tan": (("small",), np.tan, {}),
    "erf": (("any",), _erf, {}),
    "identity": (("any",), lambda x: x, {}),
    "gen_index": (("any",), None, {"axis": 1}),     # formula below: the index along the axis
    "relu": (("any",), _relu, {}),
    "leaky_relu": (("any",), lambda x: np.where(x > 0, x, 0.2 * x), {"negative_slope": 0.2}),
    "tanh": (("any",), np.tanh, {}),
    "sigmoid": (("any",), _sig, {}),
    "elu": (("any",), lambda x: np.where(x > 0, x, np.exp(x) - 1), {}),
    "gelu": (("any",), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), {}),
    "gelu_approx_tanh": (("any",), _gelu_tanh, {}),
    "softplus": (("any",), lambda x: np.log1p(np.exp(x)), {}),
    "swish": (("any",), lambda x: x * _sig(x), {}),
    "relu_backward": (("any", "any"), lambda dy, x: dy * _relu_grad(x), {}),
    "leaky_relu_backward": (("any", "any"), lambda dy, x: dy * np.where(x > 0, 1.0, 0.3), {"negative_slope": 0.3}),
    "tanh_backward": (("any", "any"), lambda dy, x: dy * (1 - np.tanh(x) ** 2), {}),
    "sigmoid_backward": (("any", "any"), lambda dy, x: dy * _sig(x) * (1 - _sig(x)), {}),
    "elu_backward": (("any", "any"), lambda dy, x: dy * np.where(x > 0, 1.0, np.exp(x)), {}),
    "gelu_backward": (("any", "any"),
                      lambda dy, x: dy * (0.5 * (1 + _erf(x / math.sqrt(2))) + x * _phi(x)), {}),
    "gelu_approx_tanh_backward": (("any", "any"), lambda dy, x: dy * _gelu_tanh_grad(x), {}),
    "softplus_backward": (("any", "any"), lambda dy, x: dy * _sig(x), {}),
    "swish_backward": (("any", "any"), lambda dy, x: dy * (_sig(x) + x * _sig(x) * (1 - _sig(x))), {}),
    "cmp_eq": (("int", "int"), lambda a, b: (a == b) * 1.0, {}),
    "cmp_neq": (("int", "int"), lambda a, b: (a != b) * 1.0, {}),
    "cmp_gt": (("int", "int"), lambda a, b: (a > b) * 1.0, {}),
    "cmp_ge": (("int", "int"), lambda a, b: (a >= b) * 1.0, {}),
    "cmp_lt": (("int", "int"), lambda a, b: (a < b) * 1.0, {}),
    "cmp_le": (("int", "int"), lambda a, b: (a <= b) * 1.0, {}),
    "logical_and": (("bit", "bit"), lambda a, b: ((a != 0) & (b != 0)) * 1.0, {}),
    "logical_or": (("bit", "bit"), lambda a, b: ((a != 0) | (b != 0)) * 1.0, {}),
    "logical_not": (("bit",), lambda a: (a == 0) * 1.0, {}),
    "binary_select": (("any", "any", "bit"), lambda a, b, m: np.where(m != 0, a, b), {}),
}

# Attribute variants of the parametrised activations (cuDNN's own knobs), formula with the same attrs.
POINTWISE_VARIANTS = {
    "relu[clipped]": ("relu", lambda x: _relu(x, -0.5, 1.0, 0.1),
                      {"negative_slope": 0.1, "lower_clip": -0.5, "upper_clip": 1.0}),
    "relu_backward[clipped]": ("relu_backward", lambda dy, x: dy * _relu_grad(x, -0.5, 1.0, 0.1),
                               {"negative_slope": 0.1, "lower_clip": -0.5, "upper_clip": 1.0}),
    "swish[beta]": ("swish", lambda x: x * _sig(1.5 * x), {"swish_beta": 1.5}),
    "swish_backward[beta]": ("swish_backward",
                             lambda dy, x: dy * (_sig(1.5 * x) + 1.5 * x * _sig(1.5 * x) * (1 - _sig(1.5 * x))),
                             {"swish_beta": 1.5}),
    "elu[alpha]": ("elu", lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)), {"elu_alpha": 0.5}),
    "softplus[beta]": ("softplus", lambda x: np.log1p(np.exp(2.0 * x)) / 2.0, {"softplus_beta": 2.0}),
    "softplus_backward[beta]": ("softplus_backward", lambda dy, x: dy * _sig(2.0 * x), {"softplus_beta": 2.0}),
}


def _domain(kind, shape):
    if kind == "any":
        return rand(*shape)
    if kind == "pos":
        return rand(*shape, lo=0.5, hi=2.0)
    if kind == "nz":
        return rand(*shape, lo=0.5, hi=2.0) * RNG.choice([-1.0, 1.0], size=shape).astype(np.float32)
    if kind == "small":
        return rand(*shape, lo=-1.0, hi=1.0)
    if kind == "bit":
        return RNG.integers(0, 2, size=shape).astype(np.float32)
    if kind == "int":
        return RNG.integers(-3, 4, size=shape).astype(np.float32)
    raise AssertionError(kind)


def test_pointwise_table_covers_every_pointwise_schema():
    assert set(POINTWISE) == {name for name, s in SCHEMAS.items() if s.family == "pointwise"}


def _run_pointwise(op, formula, attrs):
    schema = SCHEMAS[op]
    ports = [p.name for p in schema.inputs]
    domains = POINTWISE[op][0]
    g = G()
    arrays, tensors = {}, {}
    for i, (port, kind) in enumerate(zip(ports, domains)):
        # The second operand of a binary op broadcasts along axis 0 (cuDNN broadcasting, equal rank).
        shape = (1, 5) if (i == 1 and len(ports) == 2 and op != "binary_select") else (3, 5)
        arrays[port] = _domain(kind, shape)
        tensors[port] = inp(g, port, arrays[port])
    y = getattr(g, op)(**tensors, **attrs).set_output(True)
    got = run(g, {tensors[p]: arrays[p] for p in ports}, {y: out_for(y)})[y]
    if op == "gen_index":
        want = np.broadcast_to(np.arange(5, dtype=np.float64)[None, :], (3, 5))
    else:
        want = formula(*[f64(arrays[p]) for p in ports])
    close(got, np.broadcast_to(want, (3, 5)), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", sorted(POINTWISE))
def test_pointwise(op):
    _, formula, attrs = POINTWISE[op]
    _run_pointwise(op, formula, attrs)


@pytest.mark.parametrize("variant", sorted(POINTWISE_VARIANTS))
def test_pointwise_attribute_variants(variant):
    op, formula, attrs = POINTWISE_VARIANTS[variant]
    _run_pointwise(op, formula, attrs)


def test_pointwise_python_scalar_operand_and_half_io():
    g = G(io=HALF)
    x = rand(4, 6).astype(np.float16)
    tx = inp(g, "x", x)
    y = g.add(g.mul(tx, 3.0), 0.5).set_output(True)     # numbers become pass-by-value scalars
    got = run(g, {tx: x}, {y: np.zeros((4, 6), np.float16)})[y]
    close(got, f64(x) * 3.0 + 0.5, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------- matmul

def test_matmul_bias_relu_chain_batched():
    g = G()
    a, b, bias = rand(3, 4, 5), rand(3, 5, 6), rand(1, 1, 6)
    ta, tb, tbias = inp(g, "a", a), inp(g, "b", b), inp(g, "bias", bias)
    y = g.relu(g.bias(g.matmul(ta, tb), tbias)).set_output(True)
    got = run(g, {ta: a, tb: b, tbias: bias}, {y: out_for(y)})[y]
    want = np.zeros((3, 4, 6))
    for n, i, j in itertools.product(range(3), range(4), range(6)):
        want[n, i, j] = max(sum(f64(a)[n, i, k] * f64(b)[n, k, j] for k in range(5)) + bias[0, 0, j], 0.0)
    close(got, want)


def test_matmul_batch_broadcast():
    g = G()
    a, b = rand(1, 3, 4), rand(2, 4, 2)
    ta, tb = inp(g, "a", a), inp(g, "b", b)
    c = g.matmul(ta, tb).set_output(True)
    assert c.dim == (2, 3, 2)
    got = run(g, {ta: a, tb: b}, {c: out_for(c)})[c]
    close(got, np.stack([f64(a)[0] @ f64(b)[n] for n in range(2)]))


def test_matmul_noncontiguous_views_and_raw_addresses():
    """A transposed view for B (declared by tensor_like), an output written into a strided view of a
    larger array, an input with only dims (any layout accepted), and raw addresses for inputs/outputs."""
    g = G()
    a = rand(2, 4, 3)
    b_storage = rand(2, 5, 3)
    b = b_storage.transpose(0, 2, 1)                   # (2, 3, 5), not contiguous
    assert not b.flags.c_contiguous
    big = np.full((2, 8, 10), -7.0, np.float32)
    c_view = big[:, ::2, ::2]                          # (2, 4, 5) strided output
    ta = g.tensor(name="a", dim=[2, 4, 3])             # dims only: the strides are the caller's
    tb = g.tensor_like(b, name="b")
    assert tb.stride == (15, 1, 3)
    tc = g.matmul(ta, tb).set_output(True)
    g.build()
    a_view = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)   # same values, column-major
    g.execute({ta: a_view, tb: b, tc: c_view})
    want = np.einsum("nik,nkj->nij", f64(a), f64(b))
    close(c_view, want)
    assert np.all(big[:, 1::2, :] == -7.0) and np.all(big[:, :, 1::2] == -7.0)   # nothing else written

    c2 = np.zeros((2, 4, 5), np.float32)
    a_c = np.ascontiguousarray(a)
    g.execute({ta: host_address(a_c), tb: b, tc: host_address(c2)})
    close(c2, want)


def test_bf16_buffers_through_raw_addresses():
    g = G(io=BF16)
    a = rand(2, 8).astype(ml_dtypes.bfloat16)
    b = rand(8, 3).astype(ml_dtypes.bfloat16)
    ta, tb = inp(g, "a", a), inp(g, "b", b)
    assert ta.data_type == BF16
    c = g.matmul(g.reshape(ta).set_dim([1, 2, 8]).set_stride([16, 8, 1]),
                 g.reshape(tb).set_dim([1, 8, 3]).set_stride([24, 3, 1])).set_output(True)
    out = np.zeros((1, 2, 3), ml_dtypes.bfloat16)
    run(g, {ta: a, tb: b}, {c: out})
    close(out, (f64(a) @ f64(b))[None], rtol=1e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------ reductions

REDUCTIONS = {
    "ADD": lambda v: v.sum(), "MUL": lambda v: v.prod(), "MIN": lambda v: v.min(), "MAX": lambda v: v.max(),
    "AMAX": lambda v: np.abs(v).max(), "AVG": lambda v: v.mean(), "NORM1": lambda v: np.abs(v).sum(),
    "NORM2": lambda v: math.sqrt((v * v).sum()), "MUL_NO_ZEROS": lambda v: v[v != 0].prod(),
}


def test_reduction_table_covers_every_mode():
    from cudnn_graph.ops._tensor_ops import ReductionMode
    # NOT_SET (negative: "no mode") is no reduction the kernels could run.
    assert set(REDUCTIONS) == {name for name, m in ReductionMode.__members__.items() if m.value >= 0}


@pytest.mark.parametrize("mode", sorted(REDUCTIONS))
@pytest.mark.parametrize("out_dims", [(3, 1, 5), (1, 4, 1)])
def test_reduction(mode, out_dims):
    g = G()
    x = rand(3, 4, 5, lo=0.5, hi=1.5) * RNG.choice([-1, 1], size=(3, 4, 5)).astype(np.float32)
    x[0, 0, 0] = 0.0                                   # MUL_NO_ZEROS skips it, MUL does not
    tx = inp(g, "x", x)
    y = g.reduction(tx, mode=getattr(cudnn.reduction_mode, mode)).set_dim(list(out_dims)).set_output(True)
    got = run(g, {tx: x}, {y: np.zeros(out_dims, np.float32)})[y]
    want = np.zeros(out_dims)
    for idx in np.ndindex(out_dims):
        sel = tuple(slice(None) if d == 1 else i for d, i in zip(out_dims, idx))
        want[idx] = REDUCTIONS[mode](f64(x)[sel])
    close(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------- layout ops

def test_reshape_transpose_slice_concatenate():
    g = G()
    x = rand(2, 3, 4)
    z = rand(2, 3, 2)
    tx, tz = inp(g, "x", x), inp(g, "z", z)
    r = g.reshape(tx, reshape_mode="LOGICAL").set_dim([6, 4]).set_stride([4, 1]).set_output(True)
    t = g.transpose(tx, permutation=[2, 0, 1]).set_output(True)
    s = g.slice(tx, slices=[slice(1, 2), slice(0, 3, 2)]).set_output(True)
    c = g.concatenate([tx, tz], axis=2).set_output(True)
    outs = run(g, {tx: x, tz: z}, {r: out_for(r), t: out_for(t), s: out_for(s), c: out_for(c)})
    flat = [x[i, j, k] for i in range(2) for j in range(3) for k in range(4)]
    close(outs[r], np.array(flat).reshape(6, 4))
    want_t = np.zeros((4, 2, 3))
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        want_t[i, j, k] = x[j, k, i]                   # output axis i reads input axis permutation[i]
    close(outs[t], want_t)
    assert s.dim == (1, 2, 4)
    close(outs[s], np.array([[x[1, 0], x[1, 2]]]))
    want_c = np.zeros((2, 3, 6))
    want_c[:, :, :4], want_c[:, :, 4:] = x, z
    close(outs[c], want_c)


# ----------------------------------------------------------------------------------------- block scale

def test_block_scale_quantize_mxfp8():
    g = G()
    x = rand(2, 64, lo=-3.0, hi=3.0)
    x[1, 32:] *= 1e-3                                  # a block with a tiny range gets a tiny scale
    tx = inp(g, "x", x)
    y, scale = g.block_scale_quantize(tx, block_size=32)
    y.set_output(True).set_data_type(cudnn.data_type.FP8_E4M3)
    scale.set_output(True).set_data_type(cudnn.data_type.FP8_E8M0)
    assert scale.dim == (2, 2)
    yo = np.zeros((2, 64), ml_dtypes.float8_e4m3fn)
    so = np.zeros((2, 2), ml_dtypes.float8_e8m0fnu)
    run(g, {tx: x}, {y: yo, scale: so})
    for r, blk in itertools.product(range(2), range(2)):
        vals = f64(x)[r, blk * 32:(blk + 1) * 32]
        s = 2.0 ** math.ceil(math.log2(np.abs(vals).max() / 448.0))   # E8M0: a power of two, rounded up
        assert float(so[r, blk]) == s
        want = (vals / s).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        np.testing.assert_array_equal(f64(yo[r, blk * 32:(blk + 1) * 32]), want)


def test_block_scale_dequantize_into_matmul():
    g = G()
    q = RNG.uniform(-4, 4, size=(1, 4, 64)).astype(ml_dtypes.float8_e4m3fn)
    descale = (2.0 ** RNG.integers(-3, 3, size=(1, 4, 2))).astype(ml_dtypes.float8_e8m0fnu)
    b = rand(1, 64, 3)
    tq, ts, tb = inp(g, "q", q), inp(g, "descale", descale), inp(g, "b", b)
    deq = g.block_scale_dequantize(tq, ts, block_size=[1, 32])
    c = g.matmul(deq, tb).set_output(True)
    got = run(g, {tq: q, ts: descale, tb: b}, {c: out_for(c)})[c]
    a = np.zeros((1, 4, 64))
    for i, j in itertools.product(range(4), range(64)):
        a[0, i, j] = float(q[0, i, j]) * float(descale[0, i, j // 32])
    close(got, a @ f64(b), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------- convolution

def _pad(x, pre, post):
    return np.pad(x, [(0, 0), (0, 0)] + list(zip(pre, post)))


def conv_direct(x, w, pre, post, stride, dil, groups=1):
    """Y[n, k, o...] by direct summation over (c, taps) — a loop per output element."""
    x, w = f64(x), f64(w)
    xp = _pad(x, pre, post)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    taps = w.shape[2:]
    out = [1 + (xp.shape[2 + i] - dil[i] * (taps[i] - 1) - 1) // stride[i] for i in range(len(taps))]
    y = np.zeros((n, k) + tuple(out))
    for ni, ki in itertools.product(range(n), range(k)):
        grp = ki // (k // groups)
        for o in itertools.product(*map(range, out)):
            acc = 0.0
            for ci in range(cg):
                for t in itertools.product(*map(range, taps)):
                    pos = tuple(o[i] * stride[i] + t[i] * dil[i] for i in range(len(taps)))
                    acc += xp[(ni, grp * cg + ci) + pos] * w[(ki, ci) + t]
            y[(ni, ki) + o] = acc
    return y


def dgrad_direct(dy, w, x_dims, pre, post, stride, dil):
    """DX by scattering every (output, tap) product back to the input position it read."""
    dy, w = f64(dy), f64(w)
    padded = [x_dims[2 + i] + pre[i] + post[i] for i in range(len(pre))]
    dxp = np.zeros(tuple(x_dims[:2]) + tuple(padded))
    n, k = dy.shape[:2]
    taps = w.shape[2:]
    for ni, ki in itertools.product(range(n), range(k)):
        for o in itertools.product(*map(range, dy.shape[2:])):
            for ci in range(w.shape[1]):
                for t in itertools.product(*map(range, taps)):
                    pos = tuple(o[i] * stride[i] + t[i] * dil[i] for i in range(len(taps)))
                    dxp[(ni, ci) + pos] += dy[(ni, ki) + o] * w[(ki, ci) + t]
    return dxp[(slice(None), slice(None)) + tuple(slice(p, p + d) for p, d in zip(pre, x_dims[2:]))]


def wgrad_direct(x, dy, w_dims, pre, post, stride, dil):
    x, dy = f64(x), f64(dy)
    xp = _pad(x, pre, post)
    dw = np.zeros(w_dims)
    for ki, ci in itertools.product(range(w_dims[0]), range(w_dims[1])):
        for t in itertools.product(*map(range, w_dims[2:])):
            acc = 0.0
            for ni in range(x.shape[0]):
                for o in itertools.product(*map(range, dy.shape[2:])):
                    pos = tuple(o[i] * stride[i] + t[i] * dil[i] for i in range(len(t)))
                    acc += dy[(ni, ki) + o] * xp[(ni, ci) + pos]
            dw[(ki, ci) + t] = acc
    return dw


CONV_CASES = {
    # name: (x dims, w dims, pre, post, stride, dilation)
    "2d": ((2, 3, 7, 6), (4, 3, 3, 2), (1, 0), (1, 0), (2, 1), (1, 2)),
    "2d_asym_pad": ((1, 2, 5, 5), (3, 2, 3, 3), (2, 0), (0, 1), (1, 2), (1, 1)),
    "3d": ((1, 2, 5, 4, 4), (2, 2, 2, 3, 2), (1, 0, 1), (0, 1, 1), (2, 1, 2), (1, 1, 2)),
}


def _geometry_kwargs(pre, post, stride, dil):
    if pre == post:
        return dict(padding=list(pre), stride=list(stride), dilation=list(dil))
    return dict(pre_padding=list(pre), post_padding=list(post), stride=list(stride), dilation=list(dil))


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_fprop(case):
    xd, wd, pre, post, stride, dil = CONV_CASES[case]
    g = G()
    x, w = rand(*xd), rand(*wd)
    tx, tw = inp(g, "x", x), inp(g, "w", w)
    y = g.conv_fprop(tx, tw, **_geometry_kwargs(pre, post, stride, dil)).set_output(True)
    want = conv_direct(x, w, pre, post, stride, dil)
    assert y.dim == want.shape
    got = run(g, {tx: x, tw: w}, {y: out_for(y)})[y]
    close(got, want, rtol=1e-5, atol=1e-5)


def test_conv_fprop_grouped_channels_last_output():
    g = G()
    x, w = rand(1, 4, 5, 5), rand(6, 2, 3, 3)          # groups = 4 / 2 = 2
    tx, tw = inp(g, "x", x), inp(g, "w", w)
    y = g.conv_fprop(tx, tw, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)
    storage = np.zeros((1, 5, 5, 6), np.float32)       # NHWC memory, NCHW logical view
    view = storage.transpose(0, 3, 1, 2)
    run(g, {tx: x, tw: w}, {y: view})
    close(view, conv_direct(x, w, (1, 1), (1, 1), (1, 1), (1, 1), groups=2))


def run_conv_grad(case, build, names, direct) -> tuple:
    """A conv gradient on CONV_CASES[case]: random inputs ``names`` (two of "x", "w", "dy", drawn in that
    order), ``build(g, *inputs, **geometry)``, its output set to the shape of the one of x / w not among
    the inputs. Returns (the output, ``direct(*inputs, output dims, pre, post, stride, dil)``)."""
    xd, wd, pre, post, stride, dil = CONV_CASES[case]
    dims = {"x": xd, "w": wd, "dy": conv_direct(np.zeros(xd), np.zeros(wd), pre, post, stride, dil).shape}
    (out_dims,) = [dims[n] for n in ("x", "w") if n not in names]
    arrays = [rand(*dims[n]) for n in names]
    g = G()
    tensors = [inp(g, n, a) for n, a in zip(names, arrays)]
    out = build(g, *tensors, **_geometry_kwargs(pre, post, stride, dil))
    out.set_dim(list(out_dims)).set_output(True)
    got = run(g, dict(zip(tensors, arrays)), {out: np.zeros(out_dims, np.float32)})[out]
    return got, direct(*arrays, out_dims, pre, post, stride, dil)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_dgrad(case):
    got, want = run_conv_grad(case, lambda g, *t, **geometry: g.conv_dgrad(*t, **geometry), ("dy", "w"),
                              dgrad_direct)
    close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_wgrad(case):
    got, want = run_conv_grad(case, lambda g, *t, **geometry: g.conv_wgrad(*t, **geometry), ("x", "dy"),
                              wgrad_direct)
    close(got, want, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------------------------ norms

EPS = 1e-5


def ln_forward(x, scale, bias, axes, eps=EPS):
    """(y, mean, inv_std) of a layer-style norm over ``axes``, float64."""
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * inv * scale
    return (y if bias is None else y + bias), mean, inv


def rms_forward(x, scale, bias, axes, eps=EPS):
    inv = 1.0 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    y = x * inv * scale
    return (y if bias is None else y + bias), inv


def fd_grads(forward, dy, args):
    """Finite-difference gradients of sum(dy * forward(*args)) with respect to each of ``args``."""
    grads = []
    for i in range(len(args)):
        def f(v, i=i):
            a = list(args)
            a[i] = v
            return float(np.sum(dy * forward(*a)))
        grads.append(num_grad(f, args[i]))
    return grads


def check_norm_forward(build, x, s, b, axes):
    """Run ``build(g, x, s, b)`` (a training-phase norm returning y, mean, inv) and compare its outputs with
    ``ln_forward`` over ``axes``; returns the graph's mean tensor and the wanted mean and inv (for a backward
    check)."""
    g = G()
    tx, ts, tb = (inp(g, n, a.astype(np.float32)) for n, a in (("x", x), ("s", s), ("b", b)))
    y, mean, inv = build(g, tx, ts, tb)
    for o in (y, mean, inv):
        o.set_output(True)
    outs = run(g, {tx: x.astype(np.float32), ts: s.astype(np.float32), tb: b.astype(np.float32)},
               {y: out_for(y), mean: out_for(mean), inv: out_for(inv)})
    wy, wm, wi = ln_forward(x, s, b, axes)
    close(outs[y], wy, rtol=1e-4, atol=1e-4)
    close(outs[mean], wm)
    close(outs[inv], wi, rtol=1e-4)
    return mean, wm, wi


def check_norm_backward(build, dy, x, s, b, mean, inv, axes):
    """Run ``build(g, dy, x, s, mean, inv)`` (a norm backward returning dx, ds, db) and compare its outputs
    with finite differences of ``ln_forward`` over ``axes`` at (x, s, b)."""
    g = G()
    arrays = {"dy": dy, "x": x, "s": s, "mean": mean, "inv": inv}
    t = {n: inp(g, n, a.astype(np.float32)) for n, a in arrays.items()}
    dx, ds, db = build(g, t["dy"], t["x"], t["s"], t["mean"], t["inv"])
    for o in (dx, ds, db):
        o.set_output(True)
    outs = run(g, {t[n]: a.astype(np.float32) for n, a in arrays.items()},
               {dx: out_for(dx), ds: out_for(ds), db: out_for(db)})
    gx, gs, gb = fd_grads(lambda x_, s_, b_: ln_forward(x_, s_, b_, axes)[0], dy, [x, s, b])
    close(outs[dx], gx, rtol=1e-4, atol=1e-4)
    close(outs[ds], gs, rtol=1e-4, atol=1e-4)
    close(outs[db], gb, rtol=1e-4, atol=1e-4)


def test_layernorm_forward_training_and_inference():
    x, s, b = rand(2, 3, 8), rand(1, 1, 8), rand(1, 1, 8)
    for phase in (TRAINING, INFERENCE):
        g = G()
        tx, ts, tb = inp(g, "x", x), inp(g, "s", s), inp(g, "b", b)
        y, mean, inv = g.layernorm(phase, tx, ts, tb, g.tensor_scalar(EPS))
        y.set_output(True)
        outs = {y: out_for(y)}
        if phase == TRAINING:
            assert mean.dim == inv.dim == (2, 3, 1)
            mean.set_output(True).set_data_type(FLOAT)
            inv.set_output(True).set_data_type(FLOAT)
            outs.update({mean: out_for(mean), inv: out_for(inv)})
        else:
            assert mean is None and inv is None
        outs = run(g, {tx: x, ts: s, tb: b}, outs)
        wy, wm, wi = ln_forward(f64(x), f64(s), f64(b), (2,))
        close(outs[y], wy, rtol=1e-4, atol=1e-4)
        if phase == TRAINING:
            close(outs[mean], wm)
            close(outs[inv], wi, rtol=1e-4)


def test_layernorm_backward_against_finite_differences():
    x, s, dy = f64(rand(2, 6)), f64(rand(1, 6)), f64(rand(2, 6))
    _, mean, inv = ln_forward(x, s, 0.0, (1,))
    check_norm_backward(lambda g, *t: g.layernorm_backward(*t), dy, x, s, np.zeros((1, 6)), mean, inv, (1,))


def test_adalayernorm_forward_and_backward():
    x, s, b, dy = f64(rand(2, 3, 4)), f64(rand(2, 1, 4)), f64(rand(2, 1, 4)), f64(rand(2, 3, 4))
    _, wm, wi = check_norm_forward(lambda g, *t: g.adalayernorm(TRAINING, *t, g.tensor_scalar(EPS)), x, s, b, (2,))
    check_norm_backward(lambda g, *t: g.adalayernorm_backward(*t), dy, x, s, b, wm, wi, (2,))


@pytest.mark.parametrize("with_bias", [False, True])
def test_rmsnorm_forward_and_backward(with_bias):
    x, s, b, dy = f64(rand(3, 8)), f64(rand(1, 8)), f64(rand(1, 8)), f64(rand(3, 8))
    g = G()
    tx, ts = inp(g, "x", x.astype(np.float32)), inp(g, "s", s.astype(np.float32))
    tb = inp(g, "b", b.astype(np.float32)) if with_bias else None
    y, inv = g.rmsnorm(TRAINING, tx, ts, tb, g.tensor_scalar(EPS))
    y.set_output(True)
    inv.set_output(True)
    feeds = {tx: x.astype(np.float32), ts: s.astype(np.float32)}
    if with_bias:
        feeds[tb] = b.astype(np.float32)
    outs = run(g, feeds, {y: out_for(y), inv: out_for(inv)})
    wy, wi = rms_forward(x, s, b if with_bias else None, (1,))
    close(outs[y], wy, rtol=1e-4, atol=1e-4)
    close(outs[inv], wi, rtol=1e-4)

    g2 = G()
    arrays = {"dy": dy, "x": x, "s": s, "inv": wi}
    t = {n: inp(g2, n, a.astype(np.float32)) for n, a in arrays.items()}
    dx, ds, db = g2.rmsnorm_backward(t["dy"], t["x"], t["s"], t["inv"], has_dbias=with_bias)
    assert (db is not None) == with_bias
    wanted = {dx: out_for(dx), ds: out_for(ds)}
    if with_bias:
        wanted[db] = out_for(db)
    for o in wanted:
        o.set_output(True)
    outs = run(g2, {t[n]: a.astype(np.float32) for n, a in arrays.items()}, wanted)
    gx, gs, gb = fd_grads(lambda x_, s_, b_: rms_forward(x_, s_, b_, (1,))[0], dy, [x, s, b])
    close(outs[dx], gx, rtol=1e-4, atol=1e-4)
    close(outs[ds], gs, rtol=1e-4, atol=1e-4)
    if with_bias:
        close(outs[db], gb, rtol=1e-4, atol=1e-4)


def test_batchnorm_training_with_running_stats():
    x, s, b = f64(rand(3, 2, 2, 2)), f64(rand(1, 2, 1, 1)), f64(rand(1, 2, 1, 1))
    rm, rv = f64(rand(1, 2, 1, 1)), f64(rand(1, 2, 1, 1, lo=0.5, hi=1.5))
    g = G()
    t = {n: inp(g, n, a.astype(np.float32)) for n, a in (("x", x), ("s", s), ("b", b), ("rm", rm), ("rv", rv))}
    y, mean, inv, orm, orv = g.batchnorm(input=t["x"], scale=t["s"], bias=t["b"], in_running_mean=t["rm"],
                                         in_running_var=t["rv"], epsilon=g.tensor_scalar(EPS),
                                         momentum=g.tensor_scalar(0.1))
    outs = {o: out_for(o) for o in (y, mean, inv, orm, orv)}
    for o in outs:
        o.set_output(True)
    outs = run(g, {t[n]: a.astype(np.float32) for n, a in (("x", x), ("s", s), ("b", b), ("rm", rm), ("rv", rv))},
               outs)
    axes = (0, 2, 3)
    wy, wm, wi = ln_forward(x, s, b, axes)
    count = x.size // x.shape[1]
    var_unbiased = ((x - wm) ** 2).sum(axis=axes, keepdims=True) / (count - 1)
    close(outs[y], wy, rtol=1e-4, atol=1e-4)
    close(outs[mean], wm)
    close(outs[inv], wi, rtol=1e-4)
    close(outs[orm], 0.9 * rm + 0.1 * wm)
    close(outs[orv], 0.9 * rv + 0.1 * var_unbiased, rtol=1e-5)


def test_batchnorm_inference_and_backward():
    x, s, b, dy = f64(rand(2, 3, 2, 2)), f64(rand(1, 3, 1, 1)), f64(rand(1, 3, 1, 1)), f64(rand(2, 3, 2, 2))
    axes = (0, 2, 3)
    _, mean, inv = ln_forward(x, s, b, axes)
    g = G()
    arrays = {"x": x, "mean": mean, "inv": inv, "s": s, "b": b}
    t = {n: inp(g, n, a.astype(np.float32)) for n, a in arrays.items()}
    y = g.batchnorm_inference(t["x"], t["mean"], t["inv"], t["s"], t["b"]).set_output(True)
    got = run(g, {t[n]: a.astype(np.float32) for n, a in arrays.items()}, {y: out_for(y)})[y]
    close(got, (x - mean) * inv * s + b, rtol=1e-4, atol=1e-4)

    check_norm_backward(lambda g, *t: g.batchnorm_backward(*t), dy, x, s, b, mean, inv, axes)


def test_instancenorm_forward_and_backward():
    x, s, b, dy = f64(rand(2, 3, 2, 3)), f64(rand(1, 3, 1, 1)), f64(rand(1, 3, 1, 1)), f64(rand(2, 3, 2, 3))
    axes = (2, 3)
    mean, wm, wi = check_norm_forward(lambda g, *t: g.instancenorm(TRAINING, *t, g.tensor_scalar(EPS)), x, s, b, axes)
    assert mean.dim == (2, 3, 1, 1)
    check_norm_backward(lambda g, *t: g.instancenorm_backward(*t), dy, x, s, b, wm, wi, axes)


def test_genstats():
    g = G()
    x = rand(2, 3, 2, 2)
    tx = inp(g, "x", x)
    total, sq = g.genstats(tx)
    total.set_output(True)
    sq.set_output(True)
    outs = run(g, {tx: x}, {total: out_for(total), sq: out_for(sq)})
    for c in range(3):
        vals = [f64(x)[n, c, h, w] for n in range(2) for h in range(2) for w in range(2)]
        close(outs[total][0, c, 0, 0], sum(vals))
        close(outs[sq][0, c, 0, 0], sum(v * v for v in vals))


# ------------------------------------------------------------------------------------------------- sdpa

def attention_f64(q, k, v, scale, causal=False, seq_q=None, seq_kv=None):
    """Reference attention written out per (batch, head, query): returns O and Stats (logsumexp).

    GQA: query head h reads key/value head h // (h_q // h_kv). Padded query rows are returned as 0.
    """
    q, k, v = f64(q), f64(k), f64(v)
    b, hq, sq, _ = q.shape
    skv = k.shape[2]
    o = np.zeros((b, hq, sq, v.shape[3]))
    stats = np.zeros((b, hq, sq, 1))
    for bi, h in itertools.product(range(b), range(hq)):
        kh, vh = h // (hq // k.shape[1]), h // (hq // v.shape[1])
        n_q = sq if seq_q is None else int(seq_q[bi])
        n_kv = skv if seq_kv is None else int(seq_kv[bi])
        for i in range(n_q):
            keys = [j for j in range(n_kv) if not (causal and j > i)]
            logits = np.array([scale * float(q[bi, h, i] @ k[bi, kh, j]) for j in keys])
            m = logits.max()
            e = np.exp(logits - m)
            p = e / e.sum()
            o[bi, h, i] = sum(pj * v[bi, vh, j] for pj, j in zip(p, keys))
            stats[bi, h, i, 0] = m + math.log(e.sum())
    return o, stats


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_causal_gqa(causal):
    b, hq, hk, sq, skv, d = 2, 4, 2, 5, 6, 8
    q, k, v = rand(b, hq, sq, d), rand(b, hk, skv, d), rand(b, hk, skv, d)
    g = G()
    tq, tk, tv = inp(g, "q", q), inp(g, "k", k), inp(g, "v", v)
    o, stats = g.sdpa(tq, tk, tv, generate_stats=True, attn_scale=0.3, use_causal_mask=causal)
    o.set_output(True)
    stats.set_output(True)
    outs = run(g, {tq: q, tk: k, tv: v}, {o: out_for(o), stats: out_for(stats)})
    wo, ws = attention_f64(q, k, v, 0.3, causal=causal)
    close(outs[o], wo, rtol=1e-5, atol=1e-5)
    close(outs[stats], ws, rtol=1e-5, atol=1e-5)


def test_sdpa_padding_mask_bf16_addresses():
    b, hq, hk, sq, skv, d = 2, 2, 1, 4, 5, 8
    q = rand(b, hq, sq, d).astype(ml_dtypes.bfloat16)
    k = rand(b, hk, skv, d).astype(ml_dtypes.bfloat16)
    v = rand(b, hk, skv, d).astype(ml_dtypes.bfloat16)
    seq_q = np.array([3, 4], np.int32).reshape(b, 1, 1, 1)
    seq_kv = np.array([5, 2], np.int32).reshape(b, 1, 1, 1)
    g = G(io=BF16)
    tq, tk, tv = inp(g, "q", q), inp(g, "k", k), inp(g, "v", v)
    tsq, tskv = inp(g, "seq_q", seq_q), inp(g, "seq_kv", seq_kv)
    o, _ = g.sdpa(tq, tk, tv, is_inference=True, attn_scale=0.25, use_padding_mask=True,
                  seq_len_q=tsq, seq_len_kv=tskv, use_causal_mask=True)
    o.set_output(True)
    out = np.zeros((b, hq, sq, d), ml_dtypes.bfloat16)
    run(g, {tq: q, tk: k, tv: v, tsq: seq_q, tskv: seq_kv}, {o: out})
    wo, _ = attention_f64(q, k, v, 0.25, causal=True, seq_q=seq_q.ravel(), seq_kv=seq_kv.ravel())
    for bi in range(b):                                # only the valid query rows are defined
        n = int(seq_q[bi, 0, 0, 0])
        close(out[bi, :, :n], wo[bi, :, :n], rtol=2e-2, atol=2e-2)


def test_sdpa_int64_sequence_lengths():
    """INT64 seq_len tensors (cudnn-frontend checks no data type on them) mask as INT32 ones do."""
    b, hq, sq, skv, d = 2, 2, 4, 5, 8
    q, k, v = rand(b, hq, sq, d), rand(b, hq, skv, d), rand(b, hq, skv, d)
    seq_q = np.array([4, 2], np.int64).reshape(b, 1, 1, 1)
    seq_kv = np.array([3, 5], np.int64).reshape(b, 1, 1, 1)
    g = G()
    tq, tk, tv = inp(g, "q", q), inp(g, "k", k), inp(g, "v", v)
    tsq, tskv = inp(g, "seq_q", seq_q), inp(g, "seq_kv", seq_kv)
    assert tsq.data_type == cudnn.data_type.INT64
    o, _ = g.sdpa(tq, tk, tv, is_inference=True, attn_scale=0.5, use_padding_mask=True,
                  seq_len_q=tsq, seq_len_kv=tskv)
    o.set_output(True)
    out = run(g, {tq: q, tk: k, tv: v, tsq: seq_q, tskv: seq_kv}, {o: out_for(o)})[o]
    wo, _ = attention_f64(q, k, v, 0.5, seq_q=seq_q.ravel(), seq_kv=seq_kv.ravel())
    for bi in range(b):
        n = int(seq_q[bi, 0, 0, 0])
        close(out[bi, :, :n], wo[bi, :, :n], rtol=1e-5, atol=1e-5)


def test_sdpa_backward_against_finite_differences():
    b, hq, hk, sq, skv, d = 1, 2, 1, 3, 4, 4
    q, k, v = f64(rand(b, hq, sq, d)), f64(rand(b, hk, skv, d)), f64(rand(b, hk, skv, d))
    d_o = f64(rand(b, hq, sq, d))
    scale = 0.5
    o, stats = attention_f64(q, k, v, scale, causal=True)
    g = G()
    arrays = {"q": q, "k": k, "v": v, "o": o, "dO": d_o}
    t = {n: inp(g, n, a.astype(np.float32)) for n, a in arrays.items()}
    t["stats"] = inp(g, "stats", stats.astype(np.float32))
    dq, dk, dv = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], attn_scale=scale,
                                 use_causal_mask=True)
    for x in (dq, dk, dv):
        x.set_output(True)
    feeds = {t[n]: a.astype(np.float32) for n, a in arrays.items()}
    feeds[t["stats"]] = stats.astype(np.float32)
    outs = run(g, feeds, {dq: out_for(dq), dk: out_for(dk), dv: out_for(dv)})
    loss = lambda q_, k_, v_: float(np.sum(d_o * attention_f64(q_, k_, v_, scale, causal=True)[0]))  # noqa: E731
    close(outs[dq], num_grad(lambda x: loss(x, k, v), q), rtol=1e-4, atol=1e-4)
    close(outs[dk], num_grad(lambda x: loss(q, x, v), k), rtol=1e-4, atol=1e-4)
    close(outs[dv], num_grad(lambda x: loss(q, k, x), v), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------ linear attention (validation)

LA_T, LA_H, LA_K, LA_V, LA_N = 6, 2, 4, 3, 2


def _la_inputs(g, op, *, q_dt=BF16, cu_dt=INT32, cu_len=LA_N + 1, g_dt=FLOAT, h0=None, v_heads=LA_H):
    per_channel_gate = op in ("kda", "kda_bwd", "gdn2")
    ins = {
        "q": g.tensor(name="q", dim=[LA_T, LA_H, LA_K], data_type=q_dt),
        "k": g.tensor(name="k", dim=[LA_T, LA_H, LA_K], data_type=q_dt),
        "v": g.tensor(name="v", dim=[LA_T, v_heads, LA_V], data_type=q_dt),
        "g": g.tensor(name="g", dim=[LA_T, LA_H, LA_K] if per_channel_gate else [LA_T, LA_H], data_type=g_dt),
        "beta": g.tensor(name="beta", dim=[LA_T, LA_H, LA_K] if op == "gdn2" else [LA_T, LA_H], data_type=q_dt),
        "cu_seqlens": g.tensor(name="cu", dim=[cu_len], data_type=cu_dt),
    }
    if op == "gdn2":
        ins["w"] = g.tensor(name="w", dim=[LA_T, LA_H, LA_V], data_type=q_dt)
    if op.endswith("_bwd"):
        ins["dO"] = g.tensor(name="dO", dim=[LA_T, LA_H, LA_V], data_type=q_dt)
    if h0 is not None:
        ins["initial_state"] = g.tensor(name="h0", dim=list(h0), data_type=FLOAT)
    return ins


LA_OPS = ("gdn", "kda", "gdn2", "gdn_bwd", "kda_bwd")


def _la_build(op, **kw):
    g = G(io=BF16)
    final = kw.pop("final", False)
    attrs = {} if op.endswith("_bwd") else {"output_final_state": final}
    outs = getattr(g, op)(**_la_inputs(g, op, **kw), **attrs)
    for t in outs:
        if t is not None:
            t.set_output(True)
    return g, outs


@pytest.mark.parametrize("op", LA_OPS)
def test_linear_attention_valid_graph_infers_outputs(op):
    g, outs = _la_build(op, h0=(LA_N, LA_H, LA_K, LA_V), final=True)
    g.validate()
    if op.endswith("_bwd"):
        dq, dk, dv, dg, dbeta, dh0, d_a_log, d_dt_bias = outs
        assert d_a_log is None and d_dt_bias is None        # only with a_log / dt_bias (safe_gate)
        assert (dq.dim, dk.dim, dv.dim) == ((LA_T, LA_H, LA_K),) * 2 + ((LA_T, LA_H, LA_V),)
        assert dg.data_type == FLOAT and dq.data_type == BF16
        assert dh0.dim == (LA_N, LA_H, LA_K, LA_V) and dh0.data_type == FLOAT
    else:
        o, final, checkpoints = outs                       # the frontend's [O, final_state, state_checkpoints]
        assert checkpoints is None                         # only with checkpoint_every_n_tokens
        assert o.dim == (LA_T, LA_H, LA_V) and o.data_type == BF16
        assert final.dim == (LA_N, LA_H, LA_K, LA_V) and final.data_type == FLOAT
    assert SCHEMAS[op].python_only


@pytest.mark.parametrize("op", LA_OPS)
@pytest.mark.parametrize("bad,port,match", [
    (dict(cu_dt=FLOAT), "cu_seqlens", "INT32"),
    (dict(cu_len=1), "cu_seqlens", "N \\+ 1 >= 2"),
    (dict(g_dt=HALF), "g", "FLOAT"),
    (dict(q_dt=INT32), "q", "data type"),
    (dict(h0=(LA_N + 1, LA_H, LA_K, LA_V)), "initial_state", "N=2"),
    (dict(h0=(LA_N, LA_H, LA_K, LA_V + 1)), "initial_state", "dims"),
    (dict(v_heads=LA_H + 1), "v", "multiple of the H=2"),
])
def test_linear_attention_invalid_graphs(op, bad, port, match):
    g, _ = _la_build(op, **bad)
    with pytest.raises(GraphValidationError, match=match) as info:
        g.validate()
    assert info.value.port == port and info.value.op == op


def test_linear_attention_conditional_outputs():
    _, (o, final, checkpoints) = _la_build("gdn")
    assert final is None and checkpoints is None
    _, outs = _la_build("kda_bwd")
    assert outs[5] is None                             # d_initial_state only with initial_state


@pytest.mark.parametrize("op", LA_OPS)
def test_linear_attention_on_the_reference_engine(op, monkeypatch):
    from cudnn_graph.engines.reference import engine as reference_engine
    g, _ = _la_build(op)
    if op in reference_engine.KERNELS:
        g.create_execution_plans()                     # the reference runs it: it is in the plan list
        assert [p.label for p in g.plans] == ["reference"]
    # Without a kernel the reference declines, naming the op.
    monkeypatch.delitem(reference_engine.KERNELS, op, raising=False)
    g2, _ = _la_build(op)
    with pytest.raises(PlanEntryError, match=f"reference: the reference engine has no kernel for {op}") as info:
        g2.build()
    assert isinstance(info.value, GraphNotSupportedError)


# ------------------------------------------------------------------------------------------- coverage

def test_every_op_builder_is_executed_here():
    """Every op the reference runs is called as a builder somewhere in this file, or for the sampling
    ops in test_backend_layout.py, whose reference runs sit beside their GPU counterparts (static check)."""
    here = pathlib.Path(__file__)
    source = here.read_text() + (REPO_ROOT / "tests" / "engines" / "cudnn_backend" / "test_backend_layout.py").read_text()
    called = set(re.findall(r"\bg2?\.(\w+)\(", source))
    called |= set(POINTWISE)                           # driven through getattr(g, op)
    linear_attention = {name for name, s in SCHEMAS.items() if s.family == "linear_attention"}
    missing = set(SCHEMAS) - linear_attention - called
    assert not missing, f"op builders never executed here: {sorted(missing)}"
