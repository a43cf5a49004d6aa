"""Sampling op schemas: ``rng`` (random numbers) and ``resample`` (pooling).

cudnn.pygraph has no Python binding for these two; the keywords follow cudnn-frontend's C++
``Rng_attributes`` / ``Resample_attributes`` setters::

    Y = graph.rng(seed, offset, distribution="BERNOULLI", bernoulli_probability=0.9,
                  dim=[2, 4, 16, 16], stride=[1024, 256, 16, 1])
    Y, index = graph.resample(X, resampling_mode="MAXPOOL", window=[2, 2], stride=[2, 2],
                              pre_padding=[0, 0], post_padding=[0, 0], generate_index=True)

``seed`` and ``offset`` are tensors (one integer element each) or Python ints, which become
pass-by-value INT64 scalars. Only the Bernoulli distribution is offered, as cudnn-frontend does.
``resample`` pools the spatial axes (2 onwards) of an (N, C, spatial...) tensor; its ``index`` output
(the arg-max position inside each window) exists only for max pooling with ``generate_index``.
"""
from __future__ import annotations

from typing import Any, Optional

from ..data_type import DataType
from .._layout import channels_last_strides as _channels_last
from ..enums import padding_mode, resample_mode, rng_distribution
from .schema import REQUIRED, Attr, InferContext, OpSchema, Output, OutputInfo, Port, enum_converter, int_list, register

__all__ = ["ResampleMode", "PaddingMode", "RngDistribution", "pooled_size", "pool_padding_mode"]


# The op tables' names for the package's enums.
ResampleMode = resample_mode
PaddingMode = padding_mode
RngDistribution = rng_distribution


POOLING_MODES = (ResampleMode.MAXPOOL, ResampleMode.AVGPOOL_INCLUDE_PADDING, ResampleMode.AVGPOOL_EXCLUDE_PADDING)

_to_resample_mode = enum_converter(ResampleMode, "resampling_mode", "CUDNN_RESAMPLE_")
_to_padding_mode = enum_converter(PaddingMode, "padding_mode", "CUDNN_")
_to_distribution = enum_converter(RngDistribution, "distribution", "CUDNN_RNG_DISTRIBUTION_")


_ints = int_list


def _opt_ints(value: Any) -> Optional[tuple]:
    return None if value is None else _ints(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_" or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"a bool was expected; got {value!r}")


def _probability(value: Any) -> Optional[float]:
    if value is None:
        return None
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"must lie in [0, 1]; got {value!r}")
    return p


# ------------------------------------------------------------------------------------------------- rng

_SCALAR_TYPES = (DataType.INT64, DataType.INT32)


def _infer_rng(ctx: InferContext) -> dict:
    for port in ("seed", "offset"):
        t = ctx.need(port)
        if t.data_type not in _SCALAR_TYPES:
            ctx.fail(port, f"must be INT64 (or INT32); got {t.data_type.name}")
        if any(d != 1 for d in t.dim):
            ctx.fail(port, f"must hold one element; got dims {tuple(t.dim)}")
    if ctx.attrs["distribution"] != RngDistribution.BERNOULLI:
        ctx.unsupported(f"distribution {ctx.attrs['distribution'].name}: only BERNOULLI is offered "
                        "(as in cudnn-frontend)")
    if ctx.attrs.get("bernoulli_probability") is None:
        ctx.fail("bernoulli_probability", "is required for the BERNOULLI distribution")
    dim = ctx.attrs["dim"]
    if not dim or any(d <= 0 for d in dim):
        ctx.fail("dim", f"must be positive sizes; got {dim}")
    stride = ctx.attrs.get("stride")
    if stride is not None and len(stride) != len(dim):
        ctx.fail("stride", f"has {len(stride)} entries for dims {tuple(dim)}")
    return {"Y": OutputInfo(tuple(dim), None, tuple(stride) if stride else _channels_last(dim))}


# -------------------------------------------------------------------------------------------- resample

def pooled_size(size: int, pre: int, post: int, window: int, stride: int) -> int:
    """Output extent of one pooled axis (floor division, as cuDNN and cudnn-frontend compute it)."""
    return 1 + (size + pre + post - window) // stride


def pool_padding_mode(attrs) -> PaddingMode:
    """The padding mode: the one given, else NEG_INF_PAD for max pooling and ZERO_PAD otherwise."""
    mode = attrs.get("padding_mode")
    if mode is not None:
        return mode
    return PaddingMode.NEG_INF_PAD if attrs["resampling_mode"] == ResampleMode.MAXPOOL else PaddingMode.ZERO_PAD


def _spatial(attrs, n: int, key: str, default: int) -> tuple:
    value = attrs.get(key)
    return (default,) * n if value is None else tuple(value)


