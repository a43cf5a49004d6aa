"""Linear-attention (delta-rule) op schemas: ``gdn``, ``gdn_bwd``, ``kda``, ``kda_bwd``, ``gdn2`` and ``gdn2_bwd``.

These are python-only ops: cuDNN has no equivalent, so only python engines (the cuTile chunked kernels)
run them. Method, port and attribute names follow cudnn-frontend's pygraph methods of the same names;
the tensors' layouts follow flash-linear-attention's (fla) varlen convention.

Layout is varlen ("packed"): every sequence of a batch is concatenated along one token axis ``T`` and
``cu_seqlens`` (int32, ``N + 1`` entries, ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[N] == T``)
marks where sequence ``n`` starts and ends. ``H`` query/key heads, ``HV`` value heads (grouped value heads:
``HV`` a multiple of ``H``; value head ``j`` reads query/key head ``j // (HV // H)``, fla's GVA; ``HV == H``
is the plain case), key width ``K``, value width ``V``::

    o, final_state, _ = graph.gdn(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)

    q, k         (T, H, K)      bf16 / fp16 / fp32 (all three of q, k, v share one type)
    v            (T, HV, V)
    g            (T, HV)        fp32, log-space decay per token and value head (``kda``, ``gdn2``: (T, HV, K),
                                one decay per key channel); with ``safe_gate`` the raw gate input, any I/O type
    beta         (T, HV)        write strength (``gdn2``: (T, HV, K)); bf16 / fp16 / fp32; with
                                ``use_beta_sigmoid`` its logits
    w            (T, HV, V)     ``gdn2`` only: write gate on the value channels; bf16 / fp16 / fp32
    initial_state (N, HV, K, V) fp32, optional; zeros when absent
    a_log        (HV,)          ``safe_gate`` only, optional (zeros when absent): per-head log decay rate
    dt_bias      (HV,)          ``safe_gate`` only, optional (zeros): bias of the raw gate (``kda``, ``gdn2``:
                                (HV, K)); a_log and dt_bias bf16 / fp16 / fp32
    o            (T, HV, V)     type of v
    final_state  (N, HV, K, V)  fp32, only with ``output_final_state=True``
    state_checkpoints (T // n + N, HV, K, V)  only with ``checkpoint_every_n_tokens=n > 0``: the state
                                before tokens 0, n, 2n, ... of each sequence (its initial state first), type of
                                q unless set to FLOAT; sequence ``i``'s rows follow those of the sequences
                                before it (``ceil(len / n)`` rows each; rows past the last are not written)
    chunk_cache  (bytes,) UINT8 ``gdn`` / ``kda``, when asked for (``chunk_cache=tensor``, an output the caller
                                makes, as pygraph's sdpa side outputs; ``chunk_cache_layout``): per 64-token chunk
                                and value head what the backward's first kernel would form again from k, g and
                                beta; the backward given it (``gdn_bwd`` / ``kda_bwd(chunk_cache=...)``, with the
                                forward's ``state_checkpoints``) reads it instead, where its engine can. Like the
                                checkpoints, it must come from the forward of the same inputs and attributes:
                                the schema checks its size, not its contents

Per token the state ``S`` (K x V) decays by ``exp(g)``, takes a delta-rule write
``S += beta * k (v - S^T k)^T`` and the output is ``o = scale * S^T q``. ``scale`` defaults to
``1 / sqrt(K)`` (``resolved_scale``); ``use_qk_l2norm`` normalises q and k per head first.

Gate options (attributes; the transforms run in the engines' kernels, see ``gate_transform``):

- ``safe_gate``: ``g`` is the raw gate; the log decay is ``-exp(a_log) * softplus(g + dt_bias)`` (fla's
  ``use_gate_in_kernel``; Qwen3-Next's and Kimi's gate). ``kda`` / ``gdn2`` with ``gate_lower_bound=lb``
  (negative) use fla's bounded form ``lb * sigmoid(exp(a_log) * (g + dt_bias))`` instead.
- ``use_beta_sigmoid``: ``beta`` holds logits; the write strength is ``sigmoid(beta)``, or
  ``2 * sigmoid(beta)`` with ``allow_neg_eigval``.

Backward ops take the forward inputs plus ``dO`` (T, HV, V) and, optionally, ``d_final_state``
(N, HV, K, V) fp32 and the forward's ``state_checkpoints`` (with the same ``checkpoint_every_n_tokens``: the
backward starts from those states instead of running the forward's state recurrence again) and, ``gdn_bwd`` /
``kda_bwd``, the forward's ``chunk_cache`` (an engine that does not read it forms the same factors again), and return
``[dq, dk, dv, dg, dbeta, d_initial_state, d_a_log, d_dt_bias]``
(``gdn2_bwd``: ``[dq, dk, dv, dg, dbeta, dw, d_initial_state, d_a_log, d_dt_bias]``); ``d_initial_state``
exists only when ``initial_state`` was given, ``d_a_log`` / ``d_dt_bias`` only when ``a_log`` / ``dt_bias``
were. ``dg`` is fp32 (shape of g); the others have their input's type. The gradients are those of the
inputs as given: of the raw gate with ``safe_gate``, of the logits with ``use_beta_sigmoid``; dq and dk
sum over the value heads that share a query/key head.

``cu_seqlens`` values are data, not geometry: whether they are monotone and end at ``T`` is checked by the
engine at execute time, not here.

Example:
    >>> from cudnn_graph.ops._linear_attention import gate_transform
    >>> gate_transform("gdn", {"safe_gate": True})
    'softplus'
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional

from .._layout import row_major_strides as _packed_stride
from ..data_type import DataType
from .schema import Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo, register

__all__ = ["resolved_scale", "gate_transform", "beta_transform", "checkpoint_rows", "chunk_cache_layout",
           "PER_CHANNEL_GATE_OPS", "CHUNK_CACHE_TOKENS"]

_IO_TYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"a bool was expected; got {value!r}")


def _to_opt_scale(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale must be a float (or None for 1/sqrt(K)); got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"scale must be positive and finite; got {value}")
    return value


def _to_opt_lower_bound(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"gate_lower_bound must be a float (or None); got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value < 0.0):
        raise ValueError(f"gate_lower_bound must be negative and finite (a log decay); got {value}")
    return value


def _to_cadence(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"checkpoint_every_n_tokens must be an int (0: no checkpoints); got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"checkpoint_every_n_tokens must be >= 0 (0: no checkpoints); got {value}")
    return value


def checkpoint_rows(tokens: int, sequences: int, every: int) -> int:
    """Rows of a ``state_checkpoints`` tensor: ``T // n + N`` (at least 1), a bound on the ``ceil(len / n)``
    rows each sequence takes (the frontend's count).

    Example:
        >>> checkpoint_rows(8192, 4, 64)
        132
    """
    return max(tokens // every + sequences, 1)


PER_CHANNEL_GATE_OPS = frozenset({"kda", "kda_bwd", "gdn2", "gdn2_bwd"})

CHUNK_CACHE_TOKENS = 64          # a chunk_cache's chunk: the GPU kernels' (chunk_cache_layout)
_CHUNK_CACHE_ALIGN = 256         # bytes: where each of its regions starts


def chunk_cache_layout(tokens: int, sequences: int, value_heads: int, key_dim: int, io_type: DataType,
                       per_channel_gate: bool = False) -> tuple[int, dict]:
    """``(bytes, {region: (byte offset, shape, DataType)})`` of a ``gdn`` / ``kda`` (``per_channel_gate``)
    chunk_cache: per 64-token chunk of each
    sequence (sequence ``i``'s ``ceil(len / 64)`` chunks follow those of the sequences before it, ``ceil(T / 64) + N``
    places in all, as the GPU kernels number them) and value head, the factors the forward's first kernel forms
    and its backward would form again:

    - ``gate_sums`` (T, HV) FLOAT (kda: (T, HV, K), per key channel): each token's gate summed from its chunk's
      first token (``gc``);
    - ``w`` (chunks, HV, 64, K): ``T diag(beta) (k e^gc)``, the chunk's keys through the UT transform;
    - ``kd`` (chunks, HV, 64, K): ``k e^(gc_last - gc)``, the keys decayed to the chunk's end;
    - ``t`` (chunks, HV, 64, 64): ``T = (I + A)^-1``, A the strictly lower ``beta_t (k_t e^gc_t . k_i e^-gc_i)``;

    w, kd and t in the input type (q's), each region 256-byte aligned. Rows past a chunk's last token and
    chunks past the last sequence's are not written.

    Example:
        >>> size, regions = chunk_cache_layout(8192, 4, 16, 128, DataType.BFLOAT16)
        >>> regions["t"][1], size
        ((132, 16, 64, 64), 87031808)
    """
    chunks = -(-tokens // CHUNK_CACHE_TOKENS) + sequences
    item = 4 if io_type == DataType.FLOAT else 2
    regions, offset = {}, 0
    gates = (tokens, value_heads, key_dim) if per_channel_gate else (tokens, value_heads)
    for name, shape, data_type in (("gate_sums", gates, DataType.FLOAT),
                                   ("w", (chunks, value_heads, CHUNK_CACHE_TOKENS, key_dim), io_type),
                                   ("kd", (chunks, value_heads, CHUNK_CACHE_TOKENS, key_dim), io_type),
                                   ("t", (chunks, value_heads, CHUNK_CACHE_TOKENS, CHUNK_CACHE_TOKENS), io_type)):
        regions[name] = (offset, shape, data_type)
        count = 4 if data_type == DataType.FLOAT else item
        for d in shape:
            count *= d
        offset += -(-count // _CHUNK_CACHE_ALIGN) * _CHUNK_CACHE_ALIGN
    return offset, regions


def gate_transform(op: str, attrs: Mapping[str, Any]) -> str:
    """How an engine turns the ``g`` port into the log decay: ``"none"`` (g is the log decay),
    ``"softplus"`` (``-exp(a_log) * softplus(g + dt_bias)``) or ``"sigmoid"``
    (``gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias))``, kda / gdn2 with a lower bound)."""
    if not attrs.get("safe_gate"):
        return "none"
    return "sigmoid" if op in PER_CHANNEL_GATE_OPS and attrs.get("gate_lower_bound") is not None else "softplus"


def beta_transform(attrs: Mapping[str, Any]) -> float:
    """The factor of ``sigmoid(beta)`` an engine applies to the ``beta`` port: 0.0 when beta is used as
    given, 1.0 with ``use_beta_sigmoid``, 2.0 with ``allow_neg_eigval`` as well."""
    if not attrs.get("use_beta_sigmoid"):
        return 0.0
    return 2.0 if attrs.get("allow_neg_eigval") else 1.0


def resolved_scale(attrs: Mapping[str, Any], key_dim: int) -> float:
    """The query scale an engine applies: ``attrs['scale']`` or ``1 / sqrt(K)``."""
    scale = attrs.get("scale")
    return 1.0 / math.sqrt(key_dim) if scale is None else float(scale)


def _out(dim: tuple, data_type: DataType) -> OutputInfo:
    return OutputInfo(tuple(dim), data_type, _packed_stride(tuple(dim)))


def _check_dims(ctx: InferContext, port: str, t: TensorInfo, expected: tuple, names: str) -> None:
    if tuple(t.dim) != tuple(expected):
        ctx.fail(port, f"dims must be {names} = {list(expected)}; got {list(t.dim)}")


def _check_type(ctx: InferContext, port: str, t: TensorInfo, allowed: tuple) -> None:
    if t.data_type not in allowed:
        ctx.fail(port, f"data type must be {' or '.join(x.name for x in allowed)}; got {t.data_type.name}")



class _Shapes:
    """T, H (query/key heads), HV (value heads), K, V, N read off q, v and cu_seqlens after the checks."""

    def __init__(self, T: int, H: int, HV: int, K: int, V: int, N: int):
        self.T, self.H, self.HV, self.K, self.V, self.N = T, H, HV, K, V, N


class _Features:
    """Which optional parts an op schema has: per-channel gate and beta, the write gate w, the chunk cache."""

    def __init__(self, per_channel_gate: bool, per_channel_beta: bool, write_gate: bool, chunk_cache: bool = False):
        self.per_channel_gate, self.per_channel_beta, self.write_gate = per_channel_gate, per_channel_beta, write_gate
        self.chunk_cache = chunk_cache


def _check_gate_options(ctx: InferContext, s: _Shapes, f: _Features) -> None:
    """a_log / dt_bias exist only with safe_gate; gate_lower_bound needs safe_gate; allow_neg_eigval needs
    use_beta_sigmoid."""
    safe = bool(ctx.attrs.get("safe_gate"))
    for port, dims, names in (("a_log", (s.HV,), "(HV,)"),
                              ("dt_bias", (s.HV, s.K) if f.per_channel_gate else (s.HV,),
                               "(HV, K)" if f.per_channel_gate else "(HV,)")):
        t = ctx.inputs.get(port)
        if t is None:
            continue
        if not safe:
            ctx.fail(port, "is an input of the gate transform: it needs safe_gate=True")
        _check_dims(ctx, port, t, dims, names)
        _check_type(ctx, port, t, _IO_TYPES)
    if ctx.attrs.get("gate_lower_bound") is not None and not safe:
        ctx.fail("g", "gate_lower_bound bounds the gate transform: it needs safe_gate=True")
    if ctx.attrs.get("allow_neg_eigval") and not ctx.attrs.get("use_beta_sigmoid"):
        ctx.fail("beta", "allow_neg_eigval doubles the in-kernel sigmoid: it needs use_beta_sigmoid=True")


def _check_forward_inputs(ctx: InferContext, f: _Features) -> _Shapes:
    q, k, v = ctx.need("q"), ctx.need("k"), ctx.need("v")
    if len(q.dim) != 3 or any(d <= 0 for d in q.dim):
        ctx.fail("q", f"must have rank 3 (T, H, K) with positive dims; got {list(q.dim)}")
    T, H, K = q.dim
    _check_type(ctx, "q", q, _IO_TYPES)
    _check_dims(ctx, "k", k, (T, H, K), "(T, H, K) like q")
    if len(v.dim) != 3 or v.dim[0] != T or v.dim[1] <= 0 or v.dim[2] <= 0:
        ctx.fail("v", f"dims must be (T, HV, V) with T={T} (from q); got {list(v.dim)}")
    HV, V = v.dim[1], v.dim[2]
    if HV % H:
        ctx.fail("v", f"has HV={HV} value heads; grouped value heads need a multiple of the H={H} query/key "
                      "heads (value head j reads query/key head j // (HV // H))")
    for port, t in (("k", k), ("v", v)):
        if t.data_type != q.data_type:
            ctx.fail(port, f"data type {t.data_type.name} differs from q's {q.data_type.name}")

    g = ctx.need("g")
    g_dim, g_names = ((T, HV, K), "(T, HV, K)") if f.per_channel_gate else ((T, HV), "(T, HV)")
    _check_dims(ctx, "g", g, g_dim, g_names)
    _check_type(ctx, "g", g, _IO_TYPES if ctx.attrs.get("safe_gate") else (DataType.FLOAT,))
    beta = ctx.need("beta")
    b_dim, b_names = ((T, HV, K), "(T, HV, K)") if f.per_channel_beta else ((T, HV), "(T, HV)")
    _check_dims(ctx, "beta", beta, b_dim, b_names)
    _check_type(ctx, "beta", beta, _IO_TYPES)
    if f.write_gate:
        w = ctx.need("w")
        _check_dims(ctx, "w", w, (T, HV, V), "(T, HV, V)")
        _check_type(ctx, "w", w, _IO_TYPES)

    cu = ctx.need("cu_seqlens")
    if cu.data_type != DataType.INT32:
        ctx.fail("cu_seqlens", f"must be INT32; got {cu.data_type.name}")
    if len(cu.dim) != 1 or cu.dim[0] < 2:
        ctx.fail("cu_seqlens", f"must be 1-D with N + 1 >= 2 entries (sequence boundaries); got dims {list(cu.dim)}")
    N = cu.dim[0] - 1

    h0 = ctx.inputs.get("initial_state")
    if h0 is not None:
        if len(h0.dim) == 4 and h0.dim[0] != N and tuple(h0.dim[1:]) == (HV, K, V):
            ctx.fail("initial_state", f"holds {h0.dim[0]} states but cu_seqlens describes N={N} sequences")
        _check_dims(ctx, "initial_state", h0, (N, HV, K, V), "(N, HV, K, V)")
        _check_type(ctx, "initial_state", h0, (DataType.FLOAT,))
    s = _Shapes(T, H, HV, K, V, N)
    _check_gate_options(ctx, s, f)
    return s


def _forward_infer(f: _Features):
    def infer(ctx: InferContext) -> dict:
        s = _check_forward_inputs(ctx, f)
        out = {"o": _out((s.T, s.HV, s.V), ctx.inputs["v"].data_type)}
        if ctx.attrs.get("output_final_state"):
            out["final_state"] = _out((s.N, s.HV, s.K, s.V), DataType.FLOAT)
        every = ctx.attrs.get("checkpoint_every_n_tokens") or 0
        if every:
            out["state_checkpoints"] = _out((checkpoint_rows(s.T, s.N, every), s.HV, s.K, s.V),
                                            ctx.inputs["q"].data_type)
        if ctx.attrs.get("chunk_cache") is not None:
            out["chunk_cache"] = _out((_chunk_cache_bytes(ctx, s, f),), DataType.UINT8)
        return out
    return infer


def _chunk_cache_bytes(ctx: InferContext, s: _Shapes, f: _Features) -> int:
    return chunk_cache_layout(s.T, s.N, s.HV, s.K, ctx.inputs["q"].data_type, f.per_channel_gate)[0]


def _check_chunk_cache_input(ctx: InferContext, s: _Shapes, f: _Features) -> None:
    """A backward's chunk_cache is the bytes its forward wrote for these shapes."""
    given = ctx.inputs.get("chunk_cache")
    if given is None:
        return
    _check_type(ctx, "chunk_cache", given, (DataType.UINT8,))
    _check_dims(ctx, "chunk_cache", given, (_chunk_cache_bytes(ctx, s, f),),
                "(bytes,) as the forward made them for these T, N, HV, K and input type (chunk_cache_layout)")


