"""Attention ops: sdpa / sdpa_backward schemas and reference kernels, and the linear-attention schemas.

The forward kernel is checked against a per-(batch, head, query row) loop written here from the documented
semantics (not from the kernel's vectorised masks); the backward kernel against central finite differences
of the forward kernel in float64.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from cudnn_graph.engines.reference import _kernels_sdpa
from cudnn_graph.data_type import DataType
from cudnn_graph.errors import GraphValidationError
from cudnn_graph.ops import SCHEMAS
from cudnn_graph.ops._sdpa import DiagonalAlignment, resolve_masking
from cudnn_graph.ops.schema import REQUIRED, InferContext, TensorInfo


K_SDPA = _kernels_sdpa.KERNELS
H, BF, F32, I32, I64 = DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.INT32, DataType.INT64


# ----------------------------------------------------------------------------------------- helpers

def T(*dim, dt=H, stride=None):
    if stride is None:
        stride, acc = [], 1
        for d in reversed(dim):
            stride.insert(0, acc)
            acc *= d
    return TensorInfo(tuple(dim), tuple(stride), dt)


def bind(op, kw):
    """Split builder keywords into (inputs, attrs) the way the IR does: expand composite keywords,
    convert given attributes, default the rest."""
    s = SCHEMAS[op]
    kw = dict(kw)
    for key, expand in s.keyword_expanders.items():
        if key in kw:
            kw.update(expand(kw.pop(key)))
    inputs = {p.name: kw.pop(p.name, None) for p in s.inputs}
    attrs = {}
    for a in s.attrs:
        if a.name in kw:
            v = kw.pop(a.name)
            attrs[a.name] = a.convert(v) if a.convert else v
        else:
            assert a.default is not REQUIRED, a.name
            attrs[a.name] = a.default
    assert not kw, f"unknown keywords {sorted(kw)}"
    return inputs, attrs


def infer(op, **kw):
    inputs, attrs = bind(op, kw)
    out = SCHEMAS[op].infer(InferContext("node", op, inputs, attrs))
    given = frozenset(k for k, v in inputs.items() if v is not None)
    # Conditional outputs: `when` and infer must agree on which outputs exist.
    expected = {o.name for o in SCHEMAS[op].outputs if o.when is None or o.when(attrs, given)}
    assert set(out) == expected
    return out


def fails(port, op, **kw):
    with pytest.raises(GraphValidationError) as e:
        infer(op, **kw)
    assert e.value.port == port, str(e.value)
    return e.value


def qkv(b=2, hq=4, hk=2, hv=2, sq=8, skv=16, d=64, dv=64, dt=H):
    return dict(q=T(b, hq, sq, d, dt=dt), k=T(b, hk, skv, d, dt=dt), v=T(b, hv, skv, dv, dt=dt))


# ------------------------------------------------------------------------------- sdpa inference

def test_sdpa_infers_o_and_stats():
    out = infer("sdpa", **qkv(), generate_stats=True, attn_scale=T(1, 1, 1, 1, dt=F32))
    assert out["O"].dim == (2, 4, 8, 64) and out["O"].data_type == H
    assert out["Stats"].dim == (2, 4, 8, 1) and out["Stats"].data_type == F32
    assert out["Stats"].stride == (32, 8, 1, 1)


def test_sdpa_stats_only_when_asked():
    assert set(infer("sdpa", **qkv(), generate_stats=False)) == {"O"}
    assert set(infer("sdpa", **qkv(), is_inference=True)) == {"O"}
    assert set(infer("sdpa", **qkv(), is_inference=False)) == {"O", "Stats"}


def test_sdpa_output_keeps_q_layout():
    b, h, s, d = 2, 4, 8, 64
    q = T(b, h, s, d, stride=(s * h * d, d, h * d, 1))      # BSHD storage
    out = infer("sdpa", q=q, k=T(b, h, s, d), v=T(b, h, s, 32), generate_stats=False)
    assert out["O"].dim == (b, h, s, 32) and out["O"].stride == (s * h * 32, 32, h * 32, 1)


def test_sdpa_gqa_mqa_and_different_dv():
    out = infer("sdpa", **qkv(hq=8, hk=1, hv=1, d=128, dv=64, dt=BF), generate_stats=True)
    assert out["O"].dim == (2, 8, 8, 64) and out["O"].data_type == BF
    infer("sdpa", **qkv(hq=8, hk=4, hv=2), generate_stats=True)   # cuDNN allows h_k != h_v


def test_sdpa_masks_padding_bias_dropout_sink_side_outputs():
    b, hq, sq, skv = 2, 4, 8, 16
    out = infer("sdpa", **qkv(), generate_stats=True, bias=T(1, hq, sq, skv), use_padding_mask=True,
                seq_len_q=T(b, 1, 1, 1, dt=I32), seq_len_kv=T(b, 1, 1, 1, dt=I32),
                diagonal_alignment="BOTTOM_RIGHT", diagonal_band_left_bound=4, diagonal_band_right_bound=0,
                dropout=(T(b, 1, sq, skv), T(1, 1, 1, 1, dt=F32)), sink_token=T(1, hq, 1, 1, dt=F32),
                score_max=True, score_sum_exp=True)
    assert out["score_max"].dim == (b, hq, sq, 1) and out["score_sum_exp"].data_type == F32
    philox = infer("sdpa", **qkv(), generate_stats=True, use_causal_mask=True,
                   dropout=(0.1, T(1, 1, 1, 1, dt=I64), T(1, 1, 1, 1, dt=I64)), rng_dump=True)
    assert philox["rng_dump"].dim == (b, hq, sq, skv)


def test_sdpa_paged_kv():
    b, hk, page, pages_per_seq, d = 2, 2, 4, 4, 64
    out = infer("sdpa", q=T(b, 4, 1, d), k=T(20, hk, page, d), v=T(20, hk, page, d), generate_stats=False,
                use_padding_mask=True, seq_len_q=T(b, 1, 1, 1, dt=I32), seq_len_kv=T(b, 1, 1, 1, dt=I32),
                paged_attention_k_table=T(b, 1, pages_per_seq, 1, dt=I32),
                paged_attention_v_table=T(b, 1, pages_per_seq, 1, dt=I32),
                paged_attention_max_seq_len_kv=16)
    assert out["O"].dim == (b, 4, 1, d)


def _paged(b=2, hk=2, page=4, pages_per_seq=4, d=64, **kw):
    return dict(q=T(b, 4, 1, d), k=T(20, hk, page, d), v=T(20, hk, page, d), generate_stats=False,
                paged_attention_k_table=T(b, 1, pages_per_seq, 1, dt=I32),
                paged_attention_v_table=T(b, 1, pages_per_seq, 1, dt=I32), paged_attention_max_seq_len_kv=16,
                **kw)


def test_sdpa_paged_kv_needs_lengths_not_the_padding_mask():
    # cudnn-frontend's rule (its test_sdpa_with_flexible_graph): paged caches need seq_len_q and seq_len_kv;
    # a score_mod may do the masking instead of use_padding_mask.
    lengths = dict(seq_len_q=T(2, 1, 1, 1, dt=I32), seq_len_kv=T(2, 1, 1, 1, dt=I32))
    out = infer("sdpa", **_paged(**lengths, score_mod=lambda graph, score: score))
    assert out["O"].dim == (2, 4, 1, 64)
    e = fails("seq_len_kv", "sdpa", **_paged(seq_len_q=T(2, 1, 1, 1, dt=I32), score_mod=lambda g, s: s))
    assert "paged K/V caches need sequence lengths for both Q and KV" in str(e)
    # Without a padding mask or a score_mod the lengths are read by nothing: refused, as the frontend does.
    fails("seq_len_q", "sdpa", **_paged(**lengths))


def test_sdpa_sequence_lengths_may_be_int64():
    # cudnn-frontend checks no data type on sequence lengths; INT64 ones reach cuDNN as they are.
    for dt in (I32, I64):
        out = infer("sdpa", **qkv(), generate_stats=True, use_padding_mask=True,
                    seq_len_q=T(B, 1, 1, 1, dt=dt), seq_len_kv=T(B, 1, 1, 1, dt=dt))
        assert out["O"].dim == (B, HQ, SQ, 64)
    infer("sdpa", **_paged(use_padding_mask=True, seq_len_q=T(2, 1, 1, 1, dt=I64),
                           seq_len_kv=T(2, 1, 1, 1, dt=I64)))


def test_dropout_keyword_expansion():
    from cudnn_graph.ops._sdpa import expand_dropout_backward, expand_dropout_forward
    assert expand_dropout_forward((0.25, "seed", "off")) == {
        "dropout_probability": 0.25, "dropout_seed": "seed", "dropout_offset": "off"}
    assert expand_dropout_forward(("mask", "scale")) == {"dropout_mask": "mask", "dropout_scale": "scale"}
    assert expand_dropout_backward(("m", "s", "si")) == {
        "dropout_mask": "m", "dropout_scale": "s", "dropout_scale_inv": "si"}
    with pytest.raises(TypeError):
        expand_dropout_forward(("m", "s", "x"))
    with pytest.raises(TypeError):
        expand_dropout_backward((0.1, "seed"))


def test_masking_spellings_fold_together():
    assert resolve_masking({"use_causal_mask": True}).right_bound == 0
    br = resolve_masking({"use_causal_mask_bottom_right": True, "sliding_window_length": 3})
    assert (br.alignment, br.left_bound, br.right_bound) == (DiagonalAlignment.BOTTOM_RIGHT, 3, 0)
    pref = resolve_masking({"diagonal_alignment": DiagonalAlignment.BOTTOM_RIGHT,
                            "diagonal_band_left_bound": 2, "diagonal_band_right_bound": 1})
    assert (pref.left_bound, pref.right_bound) == (2, 1)


def test_positional_order_matches_pygraph():
    fwd, bwd = SCHEMAS["sdpa"], SCHEMAS["sdpa_backward"]
    assert fwd.positional[:6] == ("q", "k", "v", "is_inference", "attn_scale", "bias")
    assert fwd.positional.index("dropout") == 17 and fwd.positional.index("compute_data_type") == 22
    assert len(fwd.positional) == 31 and len(bwd.positional) == 30
    assert bwd.positional[:9] == ("q", "k", "v", "o", "dO", "stats", "attn_scale", "bias", "dBias")
    for s in (fwd, bwd):
        known = set(s.port_names()) | {a.name for a in s.attrs} | set(s.keyword_expanders) \
            | set(s.generic_positional)
        assert set(s.positional) <= known
        assert tuple(s.output_names()[:len(s.returned_outputs)]) == s.returned_outputs
        assert set(s.output_keywords) <= {a.name for a in s.attrs} & set(s.output_names())


def test_sdpa_backward_infers_grads():
    b, hq, sq, skv = 2, 4, 8, 16
    base = qkv()
    out = infer("sdpa_backward", **base, o=T(b, hq, sq, 64), dO=T(b, hq, sq, 64), stats=T(b, hq, sq, 1, dt=F32),
                attn_scale=T(1, 1, 1, 1, dt=F32), bias=T(1, hq, sq, skv), dBias=True, use_causal_mask=True,
                sink_token=T(1, hq, 1, 1, dt=F32), dSink_token=True,
                dropout=(T(1, 1, sq, skv), T(1, 1, 1, 1, dt=F32), T(1, 1, 1, 1, dt=F32)))
    assert out["dQ"].dim == (b, hq, sq, 64) and out["dK"].dim == (b, 2, skv, 64) and out["dV"].dim == (b, 2, skv, 64)
    assert out["dBias"].dim == (1, hq, sq, skv) and out["dSink_token"].dim == (1, hq, 1, 1)
    plain = infer("sdpa_backward", **base, o=T(b, hq, sq, 64), dO=T(b, hq, sq, 64), stats=T(b, hq, sq, 1, dt=F32))
    assert set(plain) == {"dQ", "dK", "dV"}


# ------------------------------------------------------------------------ sdpa invalid cases

B, HQ, SQ, SKV = 2, 4, 8, 16
SEQ = dict(use_padding_mask=True, seq_len_q=T(B, 1, 1, 1, dt=I32), seq_len_kv=T(B, 1, 1, 1, dt=I32))

INVALID_SDPA = [
    ("k", dict(**qkv(hq=6, hk=4, hv=2))),                                            # GQA heads do not divide
    ("v", dict(**qkv(hq=4, hk=2, hv=3))),
    ("k", dict(q=T(2, 4, 8, 64), k=T(2, 4, 16, 32), v=T(2, 4, 16, 64))),                # d_qk mismatch
    ("v", dict(q=T(2, 4, 8, 64), k=T(2, 4, 16, 64), v=T(2, 4, 12, 64))),                # s_kv mismatch
    ("k", dict(q=T(2, 4, 8, 64), k=T(3, 4, 16, 64), v=T(2, 4, 16, 64))),                # batch mismatch
    ("k", dict(q=T(2, 4, 8, 64), k=T(2, 4, 16, 64, dt=BF), v=T(2, 4, 16, 64))),          # dtype mismatch
    ("q", dict(q=T(2, 4, 8, 64, dt=I32), k=T(2, 4, 16, 64), v=T(2, 4, 16, 64))),
    ("q", dict(q=T(4, 8, 64), k=T(2, 4, 16, 64), v=T(2, 4, 16, 64))),                   # rank
    ("seq_len_q", dict(**qkv(), **{**SEQ, "seq_len_q": T(B, 1, 1, 1, dt=F32)})),        # seq_len dtype
    ("seq_len_kv", dict(**qkv(), **{**SEQ, "seq_len_kv": T(B, 2, 1, 1, dt=I32)})),      # seq_len shape
    ("seq_len_kv", dict(**qkv(), use_padding_mask=True, seq_len_q=T(B, 1, 1, 1, dt=I32))),
    ("seq_len_q", dict(**qkv(), seq_len_q=T(B, 1, 1, 1, dt=I32), seq_len_kv=T(B, 1, 1, 1, dt=I32))),
    ("use_causal_mask_bottom_right", dict(**qkv(), use_causal_mask=True, use_causal_mask_bottom_right=True)),
    ("diagonal_band_right_bound", dict(**qkv(), use_causal_mask=True, diagonal_band_right_bound=2)),
    ("diagonal_band_left_bound", dict(**qkv(), diagonal_band_left_bound=0)),
    ("diagonal_band_right_bound", dict(**qkv(), diagonal_band_right_bound=-1)),
    ("sliding_window_length", dict(**qkv(), sliding_window_length=3, diagonal_band_left_bound=3)),
    ("use_alibi_mask", dict(**qkv(), use_alibi_mask=True)),                              # ALiBi needs causal
    ("bias", dict(**qkv(), bias=T(1, 3, SQ, SKV))),                                     # not broadcastable
    ("bias", dict(**qkv(), bias=T(SQ, SKV))),
    ("attn_scale", dict(**qkv(), attn_scale=T(1, 1, 1, 2, dt=F32))),
    ("dropout", dict(**qkv(), dropout=(1.0, T(1, 1, 1, 1, dt=I64), T(1, 1, 1, 1, dt=I64)))),
    ("dropout_seed", dict(**qkv(), dropout=(0.1, T(1, 1, 1, 1, dt=F32), T(1, 1, 1, 1, dt=I64)))),
    ("dropout_mask", dict(**qkv(), dropout=(T(B, HQ, SQ, 3), T(1, 1, 1, 1, dt=F32)))),
    ("rng_dump", dict(**qkv(), rng_dump=True)),
    ("sink_token", dict(**qkv(), sink_token=T(1, 2, 1, 1, dt=F32))),
    ("score_sum_exp", dict(**qkv(), score_max=True)),
    ("block_mask", dict(**qkv(), block_mask=T(B, HQ, 1, 1, dt=F32))),
    ("paged_attention_k_table", dict(q=T(2, 4, 1, 64), k=T(20, 2, 4, 64), v=T(20, 2, 4, 64), **SEQ,
                                     paged_attention_k_table=T(2, 1, 4, 1, dt=I64),
                                     paged_attention_v_table=T(2, 1, 4, 1, dt=I32))),
    ("paged_attention_v_table", dict(q=T(2, 4, 1, 64), k=T(20, 2, 4, 64), v=T(20, 2, 4, 64), **SEQ,
                                     paged_attention_max_seq_len_kv=16,
                                     paged_attention_k_table=T(2, 1, 4, 1, dt=I32),
                                     paged_attention_v_table=T(2, 1, 3, 1, dt=I32))),
    ("seq_len_q", dict(q=T(2, 4, 1, 64), k=T(20, 2, 4, 64), v=T(2, 2, 16, 64),        # paged: lengths
                       paged_attention_k_table=T(2, 1, 4, 1, dt=I32))),
    ("paged_attention_max_seq_len_kv", dict(**qkv(), paged_attention_max_seq_len_kv=16)),
]


@pytest.mark.parametrize("port,kw", INVALID_SDPA, ids=[f"{i}-{p}" for i, (p, _) in enumerate(INVALID_SDPA)])
def test_sdpa_invalid(port, kw):
    kw.setdefault("generate_stats", True)
    fails(port, "sdpa", **kw)


def test_sdpa_needs_exactly_one_stats_switch():
    fails("generate_stats", "sdpa", **qkv())
    fails("generate_stats", "sdpa", **qkv(), generate_stats=True, is_inference=False)


def test_sdpa_backward_invalid():
    b, hq, sq = 2, 4, 8
    good = dict(**qkv(), o=T(b, hq, sq, 64), dO=T(b, hq, sq, 64), stats=T(b, hq, sq, 1, dt=F32))
    fails("stats", "sdpa_backward", **{**good, "stats": T(b, hq, sq, 1)})             # stats must be FLOAT
    fails("stats", "sdpa_backward", **{**good, "stats": T(b, hq, sq, 2, dt=F32)})
    fails("dO", "sdpa_backward", **{**good, "dO": T(b, hq, sq, 32)})
    fails("dBias", "sdpa_backward", **good, dBias=True)                                 # dBias without bias
    fails("dSink_token", "sdpa_backward", **good, dSink_token=True)
    fails("dropout_scale_inv", "sdpa_backward", **good,
          dropout_mask=T(b, hq, sq, 16), dropout_scale=T(1, 1, 1, 1, dt=F32))
    fails("k", "sdpa_backward", **{**good, "k": T(b, 3, 16, 64)})


# --------------------------------------------------------------- linear attention inference

TT, HH, KK, VV, NN = 10, 2, 16, 32, 3


def la(op, **over):
    kw = dict(q=T(TT, HH, KK, dt=BF), k=T(TT, HH, KK, dt=BF), v=T(TT, HH, VV, dt=BF),
              g=T(TT, HH, KK, dt=F32) if op in ("kda", "kda_bwd", "gdn2") else T(TT, HH, dt=F32),
              beta=T(TT, HH, KK, dt=BF) if op == "gdn2" else T(TT, HH, dt=BF),
              cu_seqlens=T(NN + 1, dt=I32))
    if op == "gdn2":
        kw["w"] = T(TT, HH, VV, dt=BF)
    if op.endswith("_bwd"):
        kw["dO"] = T(TT, HH, VV, dt=BF)
    kw.update(over)
    return kw


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_linear_attention_forward_infer(op):
    assert SCHEMAS[op].python_only and SCHEMAS[op].family == "linear_attention"
    out = infer(op, **la(op))
    assert set(out) == {"o"} and out["o"].dim == (TT, HH, VV) and out["o"].data_type == BF
    out = infer(op, **la(op, initial_state=T(NN, HH, KK, VV, dt=F32)), output_final_state=True, scale=0.5,
                use_qk_l2norm=True)
    assert out["final_state"].dim == (NN, HH, KK, VV) and out["final_state"].data_type == F32


@pytest.mark.parametrize("op,g_dim", [("gdn_bwd", (TT, HH)), ("kda_bwd", (TT, HH, KK))])
def test_linear_attention_backward_infer(op, g_dim):
    out = infer(op, **la(op))
    assert set(out) == {"dq", "dk", "dv", "dg", "dbeta"}
    assert out["dg"].dim == g_dim and out["dg"].data_type == F32 and out["dbeta"].data_type == BF
    out = infer(op, **la(op, initial_state=T(NN, HH, KK, VV, dt=F32), d_final_state=T(NN, HH, KK, VV, dt=F32)))
    assert out["d_initial_state"].dim == (NN, HH, KK, VV)


def test_linear_attention_scale_default():
    from cudnn_graph.ops._linear_attention import resolved_scale
    assert resolved_scale({"scale": None}, 64) == 0.125 and resolved_scale({"scale": 2.0}, 64) == 2.0
    with pytest.raises(ValueError):
        bind("gdn", {"scale": -1.0})


INVALID_LA = [
    ("gdn", "cu_seqlens", dict(cu_seqlens=T(NN + 1, dt=I64))),                        # wrong dtype
    ("gdn", "cu_seqlens", dict(cu_seqlens=T(1, dt=I32))),                             # needs >= 2 entries
    ("gdn", "cu_seqlens", dict(cu_seqlens=T(2, 2, dt=I32))),                          # must be 1-D
    ("gdn", "g", dict(g=T(TT, HH, KK, dt=F32))),                                      # gdn gate is (T, H)
    ("gdn", "g", dict(g=T(TT, HH, dt=BF))),                                           # gates are fp32
    ("gdn", "beta", dict(beta=T(TT, HH + 1, dt=BF))),
    ("gdn", "v", dict(v=T(TT + 1, HH, VV, dt=BF))),
    ("gdn", "k", dict(k=T(TT, HH, KK + 1, dt=BF))),
    ("gdn", "k", dict(k=T(TT, HH, KK, dt=H))),                                        # q/k/v one type
    ("gdn", "q", dict(q=T(TT, HH, KK, dt=I32), k=T(TT, HH, KK, dt=I32), v=T(TT, HH, VV, dt=I32))),
    ("gdn", "initial_state", dict(initial_state=T(NN + 1, HH, KK, VV, dt=F32))),      # batch != N
    ("gdn", "initial_state", dict(initial_state=T(NN, HH, VV, KK, dt=F32))),          # K/V swapped
    ("gdn", "initial_state", dict(initial_state=T(NN, HH, KK, VV, dt=BF))),           # states are fp32
    ("kda", "g", dict(g=T(TT, HH, dt=F32))),                                          # kda gate is (T, H, K)
    ("gdn2", "w", dict(w=T(TT, HH, KK, dt=BF))),                                      # w is (T, H, V)
    ("gdn2", "beta", dict(beta=T(TT, HH, dt=BF))),                                    # gdn2 beta is (T, H, K)
    ("gdn_bwd", "dO", dict(dO=T(TT, HH, KK, dt=BF))),
    ("gdn_bwd", "d_final_state", dict(d_final_state=T(NN, HH, KK, VV, dt=BF))),
    ("kda_bwd", "g", dict(g=T(TT, HH, dt=F32))),
]


@pytest.mark.parametrize("op,port,over", INVALID_LA, ids=[f"{o}-{p}-{i}" for i, (o, p, _) in enumerate(INVALID_LA)])
def test_linear_attention_invalid(op, port, over):
    fails(port, op, **la(op, **over))


def test_linear_attention_missing_cu_seqlens():
    kw = la("gdn")
    del kw["cu_seqlens"]
    fails("cu_seqlens", "gdn", **kw)


# ------------------------------------------------------------- independent loop reference (forward)

def slopes_by_powers(h):
    """ALiBi slopes as geometric sequences: m0^1..m0^n with m0 = 2^(-8/n), then odd powers of 2^(-4/n)."""
    n = 2 ** int(math.floor(math.log2(h)))
    m = [(2.0 ** (-8.0 / n)) ** e for e in range(1, n + 1)]
    m += [(2.0 ** (-4.0 / n)) ** e for e in range(1, 2 * (h - n), 2)]
    return m


def loop_sdpa(q, k, v, *, scale=1.0, bias=None, alibi=False, seq_q=None, seq_kv=None, left=None, right=None,
              bottom_right=False, drop=None, sink=None):
    """One (b, h, i) query row at a time, straight from the documented mask rules."""
    b, hq, sq, _ = q.shape
    hk, skv, hv, dv = k.shape[1], k.shape[2], v.shape[1], v.shape[3]
    slopes = slopes_by_powers(hq)
    o = np.zeros((b, hq, sq, dv))
    lse = np.zeros((b, hq, sq, 1))
    for bi in range(b):
        nq = sq if seq_q is None else int(seq_q[bi])
        nk = skv if seq_kv is None else int(seq_kv[bi])
        diag = (nk - nq) if bottom_right else 0
        for h in range(hq):
            kh, vh = h // (hq // hk), h // (hq // hv)
            for i in range(nq):
                cols, vals = [], []
                for j in range(nk):
                    if right is not None and j > i + diag + right:
                        continue
                    if left is not None and j <= i + diag - left:
                        continue
                    x = scale * float(np.dot(q[bi, h, i], k[bi, kh, j]))
                    if bias is not None:
                        x += bias[bi % bias.shape[0], h % bias.shape[1], i % bias.shape[2], j % bias.shape[3]]
                    if alibi:
                        x += slopes[h] * (j - i)
                    cols.append(j)
                    vals.append(x)
                terms = vals + ([float(sink[0, h, 0, 0])] if sink is not None else [])
                if not terms:
                    lse[bi, h, i, 0] = -np.inf
                    continue
                top = max(terms)
                total = sum(math.exp(t - top) for t in terms)
                lse[bi, h, i, 0] = top + math.log(total)
                for j, x in zip(cols, vals):
                    p = math.exp(x - lse[bi, h, i, 0])
                    if drop is not None:
                        p *= drop[0][bi % drop[0].shape[0], h % drop[0].shape[1], i, j] * drop[1]
                    o[bi, h, i] += p * v[bi, vh, j]
    return o, lse


def run_fwd(arrays, out_dtype=np.float32, **kw):
    inputs, attrs = bind("sdpa", {**arrays, **kw})
    q = inputs["q"]
    dv = inputs["v"].shape[3]
    outputs = {"O": ((q.shape[0], q.shape[1], q.shape[2], dv), out_dtype)}
    if attrs.get("generate_stats"):
        outputs["Stats"] = ((q.shape[0], q.shape[1], q.shape[2], 1), np.float32 if out_dtype == np.float32
                            else out_dtype)
    if attrs.get("score_max") is not None:
        outputs["score_max"] = outputs["score_sum_exp"] = ((q.shape[0], q.shape[1], q.shape[2], 1), out_dtype)
    return K_SDPA["sdpa"](inputs, attrs, outputs, DataType.FLOAT)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(arrays, ref_kw, **kw):
    res = run_fwd(arrays, generate_stats=True, **kw)
    o_ref, lse_ref = loop_sdpa(*(arrays[n].astype(np.float64) for n in ("q", "k", "v")), **ref_kw)
    np.testing.assert_allclose(res["O"], o_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(res["Stats"], lse_ref, rtol=2e-5, atol=2e-5)
    return res


def test_kernel_causal_gqa_padding():
    rng = np.random.default_rng(0)
    a = dict(q=rand(rng, 3, 4, 6, 8), k=rand(rng, 3, 2, 7, 8), v=rand(rng, 3, 1, 7, 5))
    sq, skv = np.array([6, 3, 5], np.int32), np.array([7, 4, 2], np.int32)
    res = check(a, dict(scale=0.3, seq_q=sq, seq_kv=skv, right=0), attn_scale=0.3,
                use_padding_mask=True, seq_len_q=sq.reshape(3, 1, 1, 1), seq_len_kv=skv.reshape(3, 1, 1, 1),
                use_causal_mask=True)
    assert np.all(res["O"][1, :, 3:] == 0) and np.all(res["Stats"][1, :, 3:] == 0)   # padded rows -> 0


def test_kernel_sliding_window_top_left():
    rng = np.random.default_rng(1)
    a = dict(q=rand(rng, 2, 2, 5, 4), k=rand(rng, 2, 2, 7, 4), v=rand(rng, 2, 2, 7, 3))
    check(a, dict(left=2, right=1), diagonal_band_left_bound=2, diagonal_band_right_bound=1)
    check(a, dict(left=3, right=0), use_causal_mask=True, sliding_window_length=3)


def test_kernel_bias_broadcasts():
    rng = np.random.default_rng(2)
    a = dict(q=rand(rng, 2, 3, 4, 8), k=rand(rng, 2, 3, 6, 8), v=rand(rng, 2, 3, 6, 8))
    for shape in [(1, 3, 4, 6), (2, 1, 4, 6), (1, 1, 4, 6), (2, 3, 4, 6)]:
        bias = rand(rng, *shape)
        check(a, dict(scale=0.5, bias=bias), attn_scale=np.full((1, 1, 1, 1), 0.5, np.float32), bias=bias)


def test_kernel_alibi_non_power_of_two_heads():
    rng = np.random.default_rng(3)
    a = dict(q=rand(rng, 1, 6, 5, 4), k=rand(rng, 1, 6, 5, 4), v=rand(rng, 1, 6, 5, 4))
    check(a, dict(alibi=True, right=0), use_alibi_mask=True, use_causal_mask=True)


def test_kernel_bottom_right():
    rng = np.random.default_rng(4)
    a = dict(q=rand(rng, 2, 2, 3, 4), k=rand(rng, 2, 2, 6, 4), v=rand(rng, 2, 2, 6, 4))
    check(a, dict(right=0, bottom_right=True), use_causal_mask_bottom_right=True)
    # Per-batch diagonal with variable sequence lengths, plus a bottom-right sliding window.
    sq, skv = np.array([3, 2], np.int32), np.array([6, 4], np.int32)
    check(a, dict(seq_q=sq, seq_kv=skv, right=0, left=2, bottom_right=True),
          use_padding_mask=True, seq_len_q=sq.reshape(2, 1, 1, 1), seq_len_kv=skv.reshape(2, 1, 1, 1),
          diagonal_alignment=DiagonalAlignment.BOTTOM_RIGHT, diagonal_band_right_bound=0,
          diagonal_band_left_bound=2)


def test_kernel_fully_masked_row_and_sink():
    rng = np.random.default_rng(5)
    # s_q > s_kv with bottom-right causal: the first rows see no key at all.
    a = dict(q=rand(rng, 1, 2, 5, 4), k=rand(rng, 1, 2, 3, 4), v=rand(rng, 1, 2, 3, 4))
    res = check(a, dict(right=0, bottom_right=True), use_causal_mask_bottom_right=True)
    assert np.all(res["O"][:, :, :2] == 0) and np.all(np.isneginf(res["Stats"][:, :, :2]))
    sink = rand(rng, 1, 2, 1, 1)
    check(a, dict(right=0, sink=sink), use_causal_mask=True, sink_token=sink)


def test_kernel_custom_dropout_mask():
    rng = np.random.default_rng(6)
    a = dict(q=rand(rng, 2, 2, 4, 4), k=rand(rng, 2, 2, 5, 4), v=rand(rng, 2, 2, 5, 4))
    mask = (rng.random((2, 1, 4, 5)) > 0.3).astype(np.float32)
    check(a, dict(drop=(mask, 1 / 0.7)), dropout=(mask, np.full((1, 1, 1, 1), 1 / 0.7, np.float32)))


def test_kernel_strided_inputs_and_score_max():
    rng = np.random.default_rng(7)
    base = rand(rng, 2, 5, 3, 4)                         # BSHD storage viewed as BHSD
    q = base.transpose(0, 2, 1, 3)
    a = dict(q=q, k=rand(rng, 2, 3, 5, 4).transpose(0, 1, 2, 3), v=rand(rng, 2, 3, 5, 4)[:, :, :, ::-1])
    res = check(a, dict(), score_max=True, score_sum_exp=True)
    lse = res["score_max"] + np.log(res["score_sum_exp"])
    np.testing.assert_allclose(lse, res["Stats"], rtol=1e-5, atol=1e-5)


def test_kernel_paged_matches_dense():
    rng = np.random.default_rng(8)
    b, hk, page, d, pages_per_seq = 2, 2, 2, 4, 3
    s_kv = page * pages_per_seq
    k, v = rand(rng, b, hk, s_kv, d), rand(rng, b, hk, s_kv, d)
    q = rand(rng, b, 4, 2, d)
    perm = rng.permutation(b * pages_per_seq)           # scatter logical pages over the container
    table = perm.reshape(b, 1, pages_per_seq, 1).astype(np.int32)
    kc = np.zeros((b * pages_per_seq, hk, page, d), np.float32)
    vc = np.zeros_like(kc)
    for bi in range(b):
        for p in range(pages_per_seq):
            kc[table[bi, 0, p, 0]] = k[bi, :, p * page:(p + 1) * page]
            vc[table[bi, 0, p, 0]] = v[bi, :, p * page:(p + 1) * page]
    sq, skv = np.array([2, 1], np.int32), np.array([6, 3], np.int32)
    pad = dict(use_padding_mask=True, seq_len_q=sq.reshape(b, 1, 1, 1), seq_len_kv=skv.reshape(b, 1, 1, 1))
    paged = run_fwd(dict(q=q, k=kc, v=vc), generate_stats=True, **pad, paged_attention_k_table=table,
                    paged_attention_v_table=table)
    dense = run_fwd(dict(q=q, k=k, v=v), generate_stats=True, **pad)
    np.testing.assert_allclose(paged["O"], dense["O"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(paged["Stats"], dense["Stats"], rtol=1e-6, atol=1e-6)


def test_kernel_int64_lengths_match_int32():
    rng = np.random.default_rng(9)
    a = dict(q=rand(rng, 2, 2, 3, 4), k=rand(rng, 2, 2, 5, 4), v=rand(rng, 2, 2, 5, 4))
    sq, skv = np.array([3, 1]).reshape(2, 1, 1, 1), np.array([2, 5]).reshape(2, 1, 1, 1)
    by_type = [run_fwd(a, generate_stats=True, use_padding_mask=True, seq_len_q=sq.astype(t),
                       seq_len_kv=skv.astype(t)) for t in (np.int32, np.int64)]
    np.testing.assert_array_equal(by_type[0]["O"], by_type[1]["O"])
    np.testing.assert_array_equal(by_type[0]["Stats"], by_type[1]["Stats"])


def test_kernel_paged_loads_read_seq_len_kv_tokens_without_the_padding_mask():
    # cuDNN's paged-cache load takes seq_len_kv: pages past it are never read, mask or no mask.
    rng = np.random.default_rng(10)
    b, hk, page, d, pages_per_seq = 2, 1, 2, 4, 3
    kc, vc = rand(rng, b * pages_per_seq, hk, page, d), rand(rng, b * pages_per_seq, hk, page, d)
    table = np.arange(b * pages_per_seq, dtype=np.int32).reshape(b, 1, pages_per_seq, 1)
    skv = np.array([3, 6], np.int32)
    table[0, 0, 2, 0] = 999                          # past seq_len_kv[0] = 3 tokens: garbage allowed
    q = rand(rng, b, 1, 1, d)
    lengths = dict(seq_len_q=np.ones((b, 1, 1, 1), np.int32), seq_len_kv=skv.reshape(b, 1, 1, 1))
    res = run_fwd(dict(q=q, k=kc, v=vc), generate_stats=True, **lengths, paged_attention_k_table=table,
                  paged_attention_v_table=table)
    k = np.zeros((b, hk, page * pages_per_seq, d), np.float32)
    v = np.zeros_like(k)
    for bi in range(b):
        for p in range(pages_per_seq):
            if table[bi, 0, p, 0] < len(kc):
                k[bi, :, p * page:(p + 1) * page] = kc[table[bi, 0, p, 0]]
                v[bi, :, p * page:(p + 1) * page] = vc[table[bi, 0, p, 0]]
        k[bi, :, skv[bi]:] = 0
        v[bi, :, skv[bi]:] = 0
    dense = run_fwd(dict(q=q, k=k, v=v), generate_stats=True)
    np.testing.assert_allclose(res["O"], dense["O"], rtol=1e-6, atol=1e-6)


def test_kernel_declines_what_it_cannot_reproduce():
    rng = np.random.default_rng(9)
    a = dict(q=rand(rng, 1, 1, 2, 4), k=rand(rng, 1, 1, 2, 4), v=rand(rng, 1, 1, 2, 4))
    seed = np.zeros((1, 1, 1, 1), np.int64)
    with pytest.raises(NotImplementedError):
        run_fwd(a, generate_stats=True, dropout=(0.1, seed, seed))
    run_fwd(a, generate_stats=True, dropout=(0.0, seed, seed))       # p = 0: no dropout, as cuDNN
    with pytest.raises(NotImplementedError):
        run_fwd(a, generate_stats=True, block_mask=np.zeros((1, 1, 1, 1), np.uint8))


# ------------------------------------------------------------ backward vs finite differences

def fd_case(rng, kw, b=2, hq=4, hk=2, hv=1, sq=3, skv=4, d=3, dv=2, bias_shape=None, sink=False, drop=False):
    arrays = dict(q=rng.standard_normal((b, hq, sq, d)), k=rng.standard_normal((b, hk, skv, d)),
                  v=rng.standard_normal((b, hv, skv, dv)))
    if bias_shape is not None:
        arrays["bias"] = rng.standard_normal(bias_shape)
    if sink:
        arrays["sink_token"] = rng.standard_normal((1, hq, 1, 1))
    extra = dict(kw)
    if drop:
        mask = (rng.random((b, hq, sq, skv)) > 0.4).astype(np.float64)
        extra["dropout"] = (mask, np.full((1, 1, 1, 1), 1 / 0.6))
    g = rng.standard_normal((b, hq, sq, dv))
    return arrays, extra, g


def forward64(arrays, extra):
    return run_fwd(arrays, out_dtype=np.float64, generate_stats=True, **extra)


def loss(arrays, extra, g):
    return float(np.sum(forward64(arrays, extra)["O"] * g))


BWD_CASES = [
    ("plain_gqa", dict(attn_scale=0.7), {}),
    ("causal_padding_bias", dict(use_causal_mask=True, use_padding_mask=True,
                                 seq_len_q=np.array([3, 2], np.int32).reshape(2, 1, 1, 1),
                                 seq_len_kv=np.array([4, 3], np.int32).reshape(2, 1, 1, 1)),
     dict(bias_shape=(1, 4, 3, 4))),
    ("alibi_causal_bias_b", dict(use_alibi_mask=True, use_causal_mask=True), dict(bias_shape=(2, 1, 3, 4))),
    ("window_bottom_right", dict(diagonal_alignment="BOTTOM_RIGHT", diagonal_band_left_bound=2,
                                 diagonal_band_right_bound=0), {}),
    ("dropout_mask_sink", dict(use_causal_mask=True), dict(sink=True, drop=True)),
]


@pytest.mark.parametrize("name,kw,shape_kw", BWD_CASES, ids=[c[0] for c in BWD_CASES])
def test_backward_matches_finite_differences(name, kw, shape_kw):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays, extra, g = fd_case(rng, kw, **shape_kw)
    fwd = forward64(arrays, extra)
    bwd_kw = dict(extra)
    if "dropout" in bwd_kw:
        mask, scale = bwd_kw.pop("dropout")
        bwd_kw["dropout"] = (mask, scale, 1.0 / scale)
    want = {"dQ": "q", "dK": "k", "dV": "v"}
    if "bias" in arrays:
        bwd_kw["dBias"] = True
        want["dBias"] = "bias"
    if "sink_token" in arrays:
        bwd_kw["dSink_token"] = True
        want["dSink_token"] = "sink_token"
    inputs, attrs = bind("sdpa_backward", {**arrays, **bwd_kw, "o": fwd["O"], "dO": g, "stats": fwd["Stats"]})
    outputs = {name_: (arrays[port].shape, np.float64) for name_, port in want.items()}
    grads = K_SDPA["sdpa_backward"](inputs, attrs, outputs, DataType.FLOAT)

    eps = 1e-6
    for out_name, port in want.items():
        x = arrays[port]
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            saved = x[idx]
            x[idx] = saved + eps
            up = loss(arrays, extra, g)
            x[idx] = saved - eps
            down = loss(arrays, extra, g)
            x[idx] = saved
            numeric[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[out_name], numeric, rtol=1e-5, atol=1e-7, err_msg=f"{name}: {out_name}")


def test_ragged_offsets_checked_when_tensor_info_carries_them():
    """pygraph attaches ragged offsets to tensors; once TensorInfo grows ``ragged_offset`` infer checks it."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class RaggedInfo(TensorInfo):
        ragged_offset: object = None

    b = 2
    good_offsets = T(b + 1, 1, 1, 1, dt=I32)
    q = RaggedInfo((b, 4, 8, 64), (8 * 4 * 64, 64, 4 * 64, 1), H, ragged_offset=good_offsets)
    base = dict(q=q, k=T(b, 4, 8, 64), v=T(b, 4, 8, 64), generate_stats=True)
    infer("sdpa", **base, **SEQ)
    fails("q", "sdpa", **base)                                            # ragged needs the padding mask
    bad = RaggedInfo(q.dim, q.stride, H, ragged_offset=T(b, 1, 1, 1, dt=I32))
    fails("q", "sdpa", **{**base, "q": bad}, **SEQ)                       # offsets are (b + 1, 1, 1, 1)
