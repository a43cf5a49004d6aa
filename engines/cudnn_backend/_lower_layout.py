"""Layout ops (reshape, transpose, slice, concatenate), block-scale quantize / dequantize, rng and
resample lowered to backend descriptors.

What each becomes, and what an older libcudnn declines:

* ``reshape``: ``OPERATION_RESHAPE`` (X, Y); its mode attribute exists from cuDNN 9.22, before which
  the reshape is a view (VIEW_ONLY). A LOGICAL reshape lowers there only where it equals the view
  (both tensors packed row-major).
* ``transpose``: a view reshape whose output strides are the input's, permuted (what cuDNN's attention
  graphs did for K^T before the transpose operation existed), when its output is virtual. A transpose
  written to memory moves data: that needs ``OPERATION_TRANSPOSE`` (cuDNN >= 9.22).
* ``slice``: ``OPERATION_SLICE`` from cuDNN 9.22. Before that, a slice of a graph input feeding
  another op is a pointer offset: the slice's output becomes a non-virtual tensor with the slice's
  dims and the source's strides (times the step), fed at execute with the source's pointer plus the
  offset (``Program.aliases``). Any other slice needs cuDNN 9.22.
* ``concatenate``: ``OPERATION_CONCAT`` (cuDNN >= 9.7).
* ``block_scale_quantize`` / ``block_scale_dequantize``: their operations (cuDNN >= 9.7); the axis of
  the blocks is the one the scale tensor's dims shrink, so no attribute names it.
* ``rng``: ``RNG_DESCRIPTOR`` (Bernoulli) + ``OPERATION_RNG`` with seed and offset tensors.
* ``resample``: ``RESAMPLE_DESCRIPTOR`` + ``OPERATION_RESAMPLE_FWD`` (index output for max pooling).

Axes and permutations shift with the leading unit axes the geometry pads (to rank 3).
"""
from __future__ import annotations

import logging
import math

from ..._cudnn_errors import CudnnVersionError
from ..._layout import row_major_strides as _row_major_strides
from ...data_type import DataType, itemsize_bits
from ...errors import GraphNotSupportedError
from ...ops._sampling import pool_padding_mode
from ...ops._tensor_ops import ReshapeMode, slice_bounds
from .lowering import BYTE_ALIGNMENT, Ref, Step, lowers

logger = logging.getLogger(__name__)

__all__ = ["NATIVE_LAYOUT_VERSION"]

NATIVE_LAYOUT_VERSION = 92200   # OPERATION_TRANSPOSE, OPERATION_SLICE and the reshape mode attribute

_DESC = "CUDNN_TYPE_BACKEND_DESCRIPTOR"
_OP = "CUDNN_ATTR_OPERATION_"


def _native(lw) -> bool:
    """Whether the libcudnn lowered for has the 9.22 layout operations (None: the newest)."""
    return lw.version is None or lw.version >= NATIVE_LAYOUT_VERSION


def _shift(lw, t) -> int:
    """Leading unit axes the geometry padded onto ``t``."""
    return len(lw.dims(t)) - len(t.dim)


def _label(node) -> str:
    return f"node '{node.name}' ({node.op})"


def _is_row_major(dims, strides) -> bool:
    expected = 1
    for d, s in reversed(list(zip(dims, strides))):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _set_geometry(lw, t, dims, strides, **extra) -> None:
    """Give graph tensor ``t``'s descriptor new strides (and other attributes)."""
    step = lw.tensor_step(t)
    step.attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] = tuple(int(d) for d in dims)
    step.attrs["CUDNN_ATTR_TENSOR_STRIDES"] = tuple(int(s) for s in strides)
    step.attrs.update(extra)
    lw.geometry[t.uid] = (tuple(dims), tuple(strides))


# ---- reshape and transpose -------------------------------------------------------------------------

def _is_graph_input(t) -> bool:
    """Whether ``t`` is memory the caller passes (not computed by the graph, not a scalar)."""
    return not (t.is_virtual or t.is_pass_by_value or t.producer is not None)


def _version_text(lw) -> str:
    v = lw.version
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else "this version"


