"""Reference (NumPy, CPU) kernels for ``sdpa`` and ``sdpa_backward``.

They are the numerical oracle for every GPU attention engine, so they favour clarity over speed: the whole
score matrix (b, h_q, s_q, s_kv) is materialised and everything is computed in float64, then cast to the
output types the graph asks for.

Semantics follow cuDNN (see ``cudnn_graph.ops._sdpa``):
  * score = attn_scale * q @ k^T + bias + alibi, then padding and diagonal-band masks, then softmax
    (with the optional per-head sink logit in the denominator), dropout, and @ v;
  * Stats = natural-log logsumexp of each row of the masked softmax input (max + log(sum(exp(x - max))));
  * padded query rows (i >= seq_len_q[b]) are not part of the problem: cuDNN leaves them unwritten, the
    reference writes O = 0 and Stats = 0 there so results are deterministic;
  * a valid query row with no key left after masking writes O = 0 and Stats = -inf (the logsumexp of an
    empty set; with a sink token it is the sink logit);
  * the backward recomputes P from the given Stats, as cuDNN does (P = exp(score - Stats)).

``score_mod``: the subgraph the builder recorded from the callback (``ops._score_mod``) runs on the scores
after the scale and before the bias, on the reference's pointwise kernels (``apply_score_mod``).

Not implemented (raise ``NotImplementedError`` so the engine declines): Philox dropout (cuDNN's random
stream layout is not public; a custom ``dropout_mask`` is supported), ``rng_dump``, ``block_mask`` (the bit
order inside a tile byte is not documented) and ``score_mod`` / ``score_mod_bprop`` in the backward.

Kernel contract: ``kernel(inputs, attrs, outputs, compute_dtype) -> {output: ndarray}`` where ``inputs``
maps port -> ndarray (logical BHSD view, any strides) or None, ``attrs`` are converted attributes and
``outputs`` maps each existing output to ``(dims, numpy dtype)``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from cudnn_graph.ops._sdpa import DiagonalAlignment, MaskSpec, alibi_slopes, infer_s_kv, resolve_masking

__all__ = ["KERNELS", "sdpa_forward_kernel", "sdpa_backward_kernel", "gather_paged", "apply_score_mod"]

_F = np.float64


def _f64(x: Optional[np.ndarray]) -> Optional[np.ndarray]:
    return None if x is None else np.asarray(x).astype(_F)


def _unsupported(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
    """Decline what the reference cannot reproduce bit-for-bit semantics of."""
    if attrs.get("score_mod") is not None and attrs.get("score_mod_graph") is None:
        raise NotImplementedError("reference sdpa: a score_mod callback without the subgraph the builder "
                                  "records from it (score_mod_graph)")
    if inputs.get("block_mask") is not None:
        raise NotImplementedError("reference sdpa: block_mask bit layout inside a tile byte is not documented")
    p = attrs.get("dropout_probability")
    if p is not None and p != 0.0:
        raise NotImplementedError("reference sdpa: Philox dropout needs cuDNN's random stream; give a custom "
                                  "dropout mask (dropout=(mask, scale)) to run dropout on the reference")
    if attrs.get("rng_dump") is not None:
        raise NotImplementedError("reference sdpa: rng_dump records cuDNN's Philox stream; not reproducible")


def _unsupported_backward(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
    """What the backward kernel declines beyond ``_unsupported``."""
    if attrs.get("score_mod") is not None or attrs.get("score_mod_bprop") is not None:
        raise NotImplementedError("reference sdpa_backward: score_mod / score_mod_bprop are not implemented "
                                  "(the forward's score_mod is)")
    _unsupported(inputs, attrs)


def apply_score_mod(record, score: np.ndarray, extra) -> np.ndarray:
    """The scores after a recorded score_mod subgraph (``ops._score_mod.ScoreModGraph``): its pointwise
    nodes run on the reference's pointwise kernels; ``extra`` are the arrays of its outer tensors."""
    from .engine import node_steps, run_steps     # the engine module imports this one
    types, steps = node_steps(record.graph)
    values = {record.score.uid: score}
    for (child, _outer), array in zip(record.mirrors, extra or ()):
        values[child.uid] = np.asarray(array)
    for t in record.constants:
        values[t.uid] = np.full(tuple(t.dim), t.value, dtype=types[t.uid])
    run_steps(steps, values)
    return _f64(values[record.output.uid])


