"""Layout ops, block scale, rng and resample on the cuDNN backend.

CPU: the descriptor programs ``lower_program`` makes (attributes, the slice-as-pointer-offset path,
declines that name the cuDNN version), the new ops' schemas and reference kernels. GPU (``gpu``): the
same graphs on the H200 against the reference engine from CuPy and JAX; rng statistically.

Graphs cuDNN 9.19 may have no engine for are run "run or decline": a clean GraphNotSupportedError
from the cuDNN backend skips the test with cuDNN's reason (``-rs`` lists them); wrong numbers or any
other error fail it.
"""
from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph._cudnn_errors import CudnnVersionError
from cudnn_graph.data_type import DataType
from cudnn_graph.engines import ids
from cudnn_graph.engines.cudnn_backend import Ref, lower_program
from cudnn_graph.engines.cudnn_backend.lowering import ATTRIBUTE_TYPES, LOWERERS
from cudnn_graph.engines.reference import _kernels_sampling
from cudnn_graph.errors import GraphNotSupportedError, GraphValidationError
from cudnn_graph.ops._sampling import PaddingMode, ResampleMode

from gpu_support import (_CupyBits, assert_close, build_gpu, compare, cupy_from_host, empty_like_strided, gpu_run,
                         reference_run)
from gpu_support import nhwc as _nhwc, row_major as _row_major
from _helpers import REPO_ROOT

F = cudnn.data_type
V919, V922 = 91900, 92200
LAYOUT_OPS = ("reshape", "transpose", "slice", "concatenate", "block_scale_quantize", "block_scale_dequantize",
              "rng", "resample")


def _graph(device, io=F.HALF):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                         device=device, name="layout")


def _tensors(program):
    return {a["CUDNN_ATTR_TENSOR_UNIQUE_ID"]: a for a in program.of_kind("TENSOR")}


# ---- graph builders shared by the CPU and GPU tests --------------------------------------------------

def slice_matmul_graph(device, io=F.HALF):
    """C = A[:, 4:12, :16] @ B: the slice of a graph input feeds the matmul."""
    g = _graph(device, io)
    a = g.tensor(name="A", dim=(2, 16, 32), stride=(512, 32, 1))
    b = g.tensor(name="B", dim=(2, 16, 8), stride=(128, 8, 1))
    s = g.slice(a, slices=[slice(None), slice(4, 12), slice(0, 16)])
    c = g.matmul(s, b).set_output(True).set_name("C")
    return g, {"A": a, "B": b, "C": c}


def transpose_matmul_graph(device, io=F.HALF):
    """C = A @ transpose(Bt): Bt [b, n, k] seen as [b, k, n] (the attention K^T pattern)."""
    g = _graph(device, io)
    a = g.tensor(name="A", dim=(2, 16, 32), stride=(512, 32, 1))
    bt = g.tensor(name="Bt", dim=(2, 8, 32), stride=(256, 32, 1))
    c = g.matmul(a, g.transpose(bt, permutation=[0, 2, 1])).set_output(True).set_name("C")
    return g, {"A": a, "Bt": bt, "C": c}


def reshape_matmul_graph(device, io=F.HALF):
    """C = reshape(A_flat [1, 32, 32] -> [2, 16, 32]) @ B."""
    g = _graph(device, io)
    a = g.tensor(name="A", dim=(1, 32, 32), stride=(1024, 32, 1))
    b = g.tensor(name="B", dim=(2, 32, 8), stride=(256, 8, 1))
    r = g.reshape(a)
    r.set_dim([2, 16, 32]).set_stride([512, 32, 1])
    c = g.matmul(r, b).set_output(True).set_name("C")
    return g, {"A": a, "B": b, "C": c}


def reshape_pointwise_graph(device, io=F.FLOAT, standalone=False, computed=False):
    """Y = relu(reshape(X [2, 8, 64] -> [2, 16, 32])), or the reshape alone written to Y; with
    ``computed`` the reshape's input is relu(X), a tensor the graph computes."""
    g = _graph(device, io)
    x = g.tensor(name="X", dim=(2, 8, 64), stride=(512, 64, 1))
    r = g.reshape(g.relu(x) if computed else x)
    r.set_dim([2, 16, 32]).set_stride([512, 32, 1])
    y = r if standalone else g.relu(r)
    y.set_output(True).set_name("Y").set_data_type(io)
    return g, {"X": x, "Y": y}


def transpose_pointwise_graph(device, io=F.FLOAT, standalone=False):
    """Y = relu(transpose(X)) written row-major, or the transpose alone."""
    g = _graph(device, io)
    x = g.tensor(name="X", dim=(2, 8, 16), stride=(128, 16, 1))
    t = g.transpose(x, permutation=[0, 2, 1])
    y = t if standalone else g.relu(t)
    y.set_output(True).set_name("Y").set_data_type(io).set_stride([128, 8, 1])
    return g, {"X": x, "Y": y}


def concat_graph(device, io=F.FLOAT, fused=False, axis=1):
    """Y = concatenate([X0, X1], axis) (then relu when ``fused``)."""
    g = _graph(device, io)
    x0 = g.tensor(name="X0", dim=(2, 8, 16), stride=(128, 16, 1))
    x1 = g.tensor(name="X1", dim=(2, 8, 16), stride=(128, 16, 1))
    y = g.concatenate([x0, x1], axis=axis)
    if fused:
        y = g.relu(y)
    dims = [2, 8, 16]
    dims[axis] *= 2
    y.set_output(True).set_name("Y").set_data_type(io).set_stride(_row_major(dims))
    return g, {"X0": x0, "X1": x1, "Y": y}


def quantize_graph(device, block_size=32):
    """Y, scale = block_scale_quantize(X): fp32 in, FP8_E4M3 values and FP8_E8M0 scales (MXFP8)."""
    g = _graph(device, F.FLOAT)
    x = g.tensor(name="X", dim=(1, 64, 64), stride=(4096, 64, 1), data_type=F.FLOAT)
    y, scale = g.block_scale_quantize(x, block_size=block_size)
    y.set_output(True).set_name("Y").set_data_type(F.FP8_E4M3)
    scale.set_output(True).set_name("scale").set_data_type(F.FP8_E8M0)
    return g, {"X": x, "Y": y, "scale": scale}