def _view_strides(dims, strides, new_dims):
    """Strides that show memory of (``dims``, ``strides``) as ``new_dims`` in row-major order (the
    logical reshape), or None when no strides can (the reshape would move data)."""
    if math.prod(dims) != math.prod(new_dims):
        return None
    old = [(int(d), int(s)) for d, s in zip(dims, strides) if d != 1]
    new = [int(d) for d in new_dims]
    if not old or 0 in new:
        return _row_major_strides(new)
    out = [0] * len(new)
    oi = ni = 0
    while oi < len(old) and ni < len(new):
        # the shortest groups of old axes [oi, oj) and new axes [ni, nj) that hold as many elements
        oj, nj = oi + 1, ni + 1
        o_count, n_count = old[oi][0], new[ni]
        while o_count != n_count:
            if n_count < o_count:
                n_count *= new[nj]
                nj += 1
            else:
                o_count *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None   # the old group is not one affine run of memory
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        oi, ni = oj, nj
    return tuple(_unit_strides(new, out))


def _unit_strides(dims, strides):
    """Unit axes get the span of the axes inside them (a packed layout's stride; they are never stepped)."""
    out = list(strides)
    for a in range(len(dims) - 1, -1, -1):
        if dims[a] == 1:
            inner = [out[b] * dims[b] for b in range(a + 1, len(dims)) if dims[b] != 1]
            out[a] = max(inner + [1])
    return out


def _same_strides(t, strides) -> bool:
    return all(d == 1 or int(s) == v for d, s, v in zip(t.dim, t.stride, strides))


def _as_view(lw, node, x, y, strides):
    """Lower ``y = op(x)`` as a view: ``y`` becomes a tensor in memory with ``strides`` over ``x``'s
    data, fed at execute from ``x``'s pointer (no operation; its consumer reads ``x`` directly)."""
    dims, padded = lw.dims(y), len(lw.dims(y)) - len(y.dim)
    full = tuple(lw.strides(y)[:padded]) + tuple(int(s) for s in strides)
    _set_geometry(lw, y, dims, full, CUDNN_ATTR_TENSOR_IS_VIRTUAL=False,
                  CUDNN_ATTR_TENSOR_DATA_TYPE=DataType(lw.graph.data_type(x)))
    lw.alias(y, x, 0)
    logger.debug("%s lowered as a view of '%s' with strides %s", node.name, x.name, full)
    yield from ()


@lowers("reshape", native_geometry=True, attributes={
    _OP + "RESHAPE_XDESC": _DESC, _OP + "RESHAPE_YDESC": _DESC, _OP + "RESHAPE_MODE": "CUDNN_TYPE_RESHAPE_MODE"})
def _lower_reshape(lw, node, i):
    x, y = node.inputs["input"], node.outputs["Y"]
    mode = ReshapeMode(node.params.get("reshape_mode", ReshapeMode.VIEW_ONLY))
    if _is_graph_input(x) and y.is_virtual:
        strides = _view_strides(tuple(x.dim), tuple(x.stride), tuple(y.dim))
        # A VIEW_ONLY reshape reads memory through Y's own strides: a view only where they agree.
        if strides is not None and (mode == ReshapeMode.LOGICAL or _same_strides(y, strides)):
            yield from _as_view(lw, node, x, y, strides)
            return
    if not _native(lw) and not y.is_virtual:
        raise GraphNotSupportedError(
            f"{_label(node)}: a reshape written to the tensor '{y.name}' copies data; before cuDNN 9.22 a reshape "
            f"is a view only and cuDNN {_version_text(lw)} has no engine that copies (its heuristics answer "
            "NOT_SUPPORTED for such a graph on sm_90)")
    attrs = {_OP + "RESHAPE_XDESC": lw.ref(x), _OP + "RESHAPE_YDESC": lw.ref(y)}
    if _native(lw):
        attrs[_OP + "RESHAPE_MODE"] = mode
    elif mode == ReshapeMode.LOGICAL and not (_is_row_major(x.dim, x.stride) and _is_row_major(y.dim, y.stride)):
        # Older cuDNN reshapes by view only; a row-major pair is the one case where both agree.
        raise CudnnVersionError(f"{_label(node)}: a LOGICAL reshape of tensors not both packed row-major",
                                NATIVE_LAYOUT_VERSION, lw.version)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR", attrs)


@lowers("transpose", native_geometry=True, attributes={
    _OP + "TRANSPOSE_XDESC": _DESC, _OP + "TRANSPOSE_YDESC": _DESC,
    _OP + "TRANSPOSE_PERMUTATION": "CUDNN_TYPE_INT64"})
