"""The cuDNN backend engine: lowering (CPU), the descriptor and execute machinery (CPU, through a
stand-in libcudnn that records every call) and real graphs on the GPU (marked ``gpu``).

GPU tests compare against the reference engine: the same graph built with ``device="cpu"`` and run
on host copies of the inputs. Frameworks are imported inside the tests that use them.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import enums
from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph.engines.base import PlanConfig
from cudnn_graph.engines.cudnn_backend import (CudnnBackendEngine, HANDLE, Ref, check_lowerable,
                                               lower_program)
from cudnn_graph.engines.cudnn_backend import engine as backend_engine
from cudnn_graph.engines.cudnn_backend.lowering import ATTRIBUTE_TYPES, MIN_RANK
from cudnn_graph.ops._pointwise import POINTWISE_OPS
from gpu_support import assert_close, build_gpu, host_dtype, reference_run
from gpu_support import nhwc as _nhwc, row_major as _row_major
from _helpers import REPO_ROOT

F = cudnn.data_type
# cuDNN's own behaviour is pinned here; the CuTe GEMM engine (where installed) is tested in test_cute_gemm.
pytestmark = pytest.mark.usefixtures("prefer_cudnn")

# ---- graph builders shared by the CPU and GPU tests ----------------------------------------------


def matmul_graph(device, io=F.HALF, *, batch=2, m=64, k=32, n=48, epilogue=("bias", "relu"),
                 transpose_b=False, a_row_pad=0, rank=3):
    """C = act(A @ B + bias) in ``io``; FLOAT intermediates and compute. Returns (graph, tensors)."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="mm")
    lead = {2: (), 3: (batch,), 4: (batch, 2)}[rank]
    lead_a = tuple(x for x in lead)
    row = k + a_row_pad
    a_dims = lead_a + (m, k)
    a_strides = _strides(lead_a, (m * row, row, 1))
    b_dims = lead + (k, n)
    b_inner = (k * n, 1, k) if transpose_b else (k * n, n, 1)
    b_strides = _strides(lead, b_inner)
    a = g.tensor(name="A", dim=a_dims, stride=a_strides)
    b = g.tensor(name="B", dim=b_dims, stride=b_strides)
    t = {"A": a, "B": b}
    y = g.matmul(a, b, name="mm")
    for step in epilogue:
        if step == "bias":
            bias = g.tensor(name="bias", dim=(1,) * len(lead) + (1, n), stride=(n,) * len(lead) + (n, 1))
            t["bias"] = bias
            y = g.bias(y, bias)
        elif step == "relu":
            y = g.relu(y)
        elif step == "gelu":
            y = g.gelu(y)
        elif step == "silu":
            y = g.swish(y)
        elif step == "tanh":
            y = g.tanh(y)
    y.set_output(True).set_data_type(io).set_name("C")
    t["C"] = y
    return g, t


def _strides(lead, inner3):
    """Strides for lead + (rows, cols) whose matrix has strides inner3[1:] and batch stride inner3[0]."""
    batch_stride, rs, cs = inner3
    if not lead:
        return (rs, cs)
    out = [batch_stride]
    for extent in reversed(lead[1:]):
        out.insert(0, out[0] * extent)
    return tuple(out) + (rs, cs)


def pointwise_graph(device, io=F.FLOAT, dims=(2, 8, 64)):
    """Y = tanh(X * S + Bias): a pointwise-only chain."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="pw")
    x = g.tensor(name="X", dim=dims, stride=_row_major(dims))
    s = g.tensor(name="S", dim=dims, stride=_row_major(dims))
    bshape = (1,) * (len(dims) - 1) + (dims[-1],)
    b = g.tensor(name="Bias", dim=bshape, stride=_row_major(bshape))
    y = g.tanh(g.add(g.mul(x, s), b)).set_output(True).set_data_type(io).set_name("Y")
    return g, {"X": x, "S": s, "Bias": b, "Y": y}


def reduction_graph(device, mode, dims=(2, 32, 8, 16), out=(1, 1, 1, 1)):
    """Y = reduce(X) to ``out``: X is (N, C, H, W) laid out NHWC (C innermost), FLOAT in and out.

    cuDNN 9.19's reduction engines refuse other layouts ("!is_NHWC") for a standalone reduction.
    """
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="red")
    x = g.tensor(name="X", dim=dims, stride=_nhwc(dims))
    y = g.reduction(x, mode=mode)
    y.set_dim(out).set_stride(_nhwc(out)).set_output(True).set_data_type(F.FLOAT).set_name("Y")
    return g, {"X": x, "Y": y}


# ---- CPU: the engine without libcudnn --------------------------------------------------------------

def run_python(code: str, env: dict | None = None) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k != "CUDNN_GRAPH_LIBCUDNN"}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full_env.update(env or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=full_env, timeout=300)
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


NO_LIBCUDNN = """
from cudnn_graph import _loader
def no_pathfinder():
    raise RuntimeError("pathfinder disabled by the test")
_loader._find_with_pathfinder = no_pathfinder
_loader._SYSTEM_LIBRARY_NAMES = ("libcudnn_graph_test_absent.so.9",)
"""


def test_engine_without_libcudnn_declines_cuda_graphs_saying_why():
    out = run_python(NO_LIBCUDNN + """
import json
import cudnn_graph as cudnn
from cudnn_graph.engines import manifest
from cudnn_graph.engines.cudnn_backend import CudnnBackendEngine
engine = CudnnBackendEngine()
names = [e.name for e in manifest.engines()]
g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu")
a = g.tensor(name="a", dim=[1, 2, 3], stride=[6, 3, 1])
b = g.tensor(name="b", dim=[1, 3, 2], stride=[6, 2, 1])
c = g.matmul(a, b).set_output(True)
g.build([cudnn.heur_mode.A])
gc = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cuda:0")
x = gc.tensor(name="x", dim=[2, 3], stride=[3, 1])
gc.relu(x).set_output(True)
try:
    gc.build()
    error = ""
except cudnn.PlanEntryError as exc:
    error = str(exc)
print(json.dumps({"available": engine.available, "engines": names, "declines": g.declines,
                  "plans": [p.label for p in g.plans], "cuda_declines": gc.declines, "error": error}))