def _attn_scale(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> float:
    t = inputs.get("attn_scale")
    if t is not None:
        return float(np.asarray(t).reshape(-1)[0])
    value = attrs.get("attn_scale")        # an IR that keeps the Python float as an attribute
    return 1.0 if value is None else float(value)


def _seq_lens(x: Optional[np.ndarray], b: int, full: int) -> np.ndarray:
    if x is None:
        return np.full(b, full, dtype=np.int64)
    return np.clip(np.asarray(x).reshape(b).astype(np.int64), 0, full)


def gather_paged(container: np.ndarray, table: np.ndarray, seq_len: np.ndarray, s_kv: int) -> np.ndarray:
    """Logical (b, h, s_kv, d) K or V from a page container (pages, h, page_size, d) and a page table
    (b, 1, pages per sequence, 1): token ``s`` of sequence ``b`` is row ``s % page_size`` of page
    ``table[b, 0, s // page_size, 0]``. Tokens at or past ``seq_len[b]`` are never read (left 0), so a
    table may hold garbage there, as cuDNN allows."""
    container = np.asarray(container)
    table = np.asarray(table)
    b = table.shape[0]
    _, h, page, d = container.shape
    out = np.zeros((b, h, s_kv, d), dtype=container.dtype)
    for bi in range(b):
        n = int(min(seq_len[bi], s_kv))
        if n <= 0:
            continue
        pos = np.arange(n)
        pages = table[bi, 0, pos // page, 0].astype(np.int64)
        if pages.min() < 0 or pages.max() >= container.shape[0]:
            raise IndexError(f"page table of sequence {bi} points outside the {container.shape[0]} pages")
        out[bi, :, :n, :] = container[pages, :, pos % page, :].transpose(1, 0, 2)
    return out


class _Problem:
    """Everything forward and backward share: dense K/V, scores, the keep-mask and the dropout factor."""

    def __init__(self, inputs: Mapping[str, Any], attrs: Mapping[str, Any]):
        _unsupported(inputs, attrs)
        q = _f64(inputs["q"])
        k_in, v_in = np.asarray(inputs["k"]), np.asarray(inputs["v"])
        b, h_q, s_q, _ = q.shape
        table_k, table_v = inputs.get("paged_attention_k_table"), inputs.get("paged_attention_v_table")
        bias = _f64(inputs.get("bias"))
        s_kv = infer_s_kv(k_in.shape, v_in.shape, table_k is not None, table_v is not None,
                          attrs.get("paged_attention_max_seq_len_kv"),
                          bias.shape if bias is not None else None,
                          None if table_k is None else np.shape(table_k),
                          None if table_v is None else np.shape(table_v))
        padding = bool(attrs.get("use_padding_mask"))
        self.seq_q = _seq_lens(inputs.get("seq_len_q") if padding else None, b, s_q)
        self.seq_kv = _seq_lens(inputs.get("seq_len_kv") if padding else None, b, s_kv)
        # The page loads read seq_len_kv tokens whether or not the padding mask is on (cuDNN's
        # paged-cache load takes it; without the mask a score_mod does the masking).
        loaded = _seq_lens(inputs.get("seq_len_kv"), b, s_kv)
        k = gather_paged(k_in, table_k, loaded, s_kv) if table_k is not None else k_in
        v = gather_paged(v_in, table_v, loaded, s_kv) if table_v is not None else v_in
        k, v = _f64(k), _f64(v)
        self.h_k, self.h_v = k.shape[1], v.shape[1]
        # GQA / MQA: query head i reads key head i // (h_q // h_k); repeat K/V heads to h_q.
        self.k = np.repeat(k, h_q // self.h_k, axis=1)
        self.v = np.repeat(v, h_q // self.h_v, axis=1)
        self.q = q
        self.shape = (b, h_q, s_q, s_kv)
        self.scale = _attn_scale(inputs, attrs)
        self.bias = bias

        score = self.scale * np.einsum("bhid,bhjd->bhij", q, self.k)
        if attrs.get("score_mod_graph") is not None:     # after the scale, before the bias (cuDNN's order)
            score = apply_score_mod(attrs["score_mod_graph"], score, inputs.get("score_mod_inputs"))
        if bias is not None:
            score = score + bias
        if attrs.get("use_alibi_mask"):
            slopes = np.asarray(alibi_slopes(h_q), dtype=_F).reshape(1, h_q, 1, 1)
            distance = np.arange(s_kv)[None, :] - np.arange(s_q)[:, None]           # j - i
            score = score + slopes * distance
        self.score = score
        self.keep = self._keep_mask(resolve_masking(attrs))                          # (b, 1, s_q, s_kv)
        self.row_valid = (np.arange(s_q)[None, :] < self.seq_q[:, None])[:, None, :, None]   # (b,1,s_q,1)

        self.dropout = None
        if inputs.get("dropout_mask") is not None:
            factor = np.asarray(inputs["dropout_scale"], dtype=_F).reshape(-1)[0]
            self.dropout = _f64(inputs["dropout_mask"]) * factor
        sink = inputs.get("sink_token")
        self.sink = None if sink is None else _f64(sink).reshape(1, h_q, 1, 1)

    def _keep_mask(self, spec: MaskSpec) -> np.ndarray:
        b, _, s_q, s_kv = self.shape
        i = np.arange(s_q)[None, :, None]
        j = np.arange(s_kv)[None, None, :]
        keep = (i < self.seq_q[:, None, None]) & (j < self.seq_kv[:, None, None])
        # BOTTOM_RIGHT moves the diagonal by (actual s_kv - actual s_q) of each batch.
        shift = np.zeros((b, 1, 1), dtype=np.int64)
        if spec.alignment == DiagonalAlignment.BOTTOM_RIGHT:
            shift = (self.seq_kv - self.seq_q)[:, None, None]
        if spec.right_bound is not None:
            keep &= j <= i + shift + spec.right_bound
        if spec.left_bound is not None:
            keep &= j > i + shift - spec.left_bound
        return keep[:, None, :, :]

    def masked_score(self) -> np.ndarray:
        return np.where(self.keep, self.score, -np.inf)


def sdpa_forward_kernel(inputs: Mapping[str, Any], attrs: Mapping[str, Any],
                        outputs: Mapping[str, tuple], compute_dtype: Any = None) -> dict:
    """Reference ``sdpa``: writes O and, when requested, Stats / score_max / score_sum_exp."""
    pr = _Problem(inputs, attrs)
    s = pr.masked_score()
    row_max = s.max(axis=-1, keepdims=True)                      # -inf on rows with nothing kept
    if pr.sink is not None:
        row_max = np.maximum(row_max, pr.sink)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(pr.keep, np.exp(s - safe_max), 0.0)
    denom = e.sum(axis=-1, keepdims=True)
    if pr.sink is not None:
        denom = denom + np.exp(pr.sink - safe_max)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
        stats = np.where(denom > 0, safe_max + np.log(np.where(denom > 0, denom, 1.0)), -np.inf)
    if pr.dropout is not None:
        p = p * pr.dropout
    o = np.einsum("bhij,bhjd->bhid", p, pr.v)

    # Padded query rows are outside the problem: write zeros there (cuDNN leaves them untouched).
    o = np.where(pr.row_valid, o, 0.0)
    stats = np.where(pr.row_valid, stats, 0.0)
    results = {"O": o, "Stats": stats, "score_max": np.where(pr.row_valid, row_max, 0.0),
               "score_sum_exp": np.where(pr.row_valid, denom, 0.0)}
    return _cast(results, outputs)


def sdpa_backward_kernel(inputs: Mapping[str, Any], attrs: Mapping[str, Any],
                         outputs: Mapping[str, tuple], compute_dtype: Any = None) -> dict:
    """Reference ``sdpa_backward``: dQ, dK, dV and, when requested, dBias and dSink_token."""
    _unsupported_backward(inputs, attrs)
    pr = _Problem(inputs, attrs)
    b, h_q, s_q, s_kv = pr.shape
    stats = _f64(inputs["stats"]).reshape(b, h_q, s_q, 1)
    o, d_o = _f64(inputs["o"]), _f64(inputs["dO"])
    finite = np.isfinite(stats) & pr.row_valid
    safe_stats = np.where(finite, stats, 0.0)
    # P from the forward's Stats, as cuDNN recomputes it; rows with no valid stats contribute nothing.
    p = np.where(pr.keep & finite, np.exp(pr.masked_score() - safe_stats), 0.0)
    d_o = np.where(pr.row_valid, d_o, 0.0)

    p_drop = p if pr.dropout is None else p * pr.dropout
    dv_full = np.einsum("bhij,bhid->bhjd", p_drop, d_o)
    dp = np.einsum("bhid,bhjd->bhij", d_o, pr.v)
    if pr.dropout is not None:
        dp = dp * pr.dropout
    # Softmax backward: dS = P * (dP - D), D_i = sum_j P_ij dP_ij = dO_i . O_i (also with dropout).
    delta = np.sum(d_o * np.where(pr.row_valid, o, 0.0), axis=-1, keepdims=True)
    ds = p * (dp - delta)

    dq = pr.scale * np.einsum("bhij,bhjd->bhid", ds, pr.k)
    dk_full = pr.scale * np.einsum("bhij,bhid->bhjd", ds, pr.q)
    results = {"dQ": dq, "dK": _sum_groups(dk_full, pr.h_k), "dV": _sum_groups(dv_full, pr.h_v)}
    if "dBias" in outputs:
        if pr.bias is None:
            raise ValueError("reference sdpa_backward: dBias requested without bias")
        axes = tuple(ax for ax in range(4) if pr.bias.shape[ax] == 1 and ds.shape[ax] != 1)
        results["dBias"] = ds.sum(axis=axes, keepdims=True) if axes else ds
    if "dSink_token" in outputs:
        # The sink's softmax share P_sink = exp(sink - stats) carries no value, so dP_sink = 0 and
        # d(sink) = -sum over batches and rows of P_sink * D.
        p_sink = np.where(finite, np.exp(pr.sink - safe_stats), 0.0)
        results["dSink_token"] = -np.sum(p_sink * delta, axis=(0, 2), keepdims=True)
    return _cast(results, outputs)


def _sum_groups(grad_full: np.ndarray, heads: int) -> np.ndarray:
    """Fold the h_q repeated heads back onto the h_k (or h_v) shared heads (GQA / MQA)."""
    b, h_q, s, d = grad_full.shape
    return grad_full.reshape(b, heads, h_q // heads, s, d).sum(axis=2)


def _cast(results: Mapping[str, np.ndarray], outputs: Mapping[str, tuple]) -> dict:
    out = {}
    for name, (dims, dtype) in outputs.items():
        if name not in results:
            raise NotImplementedError(f"reference sdpa: output {name!r} is not produced by the reference")
        value = results[name]
        if dims is not None and tuple(value.shape) != tuple(dims):
            value = np.broadcast_to(value, tuple(dims))
        out[name] = np.ascontiguousarray(value.astype(dtype))
    return out


KERNELS = {"sdpa": sdpa_forward_kernel, "sdpa_backward": sdpa_backward_kernel}