def _lower_transpose(lw, node, i):
    x, y = node.inputs["input"], node.outputs["Y"]
    shift = _shift(lw, x)
    perm = tuple(range(shift)) + tuple(int(p) + shift for p in node.params["permutation"])
    xd, xs = lw.dims(x), lw.strides(x)
    view_dims = tuple(xd[p] for p in perm)
    view_strides = tuple(xs[p] for p in perm)
    if y.is_virtual and _is_graph_input(x):
        # The input's memory under permuted strides: its consumer reads the input directly.
        yield from _as_view(lw, node, x, y, view_strides[shift:])
        return
    if y.is_virtual:
        # The output is the input's memory seen through permuted strides: a view reshape.
        _set_geometry(lw, y, view_dims, view_strides)
        yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR", {
            _OP + "RESHAPE_XDESC": lw.ref(x), _OP + "RESHAPE_YDESC": lw.ref(y)})
        return
    if not _native(lw):
        raise CudnnVersionError(f"{_label(node)}: a transpose written to the tensor '{y.name}' moves data "
                                "(only a virtual transpose feeding another op is a view)",
                                NATIVE_LAYOUT_VERSION, lw.version)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR", {
        _OP + "TRANSPOSE_XDESC": lw.ref(x), _OP + "TRANSPOSE_YDESC": lw.ref(y),
        _OP + "TRANSPOSE_PERMUTATION": perm})


# ---- slice -----------------------------------------------------------------------------------------

def _offset_alignment(byte_offset: int) -> int:
    """The alignment a pointer keeps after ``byte_offset`` from a BYTE_ALIGNMENT-aligned one."""
    if byte_offset % BYTE_ALIGNMENT == 0:
        return BYTE_ALIGNMENT
    return byte_offset & -byte_offset


@lowers("slice", native_geometry=True, attributes={
    _OP + "SLICE_XDESC": _DESC, _OP + "SLICE_YDESC": _DESC, _OP + "SLICE_START_INDICES": "CUDNN_TYPE_INT64",
    _OP + "SLICE_LIMIT_INDICES": "CUDNN_TYPE_INT64", _OP + "SLICE_STRIDES": "CUDNN_TYPE_INT64"})
def _lower_slice(lw, node, i):
    x, y = node.inputs["input"], node.outputs["Y"]
    bounds = slice_bounds(node.params.get("slices") or (), tuple(x.dim))
    shift = _shift(lw, x)
    if _native(lw):
        yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR", {
            _OP + "SLICE_XDESC": lw.ref(x), _OP + "SLICE_YDESC": lw.ref(y),
            _OP + "SLICE_START_INDICES": (0,) * shift + tuple(b[0] for b in bounds),
            _OP + "SLICE_LIMIT_INDICES": (1,) * shift + tuple(b[1] for b in bounds),
            _OP + "SLICE_STRIDES": (1,) * shift + tuple(b[2] for b in bounds)})
        return
    if x.is_virtual or x.is_pass_by_value or x.producer is not None:
        raise CudnnVersionError(f"{_label(node)}: a slice of '{x.name}', which this graph computes (before "
                                "cuDNN 9.22 only a slice of a graph input becomes a pointer offset)",
                                NATIVE_LAYOUT_VERSION, lw.version)
    if not y.is_virtual:
        raise CudnnVersionError(f"{_label(node)}: a slice written to the output tensor '{y.name}' copies data "
                                "(before cuDNN 9.22 only a virtual slice feeding another op becomes a pointer "
                                "offset)", NATIVE_LAYOUT_VERSION, lw.version)
    elements = sum(start * stride for (start, _, _), stride in zip(bounds, x.stride))
    bits = elements * itemsize_bits(DataType(lw.graph.data_type(x)))
    if bits % 8:
        raise GraphNotSupportedError(f"{_label(node)}: the slice starts inside a byte of the packed tensor "
                                     f"'{x.name}'; a pointer offset cannot express it")
    byte_offset = bits // 8
    strides = tuple(lw.strides(x)[:shift]) + tuple(s * b[2] for s, b in zip(x.stride, bounds))
    _set_geometry(lw, y, lw.dims(y), strides, CUDNN_ATTR_TENSOR_IS_VIRTUAL=False,
                  CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT=_offset_alignment(byte_offset))
    lw.alias(y, x, byte_offset)
    logger.debug("slice %s lowered as a view of '%s' at byte offset %d", node.name, x.name, byte_offset)
    yield from ()


# ---- concatenate -----------------------------------------------------------------------------------

@lowers("concatenate", native_geometry=True, attributes={
    _OP + "CONCAT_AXIS": "CUDNN_TYPE_INT64", _OP + "CONCAT_INPUT_DESCS": _DESC,
    _OP + "CONCAT_INPLACE_INDEX": "CUDNN_TYPE_INT64", _OP + "CONCAT_OUTPUT_DESC": _DESC})
