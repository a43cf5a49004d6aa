"""Normalization op schemas: batch / layer / adaptive-layer / RMS / instance norm, forward and backward,
plus ``genstats``.

Keyword names, positional order and the order of returned tensors follow ``cudnn.pygraph``::

    Y, mean, inv_var, run_mean, run_var = graph.batchnorm(input=x, scale=s, bias=b, in_running_mean=rm,
                                                          in_running_var=rv, epsilon=eps, momentum=mom)
    Y, mean, inv_var = graph.layernorm(norm_forward_phase=TRAINING, input=x, scale=s, bias=b, epsilon=eps)
    Y, inv_var = graph.rmsnorm(norm_forward_phase=INFERENCE, input=x, scale=s, epsilon=eps)   # inv_var None
    DX, dscale, dbias = graph.layernorm_backward(grad=dy, input=x, scale=s, mean=m, inv_variance=iv)
    sum_, sq_sum = graph.genstats(input=x)

Which axes a norm reduces is read off the tensor dims, as cuDNN does:
  * batchnorm: every axis but C (scale, bias and stats are (1, C, 1, ...));
  * instancenorm: the spatial axes (scale, bias (1, C, 1, ...); stats (N, C, 1, ...));
  * layernorm / rmsnorm: the axes where ``scale`` is not 1 (scale (1, C, H, W) -> stats (N, 1, 1, 1);
    scale (1, 1, H) on (B, S, H) -> stats (B, S, 1));
  * adalayernorm: like layernorm but the scale may also vary along the batch axis (per-sample scale).
``epsilon`` and ``momentum`` are one-element tensors (usually pass-by-value), as in pygraph.

Outputs present only in training (mean / inv_variance of the forward norms), only with running stats
(batchnorm's out_running_mean / out_running_var) or only with ``has_dbias`` (rmsnorm_backward's dbias)
are conditional: the builder returns None in their place.
"""
from __future__ import annotations

import math
from typing import Any

from ..enums import norm_forward_phase
from .._layout import packed_strides_like as _packed_stride
from .schema import (REQUIRED, Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo,
                     enum_converter, register)

__all__ = ["NormFwdPhase", "ADA_LAYER_NORM_VERSION"]


NormFwdPhase = norm_forward_phase   # the op tables' name for the package's enum


_to_phase = enum_converter(NormFwdPhase, "norm_forward_phase", expected="TRAINING or INFERENCE")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"a bool was expected; got {value!r}")


def _to_tensor_list(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"a list of tensors was expected; got {value!r}")
    return tuple(value)


_PHASE = Attr("norm_forward_phase", REQUIRED, _to_phase, "TRAINING (also writes mean/inv_variance) or INFERENCE")
_PEER_STATS = Attr("peer_stats", (), _to_tensor_list,
                   "tensors through which several GPUs exchange partial batch statistics")


def _training(attrs, _given) -> bool:
    return attrs.get("norm_forward_phase") == NormFwdPhase.TRAINING


# ------------------------------------------------------------------------------------------ helpers

def _x(ctx: InferContext, min_rank: int = 2) -> TensorInfo:
    x = ctx.need("input")
    if len(x.dim) < min_rank:
        ctx.fail("input", f"needs rank >= {min_rank}; got dims {list(x.dim)}")
    if any(d <= 0 for d in x.dim):
        ctx.fail("input", f"dims must be positive; got {list(x.dim)}")
    return x


def _scalar(ctx: InferContext, port: str) -> None:
    t = ctx.need(port)
    if math.prod(t.dim) != 1:
        ctx.fail(port, f"must hold exactly one element; got dims {list(t.dim)}")


def _dims_equal(ctx: InferContext, port: str, expect: tuple, what: str, optional: bool = False) -> None:
    t = ctx.inputs.get(port) if optional else ctx.need(port)
    if t is not None and tuple(t.dim) != tuple(expect):
        ctx.fail(port, f"dims must be {list(expect)} ({what}); got {list(t.dim)}")


def _per_channel(x: TensorInfo) -> tuple:
    return (1, x.dim[1]) + (1,) * (len(x.dim) - 2)


def _affine(ctx: InferContext, x: TensorInfo, port: str, batch_ok: bool) -> tuple:
    """Validate a layernorm-style scale/bias: same rank as x, each dim equal to x's or 1.

    Axis 0 must be 1 unless ``batch_ok`` (adaptive layernorm's per-sample scale).
    """
    t = ctx.need(port)
    if len(t.dim) != len(x.dim):
        ctx.fail(port, f"rank {len(t.dim)} differs from the input's rank {len(x.dim)} (dims {list(t.dim)})")
    for i, (s, d) in enumerate(zip(t.dim, x.dim)):
        if s not in (1, d):
            ctx.fail(port, f"dims {list(t.dim)} do not broadcast to the input dims {list(x.dim)} (axis {i})")
    if not batch_ok and t.dim[0] != 1:
        ctx.fail(port, f"must be 1 along the batch axis; got dims {list(t.dim)}")
    return tuple(t.dim)


