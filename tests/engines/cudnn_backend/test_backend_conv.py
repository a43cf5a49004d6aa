"""Convolutions on the cuDNN backend: the lowering (CPU), GPU runs against the reference engine (marked
``gpu``) and the conv / matmul fuzzers (their case generators on the CPU, a short run on the GPU).

Graphs come from bench/fuzz_conv.py's ``build(device, spec)``, so the tests and the fuzzer exercise
the same builder. Tolerances (max error relative to max(1, max |reference|)) by io type:
HALF 1e-2, BFLOAT16 5e-2, FLOAT 5e-3 (FLOAT leaves room for TF32 tensor cores).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph.engines.cudnn_backend import Ref, lower_program
from cudnn_graph.engines.cudnn_backend.lowering import ATTRIBUTE_TYPES
from _helpers import REPO_ROOT

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(REPO_ROOT / "bench"))
import _fuzz_common as fuzz_common  # noqa: E402
import fuzz_conv  # noqa: E402
import fuzz_matmul  # noqa: E402

F = cudnn.data_type
spec = fuzz_conv.make_spec

FWD = "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_"
BWD_DATA = "CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_"
BWD_FILTER = "CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_"
CONV = "CUDNN_ATTR_CONVOLUTION_"


def lowered(s):
    g, t = fuzz_conv.build("cuda", s)
    g.validate()
    return lower_program(g), g, t


def tensor_attrs(program, tensor):
    return program.step(program.tensor_steps[tensor.uid]).attrs


def conv_steps(program):
    (conv,) = program.of_kind("CONVOLUTION")
    return conv


# ---- CPU: what the lowering produces --------------------------------------------------------------

def test_fprop_lowers_to_a_convolution_and_a_forward_operation():
    s = spec(pre=[1, 0], post=[0, 2], stride=[1, 2], dilation=[2, 1])
    program, g, t = lowered(s)
    conv = conv_steps(program)
    assert conv == {
        CONV + "COMP_TYPE": DataType.FLOAT, CONV + "CONV_MODE": 1, CONV + "SPATIAL_DIMS": 2,
        CONV + "DILATIONS": (2, 1), CONV + "FILTER_STRIDES": (1, 2),
        CONV + "PRE_PADDINGS": (1, 0), CONV + "POST_PADDINGS": (0, 2)}
    (op,) = program.of_kind("OPERATION_CONVOLUTION_FORWARD")
    assert op[FWD + "X"] == Ref(program.tensor_steps[t["X"].uid])
    assert op[FWD + "W"] == Ref(program.tensor_steps[t["W"].uid])
    assert op[FWD + "Y"] == Ref(program.tensor_steps[t["Y"].uid])
    assert op[FWD + "CONV_DESC"] == Ref("conv_0")
    assert op[FWD + "ALPHA"] == 1.0 and op[FWD + "BETA"] == 0.0
    assert program.operations == ["op_0"]


def test_dgrad_and_wgrad_lower_to_their_backward_operations():
    program, _, t = lowered(spec(op="dgrad"))
    (op,) = program.of_kind("OPERATION_CONVOLUTION_BACKWARD_DATA")
    assert set(op) == {BWD_DATA + a for a in ("DX", "W", "DY", "CONV_DESC", "ALPHA", "BETA")}
    assert op[BWD_DATA + "DX"] == Ref(program.tensor_steps[t["DX"].uid])
    assert op[BWD_DATA + "DY"] == Ref(program.tensor_steps[t["DY"].uid])
    program, _, t = lowered(spec(op="wgrad"))
    (op,) = program.of_kind("OPERATION_CONVOLUTION_BACKWARD_FILTER")
    assert set(op) == {BWD_FILTER + a for a in ("DW", "X", "DY", "CONV_DESC", "ALPHA", "BETA")}
    assert op[BWD_FILTER + "DW"] == Ref(program.tensor_steps[t["DW"].uid])
    assert op[BWD_FILTER + "X"] == Ref(program.tensor_steps[t["X"].uid])


@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
def test_dims_stay_logical_and_strides_carry_the_layout(layout):
    program, _, t = lowered(spec(layout=layout, n=2, c=8, spatial=[5, 6]))
    x = tensor_attrs(program, t["X"])
    assert x["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 8, 5, 6)
    nhwc, nchw = (240, 1, 48, 8), (240, 30, 6, 1)
    assert x["CUDNN_ATTR_TENSOR_STRIDES"] == (nhwc if layout == "channels_last" else nchw)
    w = tensor_attrs(program, t["W"])
    assert w["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (16, 8, 3, 3)


def test_3d_convolution_keeps_rank_5():
    program, _, t = lowered(spec(nd=3, spatial=[4, 5, 6], filter=[3, 1, 2], pre=[1, 0, 1], post=[1, 0, 0],
                                 stride=[1, 2, 1], dilation=[1, 1, 2]))
    conv = conv_steps(program)
    assert conv[CONV + "SPATIAL_DIMS"] == 3
    assert conv[CONV + "FILTER_STRIDES"] == (1, 2, 1)
    assert conv[CONV + "DILATIONS"] == (1, 1, 2)
    assert conv[CONV + "PRE_PADDINGS"] == (1, 0, 1) and conv[CONV + "POST_PADDINGS"] == (1, 0, 0)
    x = tensor_attrs(program, t["X"])
    assert x["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 8, 4, 5, 6)
    assert x["CUDNN_ATTR_TENSOR_STRIDES"] == (960, 1, 240, 48, 8)   # NDHWC
    assert tensor_attrs(program, t["Y"])["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 16, 4, 3, 5)


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_groups_are_the_filter_channels_against_the_image_channels(op):
    program, _, t = lowered(spec(op=op, groups=4, c=8, k=12))
    w_name = "DW" if op == "wgrad" else "W"
    assert tensor_attrs(program, t[w_name])["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (12, 2, 3, 3)
    image = t["DX"] if op == "dgrad" else t["X"]
    assert tensor_attrs(program, image)["CUDNN_ATTR_TENSOR_DIMENSIONS"][1] == 8
    assert not any("GROUP" in attr for attr in conv_steps(program))


def test_engines_that_miscompute_grouped_3d_wgrad_are_barred():
    """cuDNN 9.19's engines 1 and 20 returned a wrong DW for a grouped 3-D wgrad on the H200 (engine 0
    was exact): the lowering keeps them out of such graphs' plans and says why."""
    grouped = dict(nd=3, spatial=[2, 4, 5], filter=[3, 2, 2], pre=[2, 0, 1], post=[2, 1, 1],
                   stride=[3, 1, 3], dilation=[2, 2, 1])
    program, _, _ = lowered(spec(op="wgrad", groups=2, c=4, k=8, **grouped))
    assert sorted(program.barred_engines) == [1, 20]
    assert "grouped 3-D conv_wgrad" in program.barred_engines[1]
    assert lowered(spec(op="wgrad", groups=1, c=4, k=8, **grouped))[0].barred_engines == {}
    assert lowered(spec(op="fprop", groups=2, c=4, k=8, **grouped))[0].barred_engines == {}
    assert lowered(spec(op="wgrad", groups=2, c=4, k=8))[0].barred_engines == {}


