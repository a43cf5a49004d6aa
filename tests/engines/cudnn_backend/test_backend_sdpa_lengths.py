"""Sequence lengths on the cuDNN backend as cudnn-frontend hands them over: INT64 seq_len tensors (the
frontend checks no data type on them), and paged K/V caches whose masking a score_mod does instead of
use_padding_mask (its test_sdpa_with_flexible_graph): the page loads and the matmuls still take the lengths.

Each GPU case matches the reference engine on the rows inside the problem, or is declined cleanly (a skip
carrying the reason), as in test_backend_sdpa.py whose builders these reuse.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from test_backend_sdpa import (TOL_FWD, _assert_cudnn_plan, _fwd_inputs, _or_declined, _paged_inputs,
                               compare_valid_rows, fwd_graph, paged_graph)

F = cudnn.data_type


def int64_lengths_graph(device, **kw):
    """``fwd_graph`` with a padding mask whose seq_len_q / seq_len_kv are INT64."""
    g, t = fwd_graph(device, padding=True, **kw)
    for name in ("seq_len_q", "seq_len_kv"):
        t[name].set_data_type(F.INT64)
    g.validate()
    return g, t


def test_int64_lengths_reach_the_composite_lowering_as_int64():
    from cudnn_graph.engines.cudnn_backend import Ref, lower_program
    from cudnn_graph.ops._sdpa import AttentionImplementation
    g, t = int64_lengths_graph("cuda", implementation=AttentionImplementation.COMPOSITE)
    program = lower_program(g)
    for name in ("seq_len_q", "seq_len_kv"):
        desc = next(a for a in program.of_kind("TENSOR") if a["CUDNN_ATTR_TENSOR_UNIQUE_ID"] == t[name].uid)
        assert desc["CUDNN_ATTR_TENSOR_DATA_TYPE"] == F.INT64
    bmm1 = program.step(program.operations[0]).attrs
    assert bmm1["CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC"] == Ref(f"tensor_{t['seq_len_kv'].uid}")


@pytest.mark.gpu
@pytest.mark.parametrize("implementation", [None, "COMPOSITE"], ids=["auto", "composite"])
def test_int64_sequence_lengths_match_the_reference(implementation):
    io = F.BFLOAT16
    host = _fwd_inputs(io, padding=True)
    for name in ("seq_len_q", "seq_len_kv"):
        host[name] = host[name].astype(np.int64)
    kw = dict(io=io, use_causal_mask=True)
    if implementation:
        from cudnn_graph.ops._sdpa import AttentionImplementation
        kw["implementation"] = AttentionImplementation[implementation]
    g = _or_declined(lambda: compare_valid_rows(int64_lengths_graph, host, {"O", "Stats"}, "cupy",
                                                TOL_FWD[io], **kw))
    _assert_cudnn_plan(g)


def _score_mod_padding(graph, score):
    """cudnn-frontend test code's padding mask written as a score_mod on the graph's own seq_len_q /
    seq_len_kv tensors: keep row < seq_len_q[b] and col < seq_len_kv[b], a large negative score elsewhere."""
    lengths = {t.name: t for t in graph.tensors}
    row = graph.gen_index(input=score, axis=2, compute_data_type=F.INT32)
    row.set_data_type(F.INT32)
    col = graph.gen_index(input=score, axis=3, compute_data_type=F.INT32)
    col.set_data_type(F.INT32)
    row_ok = graph.cmp_lt(input=row, comparison=lengths["seq_len_q"], compute_data_type=F.FLOAT)
    row_ok.set_data_type(F.BOOLEAN)
    col_ok = graph.cmp_lt(input=col, comparison=lengths["seq_len_kv"], compute_data_type=F.FLOAT)
    col_ok.set_data_type(F.BOOLEAN)
    keep = graph.logical_and(a=row_ok, b=col_ok, compute_data_type=F.FLOAT)
    keep.set_data_type(F.BOOLEAN)
    return graph.binary_select(input0=score, input1=-1e9, mask=keep)


def paged_score_mod_graph(device, **kw):
    """``paged_graph`` without use_padding_mask: the lengths go to sdpa, the masking to a score_mod."""
    return paged_graph(device, use_padding_mask=False, score_mod=_score_mod_padding, **kw)


def test_paged_kv_with_a_score_mod_needs_no_padding_mask():
    """cudnn-frontend's test_sdpa_with_flexible_graph shape of call validates (no GPU needed)."""
    g, t = paged_score_mod_graph("cuda")
    assert g.nodes[-1].params["use_padding_mask"] is False


@pytest.mark.gpu
def test_paged_kv_masked_by_a_score_mod_matches_the_padded_reference():
    from gpu_support import assert_close, gpu_run, reference_run
    io = F.BFLOAT16
    host = _paged_inputs(io)
    want = reference_run(paged_graph, host, {"O"}, io=io)               # the same masking by use_padding_mask
    got, g = _or_declined(lambda: gpu_run(paged_score_mod_graph, host, {"O"}, "cupy", io=io))
    _assert_cudnn_plan(g)
    a, b = np.asarray(got["O"], np.float32).copy(), np.asarray(want["O"], np.float32).copy()
    for i, n in enumerate(host["seq_len_q"].reshape(-1)):               # rows past seq_len_q: undefined
        a[i, :, n:, :] = 0
        b[i, :, n:, :] = 0
    assert_close(a, b, "bfloat16", "O (paged, score_mod padding)", tolerance=TOL_FWD[io])
