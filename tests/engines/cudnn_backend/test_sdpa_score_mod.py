"""sdpa ``score_mod`` on the cuDNN backend.

CPU: the composite forward's program holds the callback's pointwise ops between the scale and the softmax
(one operation graph), reading the callback's tensors through their own descriptors; the native operation
and the backward decline score_mod by name. GPU (marked ``gpu``): arrow mask, document mask and softcap
against the reference engine, fp16 and bf16, at cudnn-frontend's test shapes and at ours.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.data_type import DataType
from cudnn_graph.enums import pointwise_mode as PW, reduction_mode as RED
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph.engines.cudnn_backend import Ref, lower_program
from cudnn_graph.engines.cudnn_backend import _lower_sdpa
from cudnn_graph.ops._sdpa import AttentionImplementation

from _score_mod_callbacks import arrow_mask, document_mask, softcap, softcap_backward_graph
from gpu_support import row_major

D = cudnn.data_type
IO = [D.BFLOAT16, D.HALF]
IO_IDS = ["bf16", "fp16"]
TOL = {D.BFLOAT16: 2.5e-2, D.HALF: 5e-3}
NEG = -1e9

ARROW_OPS = [PW.GEN_INDEX, PW.GEN_INDEX, PW.CMP_LT, PW.CMP_LT, PW.SUB, PW.CMP_GE, PW.CMP_LE, PW.LOGICAL_AND,
             PW.LOGICAL_OR, PW.LOGICAL_OR, PW.BINARY_SELECT]     # what arrow_mask builds, in order


# ---- graph builders (device first, as gpu_support's compare wants) --------------------------------------

def _constant(g, value, dtype):
    """A by-value constant the plan supplies (no buffer at execute), 4-d like the scores."""
    return g.tensor_scalar(value, data_type=dtype).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1])


def score_mod_graph(device, io=D.HALF, *, kind="arrow", b=2, h=4, s=128, d=64, stats=True, **sdpa_kw):
    """O (and Stats) of sdpa(q, k, v, score_mod=<kind>) with q/k/v in pygraph's BSHD strides."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT,
                      device=device, name=f"score_mod_{kind}")
    dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)
    t = {name: g.tensor(name=name, dim=list(dims), stride=list(strides), data_type=io) for name in ("q", "k", "v")}
    if kind == "arrow":
        callback = functools.partial(arrow_mask, row_bound=_constant(g, 2, D.INT32), col_bound=_constant(g, 2, D.INT32),
                                     diag_lo=_constant(g, 1, D.INT32), diag_hi=_constant(g, 1, D.INT32),
                                     neg_inf=_constant(g, NEG, D.FLOAT))
    elif kind == "document":
        t["doc_rows"] = g.tensor(name="doc_rows", dim=[1, 1, s, 1], stride=[s, s, 1, 1], data_type=D.INT32)
        t["doc_cols"] = g.tensor(name="doc_cols", dim=[1, 1, 1, s], stride=[s, s, s, 1], data_type=D.INT32)
        callback = functools.partial(document_mask, doc_rows=t["doc_rows"], doc_cols=t["doc_cols"],
                                     neg_inf=_constant(g, NEG, D.FLOAT))
    else:
        callback = functools.partial(softcap, cap=_constant(g, 0.8, D.FLOAT))
    o, st = g.sdpa(q=t["q"], k=t["k"], v=t["v"], generate_stats=stats, attn_scale=1.0 / math.sqrt(d),
                   score_mod=callback, name="attn", **sdpa_kw)
    t["O"] = o.set_output(True).set_name("O").set_dim(list(dims)).set_stride(list(strides))
    if stats:
        t["Stats"] = st.set_output(True).set_name("Stats")
    g.validate()
    return g, t


