"""Scaled dot-product attention schemas: ``sdpa`` and ``sdpa_backward`` (captured ops).

Keyword names, defaults and the positional order are those of ``cudnn.pygraph``::

    o, stats = graph.sdpa(q, k, v, generate_stats=True, attn_scale=0.125, use_causal_mask=True)
    dq, dk, dv = graph.sdpa_backward(q, k, v, o, dO, stats, attn_scale=0.125, use_causal_mask=True)

Tensors are in cuDNN's logical BHSD order whatever their strides: ``q (b, h_q, s_q, d_qk)``,
``k (b, h_k, s_kv, d_qk)``, ``v (b, h_v, s_kv, d_v)``, ``o (b, h_q, s_q, d_v)``; ``stats (b, h_q, s_q, 1)``
float32 holds the natural-log logsumexp of each row of the softmax input (``max + log(sum(exp(x - max)))``).
Grouped / multi-query attention is implied by the head counts: ``h_q`` must be a multiple of ``h_k`` and of
``h_v``; query head ``i`` reads key head ``i // (h_q // h_k)``.

What the score goes through before the softmax, in cuDNN's order: ``attn_scale *  q @ k^T``, ``+ bias``,
``+ alibi``, padding mask (``seq_len_q`` / ``seq_len_kv``), then the diagonal band (causal and sliding window).

Masking keywords. pygraph keeps two spellings and so do we:
  * preferred: ``diagonal_alignment`` (TOP_LEFT | BOTTOM_RIGHT), ``diagonal_band_left_bound`` (>= 1) and
    ``diagonal_band_right_bound`` (>= 0). Key ``j`` is kept for query ``i`` when
    ``j <= i + shift + right`` and ``j > i + shift - left``, where ``shift`` is 0 for TOP_LEFT and
    ``s_kv - s_q`` (per batch ``seq_len_kv[b] - seq_len_q[b]`` when sequence lengths are given) for
    BOTTOM_RIGHT. An unset bound is +infinity.
  * deprecated: ``use_causal_mask`` (= TOP_LEFT, right bound 0), ``use_causal_mask_bottom_right``
    (= BOTTOM_RIGHT, right bound 0) and ``sliding_window_length`` (= the left bound).
  ``resolve_masking(attrs)`` turns either spelling into one ``MaskSpec``; engines read only that.

Keywords that do not map one-to-one onto a port or an attribute (the IR honours the schema fields named here):
  * ``attn_scale`` is a Python float or a (usually pass-by-value) one-element tensor. It is declared as an
    optional port; ``scalar_ports`` says a Python number given for it becomes a constant FLOAT
    tensor of dims (1, 1, 1, 1). The reference kernel also accepts the float in ``attrs["attn_scale"]``.
  * ``dropout`` is a tuple: ``(probability, seed, offset)`` (Philox) or, forward, ``(mask, scale)`` /
    backward ``(mask, scale, scale_inv)``. ``keyword_expanders["dropout"]`` maps it onto the ports
    ``dropout_seed``, ``dropout_offset``, ``dropout_mask``, ``dropout_scale``, ``dropout_scale_inv`` and the
    attribute ``dropout_probability`` (those names may also be given directly).
  * Output tensors that pygraph takes as keywords (the caller creates them): ``score_max``,
    ``score_sum_exp``, ``rng_dump`` (forward), ``dBias``, ``dSink_token``, ``rng_dump`` (backward). They are
    declared as attributes holding the caller's tensor (or True: "create it") and as conditional outputs of
    the same name; ``output_keywords`` lists them so the IR binds the given tensor as that output.
    ``returned_outputs`` is what the builder returns, exactly as pygraph: ``[O, Stats]`` and
    ``[dQ, dK, dV]`` (Stats is None without ``generate_stats``); side outputs are not in that list.
  * Ragged (packed THD) layouts are not an sdpa keyword in pygraph: ``graph.tensor(..., ragged_offset=t)``
    attaches a (b + 1, 1, 1, 1) int32 offset tensor to q / k / v / o / stats. ``TensorInfo`` does not carry
    it yet; when it grows a ``ragged_offset`` field, ``infer`` checks it (dtype, dims, padding mask required).
"""
from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..data_type import DataType
from .._layout import packed_strides_like as _packed_stride_like, row_major_strides as _packed_stride
from ..enums import attention_implementation, diagonal_alignment
from .schema import Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo, enum_converter, register
from ._score_mod import check_score_mod, prepare_score_mod_call, to_score_mod_graph

__all__ = ["DiagonalAlignment", "AttentionImplementation", "MaskSpec", "resolve_masking", "stats_requested",
           "PAGED_BACKWARD_REASON",
           "expand_dropout_forward", "expand_dropout_backward", "infer_s_kv", "alibi_slopes",
           "SDPA_POSITIONAL", "SDPA_BACKWARD_POSITIONAL"]

_IO_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)
_FLOAT_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)


# ------------------------------------------------------------------------------------------- enums

# The op tables' names for the package's enums (cudnn-frontend's DiagonalAlignment_t and
# AttentionImplementation_t).
DiagonalAlignment = diagonal_alignment
AttentionImplementation = attention_implementation


# ------------------------------------------------------------------------------- attr converters

def _to_bool(value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"a bool was expected; got {value!r}")


