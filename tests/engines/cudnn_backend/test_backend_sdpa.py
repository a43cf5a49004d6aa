"""sdpa / sdpa_backward on the cuDNN backend.

CPU: the lowered programs (the composite node sequence cudnn-frontend builds for cuDNN's fused attention
engines, the native SDPA operations, the choice between them) and the declines. GPU (marked ``gpu``):
results against the reference engine, forward and backward, bf16 and fp16, head dims 64, 128 and 256, from
CuPy and JAX; docs/backend_sdpa.md tabulates which feature runs where.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.data_type import DataType
from cudnn_graph.enums import pointwise_mode as PW, reduction_mode as RED
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph.engines.cudnn_backend import Ref, lower_program
from cudnn_graph.engines.cudnn_backend import _lower_sdpa
from cudnn_graph.engines.cudnn_backend.lowering import ATTRIBUTE_TYPES, Lowering
from cudnn_graph.ops._sdpa import AttentionImplementation

F = cudnn.data_type
OP_KINDS = ("OPERATION_MATMUL", "OPERATION_POINTWISE", "OPERATION_REDUCTION", "OPERATION_RESHAPE",
            "OPERATION_RNG", "OPERATION_PAGED_CACHE_LOAD", "OPERATION_SDPA_FWD", "OPERATION_SDPA_BWD")


# ---- graph builders shared by the CPU and GPU tests ----------------------------------------------------

def _dense(dims):
    out, acc = [], 1
    for d in reversed(dims):
        out.insert(0, acc)
        acc *= d
    return out


def _optional_inputs(g, t, sdpa_kw, io, b, h_q, s_q, s_kv, *, padding, bias, sink, dropout_scales, philox,
                     rng_dump) -> dict:
    """The optional inputs both builders take, added to ``t`` in this order: padding's sequence lengths, a
    bias, a sink token, a custom dropout keep-mask with its ``dropout_scales`` (none: no custom dropout),
    philox dropout's seed and offset. Returns ``sdpa_kw`` with the keywords that pass them."""
    kw = dict(sdpa_kw)
    if padding:
        for name in ("seq_len_q", "seq_len_kv"):
            t[name] = g.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT32)
        kw.update(use_padding_mask=True, seq_len_q=t["seq_len_q"], seq_len_kv=t["seq_len_kv"])
    if bias:
        t["bias"] = g.tensor(name="bias", dim=[1, h_q, s_q, s_kv], stride=_dense((1, h_q, s_q, s_kv)),
                             data_type=io)
        kw["bias"] = t["bias"]
    if sink:
        t["sink"] = g.tensor(name="sink", dim=[1, h_q, 1, 1], stride=[h_q, 1, 1, 1], data_type=F.FLOAT)
        kw["sink_token"] = t["sink"]
    if dropout_scales:
        t["mask"] = g.tensor(name="mask", dim=[b, h_q, s_q, s_kv], stride=_dense((b, h_q, s_q, s_kv)), data_type=io)
        for name in dropout_scales:
            t[name] = g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.FLOAT)
        kw["dropout"] = (t["mask"], *(t[name] for name in dropout_scales))
    if philox is not None:
        t["seed"] = g.tensor(name="seed", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT64)
        t["offset"] = g.tensor(name="offset", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT64)
        kw["dropout"] = (philox, t["seed"], t["offset"])
        if rng_dump:
            kw["rng_dump"] = True
    return kw


def fwd_graph(device, io=F.BFLOAT16, *, b=2, h_q=4, h_k=None, s_q=128, s_kv=None, d=64, stats=True,
              padding=False, bias=False, custom_dropout=False, philox=None, rng_dump=False, sink=False, **sdpa_kw):
    """O (and Stats) of sdpa(q, k, v) in ``io``; FLOAT intermediates and compute."""
    h_k = h_k or h_q
    s_kv = s_kv or s_q
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="sdpa")
    t = {}
    for name, dims in (("q", (b, h_q, s_q, d)), ("k", (b, h_k, s_kv, d)), ("v", (b, h_k, s_kv, d))):
        t[name] = g.tensor(name=name, dim=list(dims), stride=_dense(dims), data_type=io)
    kw = _optional_inputs(g, t, sdpa_kw, io, b, h_q, s_q, s_kv, padding=padding, bias=bias, sink=sink,
                          dropout_scales=("scale",) if custom_dropout else (), philox=philox, rng_dump=rng_dump)
    o, st = g.sdpa(t["q"], t["k"], t["v"], generate_stats=stats, attn_scale=1.0 / math.sqrt(d), name="attn", **kw)
    o.set_output(True).set_name("O")
    t["O"] = o
    if stats:
        st.set_output(True).set_name("Stats")
        t["Stats"] = st
    if rng_dump:
        t["rng_dump"] = g.nodes[-1].outputs["rng_dump"].set_output(True).set_name("rng_dump")
    g.validate()
    return g, t


def bwd_graph(device, io=F.BFLOAT16, *, b=2, h_q=4, h_k=None, s_q=128, s_kv=None, d=64, padding=False,
              bias=False, sink=False, dsink=False, custom_dropout=False, philox=None, rng_dump=False, **sdpa_kw):
    """dQ, dK, dV of sdpa_backward(q, k, v, o, dO, stats) in ``io``; ``custom_dropout``: a keep-mask with
    its scale and inverse scale; ``philox``: a dropout probability drawn from seed / offset tensors."""
    h_k = h_k or h_q
    s_kv = s_kv or s_q
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="sdpa_bwd")
    t = {}
    for name, dims in (("q", (b, h_q, s_q, d)), ("k", (b, h_k, s_kv, d)), ("v", (b, h_k, s_kv, d)),
                       ("o", (b, h_q, s_q, d)), ("dO", (b, h_q, s_q, d))):
        t[name] = g.tensor(name=name, dim=list(dims), stride=_dense(dims), data_type=io)
    t["stats"] = g.tensor(name="stats", dim=[b, h_q, s_q, 1], stride=_dense((b, h_q, s_q, 1)), data_type=F.FLOAT)
    kw = _optional_inputs(g, t, sdpa_kw, io, b, h_q, s_q, s_kv, padding=padding, bias=bias, sink=sink,
                          dropout_scales=("scale", "scale_inv") if custom_dropout else (), philox=philox,
                          rng_dump=rng_dump)
    if sink and dsink:
        kw["dSink_token"] = True
    dq, dk, dv = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"],
                                 attn_scale=1.0 / math.sqrt(d), name="attn_bwd", **kw)
    for name, x in (("dQ", dq), ("dK", dk), ("dV", dv)):
        x.set_output(True).set_name(name)
        t[name] = x
    if sink and dsink:
        t["dSink_token"] = g.nodes[-1].outputs["dSink_token"].set_output(True).set_name("dSink_token")
    if rng_dump:
        t["rng_dump"] = g.nodes[-1].outputs["rng_dump"].set_output(True).set_name("rng_dump")
    g.validate()
    return g, t


def ops_of(program):
    """(kind, mode) of every operation, in graph order: mode is the pointwise / reduction mode."""
    by_name = {s.name: s for s in program.steps}
    out = []
    for name in program.operations:
        step = by_name[name]
        kind = step.kind[len("CUDNN_BACKEND_"):-len("_DESCRIPTOR")]
        mode = None
        for attr in ("CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", "CUDNN_ATTR_OPERATION_REDUCTION_DESC"):
            if attr in step.attrs:
                desc = by_name[step.attrs[attr].name].attrs
                mode = desc.get("CUDNN_ATTR_POINTWISE_MODE", desc.get("CUDNN_ATTR_REDUCTION_OPERATOR"))
        out.append((kind, mode))
    return out


def tensor_attrs(program, ref):
    return program.step(ref.name).attrs


@pytest.fixture
def native_names(monkeypatch):
    """Lower as if the compiled core named every SDPA attribute."""
    monkeypatch.setattr(_lower_sdpa, "_KNOWN", None)


@pytest.fixture
def scratch(monkeypatch):
    """A stand-in for Lowering.scratch (plan-owned device tensors): a non-virtual tensor, fill recorded."""
    made = []

    def fake(self, dims, strides, dtype, fill=None):
        uid, step = self._tensor(dims, strides, dtype, CUDNN_ATTR_TENSOR_IS_VIRTUAL=False)
        made.append((uid, tuple(dims), DataType(dtype), fill))
        return Ref(step.name), step

    monkeypatch.setattr(Lowering, "scratch", fake, raising=False)
    return made


# ---- CPU: the composite forward --------------------------------------------------------------------------

SOFTMAX = [("OPERATION_REDUCTION", RED.MAX), ("OPERATION_POINTWISE", PW.SUB), ("OPERATION_POINTWISE", PW.EXP),
           ("OPERATION_REDUCTION", RED.ADD), ("OPERATION_POINTWISE", PW.LOG), ("OPERATION_POINTWISE", PW.ADD),
           ("OPERATION_POINTWISE", PW.DIV)]
CAUSAL = [("OPERATION_POINTWISE", PW.GEN_INDEX), ("OPERATION_POINTWISE", PW.GEN_INDEX),
          ("OPERATION_POINTWISE", PW.CMP_GE), ("OPERATION_POINTWISE", PW.BINARY_SELECT)]
BMM1 = [("OPERATION_MATMUL", None), ("OPERATION_POINTWISE", PW.MUL)]
BMM2 = [("OPERATION_MATMUL", None)]


