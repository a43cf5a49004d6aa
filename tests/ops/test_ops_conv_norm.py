"""Convolution and normalization ops: schema inference, validation errors and reference kernels.

Kernels are checked against formulas written here independently: direct nested loops for conv fprop,
the adjoint identity <conv(x, w), dy> == <x, dgrad(dy, w)> == <w, wgrad(x, dy)> plus finite differences
for dgrad / wgrad, explicit per-group formulas for the norm forwards and finite differences of those
formulas for the norm backwards.
"""
from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest

from cudnn_graph.engines.reference import _kernels_conv, _kernels_norm
from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphValidationError
from cudnn_graph.ops import SCHEMAS
from cudnn_graph.ops._norms import NormFwdPhase
from cudnn_graph.ops.schema import REQUIRED, InferContext, TensorInfo


KC = _kernels_conv.KERNELS
KN = _kernels_norm.KERNELS
TRAIN, INFER = NormFwdPhase.TRAINING, NormFwdPhase.INFERENCE
F64 = DataType.DOUBLE


# ----------------------------------------------------------------------------------------- helpers

def T(*dim, dt=DataType.HALF):
    stride, acc = [], 1
    for d in reversed(dim):
        stride.insert(0, acc)
        acc *= d
    return TensorInfo(tuple(dim), tuple(stride), dt)


def make_ctx(op, inputs, **attrs):
    """What the IR does before calling infer: fill every port, apply Attr defaults and converters."""
    schema = SCHEMAS[op]
    ins = {p.name: inputs.get(p.name) for p in schema.inputs}
    done = {}
    for a in schema.attrs:
        v = attrs.pop(a.name, a.default)
        assert v is not REQUIRED, f"test forgot required attr {a.name}"
        done[a.name] = a.convert(v) if (a.convert and v is not None) else v
    assert not attrs, f"unknown attrs {attrs}"
    return InferContext(node="n0", op=op, inputs=ins, attrs=done, compute_data_type=DataType.FLOAT,
                        intermediate_data_type=DataType.FLOAT, io_data_type=DataType.HALF)


def infer(op, inputs, **attrs):
    ctx = make_ctx(op, inputs, **attrs)
    out = SCHEMAS[op].infer(ctx)
    # The outputs infer returns are exactly those whose `when` holds.
    given = frozenset(k for k, v in ctx.inputs.items() if v is not None)
    expect = [o.name for o in SCHEMAS[op].outputs if o.when is None or o.when(ctx.attrs, given)]
    assert list(out) == expect
    return {k: (v.dim, v.data_type) for k, v in out.items()}


def fails(op, inputs, port, **attrs):
    with pytest.raises(GraphValidationError) as ei:
        SCHEMAS[op].infer(make_ctx(op, inputs, **attrs))
    assert ei.value.port == port, str(ei.value)
    assert ei.value.node == "n0" and ei.value.op == op
    return str(ei.value)


CONV = dict(padding=[1, 1], stride=[1, 1], dilation=[1, 1])


# ------------------------------------------------------------------------------- pygraph surface

def test_pygraph_names_positional_order_and_outputs():
    s = SCHEMAS
    assert s["conv_fprop"].positional[:2] == ("image", "weight")
    assert s["conv_dgrad"].positional[:2] == ("loss", "filter")
    assert s["conv_wgrad"].positional[:2] == ("image", "loss")
    for op in ("conv_fprop", "conv_dgrad", "conv_wgrad"):
        assert {a.name for a in s[op].attrs} == {"padding", "pre_padding", "post_padding", "stride", "dilation",
                                                "convolution_mode"}
        assert s[op].returns == "single"
    assert s["batchnorm"].positional == ("input", "scale", "bias", "in_running_mean", "in_running_var",
                                         "epsilon", "momentum", "peer_stats")
    assert s["batchnorm"].output_names() == ("Y", "mean", "inv_variance", "out_running_mean", "out_running_var")
    assert s["batchnorm_inference"].positional == ("input", "mean", "inv_variance", "scale", "bias")
    assert s["batchnorm_inference"].returns == "single"
    for op in ("layernorm", "adalayernorm", "rmsnorm", "instancenorm"):
        assert s[op].positional == ("norm_forward_phase", "input", "scale", "bias", "epsilon")
        assert s[op].returns == "list"
    assert s["rmsnorm"].output_names() == ("Y", "inv_variance")
    assert s["layernorm"].output_names() == ("Y", "mean", "inv_variance")
    for op in ("batchnorm_backward", "layernorm_backward", "adalayernorm_backward", "instancenorm_backward"):
        assert s[op].positional[:5] == ("grad", "input", "scale", "mean", "inv_variance")
        assert s[op].output_names() == ("DX", "dscale", "dbias")
    assert s["rmsnorm_backward"].positional == ("grad", "input", "scale", "inv_variance", "has_dbias")
    assert s["genstats"].output_names() == ("sum", "sq_sum")
    # Optional ports mirror pygraph's None defaults.
    assert [p.name for p in s["rmsnorm"].inputs if p.optional] == ["bias"]
    assert [p.name for p in s["adalayernorm"].inputs if p.optional] == ["bias"]
    assert [p.name for p in s["instancenorm_backward"].inputs if p.optional] == ["mean", "inv_variance"]