def _to_opt_bool(value: Any) -> Optional[bool]:
    return None if value is None else _to_bool(value)


def _to_opt_int(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"an int (or None) was expected; got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"an int (or None) was expected; got {value!r}") from None


def _to_opt_probability(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a float probability was expected; got {value!r}")
    return float(value)


def _to_opt_callable(value: Any) -> Optional[Callable]:
    if value is None or callable(value):
        return value
    raise TypeError(f"a callable (or None) was expected; got {value!r}")


def _to_output_request(value: Any) -> Any:
    """pygraph passes some outputs in as caller-made tensors. None/False: not wanted; True: create one;
    anything else is the caller's tensor, which the IR binds as the output of the same name."""
    if value is None or value is False:
        return None
    return value


def _requested(name: str) -> Callable[[Mapping[str, Any], frozenset], bool]:
    return lambda attrs, _given: attrs.get(name) is not None


# ---------------------------------------------------------------------------------- shared logic

@dataclass(frozen=True)
class MaskSpec:
    """The diagonal band after both pygraph spellings are folded together (None = unbounded)."""

    alignment: DiagonalAlignment = DiagonalAlignment.TOP_LEFT
    left_bound: Optional[int] = None
    right_bound: Optional[int] = None

    @property
    def causal(self) -> bool:
        return self.right_bound == 0


def _raise_value_error(port: str, message: str):
    raise ValueError(f"{port}: {message}")


def resolve_masking(attrs: Mapping[str, Any], fail: Callable[[str, str], Any] = _raise_value_error) -> MaskSpec:
    """Fold the deprecated (causal flags, sliding_window_length) and preferred (alignment + bounds)
    masking keywords into one ``MaskSpec``, with pygraph's conflict rules. ``fail(port, msg)`` raises."""
    causal = bool(attrs.get("use_causal_mask"))
    causal_br = bool(attrs.get("use_causal_mask_bottom_right"))
    window = attrs.get("sliding_window_length")
    left = attrs.get("diagonal_band_left_bound")
    right = attrs.get("diagonal_band_right_bound")
    alignment = attrs.get("diagonal_alignment") or DiagonalAlignment.TOP_LEFT
    if causal and causal_br:
        fail("use_causal_mask_bottom_right", "use_causal_mask and use_causal_mask_bottom_right cannot both be true")
    if (causal or causal_br) and right is not None:
        which = "use_causal_mask" if causal else "use_causal_mask_bottom_right"
        fail("diagonal_band_right_bound", f"{which} and diagonal_band_right_bound cannot be set at the same time")
    if window is not None and left is not None:
        fail("sliding_window_length", "sliding_window_length and diagonal_band_left_bound cannot both be set "
                                      "(the former is the deprecated spelling of the latter)")
    if window is not None:
        left = window
    if causal:
        alignment, right = DiagonalAlignment.TOP_LEFT, 0
    elif causal_br:
        alignment, right = DiagonalAlignment.BOTTOM_RIGHT, 0
    if left is not None and left <= 0:
        port = "sliding_window_length" if window is not None else "diagonal_band_left_bound"
        fail(port, f"the left bound (sliding window length) must be >= 1; got {left}")
    if right is not None and right < 0:
        fail("diagonal_band_right_bound", f"must be >= 0; got {right}")
    return MaskSpec(DiagonalAlignment(alignment), left, right)


def stats_requested(attrs: Mapping[str, Any]) -> bool:
    """Whether sdpa writes Stats: ``generate_stats``, or the deprecated ``is_inference=False``."""
    if attrs.get("generate_stats") is not None:
        return bool(attrs["generate_stats"])
    if attrs.get("is_inference") is not None:
        return not attrs["is_inference"]
    return False


def _is_probability(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def expand_dropout_forward(value: Any) -> dict:
    """pygraph's forward ``dropout=`` tuple -> ports/attrs: ``(p, seed, offset)`` or ``(mask, scale)``."""
    if value is None:
        return {}
    if not isinstance(value, (tuple, list)):
        raise TypeError("dropout must be a tuple (probability, seed tensor, offset tensor) or "
                        f"(mask tensor, scale tensor); got {value!r}")
    if len(value) == 3 and _is_probability(value[0]):
        return {"dropout_probability": float(value[0]), "dropout_seed": value[1], "dropout_offset": value[2]}
    if len(value) == 2 and not _is_probability(value[0]):
        return {"dropout_mask": value[0], "dropout_scale": value[1]}
    raise TypeError("dropout must be a tuple (probability, seed tensor, offset tensor) or "
                    f"(mask tensor, scale tensor); got {value!r}")


def expand_dropout_backward(value: Any) -> dict:
    """pygraph's backward ``dropout=`` tuple: ``(p, seed, offset)`` or ``(mask, scale, scale_inv)``."""
    if value is None:
        return {}
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError("dropout must be a tuple (probability, seed tensor, offset tensor) or "
                        f"(mask tensor, scale tensor, scale_inv tensor); got {value!r}")
    if _is_probability(value[0]):
        return {"dropout_probability": float(value[0]), "dropout_seed": value[1], "dropout_offset": value[2]}
    return {"dropout_mask": value[0], "dropout_scale": value[1], "dropout_scale_inv": value[2]}


def infer_s_kv(k_dim: tuple, v_dim: tuple, paged_k: bool, paged_v: bool, max_seq_len_kv: Optional[int] = None,
               bias_dim: Optional[tuple] = None, table_k_dim: Optional[tuple] = None,
               table_v_dim: Optional[tuple] = None) -> int:
    """The logical KV sequence length, found the way cudnn-frontend does when caches are paged: the
    explicit ``paged_attention_max_seq_len_kv``, else the unpaged one of K/V, else the bias, else
    ``min(pages per sequence * page size)`` over the two page tables."""
    if max_seq_len_kv is not None:
        return int(max_seq_len_kv)
    if not paged_k:
        return int(k_dim[2])
    if not paged_v:
        return int(v_dim[2])
    if bias_dim is not None:
        return int(bias_dim[3])
    return int(min(table_k_dim[2] * k_dim[2], table_v_dim[2] * v_dim[2]))


def alibi_slopes(n_heads: int) -> list:
    """cuDNN's ALiBi slope per query head (cudnn-frontend ``get_alibi_slope``): with ``n`` the largest power
    of two <= n_heads, heads ``1..n`` get ``2^(-8 i / n)``; the remaining heads get the odd-numbered slopes
    of the ``2n`` sequence, ``2^(-4 (2 m + 1) / n)``."""
    n = 1 << int(math.floor(math.log2(n_heads)))
    exponents = [float(i + 1) for i in range(n)] + [0.5 * (2 * m + 1) for m in range(n_heads - n)]
    return [2.0 ** (-8.0 * e / n) for e in exponents]


# ----------------------------------------------------------------------------------- validation

def _check_bhsd(ctx: InferContext, port: str, t: TensorInfo) -> tuple:
    if len(t.dim) != 4:
        ctx.fail(port, f"must have rank 4 (b, h, s, d); got dims {list(t.dim)}")
    if any(d <= 0 for d in t.dim):
        ctx.fail(port, f"dims must be positive; got {list(t.dim)}")
    return tuple(t.dim)


def _check_io_type(ctx: InferContext, port: str, t: TensorInfo, like: Optional[TensorInfo] = None) -> None:
    if t.data_type not in _IO_TYPES:
        ctx.fail(port, f"data type must be HALF, BFLOAT16 or FLOAT (FLOAT runs on the reference engine only; "
                       f"FP8 attention is sdpa_fp8); got {t.data_type.name}")
    if like is not None and t.data_type != like.data_type:
        ctx.fail(port, f"data type {t.data_type.name} differs from q's {like.data_type.name}")


def _check_scalar(ctx: InferContext, port: str, t: TensorInfo, types: tuple, what: str) -> None:
    if any(d != 1 for d in t.dim):
        ctx.fail(port, f"must hold one element ({what}); got dims {list(t.dim)}")
    if t.data_type not in types:
        ctx.fail(port, f"data type must be {' or '.join(x.name for x in types)}; got {t.data_type.name}")


def _check_broadcastable(ctx: InferContext, port: str, t: TensorInfo, full: tuple, what: str) -> None:
    if len(t.dim) != 4 or any(d not in (1, f) for d, f in zip(t.dim, full)):
        ctx.fail(port, f"dims {list(t.dim)} do not broadcast to the score shape (b, h_q, s_q, s_kv) = "
                       f"{list(full)}; each dim must be 1 or the full extent ({what})")


# cudnn-frontend checks no data type on sequence lengths and hands INT64 ones to cuDNN as they are; the
# integer types are accepted here likewise (anything else cannot be a length).
SEQ_LEN_TYPES = (DataType.INT32, DataType.INT64)


def _check_seq_len(ctx: InferContext, port: str, t: TensorInfo, b: int) -> None:
    if t.data_type not in SEQ_LEN_TYPES:
        ctx.fail(port, f"sequence lengths must be INT32 or INT64; got {t.data_type.name}")
    if tuple(t.dim) != (b, 1, 1, 1):
        ctx.fail(port, f"dims must be (b, 1, 1, 1) = {[b, 1, 1, 1]}; got {list(t.dim)}")


def _check_ragged(ctx: InferContext, ports: tuple, b: int, padding: bool) -> None:
    """Ragged offsets live on the tensors (pygraph's ``ragged_offset=``), read here if TensorInfo has them."""
    for port in ports:
        t = ctx.inputs.get(port)
        r = getattr(t, "ragged_offset", None) if t is not None else None
        if r is None:
            continue
        if not padding:
            ctx.fail(port, "a ragged (packed) layout needs use_padding_mask=True with seq_len_q / seq_len_kv")
        if getattr(r, "data_type", DataType.INT32) not in (DataType.INT32, DataType.INT64):
            ctx.fail(port, f"ragged offsets must be INT32 (or INT64); got {r.data_type.name}")
        if tuple(getattr(r, "dim", (b + 1, 1, 1, 1))) != (b + 1, 1, 1, 1):
            ctx.fail(port, f"the ragged offset tensor must have dims (b + 1, 1, 1, 1) = {[b + 1, 1, 1, 1]}; "
                           f"got {list(r.dim)}")


def _check_paged_lengths(ctx: InferContext, paged: bool, seq_q: Optional[TensorInfo],
                         seq_kv: Optional[TensorInfo]) -> None:
    """cudnn-frontend's rule for paged K/V: sequence lengths for both Q and KV (the page loads read
    seq_len_kv, the matmuls take both as their extents). The padding mask itself is not required: a
    ``score_mod`` may mask instead (without either, the lengths are refused as unread, as there)."""
    if not paged:
        return
    for port, t in (("seq_len_q", seq_q), ("seq_len_kv", seq_kv)):
        if t is None:
            ctx.fail(port, "paged K/V caches need sequence lengths for both Q and KV (seq_len_q and "
                           "seq_len_kv, with use_padding_mask=True or a score_mod that masks)")


# cudnn-frontend's sdpa_backward has no page-table keywords: cuDNN's support matrix lists paged attention as
# N/A for the backward. pygraph names the reason instead of an unknown-keyword TypeError.
PAGED_BACKWARD_REASON = ("paged K/V caches are forward only: cuDNN's attention backward (composite or SDPA_BWD) "
                         "reads no page tables (its support matrix lists paged attention as N/A for the "
                         "backward); gather the pages into dense or ragged K/V for the backward")


@dataclass(frozen=True)
class _Geometry:
    b: int
    h_q: int
    h_k: int
    h_v: int
    s_q: int
    s_kv: int
    d_qk: int
    d_v: int

    @property
    def scores(self) -> tuple:
        return (self.b, self.h_q, self.s_q, self.s_kv)


def _check_common(ctx: InferContext, *, forward: bool) -> tuple:
    """Checks shared by forward and backward; returns (geometry, MaskSpec, padding)."""
    a = ctx.attrs
    q, k, v = ctx.need("q"), ctx.need("k"), ctx.need("v")
    q_dim, k_dim, v_dim = _check_bhsd(ctx, "q", q), _check_bhsd(ctx, "k", k), _check_bhsd(ctx, "v", v)
    _check_io_type(ctx, "q", q)
    _check_io_type(ctx, "k", k, q)
    _check_io_type(ctx, "v", v, q)
    b, h_q, s_q, d_qk = q_dim
    h_k, h_v, d_v = k_dim[1], v_dim[1], v_dim[3]

    table_k = ctx.inputs.get("paged_attention_k_table") if forward else None
    table_v = ctx.inputs.get("paged_attention_v_table") if forward else None
    bias = ctx.inputs.get("bias")
    if k_dim[3] != d_qk:
        ctx.fail("k", f"head dim d_qk mismatch: k has {k_dim[3]}, q has {d_qk}")
    if h_q % h_k != 0:
        ctx.fail("k", f"GQA/MQA needs the query heads to be a multiple of the key heads; h_q={h_q}, h_k={h_k}")
    if h_q % h_v != 0:
        ctx.fail("v", f"GQA/MQA needs the query heads to be a multiple of the value heads; h_q={h_q}, h_v={h_v}")
    # Paged K/V: k / v are page containers (num_pages, h, page_size, d); batch and s_kv come from the tables.
    if table_k is None and k_dim[0] != b:
        ctx.fail("k", f"batch {k_dim[0]} differs from q's batch {b}")
    if table_v is None and v_dim[0] != b:
        ctx.fail("v", f"batch {v_dim[0]} differs from q's batch {b}")
    if table_k is None and table_v is None and k_dim[2] != v_dim[2]:
        ctx.fail("v", f"s_kv mismatch: k has {k_dim[2]} keys, v has {v_dim[2]} values")
    for port, table in (("paged_attention_k_table", table_k), ("paged_attention_v_table", table_v)):
        if table is None:
            continue
        if table.data_type != DataType.INT32:
            ctx.fail(port, f"page tables must be INT32; got {table.data_type.name}")
        if len(table.dim) != 4 or table.dim[0] != b or table.dim[1] != 1 or table.dim[3] != 1:
            ctx.fail(port, f"dims must be (b, 1, pages per sequence, 1) with b={b}; got {list(table.dim)}")
    max_s_kv = a.get("paged_attention_max_seq_len_kv")
    if max_s_kv is not None:
        if table_k is None and table_v is None:
            ctx.fail("paged_attention_max_seq_len_kv", "is only meaningful with paged K/V caches "
                                                       "(paged_attention_k_table / paged_attention_v_table)")
        if max_s_kv <= 0:
            ctx.fail("paged_attention_max_seq_len_kv", f"must be positive; got {max_s_kv}")
    s_kv = infer_s_kv(k_dim, v_dim, table_k is not None, table_v is not None, max_s_kv,
                      tuple(bias.dim) if bias is not None and len(bias.dim) == 4 else None,
                      tuple(table_k.dim) if table_k is not None else None,
                      tuple(table_v.dim) if table_v is not None else None)
    geo = _Geometry(b, h_q, h_k, h_v, s_q, s_kv, d_qk, d_v)

    for port, table, container in (("paged_attention_k_table", table_k, k_dim),
                                   ("paged_attention_v_table", table_v, v_dim)):
        if table is None:
            continue
        pages = -(-s_kv // container[2])
        if table.dim[2] != pages:
            ctx.fail(port, f"holds {table.dim[2]} pages per sequence; s_kv={s_kv} with page size {container[2]} "
                           f"needs ceil(s_kv / page_size) = {pages}")

    padding = bool(a.get("use_padding_mask"))
    seq_q, seq_kv = ctx.inputs.get("seq_len_q"), ctx.inputs.get("seq_len_kv")
    if padding:
        if seq_q is None:
            ctx.fail("seq_len_q", "use_padding_mask=True needs seq_len_q and seq_len_kv")
        if seq_kv is None:
            ctx.fail("seq_len_kv", "use_padding_mask=True needs seq_len_q and seq_len_kv")
    elif a.get("score_mod") is None:
        for port, t in (("seq_len_q", seq_q), ("seq_len_kv", seq_kv)):
            if t is not None:
                ctx.fail(port, "sequence lengths are read only with use_padding_mask=True")
    for port, t in (("seq_len_q", seq_q), ("seq_len_kv", seq_kv)):
        if t is not None:
            _check_seq_len(ctx, port, t, b)
    _check_paged_lengths(ctx, table_k is not None or table_v is not None, seq_q, seq_kv)

    scale = ctx.inputs.get("attn_scale")
    if scale is not None:
        _check_scalar(ctx, "attn_scale", scale, _FLOAT_TYPES, "the attention scale")
    if bias is not None:
        _check_broadcastable(ctx, "bias", bias, geo.scores, "an additive score bias")
        if bias.data_type not in _FLOAT_TYPES:
            ctx.fail("bias", f"bias must be a floating-point tensor; got {bias.data_type.name}")
    sink = ctx.inputs.get("sink_token")
    if sink is not None:
        if tuple(sink.dim) != (1, h_q, 1, 1):
            ctx.fail("sink_token", f"dims must be (1, h_q, 1, 1) = {[1, h_q, 1, 1]}; got {list(sink.dim)}")
        if sink.data_type != DataType.FLOAT:
            ctx.fail("sink_token", f"must be FLOAT; got {sink.data_type.name}")

    mask = resolve_masking(a, ctx.fail)
    if a.get("use_alibi_mask") and mask.right_bound != 0:
        ctx.fail("use_alibi_mask", "ALiBi needs a causal band: set use_causal_mask(_bottom_right) or "
                                   "diagonal_band_right_bound=0")
    _check_dropout(ctx, geo, forward=forward)
    _check_ragged(ctx, ("q", "k", "v", "o", "dO", "stats"), b, padding)
    return geo, mask, padding


def _check_dropout(ctx: InferContext, geo: _Geometry, *, forward: bool) -> None:
    a = ctx.attrs
    p = a.get("dropout_probability")
    seed, offset = ctx.inputs.get("dropout_seed"), ctx.inputs.get("dropout_offset")
    dmask, dscale = ctx.inputs.get("dropout_mask"), ctx.inputs.get("dropout_scale")
    dscale_inv = ctx.inputs.get("dropout_scale_inv")
    if p is not None:
        if dmask is not None:
            ctx.fail("dropout", "a custom dropout mask and a dropout probability cannot both be given")
        if not 0.0 <= p < 1.0:
            ctx.fail("dropout", f"the dropout probability must be in [0, 1); got {p}")
        for port, t in (("dropout_seed", seed), ("dropout_offset", offset)):
            if t is None:
                ctx.fail(port, "Philox dropout (a probability) needs a seed and an offset tensor")
            _check_scalar(ctx, port, t, (DataType.INT32, DataType.INT64), "a Philox seed / offset")
    else:
        for port, t in (("dropout_seed", seed), ("dropout_offset", offset)):
            if t is not None:
                ctx.fail(port, "a Philox seed / offset is only read together with a dropout probability")
    if dmask is not None:
        _check_broadcastable(ctx, "dropout_mask", dmask, geo.scores, "a dropout keep-mask")
        if dscale is None:
            ctx.fail("dropout_scale", "a custom dropout mask needs its scale tensor (1 / (1 - p))")
        if not forward and dscale_inv is None:
            ctx.fail("dropout_scale_inv", "sdpa_backward's custom dropout is (mask, scale, scale_inv)")
    else:
        for port, t in (("dropout_scale", dscale), ("dropout_scale_inv", dscale_inv)):
            if t is not None:
                ctx.fail(port, "a dropout scale is only read together with a custom dropout mask")
    for port, t in (("dropout_scale", dscale), ("dropout_scale_inv", dscale_inv)):
        if t is not None:
            _check_scalar(ctx, port, t, _FLOAT_TYPES, "a dropout scale")
    if a.get("rng_dump") is not None and p is None:
        ctx.fail("rng_dump", "rng_dump records the Philox dropout mask; it needs dropout=(p, seed, offset)")


# ------------------------------------------------------------------------------------ forward

def _infer_sdpa(ctx: InferContext) -> dict:
    a = ctx.attrs
    if (a.get("generate_stats") is None) == (a.get("is_inference") is None):
        ctx.fail("generate_stats", "exactly one of generate_stats and is_inference must be set "
                                   "(prefer generate_stats)")
    geo, _mask, _padding = _check_common(ctx, forward=True)
    check_score_mod(ctx, geo.scores)
    q = ctx.inputs["q"]
    block_mask = ctx.inputs.get("block_mask")
    if block_mask is not None:
        if block_mask.data_type != DataType.UINT8:
            ctx.fail("block_mask", f"the block mask is a UINT8 bit mask; got {block_mask.data_type.name}")
        if len(block_mask.dim) != 4 or tuple(block_mask.dim[:2]) != (geo.b, geo.h_q):
            ctx.fail("block_mask", f"dims must be (b, h_q, q tiles, kv tiles / 8) with b={geo.b}, h_q={geo.h_q}; "
                                   f"got {list(block_mask.dim)}")
    if (a.get("score_max") is None) != (a.get("score_sum_exp") is None):
        ctx.fail("score_max" if a.get("score_max") is None else "score_sum_exp",
                 "score_max and score_sum_exp are produced together; give both")

    o_dim = (geo.b, geo.h_q, geo.s_q, geo.d_v)
    row_dim = (geo.b, geo.h_q, geo.s_q, 1)
    out = {"O": OutputInfo(o_dim, q.data_type, _packed_stride_like(o_dim, tuple(q.stride)))}
    if stats_requested(a):
        out["Stats"] = OutputInfo(row_dim, DataType.FLOAT, _packed_stride(row_dim))
    if a.get("score_max") is not None:
        out["score_max"] = OutputInfo(row_dim, DataType.FLOAT, _packed_stride(row_dim))
        out["score_sum_exp"] = OutputInfo(row_dim, DataType.FLOAT, _packed_stride(row_dim))
    if a.get("rng_dump") is not None:
        out["rng_dump"] = OutputInfo(geo.scores, DataType.FLOAT, _packed_stride(geo.scores))
    return out


_MASK_ATTRS = (
    Attr("use_alibi_mask", False, _to_bool, "add ALiBi position biases (needs a causal band)"),
    Attr("use_padding_mask", False, _to_bool, "mask keys >= seq_len_kv[b] and queries >= seq_len_q[b]"),
    Attr("use_causal_mask", False, _to_bool, "deprecated spelling of TOP_LEFT + right bound 0"),
    Attr("use_causal_mask_bottom_right", False, _to_bool, "deprecated spelling of BOTTOM_RIGHT + right bound 0"),
    Attr("sliding_window_length", None, _to_opt_int, "deprecated spelling of diagonal_band_left_bound"),
    Attr("diagonal_alignment", DiagonalAlignment.TOP_LEFT,
         enum_converter(DiagonalAlignment, "diagonal_alignment"), "TOP_LEFT or BOTTOM_RIGHT"),
    Attr("diagonal_band_left_bound", None, _to_opt_int, "keep keys j > i + shift - left (>= 1; None = inf)"),
    Attr("diagonal_band_right_bound", None, _to_opt_int, "keep keys j <= i + shift + right (>= 0; None = inf)"),
    Attr("dropout_probability", None, _to_opt_probability, "Philox dropout probability (from dropout=)"),
)

_DROPOUT_PORTS = (
    Port("dropout_seed", optional=True, doc="Philox seed (1, 1, 1, 1) INT32/INT64; from dropout=(p, seed, offset)"),
    Port("dropout_offset", optional=True, doc="Philox offset (1, 1, 1, 1) INT32/INT64"),
    Port("dropout_mask", optional=True, doc="custom keep-mask broadcastable to (b, h_q, s_q, s_kv)"),
    Port("dropout_scale", optional=True, doc="custom dropout scale (1, 1, 1, 1), usually 1 / (1 - p)"),
)

# Ports the forward and the backward share.
_Q_PORT = Port("q", doc="(b, h_q, s_q, d_qk)")
_SCALE_PORT = Port("attn_scale", optional=True, doc="one-element scale; a Python float is accepted (scalar port)")
_BIAS_PORT = Port("bias", optional=True, doc="additive bias broadcastable to (b, h_q, s_q, s_kv)")
_SEQ_LEN_PORTS = (Port("seq_len_q", optional=True, doc="(b, 1, 1, 1) INT32 or INT64, with use_padding_mask"),
                  Port("seq_len_kv", optional=True, doc="(b, 1, 1, 1) INT32 or INT64, with use_padding_mask"))
# The debug keep-mask output both directions offer (the caller may hand in its tensor).
_RNG_DUMP_ATTR = Attr("rng_dump", None, _to_output_request, "caller's tensor receiving the Philox keep-mask (debug)")
_RNG_DUMP_OUTPUT = Output("rng_dump", _requested("rng_dump"))
_SINK_PORT = Port("sink_token", optional=True, doc="(1, h_q, 1, 1) FLOAT attention-sink logit per head")
# What a score_mod callback reads and built (set by the builder from score_mod=; see ops._score_mod).
_SCORE_MOD_PORT = Port("score_mod_inputs", optional=True, doc="outer tensors the score_mod subgraph reads (set "
                                                              "by the builder)")
_SCORE_MOD_GRAPH_ATTR = Attr("score_mod_graph", None, to_score_mod_graph,
                             "the subgraph score_mod built (set by the builder)")

SDPA_POSITIONAL = (
    "q", "k", "v", "is_inference", "attn_scale", "bias", "block_mask", "use_alibi_mask", "use_padding_mask",
    "seq_len_q", "seq_len_kv", "use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length",
    "diagonal_alignment", "diagonal_band_left_bound", "diagonal_band_right_bound", "dropout", "rng_dump",
    "paged_attention_k_table", "paged_attention_v_table", "paged_attention_max_seq_len_kv",
    "compute_data_type", "name", "score_mod", "generate_stats", "implementation", "score_max",
    "score_sum_exp", "sink_token", "unfuse_fma",
)

SDPA_BACKWARD_POSITIONAL = (
    "q", "k", "v", "o", "dO", "stats", "attn_scale", "bias", "dBias", "use_alibi_mask", "use_padding_mask",
    "seq_len_q", "seq_len_kv", "max_total_seq_len_q", "max_total_seq_len_kv", "use_causal_mask",
    "use_causal_mask_bottom_right", "sliding_window_length", "diagonal_alignment", "diagonal_band_left_bound",
    "diagonal_band_right_bound", "dropout", "rng_dump", "use_deterministic_algorithm", "compute_data_type",
    "name", "score_mod", "score_mod_bprop", "sink_token", "dSink_token",
)

# positional includes pygraph's generic compute_data_type and name at their pygraph positions;
# 'dropout' is expanded by the schema's keyword_expanders.
_GENERIC_POSITIONAL = ("compute_data_type", "name")

_SDPA = OpSchema(
    name="sdpa",
    family="sdpa",
    inputs=(
        _Q_PORT,
        Port("k", doc="(b, h_k, s_kv, d_qk), or a page container (pages, h_k, page_size, d_qk) when paged"),
        Port("v", doc="(b, h_v, s_kv, d_v), or a page container (pages, h_v, page_size, d_v) when paged"),
        _SCALE_PORT,
        _BIAS_PORT,
        Port("block_mask", optional=True, doc="UINT8 tile bit mask (cuDNN >= 9.14, unified engine)"),
        *_SEQ_LEN_PORTS,
        *_DROPOUT_PORTS,
        Port("paged_attention_k_table", optional=True, doc="(b, 1, pages per sequence, 1) INT32 page ids of k"),
        Port("paged_attention_v_table", optional=True, doc="(b, 1, pages per sequence, 1) INT32 page ids of v"),
        _SINK_PORT,
        _SCORE_MOD_PORT,
    ),
    outputs=(
        Output("O"),
        Output("Stats", lambda attrs, _given: stats_requested(attrs)),
        Output("score_max", _requested("score_max")),
        Output("score_sum_exp", _requested("score_sum_exp")),
        _RNG_DUMP_OUTPUT,
    ),
    infer=_infer_sdpa,
    attrs=(
        Attr("is_inference", None, _to_opt_bool, "deprecated: the negation of generate_stats"),
        *_MASK_ATTRS,
        _RNG_DUMP_ATTR,
        Attr("paged_attention_max_seq_len_kv", None, _to_opt_int, "logical s_kv when K and V are both paged"),
        Attr("score_mod", None, _to_opt_callable, "pygraph score-modifier callback (builds a subgraph)"),
        _SCORE_MOD_GRAPH_ATTR,
        Attr("generate_stats", None, _to_opt_bool, "also write Stats (logsumexp per row) for the backward"),
        Attr("implementation", AttentionImplementation.AUTO,
             enum_converter(AttentionImplementation, "implementation"), "AUTO, COMPOSITE or UNIFIED"),
        Attr("score_max", None, _to_output_request, "caller's tensor receiving the row max (b, h_q, s_q, 1)"),
        Attr("score_sum_exp", None, _to_output_request,
             "caller's tensor receiving sum(exp(score - max)) per row (b, h_q, s_q, 1)"),
        Attr("unfuse_fma", False, _to_bool, "SM100 softmax numerics switch (no effect off Blackwell)"),
    ),
    positional=SDPA_POSITIONAL,
    returns="list",
    doc="Scaled dot-product attention forward (flash attention); returns [O, Stats].",
    returned_outputs=("O", "Stats"),
    output_keywords=("score_max", "score_sum_exp", "rng_dump"),
    scalar_ports={"attn_scale": DataType.FLOAT},
    keyword_expanders={"dropout": expand_dropout_forward},
    list_ports=("score_mod_inputs",),
    prepare_call=prepare_score_mod_call,
    generic_positional=_GENERIC_POSITIONAL,
    aliases=("scaled_dot_product_flash_attention",),
)


# ----------------------------------------------------------------------------------- backward

def _infer_sdpa_backward(ctx: InferContext) -> dict:
    a = ctx.attrs
    geo, _mask, _padding = _check_common(ctx, forward=False)
    check_score_mod(ctx, geo.scores)
    q, k, v = ctx.inputs["q"], ctx.inputs["k"], ctx.inputs["v"]
    o, d_o, stats = ctx.need("o"), ctx.need("dO"), ctx.need("stats")
    o_dim = (geo.b, geo.h_q, geo.s_q, geo.d_v)
    for port, t in (("o", o), ("dO", d_o)):
        if tuple(t.dim) != o_dim:
            ctx.fail(port, f"dims must be (b, h_q, s_q, d_v) = {list(o_dim)}; got {list(t.dim)}")
        _check_io_type(ctx, port, t, q)
    row_dim = (geo.b, geo.h_q, geo.s_q, 1)
    if tuple(stats.dim) != row_dim:
        ctx.fail("stats", f"dims must be (b, h_q, s_q, 1) = {list(row_dim)}; got {list(stats.dim)}")
    if stats.data_type != DataType.FLOAT:
        ctx.fail("stats", f"the softmax stats are FLOAT; got {stats.data_type.name}")
    for name in ("max_total_seq_len_q", "max_total_seq_len_kv"):
        if a.get(name) is not None and a[name] <= 0:
            ctx.fail(name, f"must be positive; got {a[name]}")
    bias = ctx.inputs.get("bias")
    if a.get("dBias") is not None and bias is None:
        ctx.fail("dBias", "dBias is the gradient of bias; it needs bias")
    if a.get("dSink_token") is not None and ctx.inputs.get("sink_token") is None:
        ctx.fail("dSink_token", "dSink_token is the gradient of sink_token; it needs sink_token")
    if a.get("score_mod_bprop") is not None and a.get("score_mod") is None:
        ctx.fail("score_mod_bprop", "score_mod_bprop differentiates score_mod; give score_mod too")

    out = {
        "dQ": OutputInfo(tuple(q.dim), q.data_type, _packed_stride_like(tuple(q.dim), tuple(q.stride))),
        "dK": OutputInfo(tuple(k.dim), k.data_type, _packed_stride_like(tuple(k.dim), tuple(k.stride))),
        "dV": OutputInfo(tuple(v.dim), v.data_type, _packed_stride_like(tuple(v.dim), tuple(v.stride))),
    }
    if a.get("dBias") is not None:
        out["dBias"] = OutputInfo(tuple(bias.dim), bias.data_type, _packed_stride(tuple(bias.dim)))
    if a.get("dSink_token") is not None:
        out["dSink_token"] = OutputInfo((1, geo.h_q, 1, 1), DataType.FLOAT, (geo.h_q, 1, 1, 1))
    if a.get("rng_dump") is not None:
        out["rng_dump"] = OutputInfo(geo.scores, DataType.FLOAT, _packed_stride(geo.scores))
    return out


_SDPA_BACKWARD = OpSchema(
    name="sdpa_backward",
    family="sdpa",
    inputs=(
        _Q_PORT,
        Port("k", doc="(b, h_k, s_kv, d_qk)"),
        Port("v", doc="(b, h_v, s_kv, d_v)"),
        Port("o", doc="forward output (b, h_q, s_q, d_v)"),
        Port("dO", doc="gradient of o (b, h_q, s_q, d_v)"),
        Port("stats", doc="forward Stats (b, h_q, s_q, 1) FLOAT"),
        _SCALE_PORT,
        _BIAS_PORT,
        *_SEQ_LEN_PORTS,
        *_DROPOUT_PORTS,
        Port("dropout_scale_inv", optional=True, doc="custom dropout inverse scale (1, 1, 1, 1)"),
        _SINK_PORT,
        _SCORE_MOD_PORT,
        Port("score_mod_bprop_inputs", optional=True, doc="outer tensors the score_mod_bprop subgraph reads"),
    ),
    outputs=(
        Output("dQ"), Output("dK"), Output("dV"),
        Output("dBias", _requested("dBias")),
        Output("dSink_token", _requested("dSink_token")),
        _RNG_DUMP_OUTPUT,
    ),
    infer=_infer_sdpa_backward,
    attrs=(
        Attr("dBias", None, _to_output_request, "caller's tensor receiving the bias gradient (bias dims)"),
        *_MASK_ATTRS,
        Attr("max_total_seq_len_q", None, _to_opt_int, "workspace bound for ragged q (sum of seq_len_q)"),
        Attr("max_total_seq_len_kv", None, _to_opt_int, "workspace bound for ragged k/v"),
        _RNG_DUMP_ATTR,
        Attr("use_deterministic_algorithm", False, _to_bool, "ask cuDNN for a deterministic dQ reduction"),
        Attr("score_mod", None, _to_opt_callable, "forward score-modifier callback (recomputed here)"),
        Attr("score_mod_bprop", None, _to_opt_callable, "backward of score_mod"),
        _SCORE_MOD_GRAPH_ATTR,
        Attr("score_mod_bprop_graph", None, to_score_mod_graph, "the subgraph score_mod_bprop built (set by the "
                                                                "builder)"),
        Attr("dSink_token", None, _to_output_request, "caller's tensor receiving the sink gradient (1, h_q, 1, 1)"),
    ),
    positional=SDPA_BACKWARD_POSITIONAL,
    returns="list",
    doc="Scaled dot-product attention backward; returns [dQ, dK, dV].",
    returned_outputs=("dQ", "dK", "dV"),
    output_keywords=("dBias", "dSink_token", "rng_dump"),
    scalar_ports={"attn_scale": DataType.FLOAT},
    keyword_expanders={"dropout": expand_dropout_backward},
    list_ports=("score_mod_inputs", "score_mod_bprop_inputs"),
    prepare_call=prepare_score_mod_call,
    declined_keywords={name: PAGED_BACKWARD_REASON for name in (
        "paged_attention_k_table", "paged_attention_v_table", "paged_attention_max_seq_len_kv")},
    generic_positional=_GENERIC_POSITIONAL,
    aliases=("scaled_dot_product_flash_attention_backward",),
)

register(_SDPA, _SDPA_BACKWARD)
