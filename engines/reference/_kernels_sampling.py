"""NumPy reference kernels for rng and resample (pooling); same signature as ``_kernels_basic``.

``rng`` draws from NumPy's Philox generator keyed by the seed and offset: deterministic per (seed,
offset) but not cuDNN's bits, so GPU results are checked statistically, never against it.
``resample`` pools with the window's arg-max index numbered row-major inside the window.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cudnn_graph.ops._sampling import PaddingMode, ResampleMode, pool_padding_mode

__all__ = ["KERNELS"]


def _work_dtype(compute_dtype) -> type:
    if compute_dtype is not None and np.dtype(compute_dtype) == np.float64:
        return np.float64
    return np.float32


def _scalar(value) -> int:
    return int(np.asarray(value).reshape(-1)[0])


def rng(inputs, attrs, outputs, compute_dtype=None):
    """Bernoulli(p) draws in {0, 1}, from Philox keyed by (seed, offset)."""
    dims, _dtype = outputs["Y"]
    seed = _scalar(inputs["seed"]) % (1 << 64)
    offset = _scalar(inputs["offset"]) % (1 << 64)
    generator = np.random.Generator(np.random.Philox(key=seed, counter=offset))
    draws = generator.random(tuple(dims))
    return {"Y": (draws < float(attrs["bernoulli_probability"])).astype(_work_dtype(compute_dtype))}


def _geometry(attrs, spatial: int) -> tuple:
    def entries(key, default):
        value = attrs.get(key)
        return tuple(value) if value is not None else (default,) * spatial
    return tuple(attrs["window"]), entries("stride", 1), entries("pre_padding", 0), entries("post_padding", 0)


def _windows(array, window, stride, out_spatial):
    """(N, C, *out_spatial, prod(window)) view of every pooling window of a padded array."""
    spatial = len(window)
    view = sliding_window_view(array, window, axis=tuple(range(2, 2 + spatial)))
    view = view[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    view = view[(slice(None), slice(None)) + tuple(slice(0, n) for n in out_spatial)]
    return view.reshape(view.shape[:2 + spatial] + (-1,))


def resample(inputs, attrs, outputs, compute_dtype=None):
    """Max / average pooling over axes 2 onwards, with the padding mode's fill."""
    wd = _work_dtype(compute_dtype)
    x = np.asarray(inputs["input"]).astype(wd)
    spatial = x.ndim - 2
    window, stride, pre, post = _geometry(attrs, spatial)
    out_spatial = tuple(outputs["Y"][0])[2:]
    pads = [(0, 0), (0, 0)] + [(pre[i], post[i]) for i in range(spatial)]
    padding = pool_padding_mode(attrs)
    if padding == PaddingMode.EDGE_VAL_PAD:
        padded = np.pad(x, pads, mode="edge")
    else:
        fill = -np.inf if padding == PaddingMode.NEG_INF_PAD else 0.0
        padded = np.pad(x, pads, mode="constant", constant_values=fill)
    flat = _windows(padded, window, stride, out_spatial)
    mode = attrs["resampling_mode"]
    result = {}
    if mode == ResampleMode.MAXPOOL:
        with np.errstate(invalid="ignore"):
            if attrs.get("nan_propagation", True):
                y = np.max(flat, axis=-1)
                index = np.argmax(flat, axis=-1)   # a NaN is the first maximum np.argmax sees
            else:
                clean = np.where(np.isnan(flat), -np.inf, flat)
                y = np.max(clean, axis=-1)
                index = np.argmax(clean, axis=-1)
        if "index" in outputs:
            result["index"] = index.astype(outputs["index"][1])
    elif mode == ResampleMode.AVGPOOL_INCLUDE_PADDING:
        y = np.sum(flat, axis=-1) / math.prod(window)
    elif mode == ResampleMode.AVGPOOL_EXCLUDE_PADDING:
        inside = np.pad(np.ones(x.shape[2:], wd), pads[2:], mode="constant", constant_values=0.0)
        count = _windows(inside[None, None], window, stride, out_spatial).sum(axis=-1)
        values = np.where(_windows(np.pad(np.ones_like(x), pads, constant_values=0.0), window, stride,
                                   out_spatial) > 0, flat, 0.0)
        y = np.sum(values, axis=-1) / np.maximum(count, 1)
    else:
        raise NotImplementedError(f"resampling_mode {mode.name} has no reference kernel")
    result["Y"] = np.ascontiguousarray(y, dtype=wd)
    return result


KERNELS: dict[str, Callable] = {
    "rng": rng,
    "resample": resample,
}