def _lower_concatenate(lw, node, i):
    y = node.outputs["Y"]
    if lw.version is not None and lw.version < NATIVE_LAYOUT_VERSION and \
            not any(n.op == "conv_fprop" for n in lw.graph.nodes):
        # cudnn-frontend's samples: concatenate as a conv-fprop epilogue with an in-place input (>= 9.8),
        # or alone / with pointwise ops through the memory-bound engines (>= 9.22, run on Blackwell).
        raise CudnnVersionError(f"{_label(node)}: a concatenate outside a convolution-forward epilogue "
                                f"(cuDNN {_version_text(lw)} has an engine for concatenate only fused after "
                                "conv_fprop, with an in-place input)", NATIVE_LAYOUT_VERSION, lw.version)
    attrs = {
        _OP + "CONCAT_AXIS": int(node.params["axis"]) + _shift(lw, y),
        _OP + "CONCAT_INPUT_DESCS": tuple(lw.ref(t) for t in node.inputs["inputs"]),
        _OP + "CONCAT_OUTPUT_DESC": lw.ref(y),
    }
    if node.params.get("in_place_index") is not None:
        attrs[_OP + "CONCAT_INPLACE_INDEX"] = int(node.params["in_place_index"])
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR", attrs)


# ---- block scale -----------------------------------------------------------------------------------

_QUANT = _OP + "BLOCK_SCALE_QUANTIZE_"
_DEQUANT = _OP + "BLOCK_SCALE_DEQUANTIZE_"
NEGATIVE_SCALE_VERSION = 91400   # cudnn-frontend sets the attribute from 9.14


@lowers("block_scale_quantize", native_geometry=True, attributes={
    _QUANT + "XDESC": _DESC, _QUANT + "YDESC": _DESC, _QUANT + "SCALE_DESC": _DESC,
    _QUANT + "MATH_PREC": "CUDNN_TYPE_DATA_TYPE", _QUANT + "BLOCK_SIZE": "CUDNN_TYPE_INT32"})
def _lower_quantize(lw, node, i):
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_BLOCK_SCALE_QUANTIZE_DESCRIPTOR", {
        _QUANT + "XDESC": lw.ref(node.inputs["input"]),
        _QUANT + "YDESC": lw.ref(node.outputs["Y"]),
        _QUANT + "SCALE_DESC": lw.ref(node.outputs["scale"]),
        _QUANT + "MATH_PREC": lw.compute_type(node),
        _QUANT + "BLOCK_SIZE": int(node.params["block_size"]),
    })


@lowers("block_scale_dequantize", native_geometry=True, attributes={
    _DEQUANT + "XDESC": _DESC, _DEQUANT + "SCALE_DESC": _DESC, _DEQUANT + "YDESC": _DESC,
    _DEQUANT + "MATH_PREC": "CUDNN_TYPE_DATA_TYPE", _DEQUANT + "BLOCK_SIZE": "CUDNN_TYPE_INT32",
    _DEQUANT + "NEG_SCALE": "CUDNN_TYPE_BOOLEAN"})
def _lower_dequantize(lw, node, i):
    y = node.outputs["Y"]
    if not y.is_virtual:
        raise GraphNotSupportedError(f"{_label(node)}: the output '{y.name}' must be virtual (cuDNN dequantizes "
                                     "only into the op that consumes it, e.g. a matmul)")
    attrs = {
        _DEQUANT + "XDESC": lw.ref(node.inputs["input"]),
        _DEQUANT + "SCALE_DESC": lw.ref(node.inputs["descale"]),
        _DEQUANT + "YDESC": lw.ref(y),
        _DEQUANT + "MATH_PREC": lw.compute_type(node),
        _DEQUANT + "BLOCK_SIZE": tuple(int(b) for b in node.params["block_size"]),
    }
    negative = bool(node.params.get("is_negative_scale"))
    if lw.version is None or lw.version >= NEGATIVE_SCALE_VERSION:
        attrs[_DEQUANT + "NEG_SCALE"] = negative
    elif negative:
        raise CudnnVersionError(f"{_label(node)}: is_negative_scale", NEGATIVE_SCALE_VERSION, lw.version)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR", attrs)


# ---- rng -------------------------------------------------------------------------------------------

@lowers("rng", native_geometry=True, attributes={
    "CUDNN_ATTR_RNG_DISTRIBUTION": "CUDNN_TYPE_RNG_DISTRIBUTION",
    "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": "CUDNN_TYPE_DOUBLE",
    _OP + "RNG_YDESC": _DESC, _OP + "RNG_DESC": _DESC,
    # SEED also takes an INT64 value; the lowering always passes a tensor (a pass-by-value one for an int).
    _OP + "RNG_SEED": _DESC, _OP + "RNG_OFFSET_DESC": _DESC})