def test_causal_forward_is_the_frontends_composite_sequence():
    g, t = fwd_graph("cuda", use_causal_mask=True)
    program = lower_program(g)
    assert ops_of(program) == BMM1 + CAUSAL + SOFTMAX + BMM2
    by = {s.name: s for s in program.steps}
    ops = [by[n] for n in program.operations]
    # bmm1 = Q @ K^T: K is described transposed (dims and strides of its last two axes swapped)
    bmm1 = ops[0].attrs
    assert bmm1["CUDNN_ATTR_OPERATION_MATMUL_ADESC"] == Ref(f"tensor_{t['q'].uid}")
    assert bmm1["CUDNN_ATTR_OPERATION_MATMUL_BDESC"] == Ref(f"tensor_{t['k'].uid}")
    k = tensor_attrs(program, bmm1["CUDNN_ATTR_OPERATION_MATMUL_BDESC"])
    assert k["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 64, 128)
    assert k["CUDNN_ATTR_TENSOR_STRIDES"] == (32768, 8192, 1, 64)
    assert "CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC" not in bmm1
    scores = tensor_attrs(program, bmm1["CUDNN_ATTR_OPERATION_MATMUL_CDESC"])
    assert scores["CUDNN_ATTR_TENSOR_IS_VIRTUAL"] is True
    assert scores["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 128)
    assert scores["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT
    # the attention scale is the by-value scalar the graph made for the Python float
    scale = ops[1].attrs["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"]
    assert (int(scale.name.split("_")[1]), DataType.FLOAT, 0.125) in program.constants
    # GEN_INDEX rows (axis 2) and columns (axis 3) as INT32; row >= col keeps; -inf elsewhere
    gen = [by[op.attrs["CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR"].name].attrs for op in ops[2:4]]
    assert [x["CUDNN_ATTR_POINTWISE_AXIS"] for x in gen] == [2, 3]
    row = tensor_attrs(program, ops[2].attrs["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])
    assert row["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.INT32
    cmp = ops[4].attrs
    assert cmp["CUDNN_ATTR_OPERATION_POINTWISE_XDESC"] == ops[2].attrs["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    assert cmp["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == ops[3].attrs["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    assert tensor_attrs(program, cmp["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])["CUDNN_ATTR_TENSOR_DATA_TYPE"] \
        == DataType.BOOLEAN
    select = ops[5].attrs
    assert select["CUDNN_ATTR_OPERATION_POINTWISE_TDESC"] == cmp["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"]
    neg = select["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"]
    assert (int(neg.name.split("_")[1]), DataType.FLOAT, float("-inf")) in program.plan_constants
    # Stats = max + log(sum) lands in the graph's Stats; P is cast to the io type for bmm2
    assert ops[11].attrs["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"] == Ref(f"tensor_{t['Stats'].uid}")
    p = tensor_attrs(program, ops[12].attrs["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])
    assert p["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.BFLOAT16 and p["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]
    bmm2 = ops[13].attrs
    assert bmm2["CUDNN_ATTR_OPERATION_MATMUL_BDESC"] == Ref(f"tensor_{t['v'].uid}")
    assert bmm2["CUDNN_ATTR_OPERATION_MATMUL_CDESC"] == Ref(f"tensor_{t['O'].uid}")
    # row statistics are (b, h, s_q, 1) FLOAT
    row_max = tensor_attrs(program, ops[6].attrs["CUDNN_ATTR_OPERATION_REDUCTION_YDESC"])
    assert row_max["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 1)
    for step in program.steps:
        assert all(attr in ATTRIBUTE_TYPES for attr in step.attrs), step.name


def test_inference_forward_still_writes_virtual_stats():
    g, t = fwd_graph("cuda", stats=False, implementation=AttentionImplementation.COMPOSITE)
    program = lower_program(g)
    assert ops_of(program) == BMM1 + SOFTMAX + BMM2
    add = program.step(program.operations[7]).attrs
    assert tensor_attrs(program, add["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])["CUDNN_ATTR_TENSOR_IS_VIRTUAL"]


def test_bottom_right_causal_shifts_rows_by_the_length_difference():
    g, t = fwd_graph("cuda", s_q=64, s_kv=128, use_causal_mask_bottom_right=True)
    program = lower_program(g)
    band = ops_of(program)[2:8]
    assert band == [("OPERATION_POINTWISE", PW.GEN_INDEX), ("OPERATION_POINTWISE", PW.GEN_INDEX),
                    ("OPERATION_POINTWISE", PW.ADD), ("OPERATION_POINTWISE", PW.SUB),
                    ("OPERATION_POINTWISE", PW.CMP_GE), ("OPERATION_POINTWISE", PW.BINARY_SELECT)]
    consts = [value for _, dtype, value in program.plan_constants if dtype == DataType.INT32]
    assert consts == [128, 64]     # row + s_kv - s_q


def test_sliding_window_adds_a_left_bound_after_the_causal_bound():
    g, t = fwd_graph("cuda", diagonal_band_right_bound=0, diagonal_band_left_bound=16)
    program = lower_program(g)
    band = ops_of(program)[2:11]
    assert band == CAUSAL + [("OPERATION_POINTWISE", PW.GEN_INDEX), ("OPERATION_POINTWISE", PW.GEN_INDEX),
                             ("OPERATION_POINTWISE", PW.ADD), ("OPERATION_POINTWISE", PW.CMP_GT),
                             ("OPERATION_POINTWISE", PW.BINARY_SELECT)]
    assert (DataType.FLOAT, 16.0) in [(dt, v) for _, dt, v in program.plan_constants]   # col + left > row


def test_padding_mask_compares_indices_with_the_sequence_lengths_and_overrides_the_gemms():
    g, t = fwd_graph("cuda", padding=True, use_causal_mask=True)
    program = lower_program(g)
    kinds = ops_of(program)
    assert kinds[2:8] == [("OPERATION_POINTWISE", PW.GEN_INDEX), ("OPERATION_POINTWISE", PW.GEN_INDEX),
                          ("OPERATION_POINTWISE", PW.CMP_LT), ("OPERATION_POINTWISE", PW.CMP_LT),
                          ("OPERATION_POINTWISE", PW.LOGICAL_AND), ("OPERATION_POINTWISE", PW.BINARY_SELECT)]
    assert kinds[8:12] == CAUSAL
    ops = [program.step(n).attrs for n in program.operations]
    assert ops[4]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['seq_len_q'].uid}")
    assert ops[5]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['seq_len_kv'].uid}")
    bmm1, bmm2 = ops[0], ops[-1]
    assert bmm1["CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC"] == Ref(f"tensor_{t['seq_len_q'].uid}")
    assert bmm1["CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC"] == Ref(f"tensor_{t['seq_len_kv'].uid}")
    assert bmm2["CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC"] == Ref(f"tensor_{t['seq_len_q'].uid}")
    assert bmm2["CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC"] == Ref(f"tensor_{t['seq_len_kv'].uid}")


def test_bias_is_added_after_the_scale_and_gqa_keeps_the_key_heads():
    g, t = fwd_graph("cuda", bias=True, h_q=8, h_k=2, use_causal_mask=True)
    program = lower_program(g)
    assert ops_of(program)[:3] == BMM1 + [("OPERATION_POINTWISE", PW.ADD)]
    add = program.step(program.operations[2]).attrs
    assert add["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['bias'].uid}")
    k = tensor_attrs(program, Ref(f"tensor_{t['k'].uid}"))
    assert k["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 2, 64, 128)


def test_custom_dropout_scales_then_masks_before_bmm2():
    g, t = fwd_graph("cuda", custom_dropout=True)
    program = lower_program(g)
    assert ops_of(program)[-4:] == [("OPERATION_POINTWISE", PW.DIV), ("OPERATION_POINTWISE", PW.MUL),
                                    ("OPERATION_POINTWISE", PW.MUL), ("OPERATION_MATMUL", None)]
    ops = [program.step(n).attrs for n in program.operations]
    assert ops[-3]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['scale'].uid}")
    assert ops[-2]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['mask'].uid}")
    div_out = tensor_attrs(program, ops[-4]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])
    assert div_out["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.FLOAT
    masked = tensor_attrs(program, ops[-2]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"])
    assert masked["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.BFLOAT16


def test_philox_dropout_draws_a_bernoulli_keep_mask(native_names):
    g, t = fwd_graph("cuda", philox=0.25)
    program = lower_program(g)
    assert ops_of(program)[-5:] == [("OPERATION_POINTWISE", PW.DIV), ("OPERATION_RNG", None),
                                    ("OPERATION_POINTWISE", PW.MUL), ("OPERATION_POINTWISE", PW.MUL),
                                    ("OPERATION_MATMUL", None)]
    (rng,) = program.of_kind("RNG")
    assert rng == {"CUDNN_ATTR_RNG_DISTRIBUTION": 0, "CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY": 0.75}
    (op,) = program.of_kind("OPERATION_RNG")
    assert op["CUDNN_ATTR_OPERATION_RNG_SEED"] == Ref(f"tensor_{t['seed'].uid}")
    assert op["CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC"] == Ref(f"tensor_{t['offset'].uid}")
    assert any(dt == DataType.FLOAT and v == pytest.approx(1 / 0.75) for _, dt, v in program.constants + program.plan_constants)


def test_sink_token_joins_the_max_and_the_denominator():
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    q = g.tensor(name="q", dim=[1, 2, 64, 64], stride=_dense((1, 2, 64, 64)))
    sink = g.tensor(name="sink", dim=[1, 2, 1, 1], stride=[2, 1, 1, 1], data_type=F.FLOAT)
    o, st = g.sdpa(q, q, q, generate_stats=True, sink_token=sink)
    o.set_output(True)
    st.set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError):   # q feeds K (transposed) and V (as laid out)
        lower_program(g)
    k = g.tensor(name="k", dim=[1, 2, 64, 64], stride=_dense((1, 2, 64, 64)))
    g2 = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                       device="cuda")
    q, k, v = (g2.tensor(name=n, dim=[1, 2, 64, 64], stride=_dense((1, 2, 64, 64))) for n in "qkv")
    sink = g2.tensor(name="sink", dim=[1, 2, 1, 1], stride=[2, 1, 1, 1], data_type=F.FLOAT)
    o, st = g2.sdpa(q, k, v, generate_stats=True, sink_token=sink)
    o.set_output(True)
    st.set_output(True)
    g2.validate()
    kinds = ops_of(lower_program(g2))
    assert kinds[1:10] == [("OPERATION_REDUCTION", RED.MAX), ("OPERATION_POINTWISE", PW.MAX),
                           ("OPERATION_POINTWISE", PW.SUB), ("OPERATION_POINTWISE", PW.EXP),
                           ("OPERATION_POINTWISE", PW.SUB), ("OPERATION_POINTWISE", PW.EXP),
                           ("OPERATION_REDUCTION", RED.ADD), ("OPERATION_POINTWISE", PW.ADD),
                           ("OPERATION_POINTWISE", PW.LOG)]


def test_alibi_reads_slopes_from_a_plan_owned_tensor(scratch):
    g, t = fwd_graph("cuda", h_q=4, use_causal_mask=True, use_alibi_mask=True)
    program = lower_program(g)
    assert ops_of(program)[2:7] == [("OPERATION_POINTWISE", PW.GEN_INDEX), ("OPERATION_POINTWISE", PW.GEN_INDEX),
                                    ("OPERATION_POINTWISE", PW.SUB), ("OPERATION_POINTWISE", PW.MUL),
                                    ("OPERATION_POINTWISE", PW.ADD)]
    ((uid, dims, dtype, fill),) = scratch
    assert dims == (1, 4, 1, 1) and dtype == DataType.FLOAT
    assert fill == pytest.approx((2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8))


def test_alibi_without_plan_owned_tensors_is_declined():
    if hasattr(Lowering, "scratch"):
        pytest.skip("this build's lowering makes plan-owned tensors")
    g, _ = fwd_graph("cuda", use_causal_mask=True, use_alibi_mask=True)
    with pytest.raises(GraphNotSupportedError, match="Lowering.scratch"):
        lower_program(g)


# ---- CPU: native forward and the choice ----------------------------------------------------------------

def test_auto_picks_the_native_forward_for_a_plain_graph(native_names):
    g, t = fwd_graph("cuda", padding=True)
    program = lower_program(g, version=91900)
    assert ops_of(program) == [("OPERATION_SDPA_FWD", None)]
    (op,) = program.of_kind("OPERATION_SDPA_FWD")
    assert op == {
        "CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC": Ref(f"tensor_{t['q'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC": Ref(f"tensor_{t['k'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC": Ref(f"tensor_{t['v'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC": Ref(f"tensor_{t['O'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC": Ref(f"tensor_{t['Stats'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC": op["CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC"],
        "CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC": Ref(f"tensor_{t['seq_len_q'].uid}"),
        "CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC": Ref(f"tensor_{t['seq_len_kv'].uid}"),
    }
    k = tensor_attrs(program, Ref(f"tensor_{t['k'].uid}"))
    assert k["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 64)    # the native op takes K as laid out


def test_auto_falls_back_to_the_composite_where_the_native_op_lacks_a_feature(native_names):
    g, _ = fwd_graph("cuda", use_causal_mask=True)
    assert ("OPERATION_SDPA_FWD", None) not in ops_of(lower_program(g, version=91900))
    g, _ = fwd_graph("cuda", padding=True)
    assert ops_of(lower_program(g, version=91400))[0] == ("OPERATION_MATMUL", None)   # seq lens need 9.15


def test_unified_declines_masks_and_old_versions_with_the_reason(native_names):
    g, _ = fwd_graph("cuda", use_causal_mask=True, implementation=AttentionImplementation.UNIFIED)
    with pytest.raises(GraphNotSupportedError, match="causal / sliding-window bounds"):
        lower_program(g, version=91900)
    g, _ = fwd_graph("cuda", implementation=AttentionImplementation.UNIFIED)
    with pytest.raises(GraphNotSupportedError, match="needs cuDNN >= 9.13.1; loaded 9.12.0"):
        lower_program(g, version=91200)


def test_unified_declines_when_the_build_cannot_set_the_attributes(monkeypatch):
    monkeypatch.setattr(_lower_sdpa, "_KNOWN", frozenset())
    g, _ = fwd_graph("cuda", implementation=AttentionImplementation.UNIFIED)
    with pytest.raises(GraphNotSupportedError, match="_backend cannot set CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC"):
        lower_program(g, version=91900)
    g, _ = fwd_graph("cuda")                      # AUTO still lowers: the composite
    assert ops_of(lower_program(g, version=91900))[0] == ("OPERATION_MATMUL", None)


def test_declines_name_the_node_and_the_reason():
    g, _ = fwd_graph("cuda", io=F.FLOAT)
    with pytest.raises(GraphNotSupportedError, match="node 'attn' .*HALF or BFLOAT16"):
        lower_program(g)
    g, _ = fwd_graph("cuda", s_q=128, s_kv=64, use_causal_mask_bottom_right=True)
    with pytest.raises(GraphNotSupportedError, match="bottom-right causal mask needs s_q <= s_kv"):
        lower_program(g)
    g, _ = fwd_graph("cuda", use_causal_mask_bottom_right=True, bias=True)
    with pytest.raises(GraphNotSupportedError, match="bottom-right causal mask does not combine"):
        lower_program(g)


def test_composite_declines_a_block_mask(native_names):
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    q, k, v = (g.tensor(name=n, dim=[1, 2, 128, 64], stride=_dense((1, 2, 128, 64))) for n in "qkv")
    bm = g.tensor(name="bm", dim=[1, 2, 1, 1], stride=[2, 1, 1, 1], data_type=F.UINT8)
    o, _ = g.sdpa(q, k, v, generate_stats=False, block_mask=bm, implementation=AttentionImplementation.COMPOSITE)
    o.set_output(True)
    g.validate()
    with pytest.raises(GraphNotSupportedError, match="block mask runs only on the native"):
        lower_program(g)


# ---- CPU: backward ---------------------------------------------------------------------------------------

def test_causal_backward_is_the_frontends_composite_sequence(scratch, native_names):
    g, t = bwd_graph("cuda", use_causal_mask=True)
    program = lower_program(g, version=91900)
    P = "OPERATION_POINTWISE"
    assert ops_of(program) == [
        (P, PW.MUL), ("OPERATION_REDUCTION", RED.ADD), (P, PW.MUL),           # softmax_sum = rowsum(dO*O) * 1
        ("OPERATION_MATMUL", None), (P, PW.MUL),                              # S = Q K^T * scale
        (P, PW.SUB),                                                          # - stats
        (P, PW.GEN_INDEX), (P, PW.GEN_INDEX), (P, PW.CMP_GE), (P, PW.BINARY_SELECT),
        (P, PW.EXP),                                                          # P
        ("OPERATION_RESHAPE", None), ("OPERATION_MATMUL", None),              # dV = P^T dO
        ("OPERATION_MATMUL", None), (P, PW.SUB), (P, PW.MUL), (P, PW.MUL),    # dS = (dP - sum) P * scale
        ("OPERATION_RESHAPE", None), ("OPERATION_MATMUL", None),              # dK = dS^T Q
        ("OPERATION_RESHAPE", None), ("OPERATION_MATMUL", None), (P, PW.IDENTITY)]   # dQ via a FLOAT accumulator
    ops = [program.step(n).attrs for n in program.operations]
    softmax_sum, accum = scratch
    assert softmax_sum[1:3] == ((2, 4, 128, 1), DataType.FLOAT)
    assert accum[1:] == ((2, 4, 128, 64), DataType.FLOAT, None)
    assert ops[2]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"] == Ref(f"tensor_{softmax_sum[0]}")
    assert ops[5]["CUDNN_ATTR_OPERATION_POINTWISE_BDESC"] == Ref(f"tensor_{t['stats'].uid}")
    # K and V are read transposed; K is reshaped back for dQ
    for name in ("k", "v"):
        assert tensor_attrs(program, Ref(f"tensor_{t[name].uid}"))["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 64, 128)
    k_back = tensor_attrs(program, ops[19]["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"])
    assert k_back["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 64)
    assert k_back["CUDNN_ATTR_TENSOR_STRIDES"] == (32768, 8192, 64, 1)
    p_t = tensor_attrs(program, ops[11]["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"])
    assert p_t["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 128)
    assert p_t["CUDNN_ATTR_TENSOR_STRIDES"] == (65536, 16384, 1, 128)
    assert p_t["CUDNN_ATTR_TENSOR_DATA_TYPE"] == DataType.BFLOAT16
    assert ops[12]["CUDNN_ATTR_OPERATION_MATMUL_CDESC"] == Ref(f"tensor_{t['dV'].uid}")
    assert ops[18]["CUDNN_ATTR_OPERATION_MATMUL_CDESC"] == Ref(f"tensor_{t['dK'].uid}")
    assert ops[21]["CUDNN_ATTR_OPERATION_POINTWISE_YDESC"] == Ref(f"tensor_{t['dQ'].uid}")


def test_gqa_backward_sums_the_full_head_gradients(scratch, native_names):
    g, t = bwd_graph("cuda", h_q=8, h_k=2)
    kinds = ops_of(lower_program(g, version=91900))
    assert kinds.count(("OPERATION_REDUCTION", RED.ADD)) == 3      # rowsum, dV heads, dK heads


def test_backward_without_plan_owned_tensors_uses_the_native_op(native_names, monkeypatch):
    monkeypatch.delattr(Lowering, "scratch", raising=False)
    g, t = bwd_graph("cuda", padding=True)
    program = lower_program(g, version=91900)
    (op,) = program.of_kind("OPERATION_SDPA_BWD")
    assert op["CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC"] == Ref(f"tensor_{t['dO'].uid}")
    assert op["CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC"] == Ref(f"tensor_{t['stats'].uid}")
    assert op["CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_KVDESC"] == Ref(f"tensor_{t['seq_len_kv'].uid}")
    g, _ = bwd_graph("cuda", use_causal_mask=True)
    with pytest.raises(GraphNotSupportedError, match="Lowering.scratch.*native: the native operation takes"):
        lower_program(g, version=91900)
    g, _ = bwd_graph("cuda")
    with pytest.raises(GraphNotSupportedError, match="needs cuDNN >= 9.17.0"):
        lower_program(g, version=91600)


def test_attribute_table_registers_only_what_the_build_can_set():
    from cudnn_graph import _cudnn_names
    for attr in _lower_sdpa.SDPA_ATTRIBUTE_TYPES:
        assert (attr in _lower_sdpa._REGISTERED) == (attr in _cudnn_names.ATTRIBUTES), attr


# ---- GPU: against the reference engine ------------------------------------------------------------------

TOL_FWD = {F.BFLOAT16: 2.5e-2, F.HALF: 5e-3}
TOL_BWD = {F.BFLOAT16: 5e-2, F.HALF: 1e-2}
IO = [F.BFLOAT16, F.HALF]
IO_IDS = ["bf16", "fp16"]


def _rand(io, dims, rng, scale=1.0):
    from gpu_support import host_dtype
    return (rng.standard_normal(dims) * scale).astype(np.float32).astype(host_dtype(io))


def _fwd_inputs(io, b=2, h_q=4, h_k=None, s_q=128, s_kv=None, d=64, padding=False, bias=False, seed=0,
                sink=False):
    h_k = h_k or h_q
    s_kv = s_kv or s_q
    rng = np.random.default_rng(seed)
    x = {"q": _rand(io, (b, h_q, s_q, d), rng), "k": _rand(io, (b, h_k, s_kv, d), rng),
         "v": _rand(io, (b, h_k, s_kv, d), rng)}
    if padding:
        x["seq_len_q"] = np.array([s_q, s_q // 2 + 3][:b] + [s_q] * (b - 2), np.int32).reshape(b, 1, 1, 1)
        x["seq_len_kv"] = np.array([s_kv - 5, s_kv // 3][:b] + [s_kv] * (b - 2), np.int32).reshape(b, 1, 1, 1)
    if bias:
        x["bias"] = _rand(io, (1, h_q, s_q, s_kv), rng, 0.5)
    if sink:
        x["sink"] = (rng.standard_normal((1, h_q, 1, 1)) + 1.0).astype(np.float32)
    return x


def _assert_cudnn_plan(g):
    engine = type(g.selected_plan.engine).__name__
    assert "Cudnn" in engine, f"the graph ran on {engine}, not on the cuDNN backend"


def _skip_unless_lowerable(builder, **kw):
    g, _ = builder("cuda", **kw)
    try:
        lower_program(g)
    except GraphNotSupportedError as exc:
        if "Lowering.scratch" in str(exc) or "_backend cannot set" in str(exc):
            pytest.skip(f"this build cannot lower it yet: {exc}")
        raise


def _reference_sweep(test):
    """The GPU sweep the forward and the backward check both run: each io type, head dims 64 and 128, and
    three (case, producer) pairs (the marks applied in the order a decorator stack would)."""
    test = pytest.mark.parametrize("case,producer", [("plain", "cupy"), ("causal", "cupy"), ("causal", "jax")])(test)
    test = pytest.mark.parametrize("d", [64, 128])(test)
    test = pytest.mark.parametrize("io", IO, ids=IO_IDS)(test)
    return pytest.mark.gpu(test)


FORWARD_CASES = {
    "plain": dict(),
    "causal": dict(use_causal_mask=True),
    "causal_bottom_right": dict(s_q=64, s_kv=192, use_causal_mask_bottom_right=True),
    "padding_causal": dict(padding=True, use_causal_mask=True),
    "sliding_window": dict(diagonal_band_right_bound=0, diagonal_band_left_bound=32),
    "bias": dict(bias=True, use_causal_mask=True),
    "gqa": dict(h_q=8, h_k=2, use_causal_mask=True),
    "mqa": dict(h_q=4, h_k=1),
}


@_reference_sweep
def test_forward_matches_the_reference(io, d, case, producer):
    from gpu_support import compare
    kw = dict(FORWARD_CASES[case], d=d)
    shape = {k: kw[k] for k in ("s_q", "s_kv", "h_q", "h_k") if k in kw}
    host = _fwd_inputs(io, d=d, **shape)
    g = compare(fwd_graph, host, {"O", "Stats"}, producer, tolerance=TOL_FWD[io], io=io, **kw)
    _assert_cudnn_plan(g)


def compare_valid_rows(builder, host, out_names, producer, tolerance, **kw):
    """Reference vs GPU on the rows inside the problem only: with a padding mask the query rows at or past
    seq_len_q[b] are not part of it. cuDNN leaves O undefined there and (from 9.14) writes Stats = -inf;
    cudnn-frontend's own tests blank those rows before comparing, and so does this."""
    from gpu_support import assert_close, gpu_run, reference_run
    want = reference_run(builder, host, out_names, **kw)
    got, g = gpu_run(builder, host, out_names, producer, **kw)
    seq_q = host.get("seq_len_q")
    for name in out_names:
        a, b = np.asarray(got[name], np.float32).copy(), np.asarray(want[name], np.float32).copy()
        if seq_q is not None and name in ("O", "Stats"):
            for i, n in enumerate(np.asarray(seq_q).reshape(-1)):
                a[i, :, n:, :] = 0
                b[i, :, n:, :] = 0
        assert_close(a, b, np.dtype(want[name].dtype).name, f"{name} ({producer})", tolerance=tolerance)
    return g


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("case", ["causal_bottom_right", "padding_causal", "sliding_window", "bias", "gqa", "mqa"])
def test_forward_variants_match_the_reference(io, case):
    kw = dict(FORWARD_CASES[case])
    shape = {k: kw[k] for k in ("s_q", "s_kv", "h_q", "h_k", "padding", "bias") if k in kw}
    host = _fwd_inputs(io, **shape)
    g = compare_valid_rows(fwd_graph, host, {"O", "Stats"}, "cupy", TOL_FWD[io], io=io, **kw)
    _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_forward_composite_and_native_agree_where_both_lower(io):
    from gpu_support import compare
    host = _fwd_inputs(io)
    for impl in (AttentionImplementation.COMPOSITE, AttentionImplementation.UNIFIED):
        if impl == AttentionImplementation.UNIFIED:
            _skip_unless_lowerable(fwd_graph, io=io, implementation=impl)
        g = compare(fwd_graph, host, {"O", "Stats"}, "cupy", tolerance=TOL_FWD[io], io=io, implementation=impl)
        _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_custom_dropout_mask_matches_the_reference(io):
    from gpu_support import compare, host_dtype
    rng = np.random.default_rng(3)
    host = _fwd_inputs(io)
    host["mask"] = (rng.random((2, 4, 128, 128)) > 0.2).astype(np.float32).astype(host_dtype(io))
    host["scale"] = np.full((1, 1, 1, 1), 1 / 0.8, np.float32)
    g = compare(fwd_graph, host, {"O", "Stats"}, "cupy", tolerance=TOL_FWD[io], io=io, custom_dropout=True)
    _assert_cudnn_plan(g)


@pytest.mark.gpu
def test_philox_dropout_equals_its_dumped_keep_mask_used_as_a_custom_mask():
    from gpu_support import assert_close, gpu_run, host_dtype, reference_run
    _skip_unless_lowerable(fwd_graph, io=F.HALF, philox=0.2)
    host = _fwd_inputs(F.HALF)
    host["seed"] = np.full((1, 1, 1, 1), 1234, np.int64)
    host["offset"] = np.full((1, 1, 1, 1), 7, np.int64)
    got, g = gpu_run(fwd_graph, host, {"O", "Stats", "rng_dump"}, "cupy", io=F.HALF, philox=0.2, rng_dump=True)
    _assert_cudnn_plan(g)
    keep = got["rng_dump"]
    assert set(np.unique(keep)) <= {0.0, 1.0}
    assert abs(float(keep.mean()) - 0.8) < 0.02
    custom = {k: v for k, v in host.items() if k not in ("seed", "offset")}
    custom["mask"] = keep.astype(host_dtype(F.HALF))
    custom["scale"] = np.full((1, 1, 1, 1), 1 / 0.8, np.float32)
    want = reference_run(fwd_graph, custom, {"O", "Stats"}, io=F.HALF, custom_dropout=True)
    assert_close(got["O"], want["O"], "float16", "Philox dropout O", tolerance=TOL_FWD[F.HALF])


def _bwd_inputs(io, b=2, h_q=4, h_k=None, s_q=128, s_kv=None, d=64, padding=False, bias=False, seed=1,
                sink=False, keep=None, **mask):
    """Backward inputs whose o and Stats are the reference forward's (so P recomputed from Stats is exact).
    ``keep``: a dropout keep-probability; the inputs then hold a random keep-mask and its scales (the
    forward's O uses them)."""
    from cudnn_graph.engines.reference import _kernels_sdpa
    from gpu_support import host_dtype
    x = _fwd_inputs(io, b, h_q, h_k, s_q, s_kv, d, padding, bias, seed, sink=sink)
    if keep is not None:
        drop_rng = np.random.default_rng(seed + 13)
        x["mask"] = (drop_rng.random((b, h_q, s_q, s_kv or s_q)) < keep).astype(np.float32).astype(host_dtype(io))
        x["scale"] = np.full((1, 1, 1, 1), 1 / keep, np.float32)
        x["scale_inv"] = np.full((1, 1, 1, 1), keep, np.float32)
    attrs = {"generate_stats": True, "attn_scale": 1.0 / math.sqrt(d), "use_padding_mask": padding, **mask}
    for key in ("use_causal_mask", "use_causal_mask_bottom_right", "diagonal_band_left_bound",
                "diagonal_band_right_bound", "sliding_window_length", "diagonal_alignment"):
        attrs.setdefault(key, None)
    inputs = {k: x.get(k) for k in ("q", "k", "v", "bias", "seq_len_q", "seq_len_kv")}
    inputs["sink_token"] = x.get("sink")
    inputs["dropout_mask"], inputs["dropout_scale"] = x.get("mask"), x.get("scale")
    o_dims, row_dims = (b, h_q, s_q, d), (b, h_q, s_q, 1)
    out = _kernels_sdpa.sdpa_forward_kernel(inputs, attrs, {"O": (o_dims, host_dtype(io)),
                                                            "Stats": (row_dims, np.float32)})
    rng = np.random.default_rng(seed + 7)
    x["o"], x["stats"] = out["O"], out["Stats"]
    x["dO"] = _rand(io, o_dims, rng)
    return x


BACKWARD_CASES = {
    "plain": dict(),
    "causal": dict(use_causal_mask=True),
    "gqa": dict(h_q=8, h_k=2, use_causal_mask=True),
    "padding": dict(padding=True, use_causal_mask=True),
    "bias": dict(bias=True),
    "sliding_window": dict(diagonal_band_right_bound=0, diagonal_band_left_bound=32),
}


@_reference_sweep
def test_backward_matches_the_reference(io, d, case, producer):
    from gpu_support import compare
    kw = dict(BACKWARD_CASES[case], d=d)
    _skip_unless_lowerable(bwd_graph, io=io, **kw)
    mask = {k: v for k, v in kw.items() if k.startswith(("use_", "diagonal"))}
    host = _bwd_inputs(io, d=d, **mask)
    g = compare(bwd_graph, host, {"dQ", "dK", "dV"}, producer, tolerance=TOL_BWD[io], io=io, **kw)
    _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("case", ["gqa", "padding", "bias", "sliding_window"])
def test_backward_variants_match_the_reference(io, case):
    from gpu_support import compare
    kw = dict(BACKWARD_CASES[case])
    _skip_unless_lowerable(bwd_graph, io=io, **kw)
    shape = {k: kw[k] for k in ("h_q", "h_k", "padding", "bias") if k in kw}
    mask = {k: v for k, v in kw.items() if k.startswith(("use_", "diagonal"))}
    host = _bwd_inputs(io, **shape, **mask)
    g = compare(bwd_graph, host, {"dQ", "dK", "dV"}, "cupy", tolerance=TOL_BWD[io], io=io, **kw)
    _assert_cudnn_plan(g)


# ---- features without a GPU test before: sink, ALiBi, paged K/V, ragged THD, the native backward ---------
#
# Each runs on the cuDNN backend and matches the reference, or is declined with GraphNotSupportedError;
# a decline is reported as a skip carrying cuDNN's / the lowering's reason (never an xfail).

def _or_declined(run):
    """``run()``, or a skip that reports a clean decline (GraphNotSupportedError) and its reason."""
    try:
        return run()
    except GraphNotSupportedError as exc:
        pytest.skip(f"declined cleanly: {type(exc).__name__}: {exc}")


def _compare_on_cudnn_or_declined(builder, host, out_names, producer, tolerance, **kw):
    """``gpu_support.compare`` that must run on the cuDNN backend, or a skip for a clean decline."""
    from gpu_support import compare
    g = _or_declined(lambda: compare(builder, host, out_names, producer, tolerance=tolerance, **kw))
    _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io,producer", [(F.BFLOAT16, "cupy"), (F.HALF, "cupy"), (F.BFLOAT16, "jax")],
                         ids=["bf16-cupy", "fp16-cupy", "bf16-jax"])
def test_sink_token_forward_matches_the_reference(io, producer):
    _compare_on_cudnn_or_declined(fwd_graph, _fwd_inputs(io, sink=True), {"O", "Stats"}, producer, TOL_FWD[io],
                                  io=io, sink=True, use_causal_mask=True)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_sink_token_backward_matches_the_reference(io):
    """dQ / dK / dV with a sink in the Stats; dSink_token = -sum_rows exp(sink - Stats) * rowsum(dO * O)."""
    _compare_on_cudnn_or_declined(bwd_graph, _bwd_inputs(io, sink=True, use_causal_mask=True),
                                  {"dQ", "dK", "dV", "dSink_token"}, "cupy", TOL_BWD[io],
                                  io=io, sink=True, dsink=True, use_causal_mask=True)


@pytest.mark.gpu
@pytest.mark.parametrize("io,producer", [(F.BFLOAT16, "cupy"), (F.HALF, "cupy"), (F.HALF, "jax")],
                         ids=["bf16-cupy", "fp16-cupy", "fp16-jax"])
def test_alibi_forward_matches_the_reference(io, producer):
    _compare_on_cudnn_or_declined(fwd_graph, _fwd_inputs(io), {"O", "Stats"}, producer, TOL_FWD[io],
                                  io=io, use_causal_mask=True, use_alibi_mask=True)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_alibi_backward_matches_the_reference(io):
    _compare_on_cudnn_or_declined(bwd_graph, _bwd_inputs(io, use_causal_mask=True, use_alibi_mask=True),
                                  {"dQ", "dK", "dV"}, "cupy", TOL_BWD[io], io=io, use_causal_mask=True,
                                  use_alibi_mask=True)


def paged_graph(device, io=F.BFLOAT16, *, b=2, h=4, s_q=64, page=64, pages_per_seq=2, num_pages=5, d=64,
                **sdpa_kw):
    """O of sdpa(q, K cache, V cache) with page tables: K / V are containers (num_pages, h, page, d),
    the tables (b, 1, pages_per_seq, 1) INT32; s_kv = pages_per_seq * page. Inference (no Stats)."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="sdpa_paged")
    t = {"q": g.tensor(name="q", dim=[b, h, s_q, d], stride=_dense((b, h, s_q, d)), data_type=io)}
    for name in ("k", "v"):
        dims = (num_pages, h, page, d)
        t[name] = g.tensor(name=name, dim=list(dims), stride=_dense(dims), data_type=io)
        t[f"table_{name}"] = g.tensor(name=f"table_{name}", dim=[b, 1, pages_per_seq, 1],
                                      stride=_dense((b, 1, pages_per_seq, 1)), data_type=F.INT32)
    for name in ("seq_len_q", "seq_len_kv"):
        t[name] = g.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT32)
    sdpa_kw.setdefault("use_padding_mask", True)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, attn_scale=1.0 / math.sqrt(d), name="attn",
                  seq_len_q=t["seq_len_q"], seq_len_kv=t["seq_len_kv"],
                  paged_attention_k_table=t["table_k"], paged_attention_v_table=t["table_v"], **sdpa_kw)
    o.set_output(True).set_name("O")
    t["O"] = o
    g.validate()
    return g, t


def _paged_inputs(io, b=2, h=4, s_q=64, page=64, pages_per_seq=2, num_pages=5, d=64, seed=5):
    rng = np.random.default_rng(seed)
    x = {"q": _rand(io, (b, h, s_q, d), rng), "k": _rand(io, (num_pages, h, page, d), rng),
         "v": _rand(io, (num_pages, h, page, d), rng)}
    pages = rng.permutation(num_pages)[:b * pages_per_seq].astype(np.int32)   # scattered, one page unused
    for name in ("table_k", "table_v"):
        x[name] = pages.reshape(b, 1, pages_per_seq, 1).copy()
    s_kv = page * pages_per_seq
    x["seq_len_q"] = np.array([s_q, s_q - 9][:b], np.int32).reshape(b, 1, 1, 1)
    x["seq_len_kv"] = np.array([s_kv - 3, s_kv // 2 + 1][:b], np.int32).reshape(b, 1, 1, 1)
    return x


PAGED_CASES = {
    "auto": dict(),                                                  # 9.15+: the native forward
    "composite": dict(implementation=AttentionImplementation.COMPOSITE),   # PAGED_CACHE_LOAD per cache
    "causal_bottom_right": dict(use_causal_mask_bottom_right=True),  # composite (a band)
}


@pytest.mark.gpu
@pytest.mark.parametrize("io,case,producer", [
    (F.BFLOAT16, "auto", "cupy"), (F.HALF, "auto", "cupy"), (F.BFLOAT16, "composite", "cupy"),
    (F.HALF, "composite", "cupy"), (F.BFLOAT16, "causal_bottom_right", "cupy"),
    (F.HALF, "causal_bottom_right", "jax")])
def test_paged_kv_forward_matches_the_reference(io, case, producer):
    host = _paged_inputs(io)
    kw = dict(PAGED_CASES[case], io=io)
    g = _or_declined(lambda: compare_valid_rows(paged_graph, host, {"O"}, producer, TOL_FWD[io], **kw))
    _assert_cudnn_plan(g)


def ragged_graph(device, io=F.BFLOAT16, *, b=2, h=4, s_q=128, s_kv=128, d=64, ragged=True, **sdpa_kw):
    """sdpa over packed (THD) q / k / v / O: each is (b, h, s, d) with BSHD strides plus a (b + 1) INT64
    ragged offset tensor, in elements, where sequence ``i`` starts (cuDNN reads the batch start from it
    instead of the batch stride). ``ragged=False``: the same graph over padded BSHD buffers (the reference's).
    Stats stays a packed BHSD (b, h, s_q, 1) tensor."""
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="sdpa_ragged")
    t = {}
    for name, s in (("q", s_q), ("k", s_kv), ("v", s_kv)):
        offset = None
        if ragged:
            offset = t[f"{name}_offset"] = g.tensor(name=f"{name}_offset", dim=[b + 1, 1, 1, 1],
                                                    stride=[1, 1, 1, 1], data_type=F.INT64)
        t[name] = g.tensor(name=name, dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=io,
                           ragged_offset=offset)
    for name in ("seq_len_q", "seq_len_kv"):
        t[name] = g.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT32)
    o, st = g.sdpa(t["q"], t["k"], t["v"], generate_stats=True, attn_scale=1.0 / math.sqrt(d), name="attn",
                   use_padding_mask=True, seq_len_q=t["seq_len_q"], seq_len_kv=t["seq_len_kv"], **sdpa_kw)
    if ragged:
        t["o_offset"] = g.tensor(name="o_offset", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT64)
        o.set_ragged_offset(t["o_offset"])
    o.set_output(True).set_name("O")
    st.set_output(True).set_name("Stats")
    t["O"], t["Stats"] = o, st
    g.validate()
    return g, t


def _packed_view(padded_bshd, seq):
    """The (b, h, s, d) BSHD-strided view of a buffer holding the valid tokens of every sequence packed
    back to back from its start (the rest zero), and the ragged offsets in elements."""
    b, s, h, d = padded_bshd.shape
    flat = np.zeros(padded_bshd.size, padded_bshd.dtype)
    tokens = np.concatenate([padded_bshd[i, :n] for i, n in enumerate(seq)])
    flat[:tokens.size] = tokens.reshape(-1)
    offsets = (np.concatenate([[0], np.cumsum(seq)]) * h * d).astype(np.int64).reshape(b + 1, 1, 1, 1)
    return flat.reshape(b, s, h, d).transpose(0, 2, 1, 3), offsets


def _unpacked(packed_bhsd_view, offsets, seq):
    """Padded (b, h, s, d) from a ragged output read back through its BSHD view (zeros past seq)."""
    b, h, s, d = packed_bhsd_view.shape
    flat = np.ascontiguousarray(np.asarray(packed_bhsd_view, np.float32).transpose(0, 2, 1, 3)).reshape(-1)
    out = np.zeros((b, h, s, d), np.float32)
    for i, n in enumerate(seq):
        start = int(offsets.reshape(-1)[i])
        out[i, :, :n] = flat[start:start + n * h * d].reshape(n, h, d).transpose(1, 0, 2)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("impl", [AttentionImplementation.AUTO, AttentionImplementation.COMPOSITE],
                         ids=["auto", "composite"])
def test_ragged_thd_forward_matches_the_reference(io, impl):
    """CuPy only: a THD layout has BSHD strides, and JAX hands over dense row-major (b, h, s, d) arrays."""
    from gpu_support import assert_close, gpu_run, reference_run
    b, h, s, d = 2, 4, 128, 64
    rng = np.random.default_rng(11)
    seq_q, seq_kv = np.array([s - 7, s // 2 + 3]), np.array([s - 20, s // 3])
    padded = {name: _rand(io, (b, s, h, d), rng) for name in "qkv"}
    for name, seq in (("q", seq_q), ("k", seq_kv), ("v", seq_kv)):
        for i, n in enumerate(seq):
            padded[name][i, n:] = 0
    lengths = {"seq_len_q": seq_q.astype(np.int32).reshape(b, 1, 1, 1),
               "seq_len_kv": seq_kv.astype(np.int32).reshape(b, 1, 1, 1)}
    dense = {name: x.transpose(0, 2, 1, 3) for name, x in padded.items()}
    want = reference_run(ragged_graph, {**dense, **lengths}, {"O", "Stats"}, io=io, ragged=False)
    packed = dict(lengths)
    for name, seq in (("q", seq_q), ("k", seq_kv), ("v", seq_kv)):
        packed[name], packed[f"{name}_offset"] = _packed_view(padded[name], seq)
    packed["o_offset"] = packed["q_offset"]
    kw = dict(io=io, implementation=impl)
    got, g = _or_declined(lambda: gpu_run(ragged_graph, packed, {"O", "Stats"}, "cupy", **kw))
    _assert_cudnn_plan(g)
    o = _unpacked(got["O"], packed["o_offset"], seq_q)
    o_want = np.asarray(want["O"], np.float32).copy()
    stats, stats_want = np.asarray(got["Stats"], np.float32).copy(), np.asarray(want["Stats"], np.float32).copy()
    for i, n in enumerate(seq_q):
        o_want[i, :, n:] = 0
        stats[i, :, n:] = stats_want[i, :, n:] = 0
    dtype = np.dtype(want["O"].dtype).name
    assert_close(o, o_want, dtype, "O (ragged, cupy)", tolerance=TOL_FWD[io])
    assert_close(stats, stats_want, "float32", "Stats (ragged, cupy)", tolerance=TOL_FWD[io])


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_forced_native_backward_matches_the_reference_or_is_declined(io, monkeypatch):
    """BACKWARD_ORDER = ("native",) lowers sdpa_backward to the one SDPA_BWD operation. cuDNN 9.19 on H200
    refused its operation graph (finalize: BAD_PARAM, buildDAG) in an earlier run: a clean decline."""
    monkeypatch.setattr(_lower_sdpa, "BACKWARD_ORDER", ("native",))
    g, _ = bwd_graph("cuda", io=io)
    assert ops_of(lower_program(g)) == [("OPERATION_SDPA_BWD", None)]
    _compare_on_cudnn_or_declined(bwd_graph, _bwd_inputs(io), {"dQ", "dK", "dV"}, "cupy", TOL_BWD[io], io=io)


# ---- CPU: forcing the native backward ---------------------------------------------------------------------

def test_backward_order_forces_the_native_operation_or_says_why_not(native_names, monkeypatch):
    monkeypatch.setattr(_lower_sdpa, "BACKWARD_ORDER", ("native",))
    g, t = bwd_graph("cuda")
    (op,) = lower_program(g, version=91900).of_kind("OPERATION_SDPA_BWD")
    assert op["CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC"] == Ref(f"tensor_{t['dQ'].uid}")
    k = tensor_attrs(lower_program(g, version=91900), Ref(f"tensor_{t['k'].uid}"))
    assert k["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 64)     # as laid out, not transposed
    g, _ = bwd_graph("cuda", use_causal_mask=True)
    with pytest.raises(GraphNotSupportedError, match="no lowering covers it; native: .*causal"):
        lower_program(g, version=91900)


def test_default_backward_order_is_the_composite_first(scratch, native_names):
    assert _lower_sdpa.BACKWARD_ORDER[0] == "composite"
    g, _ = bwd_graph("cuda")
    assert ("OPERATION_SDPA_BWD", None) not in ops_of(lower_program(g, version=91900))


def test_sink_alibi_paged_and_ragged_graphs_lower(scratch, native_names):
    """The graphs the GPU tests above build lower on 9.19 (CPU check of the builders and the lowering)."""
    g, _ = fwd_graph("cuda", sink=True, use_causal_mask=True)
    assert ("OPERATION_SDPA_FWD", None) not in ops_of(lower_program(g, version=91900))
    g, t = bwd_graph("cuda", sink=True, dsink=True, use_causal_mask=True)
    program = lower_program(g, version=91900)
    assert any(s.attrs.get("CUDNN_ATTR_OPERATION_REDUCTION_YDESC") == Ref(f"tensor_{t['dSink_token'].uid}")
               for s in program.steps)
    g, _ = bwd_graph("cuda", use_causal_mask=True, use_alibi_mask=True)
    assert ops_of(lower_program(g, version=91900))[5:8] == [("OPERATION_POINTWISE", PW.GEN_INDEX),
                                                           ("OPERATION_POINTWISE", PW.GEN_INDEX),
                                                           ("OPERATION_POINTWISE", PW.SUB)]
    g, _ = paged_graph("cuda")
    assert ops_of(lower_program(g, version=91900)) == [("OPERATION_SDPA_FWD", None)]
    g, _ = paged_graph("cuda", implementation=AttentionImplementation.COMPOSITE)
    assert ops_of(lower_program(g, version=91900)).count(("OPERATION_PAGED_CACHE_LOAD", None)) == 2


def test_ragged_offsets_reach_the_tensor_descriptors(scratch, native_names):
    g, t = ragged_graph("cuda", use_causal_mask=True)
    program = lower_program(g, version=91900)
    for name in ("q", "k", "v", "O"):
        attrs = tensor_attrs(program, Ref(f"tensor_{t[name].uid}"))
        offset = "o_offset" if name == "O" else f"{name}_offset"
        assert attrs["CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"] == Ref(f"tensor_{t[offset].uid}")


# ---- head dim 256, ragged (THD) backward, paged backward, and the backward features without a GPU test ------
#
# cuDNN's support matrix (9.18) gives fp16 / bf16 attention on Hopper head dims up to 256 forward and backward,
# ragged layouts in both directions and paged K/V caches in the forward only. Where the loaded cuDNN still has
# no engine, the test checks that the decline is a GraphNotSupportedError carrying cuDNN's / the lowering's
# reason, then skips with it.

def _decline_reason(exc) -> str:
    """The reasons inside a decline; asserts there is one from the cuDNN backend (its lowering names the
    node, the engine quotes cuDNN), not a bare "no engine"."""
    declines = getattr(exc, "declines", None) or [("", str(exc))]
    reasons = [f"{who}: {why}" for who, why in declines if "cuDNN" in why or "node 'attn" in why]
    assert reasons, f"the decline does not say why the cuDNN backend refused: {exc}"
    return "; ".join(reasons)


def _or_declined_with_reason(run, what: str):
    """``run()``, or a skip quoting the reason of a clean decline; anything else fails the test."""
    try:
        return run()
    except GraphNotSupportedError as exc:
        pytest.skip(f"{what}: declined cleanly ({type(exc).__name__}): {_decline_reason(exc)}")


D256 = dict(h_q=2, d=256)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_d256_forward_matches_the_reference_or_is_declined(io, producer):
    from gpu_support import compare
    host = _fwd_inputs(io, **D256)
    kw = dict(D256, io=io, use_causal_mask=True)
    g = _or_declined_with_reason(
        lambda: compare(fwd_graph, host, {"O", "Stats"}, producer, tolerance=TOL_FWD[io], **kw), "d=256 forward")
    _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("producer", ["cupy", "jax"])
def test_d256_backward_matches_the_reference_or_is_declined(io, producer):
    from gpu_support import compare
    host = _bwd_inputs(io, **D256, use_causal_mask=True)
    kw = dict(D256, io=io, use_causal_mask=True)
    g = _or_declined_with_reason(
        lambda: compare(bwd_graph, host, {"dQ", "dK", "dV"}, producer, tolerance=TOL_BWD[io], **kw),
        "d=256 backward")
    _assert_cudnn_plan(g)


# Backward features whose earlier GPU tests were CuPy-only or missing: each from CuPy in both dtypes where it
# had none, and from JAX. "shape" keys size the inputs, the rest go to the graph builder.
MORE_BACKWARD_CASES = {
    "causal_bottom_right": dict(s_q=64, s_kv=192, use_causal_mask_bottom_right=True),
    "mqa": dict(h_q=4, h_k=1, use_causal_mask=True),
    "custom_dropout": dict(custom_dropout=True, use_causal_mask=True),
    "gqa": dict(h_q=4, h_k=2, use_causal_mask=True),
    "padding": dict(padding=True, use_causal_mask=True),
    "bias": dict(bias=True),
    "sliding_window": dict(diagonal_band_right_bound=0, diagonal_band_left_bound=32),
    "alibi": dict(use_causal_mask=True, use_alibi_mask=True),
    "sink": dict(sink=True, dsink=True, use_causal_mask=True),
}
_NEW_BWD = [(F.BFLOAT16, "cupy"), (F.HALF, "cupy"), (F.BFLOAT16, "jax")]


@pytest.mark.gpu
@pytest.mark.parametrize("case,io,producer", [
    *[(case, io, producer) for case in ("causal_bottom_right", "mqa", "custom_dropout") for io, producer in _NEW_BWD],
    *[(case, F.HALF, "jax") for case in ("gqa", "padding", "bias", "sliding_window", "alibi", "sink")]],
    ids=lambda x: {F.BFLOAT16: "bf16", F.HALF: "fp16"}.get(x, x) if not isinstance(x, str) else x)
def test_more_backward_features_match_the_reference(case, io, producer):
    from gpu_support import compare
    kw = dict(MORE_BACKWARD_CASES[case])
    shape = {k: kw[k] for k in ("h_q", "h_k", "s_q", "s_kv", "padding", "bias", "sink") if k in kw}
    mask = {k: v for k, v in kw.items() if k.startswith(("use_", "diagonal"))}
    host = _bwd_inputs(io, **shape, **mask, keep=0.8 if kw.get("custom_dropout") else None)
    outs = {"dQ", "dK", "dV"} | ({"dSink_token"} if kw.get("dsink") else set())
    g = _or_declined_with_reason(
        lambda: compare(bwd_graph, host, outs, producer, tolerance=TOL_BWD[io], io=io, **kw), f"{case} backward")
    _assert_cudnn_plan(g)


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
def test_philox_dropout_backward_equals_its_dumped_keep_mask_used_as_a_custom_mask(io):
    """The reference has no Philox stream: the backward's own rng_dump, used as a custom keep-mask on the
    reference, must give the same dQ / dK / dV."""
    from gpu_support import assert_close, gpu_run, host_dtype, reference_run
    _skip_unless_lowerable(bwd_graph, io=io, philox=0.2, rng_dump=True)
    host = _bwd_inputs(io)
    host["seed"] = np.full((1, 1, 1, 1), 1234, np.int64)
    host["offset"] = np.full((1, 1, 1, 1), 7, np.int64)
    got, g = _or_declined_with_reason(
        lambda: gpu_run(bwd_graph, host, {"dQ", "dK", "dV", "rng_dump"}, "cupy", io=io, philox=0.2, rng_dump=True),
        "Philox dropout backward")
    _assert_cudnn_plan(g)
    keep = np.asarray(got["rng_dump"], np.float32)
    assert set(np.unique(keep)) <= {0.0, 1.0}
    assert abs(float(keep.mean()) - 0.8) < 0.02
    custom = {k: v for k, v in host.items() if k not in ("seed", "offset")}
    custom["mask"] = keep.astype(host_dtype(io))
    custom["scale"] = np.full((1, 1, 1, 1), 1 / 0.8, np.float32)
    custom["scale_inv"] = np.full((1, 1, 1, 1), 0.8, np.float32)
    want = reference_run(bwd_graph, custom, {"dQ", "dK", "dV"}, io=io, custom_dropout=True)
    for name in ("dQ", "dK", "dV"):
        assert_close(got[name], want[name], np.dtype(want[name].dtype).name, f"{name} (Philox backward)",
                     tolerance=TOL_BWD[io])


def ragged_bwd_graph(device, io=F.BFLOAT16, *, b=2, h_q=4, h_k=None, s_q=128, s_kv=128, d=64, ragged=True,
                     **sdpa_kw):
    """sdpa_backward over packed (THD) q / k / v / o / dO, writing packed dQ / dK / dV: (b, h, s, d) tensors
    with BSHD strides and (b + 1) INT64 element offsets, shared as cudnn-frontend's samples share them (q and
    dQ, k and dK, v and dV, o and dO). ``ragged=False``: the same graph over padded BSHD buffers (the
    reference's). Stats is a dense BHSD (b, h_q, s_q, 1) tensor."""
    h_k = h_k or h_q
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device=device, name="sdpa_ragged_bwd")
    t = {}
    offsets = {}
    for name in ("q", "k", "v", "o"):
        offsets[name] = t[f"{name}_offset"] = g.tensor(name=f"{name}_offset", dim=[b + 1, 1, 1, 1],
                                                       stride=[1, 1, 1, 1], data_type=F.INT64) if ragged else None
    for name, h, s, shares in (("q", h_q, s_q, "q"), ("k", h_k, s_kv, "k"), ("v", h_k, s_kv, "v"),
                               ("o", h_q, s_q, "o"), ("dO", h_q, s_q, "o")):
        t[name] = g.tensor(name=name, dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=io,
                           ragged_offset=offsets[shares])
    t["stats"] = g.tensor(name="stats", dim=[b, h_q, s_q, 1], stride=_dense((b, h_q, s_q, 1)), data_type=F.FLOAT)
    for name in ("seq_len_q", "seq_len_kv"):
        t[name] = g.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=F.INT32)
    dq, dk, dv = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], attn_scale=1.0 / math.sqrt(d),
                                 name="attn_bwd", use_padding_mask=True, seq_len_q=t["seq_len_q"],
                                 seq_len_kv=t["seq_len_kv"], **sdpa_kw)
    for name, x, shares in (("dQ", dq, "q"), ("dK", dk, "k"), ("dV", dv, "v")):
        x.set_output(True).set_name(name)
        if ragged:
            x.set_ragged_offset(offsets[shares])
        t[name] = x
    g.validate()
    return g, t


RAGGED_BACKWARD_CASES = {
    "d64": dict(d=64),
    "d128_causal": dict(d=128, use_causal_mask=True),
    "gqa_causal_bottom_right": dict(h_q=4, h_k=2, use_causal_mask_bottom_right=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("io", IO, ids=IO_IDS)
@pytest.mark.parametrize("case", list(RAGGED_BACKWARD_CASES))
def test_ragged_backward_matches_the_reference(io, case):
    """dQ / dK / dV of a packed (THD) backward against the reference on the padded BSHD layout. CuPy only:
    JAX hands over dense row-major (b, h, s, d) arrays, not a BSHD-strided view of a packed buffer."""
    from cudnn_graph.engines.reference import _kernels_sdpa
    from gpu_support import assert_close, gpu_run, host_dtype, reference_run
    kw = dict(RAGGED_BACKWARD_CASES[case])
    shape = dict(b=2, h_q=kw.pop("h_q", 4), s=128, d=kw.pop("d", 64))
    h_k = kw.pop("h_k", None) or shape["h_q"]
    b, h_q, s, d = shape["b"], shape["h_q"], shape["s"], shape["d"]
    rng = np.random.default_rng(17)
    seq_q, seq_kv = np.array([s - 20, s // 3]), np.array([s - 7, s // 2 + 3])   # s_kv >= s_q per sequence
    padded = {"q": _rand(io, (b, s, h_q, d), rng), "k": _rand(io, (b, s, h_k, d), rng),
              "v": _rand(io, (b, s, h_k, d), rng), "dO": _rand(io, (b, s, h_q, d), rng)}
    lengths = {"seq_len_q": seq_q.astype(np.int32).reshape(b, 1, 1, 1),
               "seq_len_kv": seq_kv.astype(np.int32).reshape(b, 1, 1, 1)}
    for name, seq in (("q", seq_q), ("k", seq_kv), ("v", seq_kv), ("dO", seq_q)):
        for i, n in enumerate(seq):
            padded[name][i, n:] = 0
    # o and Stats from the reference forward on the padded layout (zero past seq_len_q)
    attrs = {"generate_stats": True, "attn_scale": 1.0 / math.sqrt(d), "use_padding_mask": True, **kw}
    for key in ("use_causal_mask", "use_causal_mask_bottom_right", "diagonal_band_left_bound",
                "diagonal_band_right_bound", "sliding_window_length", "diagonal_alignment"):
        attrs.setdefault(key, None)
    fwd_in = {name: padded[name].transpose(0, 2, 1, 3) for name in "qkv"}
    fwd = _kernels_sdpa.sdpa_forward_kernel({**fwd_in, **lengths}, attrs, {
        "O": ((b, h_q, s, d), host_dtype(io)), "Stats": ((b, h_q, s, 1), np.float32)})
    padded["o"] = np.ascontiguousarray(fwd["O"].transpose(0, 2, 1, 3))
    dense = {name: x.transpose(0, 2, 1, 3) for name, x in padded.items()}
    common = dict(io=io, h_q=h_q, h_k=h_k, s_q=s, s_kv=s, d=d, **kw)
    want = reference_run(ragged_bwd_graph, {**dense, **lengths, "stats": fwd["Stats"]}, {"dQ", "dK", "dV"},
                         ragged=False, **common)
    packed = {**lengths, "stats": fwd["Stats"]}
    for name, seq, shares in (("q", seq_q, "q"), ("k", seq_kv, "k"), ("v", seq_kv, "v"), ("o", seq_q, "o"),
                              ("dO", seq_q, "o")):
        packed[name], packed[f"{shares}_offset"] = _packed_view(padded[name], seq)
    got, g = _or_declined_with_reason(lambda: gpu_run(ragged_bwd_graph, packed, {"dQ", "dK", "dV"}, "cupy",
                                                      **common), f"ragged backward ({case})")
    _assert_cudnn_plan(g)
    for name, seq, shares in (("dQ", seq_q, "q"), ("dK", seq_kv, "k"), ("dV", seq_kv, "v")):
        value = _unpacked(got[name], packed[f"{shares}_offset"], seq)
        expected = np.asarray(want[name], np.float32).copy()
        for i, n in enumerate(seq):
            expected[i, :, n:] = 0
        assert_close(value, expected, np.dtype(want[name].dtype).name, f"{name} (ragged, cupy)",
                     tolerance=TOL_BWD[io])


# ---- CPU: the lowering and declines behind the GPU tests above -----------------------------------------

def test_d256_lowers_both_ways_and_larger_backward_head_dims_are_declined(scratch, native_names):
    g, _ = fwd_graph("cuda", h_q=2, d=256, use_causal_mask=True)
    assert ops_of(lower_program(g, version=91900))[0] == ("OPERATION_MATMUL", None)
    g, t = bwd_graph("cuda", h_q=2, d=256, use_causal_mask=True)
    program = lower_program(g, version=91900)
    assert ("OPERATION_SDPA_BWD", None) not in ops_of(program)
    assert tensor_attrs(program, Ref(f"tensor_{t['k'].uid}"))["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 2, 256, 128)
    g, _ = bwd_graph("cuda", h_q=2, d=264, use_causal_mask=True)
    with pytest.raises(GraphNotSupportedError, match=r"node 'attn_bwd'.*head dims up to 256 \(on sm_90.*d_qk=264"):
        lower_program(g, version=91900)


def test_head_dims_above_256_decline_the_native_backward_too(native_names, monkeypatch):
    monkeypatch.setattr(_lower_sdpa, "BACKWARD_ORDER", ("native",))
    g, _ = bwd_graph("cuda", h_q=2, d=320)
    with pytest.raises(GraphNotSupportedError, match="head dims up to 256"):
        lower_program(g, version=91900)


def test_paged_sdpa_backward_is_declined_as_forward_only():
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda")
    x = {n: g.tensor(name=n, dim=list(dims), stride=_dense(dims)) for n, dims in (
        ("q", (2, 4, 64, 64)), ("k", (5, 4, 64, 64)), ("v", (5, 4, 64, 64)), ("o", (2, 4, 64, 64)),
        ("dO", (2, 4, 64, 64)))}
    stats = g.tensor(name="stats", dim=[2, 4, 64, 1], stride=_dense((2, 4, 64, 1)), data_type=F.FLOAT)
    table = g.tensor(name="table", dim=[2, 1, 2, 1], stride=[2, 2, 1, 1], data_type=F.INT32)
    for keyword in ("paged_attention_k_table", "paged_attention_v_table"):
        with pytest.raises(GraphNotSupportedError, match=f"sdpa_backward\\(\\): {keyword}: paged K/V caches are "
                                                         "forward only.*N/A for the backward"):
            g.sdpa_backward(x["q"], x["k"], x["v"], x["o"], x["dO"], stats, **{keyword: table})
    with pytest.raises(GraphNotSupportedError, match="forward only"):
        g.scaled_dot_product_flash_attention_backward(x["q"], x["k"], x["v"], x["o"], x["dO"], stats,
                                                      paged_attention_max_seq_len_kv=128)
    assert not g.nodes                              # nothing was added
    with pytest.raises(TypeError, match="unexpected keyword argument 'page_table'"):
        g.sdpa_backward(x["q"], x["k"], x["v"], x["o"], x["dO"], stats, page_table=table)


def test_ragged_backward_puts_the_offsets_where_cudnn_frontend_does(scratch, native_names):
    g, t = ragged_bwd_graph("cuda", use_causal_mask=True)
    program = lower_program(g, version=91900)
    assert ("OPERATION_SDPA_BWD", None) not in ops_of(program)
    for name, shares in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"), ("dO", "o"), ("dQ", "q"), ("dK", "k"),
                         ("dV", "v")):
        attrs = tensor_attrs(program, Ref(f"tensor_{t[name].uid}"))
        assert attrs["CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"] == Ref(f"tensor_{t[shares + '_offset'].uid}"), name
    assert "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC" not in tensor_attrs(program, Ref(f"tensor_{t['stats'].uid}"))
    # K, read transposed for Q K^T, is reshaped back for dQ = dS K: that view keeps K's offsets
    ops = [program.step(n).attrs for n in program.operations]
    reshapes = [op for op in ops if "CUDNN_ATTR_OPERATION_RESHAPE_XDESC" in op]
    k_back = [op for op in reshapes if op["CUDNN_ATTR_OPERATION_RESHAPE_XDESC"] == Ref(f"tensor_{t['k'].uid}")]
    (k_back,) = k_back
    attrs = tensor_attrs(program, k_back["CUDNN_ATTR_OPERATION_RESHAPE_YDESC"])
    assert attrs["CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"] == Ref(f"tensor_{t['k_offset'].uid}")
    assert attrs["CUDNN_ATTR_TENSOR_DIMENSIONS"] == (2, 4, 128, 64)
    assert attrs["CUDNN_ATTR_TENSOR_STRIDES"] == (128 * 4 * 64, 64, 4 * 64, 1)
    # softmax_sum and the dQ accumulator stay dense BHSD (no max_total_seq_len_*), as in cudnn-frontend
    softmax_sum, accum = scratch
    for uid, *_ in (softmax_sum, accum):
        assert "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC" not in tensor_attrs(program, Ref(f"tensor_{uid}"))


def test_ragged_gqa_backward_needs_cudnn_9_6(scratch, native_names):
    g, _ = ragged_bwd_graph("cuda", h_q=4, h_k=2)
    assert ("OPERATION_REDUCTION", RED.ADD) in ops_of(lower_program(g, version=91900))
    with pytest.raises(GraphNotSupportedError, match="ragged .*GQA / MQA.* needs cuDNN >= 9.6.0; loaded 9.5.1"):
        lower_program(g, version=90501)


def test_dropout_backward_graphs_lower(scratch, native_names):
    # A caller's keep-mask in the backward gave a wrong dK on the H200 (cuDNN 9.19): declined, saying so.
    g, t = bwd_graph("cuda", custom_dropout=True, use_causal_mask=True)
    with pytest.raises(GraphNotSupportedError, match="custom dropout mask in the backward.*wrong dK"):
        lower_program(g, version=91900)
    g, t = bwd_graph("cuda", philox=0.2, rng_dump=True)
    program = lower_program(g, version=91900)
    (op,) = program.of_kind("OPERATION_RNG")
    assert op["CUDNN_ATTR_OPERATION_RNG_YDESC"] == Ref(f"tensor_{t['rng_dump'].uid}")


def test_reference_engine_declines_ragged_graphs_instead_of_misreading_them():
    from gpu_support import reference_run
    host = {name: np.zeros(1) for name in ("q",)}
    with pytest.raises(GraphNotSupportedError, match="reference engine does not apply ragged offsets"):
        reference_run(ragged_bwd_graph, host, {"dQ"}, io=F.HALF)
