"""Schemas and NumPy reference kernels of pointwise, matmul, reduction, layout and block-scale ops.

Inference is tested through ``InferContext`` directly; kernels are checked against formulas written
out here element by element (``math`` functions, explicit loops), never against the kernels' helpers.
"""
from __future__ import annotations

import itertools
import math
import pathlib
import re
import zlib

import numpy as np
import pytest

from cudnn_graph.data_type import DataType
from cudnn_graph.engines.reference import _kernels_basic
from cudnn_graph.errors import GraphValidationError
from cudnn_graph.ops import SCHEMAS
from cudnn_graph.ops._pointwise import POINTWISE_OPS
from cudnn_graph.ops.schema import REQUIRED, InferContext, TensorInfo


KERNELS = _kernels_basic.KERNELS
STRUCTURED = ("matmul", "reduction", "reshape", "transpose", "slice", "concatenate",
              "block_scale_quantize", "block_scale_dequantize")
MY_OPS = {row[0] for row in POINTWISE_OPS} | set(STRUCTURED)


# ------------------------------------------------------------------------------------------- helpers

def T(*dim, dt=DataType.FLOAT):
    stride, acc = [], 1
    for d in reversed(dim):
        stride.insert(0, acc)
        acc *= d
    return TensorInfo(dim=tuple(dim), stride=tuple(stride), data_type=dt)


def make_attrs(name, given):
    out = {}
    for a in SCHEMAS[name].attrs:
        if a.name in given:
            v = given[a.name]
            out[a.name] = a.convert(v) if (a.convert and v is not None) else v
        elif a.default is REQUIRED:
            raise AssertionError(f"test forgot required attr {a.name} of {name}")
        else:
            out[a.name] = a.default
    return out


def ctx_for(name, inputs, **attrs):
    schema = SCHEMAS[name]
    return InferContext("n0", name, {p.name: inputs.get(p.name) for p in schema.inputs},
                        make_attrs(name, attrs), DataType.FLOAT, DataType.FLOAT, DataType.HALF)


def infer(name, inputs, **attrs):
    ctx = ctx_for(name, inputs, **attrs)
    return SCHEMAS[name].infer(ctx), ctx


def run(name, inputs, outputs, compute=np.float32, **attrs):
    return KERNELS[name](inputs, make_attrs(name, attrs), outputs, compute)


# ---------------------------------------------------------------------------------- (a) valid cases

POINTWISE_ATTRS = {"gen_index": {"axis": 1}, "leaky_relu": {"negative_slope": 0.1},
                   "leaky_relu_backward": {"negative_slope": 0.1}}


def test_every_op_has_schema_and_kernel():
    assert MY_OPS <= set(SCHEMAS)
    assert MY_OPS == set(KERNELS)


@pytest.mark.parametrize("row", POINTWISE_OPS, ids=[r[0] for r in POINTWISE_OPS])
def test_pointwise_infer_broadcasts(row):
    name, mode, ports, _attrs, _kind = row
    inputs = {p: T(2, 3, 4) if i == 0 else T(2, 1, 4) for i, p in enumerate(ports)}
    out, _ = infer(name, inputs, **POINTWISE_ATTRS.get(name, {}))
    assert set(out) == {"Y"}
    assert out["Y"].dim == (2, 3, 4) and out["Y"].data_type is None
    assert out["Y"].stride == (12, 4, 1)
    schema = SCHEMAS[name]
    assert schema.port_names() == ports and schema.returns == "single"
    assert schema.pointwise_mode.name == mode
    # the first operand may be the broadcast one too
    if len(ports) > 1:
        swapped = {p: T(2, 1, 4) if i == 0 else T(2, 3, 4) for i, p in enumerate(ports)}
        assert infer(name, swapped, **POINTWISE_ATTRS.get(name, {}))[0]["Y"].dim == (2, 3, 4)


def test_pointwise_modes_exist_in_cudnn_header():
    header = pathlib.Path("/tmp/cudnn_headers/cudnn_graph_v9.h")
    if not header.exists():
        pytest.skip("cuDNN headers not available")
    names = set(re.findall(r"\b(CUDNN_POINTWISE_[A-Z0-9_]+)\s*=", header.read_text()))
    for row in POINTWISE_OPS:
        assert f"CUDNN_POINTWISE_{SCHEMAS[row[0]].pointwise_mode.name}" in names