# ------------------------------------------------------------------------------ inference: conv

def test_conv_fprop_infer_2d_groups_stride_dilation_asymmetric_padding():
    x, w = T(2, 6, 11, 9), T(4, 3, 3, 2)   # groups = 6 / 3 = 2
    out = infer("conv_fprop", {"image": x, "weight": w}, pre_padding=[1, 0], post_padding=[2, 1],
                stride=[2, 3], dilation=[2, 1])
    h = 1 + (11 + 1 + 2 - 2 * (3 - 1) - 1) // 2
    wd = 1 + (9 + 0 + 1 - 1 * (2 - 1) - 1) // 3
    assert out == {"Y": ((2, 4, h, wd), None)}
    y = SCHEMAS["conv_fprop"].infer(make_ctx("conv_fprop", {"image": x, "weight": w}, **CONV))["Y"]
    # pygraph's provisional stride for conv outputs is channels-last.
    n, k, hh, ww = y.dim
    assert y.stride == (k * hh * ww, 1, ww * k, k)


def test_conv_fprop_infer_3d_and_mode():
    out = infer("conv_fprop", {"image": T(1, 4, 5, 6, 7), "weight": T(8, 4, 3, 3, 3)},
                padding=[1, 1, 0], stride=[1, 2, 1], dilation=[1, 1, 2], convolution_mode="CONVOLUTION")
    assert out == {"Y": ((1, 8, 5, 3, 3), None)}
    ctx = make_ctx("conv_fprop", {}, padding=[0, 0], stride=[1, 1], dilation=[1, 1],
                   convolution_mode=types.SimpleNamespace(name="CROSS_CORRELATION"))
    assert ctx.attrs["convolution_mode"].name == "CROSS_CORRELATION"


def _assert_output_dims_checked(op, inputs, port, good, bad):
    """``op``'s validate_outputs (on a CONV-geometry context over ``inputs``) accepts ``good`` dims for
    ``port`` and rejects each of ``bad`` with a GraphValidationError naming the port."""
    ctx = make_ctx(op, inputs, **CONV)
    validate_outputs = SCHEMAS[op].validate_outputs
    validate_outputs(ctx, {port: good})
    for dims in bad:
        with pytest.raises(GraphValidationError) as ei:
            validate_outputs(ctx, {port: dims})
        assert ei.value.port == port


def test_conv_dgrad_wgrad_infer_leave_dims_to_the_user():
    assert infer("conv_dgrad", {"loss": T(2, 4, 5, 5), "filter": T(4, 3, 3, 3)}, **CONV) == {"DX": (None, None)}
    assert infer("conv_wgrad", {"image": T(2, 6, 5, 5), "loss": T(2, 4, 5, 5)}, **CONV) == {"DW": (None, None)}
    # Once the user has set the dims, validate_outputs checks them against the geometry.
    _assert_output_dims_checked("conv_dgrad", {"loss": T(2, 4, 5, 5), "filter": T(4, 3, 3, 3)}, "DX", (2, 6, 5, 5),
                                [(2, 6, 7, 5), None])
    _assert_output_dims_checked("conv_wgrad", {"image": T(2, 6, 5, 5), "loss": T(2, 4, 5, 5)}, "DW", (4, 3, 3, 3),
                                [(4, 3, 5, 3), (4, 4, 3, 3)])   # 6 % 4 != 0


# ------------------------------------------------------------------------------ inference: norms