""", env={"CUDNN_GRAPH_LIBCUDNN": "/nonexistent/libcudnn.so.9"})
    assert out["available"] is False
    assert out["plans"] == ["reference"]
    # It stays in the plan list only to say why it cannot serve a CUDA graph.
    backend = dict(out["cuda_declines"])["cudnn_backend"]
    assert backend.startswith("libcudnn not found: Install the cuDNN wheel (pip install 'cudnn_graph[cu12]'")
    assert "CUDNN_GRAPH_LIBCUDNN='/nonexistent/libcudnn.so.9'" in backend
    assert "cudnn_backend: libcudnn not found" in out["error"].splitlines()[0]


def test_engine_availability_follows_the_loader():
    from cudnn_graph import _loader
    assert CudnnBackendEngine().available == _loader.is_available()


def test_host_graph_is_declined_with_the_reason():
    g, _ = matmul_graph("cpu")
    g.validate()
    with pytest.raises(GraphNotSupportedError, match="runs CUDA graphs; this graph is on cpu"):
        CudnnBackendEngine().propose_plans(g)


def test_ops_not_lowered_are_declined_by_name(monkeypatch):
    from cudnn_graph.engines.cudnn_backend.lowering import LOWERERS
    monkeypatch.delitem(LOWERERS, "transpose")
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    x = g.tensor(name="x", dim=[2, 8, 4, 4], stride=[128, 16, 4, 1])
    y = g.transpose(x, permutation=[0, 1, 3, 2]).set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError, match="does not cover transpose"):
        check_lowerable(g)


def test_python_only_ops_are_declined():
    from cudnn_graph.ops import SCHEMAS
    python_only = [s.name for s in SCHEMAS.values() if s.python_only]
    assert python_only, "the op tables declare python-only ops"

    class _Schema:
        python_only = True
        family = "linear_attention"
        extra = {}

    class _Node:
        op = python_only[0]
        schema = _Schema()

    class _Graph:
        nodes = (_Node(),)
        tensors = ()

    with pytest.raises(GraphNotSupportedError, match="python-only op"):
        check_lowerable(_Graph())


# ---- CPU: the lowering program ---------------------------------------------------------------------

def test_matmul_bias_relu_program():
    g, t = matmul_graph("cuda", F.HALF, batch=2, m=64, k=32, n=48)
    g.validate()
    program = lower_program(g)
    kinds = [kind for kind, _ in program]
    assert kinds == ["CUDNN_BACKEND_TENSOR_DESCRIPTOR"] * 6 + [
        "CUDNN_BACKEND_MATMUL_DESCRIPTOR", "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR",
        "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR",
        "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR",
        "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR"]
    tensors = {a["CUDNN_ATTR_TENSOR_UNIQUE_ID"]: a for a in program.of_kind("TENSOR")}
    a = tensors[t["A"].uid]
    assert a == {"CUDNN_ATTR_TENSOR_UNIQUE_ID": t["A"].uid, "CUDNN_ATTR_TENSOR_DATA_TYPE": DataType.HALF,
                 "CUDNN_ATTR_TENSOR_DIMENSIONS": (2, 64, 32), "CUDNN_ATTR_TENSOR_STRIDES": (2048, 32, 1),
                 "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": 16, "CUDNN_ATTR_TENSOR_IS_VIRTUAL": False}
    assert tensors[t["bias"].uid]["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 1, 48)
    c = tensors[t["C"].uid]
    assert c["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is False and c["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.HALF
    virtual = [x for x in tensors.values() if x["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]]
    assert len(virtual) == 2 and all(x["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT for x in virtual)
    assert program.of_kind("MATMUL") == [{"CUDNN_ATTR_MATMUL_COMP_TYPE": DataType.FLOAT}]
    op = program.of_kind("OPERATION_MATMUL")[0]
    assert op["CUDNN_ATTR_OPERATION_MATMUL_ADESC"] == Ref(f"tensor_{t['A'].uid}")
    assert op["CUDNN_ATTR_OPERATION_MATMUL_DESC"] == Ref("matmul_0")
    modes = [d["CUDNN_ATTR_POINTWISE_MODE"] for d in program.of_kind("POINTWISE")]
    assert modes == [enums.pointwise_mode.ADD, enums.pointwise_mode.RELU_FWD]
    relu = program.of_kind("POINTWISE")[1]
    assert relu["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP"] == 0.0
    assert relu["CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE"] == 0.0
    assert relu["CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP"] == pytest.approx(3.4028234663852886e38)
    bias_op = program.of_kind("OPERATION_POINTWISE")[0]
    assert bias_op["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['bias'].uid}")
    opg = program.of_kind("OPERATIONGRAPH")[0]
    assert opg["CUDNN_ATTR_OPERATIONGRAPH_OPS"] == (Ref("op_0"), Ref("op_1"), Ref("op_2"))
    assert opg["CUDNN_ATTR_OPERATIONGRAPH_HANDLE"] is HANDLE
    # every attribute the program sets has a known type
    assert all(attr in ATTRIBUTE_TYPES for _, attrs in program for attr in attrs)


def test_transposed_and_padded_operands_keep_their_strides():
    g, t = matmul_graph("cuda", transpose_b=True, a_row_pad=16, k=32, m=8, n=16, batch=3, epilogue=())
    g.validate()
    geometry = lower_program(g).geometry
    assert geometry[t["A"].uid] == ((3, 8, 32), (8 * 48, 48, 1))
    assert geometry[t["B"].uid] == ((3, 32, 16), (512, 1, 32))


def test_rank2_matmul_is_padded_to_rank3():
    g, t = matmul_graph("cuda", rank=2, m=8, k=16, n=4, epilogue=("bias",))
    g.validate()
    program = lower_program(g)
    assert program.geometry[t["A"].uid] == ((1, 8, 16), (128, 16, 1))
    assert program.geometry[t["bias"].uid] == ((1, 1, 4), (4, 4, 1))
    assert any("padded" in note for note in program.notes)
    assert MIN_RANK == 3


def test_rank4_matmul_batch_axes_fold_into_one():
    g, t = matmul_graph("cuda", rank=4, batch=3, m=8, k=16, n=4, epilogue=("bias",))
    g.validate()
    program = lower_program(g)
    assert program.geometry[t["A"].uid] == ((6, 8, 16), (128, 16, 1))
    assert program.geometry[t["B"].uid] == ((6, 16, 4), (64, 4, 1))
    assert program.geometry[t["bias"].uid] == ((1, 1, 4), (4, 4, 1))
    assert program.geometry[t["C"].uid][0] == (6, 8, 4)


def test_pointwise_broadcast_over_the_first_axis_is_folded_away():
    # cuDNN 9.19's pointwise-only engine misreads an operand broadcast along axis 0 (H200 finding):
    # the leading axes are folded into one, which it computes right.
    g, t = pointwise_graph("cuda", dims=(2, 8, 64))
    g.validate()
    program = lower_program(g)
    assert program.geometry[t["X"].uid] == ((1, 16, 64), (1024, 64, 1))
    assert program.geometry[t["Bias"].uid] == ((1, 1, 64), (64, 64, 1))
    assert program.geometry[t["Y"].uid] == ((1, 16, 64), (1024, 64, 1))
    assert any("folded" in note for note in program.notes)
    g4, t4 = pointwise_graph("cuda", dims=(2, 8, 4, 64))
    g4.validate()
    assert lower_program(g4).geometry[t4["X"].uid] == ((1, 64, 64), (4096, 64, 1))
    # no broadcast along axis 0: nothing is folded
    g2 = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda")
    x = g2.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
    y = g2.tensor(name="y", dim=[2, 8, 64], stride=[512, 64, 1])
    g2.add(x, y).set_output(True)
    g2.validate()
    assert lower_program(g2).geometry[x.uid] == ((2, 8, 64), (512, 64, 1))


def test_pointwise_broadcast_along_the_first_axis_only_keeps_its_axes():
    # (1, T, d) against (B, T, d): cuDNN computes it right as it is (the GPU test below).
    g, t = _partial_broadcast_graph("cuda", (6, 40, 16), (1, 40, 16))
    g.validate()
    program = lower_program(g)
    assert program.geometry[t["c"].uid] == ((1, 40, 16), (640, 16, 1))
    assert not program.barred_engines
    assert any("leading axes kept" in note for note in program.notes)


def test_pointwise_partial_broadcast_along_the_first_axis_and_another_bars_the_pointwise_only_engine():
    # (1, 8, 1) against (2, 8, 64) cannot fold and is read wrong by engine 1 (the GPU test below).
    g, t = _partial_broadcast_graph("cuda", (2, 8, 64), (1, 8, 1))
    g.validate()
    program = lower_program(g)
    assert program.geometry[t["c"].uid] == ((1, 8, 1), (8, 1, 1))
    assert "pointwise-only engine" in program.barred_engines[1]


def _partial_broadcast_graph(device, x_dims, c_dims):
    """An operand broadcast along the first axis but not along all leading ones (RoPE's (1, T, d) tables
    against (B, T, d) activations, cudnn-frontend's test_apply_rope), which cannot fold into one axis."""
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)
    x = g.tensor(name="x", dim=list(x_dims), stride=list(_row_major(x_dims)))
    c = g.tensor(name="c", dim=list(c_dims), stride=list(_row_major(c_dims)))
    y = g.mul(x, c)
    y.set_output(True).set_name("y").set_dim(list(x_dims)).set_stride(list(_row_major(x_dims)))
    return g, {"x": x, "c": c, "y": y}