def _lower_rng(lw, node, i):
    yield Step(f"rng_{i}", "CUDNN_BACKEND_RNG_DESCRIPTOR", {
        "CUDNN_ATTR_RNG_DISTRIBUTION": node.params["distribution"],
        "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": float(node.params["bernoulli_probability"]),
    })
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR", {
        _OP + "RNG_YDESC": lw.ref(node.outputs["Y"]),
        _OP + "RNG_DESC": Ref(f"rng_{i}"),
        _OP + "RNG_SEED": lw.ref(node.inputs["seed"]),
        _OP + "RNG_OFFSET_DESC": lw.ref(node.inputs["offset"]),
    })


# ---- resample --------------------------------------------------------------------------------------

_RESAMPLE = "CUDNN_ATTR_RESAMPLE_"
_RESAMPLE_FWD = _OP + "RESAMPLE_FWD_"


def _fractions(values) -> tuple:
    """Whole numbers as cudnnFraction_t (numerator, denominator) pairs, as cudnn-frontend sets them."""
    return tuple((int(v), 1) for v in values)


@lowers("resample", native_geometry=True, attributes={
    _RESAMPLE + "MODE": "CUDNN_TYPE_RESAMPLE_MODE", _RESAMPLE + "COMP_TYPE": "CUDNN_TYPE_DATA_TYPE",
    _RESAMPLE + "NAN_PROPAGATION": "CUDNN_TYPE_NAN_PROPOGATION", _RESAMPLE + "PADDING_MODE": "CUDNN_TYPE_PADDING_MODE",
    _RESAMPLE + "SPATIAL_DIMS": "CUDNN_TYPE_INT64", _RESAMPLE + "WINDOW_DIMS": "CUDNN_TYPE_FRACTION",
    _RESAMPLE + "PRE_PADDINGS": "CUDNN_TYPE_FRACTION", _RESAMPLE + "POST_PADDINGS": "CUDNN_TYPE_FRACTION",
    _RESAMPLE + "STRIDES": "CUDNN_TYPE_FRACTION",
    _RESAMPLE_FWD + "XDESC": _DESC, _RESAMPLE_FWD + "YDESC": _DESC, _RESAMPLE_FWD + "IDXDESC": _DESC,
    _RESAMPLE_FWD + "DESC": _DESC, _RESAMPLE_FWD + "ALPHA": "CUDNN_TYPE_DOUBLE",
    _RESAMPLE_FWD + "BETA": "CUDNN_TYPE_DOUBLE"})
def _lower_resample(lw, node, i):
    x, y = node.inputs["input"], node.outputs["Y"]
    params = node.params
    spatial = len(x.dim) - 2
    yield Step(f"resample_{i}", "CUDNN_BACKEND_RESAMPLE_DESCRIPTOR", {
        _RESAMPLE + "MODE": params["resampling_mode"],
        _RESAMPLE + "COMP_TYPE": lw.compute_type(node),
        _RESAMPLE + "NAN_PROPAGATION": 1 if params.get("nan_propagation", True) else 0,
        _RESAMPLE + "PADDING_MODE": pool_padding_mode(params),
        _RESAMPLE + "SPATIAL_DIMS": spatial,
        _RESAMPLE + "WINDOW_DIMS": _fractions(params["window"]),
        _RESAMPLE + "PRE_PADDINGS": _fractions(params.get("pre_padding") or (0,) * spatial),
        _RESAMPLE + "POST_PADDINGS": _fractions(params.get("post_padding") or (0,) * spatial),
        _RESAMPLE + "STRIDES": _fractions(params.get("stride") or (1,) * spatial),
    })
    op = {
        _RESAMPLE_FWD + "XDESC": lw.ref(x),
        _RESAMPLE_FWD + "YDESC": lw.ref(y),
        _RESAMPLE_FWD + "DESC": Ref(f"resample_{i}"),
        # Deprecated in the headers but still set by cudnn-frontend; 1 and 0 are what it sets.
        _RESAMPLE_FWD + "ALPHA": 1.0,
        _RESAMPLE_FWD + "BETA": 0.0,
    }
    index = node.outputs.get("index")
    if index is not None:
        op[_RESAMPLE_FWD + "IDXDESC"] = lw.ref(index)
    yield Step(f"op_{i}", "CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR", op)