def test_batchnorm_infer_with_and_without_running_stats():
    x, pc, one = T(4, 3, 5, 5), T(1, 3, 1, 1, dt=DataType.FLOAT), T(1, 1, 1, 1, dt=DataType.FLOAT)
    base = {"input": x, "scale": pc, "bias": pc, "epsilon": one}
    out = infer("batchnorm", {**base, "in_running_mean": pc, "in_running_var": pc, "momentum": one})
    assert out == {"Y": ((4, 3, 5, 5), None), "mean": ((1, 3, 1, 1), None), "inv_variance": ((1, 3, 1, 1), None),
                   "out_running_mean": ((1, 3, 1, 1), None), "out_running_var": ((1, 3, 1, 1), None)}
    assert list(infer("batchnorm", base)) == ["Y", "mean", "inv_variance"]
    assert infer("batchnorm_inference", {"input": x, "mean": pc, "inv_variance": pc, "scale": pc, "bias": pc}) \
        == {"Y": ((4, 3, 5, 5), None)}
    assert infer("batchnorm_backward", {"grad": x, "input": x, "scale": pc, "mean": pc, "inv_variance": pc}) \
        == {"DX": ((4, 3, 5, 5), None), "dscale": ((1, 3, 1, 1), None), "dbias": ((1, 3, 1, 1), None)}


def test_layernorm_family_infer():
    x, s, one = T(6, 8, 1, 1), T(1, 8, 1, 1), T(1, 1, 1, 1, dt=DataType.FLOAT)
    ins = {"input": x, "scale": s, "bias": s, "epsilon": one}
    assert infer("layernorm", ins, norm_forward_phase=TRAIN) == {
        "Y": ((6, 8, 1, 1), None), "mean": ((6, 1, 1, 1), None), "inv_variance": ((6, 1, 1, 1), None)}
    assert infer("layernorm", ins, norm_forward_phase="INFERENCE") == {"Y": ((6, 8, 1, 1), None)}
    # 3-D tokens with a hidden-only scale: statistics per (batch, token).
    x3, s3 = T(2, 5, 8), T(1, 1, 8)
    assert infer("layernorm", {"input": x3, "scale": s3, "bias": s3, "epsilon": one}, norm_forward_phase=TRAIN)[
        "mean"] == ((2, 5, 1), None)
    st = T(6, 1, 1, 1, dt=DataType.FLOAT)
    assert infer("layernorm_backward", {"grad": x, "input": x, "scale": s, "mean": st, "inv_variance": st}) == {
        "DX": ((6, 8, 1, 1), None), "dscale": ((1, 8, 1, 1), None), "dbias": ((1, 8, 1, 1), None)}
    # rmsnorm: no mean; bias optional; dbias only with has_dbias.
    assert infer("rmsnorm", {"input": x, "scale": s, "epsilon": one}, norm_forward_phase=TRAIN) == {
        "Y": ((6, 8, 1, 1), None), "inv_variance": ((6, 1, 1, 1), None)}
    assert infer("rmsnorm", {"input": x, "scale": s, "bias": s, "epsilon": one},
                 norm_forward_phase=INFER) == {"Y": ((6, 8, 1, 1), None)}
    rb = {"grad": x, "input": x, "scale": s, "inv_variance": st}
    assert list(infer("rmsnorm_backward", rb, has_dbias=True)) == ["DX", "dscale", "dbias"]
    assert infer("rmsnorm_backward", rb, has_dbias=False) == {"DX": ((6, 8, 1, 1), None),
                                                             "dscale": ((1, 8, 1, 1), None)}
    # adaptive layernorm: per-sample scale; statistics per token.
    xa, sa = T(2, 5, 8), T(2, 1, 8)
    assert infer("adalayernorm", {"input": xa, "scale": sa, "epsilon": one}, norm_forward_phase=TRAIN) == {
        "Y": ((2, 5, 8), None), "mean": ((2, 5, 1), None), "inv_variance": ((2, 5, 1), None)}
    sta = T(2, 5, 1, dt=DataType.FLOAT)
    assert infer("adalayernorm_backward", {"grad": xa, "input": xa, "scale": sa, "mean": sta,
                                           "inv_variance": sta})["dscale"] == ((2, 1, 8), None)


def test_instancenorm_and_genstats_infer():
    x, pc, one = T(2, 3, 4, 5), T(1, 3, 1, 1), T(1, 1, 1, 1)
    assert infer("instancenorm", {"input": x, "scale": pc, "bias": pc, "epsilon": one},
                 norm_forward_phase=TRAIN) == {"Y": ((2, 3, 4, 5), None), "mean": ((2, 3, 1, 1), None),
                                               "inv_variance": ((2, 3, 1, 1), None)}
    st = T(2, 3, 1, 1)
    assert infer("instancenorm_backward", {"grad": x, "input": x, "scale": pc, "mean": st, "inv_variance": st}) \
        == {"DX": ((2, 3, 4, 5), None), "dscale": ((1, 3, 1, 1), None), "dbias": ((1, 3, 1, 1), None)}
    assert infer("genstats", {"input": T(2, 3, 4, 4, 4)}) == {"sum": ((1, 3, 1, 1, 1), None),
                                                             "sq_sum": ((1, 3, 1, 1, 1), None)}