def test_pygraph_signatures():
    # positional order follows pygraph, compute_data_type/name excluded; full order in pygraph_positional
    assert SCHEMAS["relu"].positional == ("input", "negative_slope", "lower_clip", "upper_clip")
    assert SCHEMAS["swish_backward"].pygraph_positional == (
        "loss", "input", "compute_data_type", "swish_beta", "name")
    assert SCHEMAS["matmul"].pygraph_positional == ("A", "B", "compute_data_type", "padding", "name")
    assert SCHEMAS["reshape"].positional == ("input", "reshape_mode")
    assert SCHEMAS["cmp_gt"].port_names() == ("input", "comparison")
    assert SCHEMAS["binary_select"].port_names() == ("input0", "input1", "mask")
    assert SCHEMAS["elu"].positional == ("input",)   # elu_alpha is a keyword-only extension
    assert SCHEMAS["block_scale_quantize"].returns == "list"
    assert SCHEMAS["block_scale_quantize"].output_names() == ("Y", "scale")
    assert SCHEMAS["concatenate"].list_ports == ("inputs",)
    assert SCHEMAS["matmul"].attrs[0].default == 0.0
    assert SCHEMAS["block_scale_quantize"].attrs[2].default is False


STRUCTURED_VALID = {
    "matmul": ({"A": T(2, 1, 3, 4), "B": T(1, 5, 4, 6)}, {}, {"C": (2, 5, 3, 6)}),
    "reduction": ({"input": T(2, 3, 4)}, {"mode": "add"}, {"Y": None}),
    "reshape": ({"input": T(2, 3, 4, dt=DataType.HALF)}, {}, {"Y": None}),
    "transpose": ({"input": T(2, 3, 4)}, {"permutation": [0, 2, 1]}, {"Y": (2, 4, 3)}),
    "slice": ({"input": T(4, 8, 16)}, {"slices": [slice(0, 2), slice(1, 8, 2), slice(0, 16)]},
              {"Y": (2, 4, 16)}),
    "concatenate": ({"inputs": [T(2, 3, 4), T(2, 5, 4)]}, {"axis": 1}, {"Y": (2, 8, 4)}),
    "block_scale_quantize": ({"input": T(4, 64, dt=DataType.BFLOAT16)}, {"block_size": 32},
                             {"Y": (4, 64), "scale": (4, 2)}),
    "block_scale_dequantize": ({"input": T(2, 8, 64, dt=DataType.FP8_E4M3),
                                "descale": T(2, 8, 2, dt=DataType.FP8_E8M0)},
                               {"block_size": [1, 32]}, {"Y": (2, 8, 64)}),
}


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_infer(name):
    inputs, attrs, expected = STRUCTURED_VALID[name]
    out, _ = infer(name, inputs, **attrs)
    assert {k: v.dim for k, v in out.items()} == expected


def test_structured_infer_details():
    out, ctx = infer("reduction", {"input": T(2, 3, 4)}, mode="AMAX")
    assert ctx.attrs["mode"].name == "AMAX"
    SCHEMAS["reduction"].validate_outputs(ctx, {"Y": (2, 1, 4)})
    SCHEMAS["reduction"].validate_outputs(ctx, {"Y": (1, 1, 1)})
    out, ctx = infer("reshape", {"input": T(2, 3, 4, dt=DataType.HALF)}, reshape_mode="LOGICAL")
    assert out["Y"].data_type is DataType.HALF and ctx.attrs["reshape_mode"].name == "LOGICAL"
    SCHEMAS["reshape"].validate_outputs(ctx, {"Y": (6, 4)})
    out, _ = infer("transpose", {"input": T(2, 3, 4)}, permutation=[2, 0, 1])
    assert out["Y"].dim == (4, 2, 3) and out["Y"].stride == (1, 12, 4)
    out, _ = infer("slice", {"input": T(4, 8)}, slices=[(1, None)])        # trailing axes kept whole
    assert out["Y"].dim == (3, 8) and out["Y"].stride == (8, 1)
    out, _ = infer("slice", {"input": T(4, 8)}, slices=[slice(None), slice(-5, 100, 3)])
    assert out["Y"].dim == (4, 2) and out["Y"].stride == (8, 3)
    out, _ = infer("block_scale_quantize", {"input": T(64, 8)}, block_size=16, axis=0, transpose=True)
    assert out["scale"].dim == (4, 8) and out["Y"].dim == (64, 8)
    out, ctx = infer("block_scale_quantize", {"input": T(100, 64)}, block_size=32)
    SCHEMAS["block_scale_quantize"].validate_outputs(ctx, {"Y": (100, 64), "scale": (128, 4)})
    out, _ = infer("block_scale_dequantize", {"input": T(2, 64, 8), "descale": T(2, 2, 128)},
                   block_size=[32, 1])   # padded scale dims are accepted
    assert out["Y"].dim == (2, 64, 8)
    out, _ = infer("matmul", {"A": T(3, 4), "B": T(4, 5)})
    assert out["C"].dim == (3, 5) and out["C"].data_type is None
    out, _ = infer("concatenate", {"inputs": [T(2, 3, dt=DataType.HALF)] * 3}, axis=0, in_place_index=2)
    assert out["Y"].dim == (6, 3) and out["Y"].data_type is DataType.HALF