@pytest.mark.gpu
@pytest.mark.parametrize("x_dims, c_dims", [((6, 40, 16), (1, 40, 16)), ((2, 8, 64), (1, 8, 1)),
                                            ((3, 5, 7, 32), (1, 5, 1, 32))], ids=["rope", "row", "rank4"])
def test_gpu_partial_broadcast_over_the_first_axis_is_right_or_declined(x_dims, c_dims):
    # H200, cuDNN 9.19, with the graph's axes kept and engine 1 allowed: "rope" was right; "row" and
    # "rank4" were wrong. Now "rope" runs and the other two decline naming the engine (or run right on
    # another engine, should cuDNN offer one).
    from functools import partial
    from gpu_support import assert_close, gpu_run
    rng = np.random.default_rng(3)
    host = {"x": rng.standard_normal(x_dims).astype(np.float32),
            "c": rng.standard_normal(c_dims).astype(np.float32)}
    try:
        got, g = gpu_run(partial(_partial_broadcast_graph, x_dims=x_dims, c_dims=c_dims), host, {"y"})
    except cudnn.cudnnGraphNotSupportedError as exc:
        # Declined either by our bar on engine 1 or by cuDNN itself (H200: for "rank4" every engine
        # cuDNN offers refuses the folded layout with NOT_SUPPORTED_LAYOUT): a decline, never wrong.
        assert x_dims[1:] != c_dims[1:], str(exc)
        assert "pointwise-only engine" in str(exc) or "NOT_SUPPORTED" in str(exc)
        return
    assert_close(np.asarray(got["y"]), host["x"] * host["c"], "float32", "y")
    if x_dims[1:] != c_dims[1:]:
        assert g.selected_plan.engine_id != 1


def test_partially_broadcast_batch_is_declined():
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    a = g.tensor(name="a", dim=[2, 3, 8, 16], stride=[384, 128, 16, 1])
    b = g.tensor(name="b", dim=[1, 3, 16, 4], stride=[192, 64, 4, 1])
    g.matmul(a, b).set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError, match="broadcast partially"):
        lower_program(g)


def _pointwise_args(g, method, ports, dims):
    args = {}
    for port in ports:
        args[port] = g.tensor(name=f"{method}_{port}", dim=dims, stride=_row_major(dims))
    return args


_ATTR_VALUES = {"negative_slope": 0.1, "lower_clip": -1.0, "upper_clip": 6.0, "swish_beta": 1.5,
                "elu_alpha": 0.7, "softplus_beta": 2.0, "axis": 1}


@pytest.mark.parametrize("row", POINTWISE_OPS, ids=[r[0] for r in POINTWISE_OPS])
def test_every_pointwise_mode_lowers_with_its_attributes(row):
    method, mode, ports, attrs, kind = row
    dims = (2, 4, 8)
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    args = _pointwise_args(g, method, ports, dims)
    params = {a.name: _ATTR_VALUES[a.name] for a in attrs}
    y = getattr(g, method)(**args, **params).set_output(True)
    g.validate()
    program = lower_program(g)
    (pw,) = program.of_kind("POINTWISE")
    assert pw["CUDNN_ATTR_POINTWISE_MODE"] == enums.pointwise_mode[mode]
    assert pw["CUDNN_ATTR_POINTWISE_MATH_PREC"] == DataType.FLOAT
    schema = g.nodes[0].schema
    for name, backend_attr in schema.attr_map.items():
        expected = _ATTR_VALUES[name] + (0 if name != "axis" else 0)
        assert pw[backend_attr] == pytest.approx(expected), backend_attr
    (op,) = program.of_kind("OPERATION_POINTWISE")
    for port, backend_attr in schema.operands.items():
        assert op[backend_attr] == Ref(f"tensor_{args[port].uid}")
    out_attr = "CUDNN_ATTR_OPERATION_POINTWISE_DXDESC" if kind == "backward" else "CUDNN_ATTR_OPERATION_POINTWISE_YDESC"
    assert op[out_attr] == Ref(f"tensor_{y.uid}")
    if kind == "backward":
        assert "CUDNN_ATTR_OPERATION_POINTWISE_YDESC" not in op


def test_gen_index_axis_moves_with_padding():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda")
    x = g.tensor(name="x", dim=[4, 8], stride=[8, 1])
    g.gen_index(x, axis=1).set_output(True).set_data_type(F.INT32)
    g.validate()
    (pw,) = lower_program(g).of_kind("POINTWISE")
    assert pw["CUDNN_ATTR_POINTWISE_AXIS"] == 2   # rank 2 padded to 3: axis 1 becomes 2


@pytest.mark.parametrize("mode", [m for m in enums.reduction_mode if m.value >= 0], ids=lambda m: m.name)
def test_every_reduction_mode_lowers(mode):
    g, t = reduction_graph("cuda", mode)
    g.validate()
    program = lower_program(g)
    (red,) = program.of_kind("REDUCTION")
    assert red == {"CUDNN_ATTR_REDUCTION_OPERATOR": mode, "CUDNN_ATTR_REDUCTION_COMP_TYPE": DataType.FLOAT}
    (op,) = program.of_kind("OPERATION_REDUCTION")
    assert op["CUDNN_ATTR_OPERATION_REDUCTION_XDESC"] == Ref(f"tensor_{t['X'].uid}")
    assert op["CUDNN_ATTR_OPERATION_REDUCTION_YDESC"] == Ref(f"tensor_{t['Y'].uid}")
    assert program.geometry[t["X"].uid] == ((2, 32, 8, 16), (4096, 1, 512, 32))
    assert program.geometry[t["Y"].uid] == ((1, 1, 1, 1), (1, 1, 1, 1))


