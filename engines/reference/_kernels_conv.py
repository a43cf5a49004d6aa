"""Reference (NumPy, CPU) kernels for ``conv_fprop``, ``conv_dgrad`` and ``conv_wgrad``.

One im2col formulation serves all three, for 2-D and 3-D convolutions with stride, dilation, asymmetric
padding, groups and both convolution modes:

* ``im2col`` pads the image and gathers, for each filter tap ``t``, the strided/dilated window of the
  image that tap sees: ``cols[n, c, t, *out] = x_padded[n, c, *(out * stride + tap * dilation)]``;
* fprop contracts ``cols`` with the filter over (c, t) per group;
* wgrad contracts ``cols`` with dy over (n, *out) per group;
* dgrad contracts dy with the filter into ``dcols`` and scatters them back with ``col2im`` (the exact
  transpose of im2col), then drops the padding.

So dgrad and wgrad are the true adjoints of fprop, not separate formulas that could drift. Work is done in
float32 (float64 when the compute type is DOUBLE); results are cast to the requested output dtype.

Kernel signature (every reference kernel): ``kernel(inputs, attrs, outputs, compute_dtype) -> dict``
with ``inputs`` keyed by port name, ``outputs`` mapping output name -> (dims, numpy dtype).
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping

import numpy as np

__all__ = ["KERNELS", "conv_fprop", "conv_dgrad", "conv_wgrad"]


def _work_dtype(compute_dtype: Any) -> type:
    name = getattr(compute_dtype, "name", compute_dtype)
    if isinstance(name, str) and name.upper() in ("DOUBLE", "FLOAT64"):
        return np.float64
    return np.float32


def _as(a: Any, work: type) -> np.ndarray:
    # ml_dtypes (bf16, fp8) arrays convert through astype like any NumPy dtype.
    return np.asarray(a).astype(work, copy=False)


def _emit(a: np.ndarray, spec: tuple) -> np.ndarray:
    dims, dtype = spec
    a = a.reshape(tuple(dims))
    return np.ascontiguousarray(a if dtype is None else a.astype(dtype))


def _geometry(attrs: Mapping[str, Any], nd: int) -> tuple:
    """(pre, post, stride, dilation, flip) from the schema attrs (padding is shorthand for pre = post)."""
    pad = attrs.get("padding")
    pre = pad if pad is not None else attrs.get("pre_padding")
    post = pad if pad is not None else attrs.get("post_padding")
    pre = tuple(pre) if pre is not None else (0,) * nd
    post = tuple(post) if post is not None else (0,) * nd
    stride = tuple(attrs.get("stride") or (1,) * nd)
    dilation = tuple(attrs.get("dilation") or (1,) * nd)
    mode = attrs.get("convolution_mode")
    mode = getattr(mode, "name", mode)
    flip = isinstance(mode, str) and mode.upper().rsplit(".", 1)[-1] == "CONVOLUTION"
    return pre, post, stride, dilation, flip


def _tap_slices(taps: tuple, out: tuple, stride: tuple, dilation: tuple):
    """For each filter tap, the slice of the padded image it reads for every output position."""
    for tap in itertools.product(*(range(k) for k in taps)):
        yield tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, o, s, d in zip(tap, out, stride, dilation))


def _check_fits(padded: tuple, taps: tuple, out: tuple, stride: tuple, dilation: tuple) -> None:
    for p, k, o, s, d in zip(padded, taps, out, stride, dilation):
        if o < 1 or (o - 1) * s + (k - 1) * d + 1 > p:
            raise ValueError(f"conv geometry does not fit: output extent {o} with filter {k}, stride {s}, "
                             f"dilation {d} needs more than the {p} padded input elements")


def _im2col(xp: np.ndarray, taps: tuple, out: tuple, stride: tuple, dilation: tuple) -> np.ndarray:
    """[N, C, *padded] -> [N, C, T, *out] where T = prod(taps)."""
    lead = (slice(None), slice(None))
    return np.stack([xp[lead + sl] for sl in _tap_slices(taps, out, stride, dilation)], axis=2)


def _col2im(cols: np.ndarray, padded_shape: tuple, taps: tuple, stride: tuple, dilation: tuple) -> np.ndarray:
    """Transpose of _im2col: scatter-add [N, C, T, *out] back into a zero [N, C, *padded] array."""
    out = cols.shape[3:]
    xp = np.zeros(padded_shape, dtype=cols.dtype)
    lead = (slice(None), slice(None))
    for t, sl in enumerate(_tap_slices(taps, out, stride, dilation)):
        xp[lead + sl] += cols[:, :, t]
    return xp


def _flip(w: np.ndarray) -> np.ndarray:
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]


def _pad(x: np.ndarray, pre: tuple, post: tuple) -> np.ndarray:
    return np.pad(x, [(0, 0), (0, 0)] + list(zip(pre, post)))


def _operands(inputs, attrs, ports: tuple, compute_dtype) -> tuple:
    """The two operands (``ports``) in the work dtype and the geometry for the first one's spatial rank."""
    work = _work_dtype(compute_dtype)
    first, second = (_as(inputs[p], work) for p in ports)
    return first, second, _geometry(attrs, first.ndim - 2)


