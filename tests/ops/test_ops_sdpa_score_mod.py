"""sdpa ``score_mod``: the callback's subgraph is part of the attention node, validated and run by the
reference engine against NumPy formulas (arrow mask, document mask, softcap), with errors naming the
callback's tensor when it is wrong."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import GraphNotSupportedError, GraphValidationError
from cudnn_graph.ops._score_mod import ScoreModBuilder, ScoreModGraph

from _score_mod_callbacks import arrow_mask, document_mask, softcap, softcap_backward_graph
from gpu_support import row_major

D = cudnn.data_type
NEG = -1e9


# ---- helpers --------------------------------------------------------------------------------------------

def _graph(b=2, h=2, s_q=8, s_kv=8, d=16):
    g = cudnn.pygraph(io_data_type=D.HALF, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT,
                      device="cpu")
    t = {name: g.tensor(name=name, dim=list(dims), stride=row_major(dims))
         for name, dims in (("q", (b, h, s_q, d)), ("k", (b, h, s_kv, d)), ("v", (b, h, s_kv, d)))}
    return g, t


def _scalar(g, name, dtype):
    return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=dtype)


def _inputs(b=2, h=2, s_q=8, s_kv=8, d=16, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(dims).astype(np.float16)
            for name, dims in (("q", (b, h, s_q, d)), ("k", (b, h, s_kv, d)), ("v", (b, h, s_kv, d)))}


def _attention(x, scale, modify, stats=False):
    """NumPy attention with ``modify(score)`` between the scale and the softmax."""
    q, k, v = (x[n].astype(np.float64) for n in ("q", "k", "v"))
    s = modify(scale * np.einsum("bhid,bhjd->bhij", q, k))
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    o = np.einsum("bhij,bhjd->bhid", e / e.sum(axis=-1, keepdims=True), v)
    return (o, m + np.log(e.sum(axis=-1, keepdims=True))) if stats else o


def _run(g, pack, o, stats=None):
    g.build([cudnn.heur_mode.A])
    out = np.empty(o.dim, np.float16)
    pack = {**pack, o: out}
    st = None
    if stats is not None:
        st = np.empty(stats.dim, np.float32)
        pack[stats] = st
    g.execute(pack)
    return out, st


def _by_value(value, dtype):
    return np.full((1, 1, 1, 1), value, dtype)


# ---- the reference engine runs the callbacks' subgraphs ----------------------------------------------

def test_arrow_mask_runs_on_the_reference_engine():
    g, t = _graph()
    bounds = {name: _scalar(g, name, D.INT32) for name in ("row_bound", "col_bound", "diag_lo", "diag_hi")}
    neg_inf = _scalar(g, "neg_inf", D.FLOAT)
    o, _ = g.sdpa(q=t["q"], k=t["k"], v=t["v"], generate_stats=False, attn_scale=0.25,
                  score_mod=functools.partial(arrow_mask, neg_inf=neg_inf, **bounds))
    o.set_output(True)
    x = _inputs()
    values = {"row_bound": 2, "col_bound": 1, "diag_lo": 0, "diag_hi": 1}
    pack = {**{t[n]: x[n] for n in x}, **{bounds[n]: _by_value(v, np.int32) for n, v in values.items()}}
    pack[neg_inf] = _by_value(NEG, np.float32)
    got, _ = _run(g, pack, o)

    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    keep = (i < 2) | (j < 1) | ((i - j >= 0) & (i - j <= 1))
    want = _attention(x, 0.25, lambda s: np.where(keep, s, NEG))
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-3)


def test_document_mask_reads_the_document_tensors_through_the_variant_pack():
    g, t = _graph(b=1, h=1, s_q=16, s_kv=16)
    doc_rows = g.tensor(name="doc_rows", dim=[1, 1, 16, 1], stride=[16, 16, 1, 1], data_type=D.INT32)
    doc_cols = g.tensor(name="doc_cols", dim=[1, 1, 1, 16], stride=[16, 16, 16, 1], data_type=D.INT32)
    neg_inf = _scalar(g, "neg_inf", D.FLOAT)
    o, _ = g.sdpa(q=t["q"], k=t["k"], v=t["v"], generate_stats=False, attn_scale=0.25,
                  score_mod=functools.partial(document_mask, doc_rows=doc_rows, doc_cols=doc_cols, neg_inf=neg_inf))
    o.set_output(True)
    x = _inputs(b=1, h=1, s_q=16, s_kv=16, seed=3)
    docs = np.sort(np.random.default_rng(4).integers(0, 4, 16)).astype(np.int32)
    pack = {t[n]: x[n] for n in x}
    pack.update({doc_rows: docs.reshape(1, 1, 16, 1), doc_cols: docs.reshape(1, 1, 1, 16),
                 neg_inf: _by_value(NEG, np.float32)})
    got, _ = _run(g, pack, o)
    same = docs[:, None] == docs[None, :]
    want = _attention(x, 0.25, lambda s: np.where(same, s, NEG))
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-3)


def test_softcap_score_mod_also_shapes_the_stats():
    g, t = _graph(s_q=4, s_kv=12)
    cap = _scalar(g, "cap", D.FLOAT)
    o, stats = g.sdpa(t["q"], t["k"], t["v"], generate_stats=True, attn_scale=0.5,
                      score_mod=functools.partial(softcap, cap=cap))
    o.set_output(True)
    stats.set_output(True)
    x = _inputs(s_q=4, s_kv=12, seed=1)
    got, got_stats = _run(g, {t[n]: x[n] for n in x} | {cap: _by_value(0.8, np.float32)}, o, stats)
    want, want_stats = _attention(x, 0.5, lambda s: 0.8 * np.tanh(s / 0.8), stats=True)
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-3)
    np.testing.assert_allclose(got_stats, want_stats, atol=1e-4)


def test_score_mod_runs_before_the_bias():
    g, t = _graph(s_q=4, s_kv=4)
    bias = g.tensor(name="bias", dim=[1, 2, 4, 4], stride=row_major((1, 2, 4, 4)))
    cap = _scalar(g, "cap", D.FLOAT)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, attn_scale=1.0, bias=bias,
                  score_mod=functools.partial(softcap, cap=cap))
    o.set_output(True)
    x = _inputs(s_q=4, s_kv=4, seed=2)
    bias_values = np.random.default_rng(5).standard_normal((1, 2, 4, 4)).astype(np.float16)
    got, _ = _run(g, {t[n]: x[n] for n in x} | {cap: _by_value(0.5, np.float32), bias: bias_values}, o)
    want = _attention(x, 1.0, lambda s: 0.5 * np.tanh(s / 0.5) + bias_values.astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-3)


def test_positional_score_mod_and_an_identity_callback():
    g, t = _graph(s_q=4, s_kv=4)
    # pygraph's positional order: q, k, v, is_inference, attn_scale, ..., score_mod (the 25th)
    args = [t["q"], t["k"], t["v"], None, 0.5] + [None] * 19 + [lambda sub, score: score]
    o, _ = g.sdpa(*args, generate_stats=False)
    o.set_output(True)
    rec = o.producer.params["score_mod_graph"]
    assert isinstance(rec, ScoreModGraph) and rec.nodes == () and rec.output is rec.score
    x = _inputs(s_q=4, s_kv=4)
    got, _ = _run(g, {t[n]: x[n] for n in x}, o)
    np.testing.assert_allclose(got.astype(np.float64), _attention(x, 0.5, lambda s: s), atol=2e-3)


# ---- what the IR records --------------------------------------------------------------------------------

def test_the_callbacks_tensors_are_inputs_of_the_attention_node():
    g, t = _graph()
    cap = _scalar(g, "cap", D.FLOAT)
    seen = {}

    def callback(sub, score, cap):
        seen["graph"], seen["score"] = sub, score
        return softcap(sub, score, cap)

    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod=functools.partial(callback, cap=cap),
                  name="attn")
    o.set_output(True)
    node = o.producer
    assert isinstance(seen["graph"], ScoreModBuilder)
    assert tuple(seen["score"].dim) == (2, 2, 8, 8) and seen["score"].data_type == D.FLOAT
    assert node.inputs["score_mod_inputs"] == (cap,)
    rec = node.params["score_mod_graph"]
    assert [n.op for n in rec.nodes] == ["div", "tanh", "mul"]
    assert [(child.name, outer) for child, outer in rec.mirrors] == [("cap", cap)]
    g.validate()                                  # cap counts as used: it feeds the attention node
    g.build_operation_graph()
    assert rec.graph.frozen
    encoded = json.loads(g.to_json())["nodes"][0]["params"]["score_mod_graph"]["subgraph"]
    assert [n["op"] for n in encoded["graph"]["nodes"]] == ["div", "tanh", "mul"]


def test_equal_subgraphs_share_a_fingerprint_and_different_ones_do_not():
    def build(callback):
        g, t = _graph()
        cap = _scalar(g, "cap", D.FLOAT)
        o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod=functools.partial(callback, cap=cap))
        o.set_output(True)
        g.validate()
        return g.key()

    assert build(softcap) == build(lambda sub, score, cap: softcap(sub, score, cap))
    renamed = lambda sub, score, cap: sub.mul(a=sub.tanh(input=sub.div(a=score, b=cap, name="d")), b=cap, name="m")
    assert build(softcap) == build(renamed)
    assert build(softcap) != build(lambda sub, score, cap: sub.mul(a=score, b=cap))


def test_tensors_made_inside_the_callback_land_on_the_graph():
    g, t = _graph()

    def callback(sub, score):
        cap = sub.tensor(name="made_cap", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True,
                         data_type=D.FLOAT)
        return softcap(sub, score, cap)

    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, attn_scale=0.5, score_mod=callback)
    o.set_output(True)
    made = [x for x in g.tensors if x.name == "made_cap"]
    assert len(made) == 1 and o.producer.inputs["score_mod_inputs"] == (made[0],)
    x = _inputs()
    got, _ = _run(g, {t[n]: x[n] for n in x} | {made[0]: _by_value(2.0, np.float32)}, o)
    np.testing.assert_allclose(got.astype(np.float64), _attention(x, 0.5, lambda s: 2 * np.tanh(s / 2)), atol=2e-3)


# ---- errors name the callback's tensor --------------------------------------------------------------------

def test_a_bound_of_the_wrong_shape_is_named():
    g, t = _graph()
    wrong = g.tensor(name="wrong_bound", dim=[1, 1, 3, 1], stride=[3, 3, 1, 1], data_type=D.FLOAT)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod=functools.partial(softcap, cap=wrong),
                  name="attn")
    o.set_output(True)
    with pytest.raises(GraphValidationError, match=r"node 'attn' \(sdpa\), port 'score_mod'.*wrong_bound"):
        g.validate()


def test_a_callback_returning_something_else_is_refused_by_name():
    g, t = _graph()
    with pytest.raises(GraphValidationError, match="score_mod.*must return the modified score tensor; it returned int"):
        g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod=lambda sub, score: 3, name="attn")
    with pytest.raises(GraphValidationError, match="returned tensor 'q' of the outer graph"):
        g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod=lambda sub, score: t["q"], name="attn")


def test_a_result_of_another_shape_is_refused():
    g, t = _graph()
    cap = _scalar(g, "cap", D.FLOAT)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, name="attn",
                  score_mod=lambda sub, score: sub.mul(a=cap, b=cap))
    o.set_output(True)
    with pytest.raises(GraphValidationError, match=r"port 'score_mod'.*dims \[1, 1, 1, 1\].*\[2, 2, 8, 8\]"):
        g.validate()


def test_an_unused_op_in_the_callback_is_named():
    g, t = _graph()
    cap = _scalar(g, "cap", D.FLOAT)

    def callback(sub, score):
        sub.exp(input=score, name="dangling")
        return sub.mul(a=score, b=cap)

    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, name="attn", score_mod=callback)
    o.set_output(True)
    with pytest.raises(GraphValidationError, match="dangling.*is not used"):
        g.validate()


def test_the_builder_owns_the_recorded_ports():
    g, t = _graph()
    with pytest.raises(TypeError, match="score_mod_inputs.*set by the builder"):
        g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, score_mod_inputs=[t["q"]])


def test_builtin_masks_are_off_with_a_score_mod_as_in_the_frontend():
    g, t = _graph()
    cap = _scalar(g, "cap", D.FLOAT)
    o, _ = g.sdpa(t["q"], t["k"], t["v"], generate_stats=False, use_causal_mask=True,
                  score_mod=functools.partial(softcap, cap=cap))
    o.set_output(True)
    with pytest.raises(GraphNotSupportedError, match="built-in masks"):
        g.validate()


def test_backward_score_mod_is_recorded_and_declined_by_the_reference_by_name():
    g, grads, cap = softcap_backward_graph("cpu")
    assert grads[0].producer.inputs["score_mod_inputs"] == (cap,)
    with pytest.raises(cudnn.PlanEntryError, match="reference sdpa_backward: score_mod"):
        g.build()