def dequantize_matmul_graph(device):
    """C = dequantize(A, sa) @ dequantize(B, sb), FP8_E4M3 values with FP8_E8M0 scales per 32."""
    g = _graph(device, F.FLOAT)
    a = g.tensor(name="A", dim=(1, 64, 64), stride=(4096, 64, 1), data_type=F.FP8_E4M3)
    sa = g.tensor(name="sa", dim=(1, 64, 2), stride=(128, 2, 1), data_type=F.FP8_E8M0)
    b = g.tensor(name="B", dim=(1, 64, 32), stride=(2048, 1, 64), data_type=F.FP8_E4M3)
    sb = g.tensor(name="sb", dim=(1, 2, 32), stride=(64, 1, 2), data_type=F.FP8_E8M0)
    da = g.block_scale_dequantize(a, sa, block_size=[1, 32])
    db = g.block_scale_dequantize(b, sb, block_size=[32, 1])
    c = g.matmul(da, db).set_output(True).set_name("C").set_data_type(F.FLOAT)
    return g, {"A": a, "sa": sa, "B": b, "sb": sb, "C": c}


def rng_graph(device, seed=7, offset=0, p=0.3, dims=(4, 8, 32, 32), fused=False, device_seed=False):
    """Y = Bernoulli(p) draws (times X when ``fused``); seed / offset by value or as tensors."""
    g = _graph(device, F.FLOAT)
    t = {}
    if device_seed:
        seed_t = g.tensor(name="seed", dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=F.INT64)
        offset_t = g.tensor(name="offset", dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=F.INT64)
        t.update(seed=seed_t, offset=offset_t)
        seed, offset = seed_t, offset_t
    y = g.rng(seed, offset, bernoulli_probability=p, dim=list(dims), stride=list(_row_major(dims)))
    if fused:
        x = g.tensor(name="X", dim=dims, stride=_row_major(dims))
        t["X"] = x
        y = g.mul(y, x)
    y.set_output(True).set_name("Y").set_data_type(F.FLOAT)
    t["Y"] = y
    return g, t


def pool_graph(device, io=F.HALF, mode="MAXPOOL", layout="nhwc", window=(2, 2), stride=(2, 2),
               pre=(0, 0), post=(0, 0), generate_index=False, dims=(2, 8, 16, 16)):
    """Y (and index) = resample(X): 2-D pooling of an (N, C, H, W) tensor in NHWC or NCHW memory."""
    g = _graph(device, io)
    strides = _nhwc if layout == "nhwc" else _row_major
    x = g.tensor(name="X", dim=dims, stride=strides(dims))
    y, index = g.resample(x, resampling_mode=mode, window=list(window), stride=list(stride),
                          pre_padding=list(pre), post_padding=list(post), generate_index=generate_index)
    y.set_output(True).set_name("Y").set_data_type(io).set_stride(strides(tuple(y.dim)))
    t = {"X": x, "Y": y}
    if index is not None:
        index.set_output(True).set_name("index").set_data_type(F.INT8).set_stride(strides(tuple(y.dim)))
        t["index"] = index
    return g, t


def _validated(builder, **kwargs):
    g, t = builder("cuda", **kwargs)
    g.validate()
    return g, t


# ---- CPU: attribute and descriptor names --------------------------------------------------------------

def test_layout_lowerings_are_registered():
    assert set(LAYOUT_OPS) <= set(LOWERERS)
    assert all(LOWERERS[op].native_geometry for op in LAYOUT_OPS)
    assert LOWERERS["concatenate"].min_version == 90700
    assert LOWERERS["block_scale_quantize"].min_version == 90700
    assert LOWERERS["slice"].min_version == 0      # the pointer-offset path runs on 9.19


def _layout_programs():
    graphs = [_validated(b, **kw)[0] for b, kw in (
        (slice_matmul_graph, {}), (transpose_matmul_graph, {}), (reshape_pointwise_graph, {}),
        (transpose_pointwise_graph, {"standalone": True}), (concat_graph, {}), (quantize_graph, {}),
        (dequantize_matmul_graph, {}), (rng_graph, {}), (pool_graph, {"generate_index": True}))]
    for g in graphs:
        for version in (None, V919):
            try:
                yield lower_program(g, version=version)
            except CudnnVersionError:
                pass


def test_layout_attributes_and_descriptors_exist_in_the_header():
    header = (REPO_ROOT / "include" / "cudnn_graph" / "cudnn_backend.h").read_text()
    declared = set(re.findall(r"^\s+(CUDNN_\w+)\s+=", header, re.M))
    kinds, attrs = set(), set()
    for program in _layout_programs():
        for step in program.steps:
            kinds.add(step.kind)
            attrs.update(step.attrs)
    assert {"CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR", "CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR",
            "CUDNN_BACKEND_RESAMPLE_DESCRIPTOR", "CUDNN_BACKEND_RNG_DESCRIPTOR"} <= kinds
    assert sorted(kinds - declared) == [] and sorted(attrs - declared) == []
    assert sorted(a for a in attrs if ATTRIBUTE_TYPES[a] not in declared) == []


# ---- CPU: reshape and transpose -------------------------------------------------------------------------

def _view_of(program, view, source):
    """The descriptor of graph tensor ``view``, checked to be fed from ``source``'s pointer."""
    assert (view.uid, source.uid, 0) in program.aliases
    attrs = program.step(f"tensor_{view.uid}").attrs
    assert attrs["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is False
    return attrs


def _assert_view_of(program, view, source, dims, strides, data_type):
    """``view`` is lowered as a descriptor onto ``source``'s memory with these dims, strides and data type."""
    attrs = _view_of(program, view, source)
    assert attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] == dims
    assert attrs["CUDNN_ATTR_TENSOR_STRIDES"] == strides
    assert attrs["CUDNN_ATTR_TENSOR_DATA_TYPE"] == data_type


def _assert_input_view_is_read_in_place(builder, source, absent_kinds, consumer, operand, *view):
    """For every cuDNN version, the graph ``builder`` validates: its first node's output Y, a view of graph
    input ``source``, lowers to no operation of ``absent_kinds`` and is read by the one ``consumer``
    operation (its ``operand`` descriptor) through a descriptor onto ``source``'s memory (``*view``: dims,
    strides, data type)."""
    for version in (V919, V922, None):
        g, t = _validated(builder)
        program = lower_program(g, version=version)
        for kind in absent_kinds:
            assert program.of_kind(kind) == []
        (op,) = program.of_kind(f"OPERATION_{consumer}")
        y = g.nodes[0].outputs["Y"]
        assert op[f"CUDNN_ATTR_OPERATION_{consumer}_{operand}"] == Ref(f"tensor_{y.uid}")
        _assert_view_of(program, y, t[source], *view)


def test_reshape_of_a_graph_input_is_a_view_of_its_memory():
    _assert_input_view_is_read_in_place(reshape_pointwise_graph, "X", ["OPERATION_RESHAPE"], "POINTWISE", "XDESC",
                                        (2, 16, 32), (512, 32, 1), DataType.FLOAT)