def test_pass_by_value_scalar_is_by_value_and_a_plan_constant():
    g = cudnn.pygraph(io_data_type=F.FLOAT, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    x = g.tensor(name="x", dim=[2, 4, 8], stride=[32, 8, 1])
    s = g.tensor_scalar(0.5, data_type=F.FLOAT, name="half").set_dim([1, 1, 1]).set_stride([1, 1, 1])
    g.mul(x, s).set_output(True)
    g.validate()
    program = lower_program(g)
    scalar = next(a for a in program.of_kind("TENSOR") if a["CUDNN_ATTR_TENSOR_UNIQUE_ID"] == s.uid)
    assert scalar["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
    assert scalar["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 1, 1)
    assert program.constants == [(s.uid, DataType.FLOAT, 0.5)]


def test_matmul_padding_value_is_set_only_when_nonzero():
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    a = g.tensor(name="a", dim=[1, 8, 16], stride=[128, 16, 1])
    b = g.tensor(name="b", dim=[1, 16, 8], stride=[128, 8, 1])
    g.matmul(a, b, padding=-1.5).set_output(True)
    g.validate()
    (mm,) = lower_program(g).of_kind("MATMUL")
    assert mm["CUDNN_ATTR_MATMUL_PADDING_VALUE"] == -1.5


def test_attribute_and_descriptor_names_match_the_header():
    from pathlib import Path
    import re
    header = REPO_ROOT / "include" / "cudnn_graph" / "cudnn_backend.h"
    values = {name: int(v) for name, v in re.findall(r"^\s+(CUDNN_\w+)\s+=\s+(-?\d+),", header.read_text(), re.M)}
    from cudnn_graph import _cudnn_names
    for table in (_cudnn_names.ATTRIBUTES, _cudnn_names.ATTRIBUTE_TYPES, _cudnn_names.DESCRIPTOR_TYPES):
        for name, value in table.items():
            assert values[name] == value, name
    for attr, attr_type in ATTRIBUTE_TYPES.items():
        assert attr in _cudnn_names.ATTRIBUTES and attr_type in _cudnn_names.ATTRIBUTE_TYPES


# ---- CPU: the plan filters --------------------------------------------------------------------------

def _entry(engine_id, numeric=(), behavior=(), workspace=0, knobs=None):
    knobs = knobs or {}
    return PlanConfig(engine_id, knobs=knobs, name=backend_engine.plan_name(engine_id, knobs),
                      source="heuristics_A", numerical_notes=numeric, behavior_notes=behavior,
                      workspace_size=workspace)


def test_plan_names_follow_the_frontend_tag():
    assert backend_engine.plan_name(7, {enums.knob_type.TILE_SIZE: 3, enums.knob_type.SWIZZLE: 1}) == "eng7_k1=1_k2=3"


def test_filters_decline_in_check_support():
    g, _ = matmul_graph("cuda")
    engine = CudnnBackendEngine()
    tc, dc = enums.numerical_note.TENSOR_CORE, enums.numerical_note.DOWN_CONVERT_INPUTS
    rt = enums.behavior_note.RUNTIME_COMPILATION
    plans = [_entry(0, (tc,), (rt,), 0), _entry(4, (tc, dc), (), 1 << 20), _entry(12, (), (), 64)]

    def kept():
        out = []
        for p in plans:
            try:
                engine.check_support(g, p)
            except GraphNotSupportedError:
                continue
            out.append(p.engine_id)
        return out

    assert kept() == [0, 4, 12]
    assert backend_engine.deselect_engines(g, ["eng4"]) is g
    assert kept() == [0, 12]
    backend_engine.deselect_engines(g, [])
    backend_engine.select_numeric_notes(g, [tc])
    assert kept() == [0, 4]
    backend_engine.deselect_numeric_notes(g, ["DOWN_CONVERT_INPUTS"])
    assert kept() == [0]
    backend_engine.select_numeric_notes(g, [])
    backend_engine.deselect_numeric_notes(g, [])
    backend_engine.select_behavior_notes(g, [rt])
    assert kept() == [0]
    backend_engine.select_behavior_notes(g, [])
    backend_engine.deselect_behavior_notes(g, [rt])
    assert kept() == [4, 12]
    backend_engine.deselect_behavior_notes(g, [])
    backend_engine.deselect_workspace_greater_than(g, 100)
    assert kept() == [0, 12]
    with pytest.raises(GraphNotSupportedError, match="deselect_workspace_greater_than"):
        engine.check_support(g, plans[1])


def test_graph_methods_table_names_functions():
    assert set(backend_engine.GRAPH_METHODS) == {
        "deselect_engines", "select_numeric_notes", "deselect_numeric_notes", "select_behavior_notes",
        "deselect_behavior_notes", "deselect_workspace_greater_than", "get_engine_count",
        "get_knobs_for_engine", "create_execution_plan"}


# ---- CPU: descriptors and the execute path against a recording stand-in libcudnn ------------------

RECORDING_LIBCUDNN = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
typedef struct { int type; int64_t n; int64_t uids[64]; void *ptrs[64]; void *ws; } desc_t;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static void emit(const char *line) {
    pthread_mutex_lock(&lock);
    if (!out) out = fopen(getenv("FAKE_CUDNN_LOG"), "w");
    fputs(line, out); fputc('\n', out); fflush(out);
    pthread_mutex_unlock(&lock);
}
static int elem_size(int type) {
    switch (type) { case 2: case 24: return 1; case 3: case 5: case 0: case 6: case 15: return 8; default: return 4; }
}
size_t cudnnGetVersion(void) { return 91900; }
size_t cudnnGetCudartVersion(void) { return 13000; }
const char *cudnnGetErrorString(int s) { return s ? "fake error" : "CUDNN_STATUS_SUCCESS"; }
void cudnnGetLastErrorString(char *m, size_t n) { m[0] = 0; }
int cudnnCreate(void **h) { *h = (void *)0x1000; return 0; }
int cudnnDestroy(void *h) { return 0; }
int cudnnSetStream(void *h, void *s) { char b[64]; snprintf(b, 64, "stream %p", s); emit(b); return 0; }
int cudnnGetStream(void *h, void **s) { *s = 0; return 0; }
int cudnnBackendCreateDescriptor(int type, void **d) {
    desc_t *x = calloc(1, sizeof *x); x->type = type; *d = x;
    char b[64]; snprintf(b, 64, "create %d", type); emit(b); return 0;
}
int cudnnBackendDestroyDescriptor(void *d) { free(d); return 0; }
int cudnnBackendFinalize(void *d) { char b[64]; snprintf(b, 64, "finalize %d", ((desc_t *)d)->type); emit(b); return 0; }
int cudnnBackendSetAttribute(void *d, int name, int type, long long n, const void *e) {
    desc_t *x = d;
    char *b = malloc(256 + 2 * 8 * (n + 1)); int k = sprintf(b, "set %d %d %d %lld ", x->type, name, type, n);
    const unsigned char *p = e; int size = elem_size(type);
    for (long long i = 0; i < n * size; i++) k += sprintf(b + k, "%02x", p[i]);
    emit(b); free(b);
    if (name == 1000) { x->n = n; memcpy(x->uids, e, n * 8); }
    if (name == 1001) memcpy(x->ptrs, e, n * 8);
    if (name == 1003) x->ws = *(void *const *)e;
    if (name == 1011 || name == 1012) {   /* override shapes / strides: a vector of int64 vectors */
        typedef struct { int64_t *begin, *end, *cap; } row_t;
        const struct { row_t *begin, *end, *cap; } *rows = e;
        char line[1024]; int at = sprintf(line, "override %s", name == 1011 ? "shapes" : "strides");
        for (const row_t *r = rows->begin; r != rows->end; r++) {
            at += sprintf(line + at, " ");
            for (const int64_t *v = r->begin; v != r->end; v++)
                at += sprintf(line + at, "%s%lld", v == r->begin ? "" : ",", (long long)*v);
        }
        emit(line);
    }
    return 0;
}
int cudnnBackendGetAttribute(void *d, int name, int type, long long r, long long *c, void *e) {
    if (c) *c = 1;
    if (e && r >= 1) memset(e, 0, elem_size(type));
    return 0;
}
int cudnnBackendExecute(void *h, void *p, void *v) {
    desc_t *x = v; char b[2048]; int k = sprintf(b, "execute %lu %p", (unsigned long)pthread_self(), x->ws);
    for (int i = 0; i < x->n; i++) k += sprintf(b + k, " %lld=%p", (long long)x->uids[i], x->ptrs[i]);
    emit(b); return 0;
}
"""


@pytest.fixture(scope="module")
def recording_libcudnn(tmp_path_factory):
    from _helpers import build_shared_library
    lib = build_shared_library(RECORDING_LIBCUDNN, tmp_path_factory.mktemp("recording_cudnn"), "libcudnn.so.9",
                               libs=("-lpthread",))
    return str(lib), lib.parent


def _read_log(path):
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def test_materialize_sets_every_attribute_with_its_type(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "materialize.log"
    out = run_python("""
import json
import cudnn_graph as cudnn
from cudnn_graph.engines.cudnn_backend.lowering import lower_program, materialize, ATTRIBUTE_TYPES
from cudnn_graph import _cudnn_names
F = cudnn.data_type
g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda")
a = g.tensor(name="A", dim=[2, 64, 32], stride=[2048, 32, 1])
b = g.tensor(name="B", dim=[2, 32, 48], stride=[1536, 48, 1])
bias = g.tensor(name="bias", dim=[1, 1, 48], stride=[48, 48, 1])
g.relu(g.bias(g.matmul(a, b), bias)).set_output(True)
g.validate()
program = lower_program(g)
made = materialize(program, 0x1000)
steps = [[s.kind, {k: [ATTRIBUTE_TYPES[k], repr(v)] for k, v in s.attrs.items()}] for s in program.steps]
print(json.dumps({"made": len(made), "finalized": all(d.finalized for d in made.values()),
                  "types": _cudnn_names.DESCRIPTOR_TYPES, "attrs": _cudnn_names.ATTRIBUTES,
                  "attr_types": _cudnn_names.ATTRIBUTE_TYPES, "steps": steps}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    assert out["made"] == 13 and out["finalized"]
    records = _read_log(log)
    sets = [r for r in records if r[0] == "set"]
    created = [int(r[1]) for r in records if r[0] == "create"]
    assert created == [out["types"][kind] for kind, _ in out["steps"]]
    assert len(sets) == sum(len(attrs) for _, attrs in out["steps"])
    expected = [(out["types"][kind], out["attrs"][name], out["attr_types"][t])
                for kind, attrs in out["steps"] for name, (t, _) in attrs.items()]
    assert [(int(r[1]), int(r[2]), int(r[3])) for r in sets] == expected
    # element encodings: dims as int64, virtual flags as one byte, clips as double
    dims = [r for r in sets if int(r[2]) == out["attrs"]["CUDNN_ATTR_TENSOR_DIMENSIONS"]][0]
    assert int(dims[4]) == 3 and struct.unpack("<3q", bytes.fromhex(dims[5])) == (2, 64, 32)
    virtual = [r for r in sets if int(r[2]) == out["attrs"]["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]]
    assert [r[5] for r in virtual] == ["00", "00", "00", "01", "01", "00"]
    upper = [r for r in sets if int(r[2]) == out["attrs"]["CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP"]][0]
    assert struct.unpack("<d", bytes.fromhex(upper[5]))[0] == pytest.approx(3.4028234663852886e38)
    ops = [r for r in sets if int(r[2]) == out["attrs"]["CUDNN_ATTR_OPERATIONGRAPH_OPS"]][0]
    assert int(ops[4]) == 3
    handle = [r for r in sets if int(r[2]) == out["attrs"]["CUDNN_ATTR_OPERATIONGRAPH_HANDLE"]][0]
    assert struct.unpack("<Q", bytes.fromhex(handle[5]))[0] == 0x1000


EXECUTE_PROLOGUE = """
import json, threading
import numpy as np
from cudnn_graph import _cudnn_descriptor, _cudnn_handle, _plan_runner, TensorSpec, PackLayout
plan = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR").finalize()
scalar = np.array([0.25], np.float32)
runner = _plan_runner.PlanRunner(plan, 0, 0, "fake", [(7, scalar)])
layout = PackLayout([TensorSpec(3, (4, 8), "float16", name="x"),
                     TensorSpec(5, (4, 8), "float16", name="y", is_output=True),
                     TensorSpec(7, (1,), "float32", device="cpu", name="s", required=False)])
"""


def test_execute_builds_the_variant_pack_from_the_pack_and_caches_it(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "execute.log"
    out = run_python(EXECUTE_PROLOGUE + """
_cudnn_handle.set_variant_pack_cache(True)
for i in range(3):
    runner.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000, stream=0)
runner.run(layout.pack({3: 0x30000, 5: 0x20000}), handle=0x1000)
given = np.array([2.0], np.float32)
runner.run(layout.pack({3: 0x10000, 5: 0x20000, 7: given}), handle=0x1000)
cached = _cudnn_handle.current_thread_state().cached_variant_packs
_cudnn_handle.set_variant_pack_cache(False)
runner.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000)
runner.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000)
errors = {}
try:
    runner.run(layout.pack({3: 0x10002, 5: 0x20000}), handle=0x1000)
except Exception as e:
    errors["misaligned"] = [type(e).__name__, str(e)]
print(json.dumps({"scalar": scalar.ctypes.data, "given": given.ctypes.data, "cached": cached,
                  "errors": errors}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    records = _read_log(log)
    vp_type = 16
    executes = [r for r in records if r[0] == "execute"]
    assert len(executes) == 7
    scalar = f"{out['scalar']:#x}"
    first = executes[0][3:]
    assert first == ["3=0x10000", "5=0x20000", f"7={scalar}"]     # the plan supplies the scalar
    assert executes[3][3:] == ["3=0x30000", "5=0x20000", f"7={scalar}"]
    assert executes[4][3:] == ["3=0x10000", "5=0x20000", f"7={out['given']:#x}"]   # the caller's wins
    # with the cache on, 5 executes of 3 distinct packs made 3 variant packs; off, one per execute
    creates = [i for i, r in enumerate(records) if r[0] == "create" and int(r[1]) == vp_type]
    exec_lines = [i for i, r in enumerate(records) if r[0] == "execute"]
    assert sum(1 for c in creates if c < exec_lines[4]) == 3
    assert sum(1 for c in creates if c > exec_lines[4]) == 2
    assert out["cached"] == 3
    # a foreign handle (an int) gets the stream each call that gives one (its own stream is unknown)
    assert [r for r in records if r[0] == "stream"] == [["stream", "(nil)"]] * 3
    assert out["errors"]["misaligned"][0] == "AlignmentError"
    assert "tensor 'x' (uid 3)" in out["errors"]["misaligned"][1]


def test_aliased_view_is_fed_the_source_pointer_plus_its_offset(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "alias.log"
    out = run_python(EXECUTE_PROLOGUE + """
aliased = _plan_runner.PlanRunner(plan, 0, 0, "sliced", [], aliases=[(9, 3, 96)])
aliased.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000)
replaced = _plan_runner.PlanRunner(plan, 0, 0, "viewed", [], aliases=[(9, 3, 0)], omit=[3])
replaced.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000)
errors = {}
orphan = _plan_runner.PlanRunner(plan, 0, 0, "orphan", [], aliases=[(9, 11, 0)])
try:
    orphan.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000)
except Exception as e:
    errors["missing"] = [type(e).__name__, str(e)]
print(json.dumps({"errors": errors}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    executes = [r for r in _read_log(log) if r[0] == "execute"]
    assert executes[0][3:] == ["3=0x10000", "5=0x20000", "9=0x10060"]
    # a source no operation reads stays out of the variant pack (cuDNN wants its tensors exactly)
    assert executes[1][3:] == ["5=0x20000", "9=0x10000"]
    assert out["errors"]["missing"][0] == "MissingTensorError"
    assert "uid 11" in out["errors"]["missing"][1] and "uid 9" in out["errors"]["missing"][1]


def test_plan_owned_operands_join_every_pack(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "owned.log"
    out = run_python(EXECUTE_PROLOGUE + """
owned = _plan_runner.PlanRunner(plan, 300, 0, "owned", [], fixed=[(13, 0x5000, None)],
                            scratch=[(21, 100, False), (22, 8, False)])
owned.run(layout.pack({3: 0x10000, 5: 0x20000}), handle=0x1000, workspace=0x800000)
print(json.dumps({"workspace": owned.workspace_size, "cudnn": owned.cudnn_workspace_size}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    executes = [r for r in _read_log(log) if r[0] == "execute"]
    # scratch sits past cuDNN's 300 bytes, each tensor 256-byte aligned; the workspace covers both
    assert executes[0][2] == "0x800000"
    assert executes[0][3:] == ["3=0x10000", "5=0x20000", "13=0x5000", "21=0x800200", "22=0x800300"]
    assert out == {"workspace": 0x400, "cudnn": 300}


def test_override_shapes_reach_cudnn_as_vectors_of_int64_vectors(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "overrides.log"
    run_python(EXECUTE_PROLOGUE + """
overrides = _plan_runner.ShapeOverrides([3, 5], [(2, 8), (2, 4)], [(8, 1), (4, 1)])
runner.run_with_overrides(layout.pack({3: 0x10000, 5: 0x20000}), overrides, handle=0x1000)
print(json.dumps({}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    records = _read_log(log)
    uids = [r for r in records if r[0] == "set" and r[2] == "1010"][0]
    assert struct.unpack("<2q", bytes.fromhex(uids[5])) == (3, 5)
    assert ["override", "shapes", "2,8", "2,4"] in records
    assert ["override", "strides", "8,1", "4,1"] in records
    assert [r[0] for r in records].count("execute") == 1


def test_shape_overrides_are_checked_before_any_launch():
    from cudnn_graph._plan_runner import ShapeOverrides
    with pytest.raises(ValueError, match="one entry per uid"):
        ShapeOverrides([1, 2], [(2, 3)], [(3, 1)])
    with pytest.raises(ValueError, match="differ in rank"):
        ShapeOverrides([1], [(2, 3)], [(1,)])
    with pytest.raises(TypeError):
        ShapeOverrides([1], [(2.5, 3)], [(3, 1)])
    assert ShapeOverrides([], [], []).uids == ()


def test_override_shape_enabled_graphs_set_the_flag_or_name_the_version_needed():
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda",
                      is_override_shape_enabled=True)
    x = g.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
    g.relu(x).set_output(True)
    g.validate()
    assert g.is_override_shape_enabled
    attrs = lower_program(g).step("operation_graph").attrs
    assert attrs["CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED"] is True
    from cudnn_graph._cudnn_errors import CudnnVersionError
    with pytest.raises(CudnnVersionError, match=r"override shapes enabled.*9\.21"):
        lower_program(g, 91900)
    plain = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    y = plain.tensor(name="x", dim=[2, 8, 64], stride=[512, 64, 1])
    plain.relu(y).set_output(True)
    plain.validate()
    assert "CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED" not in lower_program(plain).step(
        "operation_graph").attrs


def test_overrides_on_a_graph_without_them_are_refused_not_dropped():
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    y = g.relu(x).set_output(True)
    g.build([cudnn.heur_mode.A])
    a, b = np.ones((2, 3), np.float32), np.empty((2, 3), np.float32)
    with pytest.raises(GraphNotSupportedError, match="is_override_shape_enabled=True"):
        g.execute({x: a, y: b}, override_uids=[x.uid], override_shapes=[(1, 3)], override_strides=[(3, 1)])
    g2 = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu",
                       is_override_shape_enabled=True)
    x2 = g2.tensor(name="x", dim=[2, 3], stride=[3, 1])
    y2 = g2.relu(x2).set_output(True)
    g2.build([cudnn.heur_mode.A])
    with pytest.raises(GraphNotSupportedError, match="does not take override shapes"):
        g2.execute({x2: a, y2: b}, override_uids=[x2.uid], override_shapes=[(1, 3)], override_strides=[(3, 1)])
    with pytest.raises(ValueError, match="go together"):
        g2.execute({x2: a, y2: b}, override_uids=[x2.uid], override_shapes=[(1, 3)])


def test_threads_see_only_their_own_pointers(recording_libcudnn):
    lib, folder = recording_libcudnn
    log = folder / "threads.log"
    run_python(EXECUTE_PROLOGUE + """
_cudnn_handle.set_variant_pack_cache(True)
barrier = threading.Barrier(8)
def work(i):
    barrier.wait()
    for j in range(50):
        runner.run(layout.pack({3: 0x100000 * (i + 1), 5: 0x100000 * (i + 1) + 0x1000 * (j % 3)}),
                   handle=0x1000)
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(log)})
    executes = [r for r in _read_log(log) if r[0] == "execute"]
    assert len(executes) == 400
    by_thread = {}
    for r in executes:
        x = int(r[3].split("=")[1], 16)
        y = int(r[4].split("=")[1], 16)
        assert y - x in (0, 0x1000, 0x2000), r       # x and y always come from the same call
        by_thread.setdefault(r[1], set()).add(x)
    assert len(by_thread) == 8 and all(len(v) == 1 for v in by_thread.values())


def test_workspace_checks(recording_libcudnn):
    lib, folder = recording_libcudnn
    out = run_python(EXECUTE_PROLOGUE + """
import numpy as np
runner = _plan_runner.PlanRunner(plan, 4096, 0, "needs-ws")
pack = layout.pack({3: 0x10000, 5: 0x20000, 7: np.array([1.0], np.float32)})
errors = {}
for label, ws in (("small", np.zeros(16, np.uint8)), ("host", np.zeros(8192, np.uint8))):
    try:
        runner.run(pack, handle=0x1000, workspace=ws)
    except Exception as e:
        errors[label] = [type(e).__name__, str(e), getattr(e, "required", None)]
runner.run(pack, handle=0x1000, workspace=0x40000)   # a raw address is trusted
print(json.dumps(errors))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(folder / "ws.log")})
    assert out["host"][0] == "WorkspaceError" and "CUDA device memory" in out["host"][1]
    executes = [r for r in _read_log(folder / "ws.log") if r[0] == "execute"]
    assert executes[-1][2] == "0x40000"
    # a host buffer is refused for where it lives before its size is looked at
    assert out["small"][0] == "WorkspaceError"


def test_ops_newer_than_the_loaded_cudnn_are_declined_first(recording_libcudnn):
    lib, folder = recording_libcudnn
    out = run_python("""
import json
import cudnn_graph as cudnn
from cudnn_graph.engines.cudnn_backend import CudnnBackendEngine
F = cudnn.data_type
g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda")
x = g.tensor(name="x", dim=[2, 4, 8], stride=[32, 8, 1])
y = g.tensor(name="y", dim=[2, 4, 8], stride=[32, 8, 1])
g.floor_mod(x, y).set_output(True)
g.validate()
try:
    CudnnBackendEngine().propose_plans(g)
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
""", env={"CUDNN_GRAPH_LIBCUDNN": lib, "FAKE_CUDNN_LOG": str(folder / "version.log")})
    assert out["error"] == "CudnnVersionError"
    assert "floor_mod" in out["message"] and "9.27.0" in out["message"] and "9.19.0" in out["message"]
    assert "create" not in (folder / "version.log").read_text() if (folder / "version.log").exists() else True


def test_descriptor_without_libcudnn_raises_not_found():
    out = run_python(NO_LIBCUDNN + """
import json
from cudnn_graph import _cudnn_descriptor
try:
    _cudnn_descriptor.Descriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
except Exception as e:
    print(json.dumps({"error": type(e).__name__}))
""", env={"CUDNN_GRAPH_LIBCUDNN": "/nonexistent/libcudnn.so.9"})
    assert out["error"] == "CudnnNotFoundError"


# ---- GPU: real graphs against the reference engine --------------------------------------------------

NP_NAME = {F.FLOAT: "float32", F.HALF: "float16", F.BFLOAT16: "bfloat16"}
_host_dtype = host_dtype


def matmul_inputs(io, *, batch=2, m=64, k=32, n=48, transpose_b=False, a_row_pad=0, rank=3, seed=0):
    """Host inputs with exactly the strides matmul_graph declares."""
    rng = np.random.default_rng(seed)
    lead = {2: (), 3: (batch,), 4: (batch, 2)}[rank]
    dt = _host_dtype(io)
    a_full = (rng.standard_normal(lead + (m, k + a_row_pad)) * 0.5).astype(dt)
    a = a_full[..., :k]
    if transpose_b:
        b = (rng.standard_normal(lead + (n, k)) * 0.5).astype(dt)
        b = np.swapaxes(b, -1, -2)
    else:
        b = (rng.standard_normal(lead + (k, n)) * 0.5).astype(dt)
    bias = (rng.standard_normal((1,) * len(lead) + (1, n)) * 0.5).astype(dt)
    return {"A": a, "B": b, "bias": bias, "A_full": a_full}


def _torch_from_host(torch, array, strides_like=None):
    """A CUDA tensor with the values and the element strides of a host array."""
    import ml_dtypes
    if array.dtype == ml_dtypes.bfloat16:
        dense = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    else:
        dense = torch.from_numpy(np.ascontiguousarray(array))
    itemsize = array.dtype.itemsize
    strides = tuple(s // itemsize for s in array.strides)
    out = torch.empty_strided(array.shape, strides, dtype=dense.dtype, device="cuda")
    out.copy_(dense.to("cuda"))
    return out


def _to_host(torch, tensor):
    return tensor.float().cpu().numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("io", [F.BFLOAT16, F.HALF, F.FLOAT], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("epilogue", [(), ("bias", "relu")], ids=["plain", "bias_relu"])
def test_matmul_dtypes_with_torch(io, epilogue):
    torch = pytest.importorskip("torch")
    host = matmul_inputs(io)
    want = reference_run(matmul_graph, host, {"C"}, io=io, epilogue=epilogue)["C"]
    g, t = build_gpu(matmul_graph, io=io, epilogue=epilogue)
    assert g.selected_plan.engine_id in range(0, 10000)
    dev = {k: _torch_from_host(torch, v) for k, v in host.items() if k != "A_full"}
    c = torch.empty(t["C"].dim, dtype=dev["A"].dtype, device="cuda")
    pack = {t["A"]: dev["A"], t["B"]: dev["B"], t["C"]: c}
    if "bias" in t:
        pack[t["bias"]] = dev["bias"]
    g.execute(pack)
    torch.cuda.synchronize()
    assert_close(_to_host(torch, c), want, NP_NAME[io], f"{io.name} {epilogue}")


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", [("bias",), ("gelu",), ("silu",), ("bias", "gelu"), ("bias", "silu")],
                         ids=lambda e: "_".join(e))
def test_matmul_epilogues(epilogue):
    torch = pytest.importorskip("torch")
    host = matmul_inputs(F.HALF)
    want = reference_run(matmul_graph, host, {"C"}, io=F.HALF, epilogue=epilogue)["C"]
    g, t = build_gpu(matmul_graph, io=F.HALF, epilogue=epilogue)
    dev = {k: _torch_from_host(torch, v) for k, v in host.items() if k != "A_full"}
    c = torch.empty(t["C"].dim, dtype=torch.float16, device="cuda")
    pack = {t["A"]: dev["A"], t["B"]: dev["B"], t["C"]: c}
    if "bias" in t:
        pack[t["bias"]] = dev["bias"]
    g.execute(pack)
    torch.cuda.synchronize()
    assert_close(_to_host(torch, c), want, "float16", str(epilogue))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [dict(transpose_b=True), dict(a_row_pad=16), dict(rank=2), dict(rank=4)],
                         ids=["transposed_b", "strided_a", "rank2", "rank4_folded"])
def test_matmul_layouts(layout):
    torch = pytest.importorskip("torch")
    host = matmul_inputs(F.HALF, **layout)
    want = reference_run(matmul_graph, host, {"C"}, io=F.HALF, **layout)["C"]
    g, t = build_gpu(matmul_graph, io=F.HALF, **layout)
    full = _torch_from_host(torch, host["A_full"])
    a = full[..., :t["A"].dim[-1]]
    assert tuple(a.stride()) == t["A"].stride
    b = _torch_from_host(torch, host["B"])
    assert tuple(b.stride()) == t["B"].stride
    bias = _torch_from_host(torch, host["bias"])
    c = torch.empty(t["C"].dim, dtype=torch.float16, device="cuda")
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c})
    torch.cuda.synchronize()
    assert_close(_to_host(torch, c), want, "float16", str(layout))


@pytest.mark.gpu
def test_pointwise_chain_with_cupy():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(1)
    dims = (2, 8, 64)
    host = {"X": rng.standard_normal(dims).astype(np.float32), "S": rng.standard_normal(dims).astype(np.float32),
            "Bias": rng.standard_normal((1, 1, 64)).astype(np.float32)}
    want = reference_run(pointwise_graph, host, {"Y"})["Y"]
    g, t = build_gpu(pointwise_graph)
    y = cp.full(dims, cp.nan, cp.float32)
    g.execute({t[k]: cp.asarray(v) for k, v in host.items()} | {t["Y"]: y})
    cp.cuda.get_current_stream().synchronize()
    assert_close(cp.asnumpy(y), want, "float32", "tanh(x*s+b)")


# What cuDNN 9.19 runs as a standalone reduction on the H200. AVG, NORM1, NORM2 and MUL_NO_ZEROS fail
# the REDUCTION descriptor's finalize (NOT_SUPPORTED); MUL passes it but no engine takes it
# ("Unsupported reduction op in the graph").
BACKEND_REDUCTION_MODES = ("ADD", "MIN", "MAX", "AMAX")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [m for m in enums.reduction_mode if m.value >= 0], ids=lambda m: m.name)
def test_reduction_modes(mode):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    dims = (2, 32, 8, 16)
    # Values near 1 keep the product of 8192 of them finite; NHWC memory, NCHW dims.
    nhwc = (1.0 + 0.01 * rng.standard_normal((dims[0], dims[2], dims[3], dims[1]))).astype(np.float32)
    nhwc[0, 0, 0, :4] = 0.0   # MUL_NO_ZEROS skips them
    x = nhwc.transpose(0, 3, 1, 2)
    if mode.name not in BACKEND_REDUCTION_MODES:
        with pytest.raises(GraphNotSupportedError, match="(?i)reduction"):
            build_gpu(reduction_graph, mode=mode)
        return
    want = reference_run(reduction_graph, {"X": x}, {"Y"}, mode=mode)["Y"]
    g, t = build_gpu(reduction_graph, mode=mode)
    xd = cp.asarray(nhwc).transpose(0, 3, 1, 2)
    assert tuple(s // 4 for s in xd.strides) == t["X"].stride
    y = cp.full(t["Y"].dim, cp.nan, cp.float32)
    g.execute({t["X"]: xd, t["Y"]: y})
    cp.cuda.get_current_stream().synchronize()
    got = cp.asnumpy(y)
    if mode == enums.reduction_mode.MUL:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-30)
    else:
        assert_close(got, want, "float32", mode.name)


def _fp16_graph_and_host():
    host = matmul_inputs(F.HALF)
    want = reference_run(matmul_graph, host, {"C"}, io=F.HALF)["C"]
    g, t = build_gpu(matmul_graph, io=F.HALF)
    return g, t, host, want


@pytest.mark.gpu
def test_producers_cupy_jax_numba_and_raw_pointers():
    cp = pytest.importorskip("cupy")
    g, t, host, want = _fp16_graph_and_host()
    a, b, bias = (cp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    # CuPy
    c = cp.empty(t["C"].dim, cp.float16)
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c})
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(c), want, "float16", "cupy")
    # raw int addresses, shaped by the graph
    c2 = cp.zeros(t["C"].dim, cp.float16)
    g.execute({t["A"]: a.data.ptr, t["B"]: b.data.ptr, t["bias"]: bias.data.ptr, t["C"]: c2.data.ptr})
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(c2), want, "float16", "raw pointers")
    # by tensor name and by uid
    c3 = cp.zeros(t["C"].dim, cp.float16)
    g.execute({"A": a, t["B"].uid: b, "bias": bias, t["C"].uid: c3})
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(c3), want, "float16", "names and uids")
    # numba output through the CUDA array interface
    numba_cuda = pytest.importorskip("numba.cuda")
    c4 = numba_cuda.device_array(t["C"].dim, dtype=np.float16)
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c4})
    cp.cuda.Device().synchronize()
    assert_close(c4.copy_to_host(), want, "float16", "numba")
    # JAX inputs (legacy DLPack capsules)
    jnp = pytest.importorskip("jax.numpy")
    ja, jb, jbias = (jnp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    for x in (ja, jb, jbias):
        x.block_until_ready()
    c5 = cp.zeros(t["C"].dim, cp.float16)
    g.execute({t["A"]: ja, t["B"]: jb, t["bias"]: jbias, t["C"]: c5})
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(c5), want, "float16", "jax")