def _check_checkpoints_input(ctx: InferContext, s: _Shapes) -> None:
    """A backward's state_checkpoints and checkpoint_every_n_tokens come together, shaped as the forward made
    them."""
    every = ctx.attrs.get("checkpoint_every_n_tokens") or 0
    given = ctx.inputs.get("state_checkpoints")
    if given is None:
        if every:
            ctx.fail("state_checkpoints", f"is missing: checkpoint_every_n_tokens={every} says the backward starts "
                                          "from the forward's checkpoints (pass them, or leave the attribute 0)")
        return
    if not every:
        ctx.fail("state_checkpoints", "was given with checkpoint_every_n_tokens=0; pass the forward's "
                                      "checkpoint_every_n_tokens too")
    rows = checkpoint_rows(s.T, s.N, every)
    _check_dims(ctx, "state_checkpoints", given, (rows, s.HV, s.K, s.V),
                f"(T // {every} + N, HV, K, V) as the forward made them")
    io = ctx.inputs["q"].data_type
    _check_type(ctx, "state_checkpoints", given, (io, DataType.FLOAT) if io != DataType.FLOAT else (io,))


def _backward_infer(f: _Features):
    def infer(ctx: InferContext) -> dict:
        s = _check_forward_inputs(ctx, f)
        v = ctx.inputs["v"]
        d_o = ctx.need("dO")
        _check_dims(ctx, "dO", d_o, (s.T, s.HV, s.V), "(T, HV, V) like o")
        if d_o.data_type != v.data_type:
            ctx.fail("dO", f"data type {d_o.data_type.name} differs from v's {v.data_type.name}")
        dht = ctx.inputs.get("d_final_state")
        if dht is not None:
            _check_dims(ctx, "d_final_state", dht, (s.N, s.HV, s.K, s.V), "(N, HV, K, V)")
            _check_type(ctx, "d_final_state", dht, (DataType.FLOAT,))
        _check_checkpoints_input(ctx, s)
        _check_chunk_cache_input(ctx, s, f)
        q, k, beta, g = ctx.inputs["q"], ctx.inputs["k"], ctx.inputs["beta"], ctx.inputs["g"]
        out = {
            "dq": _out(q.dim, q.data_type), "dk": _out(k.dim, k.data_type), "dv": _out(v.dim, v.data_type),
            "dg": _out(g.dim, DataType.FLOAT), "dbeta": _out(beta.dim, beta.data_type),
        }
        if f.write_gate:
            w = ctx.inputs["w"]
            out["dw"] = _out(w.dim, w.data_type)
        if ctx.inputs.get("initial_state") is not None:
            out["d_initial_state"] = _out((s.N, s.HV, s.K, s.V), DataType.FLOAT)
        for port in ("a_log", "dt_bias"):
            t = ctx.inputs.get(port)
            if t is not None:
                out["d_" + port] = _out(t.dim, t.data_type)
        return out
    return infer