def test_convolution_mode_and_compute_type_follow_the_node():
    program, _, _ = lowered(spec(mode="CONVOLUTION"))
    assert conv_steps(program)[CONV + "CONV_MODE"] == 0
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    x = g.tensor(name="X", dim=[1, 8, 4, 4], stride=[128, 1, 32, 8])
    w = g.tensor(name="W", dim=[8, 8, 1, 1], stride=[8, 1, 8, 8])
    g.conv_fprop(x, w, padding=[0, 0], stride=[1, 1], dilation=[1, 1], compute_data_type=F.HALF).set_output(True)
    g.validate()
    assert conv_steps(lower_program(g))[CONV + "COMP_TYPE"] == DataType.HALF


def test_double_compute_is_declined_naming_the_node():
    g, _ = fuzz_conv.build("cuda", spec(io="DOUBLE", compute="DOUBLE"))
    g.validate()
    with pytest.raises(GraphNotSupportedError, match=r"conv_fprop_0.*DOUBLE"):
        lower_program(g)


def test_broadcast_image_is_declined_naming_the_tensor():
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    x = g.tensor(name="X", dim=[2, 8, 6, 6], stride=[0, 1, 48, 8])
    w = g.tensor(name="W", dim=[4, 8, 3, 3], stride=[72, 1, 24, 8])
    g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError, match=r"'X' broadcasts along axes \[0\]"):
        lower_program(g)