def _inputs(io, kind="arrow", b=2, h=4, s=128, d=64, seed=0):
    from gpu_support import host_dtype
    rng = np.random.default_rng(seed)
    dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)
    x = {}
    for name in ("q", "k", "v"):
        dense = rng.standard_normal((b, s, h, d)).astype(np.float32).astype(host_dtype(io))
        x[name] = np.lib.stride_tricks.as_strided(dense, dims, tuple(v * dense.itemsize for v in strides))
    if kind == "document":
        docs = np.sort(rng.integers(0, max(s // 8, 2), s)).astype(np.int32)
        x["doc_rows"], x["doc_cols"] = docs.reshape(1, 1, s, 1), docs.reshape(1, 1, 1, s)
    return x


# ---- CPU: what the lowering builds -----------------------------------------------------------------------

def _ops(program):
    """(kind, mode) of every operation of the program, in order."""
    by = {s.name: s for s in program.steps}
    out = []
    for name in program.operations:
        step = by[name]
        mode = None
        for attr in ("CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", "CUDNN_ATTR_OPERATION_REDUCTION_DESC"):
            if attr in step.attrs:
                desc = by[step.attrs[attr].name].attrs
                mode = desc.get("CUDNN_ATTR_POINTWISE_MODE", desc.get("CUDNN_ATTR_REDUCTION_OPERATOR"))
        out.append((step.kind[len("CUDNN_BACKEND_"):-len("_DESCRIPTOR")], mode))
    return out


BMM1 = [("OPERATION_MATMUL", None), ("OPERATION_POINTWISE", PW.MUL)]
SOFTMAX = [("OPERATION_REDUCTION", RED.MAX), ("OPERATION_POINTWISE", PW.SUB), ("OPERATION_POINTWISE", PW.EXP),
           ("OPERATION_REDUCTION", RED.ADD), ("OPERATION_POINTWISE", PW.LOG), ("OPERATION_POINTWISE", PW.ADD),
           ("OPERATION_POINTWISE", PW.DIV)]
BMM2 = [("OPERATION_MATMUL", None)]


def test_arrow_mask_lowers_between_the_scale_and_the_softmax_in_one_operation_graph():
    g, t = score_mod_graph("cuda", kind="arrow")
    program = lower_program(g)
    assert _ops(program) == BMM1 + [("OPERATION_POINTWISE", m) for m in ARROW_OPS] + SOFTMAX + BMM2
    by = {s.name: s for s in program.steps}
    ops = [by[n].attrs for n in program.operations]
    # the first score_mod op reads the scaled score; the last one feeds the row max
    scaled = ops[1]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    assert ops[2]["CUDNN_ATTR_OPERATION_POINTWISE_XDESC"] == scaled
    assert ops[2 + len(ARROW_OPS)]["CUDNN_ATTR_OPERATION_REDUCTION_XDESC"] == \
        ops[1 + len(ARROW_OPS)]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    # GEN_INDEX along rows and columns, into INT32 virtual tensors of the score's dims
    for op, axis in ((ops[2], 2), (ops[3], 3)):
        assert by[op["CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR"].name].attrs["CUDNN_ATTR_POINTWISE_AXIS"] == axis
        y = by[op["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"].name].attrs
        assert y["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.INT32 and y["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]
        assert y["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 128)
    # the bounds are the graph's own by-value tensors, read through their descriptors
    bound = ops[4]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"]
    outer = g.nodes[0].inputs["score_mod_inputs"]
    assert bound == Ref(f"tensor_{outer[0].uid}")
    assert by[bound.name].attrs["CUDNN_ATTR_TENSOR_IS_BY_VALUE"] is True
    assert (outer[0].uid, DataType.INT32, 2) in program.constants
    # binary_select(score, -1e9, mask): the select's inputs are the scaled score, neg_inf and the mask
    select = ops[1 + len(ARROW_OPS)]
    assert select["CUDNN_ATTR_OPERATION_POINTWISE_XDESC"] == scaled
    assert select["CUDNN_ATTR_OPERATION_POINTWISE_TDESC"] == ops[len(ARROW_OPS)]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    assert not program.unused_uids


def test_document_mask_reads_the_document_ids_as_graph_inputs():
    g, t = score_mod_graph("cuda", kind="document", b=1, h=1, s=16, d=128, stats=False)
    program = lower_program(g)
    modes = [m for _, m in _ops(program)[2:8]]
    assert modes == [PW.GEN_INDEX, PW.CMP_LE, PW.MUL, PW.MUL, PW.CMP_EQ, PW.BINARY_SELECT]
    refs = {v for s in program.steps for v in s.attrs.values() if isinstance(v, Ref)}
    for name in ("doc_rows", "doc_cols"):
        ref = Ref(f"tensor_{t[name].uid}")
        assert ref in refs
        assert program.step(ref.name).attrs["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is False


def test_the_native_operation_declines_score_mod_and_auto_takes_the_composite(monkeypatch):
    monkeypatch.setattr(_lower_sdpa, "_KNOWN", None)
    g, _ = score_mod_graph("cuda", kind="softcap", implementation=AttentionImplementation.UNIFIED)
    with pytest.raises(GraphNotSupportedError, match="implementation=UNIFIED: .*score_mod subgraph"):
        lower_program(g)
    g, _ = score_mod_graph("cuda", kind="softcap")
    assert not program_has_native(lower_program(g))


def program_has_native(program) -> bool:
    return any(s.kind == "CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR" for s in program.steps)


def test_backward_score_mod_is_declined_by_name():
    g, _grads, _cap = softcap_backward_graph("cuda", s=64, d=64)
    with pytest.raises(GraphNotSupportedError, match="node 'attn_bwd'.*score_mod / score_mod_bprop in sdpa_backward"):
        lower_program(g)


# ---- GPU: against the reference engine --------------------------------------------------------------------

def _assert_cudnn_plan(g):
    engine = type(g.selected_plan.engine).__name__
    assert "Cudnn" in engine, f"the graph ran on {engine}, not on the cuDNN backend"


GPU_CASES = {
    # cudnn-frontend's test_sdpa_with_arrow_mask / test_sdpa_with_document_mask shapes
    "arrow_frontend": dict(kind="arrow", b=4, h=12, s=256, d=128, stats=False),
    "document_frontend": dict(kind="document", b=1, h=1, s=16, d=128, stats=False),
    # ours, with Stats (the backward's input) checked too
    "arrow": dict(kind="arrow"),
    "document": dict(kind="document", b=2, h=2, s=128),
    "softcap": dict(kind="softcap"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_score_mod_forward_matches_the_reference(io, case):
    from gpu_support import compare
    kw = GPU_CASES[case]
    host = _inputs(io, **{k: v for k, v in kw.items() if k != "stats"})
    outs = {"O", "Stats"} if kw.get("stats", True) else {"O"}
    g = compare(score_mod_graph, host, outs, "cupy", tolerance=TOL[io], io=io, **kw)
    _assert_cudnn_plan(g)


def test_a_python_number_in_the_callback_becomes_a_plan_constant():
    g = cudnn.pygraph(io_data_type=D.HALF, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT,
                      device="cuda")
    q, k, v = (g.tensor(name=n, dim=[1, 2, 64, 64], stride=list(row_major((1, 2, 64, 64)))) for n in "qkv")
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=1.0, score_mod=lambda sub, score: sub.mul(a=score, b=0.5))
    o.set_output(True)
    g.validate()
    program = lower_program(g)
    ops = [program.step(n).attrs for n in program.operations]
    half = ops[2]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"]
    assert program.step(half.name).attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (1, 1, 1, 1)
    assert (int(half.name.split("_")[1]), DataType.FLOAT, 0.5) in program.plan_constants


def test_an_old_cudnn_names_the_override_shape_version_before_any_node_declines():
    """cudnn-frontend's THD tests skip with "needs cuDNN 9.21" on 9.19: the version is the reason given even
    where a node's lowering would decline too (here a score_mod with implementation=UNIFIED)."""
    from cudnn_graph._cudnn_errors import CudnnVersionError
    g = cudnn.pygraph(io_data_type=D.HALF, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT,
                      device="cuda", is_override_shape_enabled=True)
    q, k, v = (g.tensor(name=n, dim=[1, 2, 64, 64], stride=list(row_major((1, 2, 64, 64)))) for n in "qkv")
    g.sdpa(q, k, v, generate_stats=False, attn_scale=1.0, implementation=AttentionImplementation.UNIFIED,
           score_mod=lambda sub, score: score)[0].set_output(True)
    g.validate()
    with pytest.raises(CudnnVersionError, match=r"override shapes enabled \(dynamic shapes\) needs cuDNN >= 9\.21"):
        lower_program(g, 91900)
    with pytest.raises(GraphNotSupportedError, match="implementation=UNIFIED"):
        lower_program(g, 92100)