def _final_state_wanted(attrs, _given) -> bool:
    return bool(attrs.get("output_final_state"))


def _checkpoints_wanted(attrs, _given) -> bool:
    return bool(attrs.get("checkpoint_every_n_tokens"))


def _chunk_cache_wanted(attrs, _given) -> bool:
    return attrs.get("chunk_cache") is not None


def _to_output_request(value: Any) -> Any:
    """An output the caller makes (pygraph's side-output keywords): None / False: not wanted; True: made by the
    builder; a graph tensor: bound as the output."""
    if value is None or value is False:
        return None
    return value


def _given(port: str):
    def when(_attrs, given) -> bool:
        return port in given
    when.__name__ = f"has_{port}"
    return when


_SCALE = Attr("scale", None, _to_opt_scale, "query scale; None means 1 / sqrt(K)")
_L2 = Attr("use_qk_l2norm", False, _to_bool, "L2-normalise q and k per token and head before use")
_FINAL = Attr("output_final_state", False, _to_bool, "also return each sequence's final state (N, HV, K, V)")
_CHECKPOINTS = Attr("checkpoint_every_n_tokens", 0, _to_cadence,
                    "forward: also return the state before every n-th token of each sequence (state_checkpoints); "
                    "backward: start from those (the state_checkpoints input); 0: none")