@pytest.mark.gpu
def test_typed_errors_before_launch():
    cp = pytest.importorskip("cupy")
    from cudnn_graph.errors import (DataTypeMismatchError, DeviceMismatchError, MissingTensorError,
                                    ReadOnlyOutputError, ShapeMismatchError, UnknownTensorError)
    g, t, host, _ = _fp16_graph_and_host()
    a, b, bias = (cp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    c = cp.full(t["C"].dim, 7.0, cp.float16)
    ok = {t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c}
    with pytest.raises(DeviceMismatchError, match="tensor 'A'"):
        g.execute(ok | {t["A"]: np.ascontiguousarray(host["A"])})
    with pytest.raises(DataTypeMismatchError, match="tensor 'B'"):
        g.execute(ok | {t["B"]: b.astype(cp.float32)})
    with pytest.raises(ShapeMismatchError, match="tensor 'bias'"):
        g.execute(ok | {t["bias"]: cp.zeros((1, 1, 47), cp.float16)})
    with pytest.raises(MissingTensorError, match="bias"):
        g.execute({t["A"]: a, t["B"]: b, t["C"]: c})
    with pytest.raises(UnknownTensorError, match="uid 999"):
        g.execute(ok | {999: c})
    readonly = cudnn.Slot.from_address(c.data.ptr, t["C"].dim, t["C"].stride, "float16", "cuda:0", readonly=True)
    with pytest.raises(ReadOnlyOutputError, match="C"):
        g.execute(ok | {t["C"]: readonly})
    cp.cuda.Device().synchronize()
    assert bool((c == 7.0).all()), "nothing may run when a check fails"


@pytest.mark.gpu
def test_workspace_too_small_is_refused_before_launch():
    cp = pytest.importorskip("cupy")
    from cudnn_graph.engines.cudnn_backend import WorkspaceError
    # A long reduction dimension is where engines split K and need scratch.
    g, t = matmul_graph("cuda", F.HALF, batch=1, m=64, k=1 << 16, n=64, epilogue=())
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    sizes = sorted(((p.workspace_size or 0), i) for i, p in enumerate(g.plans))
    need, index = sizes[-1]
    if need == 0:
        pytest.skip(f"no engine config of this graph asks for a workspace ({len(sizes)} configs)")
    assert g.get_workspace_size_plan_at_index(index) >= need
    need = g.get_workspace_size_plan_at_index(index)
    a = cp.ones(t["A"].dim, cp.float16)
    b = cp.full(t["B"].dim, 0.5, cp.float16)
    c = cp.zeros(t["C"].dim, cp.float16)
    pack = {t["A"]: a, t["B"]: b, t["C"]: c}
    with pytest.raises(ValueError, match=str(need)):     # the graph's own check
        g.execute_plan_at_index(pack, cp.empty(need - 1, cp.uint8), index)
    runner = g.compiled_plan(index).runner
    with pytest.raises(WorkspaceError, match=str(need)):   # the plan's check, for callers below the graph
        runner.run(runner_pack(g, index, pack), workspace=cp.empty(need - 1, cp.uint8))
    assert bool((c == 0).all()), "nothing ran"
    g.execute_plan_at_index(pack, cp.empty(need, cp.uint8), index)
    cp.cuda.Device().synchronize()
    assert float(c[0, 0, 0]) == pytest.approx((1 << 16) * 0.5, rel=1e-2)
    c[...] = 0
    g.execute_plan_at_index(pack, None, index)    # the plan's cached workspace
    cp.cuda.Device().synchronize()
    assert float(c[0, 0, 0]) == pytest.approx((1 << 16) * 0.5, rel=1e-2)


def runner_pack(g, index, mapping):
    return g.compiled_plan(index).layout.pack(mapping)


@pytest.mark.gpu
def test_eight_threads_one_graph_different_buffers():
    cp = pytest.importorskip("cupy")
    g, t, host, _ = _fp16_graph_and_host()
    errors, results = [], {}
    barrier = threading.Barrier(8)

    def work(i):
        rng = np.random.default_rng(100 + i)
        try:
            with cp.cuda.Device(0):
                a = cp.asarray((rng.standard_normal(t["A"].dim) * 0.5).astype(np.float16))
                b = cp.asarray((rng.standard_normal(t["B"].dim) * 0.5).astype(np.float16))
                bias = cp.full(t["bias"].dim, 0.1 * i, cp.float16)
                c = cp.empty(t["C"].dim, cp.float16)
                barrier.wait()
                for _ in range(20):
                    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c})
                cp.cuda.get_current_stream().synchronize()
                want = cp.maximum(cp.matmul(a.astype(cp.float32), b.astype(cp.float32)) + 0.1 * i, 0)
                results[i] = float(cp.abs(c.astype(cp.float32) - want).max())
        except Exception as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert not errors, errors
    assert len(results) == 8 and max(results.values()) < 0.05, results


