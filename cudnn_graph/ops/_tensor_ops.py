"""Structured tensor op schemas: matmul, reduction, reshape, transpose, slice, concatenate, block-scale.

Names and keywords follow ``cudnn.pygraph``::

    C = graph.matmul(A, B, padding=0.0)                  # [.., M, K] x [.., K, N] -> [.., M, N]
    Y = graph.reduction(input, mode=reduction_mode.ADD)   # then Y.set_dim([...]) with 1 on reduced axes
    Y = graph.reshape(input, reshape_mode=VIEW_ONLY)      # then Y.set_dim([...])
    Y = graph.transpose(input, permutation=[0, 2, 1])     # output axis i reads input axis permutation[i]
    Y = graph.slice(input, slices=[slice(0, 2), slice(1, 8, 2)])
    Y = graph.concatenate(inputs=[x0, x1], axis=1, in_place_index=None)
    Y, scale = graph.block_scale_quantize(input, block_size=32, axis=None, transpose=False)
    Y = graph.block_scale_dequantize(input, descale, block_size=[1, 32], is_negative_scale=False)

Output dims that pygraph leaves to the caller (reduction, reshape) infer as ``None``; the IR calls
``schema.validate_outputs(ctx, {output: dims})`` once the caller has set them. ``concatenate``'s
``inputs`` port takes a list of tensors (``schema.list_ports``); inference sees it as a list of
``TensorInfo``.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Mapping, Optional

from ..data_type import DataType
from ..enums import reduction_mode, reshape_mode
from .schema import (REQUIRED, Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo,
                     enum_converter, register)

__all__ = ["ReductionMode", "ReshapeMode", "slice_bounds", "block_scale_axis"]


# The op tables' names for the package's enums (VIEW_ONLY reinterprets the same memory with the
# output's dims/strides; LOGICAL is a lexicographic, row-major reshape that may move data).
ReductionMode = reduction_mode
ReshapeMode = reshape_mode


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"an integer was expected; got {value!r}")
    return operator.index(value)


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else _int(value)


def _int_tuple(value: Any) -> tuple:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return (_int(value),)   # a bare int is a one-element list (dequantize's block_size)
    return tuple(_int(v) for v in value)


def _bool(value: Any) -> bool:
    # bool, 0/1, or a NumPy bool; anything else (a string, a float) is a mistake worth reporting.
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"a bool was expected; got {value!r}")


def _slices(value: Any) -> tuple:
    """Normalise ``slices`` to a hashable tuple of (start, stop, step) triples (None allowed)."""
    if value is None:
        return ()
    out = []
    for s in value:
        if isinstance(s, slice):
            triple = (s.start, s.stop, s.step)
        elif isinstance(s, (tuple, list)) and 2 <= len(s) <= 3:
            triple = (s[0], s[1], s[2] if len(s) == 3 else None)
        else:
            raise TypeError(f"slices must hold Python slice objects or (start, stop[, step]) tuples; got {s!r}")
        out.append(tuple(None if v is None else _int(v) for v in triple))
    return tuple(out)


def _dims(info: TensorInfo) -> tuple:
    return tuple(info.dim)


# ---------------------------------------------------------------------------------------------- matmul

def _infer_matmul(ctx: InferContext) -> dict:
    a, b = _dims(ctx.need("A")), _dims(ctx.need("B"))
    for port, d in (("A", a), ("B", b)):
        if len(d) < 2:
            ctx.fail(port, f"must have rank >= 2 (.., rows, cols); got dims {d}")
    if len(a) != len(b):
        ctx.fail("B", f"has rank {len(b)} but A has rank {len(a)}; matmul operands must have equal rank")
    if a[-1] != b[-2]:
        ctx.fail("B", f"K mismatch: A is {a} (K = {a[-1]}) but B is {b} (K = {b[-2]})")
    batch = []
    for i, (x, y) in enumerate(zip(a[:-2], b[:-2])):
        if x != y and 1 not in (x, y):
            ctx.fail("B", f"batch axis {i} is {y} but A's is {x}; batch dims must match or be 1")
        batch.append(max(x, y))
    return {"C": OutputInfo(tuple(batch) + (a[-2], b[-1]))}


# ------------------------------------------------------------------------------------------- reduction

def _infer_reduction(ctx: InferContext) -> dict:
    ctx.need("input")
    return {"Y": OutputInfo(None)}   # the caller's dims say which axes are reduced


def _validate_reduction(ctx: InferContext, dims: Mapping[str, Optional[tuple]]) -> None:
    x = _dims(ctx.need("input"))
    y = dims.get("Y")
    if y is None:
        ctx.fail("Y", "dims must be set: reduction infers the reduced axes from them (1 on reduced axes)")
    y = tuple(y)
    if len(y) != len(x):
        ctx.fail("Y", f"has rank {len(y)} but the input {x} has rank {len(x)}")
    for i, (xi, yi) in enumerate(zip(x, y)):
        if yi != 1 and yi != xi:
            ctx.fail("Y", f"axis {i} is {yi}; a reduction output axis must be 1 (reduced) or {xi} (kept)")


# -------------------------------------------------------------------------------------- layout ops

def _infer_reshape(ctx: InferContext) -> dict:
    x = ctx.need("input")
    return {"Y": OutputInfo(None, x.data_type)}


def _validate_reshape(ctx: InferContext, dims: Mapping[str, Optional[tuple]]) -> None:
    x = _dims(ctx.need("input"))
    y = dims.get("Y")
    if y is None:
        ctx.fail("Y", "dims must be set: reshape takes its target shape from the output tensor")
    if math.prod(y) != math.prod(x):
        ctx.fail("Y", f"dims {tuple(y)} hold {math.prod(y)} elements but the input {x} holds {math.prod(x)}")


def _infer_transpose(ctx: InferContext) -> dict:
    x = ctx.need("input")
    perm = ctx.attrs["permutation"]
    rank = len(x.dim)
    if len(perm) != rank:
        ctx.fail("permutation", f"has {len(perm)} entries but the input has rank {rank}")
    if sorted(perm) != list(range(rank)):
        ctx.fail("permutation", f"{tuple(perm)} is not a permutation of 0..{rank - 1}")
    dim = tuple(x.dim[p] for p in perm)
    stride = tuple(x.stride[p] for p in perm) if len(x.stride) == rank else None
    return {"Y": OutputInfo(dim, x.data_type, stride)}


def slice_bounds(slices: tuple, dims: tuple) -> list:
    """(start, limit, step) per axis, Python-slice semantics; axes past ``len(slices)`` are kept whole.

    Raises ValueError when there are more slices than axes or a step is not positive.
    """
    if len(slices) > len(dims):
        raise ValueError(f"{len(slices)} slices given for a rank-{len(dims)} input")
    out = []
    for i, d in enumerate(dims):
        start, stop, step = slices[i] if i < len(slices) else (None, None, None)
        if step is not None and step <= 0:
            raise ValueError(f"axis {i}: step must be positive (cuDNN slices forward only); got {step}")
        out.append(slice(start, stop, step).indices(d))
    return out


def _infer_slice(ctx: InferContext) -> dict:
    x = ctx.need("input")
    try:
        bounds, problem = slice_bounds(ctx.attrs["slices"], tuple(x.dim)), None
    except ValueError as e:
        problem = str(e)
    if problem:
        ctx.fail("slices", problem)   # raised outside the except block: no chained traceback
    dim = []
    for i, ((start, stop, step), d) in enumerate(zip(bounds, x.dim)):
        n = len(range(start, stop, step))
        if n == 0:
            ctx.fail("slices", f"axis {i} (size {d}) selects nothing: start {start}, stop {stop}, step {step}")
        dim.append(n)
    # cudnn-frontend's stride: the input's, scaled by the step (the slice as a view of its source).
    stride = (tuple(s * b[2] for s, b in zip(x.stride, bounds)) if len(x.stride) == len(x.dim) else None)
    return {"Y": OutputInfo(tuple(dim), x.data_type, stride)}


def _infer_concatenate(ctx: InferContext) -> dict:
    items = ctx.need("inputs")
    if isinstance(items, TensorInfo) or not isinstance(items, (list, tuple)) or not items:
        ctx.fail("inputs", "must be a non-empty list of tensors")
    if any(t is None for t in items):
        ctx.fail("inputs", f"entry {[t is None for t in items].index(True)} is not a tensor")
    first = _dims(items[0])
    rank, axis = len(first), ctx.attrs["axis"]
    if not 0 <= axis < rank:
        ctx.fail("axis", f"must lie in [0, {rank - 1}] for rank-{rank} inputs; got {axis}")
    for i, t in enumerate(items[1:], 1):
        d = _dims(t)
        if len(d) != rank or any(a != b for j, (a, b) in enumerate(zip(d, first)) if j != axis):
            ctx.fail("inputs", f"entry {i} has dims {d}; every entry must match {first} except on axis {axis}")
        if t.data_type != items[0].data_type:
            ctx.fail("inputs", f"entry {i} is {t.data_type.name} but entry 0 is {items[0].data_type.name}")
    idx = ctx.attrs.get("in_place_index")
    if idx is not None and not 0 <= idx < len(items):
        ctx.fail("in_place_index", f"must index one of the {len(items)} inputs; got {idx}")
    dim = list(first)
    dim[axis] = sum(t.dim[axis] for t in items)
    return {"Y": OutputInfo(tuple(dim), items[0].data_type)}


# ---------------------------------------------------------------------------------------- block scale

_FLOAT_INPUTS = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16)


def block_scale_axis(attrs: Mapping[str, Any], rank: int) -> int:
    """The axis block_scale_quantize blocks along: ``axis`` or, when None, the last one."""
    axis = attrs.get("axis")
    return rank - 1 if axis is None else axis


def _infer_quantize(ctx: InferContext) -> dict:
    x = ctx.need("input")
    if x.data_type not in _FLOAT_INPUTS:
        ctx.fail("input", "must be FLOAT, HALF or BFLOAT16 (the float tensor to quantize); "
                          f"got {x.data_type.name}")
    dim, bs = _dims(x), ctx.attrs["block_size"]
    if bs <= 0:
        ctx.fail("block_size", f"must be positive; got {bs}")
    axis = block_scale_axis(ctx.attrs, len(dim))
    if not 0 <= axis < len(dim):
        ctx.fail("axis", f"must lie in [0, {len(dim) - 1}]; got {axis}")
    if dim[axis] % bs:
        ctx.fail("block_size", f"{bs} does not divide axis {axis} (size {dim[axis]})")
    scale = list(dim)
    scale[axis] //= bs
    y_stride = None if ctx.attrs.get("transpose") else tuple(x.stride) or None
    return {"Y": OutputInfo(dim, None, y_stride), "scale": OutputInfo(tuple(scale))}


def _validate_quantize(ctx: InferContext, dims: Mapping[str, Optional[tuple]]) -> None:
    x = _dims(ctx.need("input"))
    y, s = dims.get("Y"), dims.get("scale")
    if y is not None and tuple(y) != x:
        ctx.fail("Y", f"dims {tuple(y)} must equal the input's {x}")
    if s is not None:
        axis, bs = block_scale_axis(ctx.attrs, len(x)), ctx.attrs["block_size"]
        need = tuple(-(-d // bs) if i == axis else d for i, d in enumerate(x))
        # Larger scale dims are allowed: swizzled layouts (e.g. F8_128x4) pad them.
        if len(s) != len(x) or any(a < b for a, b in zip(s, need)):
            ctx.fail("scale", f"dims {tuple(s)} cannot hold the {need} block scales of input {x}")


def _infer_dequantize(ctx: InferContext) -> dict:
    x, sc = ctx.need("input"), ctx.need("descale")
    dim, bs = _dims(x), ctx.attrs["block_size"]
    if not bs or len(bs) > len(dim) or any(b <= 0 for b in bs):
        ctx.fail("block_size", f"must be 1..{len(dim)} positive sizes (aligned to the last axes); got {bs}")
    blocks = (1,) * (len(dim) - len(bs)) + tuple(bs)
    need = tuple(-(-d // b) for d, b in zip(dim, blocks))
    if len(sc.dim) != len(dim) or any(a < b for a, b in zip(sc.dim, need)):
        ctx.fail("descale", f"dims {tuple(sc.dim)} cannot hold the {need} block scales of input {dim} "
                            f"with block_size {tuple(bs)}")
    return {"Y": OutputInfo(dim, None, tuple(x.stride) or None)}


# -------------------------------------------------------------------------------------------- tables

def _op(name, family, ports, infer, attrs=(), order=None, outputs=("Y",), doc="", **fields) -> OpSchema:
    """A schema whose positional order is pygraph's (ports, attrs, compute_data_type, name) unless
    ``order`` says otherwise; ``fields`` are further OpSchema fields."""
    order = order or tuple(ports) + tuple(a.name for a in attrs) + ("compute_data_type", "name")
    return OpSchema(
        name=name, family=family, inputs=tuple(Port(p) for p in ports),
        outputs=tuple(Output(o) for o in outputs), infer=infer, attrs=tuple(attrs),
        positional=tuple(n for n in order if n not in ("compute_data_type", "name")),
        returns="single" if len(outputs) == 1 else "list", doc=doc, pygraph_positional=order, **fields)


_to_reduction_mode = enum_converter(ReductionMode, "mode", "CUDNN_REDUCE_TENSOR_")
_to_reshape_mode = enum_converter(ReshapeMode, "reshape_mode", "CUDNN_RESHAPE_")

register(
    _op("matmul", "matmul", ("A", "B"), _infer_matmul,
        (Attr("padding", 0.0, float, "value of padded elements (CUDNN_ATTR_MATMUL_PADDING_VALUE)"),),
        order=("A", "B", "compute_data_type", "padding", "name"), outputs=("C",),
        backend="CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR",
        doc="C[.., M, N] = A[.., M, K] @ B[.., K, N]; batch axes broadcast (equal or 1)."),
    _op("reduction", "reduction", ("input",), _infer_reduction,
        (Attr("mode", REQUIRED, _to_reduction_mode, "ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2, MUL_NO_ZEROS"),),
        backend="CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR", validate_outputs=_validate_reduction,
        doc="Reduce along the axes where the caller-set output dims are 1."),
    _op("reshape", "layout", ("input",), _infer_reshape,
        (Attr("reshape_mode", ReshapeMode.VIEW_ONLY, _to_reshape_mode, "VIEW_ONLY (default) or LOGICAL"),),
        order=("input", "name", "reshape_mode"),
        backend="CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR", validate_outputs=_validate_reshape,
        doc="Reshape to the caller-set output dims (same element count)."),
    _op("transpose", "layout", ("input",), _infer_transpose,
        (Attr("permutation", REQUIRED, _int_tuple, "output axis i reads input axis permutation[i]"),),
        backend="CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR",
        doc="Permute axes."),
    _op("slice", "layout", ("input",), _infer_slice,
        (Attr("slices", (), _slices, "one Python slice (or (start, stop[, step])) per leading axis"),),
        backend="CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR",
        doc="Strided slice with Python semantics; axes without a slice are kept whole."),
    _op("concatenate", "layout", ("inputs",), _infer_concatenate,
        (Attr("axis", REQUIRED, _int, "concatenation axis"),
         Attr("in_place_index", None, _opt_int, "index of the input already in place in the output")),
        order=("inputs", "axis", "in_place_index", "name"),
        backend="CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR", min_cudnn=90700, list_ports=("inputs",),
        doc="Concatenate a list of tensors along axis."),
    _op("block_scale_quantize", "quant", ("input",), _infer_quantize,
        (Attr("block_size", REQUIRED, _int, "elements per scale block"),
         Attr("axis", None, _opt_int, "blocked axis; None = the last"),
         Attr("transpose", False, _bool, "lay Y and scale out with the blocked axis packed")),
        outputs=("Y", "scale"),
        backend="CUDNN_BACKEND_OPERATION_BLOCK_SCALE_QUANTIZE_DESCRIPTOR", min_cudnn=90700,
        validate_outputs=_validate_quantize,
        doc="Quantize blocks of block_size elements with one shared scale each; returns (Y, scale)."),
    _op("block_scale_dequantize", "quant", ("input", "descale"), _infer_dequantize,
        (Attr("block_size", REQUIRED, _int_tuple, "block size per trailing axis, e.g. [1, 32]"),
         Attr("is_negative_scale", False, _bool, "scales may be negative (cuDNN >= 9.14)")),
        backend="CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR", min_cudnn=90700,
        doc="Y = input * descale broadcast over blocks; Y must be virtual (feeds a matmul)."),
)
