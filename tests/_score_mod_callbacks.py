"""sdpa score_mod callbacks the tests share, written as cudnn-frontend's test_flexible_sdpa writes them:
``callback(graph, score, **extra tensors) -> modified score``, the extra tensors bound with functools.partial."""
from __future__ import annotations

import functools

import cudnn_graph as cudnn

from gpu_support import row_major

D = cudnn.data_type


def _int(t):
    t.set_data_type(D.INT32)
    return t


def arrow_mask(sub, score, row_bound, col_bound, diag_lo, diag_hi, neg_inf):
    """Keep the first ``row_bound`` rows, the first ``col_bound`` columns and the band
    ``diag_lo <= row - col <= diag_hi``; ``neg_inf`` elsewhere."""
    row = _int(sub.gen_index(input=score, axis=2))
    col = _int(sub.gen_index(input=score, axis=3))
    first_rows = _int(sub.cmp_lt(input=row, comparison=row_bound, compute_data_type=D.BOOLEAN))
    first_cols = _int(sub.cmp_lt(input=col, comparison=col_bound, compute_data_type=D.BOOLEAN))
    diff = _int(sub.sub(a=row, b=col, compute_data_type=D.INT32))
    above = _int(sub.cmp_ge(input=diff, comparison=diag_lo, compute_data_type=D.BOOLEAN))
    below = _int(sub.cmp_le(input=diff, comparison=diag_hi, compute_data_type=D.BOOLEAN))
    band = _int(sub.logical_and(above, below, compute_data_type=D.BOOLEAN))
    keep = _int(sub.logical_or(first_rows, first_cols, compute_data_type=D.BOOLEAN))
    keep = _int(sub.logical_or(keep, band, compute_data_type=D.BOOLEAN))
    return sub.binary_select(input0=score, input1=neg_inf, mask=keep)


def document_mask(sub, score, doc_rows, doc_cols, neg_inf):
    """Query i sees key j only inside its document: ids as a (1, 1, s, 1) column and a (1, 1, 1, s) row."""
    col = _int(sub.gen_index(input=score, axis=3, compute_data_type=D.INT32))
    ones = _int(sub.cmp_le(input=col, comparison=col, compute_data_type=D.FLOAT))
    rows = _int(sub.scale(input=ones, scale=doc_rows, compute_data_type=D.FLOAT))
    cols = _int(sub.scale(input=ones, scale=doc_cols, compute_data_type=D.FLOAT))
    same = _int(sub.cmp_eq(input=rows, comparison=cols, compute_data_type=D.FLOAT))
    return sub.binary_select(input0=score, input1=neg_inf, mask=same)


def softcap(sub, score, cap):
    """``cap * tanh(score / cap)``."""
    return sub.mul(a=sub.tanh(input=sub.div(a=score, b=cap)), b=cap)


def softcap_backward_graph(device: str, b=1, h=2, s=8, d=16, name="attn_bwd"):
    """sdpa_backward with a softcap score_mod (a by-value FLOAT ``cap``), validated: ``(graph, grads, cap)``."""
    g = cudnn.pygraph(io_data_type=D.HALF, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT,
                      device=device)
    dims = (b, h, s, d)
    q, k, v, o, d_o = (g.tensor(name=n, dim=list(dims), stride=row_major(dims)) for n in ("q", "k", "v", "o", "dO"))
    stats = g.tensor(name="stats", dim=[b, h, s, 1], stride=row_major((b, h, s, 1)), data_type=D.FLOAT)
    cap = g.tensor(name="cap", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=D.FLOAT)
    grads = g.sdpa_backward(q, k, v, o, d_o, stats, score_mod=functools.partial(softcap, cap=cap), name=name)
    for grad in grads:
        grad.set_output(True)
    g.validate()
    return g, grads, cap
