"""NumPy reference kernels for pointwise, matmul, reduction, layout and block-scale ops.

Every kernel has the signature::

    kernel(inputs, attrs, outputs, compute_dtype) -> {output name: numpy.ndarray}

``inputs`` maps port names to arrays (a list of arrays for concatenate's ``inputs``, None for an absent
optional port); ``attrs`` holds the node's converted attributes; ``outputs`` maps each output name to
``(dims, numpy dtype)``; ``compute_dtype`` is the NumPy dtype of the node's compute type (None when not
set). Arithmetic runs in float32, or float64 when the compute type is DOUBLE; bf16 / fp8 / fp4 inputs
(ml_dtypes arrays) are widened first. Layout ops (reshape, transpose, slice, concatenate) move elements
without converting them. Results have the output dims; the engine casts them into the output buffers.

``KERNELS`` maps each schema name to its kernel. Pointwise kernels come from one table of formulas keyed
by cuDNN mode (``_MODES``); the method -> (mode, ports) table is the op schemas' own.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from cudnn_graph.ops._pointwise import POINTWISE_OPS

__all__ = ["KERNELS"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_C = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _work_dtype(compute_dtype: Any) -> type:
    if compute_dtype is not None and np.dtype(compute_dtype) == np.float64:
        return np.float64
    return np.float32


def _widen(x: Any, wd: type) -> np.ndarray:
    return np.asarray(x).astype(wd, copy=False)


def _name(value: Any) -> str:
    """An enum member's name, or the string itself (modes may come from any enum binding)."""
    return value if isinstance(value, str) else value.name


def _opt(attrs: dict, key: str, default: float) -> float:
    value = attrs.get(key)
    return default if value is None else float(value)


# ---------------------------------------------------------------------------------- pointwise table

def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))   # overflow-free form of 1 / (1 + exp(-x))


def _phi_cdf(x):
    return 0.5 * (1.0 + _erf(x * _INV_SQRT_2))


def _relu_fwd(xs, a):
    x = xs[0]
    lo, hi, slope = _opt(a, "lower_clip", 0.0), _opt(a, "upper_clip", math.inf), _opt(a, "negative_slope", 0.0)
    return np.where(x < lo, lo + slope * (x - lo), np.minimum(x, hi))


def _relu_bwd(xs, a):
    dy, x = xs
    lo, hi, slope = _opt(a, "lower_clip", 0.0), _opt(a, "upper_clip", math.inf), _opt(a, "negative_slope", 0.0)
    # Subgradient choices at the kinks follow the usual frameworks: 0 slope at lower_clip and upper_clip.
    return np.where(x <= lo, slope * dy, np.where(x >= hi, 0.0, dy))


def _gelu_tanh_parts(x):
    t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x ** 3))
    return t, _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * x * x)


