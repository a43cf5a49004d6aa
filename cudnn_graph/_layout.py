"""Memory-layout facts every layer shares: packed strides and the operand alignment GPU engines ask.

Strides are in elements. A packed layout lists its axes outermost first; the innermost axis gets
stride 1 and each axis further out the product of the extents inside it (an extent of 0 counts as
1, so a zero-size tensor still gets distinct, valid strides).

Example:
    >>> row_major_strides((2, 3, 4))
    (12, 4, 1)
    >>> packed_strides((2, 3, 4, 5), order=(0, 2, 3, 1))   # NHWC: C innermost
    (60, 1, 15, 3)
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

__all__ = ["ALIGNMENT_BYTES", "packed_strides", "row_major_strides", "packed_strides_like",
           "channels_last_strides"]

# The base-address and outer-stride alignment GPU operands keep: what cuDNN's tensor descriptors
# promise (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), what TMA and 128-bit vector loads need.
ALIGNMENT_BYTES = 16


def packed_strides(dims: Sequence[int], order: Optional[Iterable[int]] = None) -> tuple:
    """Packed strides for ``dims`` with the axes laid out in ``order`` (outermost first; default
    row-major, i.e. ``0, 1, ..., rank - 1``)."""
    dims = tuple(int(d) for d in dims)
    axes = tuple(range(len(dims))) if order is None else tuple(order)
    strides, acc = [0] * len(dims), 1
    for axis in reversed(axes):
        strides[axis] = acc
        acc *= max(dims[axis], 1)
    return tuple(strides)


def row_major_strides(dims: Sequence[int]) -> tuple:
    """Packed row-major (C order) strides for ``dims``."""
    return packed_strides(dims)


def packed_strides_like(dims: Sequence[int], like: Sequence[int]) -> tuple:
    """Packed strides for ``dims`` whose axis order follows the strides ``like`` (larger stride
    further out, ties in axis order), so an output keeps its input's layout (BSHD stays BSHD).
    Row-major when ``like`` has another rank."""
    if len(like) != len(dims):
        return row_major_strides(dims)
    return packed_strides(dims, sorted(range(len(dims)), key=lambda i: (-like[i], i)))


def channels_last_strides(dims: Sequence[int]) -> tuple:
    """Packed strides with axis 1 innermost (NHWC / NDHWC for (N, C, spatial...)); row-major below rank 3."""
    rank = len(dims)
    if rank < 3:
        return row_major_strides(dims)
    return packed_strides(dims, (0,) + tuple(range(2, rank)) + (1,))