# ------------------------------------------------------------------------------- invalid graphs

def test_conv_invalid_graphs_name_the_port():
    ok = {"image": T(1, 4, 8, 8), "weight": T(2, 4, 3, 3)}
    assert "channel mismatch" in fails("conv_fprop", {"image": T(1, 5, 8, 8), "weight": T(2, 2, 3, 3)}, "weight",
                                       **CONV)
    fails("conv_fprop", {"image": T(1, 4, 8, 8), "weight": T(3, 2, 3, 3)}, "weight", **CONV)  # K=3, groups=2
    fails("conv_fprop", {"image": T(4, 8, 8), "weight": T(2, 4, 3)}, "image", padding=[1], stride=[1],
          dilation=[1])
    fails("conv_fprop", {"image": T(1, 4, 8, 8), "weight": T(2, 4, 3, 3, 3)}, "weight", **CONV)
    assert "impossible conv padding" in fails("conv_fprop", {"image": T(1, 4, 2, 8), "weight": T(2, 4, 5, 3)},
                                              "padding", padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    fails("conv_fprop", {"image": T(1, 4, 2, 8), "weight": T(2, 4, 3, 3)}, "pre_padding", pre_padding=[0, 0],
          post_padding=[0, 0], stride=[1, 1], dilation=[2, 1])   # dilated extent 5 > 2
    fails("conv_fprop", ok, "stride", padding=[1, 1], stride=[1, 0], dilation=[1, 1])
    fails("conv_fprop", ok, "dilation", padding=[1, 1], stride=[1, 1], dilation=[0, 1])
    fails("conv_fprop", ok, "pre_padding", pre_padding=[-1, 0], post_padding=[0, 0], stride=[1, 1],
          dilation=[1, 1])
    fails("conv_fprop", ok, "dilation", padding=[1, 1], stride=[1, 1], dilation=[1, 1, 1])
    fails("conv_fprop", ok, "padding", padding=[1, 1], pre_padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    fails("conv_fprop", ok, "stride", padding=[1, 1], dilation=[1, 1])              # not set, as in pygraph
    fails("conv_fprop", ok, "padding", stride=[1, 1], dilation=[1, 1])
    fails("conv_fprop", ok, "post_padding", pre_padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    fails("conv_fprop", {"image": T(1, 4, 8, 8)}, "weight", **CONV)
    fails("conv_dgrad", {"loss": T(1, 3, 8, 8), "filter": T(2, 4, 3, 3)}, "filter", **CONV)
    fails("conv_wgrad", {"image": T(2, 4, 8, 8), "loss": T(1, 2, 8, 8)}, "loss", **CONV)
    with pytest.raises((TypeError, ValueError)):
        make_ctx("conv_fprop", ok, convolution_mode="SIDEWAYS", **CONV)
    with pytest.raises(TypeError):
        make_ctx("conv_fprop", ok, padding=[1.5, 1], stride=[1, 1], dilation=[1, 1])


def test_norm_invalid_graphs_name_the_port():
    x, pc, one = T(4, 3, 5, 5), T(1, 3, 1, 1), T(1, 1, 1, 1)
    bn = {"input": x, "scale": pc, "bias": pc, "epsilon": one}
    assert "in_running_mean" in fails("batchnorm", {**bn, "momentum": one}, "in_running_mean")
    fails("batchnorm", {**bn, "in_running_mean": pc, "in_running_var": pc}, "momentum")
    fails("batchnorm", {**bn, "in_running_mean": pc, "momentum": one}, "in_running_var")
    fails("batchnorm", {**bn, "in_running_mean": T(1, 4, 1, 1), "in_running_var": pc, "momentum": one},
          "in_running_mean")
    fails("batchnorm", {**bn, "scale": T(1, 4, 1, 1)}, "scale")
    fails("batchnorm", {**bn, "epsilon": T(2, 1, 1, 1)}, "epsilon")
    fails("batchnorm", {k: v for k, v in bn.items() if k != "epsilon"}, "epsilon")
    fails("batchnorm_inference", {"input": x, "mean": pc, "inv_variance": T(1, 3, 1, 2), "scale": pc,
                                  "bias": pc}, "inv_variance")
    fails("batchnorm_backward", {"grad": T(4, 3, 5, 4), "input": x, "scale": pc, "mean": pc,
                                 "inv_variance": pc}, "grad")
    lx, ls = T(6, 8, 1, 1), T(1, 8, 1, 1)
    ln = {"input": lx, "scale": ls, "bias": ls, "epsilon": one}
    fails("layernorm", {**ln, "scale": T(1, 7, 1, 1)}, "scale", norm_forward_phase=TRAIN)
    fails("layernorm", {**ln, "scale": T(1, 8)}, "scale", norm_forward_phase=TRAIN)
    fails("layernorm", {**ln, "scale": T(6, 8, 1, 1)}, "scale", norm_forward_phase=TRAIN)  # batch axis
    fails("layernorm", {**ln, "bias": T(1, 8, 1, 2)}, "bias", norm_forward_phase=TRAIN)
    fails("layernorm", {k: v for k, v in ln.items() if k != "input"}, "input", norm_forward_phase=TRAIN)
    fails("layernorm_backward", {"grad": lx, "input": lx, "scale": ls, "mean": T(1, 8, 1, 1),
                                 "inv_variance": T(6, 1, 1, 1)}, "mean")
    fails("rmsnorm", {"input": lx, "scale": ls, "bias": T(1, 4, 1, 1), "epsilon": one}, "bias",
          norm_forward_phase=TRAIN)
    fails("instancenorm_backward", {"grad": x, "input": x, "scale": pc}, "mean")
    fails("instancenorm", {"input": T(4, 3), "scale": T(1, 3), "bias": T(1, 3), "epsilon": one}, "input",
          norm_forward_phase=TRAIN)
    with pytest.raises(ValueError):
        make_ctx("layernorm", ln, norm_forward_phase="NOT_SET")
    with pytest.raises(TypeError):
        make_ctx("rmsnorm_backward", {}, has_dbias="yes")


# ------------------------------------------------------------------------------ conv kernels

def direct_conv(x, w, pre, post, stride, dilation, flip=False):
    """Y by nested loops; padding handled by bounds checks (no padded copy); any spatial rank."""
    n_, c_, *sp = x.shape
    k_, cg, *taps = w.shape
    g = c_ // cg
    kg = k_ // g
    out = [1 + (s + a + b - d * (r - 1) - 1) // st for s, a, b, r, st, d in zip(sp, pre, post, taps, stride, dilation)]
    y = np.zeros([n_, k_] + out)
    for n, k in itertools.product(range(n_), range(k_)):
        grp = k // kg
        for o in itertools.product(*map(range, out)):
            acc = 0.0
            for cl in range(cg):
                c = grp * cg + cl
                for t in itertools.product(*map(range, taps)):
                    idx = [oi * st + ti * d - a for oi, ti, st, d, a in zip(o, t, stride, dilation, pre)]
                    if all(0 <= i < s for i, s in zip(idx, sp)):
                        tw = tuple(r - 1 - ti for r, ti in zip(taps, t)) if flip else t
                        acc += x[(n, c) + tuple(idx)] * w[(k, cl) + tw]
            y[(n, k) + o] = acc
    return y


def _attrs(pre, post, stride, dilation, mode="CROSS_CORRELATION"):
    return {"pre_padding": tuple(pre), "post_padding": tuple(post), "stride": tuple(stride),
            "dilation": tuple(dilation), "convolution_mode": mode, "padding": None}


CASES = [  # x dims, w dims, pre, post, stride, dilation, mode
    ((2, 4, 7, 6), (6, 2, 3, 2), (1, 0), (2, 1), (2, 1), (1, 2), "CROSS_CORRELATION"),
    ((1, 3, 6, 7), (2, 3, 2, 3), (0, 2), (1, 0), (1, 3), (2, 1), "CONVOLUTION"),
    ((1, 4, 4, 5, 4), (4, 2, 2, 3, 2), (1, 0, 1), (0, 1, 1), (2, 1, 1), (1, 1, 2), "CROSS_CORRELATION"),
    ((2, 2, 3, 4, 5), (2, 1, 2, 2, 3), (0, 1, 2), (1, 0, 0), (1, 2, 1), (2, 1, 1), "CONVOLUTION"),
]


@pytest.mark.parametrize("xd,wd,pre,post,stride,dil,mode", CASES)
def test_conv_fprop_matches_direct_loops(xd, wd, pre, post, stride, dil, mode):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    ref = direct_conv(x, w, pre, post, stride, dil, flip=(mode == "CONVOLUTION"))
    got = KC["conv_fprop"]({"image": x.astype(np.float32), "weight": w.astype(np.float32)},
                           _attrs(pre, post, stride, dil, mode), {"Y": (ref.shape, np.float32)},
                           DataType.FLOAT)["Y"]
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_conv_fprop_symmetric_padding_attr_and_bf16():
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 5, 5)).astype(ml.bfloat16)
    w = rng.standard_normal((3, 2, 3, 3)).astype(ml.bfloat16)
    ref = direct_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), (1, 1))
    attrs = {"padding": (1, 1), "stride": (1, 1), "dilation": (1, 1), "convolution_mode": "CROSS_CORRELATION"}
    got = KC["conv_fprop"]({"image": x, "weight": w}, attrs, {"Y": (ref.shape, ml.bfloat16)}, DataType.FLOAT)["Y"]
    assert got.dtype == ml.bfloat16
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-2, atol=5e-2)