def test_conv_bias_relu_is_one_operation_graph():
    program, _, t = lowered(spec(epilogue=["bias", "relu"]))
    kinds = [program.step(name).kind for name in program.operations]
    assert kinds == ["CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR"] + \
        ["CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR"] * 2
    (conv_op,) = program.of_kind("OPERATION_CONVOLUTION_FORWARD")
    y = program.step(conv_op[FWD + "Y"].name).attrs
    assert y["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is True
    assert y["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT
    bias_op = program.step(program.operations[1]).attrs
    assert bias_op["CUDNN_ATTR_OPERATION_POINTWISE_XDESC"] == conv_op[FWD + "Y"]
    assert bias_op["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(program.tensor_steps[t["B"].uid])


def test_conv_reduction_dgrad_drelu_and_wgrad_scale_lower():
    program, _, t = lowered(spec(epilogue=["relu", "reduction"]))
    assert [program.step(n).kind.split("_")[3] for n in program.operations] == \
        ["CONVOLUTION", "POINTWISE", "REDUCTION"]
    (red,) = program.of_kind("OPERATION_REDUCTION")
    assert red["CUDNN_ATTR_OPERATION_REDUCTION_YDESC"] == Ref(program.tensor_steps[t["R"].uid])

    program, _, t = lowered(spec(op="dgrad", epilogue=["drelu"]))
    (dgrad,) = program.of_kind("OPERATION_CONVOLUTION_BACKWARD_DATA")
    (drelu,) = program.of_kind("OPERATION_POINTWISE")
    assert drelu["CUDNN_ATTR_OPERATION_POINTWISE_DYDESC"] == dgrad[BWD_DATA + "DX"]
    assert drelu["CUDNN_ATTR_OPERATION_POINTWISE_XDESC"] == Ref(program.tensor_steps[t["XR"].uid])
    assert drelu["CUDNN_ATTR_OPERATION_POINTWISE_DXDESC"] == Ref(program.tensor_steps[t["DX"].uid])

    program, _, _ = lowered(spec(op="wgrad", epilogue=["scale"]))
    assert len(program.operations) == 2


def test_conv_attributes_have_types_and_exist_in_the_header():
    import re
    header = (REPO_ROOT / "include" / "cudnn_graph" / "cudnn_backend.h").read_text()
    names = set(re.findall(r"^\s+(CUDNN_\w+)\s+=", header, re.M))
    program, _, _ = lowered(spec(epilogue=["bias"]))
    for wanted in ("CONVOLUTION", "OPERATION_CONVOLUTION_FORWARD"):
        (attrs,) = program.of_kind(wanted)
        for attr in attrs:
            assert attr in names and ATTRIBUTE_TYPES[attr] in names, attr
    for op in ("dgrad", "wgrad"):
        program, _, _ = lowered(spec(op=op))
        for step in program.steps:
            assert step.kind in names
            for attr in step.attrs:
                assert attr in names and ATTRIBUTE_TYPES[attr] in names, attr
    assert ATTRIBUTE_TYPES[FWD + "ALPHA"] == "CUDNN_TYPE_FLOAT"
    assert ATTRIBUTE_TYPES[CONV + "CONV_MODE"] == "CUDNN_TYPE_CONVOLUTION_MODE"


# ---- CPU: the fuzzers' case generators -------------------------------------------------------------

@pytest.mark.parametrize("fuzzer", [fuzz_conv, fuzz_matmul], ids=["conv", "matmul"])
def test_case_generators_are_deterministic_per_seed(fuzzer):
    a = fuzzer.generate_cases(7, 50)
    assert a == fuzzer.generate_cases(7, 50)
    assert a != fuzzer.generate_cases(8, 50)
    assert fuzzer.generate_cases(7, 10) == a[:10]
    for name, array in fuzzer.host_inputs(a[0]).items():
        np.testing.assert_array_equal(array, fuzzer.host_inputs(a[0])[name])


@pytest.mark.parametrize("fuzzer", [fuzz_conv, fuzz_matmul], ids=["conv", "matmul"])
def test_every_generated_graph_lowers_or_is_declined(fuzzer):
    lowered_count = 0
    for s in fuzzer.generate_cases(11, 150):
        g, _ = fuzzer.build("cuda", s)
        g.validate()
        try:
            program = lower_program(g)
        except GraphNotSupportedError as exc:
            assert str(exc), s["label"]
            continue
        lowered_count += 1
        assert program.operations, s["label"]
    assert lowered_count > 100


@pytest.mark.parametrize("fuzzer", [fuzz_conv, fuzz_matmul], ids=["conv", "matmul"])
def test_generated_cases_run_on_the_reference_engine(fuzzer):
    for s in fuzzer.generate_cases(3, 25):
        outs = fuzz_common.reference_outputs(fuzzer, s, fuzzer.host_inputs(s))
        for name in fuzzer.outputs(s):
            assert np.isfinite(np.asarray(outs[name], np.float64)).all(), s["label"]


def test_fuzz_harness_counts_passes_declines_and_failures(monkeypatch, tmp_path):
    """The harness with the host reference engine standing in for the GPU."""
    def fake_build(fuzzer, s):
        if s["io"] == "DOUBLE":
            g, _ = fuzzer.build("cuda", s)
            g.validate()
            lower_program(g)          # raises the lowering's decline
        if s.get("explode"):
            raise RuntimeError("boom")
        g, t = fuzzer.build("cpu", s)
        g.build([cudnn.heur_mode.A])
        return g, t

    def fake_gpu(fuzzer, s, inputs, graph=None):
        outs = fuzz_common.reference_outputs(fuzzer, s, inputs)
        if s.get("off"):
            outs = {k: v.astype(np.float32) + 1.0 for k, v in outs.items()}
        return outs, graph[0]

    monkeypatch.setattr(fuzz_common, "build_gpu", fake_build)
    monkeypatch.setattr(fuzz_common, "gpu_outputs", fake_gpu)
    cases = [spec(id=0), spec(id=1, io="DOUBLE", compute="DOUBLE"), spec(id=2, explode=True),
             spec(id=3, off=True), spec(id=4, nd=3, io="DOUBLE", compute="DOUBLE")]
    records = [fuzz_common.run_case(fuzz_conv, c) for c in cases]
    assert [r["outcome"] for r in records] == ["passed", "declined", "failed", "failed", "declined"]
    assert records[2]["error"] == "RuntimeError: boom"
    assert "max error" in records[3]["error"]
    summary = fuzz_common.summarize(fuzz_conv, 0, records)
    assert summary["passed"] == 1 and summary["failed"] == 2
    (reason, count), = summary["declined"].items()
    assert count == 2 and "compute type DOUBLE is not lowered" in reason and "conv_fprop_#" in reason
    text = fuzz_common.table(summary)
    assert "declined" in text and "RuntimeError: boom" in text
    path = fuzz_common.write_json(summary, tmp_path / "out.json")
    assert '"fuzzer": "fuzz_conv"' in path.read_text()


def test_reason_key_elides_numbers_and_skips_the_host_engine():
    from cudnn_graph.graph import PlanEntryError
    exc = PlanEntryError("no engine supports this graph", [
        ("reference", "the reference engine runs host graphs; this graph is on cuda"),
        ("cudnn_backend", "cuDNN's heuristics offered no engine for this graph (heuristics A: 12 engines)")])
    assert fuzz_common.reason_key(exc) == "cudnn_backend: cuDNN's heuristics offered no engine for this graph"
    exc = PlanEntryError("no plan of the list could be built", [
        ("eng12_k2=3", "cuDNN could not build eng12_k2=3: CUDNN_STATUS_NOT_SUPPORTED (3000)")])
    assert fuzz_common.reason_key(exc) == \
        "<plan>: cuDNN could not build <plan>: CUDNN_STATUS_NOT_SUPPORTED (#)"


# ---- GPU: against the reference engine -------------------------------------------------------------

TOL = fuzz_common.TOLERANCE


def conv_builder(device, spec):
    return fuzz_conv.build(device, spec)


def _compare(s, producer="cupy"):
    from gpu_support import compare
    host = fuzz_conv.host_inputs(s)
    return compare(conv_builder, host, set(fuzz_conv.outputs(s)), producer, tolerance=TOL[s["io"]], spec=s)


def _jax_gpu():
    from gpu_support import jax_gpu
    return jax_gpu()


def _compare_jax_channels_last(s):
    """JAX arrays are dense in their own shape: a channels-last input is a dense (N, [D,] H, W, C) JAX array
    whose memory is handed over (through its DLPack export) as the (N, C, [D,] H, W) tensor the graph
    declares. Outputs are CuPy arrays, as in gpu_support."""
    _jax_gpu()
    import jax.numpy as jnp
    import cupy as cp
    from gpu_support import _CupyBits, assert_close, build_gpu, cupy_from_host, empty_like_strided, host_dtype, \
        reference_run
    host = fuzz_conv.host_inputs(s)
    outs = set(fuzz_conv.outputs(s))
    want = reference_run(conv_builder, host, outs, spec=s)
    g, t = build_gpu(conv_builder, spec=s)
    order = fuzz_conv.layout_order(s)
    pack, keep, got = {}, [], {}
    for name, tensor in t.items():
        if name in outs:
            np_dtype = host_dtype(g.view.data_type(tensor))
            dev = cupy_from_host(cp, empty_like_strided(np_dtype, tensor.dim, tensor.stride))
            got[name] = (dev, np_dtype)
            pack[tensor] = _CupyBits(dev, np.dtype(np_dtype).name).slot()
        elif name in host:
            physical = np.ascontiguousarray(np.transpose(host[name], order))
            array = jnp.asarray(physical)
            array.block_until_ready()
            dense = cudnn.Slot.from_object(array)
            assert dense.shape == physical.shape
            pack[tensor] = cudnn.Slot.from_address(dense.data_ptr, tensor.dim, tensor.stride, dense.dtype,
                                                   dense.device)
            keep.append(array)
    g.execute(pack)
    cp.cuda.Device().synchronize()
    for name, (dev, np_dtype) in got.items():
        raw = cp.asnumpy(dev)
        raw = raw.view(np_dtype) if raw.dtype != np.dtype(np_dtype) else raw
        assert_close(raw, want[name], np.dtype(want[name].dtype).name, f"{name} (jax)", tolerance=TOL[s["io"]])
    return g


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["channels_last", "channels_first"], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("nd", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_conv_ops_with_cupy(op, nd, layout):
    size = [8, 8] if nd == 2 else [4, 5, 6]
    g = _compare(spec(op=op, nd=nd, layout=layout, spatial=size))
    assert g.selected_plan.engine.name == "cudnn_backend"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("geometry", [
    dict(stride=[2, 2]), dict(dilation=[2, 2], spatial=[9, 9]),
    dict(stride=[2, 1], dilation=[1, 2], pre=[0, 2], post=[1, 1], spatial=[9, 7]),
], ids=["stride", "dilation", "asymmetric_padding_stride_dilation"])
def test_conv_geometry_with_cupy(op, geometry):
    _compare(spec(op=op, **geometry))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["channels_last", "channels_first"], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_grouped_conv_with_cupy(op, layout):
    _compare(spec(op=op, layout=layout, groups=2, c=16, k=16))


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["HALF", "BFLOAT16", "FLOAT"])
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_conv_io_types_with_fp32_compute(op, io):
    _compare(spec(op=op, io=io))


@pytest.mark.gpu
def test_flipped_convolution_mode():
    _compare(spec(mode="CONVOLUTION", pre=[1, 0], post=[0, 1]))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_conv_ops_from_jax_nchw(op):
    _jax_gpu()
    _compare(spec(op=op, layout="channels_first"), producer="jax")


@pytest.mark.gpu
@pytest.mark.parametrize("nd", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_conv_ops_from_jax_channels_last(op, nd):
    size = [8, 8] if nd == 2 else [4, 5, 6]
    _compare_jax_channels_last(spec(op=op, nd=nd, spatial=size))


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
@pytest.mark.parametrize("epilogue", [["bias", "relu"], ["scale", "bias", "relu"]], ids=lambda e: "_".join(e))
def test_conv_bias_relu_fusion(epilogue, producer):
    s = spec(epilogue=epilogue)
    g = _compare(s) if producer == "cupy" else _compare_jax_channels_last(s)
    assert g.selected_plan.engine.name == "cudnn_backend"


@pytest.mark.gpu
def test_conv_reduction_fusion():
    _compare(spec(epilogue=["relu", "reduction"]))


@pytest.mark.gpu
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_dgrad_drelu_fusion(producer):
    s = spec(op="dgrad", epilogue=["drelu"])
    _compare(s) if producer == "cupy" else _compare_jax_channels_last(s)


@pytest.mark.gpu
def test_wgrad_epilogue_runs_or_is_declined_cleanly():
    s = spec(op="wgrad", epilogue=["scale"])
    try:
        _compare(s)
    except GraphNotSupportedError as exc:
        assert "cudnn_backend" in str(exc) or "cuDNN" in str(exc), str(exc)


@pytest.mark.gpu
@pytest.mark.parametrize("fuzzer", [fuzz_conv, fuzz_matmul], ids=["conv", "matmul"])
def test_fuzzer_short_run_has_no_failures(fuzzer):
    pytest.importorskip("cupy")
    summary = fuzz_common.run(fuzzer, seed=1, count=6)
    assert summary["cases"] == 6
    assert summary["failed"] == 0, fuzz_common.table(summary)
    assert summary["passed"] + sum(summary["declined"].values()) == 6