def _ln_stats_dim(x: TensorInfo, scale_dim: tuple, first_axis: int) -> tuple:
    """Stats keep x's extent where the scale is 1 (independent rows) and are 1 where it is normalized."""
    return tuple(1 if (i >= first_axis and s != 1) else d for i, (s, d) in enumerate(zip(scale_dim, x.dim)))


def _same_as_input(ctx: InferContext, port: str, x: TensorInfo) -> None:
    _dims_equal(ctx, port, x.dim, "same as input")


# ------------------------------------------------------------------------------------------ batchnorm

def _has_running(_attrs, given) -> bool:
    return "in_running_mean" in given or "in_running_var" in given


def _infer_batchnorm(ctx: InferContext) -> dict:
    x = _x(ctx)
    pc = _per_channel(x)
    for port in ("scale", "bias"):
        _dims_equal(ctx, port, pc, "per channel")
    _scalar(ctx, "epsilon")
    running = [p for p in ("in_running_mean", "in_running_var", "momentum") if ctx.inputs.get(p) is not None]
    if running and len(running) != 3:
        missing = [p for p in ("in_running_mean", "in_running_var", "momentum") if p not in running][0]
        ctx.fail(missing, f"running statistics need in_running_mean, in_running_var and momentum together; "
                          f"got only {', '.join(running)}")
    out = {"Y": OutputInfo(x.dim, None, x.stride)}
    stat = OutputInfo(pc, None, _packed_stride(pc, x.stride))
    out["mean"] = out["inv_variance"] = stat
    if running:
        _dims_equal(ctx, "in_running_mean", pc, "per channel")
        _dims_equal(ctx, "in_running_var", pc, "per channel")
        _scalar(ctx, "momentum")
        out["out_running_mean"] = out["out_running_var"] = stat
    return out


def _infer_batchnorm_inference(ctx: InferContext) -> dict:
    x = _x(ctx)
    pc = _per_channel(x)
    for port in ("mean", "inv_variance", "scale", "bias"):
        _dims_equal(ctx, port, pc, "per channel")
    return {"Y": OutputInfo(x.dim, None, x.stride)}


def _infer_batchnorm_backward(ctx: InferContext) -> dict:
    x = _x(ctx)
    _same_as_input(ctx, "grad", x)
    pc = _per_channel(x)
    for port in ("scale", "mean", "inv_variance"):
        _dims_equal(ctx, port, pc, "per channel")
    st = _packed_stride(pc, x.stride)
    return {"DX": OutputInfo(x.dim, None, x.stride), "dscale": OutputInfo(pc, None, st),
            "dbias": OutputInfo(pc, None, st)}


# ------------------------------------------------------------------------------- layernorm family

def _layer_forward(ctx: InferContext, batch_ok: bool, with_mean: bool, bias_optional: bool) -> dict:
    x = _x(ctx)
    scale = _affine(ctx, x, "scale", batch_ok)
    if ctx.inputs.get("bias") is not None or not bias_optional:
        _dims_equal(ctx, "bias", scale, "same as scale")
    _scalar(ctx, "epsilon")
    out = {"Y": OutputInfo(x.dim, None, x.stride)}
    if ctx.attrs["norm_forward_phase"] == NormFwdPhase.TRAINING:
        sd = _ln_stats_dim(x, scale, 1 if batch_ok else 0)
        stat = OutputInfo(sd, None, _packed_stride(sd, x.stride))
        if with_mean:
            out["mean"] = stat
        out["inv_variance"] = stat
    return out


def _layer_backward(ctx: InferContext, batch_ok: bool, with_mean: bool, dbias: bool = True) -> dict:
    x = _x(ctx)
    _same_as_input(ctx, "grad", x)
    scale = _affine(ctx, x, "scale", batch_ok)
    sd = _ln_stats_dim(x, scale, 1 if batch_ok else 0)
    for port in (("mean", "inv_variance") if with_mean else ("inv_variance",)):
        _dims_equal(ctx, port, sd, "the forward statistics")
    st = _packed_stride(scale, x.stride)
    out = {"DX": OutputInfo(x.dim, None, x.stride), "dscale": OutputInfo(scale, None, st)}
    if dbias:
        out["dbias"] = OutputInfo(scale, None, st)
    return out