def _conv_all(x, w, dy, attrs):
    y = KC["conv_fprop"]({"image": x, "weight": w}, attrs, {"Y": (dy.shape, None)}, F64)["Y"]
    dx = KC["conv_dgrad"]({"loss": dy, "filter": w}, attrs, {"DX": (x.shape, None)}, F64)["DX"]
    dw = KC["conv_wgrad"]({"image": x, "loss": dy}, attrs, {"DW": (w.shape, None)}, F64)["DW"]
    return y, dx, dw


def y_dims(xd, wd, pre, post, stride, dil):
    sp = [1 + (s + a + b - d * (r - 1) - 1) // st
          for s, r, a, b, st, d in zip(xd[2:], wd[2:], pre, post, stride, dil)]
    return (xd[0], wd[0], *sp)


@pytest.mark.parametrize("xd,wd,pre,post,stride,dil,mode", CASES + [
    # stride 3 over an extent the floor division does not cover: trailing inputs get zero gradient
    ((1, 2, 8, 7), (2, 2, 2, 2), (0, 1), (0, 0), (3, 2), (1, 1), "CROSS_CORRELATION"),
])
def test_conv_dgrad_wgrad_are_adjoints(xd, wd, pre, post, stride, dil, mode):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    dy = rng.standard_normal(y_dims(xd, wd, pre, post, stride, dil))
    y, dx, dw = _conv_all(x, w, dy, _attrs(pre, post, stride, dil, mode))
    lhs = float(np.sum(y * dy))
    assert dx.shape == x.shape and dw.shape == w.shape
    assert lhs == pytest.approx(float(np.sum(x * dx)), rel=1e-10, abs=1e-10)
    assert lhs == pytest.approx(float(np.sum(w * dw)), rel=1e-10, abs=1e-10)