@pytest.mark.gpu
def test_cupy_and_torch_streams():
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    from cudnn_graph import _cudnn_handle
    g, t, host, want = _fp16_graph_and_host()
    a, b, bias = (cp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    stream = cp.cuda.Stream(non_blocking=True)
    c = cp.zeros(t["C"].dim, cp.float16)
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c}, stream=stream)
    assert _cudnn_handle.thread_handle(0).stream == stream.ptr
    stream.synchronize()
    assert_close(cp.asnumpy(c), want, "float16", "cupy stream")
    ts = torch.cuda.Stream()
    ta, tb, tbias = (_torch_from_host(torch, np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    tc = torch.zeros(t["C"].dim, dtype=torch.float16, device="cuda")
    torch.cuda.synchronize()
    g.execute({t["A"]: ta, t["B"]: tb, t["bias"]: tbias, t["C"]: tc}, stream=ts)
    assert _cudnn_handle.thread_handle(0).stream == ts.cuda_stream
    ts.synchronize()
    assert_close(_to_host(torch, tc), want, "float16", "torch stream")


@pytest.mark.gpu
def test_a_stream_given_to_one_execute_does_not_outlive_it():
    cp = pytest.importorskip("cupy")
    from cudnn_graph import _cudnn_handle
    g, t, host, want = _fp16_graph_and_host()
    a, b, bias = (cp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    for _ in range(12):     # more streams than a plan keeps workspaces for
        stream = cp.cuda.Stream(non_blocking=True)
        c = cp.zeros(t["C"].dim, cp.float16)
        g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c}, stream=stream)
        stream.synchronize()
        del stream          # destroyed: the next call without a stream must not launch on it
    c = cp.zeros(t["C"].dim, cp.float16)
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c})
    assert _cudnn_handle.thread_handle(0).stream == 0
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(c), want, "float16", "after a destroyed stream")