_SAFE_GATE = Attr("safe_gate", False, _to_bool,
                  "g is the raw gate: the log decay is -exp(a_log) * softplus(g + dt_bias) (with gate_lower_bound: "
                  "gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias)))")
_LOWER_BOUND = Attr("gate_lower_bound", None, _to_opt_lower_bound,
                    "kda / gdn2 with safe_gate: the bounded gate form's lower bound (negative); None: softplus")
_BETA_SIGMOID = Attr("use_beta_sigmoid", False, _to_bool, "beta holds logits: the write strength is sigmoid(beta)")
_NEG_EIGVAL = Attr("allow_neg_eigval", False, _to_bool, "with use_beta_sigmoid: the write strength is 2 sigmoid(beta)")
_CHUNK_CACHE = Attr("chunk_cache", None, _to_output_request,
                    "caller's tensor receiving the per-chunk factors the backward reads instead of forming them "
                    "again ((bytes,) UINT8, chunk_cache_layout)")


def _forward_ports(f: _Features) -> tuple:
    g_doc = "(T, HV, K) log decay per key channel" if f.per_channel_gate else "(T, HV) log decay"
    beta_doc = "(T, HV, K) write strength per key channel" if f.per_channel_beta else "(T, HV) write strength"
    ports = [Port("q", doc="(T, H, K)"), Port("k", doc="(T, H, K)"), Port("v", doc="(T, HV, V)"),
             Port("g", doc=g_doc + " (the raw gate with safe_gate)"),
             Port("beta", doc=beta_doc + " (its logits with use_beta_sigmoid)")]
    if f.write_gate:
        ports.append(Port("w", doc="(T, HV, V) write gate on the value channels"))
    ports += [Port("cu_seqlens", doc="(N + 1,) INT32 sequence boundaries in T"),
              Port("initial_state", optional=True, doc="(N, HV, K, V) FLOAT; zeros when absent"),
              Port("a_log", optional=True, doc="(HV,) safe_gate's per-head log decay rate; zeros when absent"),
              Port("dt_bias", optional=True, doc=("(HV, K)" if f.per_channel_gate else "(HV,)")
                   + " safe_gate's bias of the raw gate; zeros when absent")]
    return tuple(ports)