# -------------------------------------------------------------------------------- (b) invalid cases

INVALID = [
    ("add", {"a": T(2, 3, 4), "b": T(3, 4)}, {}, "b"),                                 # rank mismatch
    ("mul", {"a": T(2, 3, 4), "b": T(2, 5, 4)}, {}, "b"),                              # no broadcast
    ("binary_select", {"input0": T(2, 3), "input1": T(2, 3), "mask": T(3, 3)}, {}, "mask"),
    ("cmp_lt", {"input": T(4), "comparison": T(2, 4)}, {}, "comparison"),
    ("add", {"a": T(2, 3)}, {}, "b"),                                                  # missing port
    ("relu_backward", {"input": T(2, 3)}, {}, "loss"),
    ("gen_index", {"input": T(2, 3)}, {"axis": 2}, "axis"),
    ("matmul", {"A": T(2, 3, 4), "B": T(2, 5, 6)}, {}, "B"),                           # K mismatch
    ("matmul", {"A": T(2, 3, 4), "B": T(3, 4, 5)}, {}, "B"),                           # batch mismatch
    ("matmul", {"A": T(4), "B": T(4, 5)}, {}, "A"),                                    # rank 1
    ("matmul", {"A": T(2, 3, 4), "B": T(4, 5)}, {}, "B"),                              # rank mismatch
    ("matmul", {"A": T(3, 4)}, {}, "B"),
    ("transpose", {"input": T(2, 3, 4)}, {"permutation": [0, 0, 1]}, "permutation"),
    ("transpose", {"input": T(2, 3, 4)}, {"permutation": [1, 0]}, "permutation"),
    ("transpose", {"input": T(2, 3)}, {"permutation": [0, 2]}, "permutation"),
    ("slice", {"input": T(4, 8)}, {"slices": [slice(0, 2), slice(10, 12)]}, "slices"),  # out of range
    ("slice", {"input": T(4, 8)}, {"slices": [slice(0, 2)] * 3}, "slices"),           # too many
    ("slice", {"input": T(4, 8)}, {"slices": [slice(3, 0, -1)]}, "slices"),           # backwards
    ("concatenate", {"inputs": [T(2, 3, 4), T(2, 5, 5)]}, {"axis": 1}, "inputs"),       # axis mismatch
    ("concatenate", {"inputs": [T(2, 3, 4), T(2, 3)]}, {"axis": 1}, "inputs"),
    ("concatenate", {"inputs": [T(2, 3), T(2, 3, dt=DataType.HALF)]}, {"axis": 0}, "inputs"),
    ("concatenate", {"inputs": [T(2, 3), T(2, 3)]}, {"axis": 2}, "axis"),
    ("concatenate", {"inputs": [T(2, 3), T(2, 3)]}, {"axis": 0, "in_place_index": 2}, "in_place_index"),
    ("concatenate", {"inputs": []}, {"axis": 0}, "inputs"),
    ("block_scale_quantize", {"input": T(4, 64, dt=DataType.INT8)}, {"block_size": 32}, "input"),
    ("block_scale_quantize", {"input": T(4, 48)}, {"block_size": 32}, "block_size"),
    ("block_scale_quantize", {"input": T(4, 64)}, {"block_size": 32, "axis": 2}, "axis"),
    ("block_scale_dequantize", {"input": T(2, 64), "descale": T(2, 1)}, {"block_size": [1, 32]}, "descale"),
    ("block_scale_dequantize", {"input": T(64), "descale": T(2)}, {"block_size": [1, 32]}, "block_size"),
    ("block_scale_dequantize", {"input": T(2, 64)}, {"block_size": 32}, "descale"),
]