def test_conv_dgrad_wgrad_finite_differences():
    rng = np.random.default_rng(4)
    xd, wd, pre, post, stride, dil = (1, 4, 5, 4), (2, 2, 2, 3), (1, 0), (0, 2), (2, 1), (1, 2)   # groups = 2
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    attrs = _attrs(pre, post, stride, dil, "CONVOLUTION")
    dy = rng.standard_normal(y_dims(xd, wd, pre, post, stride, dil))
    _, dx, dw = _conv_all(x, w, dy, attrs)

    def loss(xx, ww):
        y = KC["conv_fprop"]({"image": xx, "weight": ww}, attrs, {"Y": (dy.shape, None)}, F64)["Y"]
        return float(np.sum(y * dy))

    h = 1e-6
    for arr, grad, which in ((x, dx, 0), (w, dw, 1)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            p, m = arr.copy(), arr.copy()
            p[idx] += h
            m[idx] -= h
            num[idx] = ((loss(p, w) - loss(m, w)) if which == 0 else (loss(x, p) - loss(x, m))) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------ norm kernels

EPS = 1e-3


def run(op, inputs, outputs, attrs=None, compute=F64):
    return KN[op](inputs, attrs or {}, {k: (v, None) for k, v in outputs.items()}, compute)


def ref_standardize(v):
    mu = sum(v.ravel()) / v.size
    var = sum((e - mu) ** 2 for e in v.ravel()) / v.size
    return mu, 1.0 / math.sqrt(var + EPS)


def test_batchnorm_forward_matches_per_channel_formula():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4, 3))
    s, b = rng.standard_normal((1, 2, 1, 1)), rng.standard_normal((1, 2, 1, 1))
    rm, rv = rng.standard_normal((1, 2, 1, 1)), rng.random((1, 2, 1, 1)) + 0.5
    mom = 0.1
    pc = (1, 2, 1, 1)
    got = run("batchnorm", {"input": x, "scale": s, "bias": b, "in_running_mean": rm, "in_running_var": rv,
                            "epsilon": np.full((1, 1, 1, 1), EPS), "momentum": np.full((1, 1, 1, 1), mom)},
              {"Y": x.shape, "mean": pc, "inv_variance": pc, "out_running_mean": pc, "out_running_var": pc})
    for c in range(2):
        v = x[:, c]
        mu, inv = ref_standardize(v)
        np.testing.assert_allclose(got["Y"][:, c], (v - mu) * inv * s[0, c, 0, 0] + b[0, c, 0, 0], rtol=1e-12)
        assert got["mean"][0, c, 0, 0] == pytest.approx(mu)
        assert got["inv_variance"][0, c, 0, 0] == pytest.approx(inv)
        unbiased = sum((e - mu) ** 2 for e in v.ravel()) / (v.size - 1)
        assert got["out_running_mean"][0, c, 0, 0] == pytest.approx((1 - mom) * rm[0, c, 0, 0] + mom * mu)
        assert got["out_running_var"][0, c, 0, 0] == pytest.approx((1 - mom) * rv[0, c, 0, 0] + mom * unbiased)
    inf = run("batchnorm_inference", {"input": x, "mean": got["mean"], "inv_variance": got["inv_variance"],
                                      "scale": s, "bias": b}, {"Y": x.shape})
    np.testing.assert_allclose(inf["Y"], got["Y"], rtol=1e-12)
    with pytest.raises(NotImplementedError):
        run("batchnorm", {"input": x, "scale": s, "bias": b, "epsilon": np.array([EPS])}, {"Y": x.shape},
            attrs={"peer_stats": ("t0",)})