def _backward_ports(f: _Features) -> tuple:
    ports = _forward_ports(f) + (
        Port("dO", doc="(T, HV, V) gradient of o"),
        Port("d_final_state", optional=True, doc="(N, HV, K, V) FLOAT gradient of final_state"),
        Port("state_checkpoints", optional=True,
             doc="(T // n + N, HV, K, V) the forward's state_checkpoints at n = checkpoint_every_n_tokens"),
    )
    if f.chunk_cache:
        ports += (Port("chunk_cache", optional=True, doc="(bytes,) UINT8 the forward's chunk_cache"),)
    return ports


def _gate_attrs(f: _Features) -> tuple:
    return (_SAFE_GATE,) + ((_LOWER_BOUND,) if f.per_channel_gate else ()) + (_BETA_SIGMOID, _NEG_EIGVAL)


_FWD_OUTPUTS = (Output("o"), Output("final_state", _final_state_wanted),
                Output("state_checkpoints", _checkpoints_wanted))
_PARAMETER_GRADIENTS = (Output("d_initial_state", _given("initial_state")), Output("d_a_log", _given("a_log")),
                        Output("d_dt_bias", _given("dt_bias")))


def _fwd(name: str, doc: str, f: _Features) -> OpSchema:
    positional = ("q", "k", "v", "g", "beta") + (("w",) if f.write_gate else ())
    # the chunk cache is a side output the caller makes (as sdpa's score_max): the returned list stays pygraph's
    cache = ((Output("chunk_cache", _chunk_cache_wanted),), (_CHUNK_CACHE,), ("chunk_cache",)) if f.chunk_cache \
        else ((), (), ())
    return OpSchema(
        name=name, family="linear_attention", python_only=True, returns="list", doc=doc,
        inputs=_forward_ports(f), outputs=_FWD_OUTPUTS + cache[0], infer=_forward_infer(f),
        attrs=(_SCALE, _L2, _FINAL, _CHECKPOINTS) + _gate_attrs(f) + cache[1], positional=positional,
        returned_outputs=tuple(o.name for o in _FWD_OUTPUTS), output_keywords=cache[2],
    )