def _gelu_tanh_bwd(xs, a):
    dy, x = xs
    t, du = _gelu_tanh_parts(x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def _swish_bwd(xs, a):
    dy, x = xs
    beta = _opt(a, "swish_beta", 1.0)
    s = _sigmoid(beta * x)
    return dy * (s + beta * x * s * (1.0 - s))


# cuDNN mode suffix -> f(list of widened inputs in port order, attrs) -> array (broadcast later).
_MODES: dict[str, Callable] = {
    "ADD": lambda xs, a: xs[0] + xs[1],
    "SUB": lambda xs, a: xs[0] - xs[1],
    "MUL": lambda xs, a: xs[0] * xs[1],
    "DIV": lambda xs, a: xs[0] / xs[1],
    "ADD_SQUARE": lambda xs, a: xs[0] + xs[1] * xs[1],
    "MAX": lambda xs, a: np.maximum(xs[0], xs[1]),
    "MIN": lambda xs, a: np.minimum(xs[0], xs[1]),
    "MOD": lambda xs, a: np.fmod(xs[0], xs[1]),          # truncated: sign of the dividend
    "FLOOR_MOD": lambda xs, a: np.mod(xs[0], xs[1]),     # floored: sign of the divisor
    "POW": lambda xs, a: np.power(xs[0], xs[1]),
    "ATAN2": lambda xs, a: np.arctan2(xs[0], xs[1]),
    "ABS": lambda xs, a: np.abs(xs[0]),
    "CEIL": lambda xs, a: np.ceil(xs[0]),
    "FLOOR": lambda xs, a: np.floor(xs[0]),
    "EXP": lambda xs, a: np.exp(xs[0]),
    "LOG": lambda xs, a: np.log(xs[0]),
    "NEG": lambda xs, a: -xs[0],
    "RECIPROCAL": lambda xs, a: 1.0 / xs[0],
    "RSQRT": lambda xs, a: 1.0 / np.sqrt(xs[0]),
    "SQRT": lambda xs, a: np.sqrt(xs[0]),
    "SIN": lambda xs, a: np.sin(xs[0]),
    "COS": lambda xs, a: np.cos(xs[0]),
    "TAN": lambda xs, a: np.tan(xs[0]),
    "ERF": lambda xs, a: _erf(xs[0]),
    "IDENTITY": lambda xs, a: xs[0],
    "RELU_FWD": _relu_fwd,
    "TANH_FWD": lambda xs, a: np.tanh(xs[0]),
    "SIGMOID_FWD": lambda xs, a: _sigmoid(xs[0]),
    "ELU_FWD": lambda xs, a: np.where(xs[0] > 0, xs[0], _opt(a, "elu_alpha", 1.0) * np.expm1(xs[0])),
    "GELU_FWD": lambda xs, a: xs[0] * _phi_cdf(xs[0]),
    "GELU_APPROX_TANH_FWD": lambda xs, a: 0.5 * xs[0] * (1.0 + _gelu_tanh_parts(xs[0])[0]),
    "SOFTPLUS_FWD": lambda xs, a: np.logaddexp(0.0, _opt(a, "softplus_beta", 1.0) * xs[0])
    / _opt(a, "softplus_beta", 1.0),
    "SWISH_FWD": lambda xs, a: xs[0] * _sigmoid(_opt(a, "swish_beta", 1.0) * xs[0]),
    # backward: xs = (dy, x), derivative taken at the forward input x
    "RELU_BWD": _relu_bwd,
    "TANH_BWD": lambda xs, a: xs[0] * (1.0 - np.tanh(xs[1]) ** 2),
    "SIGMOID_BWD": lambda xs, a: xs[0] * _sigmoid(xs[1]) * (1.0 - _sigmoid(xs[1])),
    "ELU_BWD": lambda xs, a: np.where(xs[1] > 0, xs[0], xs[0] * _opt(a, "elu_alpha", 1.0) * np.exp(xs[1])),
    "GELU_BWD": lambda xs, a: xs[0] * (_phi_cdf(xs[1]) + xs[1] * np.exp(-0.5 * xs[1] ** 2) * _INV_SQRT_2PI),
    "GELU_APPROX_TANH_BWD": _gelu_tanh_bwd,
    "SOFTPLUS_BWD": lambda xs, a: xs[0] * _sigmoid(_opt(a, "softplus_beta", 1.0) * xs[1]),
    "SWISH_BWD": _swish_bwd,
    # comparisons and logic yield 1 / 0 in the compute type (the engine casts to the output's type)
    "CMP_EQ": lambda xs, a: xs[0] == xs[1],
    "CMP_NEQ": lambda xs, a: xs[0] != xs[1],
    "CMP_GT": lambda xs, a: xs[0] > xs[1],
    "CMP_GE": lambda xs, a: xs[0] >= xs[1],
    "CMP_LT": lambda xs, a: xs[0] < xs[1],
    "CMP_LE": lambda xs, a: xs[0] <= xs[1],
    "LOGICAL_AND": lambda xs, a: (xs[0] != 0) & (xs[1] != 0),
    "LOGICAL_OR": lambda xs, a: (xs[0] != 0) | (xs[1] != 0),
    "LOGICAL_NOT": lambda xs, a: xs[0] == 0,
    "BINARY_SELECT": lambda xs, a: np.where(xs[2] != 0, xs[0], xs[1]),
}


def _single(outputs: dict) -> tuple:
    (name, (dims, _dtype)), = outputs.items()
    return name, tuple(dims)


def _pointwise_kernel(mode: str, ports: tuple) -> Callable:
    def kernel(inputs, attrs, outputs, compute_dtype=None):
        wd = _work_dtype(compute_dtype)
        name, dims = _single(outputs)
        if mode == "GEN_INDEX":
            axis = attrs["axis"]
            shape = [1] * len(dims)
            shape[axis] = dims[axis]
            y = np.arange(dims[axis], dtype=wd).reshape(shape)
        else:
            xs = [_widen(inputs[p], wd) for p in ports]
            with np.errstate(all="ignore"):   # log(0), 1/0 ... give inf/nan as the GPU does
                y = _MODES[mode](xs, attrs)
        return {name: np.ascontiguousarray(np.broadcast_to(y, dims), dtype=wd)}

    kernel.__name__ = f"pointwise_{mode.lower()}"
    return kernel


# ------------------------------------------------------------------------------------ structured ops

def matmul(inputs, attrs, outputs, compute_dtype=None):
    """C = A @ B with batch broadcasting (``padding`` only matters for ragged overrides: unused here)."""
    wd = _work_dtype(compute_dtype)
    c = np.matmul(_widen(inputs["A"], wd), _widen(inputs["B"], wd))
    return {"C": np.ascontiguousarray(np.broadcast_to(c, tuple(outputs["C"][0])))}


def _prod_no_zeros(x, axis, keepdims):
    return np.prod(np.where(x == 0, 1, x), axis=axis, keepdims=keepdims)


_REDUCERS: dict[str, Callable] = {
    "ADD": np.sum,
    "MUL": np.prod,
    "MIN": np.min,
    "MAX": np.max,
    "AMAX": lambda x, axis, keepdims: np.max(np.abs(x), axis=axis, keepdims=keepdims),
    "AVG": np.mean,
    "NORM1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "NORM2": lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
    "MUL_NO_ZEROS": _prod_no_zeros,
}


def reduction(inputs, attrs, outputs, compute_dtype=None):
    """Reduce over every axis the output has as 1 and the input does not."""
    wd = _work_dtype(compute_dtype)
    x = _widen(inputs["input"], wd)
    dims = tuple(outputs["Y"][0])
    axes = tuple(i for i, (xi, yi) in enumerate(zip(x.shape, dims)) if yi == 1 and xi != 1)
    y = _REDUCERS[_name(attrs["mode"])](x, axis=axes, keepdims=True)
    return {"Y": np.ascontiguousarray(np.broadcast_to(y, dims), dtype=wd)}


def reshape(inputs, attrs, outputs, compute_dtype=None):
    """Row-major (lexicographic) reshape of the logical input.

    That is LOGICAL mode exactly, and VIEW_ONLY for packed row-major tensors; a VIEW_ONLY reshape of any
    other layout reinterprets memory, which the engine handles by passing the raw buffer as a view.
    """
    return {"Y": np.reshape(np.asarray(inputs["input"]), tuple(outputs["Y"][0])).copy()}


def transpose(inputs, attrs, outputs, compute_dtype=None):
    return {"Y": np.ascontiguousarray(np.transpose(np.asarray(inputs["input"]), attrs["permutation"]))}


def slice_(inputs, attrs, outputs, compute_dtype=None):
    index = tuple(slice(*t) for t in attrs.get("slices") or ())
    return {"Y": np.ascontiguousarray(np.asarray(inputs["input"])[index])}


def concatenate(inputs, attrs, outputs, compute_dtype=None):
    return {"Y": np.concatenate([np.asarray(t) for t in inputs["inputs"]], axis=attrs["axis"])}


def _finite_max(dtype: Any) -> float:
    """Largest finite value of a NumPy / ml_dtypes dtype (int types too)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return float(np.iinfo(dt).max)
    import ml_dtypes  # only the block-scale kernels need it

    return float(ml_dtypes.finfo(dt).max)


def block_scale_quantize(inputs, attrs, outputs, compute_dtype=None):
    """Per block of ``block_size`` elements along ``axis``: scale = amax / max(Y type); Y = x / scale.

    With an FP8_E8M0 scale (MX formats) the scale is rounded UP to a power of two, so no element
    saturates; with any other scale type it is rounded to that type and Y is clipped to Y's range.
    Scale dims larger than needed (padded layouts) are filled with 1.
    """
    wd = _work_dtype(compute_dtype)
    x = _widen(inputs["input"], wd)
    bs = attrs["block_size"]
    axis = x.ndim - 1 if attrs.get("axis") is None else attrs["axis"]
    y_dtype, (s_dims, s_dtype) = outputs["Y"][1], outputs["scale"]
    elem_max = _finite_max(y_dtype)

    xb = np.moveaxis(x, axis, -1)
    blocks = xb.reshape(xb.shape[:-1] + (xb.shape[-1] // bs, bs))
    amax = np.max(np.abs(blocks), axis=-1)
    with np.errstate(divide="ignore"):
        if np.dtype(s_dtype).name == "float8_e8m0fnu":
            exp = np.clip(np.ceil(np.log2(amax / elem_max)), -127, 127)
            scale = np.exp2(np.where(amax > 0, exp, -127)).astype(wd)
        else:
            scale = (amax / elem_max).astype(s_dtype).astype(wd)   # round to the scale's own type
        y = np.where(scale[..., None] > 0, blocks / np.where(scale > 0, scale, 1)[..., None], 0)
    y = np.clip(y, -elem_max, elem_max).reshape(xb.shape)
    scale_full = np.ones(tuple(s_dims), wd)
    scale = np.moveaxis(scale, -1, axis)
    scale_full[tuple(slice(0, n) for n in scale.shape)] = scale
    return {"Y": np.ascontiguousarray(np.moveaxis(y, -1, axis)), "scale": scale_full}


def block_scale_dequantize(inputs, attrs, outputs, compute_dtype=None):
    """Y = input * descale, each scale covering a block; ``block_size`` aligns with the last axes."""
    wd = _work_dtype(compute_dtype)
    x = _widen(inputs["input"], wd)
    s = _widen(inputs["descale"], wd)
    bs = tuple(attrs["block_size"])
    blocks = (1,) * (x.ndim - len(bs)) + bs
    for axis, b in enumerate(blocks):
        if b > 1:
            s = np.repeat(s, b, axis=axis)
    s = s[tuple(slice(0, n) for n in x.shape)]   # drop padding and the ragged tail of the last block
    return {"Y": x * s}


KERNELS: dict[str, Callable] = {
    **{method: _pointwise_kernel(mode, ports) for method, mode, ports, _attrs, _kind in POINTWISE_OPS},
    "matmul": matmul,
    "reduction": reduction,
    "reshape": reshape,
    "transpose": transpose,
    "slice": slice_,
    "concatenate": concatenate,
    "block_scale_quantize": block_scale_quantize,
    "block_scale_dequantize": block_scale_dequantize,
}