def test_layer_rms_instance_adaptive_forward_match_formulas():
    rng = np.random.default_rng(6)
    eps = np.full((1, 1, 1, 1), EPS)
    # layernorm over (C, H, W) per sample
    x = rng.standard_normal((3, 4, 2, 2))
    s, b = rng.standard_normal((1, 4, 2, 2)), rng.standard_normal((1, 4, 2, 2))
    got = run("layernorm", {"input": x, "scale": s, "bias": b, "epsilon": eps},
              {"Y": x.shape, "mean": (3, 1, 1, 1), "inv_variance": (3, 1, 1, 1)})
    for n in range(3):
        mu, inv = ref_standardize(x[n])
        np.testing.assert_allclose(got["Y"][n], (x[n] - mu) * inv * s[0] + b[0], rtol=1e-12)
        assert got["mean"][n, 0, 0, 0] == pytest.approx(mu) and got["inv_variance"][n, 0, 0, 0] == pytest.approx(inv)
    # rmsnorm per token of (B, S, H), with and without bias
    x = rng.standard_normal((2, 3, 5))
    s, b = rng.standard_normal((1, 1, 5)), rng.standard_normal((1, 1, 5))
    got = run("rmsnorm", {"input": x, "scale": s, "bias": b, "epsilon": eps}, {"Y": x.shape, "inv_variance": (2, 3, 1)})
    nob = run("rmsnorm", {"input": x, "scale": s, "bias": None, "epsilon": eps}, {"Y": x.shape})
    for bi, si in itertools.product(range(2), range(3)):
        v = x[bi, si]
        r = 1.0 / math.sqrt(sum(e * e for e in v) / v.size + EPS)
        np.testing.assert_allclose(got["Y"][bi, si], v * r * s[0, 0] + b[0, 0], rtol=1e-12)
        np.testing.assert_allclose(nob["Y"][bi, si], v * r * s[0, 0], rtol=1e-12)
        assert got["inv_variance"][bi, si, 0] == pytest.approx(r)
    # instancenorm per (n, c)
    x = rng.standard_normal((2, 3, 3, 4))
    s, b = rng.standard_normal((1, 3, 1, 1)), rng.standard_normal((1, 3, 1, 1))
    got = run("instancenorm", {"input": x, "scale": s, "bias": b, "epsilon": eps},
              {"Y": x.shape, "mean": (2, 3, 1, 1), "inv_variance": (2, 3, 1, 1)})
    for n, c in itertools.product(range(2), range(3)):
        mu, inv = ref_standardize(x[n, c])
        np.testing.assert_allclose(got["Y"][n, c], (x[n, c] - mu) * inv * s[0, c, 0, 0] + b[0, c, 0, 0], rtol=1e-12)
        assert got["mean"][n, c, 0, 0] == pytest.approx(mu)
    # adaptive layernorm: per-sample scale / bias, statistics per token
    x = rng.standard_normal((2, 3, 6))
    s, b = rng.standard_normal((2, 1, 6)), rng.standard_normal((2, 1, 6))
    got = run("adalayernorm", {"input": x, "scale": s, "bias": b, "epsilon": eps},
              {"Y": x.shape, "mean": (2, 3, 1), "inv_variance": (2, 3, 1)})
    for bi, si in itertools.product(range(2), range(3)):
        mu, inv = ref_standardize(x[bi, si])
        np.testing.assert_allclose(got["Y"][bi, si], (x[bi, si] - mu) * inv * s[bi, 0] + b[bi, 0], rtol=1e-12)
        assert got["inv_variance"][bi, si, 0] == pytest.approx(inv)
    # genstats per channel
    x = rng.standard_normal((2, 3, 2, 2))
    got = run("genstats", {"input": x}, {"sum": (1, 3, 1, 1), "sq_sum": (1, 3, 1, 1)})
    for c in range(3):
        assert got["sum"][0, c, 0, 0] == pytest.approx(sum(x[:, c].ravel()))
        assert got["sq_sum"][0, c, 0, 0] == pytest.approx(sum(e * e for e in x[:, c].ravel()))