@pytest.mark.parametrize("name,inputs,attrs,port", INVALID,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(INVALID)])
def test_invalid_infer(name, inputs, attrs, port):
    with pytest.raises(GraphValidationError) as e:
        infer(name, inputs, **attrs)
    assert e.value.port == port and e.value.node == "n0" and e.value.op == name


@pytest.mark.parametrize("name,inputs,attrs,dims,port", [
    ("reduction", {"input": T(2, 3, 4)}, {"mode": "max"}, {"Y": (2, 2, 1)}, "Y"),   # non-1 reduced dim
    ("reduction", {"input": T(2, 3, 4)}, {"mode": "max"}, {"Y": (2, 1)}, "Y"),
    ("reduction", {"input": T(2, 3, 4)}, {"mode": "max"}, {"Y": None}, "Y"),
    ("reshape", {"input": T(2, 3, 4)}, {}, {"Y": (5, 5)}, "Y"),
    ("block_scale_quantize", {"input": T(4, 64)}, {"block_size": 32}, {"Y": (4, 64), "scale": (4, 1)},
     "scale"),
    ("block_scale_quantize", {"input": T(4, 64)}, {"block_size": 32}, {"Y": (4, 32), "scale": None}, "Y"),
])
def test_invalid_output_dims(name, inputs, attrs, dims, port):
    _, ctx = infer(name, inputs, **attrs)
    with pytest.raises(GraphValidationError) as e:
        SCHEMAS[name].validate_outputs(ctx, dims)
    assert e.value.port == port


@pytest.mark.parametrize("name,attr,value", [
    ("reduction", "mode", "median"), ("reshape", "reshape_mode", "sideways"),
    ("transpose", "permutation", ["a"]), ("slice", "slices", [3]), ("relu", "negative_slope", "x"),
    ("block_scale_quantize", "transpose", "yes"), ("gen_index", "axis", 1.5),
])
def test_attr_conversion_rejects(name, attr, value):
    conv = next(a.convert for a in SCHEMAS[name].attrs if a.name == attr)
    with pytest.raises((TypeError, ValueError)):
        conv(value)


def test_enum_like_attr_values():
    class FakeEnum:   # e.g. cudnn.reduction_mode.NORM2 from another binding
        name = "NORM2"
    conv = next(a.convert for a in SCHEMAS["reduction"].attrs if a.name == "mode")
    assert conv(FakeEnum()).name == "NORM2"
    assert conv("CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS").name == "MUL_NO_ZEROS"
    assert int(conv("avg")) == 5   # cudnnReduceTensorOp_t code


# ------------------------------------------------------------------------------- (c) kernel checks

def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _relu_clip(x, a):
    lo = a.get("lower_clip") or 0.0
    hi = a.get("upper_clip") if a.get("upper_clip") is not None else math.inf
    slope = a.get("negative_slope") or 0.0
    if x < lo:
        return lo + slope * (x - lo)
    return min(x, hi)


