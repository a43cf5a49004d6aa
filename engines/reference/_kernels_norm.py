"""Reference (NumPy, CPU) kernels for the normalization ops and ``genstats``.

Every norm here is "standardise over some axes, then scale and shift": they differ only in which axes
the statistics run over, which the dims decide (see cudnn_graph/ops/_norms.py):

* batchnorm: all axes but C;          * instancenorm: the spatial axes (2, 3, ...);
* layernorm / rmsnorm: the axes where scale is not 1;  * adalayernorm: the same, never axis 0.

So one forward and one backward formula serve every op. With xhat = (x - mean) * inv_variance and
g = dy * scale (means over the statistics axes), the backward pass is
    dx = inv_variance * (g - mean(g) - xhat * mean(g * xhat)),
    dscale = sum(dy * xhat), dbias = sum(dy)   (summed down to scale's dims),
and for rmsnorm (no mean subtraction) dx = inv_rms * (g - xhat * mean(g * xhat)).
Variance is the biased (population) variance, as cuDNN computes it; batchnorm's running variance is
updated with the unbiased estimate, as cuDNN and the frameworks do.

Work is done in float32 (float64 when the compute type is DOUBLE); results are cast to the requested dtypes.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["KERNELS"]


def _work_dtype(compute_dtype: Any) -> type:
    name = getattr(compute_dtype, "name", compute_dtype)
    if isinstance(name, str) and name.upper() in ("DOUBLE", "FLOAT64"):
        return np.float64
    return np.float32


def _get(inputs: dict, port: str, work: type) -> Optional[np.ndarray]:
    a = inputs.get(port)
    # ml_dtypes (bf16, fp8) arrays convert through astype like any NumPy dtype.
    return None if a is None else np.asarray(a).astype(work, copy=False)


def _scalar(inputs: dict, port: str) -> float:
    return float(np.asarray(inputs[port]).astype(np.float64).reshape(-1)[0])


def _emit(result: dict, outputs: dict) -> dict:
    """Cast and shape each requested output; outputs not requested are dropped."""
    done = {}
    for name, (dims, dtype) in outputs.items():
        a = result[name].reshape(tuple(dims))
        done[name] = np.ascontiguousarray(a if dtype is None else a.astype(dtype))
    return done


def _sum_to(a: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``a`` over the axes where ``shape`` is 1 (the adjoint of broadcasting to a.shape)."""
    axes = tuple(i for i, (s, d) in enumerate(zip(shape, a.shape)) if s == 1 and d != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


def _affine_axes(scale_shape: tuple, first: int) -> tuple:
    return tuple(i for i in range(first, len(scale_shape)) if scale_shape[i] != 1)


def _batch_axes(x: np.ndarray) -> tuple:
    return (0,) + tuple(range(2, x.ndim))


def _instance_axes(x: np.ndarray) -> tuple:
    return tuple(range(2, x.ndim))


def _standardize(x: np.ndarray, axes: tuple, eps: float) -> tuple:
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    return mean, var, inv


def _affine_backward(dy, x, scale, mean, inv, axes) -> dict:
    """Shared backward of y = (x - mean) * inv * scale + bias, with mean/inv over ``axes``."""
    xhat = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return {"DX": dx, "dscale": _sum_to(dy * xhat, scale.shape), "dbias": _sum_to(dy, scale.shape)}


def _no_peers(attrs: dict) -> None:
    if attrs.get("peer_stats"):
        raise NotImplementedError("the reference engine runs on one device: peer_stats is not supported")


# ----------------------------------------------------------------------------------------- forwards

def batchnorm(inputs, attrs, outputs, compute_dtype=None) -> dict:
    """Training batch norm; running stats: r' = (1 - momentum) * r + momentum * batch statistic."""
    _no_peers(attrs)
    work = _work_dtype(compute_dtype)
    x, scale, bias = _get(inputs, "input", work), _get(inputs, "scale", work), _get(inputs, "bias", work)
    mean, var, inv = _standardize(x, _batch_axes(x), _scalar(inputs, "epsilon"))
    res = {"Y": (x - mean) * inv * scale + bias, "mean": mean, "inv_variance": inv}
    if inputs.get("in_running_mean") is not None:
        m = _scalar(inputs, "momentum")
        count = x.size // x.shape[1]
        unbiased = var * (count / (count - 1)) if count > 1 else var
        res["out_running_mean"] = (1 - m) * _get(inputs, "in_running_mean", work) + m * mean
        res["out_running_var"] = (1 - m) * _get(inputs, "in_running_var", work) + m * unbiased
    return _emit(res, outputs)


def batchnorm_inference(inputs, attrs, outputs, compute_dtype=None) -> dict:
    work = _work_dtype(compute_dtype)
    x = _get(inputs, "input", work)
    y = (x - _get(inputs, "mean", work)) * _get(inputs, "inv_variance", work) * _get(inputs, "scale", work)
    return _emit({"Y": y + _get(inputs, "bias", work)}, outputs)


def _layer_forward(inputs, outputs, compute_dtype, first_axis: int) -> dict:
    work = _work_dtype(compute_dtype)
    x, scale, bias = _get(inputs, "input", work), _get(inputs, "scale", work), _get(inputs, "bias", work)
    mean, _, inv = _standardize(x, _affine_axes(scale.shape, first_axis), _scalar(inputs, "epsilon"))
    y = (x - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return _emit({"Y": y, "mean": mean, "inv_variance": inv}, outputs)


def layernorm(inputs, attrs, outputs, compute_dtype=None) -> dict:
    return _layer_forward(inputs, outputs, compute_dtype, 0)


def adalayernorm(inputs, attrs, outputs, compute_dtype=None) -> dict:
    # Axis 0 is the batch: a per-sample scale varies along it but is never normalised over.
    return _layer_forward(inputs, outputs, compute_dtype, 1)


def rmsnorm(inputs, attrs, outputs, compute_dtype=None) -> dict:
    work = _work_dtype(compute_dtype)
    x, scale, bias = _get(inputs, "input", work), _get(inputs, "scale", work), _get(inputs, "bias", work)
    axes = _affine_axes(scale.shape, 0)
    inv = 1.0 / np.sqrt(np.square(x).mean(axis=axes, keepdims=True) + _scalar(inputs, "epsilon"))
    y = x * inv * scale
    if bias is not None:
        y = y + bias
    return _emit({"Y": y, "inv_variance": inv}, outputs)


def instancenorm(inputs, attrs, outputs, compute_dtype=None) -> dict:
    work = _work_dtype(compute_dtype)
    x, scale, bias = _get(inputs, "input", work), _get(inputs, "scale", work), _get(inputs, "bias", work)
    mean, _, inv = _standardize(x, _instance_axes(x), _scalar(inputs, "epsilon"))
    return _emit({"Y": (x - mean) * inv * scale + bias, "mean": mean, "inv_variance": inv}, outputs)


def genstats(inputs, attrs, outputs, compute_dtype=None) -> dict:
    work = _work_dtype(compute_dtype)
    x = _get(inputs, "input", work)
    axes = _batch_axes(x)
    return _emit({"sum": x.sum(axis=axes, keepdims=True),
                  "sq_sum": np.square(x).sum(axis=axes, keepdims=True)}, outputs)


# ---------------------------------------------------------------------------------------- backwards

def _backward(inputs, outputs, compute_dtype, axes_of) -> dict:
    work = _work_dtype(compute_dtype)
    dy, x, scale = _get(inputs, "grad", work), _get(inputs, "input", work), _get(inputs, "scale", work)
    mean, inv = _get(inputs, "mean", work), _get(inputs, "inv_variance", work)
    return _emit(_affine_backward(dy, x, scale, mean, inv, axes_of(x, scale)), outputs)


def batchnorm_backward(inputs, attrs, outputs, compute_dtype=None) -> dict:
    _no_peers(attrs)
    return _backward(inputs, outputs, compute_dtype, lambda x, s: _batch_axes(x))


def layernorm_backward(inputs, attrs, outputs, compute_dtype=None) -> dict:
    return _backward(inputs, outputs, compute_dtype, lambda x, s: _affine_axes(s.shape, 0))


def adalayernorm_backward(inputs, attrs, outputs, compute_dtype=None) -> dict:
    return _backward(inputs, outputs, compute_dtype, lambda x, s: _affine_axes(s.shape, 1))


def instancenorm_backward(inputs, attrs, outputs, compute_dtype=None) -> dict:
    return _backward(inputs, outputs, compute_dtype, lambda x, s: _instance_axes(x))


def rmsnorm_backward(inputs, attrs, outputs, compute_dtype=None) -> dict:
    work = _work_dtype(compute_dtype)
    dy, x, scale = _get(inputs, "grad", work), _get(inputs, "input", work), _get(inputs, "scale", work)
    inv = _get(inputs, "inv_variance", work)
    axes = _affine_axes(scale.shape, 0)
    xhat = x * inv
    g = dy * scale
    dx = inv * (g - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return _emit({"DX": dx, "dscale": _sum_to(dy * xhat, scale.shape), "dbias": _sum_to(dy, scale.shape)},
                 outputs)


KERNELS = {
    "batchnorm": batchnorm, "batchnorm_inference": batchnorm_inference, "batchnorm_backward": batchnorm_backward,
    "layernorm": layernorm, "layernorm_backward": layernorm_backward,
    "adalayernorm": adalayernorm, "adalayernorm_backward": adalayernorm_backward,
    "rmsnorm": rmsnorm, "rmsnorm_backward": rmsnorm_backward,
    "instancenorm": instancenorm, "instancenorm_backward": instancenorm_backward,
    "genstats": genstats,
}