def test_norm_forward_float32_and_bf16_inputs():
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8, 1, 1)).astype(ml.bfloat16)
    s = np.ones((1, 8, 1, 1), np.float32)
    got = KN["layernorm"]({"input": x, "scale": s, "bias": s * 0, "epsilon": np.array([[[[EPS]]]], np.float32)},
                          {}, {"Y": ((4, 8, 1, 1), ml.bfloat16), "mean": ((4, 1, 1, 1), np.float32)},
                          DataType.FLOAT)
    assert got["Y"].dtype == ml.bfloat16 and got["mean"].dtype == np.float32
    xf = x.astype(np.float64)
    np.testing.assert_allclose(got["mean"][:, 0, 0, 0], xf.mean(axis=(1, 2, 3)), rtol=1e-5)


# Independent forward formulas (vectorised) used to finite-difference the backward kernels.

def _fwd_ref(kind, x, s, b):
    if kind == "batchnorm":
        axes = (0, 2, 3)
    elif kind == "instancenorm":
        axes = (2, 3)
    elif kind == "layernorm":
        axes = (1, 2, 3)
    else:                      # adalayernorm / rmsnorm on (B, S, H): per token
        axes = (2,)
    if kind == "rmsnorm":
        return x / np.sqrt((x ** 2).mean(axis=axes, keepdims=True) + EPS) * s + b
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS) * s + b


BWD = [  # kind, x dims, scale dims, stats dims
    ("batchnorm", (3, 2, 2, 3), (1, 2, 1, 1), (1, 2, 1, 1)),
    ("layernorm", (3, 2, 2, 2), (1, 2, 2, 2), (3, 1, 1, 1)),
    ("instancenorm", (2, 2, 3, 2), (1, 2, 1, 1), (2, 2, 1, 1)),
    ("adalayernorm", (2, 3, 4), (2, 1, 4), (2, 3, 1)),
    ("rmsnorm", (2, 3, 4), (1, 1, 4), (2, 3, 1)),
]


@pytest.mark.parametrize("kind,xd,sd,std", BWD)
def test_norm_backward_matches_finite_differences(kind, xd, sd, std):
    rng = np.random.default_rng(8)
    x, s, b = rng.standard_normal(xd), rng.standard_normal(sd), rng.standard_normal(sd)
    dy = rng.standard_normal(xd)
    eps = np.full((1,) * len(xd), EPS)
    fwd = run(kind, {"input": x, "scale": s, "bias": b, "epsilon": eps},
              {"Y": xd, "inv_variance": std, **({} if kind == "rmsnorm" else {"mean": std})},
              attrs={"norm_forward_phase": TRAIN})
    np.testing.assert_allclose(fwd["Y"], _fwd_ref(kind, x, s, b), rtol=1e-10, atol=1e-12)
    ins = {"grad": dy, "input": x, "scale": s, "inv_variance": fwd["inv_variance"]}
    if kind != "rmsnorm":
        ins["mean"] = fwd["mean"]
    attrs = {"has_dbias": True} if kind == "rmsnorm" else {}
    got = run(f"{kind}_backward", ins, {"DX": xd, "dscale": sd, "dbias": sd}, attrs=attrs)

    def loss(xx, ss, bb):
        return float(np.sum(_fwd_ref(kind, xx, ss, bb) * dy))

    h = 1e-6
    for pos, grad in ((0, got["DX"]), (1, got["dscale"]), (2, got["dbias"])):
        base = [x, s, b]
        num = np.zeros_like(base[pos])
        for idx in np.ndindex(num.shape):
            p = [a.copy() for a in base]
            m = [a.copy() for a in base]
            p[pos][idx] += h
            m[pos][idx] -= h
            num[idx] = (loss(*p) - loss(*m)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6)
    if kind == "rmsnorm":
        nob = run("rmsnorm_backward", ins, {"DX": xd, "dscale": sd}, attrs={"has_dbias": False})
        assert set(nob) == {"DX", "dscale"}