def _infer_layernorm(ctx):
    return _layer_forward(ctx, batch_ok=False, with_mean=True, bias_optional=False)


def _infer_adalayernorm(ctx):
    return _layer_forward(ctx, batch_ok=True, with_mean=True, bias_optional=True)


def _infer_rmsnorm(ctx):
    return _layer_forward(ctx, batch_ok=False, with_mean=False, bias_optional=True)


def _infer_layernorm_backward(ctx):
    return _layer_backward(ctx, batch_ok=False, with_mean=True)


def _infer_adalayernorm_backward(ctx):
    return _layer_backward(ctx, batch_ok=True, with_mean=True)


def _infer_rmsnorm_backward(ctx):
    return _layer_backward(ctx, batch_ok=False, with_mean=False, dbias=ctx.attrs["has_dbias"])


# ------------------------------------------------------------------------------------ instancenorm

def _instance_stats(x: TensorInfo) -> tuple:
    return tuple(x.dim[:2]) + (1,) * (len(x.dim) - 2)


def _infer_instancenorm(ctx: InferContext) -> dict:
    x = _x(ctx, min_rank=3)
    pc = _per_channel(x)
    _dims_equal(ctx, "scale", pc, "per channel")
    _dims_equal(ctx, "bias", pc, "per channel")
    _scalar(ctx, "epsilon")
    out = {"Y": OutputInfo(x.dim, None, x.stride)}
    if ctx.attrs["norm_forward_phase"] == NormFwdPhase.TRAINING:
        sd = _instance_stats(x)
        out["mean"] = out["inv_variance"] = OutputInfo(sd, None, _packed_stride(sd, x.stride))
    return out


def _infer_instancenorm_backward(ctx: InferContext) -> dict:
    x = _x(ctx, min_rank=3)
    _same_as_input(ctx, "grad", x)
    pc = _per_channel(x)
    _dims_equal(ctx, "scale", pc, "per channel")
    # pygraph lets mean / inv_variance default to None, but cuDNN needs the saved statistics.
    for port in ("mean", "inv_variance"):
        if ctx.inputs.get(port) is None:
            ctx.fail(port, "instancenorm_backward needs the saved mean and inv_variance from the forward pass")
        _dims_equal(ctx, port, _instance_stats(x), "the forward statistics")
    st = _packed_stride(pc, x.stride)
    return {"DX": OutputInfo(x.dim, None, x.stride), "dscale": OutputInfo(pc, None, st),
            "dbias": OutputInfo(pc, None, st)}


# ---------------------------------------------------------------------------------------- genstats

def _infer_genstats(ctx: InferContext) -> dict:
    x = _x(ctx)
    pc = _per_channel(x)
    info = OutputInfo(pc, None, _packed_stride(pc, x.stride))
    return {"sum": info, "sq_sum": info}


# ------------------------------------------------------------------------------------- registration

def _bwd_ports(with_mean: bool = True, stats_optional: bool = False) -> tuple:
    ports = [Port("grad", doc="dY, dims of input"), Port("input", doc="X"), Port("scale")]
    if with_mean:
        ports.append(Port("mean", optional=stats_optional, doc="saved mean from the forward pass"))
    ports.append(Port("inv_variance", optional=stats_optional, doc="saved 1/sqrt(var + eps)"))
    return tuple(ports)


_FWD_LN_PORTS = (Port("input", doc="X"), Port("scale"), Port("bias"), Port("epsilon", doc="one element"))
_FWD_LN_POS = ("norm_forward_phase", "input", "scale", "bias", "epsilon")
_BWD_OUTS = (Output("DX"), Output("dscale"), Output("dbias"))
_BWD_POS = ("grad", "input", "scale", "mean", "inv_variance")
_TENSOR_LIST = ("peer_stats",)   # attrs whose values are graph tensors

# cudnn-frontend builds adaptive layer norm (both directions) only on cuDNN >= 9.9.0.
ADA_LAYER_NORM_VERSION = 90900

_FWD_STATS_OUTS = (Output("Y"), Output("mean", _training), Output("inv_variance", _training))


def _phased_norm(name, infer, doc, inputs=_FWD_LN_PORTS, outputs=_FWD_STATS_OUTS, **fields) -> OpSchema:
    """A forward norm taking pygraph's ``norm_forward_phase`` (statistics outputs in training only)."""
    return OpSchema(name=name, family="norm", inputs=inputs, outputs=outputs, infer=infer, attrs=(_PHASE,),
                    positional=_FWD_LN_POS, returns="list", doc=doc, **fields)


