"""Convolution op schemas: ``conv_fprop``, ``conv_dgrad`` and ``conv_wgrad``.

Names follow ``cudnn.pygraph``::

    Y  = graph.conv_fprop(image, weight, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    DX = graph.conv_dgrad(loss, filter, pre_padding=[1, 1], post_padding=[0, 0], stride=..., dilation=...)
    DW = graph.conv_wgrad(image, loss, padding=..., stride=..., dilation=...)

Dims are in cuDNN's logical order (N, C, spatial...) whatever the physical layout; strides decide the
layout. 2-D (rank 4) and 3-D (rank 5) convolutions are supported. Grouped convolution is implied, as in
cuDNN, by the filter's channel count: ``groups = C_image / C_filter``.

``padding`` is shorthand for equal ``pre_padding`` and ``post_padding`` (pygraph exposes it as a second
overload). As in pygraph, padding, stride and dilation have no defaults: an empty list is "not set" and
fails validation. ``conv_dgrad``'s DX and ``conv_wgrad``'s DW cannot be inferred (the inverse mapping is
not unique), so the caller sets their dims, exactly as with pygraph; ``validate_outputs`` checks
those user-set dims once they are known.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..enums import convolution_mode
from .._layout import channels_last_strides as channels_last_stride
from .schema import Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo, enum_converter, int_list, register

__all__ = ["ConvolutionMode", "conv_output_size", "resolve_padding", "channels_last_stride"]


# The op table's name for the package's enum. ``CROSS_CORRELATION`` (the default, what deep-learning
# frameworks call convolution) does not flip the filter; ``CONVOLUTION`` flips it along every spatial axis.
ConvolutionMode = convolution_mode


_to_conv_mode = enum_converter(ConvolutionMode, "convolution_mode",
                               expected="CROSS_CORRELATION or CONVOLUTION")


def _to_int_tuple(value: Any) -> Optional[tuple]:
    """Normalise a list attr; None or an empty list means "not set" (pygraph's default is [])."""
    return None if value is None else int_list(value) or None


_CONV_ATTRS = (
    Attr("padding", None, _to_int_tuple, "symmetric padding per spatial axis (sets pre and post)"),
    Attr("pre_padding", None, _to_int_tuple, "padding before each spatial axis"),
    Attr("post_padding", None, _to_int_tuple, "padding after each spatial axis"),
    Attr("stride", None, _to_int_tuple, "filter stride per spatial axis"),
    Attr("dilation", None, _to_int_tuple, "filter dilation per spatial axis"),
    Attr("convolution_mode", ConvolutionMode.CROSS_CORRELATION, _to_conv_mode,
         "CROSS_CORRELATION (no flip, default) or CONVOLUTION (flipped filter)"),
)


def resolve_padding(attrs: Mapping[str, Any]) -> tuple:
    """``(pre_padding, post_padding)`` from either ``padding`` or the explicit pair."""
    if attrs.get("padding") is not None:
        return tuple(attrs["padding"]), tuple(attrs["padding"])
    return attrs.get("pre_padding"), attrs.get("post_padding")


def conv_output_size(x: int, k: int, pre: int, post: int, stride: int, dilation: int) -> int:
    """Output extent of one spatial axis (cuDNN's formula, floor division)."""
    return 1 + (x + pre + post - dilation * (k - 1) - 1) // stride


def _check_attrs(ctx: InferContext, nd: int) -> tuple:
    """Validate the geometry attrs for ``nd`` spatial axes; return (pre, post, stride, dilation)."""
    a = ctx.attrs
    pre, post = a.get("pre_padding"), a.get("post_padding")
    if a.get("padding") is not None:
        if pre is not None or post is not None:
            ctx.fail("padding", "give either padding or pre_padding/post_padding, not both")
        checks = [("padding", a["padding"], 0)]
    elif pre is None and post is None:
        ctx.fail("padding", "is not set (pygraph requires padding or pre_padding/post_padding)")
    else:
        checks = [("pre_padding", pre, 0), ("post_padding", post, 0)]
    checks += [("stride", a.get("stride"), 1), ("dilation", a.get("dilation"), 1)]
    for port, val, lowest in checks:
        if val is None:
            ctx.fail(port, "is not set (pygraph requires padding, stride and dilation)")
        if len(val) != nd:
            ctx.fail(port, f"has {len(val)} entries; a {nd}-D convolution needs {nd}")
        if any(v < lowest for v in val):
            ctx.fail(port, f"must be {'non-negative' if lowest == 0 else 'positive'}; got {list(val)}")
    pre, post = resolve_padding(a)
    return tuple(pre), tuple(post), tuple(a["stride"]), tuple(a["dilation"])


def _check_rank(ctx: InferContext, port: str, t: TensorInfo, what: str) -> None:
    if len(t.dim) not in (4, 5):
        ctx.fail(port, f"{what} must have rank 4 (2-D conv) or 5 (3-D conv); got dims {list(t.dim)}")
    if any(d <= 0 for d in t.dim):
        ctx.fail(port, f"dims must be positive; got {list(t.dim)}")


def _operands(ctx: InferContext, ref: str, ref_what: str, other: str, other_what: str) -> tuple:
    """The two input tensors, each of conv rank and positive dims and of equal rank (``other`` is
    the one named when they differ); the geometry attrs are checked for their spatial rank."""
    a, b = ctx.need(ref), ctx.need(other)
    _check_rank(ctx, ref, a, ref_what)
    _check_rank(ctx, other, b, other_what)
    if len(b.dim) != len(a.dim):
        ctx.fail(other, f"rank {len(b.dim)} differs from the {ref}'s rank {len(a.dim)}")
    return a, b, _check_attrs(ctx, len(a.dim) - 2)


def _padding_port(ctx: InferContext) -> str:
    return "padding" if ctx.attrs.get("padding") is not None else "pre_padding"


def _fprop_spatial(ctx: InferContext, x_dim: tuple, w_dim: tuple, geometry: tuple) -> list:
    """Output spatial extents; fails when padding leaves no room for the (dilated) filter."""
    pre, post, stride, dilation = geometry
    out = []
    for i in range(len(x_dim) - 2):
        span = x_dim[i + 2] + pre[i] + post[i] - dilation[i] * (w_dim[i + 2] - 1) - 1
        if span < 0:
            ctx.fail(_padding_port(ctx),
                     f"impossible conv padding: spatial axis {i} has {x_dim[i + 2]} + {pre[i]} + {post[i]} "
                     f"padded elements, fewer than the dilated filter extent "
                     f"{dilation[i] * (w_dim[i + 2] - 1) + 1}, so the output would be empty")
        out.append(conv_output_size(x_dim[i + 2], w_dim[i + 2], pre[i], post[i], stride[i], dilation[i]))
    return out


def _check_groups(ctx: InferContext, c_image: int, w_port: str, w_dim: tuple) -> int:
    """Groups = C_image / C_filter; K must split evenly across them too."""
    k, c_filter = w_dim[0], w_dim[1]
    if c_image % c_filter != 0:
        ctx.fail(w_port, f"channel mismatch: the image has {c_image} channels, which is not a multiple of "
                         f"the filter's {c_filter} input channels (groups = C_image / C_filter)")
    groups = c_image // c_filter
    if k % groups != 0:
        ctx.fail(w_port, f"filter has {k} output channels, not divisible by the {groups} groups implied by "
                         f"{c_image} image channels / {c_filter} filter channels")
    return groups


# --------------------------------------------------------------------------------------------- fprop

def _infer_fprop(ctx: InferContext) -> dict:
    x, w, geometry = _operands(ctx, "image", "image", "weight", "weight")
    _check_groups(ctx, x.dim[1], "weight", w.dim)
    y_dim = (x.dim[0], w.dim[0], *_fprop_spatial(ctx, x.dim, w.dim, geometry))
    return {"Y": OutputInfo(y_dim, None, channels_last_stride(y_dim))}


def _caller_set(ctx: InferContext, dims: Mapping[str, Optional[tuple]], port: str) -> None:
    if dims.get(port) is None:
        ctx.fail(port, f"{ctx.op} cannot infer {port} dims; set them on the output tensor (as with pygraph)")


def _caller_dims(ctx: InferContext, dims: Mapping[str, Optional[tuple]], port: str, ref_port: str,
                 ref: TensorInfo) -> tuple:
    """The caller-set dims of output ``port`` (of ``ref``'s rank) and the geometry for them."""
    value = tuple(dims[port])
    if len(value) != len(ref.dim):
        ctx.fail(port, f"rank {len(value)} differs from the {ref_port}'s rank {len(ref.dim)}")
    return value, _check_attrs(ctx, len(value) - 2)


# --------------------------------------------------------------------------------------------- dgrad

def _infer_dgrad(ctx: InferContext) -> dict:
    dy, w, _ = _operands(ctx, "loss", "loss (dy)", "filter", "filter")
    if dy.dim[1] != w.dim[0]:
        ctx.fail("filter", f"channel mismatch: loss has {dy.dim[1]} channels but the filter has "
                           f"{w.dim[0]} output channels (K)")
    # DX dims cannot be inferred from (dy, w): several input extents map to one output extent.
    return {"DX": OutputInfo(None, None, None)}


def _validate_dgrad_outputs(ctx: InferContext, dims: Mapping[str, Optional[tuple]]) -> None:
    """Check user-set DX dims against loss, filter and the geometry attrs."""
    _caller_set(ctx, dims, "DX")
    dy, w = ctx.need("loss"), ctx.need("filter")
    dx, geometry = _caller_dims(ctx, dims, "DX", "loss", dy)
    _check_groups(ctx, dx[1], "DX", w.dim)
    expect = (dx[0], w.dim[0], *_fprop_spatial(ctx, dx, w.dim, geometry))
    if expect != tuple(dy.dim):
        ctx.fail("DX", f"dims {list(dx)} convolved with filter {list(w.dim)} give {list(expect)}, "
                       f"not the loss dims {list(dy.dim)}")


# --------------------------------------------------------------------------------------------- wgrad

def _infer_wgrad(ctx: InferContext) -> dict:
    x, dy, _ = _operands(ctx, "image", "image", "loss", "loss (dy)")
    if dy.dim[0] != x.dim[0]:
        ctx.fail("loss", f"batch mismatch: loss has N={dy.dim[0]}, image has N={x.dim[0]}")
    # DW's filter extent is not determined by (x, dy) alone (floor division), so the caller sets it.
    return {"DW": OutputInfo(None, None, None)}


def _validate_wgrad_outputs(ctx: InferContext, dims: Mapping[str, Optional[tuple]]) -> None:
    """Check user-set DW dims against image, loss and the geometry attrs."""
    _caller_set(ctx, dims, "DW")
    x, dy = ctx.need("image"), ctx.need("loss")
    dw, geometry = _caller_dims(ctx, dims, "DW", "image", x)
    _check_groups(ctx, x.dim[1], "DW", dw)
    expect = (x.dim[0], dw[0], *_fprop_spatial(ctx, x.dim, dw, geometry))
    if expect != tuple(dy.dim):
        ctx.fail("DW", f"image {list(x.dim)} convolved with a {list(dw)} filter gives {list(expect)}, "
                       f"not the loss dims {list(dy.dim)}")


_IMAGE = ("image", "X, dims (N, C, [D,] H, W)")
_FILTER = "W, dims (K, C / groups, [T,] R, S)"
_LOSS = ("loss", "dY, dims (N, K, [O,] P, Q)")


def _conv_op(name: str, first: tuple, second: tuple, output: str, infer, doc: str, **fields) -> OpSchema:
    """A convolution op on ports ``first`` and ``second`` ((name, doc) each), pygraph's positional order."""
    return OpSchema(
        name=name, family="conv", inputs=(Port(first[0], doc=first[1]), Port(second[0], doc=second[1])),
        outputs=(Output(output),), infer=infer, attrs=_CONV_ATTRS,
        positional=(first[0], second[0], "padding", "stride", "dilation", "convolution_mode"), doc=doc, **fields)


register(
    _conv_op("conv_fprop", _IMAGE, ("weight", _FILTER), "Y", _infer_fprop, "Forward convolution Y = conv(X, W)."),
    _conv_op("conv_dgrad", _LOSS, ("filter", _FILTER), "DX", _infer_dgrad,
             "Data gradient: the adjoint of conv_fprop in X. DX dims must be set by the caller.",
             validate_outputs=_validate_dgrad_outputs),
    _conv_op("conv_wgrad", _IMAGE, _LOSS, "DW", _infer_wgrad,
             "Weight gradient: the adjoint of conv_fprop in W. DW dims must be set by the caller.",
             validate_outputs=_validate_wgrad_outputs),
)