def _infer_resample(ctx: InferContext) -> dict:
    x = ctx.need("input")
    dim = tuple(x.dim)
    if len(dim) < 3:
        ctx.fail("input", f"must be (N, C, spatial...) of rank >= 3; got dims {dim}")
    mode = ctx.attrs["resampling_mode"]
    if mode not in POOLING_MODES:
        ctx.unsupported(f"resampling_mode {mode.name}: only MAXPOOL, AVGPOOL_INCLUDE_PADDING and "
                        "AVGPOOL_EXCLUDE_PADDING (pooling) are offered")
    n = len(dim) - 2
    window = ctx.attrs["window"]
    stride = _spatial(ctx.attrs, n, "stride", 1)
    pre = _spatial(ctx.attrs, n, "pre_padding", 0)
    post = _spatial(ctx.attrs, n, "post_padding", 0)
    for key, values, least in (("window", window, 1), ("stride", stride, 1),
                               ("pre_padding", pre, 0), ("post_padding", post, 0)):
        if len(values) != n:
            ctx.fail(key, f"needs {n} entries (one per spatial axis of {dim}); got {tuple(values)}")
        if any(v < least for v in values):
            ctx.fail(key, f"entries must be >= {least}; got {tuple(values)}")
    out = list(dim)
    for i in range(n):
        size = pooled_size(dim[2 + i], pre[i], post[i], window[i], stride[i])
        if size < 1:
            ctx.fail("window", f"spatial axis {i} (size {dim[2 + i]}, padded by {pre[i]} + {post[i]}) is "
                               f"smaller than the window {window[i]}")
        out[2 + i] = size
    out = tuple(out)
    result = {"Y": OutputInfo(out, None, _channels_last(out))}
    if _has_index(ctx.attrs, frozenset()):
        result["index"] = OutputInfo(out, DataType.INT8, _channels_last(out))
    return result


def _has_index(attrs, given) -> bool:
    return bool(attrs.get("generate_index")) and attrs.get("resampling_mode") == ResampleMode.MAXPOOL


# ----------------------------------------------------------------------------------------------- tables

register(
    OpSchema(
        name="rng", family="sampling",
        inputs=(Port("seed", doc="INT64 scalar tensor, or a Python int"),
                Port("offset", doc="INT64 scalar tensor, or a Python int")),
        outputs=(Output("Y"),), infer=_infer_rng,
        attrs=(Attr("distribution", RngDistribution.BERNOULLI, _to_distribution, "BERNOULLI"),
               Attr("bernoulli_probability", None, _probability, "probability of a 1"),
               Attr("dim", REQUIRED, _ints, "output dims"),
               Attr("stride", None, _opt_ints, "output strides; default packed with axis 1 innermost")),
        positional=("seed", "offset", "distribution", "bernoulli_probability", "dim", "stride"),
        doc="Random numbers (Philox): Y[i] = 1 with probability bernoulli_probability, else 0.",
        backend="CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR",
        pygraph_positional=("seed", "offset", "distribution", "bernoulli_probability", "dim", "stride", "name"),
        scalar_ports={"seed": DataType.INT64, "offset": DataType.INT64}),
    OpSchema(
        name="resample", family="sampling",
        inputs=(Port("input"),),
        outputs=(Output("Y"), Output("index", _has_index)), infer=_infer_resample,
        attrs=(Attr("resampling_mode", REQUIRED, _to_resample_mode,
                    "MAXPOOL, AVGPOOL_INCLUDE_PADDING or AVGPOOL_EXCLUDE_PADDING"),
               Attr("window", REQUIRED, _ints, "window extent per spatial axis"),
               Attr("stride", None, _opt_ints, "window step per spatial axis (default 1)"),
               Attr("pre_padding", None, _opt_ints, "padding before each spatial axis (default 0)"),
               Attr("post_padding", None, _opt_ints, "padding after each spatial axis (default 0)"),
               Attr("padding_mode", None, _to_padding_mode,
                    "ZERO_PAD, NEG_INF_PAD or EDGE_VAL_PAD; default NEG_INF_PAD for MAXPOOL, else ZERO_PAD"),
               Attr("generate_index", False, _bool, "max pooling also writes the arg-max index (training)"),
               Attr("nan_propagation", True, _bool, "a NaN in a window makes the result NaN")),
        positional=("input", "resampling_mode", "window", "stride", "pre_padding", "post_padding",
                    "padding_mode", "generate_index"),
        returns="list",
        doc="Pooling over the spatial axes of (N, C, spatial...); returns [Y, index] (index None "
            "unless max pooling with generate_index).",
        backend="CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR",
        pygraph_positional=("input", "resampling_mode", "window", "stride", "pre_padding", "post_padding",
                            "padding_mode", "generate_index", "compute_data_type", "name")),
)