# Scalar forward formulas, by method name; f(values, attrs).
FORWARD = {
    "add": lambda v, a: v[0] + v[1], "bias": lambda v, a: v[0] + v[1],
    "sub": lambda v, a: v[0] - v[1], "mul": lambda v, a: v[0] * v[1], "scale": lambda v, a: v[0] * v[1],
    "div": lambda v, a: v[0] / v[1], "add_square": lambda v, a: v[0] + v[1] ** 2,
    "max": lambda v, a: max(v), "min": lambda v, a: min(v),
    "mod": lambda v, a: math.fmod(v[0], v[1]),
    "floor_mod": lambda v, a: v[0] - math.floor(v[0] / v[1]) * v[1],
    "pow": lambda v, a: v[0] ** v[1], "atan2": lambda v, a: math.atan2(v[0], v[1]),
    "abs": lambda v, a: abs(v[0]), "ceil": lambda v, a: math.ceil(v[0]), "floor": lambda v, a: math.floor(v[0]),
    "exp": lambda v, a: math.exp(v[0]), "log": lambda v, a: math.log(v[0]), "neg": lambda v, a: -v[0],
    "reciprocal": lambda v, a: 1 / v[0], "rsqrt": lambda v, a: 1 / math.sqrt(v[0]),
    "sqrt": lambda v, a: math.sqrt(v[0]), "sin": lambda v, a: math.sin(v[0]), "cos": lambda v, a: math.cos(v[0]),
    "tan": lambda v, a: math.tan(v[0]), "erf": lambda v, a: math.erf(v[0]), "identity": lambda v, a: v[0],
    "relu": lambda v, a: _relu_clip(v[0], a),
    "leaky_relu": lambda v, a: v[0] if v[0] >= 0 else a["negative_slope"] * v[0],
    "tanh": lambda v, a: math.tanh(v[0]), "sigmoid": lambda v, a: _sig(v[0]),
    "elu": lambda v, a: v[0] if v[0] > 0 else (a.get("elu_alpha") or 1.0) * (math.exp(v[0]) - 1),
    "gelu": lambda v, a: 0.5 * v[0] * (1 + math.erf(v[0] / math.sqrt(2))),
    "gelu_approx_tanh": lambda v, a: 0.5 * v[0] * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                                 * (v[0] + 0.044715 * v[0] ** 3))),
    "softplus": lambda v, a: math.log(1 + math.exp((a.get("softplus_beta") or 1.0) * v[0]))
    / (a.get("softplus_beta") or 1.0),
    "swish": lambda v, a: v[0] / (1 + math.exp(-(a.get("swish_beta") or 1.0) * v[0])),
    "cmp_eq": lambda v, a: float(v[0] == v[1]), "cmp_neq": lambda v, a: float(v[0] != v[1]),
    "cmp_gt": lambda v, a: float(v[0] > v[1]), "cmp_ge": lambda v, a: float(v[0] >= v[1]),
    "cmp_lt": lambda v, a: float(v[0] < v[1]), "cmp_le": lambda v, a: float(v[0] <= v[1]),
    "logical_and": lambda v, a: float(bool(v[0]) and bool(v[1])),
    "logical_or": lambda v, a: float(bool(v[0]) or bool(v[1])),
    "logical_not": lambda v, a: float(not v[0]),
    "binary_select": lambda v, a: v[0] if v[2] else v[1],
}
KINKS = (0.0, 0.2, 1.5)   # relu clip points used below; sample values stay away from them

# Attribute sets exercised per method (several for relu-like ops).
ATTR_CASES = {
    "relu": [{}, {"negative_slope": 0.1, "lower_clip": 0.2, "upper_clip": 1.5}],
    "relu_backward": [{}, {"negative_slope": 0.1, "lower_clip": 0.2, "upper_clip": 1.5}],
    "leaky_relu": [{"negative_slope": 0.01}], "leaky_relu_backward": [{"negative_slope": 0.01}],
    "swish": [{}, {"swish_beta": 1.7}], "swish_backward": [{}, {"swish_beta": 1.7}],
    "elu": [{}, {"elu_alpha": 0.5}], "elu_backward": [{}, {"elu_alpha": 0.5}],
    "softplus": [{}, {"softplus_beta": 2.0}], "softplus_backward": [{}, {"softplus_beta": 2.0}],
    "gen_index": [{"axis": 0}, {"axis": 2}],
}


def _sample(name, port, shape, rng):
    if name.startswith(("cmp_", "logical_")) or (name == "binary_select" and port == "mask"):
        return rng.integers(-1, 2, shape).astype(np.float32)   # small ints: ties and zeros happen
    if name in ("log", "sqrt", "rsqrt") or (name == "pow" and port == "input0"):
        return rng.uniform(0.2, 3.0, shape).astype(np.float32)
    if port in ("b", "input1") and name in ("div", "mod", "floor_mod", "atan2"):
        return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    x = rng.uniform(-2.5, 2.5, shape)
    if name == "tan":
        x = x / 2.5
    for k in KINKS:   # keep samples off the non-differentiable points
        x[np.abs(x - k) < 0.03] += 0.07
    return x.astype(np.float32)