def _bwd(name: str, doc: str, f: _Features) -> OpSchema:
    outputs = (Output("dq"), Output("dk"), Output("dv"), Output("dg"), Output("dbeta")) \
        + ((Output("dw"),) if f.write_gate else ()) + _PARAMETER_GRADIENTS
    positional = ("q", "k", "v", "g", "beta") + (("w",) if f.write_gate else ()) + ("dO",)
    return OpSchema(
        name=name, family="linear_attention", python_only=True, returns="list", doc=doc,
        inputs=_backward_ports(f), outputs=outputs, infer=_backward_infer(f),
        attrs=(_SCALE, _L2, _CHECKPOINTS) + _gate_attrs(f), positional=positional,
    )


_GDN = _Features(per_channel_gate=False, per_channel_beta=False, write_gate=False, chunk_cache=True)
_KDA = _Features(per_channel_gate=True, per_channel_beta=False, write_gate=False, chunk_cache=True)
_GDN2 = _Features(per_channel_gate=True, per_channel_beta=True, write_gate=True)
_BWD_RETURNS = "[dq, dk, dv, dg, dbeta, d_initial_state, d_a_log, d_dt_bias]"

register(
    _fwd("gdn", "Gated delta net forward (one scalar decay per token and head); returns "
                "[o, final_state, state_checkpoints].", _GDN),
    _bwd("gdn_bwd", f"Gated delta net backward; returns {_BWD_RETURNS}.", _GDN),
    _fwd("kda", "Kimi delta attention forward (per-key-channel decay); returns "
                "[o, final_state, state_checkpoints].", _KDA),
    _bwd("kda_bwd", f"Kimi delta attention backward; returns {_BWD_RETURNS}.", _KDA),
    _fwd("gdn2", "Gated delta net 2 forward (per-channel decay and write strength, value write gate); "
                 "returns [o, final_state, state_checkpoints].", _GDN2),
    _bwd("gdn2_bwd", "Gated delta net 2 backward; returns "
                     "[dq, dk, dv, dg, dbeta, dw, d_initial_state, d_a_log, d_dt_bias].", _GDN2),
)