@pytest.mark.gpu
def test_a_callers_handle_keeps_the_stream_bound_to_it():
    cp = pytest.importorskip("cupy")
    g, t, host, want = _fp16_graph_and_host()
    a, b, bias = (cp.asarray(np.ascontiguousarray(host[k])) for k in ("A", "B", "bias"))
    handle = cudnn.create_handle(0)
    stream = cp.cuda.Stream(non_blocking=True)
    cudnn.set_stream(handle=handle, stream=stream)
    assert cudnn.get_stream(handle) == stream.ptr
    c = cp.zeros(t["C"].dim, cp.float16)
    g.execute({t["A"]: a, t["B"]: b, t["bias"]: bias, t["C"]: c}, handle=handle)
    assert cudnn.get_stream(handle) == stream.ptr
    stream.synchronize()
    assert_close(cp.asnumpy(c), want, "float16", "caller's handle stream")
    cudnn.destroy_handle(handle)
    cudnn.destroy_handle(handle)    # idempotent


@pytest.mark.gpu
def test_engine_queries_and_pinned_plans():
    g, t = matmul_graph("cuda", F.HALF)
    g.build_operation_graph()
    count = backend_engine.get_engine_count(g)
    assert count > 0
    entry = backend_engine.create_execution_plan(g, g_plans_first_engine(g), {})
    knobs = backend_engine.get_knobs_for_engine(g, entry.engine_id)
    assert all(k.min_value <= k.max_value for k in knobs)
    assert g.plans[-1] is entry and entry.source == "pinned"


def g_plans_first_engine(g):
    # the first engine heuristics A offers for this graph (any index would do when it builds)
    engine = backend_engine._engine()
    configs, reason = engine.lowered(g).query(enums.heur_mode.A)
    assert configs, reason
    return configs[0][1]["engine_id"]