def _pointwise_cases():
    for method, _mode, ports, _attrs, _kind in POINTWISE_OPS:
        for attrs in ATTR_CASES.get(method, [{}]):
            yield pytest.param(method, ports, attrs, id=f"{method}-{sorted(attrs.items())}")


@pytest.mark.parametrize("method,ports,attrs", list(_pointwise_cases()))
def test_pointwise_kernel(method, ports, attrs):
    rng = np.random.default_rng(zlib.crc32(method.encode()))   # same data every run
    out_shape = (2, 3, 4)
    shapes = [out_shape] + [(2, 1, 4), (1, 3, 1)][: len(ports) - 1]   # later operands broadcast
    xs = {p: _sample(method, p, s, rng) for p, s in zip(ports, shapes)}
    got = run(method, xs, {"Y": (out_shape, np.float32)}, **attrs)["Y"]
    assert got.shape == out_shape
    full = make_attrs(method, attrs)
    for idx in itertools.product(*(range(n) for n in out_shape)):
        vals = [float(xs[p][tuple(i if n > 1 else 0 for i, n in zip(idx, xs[p].shape))]) for p in ports]
        if method == "gen_index":
            want = float(idx[attrs["axis"]])
        elif method.endswith("_backward"):
            # dy * f'(x) by central differences of the forward formula
            fwd, dy, x, h = FORWARD[method[: -len("_backward")]], vals[0], vals[1], 1e-6
            want = dy * (fwd([x + h], full) - fwd([x - h], full)) / (2 * h)
        else:
            want = FORWARD[method](vals, full)
        assert math.isclose(float(got[idx]), want, rel_tol=2e-4, abs_tol=2e-5), (idx, vals, got[idx], want)


def test_pointwise_kernel_bf16_inputs_and_double_compute():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([[1.5, -2.25], [3.0, 0.125]], dtype=ml_dtypes.bfloat16)
    b = np.array([[0.5, 0.75]], dtype=ml_dtypes.bfloat16)
    got = run("add", {"a": a, "b": b}, {"Y": ((2, 2), ml_dtypes.bfloat16)})["Y"]
    assert got.dtype == np.float32
    assert got.tolist() == [[2.0, -1.5], [3.5, 0.875]]
    x = np.array([0.1, 1.0, 2.0])
    got = run("exp", {"input": x}, {"Y": ((3,), np.float64)}, compute=np.float64)["Y"]
    assert got.dtype == np.float64
    assert all(g == math.exp(v) for g, v in zip(got, x))


def test_matmul_kernel():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    b = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    got = run("matmul", {"A": a, "B": b}, {"C": ((2, 2, 3, 5), np.float32)})["C"]
    assert got.shape == (2, 2, 3, 5)
    for i, j, m, n in itertools.product(range(2), range(2), range(3), range(5)):
        want = sum(float(a[i, 0, m, k]) * float(b[0, j, k, n]) for k in range(4))
        assert math.isclose(got[i, j, m, n], want, rel_tol=1e-5, abs_tol=1e-5)


REDUCE_REF = {
    "ADD": sum, "MUL": math.prod, "MIN": min, "MAX": max, "AMAX": lambda v: max(abs(x) for x in v),
    "AVG": lambda v: sum(v) / len(v), "NORM1": lambda v: sum(abs(x) for x in v),
    "NORM2": lambda v: math.sqrt(sum(x * x for x in v)),
    "MUL_NO_ZEROS": lambda v: math.prod(x for x in v if x != 0),
}


@pytest.mark.parametrize("mode", sorted(REDUCE_REF))
@pytest.mark.parametrize("out_shape", [(2, 1, 1), (1, 3, 1), (1, 1, 1), (2, 3, 4)])
def test_reduction_kernel(mode, out_shape):
    rng = np.random.default_rng(2)
    x = rng.uniform(-1.5, 1.5, (2, 3, 4)).astype(np.float32)
    x[0, 0, 0] = 0.0
    got = run("reduction", {"input": x}, {"Y": (out_shape, np.float32)}, mode=mode.lower())["Y"]
    groups: dict = {}
    for idx in itertools.product(range(2), range(3), range(4)):
        key = tuple(i if n > 1 else 0 for i, n in zip(idx, out_shape))
        groups.setdefault(key, []).append(float(x[idx]))
    assert got.shape == out_shape
    for key, vals in groups.items():
        assert math.isclose(got[key], REDUCE_REF[mode](vals), rel_tol=1e-5, abs_tol=1e-6), (key, mode)