def conv_fprop(inputs, attrs, outputs, compute_dtype=None) -> dict:
    """Y[n, k, o] = sum_{c in group(k), t} X_padded[n, c, o * stride + t * dilation] * W[k, c, t]."""
    x, w, (pre, post, stride, dilation, flip) = _operands(inputs, attrs, ("image", "weight"), compute_dtype)
    if flip:
        w = _flip(w)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    g = c // cg
    taps = w.shape[2:]
    xp = _pad(x, pre, post)
    out = tuple(1 + (p - d * (r - 1) - 1) // s for p, r, s, d in zip(xp.shape[2:], taps, stride, dilation))
    _check_fits(xp.shape[2:], taps, out, stride, dilation)
    cols = _im2col(xp, taps, out, stride, dilation).reshape((n, g, cg, -1) + out)
    y = np.einsum("ngct...,gkct->ngk...", cols, w.reshape(g, k // g, cg, -1), optimize=True)
    return {"Y": _emit(y, outputs["Y"])}


def conv_dgrad(inputs, attrs, outputs, compute_dtype=None) -> dict:
    """DX = adjoint of conv_fprop in X, applied to dY; DX dims come from the output spec."""
    dy, w, (pre, post, stride, dilation, flip) = _operands(inputs, attrs, ("loss", "filter"), compute_dtype)
    dx_dims = tuple(outputs["DX"][0])
    if flip:
        w = _flip(w)
    n, k = dy.shape[:2]
    c, cg = dx_dims[1], w.shape[1]
    g = c // cg
    taps, out = w.shape[2:], dy.shape[2:]
    padded = tuple(s + a + b for s, a, b in zip(dx_dims[2:], pre, post))
    _check_fits(padded, taps, out, stride, dilation)
    dcols = np.einsum("ngk...,gkct->ngct...", dy.reshape((n, g, k // g) + out),
                      w.reshape(g, k // g, cg, -1), optimize=True)
    xp = _col2im(dcols.reshape((n, c, -1) + out), (n, c) + padded, taps, stride, dilation)
    dx = xp[(slice(None), slice(None)) + tuple(slice(a, a + s) for a, s in zip(pre, dx_dims[2:]))]
    return {"DX": _emit(dx, outputs["DX"])}


def conv_wgrad(inputs, attrs, outputs, compute_dtype=None) -> dict:
    """DW = adjoint of conv_fprop in W, applied to dY; DW dims come from the output spec."""
    x, dy, (pre, post, stride, dilation, flip) = _operands(inputs, attrs, ("image", "loss"), compute_dtype)
    dw_dims = tuple(outputs["DW"][0])
    n, c = x.shape[:2]
    k, cg = dw_dims[:2]
    g = c // cg
    taps, out = dw_dims[2:], dy.shape[2:]
    xp = _pad(x, pre, post)
    _check_fits(xp.shape[2:], taps, out, stride, dilation)
    cols = _im2col(xp, taps, out, stride, dilation).reshape((n, g, cg, -1) + out)
    dw = np.einsum("ngk...,ngct...->gkct", dy.reshape((n, g, k // g) + out), cols, optimize=True)
    dw = dw.reshape(dw_dims)
    if flip:   # the fprop filter was flipped before use, so its gradient is flipped back
        dw = _flip(dw)
    return {"DW": _emit(dw, outputs["DW"])}


KERNELS = {"conv_fprop": conv_fprop, "conv_dgrad": conv_dgrad, "conv_wgrad": conv_wgrad}