def _backward_norm(name, infer, doc, inputs=None, **fields) -> OpSchema:
    """A norm's backward from its saved statistics: DX, dscale, dbias."""
    return OpSchema(name=name, family="norm", inputs=inputs or _bwd_ports(), outputs=_BWD_OUTS, infer=infer,
                    positional=_BWD_POS, returns="list", doc=doc, **fields)

register(
    OpSchema(
        name="batchnorm", family="norm",
        inputs=(Port("input", doc="X (N, C, ...)"), Port("scale", doc="(1, C, 1, ...)"), Port("bias"),
                Port("in_running_mean", optional=True), Port("in_running_var", optional=True),
                Port("epsilon", doc="one element"), Port("momentum", optional=True, doc="one element")),
        outputs=(Output("Y"), Output("mean"), Output("inv_variance"),
                 Output("out_running_mean", _has_running), Output("out_running_var", _has_running)),
        infer=_infer_batchnorm, attrs=(_PEER_STATS,),
        positional=("input", "scale", "bias", "in_running_mean", "in_running_var", "epsilon", "momentum",
                    "peer_stats"),
        returns="list", tensor_list_attrs=_TENSOR_LIST,
        doc="Training batch norm; also updates the running statistics when they are given.",
    ),
    OpSchema(
        name="batchnorm_inference", family="norm",
        inputs=(Port("input"), Port("mean"), Port("inv_variance"), Port("scale"), Port("bias")),
        outputs=(Output("Y"),), infer=_infer_batchnorm_inference,
        positional=("input", "mean", "inv_variance", "scale", "bias"),
        doc="Y = (X - mean) * inv_variance * scale + bias, per channel.",
    ),
    OpSchema(
        name="batchnorm_backward", family="norm",
        inputs=_bwd_ports(), outputs=_BWD_OUTS, infer=_infer_batchnorm_backward, attrs=(_PEER_STATS,),
        positional=_BWD_POS + ("peer_stats",), returns="list", tensor_list_attrs=_TENSOR_LIST,
        doc="Gradients of training batch norm from the saved batch statistics.",
    ),
    _phased_norm("layernorm", _infer_layernorm, "Layer norm over the axes where scale is not 1."),
    _backward_norm("layernorm_backward", _infer_layernorm_backward,
                   "Gradients of layer norm from the saved mean / inv_variance."),
    _phased_norm("adalayernorm", _infer_adalayernorm,
                 "Adaptive layer norm: per-sample scale / bias (e.g. (B, 1, H) on (B, S, H)).",
                 inputs=(Port("input"), Port("scale", doc="may vary per sample"), Port("bias", optional=True),
                         Port("epsilon")),
                 min_cudnn=ADA_LAYER_NORM_VERSION),
    _backward_norm("adalayernorm_backward", _infer_adalayernorm_backward, "Gradients of adaptive layer norm.",
                   min_cudnn=ADA_LAYER_NORM_VERSION),
    _phased_norm("rmsnorm", _infer_rmsnorm,
                 "RMS norm: Y = X / sqrt(mean(X^2) + eps) * scale (+ bias); no mean output.",
                 inputs=(Port("input"), Port("scale"), Port("bias", optional=True), Port("epsilon")),
                 outputs=(Output("Y"), Output("inv_variance", _training))),
    OpSchema(
        name="rmsnorm_backward", family="norm", inputs=_bwd_ports(with_mean=False),
        outputs=(Output("DX"), Output("dscale"), Output("dbias", lambda a, g: bool(a.get("has_dbias")))),
        infer=_infer_rmsnorm_backward, attrs=(Attr("has_dbias", REQUIRED, _to_bool, "also compute dbias"),),
        positional=("grad", "input", "scale", "inv_variance", "has_dbias"), returns="list",
        doc="Gradients of RMS norm; dbias only when has_dbias.",
    ),
    _phased_norm("instancenorm", _infer_instancenorm,
                 "Instance norm: per (N, C) statistics over the spatial axes; per-channel scale / bias."),
    _backward_norm("instancenorm_backward", _infer_instancenorm_backward,
                   "Gradients of instance norm from the saved statistics.", inputs=_bwd_ports(stats_optional=True)),
    OpSchema(
        name="genstats", family="norm", inputs=(Port("input"),),
        outputs=(Output("sum"), Output("sq_sum")), infer=_infer_genstats, positional=("input",),
        returns="list",
        doc="Per-channel sum and sum of squares over N and the spatial axes.",
    ),
)