def test_layout_kernels():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4) * 7
    flat = [x[i, j, k] for i in range(2) for j in range(3) for k in range(4)]
    y = run("reshape", {"input": x}, {"Y": ((4, 6), np.int64)}, reshape_mode="LOGICAL")["Y"]
    assert y.dtype == np.int64 and [y[r, c] for r in range(4) for c in range(6)] == flat

    perm = (2, 0, 1)
    y = run("transpose", {"input": x}, {"Y": ((4, 2, 3), np.int64)}, permutation=perm)["Y"]
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        src = [0, 0, 0]
        for out_axis, in_axis in enumerate(perm):
            src[in_axis] = (i, j, k)[out_axis]
        assert y[i, j, k] == x[tuple(src)]

    y = run("slice", {"input": x}, {"Y": ((1, 2, 2), np.int64)},
            slices=[(1, 2), slice(0, 3, 2), slice(-3, 4, 2)])["Y"]
    rows = [[[x[1, j, k] for k in range(1, 4, 2)] for j in range(0, 3, 2)]]
    assert y.tolist() == rows

    parts = [np.full((2, n, 4), n, dtype=np.int64) for n in (1, 3, 2)]
    y = run("concatenate", {"inputs": parts}, {"Y": ((2, 6, 4), np.int64)}, axis=1)["Y"]
    assert [int(y[0, j, 0]) for j in range(6)] == [1, 3, 3, 3, 2, 2]


def test_block_scale_quantize_kernel_mxfp8():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 64)) * np.array([[1.0], [100.0], [1e-3]])).astype(np.float32)
    x[2, 32:] = 0.0   # an all-zero block
    out = run("block_scale_quantize", {"input": x},
              {"Y": ((3, 64), ml_dtypes.float8_e4m3fn), "scale": ((4, 4), ml_dtypes.float8_e8m0fnu)},
              block_size=32)
    y, s = out["Y"], out["scale"]
    for r, blk in itertools.product(range(3), range(2)):
        vals = [float(v) for v in x[r, blk * 32:(blk + 1) * 32]]
        amax = max(abs(v) for v in vals)
        if amax == 0:
            assert all(float(y[r, blk * 32 + i]) == 0 for i in range(32))
            continue
        want_scale = 2.0 ** math.ceil(math.log2(amax / 448.0))
        assert s[r, blk] == want_scale
        for i, v in enumerate(vals):
            assert math.isclose(float(y[r, blk * 32 + i]), v / want_scale, rel_tol=1e-6)
            assert abs(v / want_scale) <= 448.0
    assert np.all(s[3, :] == 1) and np.all(s[:, 2:] == 1)   # padding


def test_block_scale_quantize_kernel_nvfp4_axis0():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    out = run("block_scale_quantize", {"input": x},
              {"Y": ((32, 3), ml_dtypes.float4_e2m1fn), "scale": ((2, 3), ml_dtypes.float8_e4m3fn)},
              block_size=16, axis=0)
    for blk, c in itertools.product(range(2), range(3)):
        col = [float(x[blk * 16 + i, c]) for i in range(16)]
        scale = float(np.float32(max(abs(v) for v in col) / 6.0).astype(ml_dtypes.float8_e4m3fn))
        assert out["scale"][blk, c] == scale
        for i, v in enumerate(col):
            assert math.isclose(out["Y"][blk * 16 + i, c], max(-6.0, min(6.0, v / scale)), rel_tol=1e-6)


def test_block_scale_dequantize_kernel():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 70)).astype(np.float32)
    s = rng.uniform(0.5, 4.0, (2, 8, 4)).astype(np.float32)   # padded: needs (2, 5, 3)
    y = run("block_scale_dequantize", {"input": x, "descale": s}, {"Y": ((2, 5, 70), np.float32)},
            block_size=[1, 32])["Y"]
    for i, j, k in itertools.product(range(2), range(5), range(70)):
        assert math.isclose(y[i, j, k], float(x[i, j, k]) * float(s[i, j, k // 32]), rel_tol=1e-6)