def test_reshape_view_strides_follow_the_source_layout():
    g = _graph("cuda", F.HALF)
    x = g.tensor(name="X", dim=(4, 6, 8), stride=(8, 32, 1))   # axes 0 and 1 swapped in memory
    r = g.reshape(x, reshape_mode=cudnn.reshape_mode.LOGICAL)
    r.set_dim([4, 3, 2, 8]).set_stride([48, 16, 8, 1])          # splits axis 1: a view exists
    g.relu(r).set_output(True)
    g.validate()
    view = _view_of(lower_program(g, version=V919), r, x)
    assert view["CUDNN_ATTR_TENSOR_STRIDES"] == (8, 64, 32, 1)
    assert view["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.HALF   # the source's type, not the intermediate's


def test_reshape_written_to_memory_is_declined_before_9_22_saying_why():
    g, t = _validated(reshape_pointwise_graph, standalone=True)
    with pytest.raises(GraphNotSupportedError, match=r"'Y' copies data.*9\.22.*9\.19\.0 has no engine"):
        lower_program(g, version=V919)
    (op,) = lower_program(g, version=V922).of_kind("OPERATION_RESHAPE")
    assert op["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"] == Ref(f"tensor_{t['Y'].uid}")


def test_reshape_is_a_reshape_operation_with_its_mode_from_9_22():
    g, t = _validated(reshape_pointwise_graph, computed=True)
    old = lower_program(g, version=V919)
    (op,) = old.of_kind("OPERATION_RESHAPE")
    tensors = _tensors(old)
    relu_out = g.nodes[0].outputs["Y"]
    assert op == {"CUDNN_ATTR_OPERATION_RESHAPE_XDESC": Ref(f"tensor_{relu_out.uid}"),
                  "CUDNN_ATTR_OPERATION_RESHAPE_YDESC": op["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"]}
    y = tensors[int(op["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"].name.split("_")[1])]
    assert y["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 16, 32) and y["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]
    (new,) = lower_program(g, version=V922).of_kind("OPERATION_RESHAPE")
    assert new["CUDNN_ATTR_OPERATION_RESHAPE_MODE"] == cudnn.reshape_mode.VIEW_ONLY
    assert lower_program(g).of_kind("OPERATION_RESHAPE")[0]["CUDNN_ATTR_OPERATION_RESHAPE_MODE"] == 0


def test_logical_reshape_lowers_before_9_22_only_where_it_is_a_view():
    g = _graph("cuda", F.FLOAT)
    x = g.tensor(name="X", dim=(2, 8, 64), stride=(512, 64, 1))
    r = g.reshape(g.relu(x), reshape_mode=cudnn.reshape_mode.LOGICAL)
    r.set_dim([2, 16, 32]).set_stride([512, 32, 1])
    g.relu(r).set_output(True)
    g.validate()
    assert "CUDNN_ATTR_OPERATION_RESHAPE_MODE" not in lower_program(g, version=V919).of_kind("OPERATION_RESHAPE")[0]

    g = _graph("cuda", F.FLOAT)
    x = g.tensor(name="X", dim=(2, 8, 64), stride=(512, 1, 8))   # not row-major: no view of it is the reshape
    r = g.reshape(x, reshape_mode="LOGICAL", name="flat")
    r.set_dim([2, 16, 32]).set_stride([512, 32, 1])
    g.relu(r).set_output(True)
    g.validate()
    with pytest.raises(CudnnVersionError, match=r"node 'flat'.*9\.22\.0.*9\.19\.0"):
        lower_program(g, version=V919)
    assert lower_program(g, version=V922).of_kind("OPERATION_RESHAPE")[0][
        "CUDNN_ATTR_OPERATION_RESHAPE_MODE"] == cudnn.reshape_mode.LOGICAL


def test_transpose_of_a_graph_input_is_a_view_of_its_memory():
    _assert_input_view_is_read_in_place(transpose_matmul_graph, "Bt", ["OPERATION_TRANSPOSE", "OPERATION_RESHAPE"],
                                        "MATMUL", "BDESC", (2, 32, 8), (256, 1, 32), DataType.HALF)


def test_virtual_transpose_of_a_computed_tensor_is_a_view_reshape_with_permuted_strides():
    g = _graph("cuda", F.FLOAT)
    x = g.tensor(name="X", dim=(2, 8, 16), stride=(128, 16, 1))
    t = g.transpose(g.relu(x), permutation=[0, 2, 1])
    g.relu(t).set_output(True).set_stride([128, 8, 1])
    g.validate()
    program = lower_program(g, version=V919)
    assert program.aliases == []
    (op,) = program.of_kind("OPERATION_RESHAPE")
    view = program.step(op["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"].name).attrs
    assert view["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 16, 8)
    assert view["CUDNN_ATTR_TENSOR_STRIDES"] == (128, 1, 16)
    assert view["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is True


def test_rank2_transpose_permutation_moves_with_the_padding():
    g = _graph("cuda", F.FLOAT)
    x = g.tensor(name="X", dim=(8, 16), stride=(16, 1))
    t = g.transpose(x, permutation=[1, 0])
    g.relu(t).set_output(True).set_stride([8, 1])
    g.validate()
    view = _view_of(lower_program(g, version=V919), t, x)
    assert view["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 16, 8)
    assert view["CUDNN_ATTR_TENSOR_STRIDES"][1:] == (1, 16)


def test_transpose_written_to_memory_needs_the_9_22_transpose_operation():
    g, t = _validated(transpose_pointwise_graph, standalone=True)
    with pytest.raises(CudnnVersionError, match=r"transpose.*'Y' moves data.*9\.22\.0"):
        lower_program(g, version=V919)
    (op,) = lower_program(g, version=V922).of_kind("OPERATION_TRANSPOSE")
    assert op["CUDNN_ATTR_OPERATION_TRANSPOSE_PERMUTATION"] == (0, 2, 1)
    assert op["CUDNN_ATTR_OPERATION_TRANSPOSE_XDESC"] == Ref(f"tensor_{t['X'].uid}")
    assert op["CUDNN_ATTR_OPERATION_TRANSPOSE_YDESC"] == Ref(f"tensor_{t['Y'].uid}")


# ---- CPU: slice ----------------------------------------------------------------------------------------

def test_slice_of_a_graph_input_is_a_pointer_offset_before_9_22():
    g, t = _validated(slice_matmul_graph)
    program = lower_program(g, version=V919)
    assert program.of_kind("OPERATION_SLICE") == []
    (mm,) = program.of_kind("OPERATION_MATMUL")
    view_ref = mm["CUDNN_ATTR_OPERATION_MATMUL_ADESC"]
    view = program.step(view_ref.name).attrs
    view_uid = view["CUDNN_ATTR_TENSOR_UNIQUE_ID"]
    assert view["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is False
    assert view["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 8, 16)
    assert view["CUDNN_ATTR_TENSOR_STRIDES"] == (512, 32, 1)          # the source's strides
    assert view["CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"] == 16              # 4 rows * 32 * 2 bytes = 256
    assert program.aliases == [(view_uid, t["A"].uid, 4 * 32 * 2)]
    assert program.geometry[view_uid] == ((2, 8, 16), (512, 32, 1))


@pytest.mark.parametrize("start,step,offset,alignment", [(1, 1, 2, 2), (2, 1, 4, 4), (4, 2, 8, 8), (8, 1, 16, 16)])
def test_slice_view_promises_the_alignment_its_offset_keeps(start, step, offset, alignment):
    g = _graph("cuda", F.HALF)
    a = g.tensor(name="A", dim=(1, 16, 32), stride=(512, 32, 1))
    b = g.tensor(name="B", dim=(1, 8, 4), stride=(32, 4, 1))
    s = g.slice(a, slices=[slice(None), slice(0, 16), slice(start, start + 8 * step, step)])
    g.matmul(s, b).set_output(True)
    g.validate()
    program = lower_program(g, version=V919)
    ((view_uid, source, byte_offset),) = program.aliases
    view = _tensors(program)[view_uid]
    assert (source, byte_offset) == (a.uid, offset)
    assert view["CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT"] == alignment
    assert view["CUDNN_ATTR_TENSOR_STRIDES"] == (512, 32, step)


def test_slice_of_a_computed_tensor_needs_9_22():
    g = _graph("cuda", F.HALF)
    a = g.tensor(name="A", dim=(1, 16, 32), stride=(512, 32, 1))
    b = g.tensor(name="B", dim=(1, 8, 4), stride=(32, 4, 1))
    s = g.slice(g.relu(a), slices=[slice(None), slice(0, 8), slice(0, 8)], name="cut")
    g.matmul(s, b).set_output(True)
    g.validate()
    with pytest.raises(CudnnVersionError, match=r"node 'cut'.*graph computes.*9\.22\.0.*9\.19\.0"):
        lower_program(g, version=V919)
    assert len(lower_program(g, version=V922).of_kind("OPERATION_SLICE")) == 1


def test_slice_written_to_an_output_needs_9_22():
    g = _graph("cuda", F.HALF)
    a = g.tensor(name="A", dim=(2, 16, 32), stride=(512, 32, 1))
    g.slice(a, slices=[slice(None), slice(2, 10, 2)], name="cut").set_output(True).set_name("S")
    g.validate()
    with pytest.raises(CudnnVersionError, match=r"'S' copies data.*9\.22\.0"):
        lower_program(g, version=V919)


def test_native_slice_operation_from_9_22():
    g = _graph("cuda", F.HALF)
    a = g.tensor(name="A", dim=(16, 32), stride=(32, 1))
    g.slice(a, slices=[slice(2, 10, 2), slice(1, None)]).set_output(True)
    g.validate()
    program = lower_program(g, version=V922)
    (op,) = program.of_kind("OPERATION_SLICE")
    assert op["CUDNN_ATTR_OPERATION_SLICE_START_INDICES"] == (0, 2, 1)
    assert op["CUDNN_ATTR_OPERATION_SLICE_LIMIT_INDICES"] == (1, 10, 32)
    assert op["CUDNN_ATTR_OPERATION_SLICE_STRIDES"] == (1, 2, 1)
    assert program.aliases == []


# ---- CPU: concatenate, block scale ------------------------------------------------------------------------

def conv_concat_graph(device, n=2, c=16, k=16, hw=4):
    """Y1 = concatenate([conv_fprop(X, W) (1x1), Y0], channels, in_place_index=1): cudnn-frontend's
    conv-fprop + concatenate epilogue (cuDNN >= 9.8); Y0 is the input that already lies in Y1's memory."""
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.HALF, compute_data_type=F.FLOAT,
                      device=device, name="conv_concat")
    x = g.tensor(name="X", dim=(n, c, hw, hw), stride=_nhwc((n, c, hw, hw)))
    w = g.tensor(name="W", dim=(k, c, 1, 1), stride=_nhwc((k, c, 1, 1)))
    y0 = g.tensor(name="Y0", dim=(n, k, hw, hw), stride=_nhwc((n, k, hw, hw)))
    y = g.conv_fprop(image=x, weight=w, padding=[0, 0], stride=[1, 1], dilation=[1, 1])
    y1 = g.concatenate([y, y0], axis=1, in_place_index=1)
    y1.set_output(True).set_name("Y1").set_data_type(F.HALF).set_stride(_nhwc((n, 2 * k, hw, hw)))
    return g, {"X": x, "W": w, "Y0": y0, "Y1": y1}


def test_concatenate_outside_a_conv_epilogue_is_declined_before_9_22_saying_why():
    g, _ = _validated(concat_graph, fused=True)
    with pytest.raises(CudnnVersionError, match=r"outside a convolution-forward epilogue.*9\.22\.0.*9\.19\.0"):
        lower_program(g, version=V919)
    g, t = _validated(conv_concat_graph)
    program = lower_program(g, version=V919)
    (op,) = program.of_kind("OPERATION_CONCAT")
    assert op["CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX"] == 1
    assert op["CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS"][1] == Ref(f"tensor_{t['Y0'].uid}")


def test_concatenate_program_and_its_version_gate():
    g, t = _validated(concat_graph, axis=2)
    (op,) = lower_program(g, version=V922).of_kind("OPERATION_CONCAT")
    assert op == {"CUDNN_ATTR_OPERATION_CONCAT_AXIS": 2,
                  "CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS": (Ref(f"tensor_{t['X0'].uid}"), Ref(f"tensor_{t['X1'].uid}")),
                  "CUDNN_ATTR_OPERATION_CONCAT_OUTPUT_DESC": Ref(f"tensor_{t['Y'].uid}")}
    with pytest.raises(CudnnVersionError, match=r"concatenate.*9\.7\.0"):
        lower_program(g, version=90600)

    g = _graph("cuda", F.FLOAT)
    x0 = g.tensor(name="X0", dim=(8, 16), stride=(16, 1))
    x1 = g.tensor(name="X1", dim=(4, 16), stride=(16, 1))
    g.concatenate([x0, x1], axis=0, in_place_index=1).set_output(True)
    g.validate()
    (op,) = lower_program(g).of_kind("OPERATION_CONCAT")
    assert op["CUDNN_ATTR_OPERATION_CONCAT_AXIS"] == 1                  # moved by the padded unit axis
    assert op["CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX"] == 1


def test_block_scale_quantize_program():
    g, t = _validated(quantize_graph)
    (op,) = lower_program(g, version=V919).of_kind("OPERATION_BLOCK_SCALE_QUANTIZE")
    assert op == {"CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_XDESC": Ref(f"tensor_{t['X'].uid}"),
                  "CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_YDESC": Ref(f"tensor_{t['Y'].uid}"),
                  "CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_SCALE_DESC": Ref(f"tensor_{t['scale'].uid}"),
                  "CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_MATH_PREC": DataType.FLOAT,
                  "CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_BLOCK_SIZE": 32}
    assert ATTRIBUTE_TYPES["CUDNN_ATTR_OPERATION_BLOCK_SCALE_QUANTIZE_BLOCK_SIZE"] == "CUDNN_TYPE_INT32"
    scale = _tensors(lower_program(g))[t["scale"].uid]
    assert scale["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 64, 2)
    assert scale["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FP8_E8M0
    with pytest.raises(CudnnVersionError, match=r"9\.7\.0"):
        lower_program(g, version=90600)


def test_block_scale_dequantize_program_and_negative_scales():
    g, t = _validated(dequantize_matmul_graph)
    ops = lower_program(g).of_kind("OPERATION_BLOCK_SCALE_DEQUANTIZE")
    assert [op["CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_BLOCK_SIZE"] for op in ops] == [(1, 32), (32, 1)]
    assert ops[0]["CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_SCALE_DESC"] == Ref(f"tensor_{t['sa'].uid}")
    assert ops[0]["CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_NEG_SCALE"] is False
    assert ops[0]["CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_MATH_PREC"] == DataType.FLOAT
    old = lower_program(g, version=91300).of_kind("OPERATION_BLOCK_SCALE_DEQUANTIZE")
    assert all("CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_NEG_SCALE" not in op for op in old)

    g = _graph("cuda", F.FLOAT)
    a = g.tensor(name="A", dim=(1, 8, 32), stride=(256, 32, 1), data_type=F.FP8_E4M3)
    sa = g.tensor(name="sa", dim=(1, 8, 1), stride=(8, 1, 1), data_type=F.FP8_E8M0)
    b = g.tensor(name="B", dim=(1, 32, 8), stride=(256, 8, 1), data_type=F.HALF)
    d = g.block_scale_dequantize(a, sa, block_size=[1, 32], is_negative_scale=True, name="dq")
    g.matmul(d, b).set_output(True)
    g.validate()
    with pytest.raises(CudnnVersionError, match=r"node 'dq'.*is_negative_scale.*9\.14\.0"):
        lower_program(g, version=91300)
    assert lower_program(g, version=V919).of_kind("OPERATION_BLOCK_SCALE_DEQUANTIZE")[0][
        "CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_NEG_SCALE"] is True


def test_dequantize_into_memory_is_declined():
    g = _graph("cuda", F.FLOAT)
    a = g.tensor(name="A", dim=(1, 8, 32), stride=(256, 32, 1), data_type=F.FP8_E4M3)
    sa = g.tensor(name="sa", dim=(1, 8, 1), stride=(8, 1, 1), data_type=F.FP8_E8M0)
    g.block_scale_dequantize(a, sa, block_size=[1, 32], name="dq").set_output(True).set_name("D")
    g.validate()
    with pytest.raises(GraphNotSupportedError, match=r"node 'dq'.*'D' must be virtual"):
        lower_program(g, version=V919)


# ---- CPU: rng and resample --------------------------------------------------------------------------------

def test_rng_program_with_seed_and_offset_by_value():
    g, t = _validated(rng_graph, seed=11, offset=5, p=0.25)
    program = lower_program(g, version=V919)
    (rng,) = program.of_kind("RNG")
    assert rng == {"CUDNN_ATTR_RNG_DISTRIBUTION": 0, "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": 0.25}
    (op,) = program.of_kind("OPERATION_RNG")
    assert op["CUDNN_ATTR_OPERATION_RNG_YDESC"] == Ref(f"tensor_{t['Y'].uid}")
    assert op["CUDNN_ATTR_OPERATION_RNG_DESC"] == Ref("rng_0")
    tensors = _tensors(program)
    seed = tensors[int(op["CUDNN_ATTR_OPERATION_RNG_SEED"].name.split("_")[1])]
    offset = tensors[int(op["CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC"].name.split("_")[1])]
    for scalar in (seed, offset):
        assert scalar["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
        assert scalar["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.INT64
        assert scalar["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 1, 1, 1)
    assert sorted(v for _, _, v in program.constants) == [5, 11]
    assert ATTRIBUTE_TYPES["CUDNN_ATTR_OPERATION_RNG_SEED"] == "CUDNN_TYPE_BACKEND_DESCRIPTOR"


def test_rng_with_seed_tensors():
    g, t = _validated(rng_graph, device_seed=True)
    (op,) = lower_program(g).of_kind("OPERATION_RNG")
    assert op["CUDNN_ATTR_OPERATION_RNG_SEED"] == Ref(f"tensor_{t['seed'].uid}")
    assert op["CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC"] == Ref(f"tensor_{t['offset'].uid}")


def test_rng_schema_checks():
    g = _graph("cuda", F.FLOAT)
    with pytest.raises(GraphValidationError, match="bernoulli_probability"):
        g.rng(1, 2, bernoulli_probability=1.5, dim=[4])
    g = _graph("cuda", F.FLOAT)
    g.rng(1, 2, dim=[4, 4], name="r").set_output(True)
    with pytest.raises(GraphValidationError, match="bernoulli_probability.*required"):
        g.validate()
    g = _graph("cuda", F.FLOAT)
    s = g.tensor(name="s", dim=(1,), stride=(1,), data_type=F.FLOAT)
    g.rng(s, 2, bernoulli_probability=0.5, dim=[4, 4]).set_output(True)
    with pytest.raises(GraphValidationError, match="INT64"):
        g.validate()
    g = _graph("cuda", F.FLOAT)
    g.rng(1, 2, distribution="NORMAL", bernoulli_probability=0.5, dim=[4]).set_output(True)
    with pytest.raises(GraphNotSupportedError, match="only BERNOULLI"):
        g.validate()


def test_rng_default_strides_put_axis_1_innermost():
    g = _graph("cuda", F.FLOAT)
    y = g.rng(1, 2, bernoulli_probability=0.5, dim=[2, 3, 4, 5]).set_output(True)
    g.validate()
    assert y.stride == (60, 1, 15, 3)


def test_resample_program():
    g, t = _validated(pool_graph, mode="AVGPOOL_EXCLUDE_PADDING", window=(3, 3), stride=(2, 2),
                      pre=(1, 1), post=(1, 0))
    assert t["Y"].dim == (2, 8, 8, 8)
    program = lower_program(g, version=V919)
    (desc,) = program.of_kind("RESAMPLE")
    assert desc == {
        "CUDNN_ATTR_RESAMPLE_MODE": ResampleMode.AVGPOOL_EXCLUDE_PADDING,
        "CUDNN_ATTR_RESAMPLE_COMP_TYPE": DataType.FLOAT,
        "CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION": 1,
        "CUDNN_ATTR_RESAMPLE_PADDING_MODE": PaddingMode.ZERO_PAD,
        "CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS": 2,
        "CUDNN_ATTR_RESAMPLE_WINDOW_DIMS": ((3, 1), (3, 1)),
        "CUDNN_ATTR_RESAMPLE_PRE_PADDINGS": ((1, 1), (1, 1)),
        "CUDNN_ATTR_RESAMPLE_POST_PADDINGS": ((1, 1), (0, 1)),
        "CUDNN_ATTR_RESAMPLE_STRIDES": ((2, 1), (2, 1)),
    }
    (op,) = program.of_kind("OPERATION_RESAMPLE_FWD")
    assert op["CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC"] == Ref(f"tensor_{t['X'].uid}")
    assert op["CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC"] == Ref(f"tensor_{t['Y'].uid}")
    assert op["CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC"] == Ref("resample_0")
    assert "CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC" not in op
    for attr in ("WINDOW_DIMS", "PRE_PADDINGS", "POST_PADDINGS", "STRIDES"):
        assert ATTRIBUTE_TYPES["CUDNN_ATTR_RESAMPLE_" + attr] == "CUDNN_TYPE_FRACTION"


def test_max_pooling_index_output_only_when_asked():
    g, t = _validated(pool_graph, mode="MAXPOOL", generate_index=True)
    program = lower_program(g, version=V919)
    (op,) = program.of_kind("OPERATION_RESAMPLE_FWD")
    assert op["CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC"] == Ref(f"tensor_{t['index'].uid}")
    assert program.of_kind("RESAMPLE")[0]["CUDNN_ATTR_RESAMPLE_PADDING_MODE"] == PaddingMode.NEG_INF_PAD
    assert _tensors(program)[t["index"].uid]["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.INT8
    g = _graph("cuda")
    x = g.tensor(name="X", dim=(1, 2, 4, 4), stride=(32, 16, 4, 1))
    y, index = g.resample(x, resampling_mode="AVGPOOL_INCLUDE_PADDING", window=[2, 2], stride=[2, 2],
                          generate_index=True)
    assert index is None and y.dim == (1, 2, 2, 2)


def test_resample_schema_checks():
    g = _graph("cuda")
    x = g.tensor(name="X", dim=(1, 2, 4, 4), stride=(32, 16, 4, 1))
    g.resample(x, resampling_mode="MAXPOOL", window=[2], name="p")[0].set_output(True)
    with pytest.raises(GraphValidationError, match="window.*2 entries"):
        g.validate()
    g = _graph("cuda")
    x = g.tensor(name="X", dim=(1, 2, 4, 4), stride=(32, 16, 4, 1))
    g.resample(x, resampling_mode="MAXPOOL", window=[5, 5])[0].set_output(True)
    with pytest.raises(GraphValidationError, match="smaller than the window"):
        g.validate()
    g = _graph("cuda")
    x = g.tensor(name="X", dim=(1, 2, 4, 4), stride=(32, 16, 4, 1))
    g.resample(x, resampling_mode="BILINEAR", window=[2, 2])[0].set_output(True)
    with pytest.raises(GraphNotSupportedError, match="pooling"):
        g.validate()


# ---- CPU: reference kernels --------------------------------------------------------------------------------

def _pool_by_loops(x, mode, window, stride, pre, post):
    n, c, h, w = x.shape
    oh = 1 + (h + pre[0] + post[0] - window[0]) // stride[0]
    ow = 1 + (w + pre[1] + post[1] - window[1]) // stride[1]
    y = np.zeros((n, c, oh, ow))
    index = np.zeros((n, c, oh, ow), np.int64)
    for b, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        values, inside = [], []
        for di, dj in itertools.product(range(window[0]), range(window[1])):
            r, s = i * stride[0] - pre[0] + di, j * stride[1] - pre[1] + dj
            ok = 0 <= r < h and 0 <= s < w
            inside.append(ok)
            values.append(float(x[b, ch, r, s]) if ok else (-math.inf if mode == "MAXPOOL" else 0.0))
        if mode == "MAXPOOL":
            y[b, ch, i, j] = max(values)
            index[b, ch, i, j] = values.index(max(values))
        elif mode == "AVGPOOL_INCLUDE_PADDING":
            y[b, ch, i, j] = sum(values) / len(values)
        else:
            y[b, ch, i, j] = sum(v for v, ok in zip(values, inside) if ok) / max(sum(inside), 1)
    return y, index


@pytest.mark.parametrize("mode", ["MAXPOOL", "AVGPOOL_INCLUDE_PADDING", "AVGPOOL_EXCLUDE_PADDING"])
@pytest.mark.parametrize("geometry", [((2, 2), (2, 2), (0, 0), (0, 0)), ((3, 3), (2, 1), (1, 1), (1, 0)),
                                      ((2, 3), (1, 2), (0, 1), (1, 1))], ids=["2x2s2", "3x3pad", "2x3mixed"])
def test_reference_pooling_matches_explicit_loops(mode, geometry):
    window, stride, pre, post = geometry
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 6)).astype(np.float32)
    want, want_index = _pool_by_loops(x, mode, window, stride, pre, post)
    attrs = {"resampling_mode": ResampleMode[mode], "window": window, "stride": stride, "pre_padding": pre,
             "post_padding": post, "padding_mode": None, "generate_index": mode == "MAXPOOL",
             "nan_propagation": True}
    outputs = {"Y": (want.shape, np.float32)}
    if mode == "MAXPOOL":
        outputs["index"] = (want.shape, np.int8)
    got = _kernels_sampling.KERNELS["resample"]({"input": x}, attrs, outputs, np.float32)
    np.testing.assert_allclose(got["Y"], want, rtol=1e-6, atol=1e-6)
    if mode == "MAXPOOL":
        np.testing.assert_array_equal(got["index"], want_index)


def test_reference_max_pooling_nan_propagation():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = np.nan
    attrs = {"resampling_mode": ResampleMode.MAXPOOL, "window": (2, 2), "stride": (2, 2)}
    out = {"Y": ((1, 1, 2, 2), np.float32)}
    assert np.isnan(_kernels_sampling.resample({"input": x}, attrs, out)["Y"][0, 0, 0, 0])
    kept = _kernels_sampling.resample({"input": x}, dict(attrs, nan_propagation=False), out)["Y"]
    assert kept[0, 0, 0, 0] == 5.0


def test_reference_rng_is_bernoulli_and_keyed_by_seed_and_offset():
    def draw(seed, offset, p=0.3):
        return _kernels_sampling.rng({"seed": np.array([seed]), "offset": np.array([offset])},
                                     {"bernoulli_probability": p}, {"Y": ((64, 64), np.float32)})["Y"]
    a = draw(1, 0)
    assert set(np.unique(a)) <= {0.0, 1.0} and abs(a.mean() - 0.3) < 0.03
    np.testing.assert_array_equal(a, draw(1, 0))
    assert (a != draw(2, 0)).mean() > 0.2 and (a != draw(1, 1)).mean() > 0.2
    assert draw(5, 0, p=0.0).sum() == 0 and draw(5, 0, p=1.0).mean() == 1.0


def test_reference_engine_runs_pooling_and_rng_graphs():
    x = np.random.default_rng(4).standard_normal((2, 8, 16, 16)).astype(np.float16)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = reference_run(pool_graph, {"X": nhwc}, {"Y"}, mode="MAXPOOL")["Y"]
    np.testing.assert_array_equal(out, x.reshape(2, 8, 8, 2, 8, 2).max(axis=(3, 5)))
    y = reference_run(rng_graph, {}, {"Y"}, dims=(2, 3, 8, 8))["Y"]
    assert set(np.unique(y)) <= {0.0, 1.0}


# ---- GPU ---------------------------------------------------------------------------------------------------

PRODUCERS = ["cupy", "jax"]


def _assert_on_cudnn(g):
    assert ids.family_of(g.selected_plan.engine_id) == "cudnn", g.selected_plan


def _run_or_decline(fn, what):
    """Run ``fn``; a clean decline of the cuDNN backend skips, naming cuDNN's reason."""
    try:
        return fn()
    except GraphNotSupportedError as exc:
        text = str(exc)
        assert "cudnn_backend" in text or "cuDNN" in text, text
        pytest.skip(f"cuDNN declines {what}: {_cudnn_decline(exc)}")


def _compare_on_cudnn_or_decline(builder, host, out_names, producer, what, **kw):
    """``compare`` that must run on the cuDNN backend; a clean decline skips (``_run_or_decline``)."""
    g = _run_or_decline(lambda: compare(builder, host, out_names, producer, **kw), what)
    _assert_on_cudnn(g)


def _cudnn_decline(exc) -> str:
    """The cuDNN backend's own reasons (PlanEntryError.declines) on one line, else the message."""
    reasons = [f"{who}: {why}" for who, why in getattr(exc, "declines", ()) if "cudnn" in str(who).lower()]
    return " | ".join(" ".join(r.split()) for r in (reasons or [str(exc)]))


def _half(rng, dims, scale=1.0):
    return (scale * rng.standard_normal(dims)).astype(np.float16)


# A view feeding a matmul: view -> (graph, seed, the half inputs' dims (drawn in this order, scale 0.5), what a
# clean decline is reported as; None: the cuDNN backend must run it).
MATMUL_VIEW_CASES = {
    "slice": (slice_matmul_graph, 10, {"A": (2, 16, 32), "B": (2, 16, 8)}, None),
    "virtual_transpose": (transpose_matmul_graph, 11, {"A": (2, 16, 32), "Bt": (2, 8, 32)}, "matmul(A, transpose(B))"),
    "reshape": (reshape_matmul_graph, 12, {"A": (1, 32, 32), "B": (2, 32, 8)}, "matmul(reshape(A), B)"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize("view", list(MATMUL_VIEW_CASES))
def test_gpu_view_feeding_a_matmul(view, producer):
    builder, seed, dims, what = MATMUL_VIEW_CASES[view]
    rng = np.random.default_rng(seed)
    host = {name: _half(rng, d, 0.5) for name, d in dims.items()}
    if what is None:
        _assert_on_cudnn(compare(builder, host, {"C"}, producer))
    else:
        _compare_on_cudnn_or_decline(builder, host, {"C"}, producer, what)


@pytest.mark.gpu
@pytest.mark.parametrize("standalone", [False, True], ids=["fused_relu", "standalone"])
@pytest.mark.parametrize("producer", PRODUCERS)
def test_gpu_reshape_with_pointwise(producer, standalone):
    host = {"X": np.random.default_rng(13).standard_normal((2, 8, 64)).astype(np.float32)}
    _compare_on_cudnn_or_decline(reshape_pointwise_graph, host, {"Y"}, producer,
                                 f"reshape ({'standalone' if standalone else 'then relu'})", standalone=standalone)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", PRODUCERS)
def test_gpu_transpose_then_relu(producer):
    host = {"X": np.random.default_rng(14).standard_normal((2, 8, 16)).astype(np.float32)}
    _compare_on_cudnn_or_decline(transpose_pointwise_graph, host, {"Y"}, producer, "relu(transpose(X))")


@pytest.mark.gpu
def test_gpu_transpose_into_memory_is_declined_on_9_19():
    g, _ = transpose_pointwise_graph("cuda", standalone=True)
    with pytest.raises(GraphNotSupportedError, match=r"9\.22"):
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["standalone", "fused_relu"])
@pytest.mark.parametrize("producer", PRODUCERS)
def test_gpu_concatenate(producer, fused):
    rng = np.random.default_rng(15)
    host = {"X0": rng.standard_normal((2, 8, 16)).astype(np.float32),
            "X1": rng.standard_normal((2, 8, 16)).astype(np.float32)}
    _compare_on_cudnn_or_decline(concat_graph, host, {"Y"}, producer,
                                 f"concatenate ({'then relu' if fused else 'standalone'})", fused=fused)


@pytest.mark.gpu
@pytest.mark.parametrize("producer", PRODUCERS)
def test_gpu_conv_fprop_concatenate_in_place(producer):
    """The output buffer holds Y0 in its in-place slot before execute (what the in-place index
    promises), so the result is right whether cuDNN copies Y0 or leaves that slot alone."""
    cp = pytest.importorskip("cupy")
    from gpu_support import _device_input
    # JAX hands over dense arrays only: 1x1 images are channels-last and row-major at once.
    n, c, k, hw = (2, 16, 16, 4) if producer == "cupy" else (8, 16, 16, 1)
    rng = np.random.default_rng(20)

    def nhwc(dims, scale=1.0):
        a = (scale * rng.standard_normal((dims[0], dims[2], dims[3], dims[1]))).astype(np.float16)
        return a.transpose(0, 3, 1, 2)

    host = {"X": nhwc((n, c, hw, hw)), "W": nhwc((k, c, 1, 1), 0.25), "Y0": nhwc((n, k, hw, hw))}
    kwargs = dict(n=n, c=c, k=k, hw=hw)
    want = reference_run(conv_concat_graph, host, {"Y1"}, **kwargs)["Y1"]
    g, t = _run_or_decline(lambda: build_gpu(conv_concat_graph, **kwargs), "conv_fprop + concatenate (in place)")
    _assert_on_cudnn(g)
    y1_host = empty_like_strided(np.float16, t["Y1"].dim, t["Y1"].stride)
    y1_host[:, k:] = host["Y0"]
    y1 = cupy_from_host(cp, y1_host)
    pack, keep = {t["Y1"]: y1}, []
    for name in ("X", "W", "Y0"):
        dev, alive = _device_input(producer, host[name])
        pack[t[name]] = dev
        keep.append(alive)
    g.execute(pack)
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(y1), want, "float16", f"Y1 ({producer})")


@pytest.mark.gpu
@pytest.mark.parametrize("io", [F.HALF, F.FLOAT], ids=["fp16", "fp32"])
@pytest.mark.parametrize("mode,window,stride,pre,post", [
    ("MAXPOOL", (2, 2), (2, 2), (0, 0), (0, 0)),
    ("AVGPOOL_INCLUDE_PADDING", (3, 3), (2, 2), (1, 1), (1, 1)),
    ("AVGPOOL_EXCLUDE_PADDING", (3, 3), (2, 2), (1, 1), (1, 1)),
], ids=["max2x2", "avg_incl3x3", "avg_excl3x3"])
@pytest.mark.parametrize("producer,layout", [("cupy", "nhwc"), ("jax", "nchw")])
def test_gpu_pooling(producer, layout, mode, window, stride, pre, post, io):
    x = np.random.default_rng(16).standard_normal((2, 8, 16, 16)).astype(np.float16 if io == F.HALF else np.float32)
    if layout == "nhwc":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    kwargs = dict(io=io, mode=mode, layout=layout, window=window, stride=stride, pre=pre, post=post)
    if layout == "nchw":   # cuDNN's pooling engines favour NHWC; NCHW may have none
        g = _run_or_decline(lambda: compare(pool_graph, {"X": x}, {"Y"}, producer, **kwargs), f"{mode} NCHW")
    else:
        g = compare(pool_graph, {"X": x}, {"Y"}, producer, **kwargs)
    _assert_on_cudnn(g)


@pytest.mark.gpu
def test_gpu_max_pooling_index_points_at_the_maximum():
    x = np.random.default_rng(17).standard_normal((2, 8, 16, 16)).astype(np.float16)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    kwargs = dict(mode="MAXPOOL", generate_index=True)
    want = reference_run(pool_graph, {"X": x}, {"Y", "index"}, **kwargs)
    got, g = _run_or_decline(lambda: gpu_run(pool_graph, {"X": x}, {"Y", "index"}, "cupy", **kwargs),
                             "max pooling with an index output")
    _assert_on_cudnn(g)
    assert_close(got["Y"], want["Y"], "float16", "Y")
    # The index numbers the window's elements row-major (as the reference does); say so if cuDNN differs.
    np.testing.assert_array_equal(got["index"], want["index"], err_msg="cuDNN's index numbering differs")


@pytest.mark.gpu
@pytest.mark.parametrize("producer,fused", [("cupy", False), ("cupy", True), ("jax", True)],
                         ids=["standalone", "fused_cupy", "fused_jax"])
def test_gpu_rng_draws_are_bernoulli(producer, fused):
    p, dims = 0.3, (4, 8, 32, 32)
    host = {"X": np.ones(dims, np.float32)} if fused else {}
    got, g = _run_or_decline(lambda: gpu_run(rng_graph, host, {"Y"}, producer, seed=7, p=p, dims=dims, fused=fused),
                             f"rng ({'times X' if fused else 'standalone'})")
    _assert_on_cudnn(g)
    y = got["Y"]
    assert set(np.unique(y)) <= {0.0, 1.0}
    assert abs(float(y.mean()) - p) < 0.02          # 32768 draws: the mean's sd is 0.0025


@pytest.mark.gpu
def test_gpu_rng_seed_and_offset_tensors_make_it_repeatable():
    cp = pytest.importorskip("cupy")
    dims = (4, 8, 32, 32)
    g, t = _run_or_decline(lambda: build_gpu(rng_graph, device_seed=True, p=0.6, dims=dims), "rng with seed tensors")
    _assert_on_cudnn(g)

    def draw(seed, offset):
        y = cp.full(dims, -1.0, cp.float32)
        g.execute({t["seed"]: cp.full((1, 1, 1, 1), seed, cp.int64),
                   t["offset"]: cp.full((1, 1, 1, 1), offset, cp.int64), t["Y"]: y})
        cp.cuda.Device().synchronize()
        return cp.asnumpy(y)

    first = draw(3, 0)
    assert set(np.unique(first)) <= {0.0, 1.0} and abs(float(first.mean()) - 0.6) < 0.02
    np.testing.assert_array_equal(first, draw(3, 0))
    assert (first != draw(4, 0)).mean() > 0.2
    assert (first != draw(3, 1)).mean() > 0.0


@pytest.mark.gpu
def test_gpu_block_scale_quantize_runs_or_declines_cleanly():
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    x = np.random.default_rng(18).standard_normal((1, 64, 64)).astype(np.float32)
    g, t = _run_or_decline(lambda: build_gpu(quantize_graph), "block_scale_quantize (MXFP8)")
    _assert_on_cudnn(g)
    # gpu_support has no FP8_E8M0 host type: the outputs are raw bytes described by name.
    y = cupy_from_host(cp, empty_like_strided(np.uint8, t["Y"].dim, t["Y"].stride))
    scale = cupy_from_host(cp, empty_like_strided(np.uint8, t["scale"].dim, t["scale"].stride))
    g.execute({t["X"]: cp.asarray(x), t["Y"]: _CupyBits(y, "float8_e4m3fn").slot(),
               t["scale"]: _CupyBits(scale, "float8_e8m0fnu").slot()})
    cp.cuda.Device().synchronize()
    values = cp.asnumpy(y).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = np.repeat(cp.asnumpy(scale).view(ml_dtypes.float8_e8m0fnu).astype(np.float32), 32, axis=2)
    # Whatever cuDNN's scale rounding, the scaled values give X back to FP8_E4M3's precision.
    np.testing.assert_allclose(values * scales, x, rtol=0.07, atol=1e-3 * float(np.abs(x).max()))


@pytest.mark.gpu
def test_gpu_block_scale_dequantize_matmul_runs_or_declines_cleanly():
    import ml_dtypes
    rng = np.random.default_rng(19)
    host = {"A": rng.standard_normal((1, 64, 64)).astype(ml_dtypes.float8_e4m3fn),
            "sa": np.exp2(rng.integers(-2, 3, (1, 64, 2))).astype(ml_dtypes.float8_e8m0fnu)}
    b = rng.standard_normal((1, 32, 64)).astype(ml_dtypes.float8_e4m3fn)
    host["B"] = b.transpose(0, 2, 1)                                  # [1, 64, 32] column-major
    host["sb"] = np.exp2(rng.integers(-2, 3, (1, 32, 2))).astype(ml_dtypes.float8_e8m0fnu).transpose(0, 2, 1)
    _compare_on_cudnn_or_decline(dequantize_matmul_graph, host, {"C"}, "cupy", "dequantize + matmul (MXFP8)",
                                 tolerance=2e-2)
