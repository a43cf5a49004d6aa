"""Linear-attention (delta-rule) op schemas: ``gdn``, ``gdn_bwd``, ``kda``, ``kda_bwd`` and ``gdn2``.

These are python-only ops: cuDNN has no equivalent, so only python engines (the cuTile chunked kernels)
run them and pygraph has no keywords to copy. The names below follow the tensors' usual names in the
gated-delta-net literature.

Layout is varlen ("packed"): every sequence of a batch is concatenated along one token axis ``T`` and
``cu_seqlens`` (int32, ``N + 1`` entries, ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[N] == T``)
marks where sequence ``n`` starts and ends. ``H`` heads, key width ``K``, value width ``V``::

    o, final_state = graph.gdn(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)

    q, k         (T, H, K)      bf16 / fp16 / fp32 (all three of q, k, v share one type)
    v            (T, H, V)
    g            (T, H)         fp32, log-space decay per token and head (``kda``, ``gdn2``: (T, H, K),
                                one decay per key channel)
    beta         (T, H)         write strength (``gdn2``: (T, H, K)); bf16 / fp16 / fp32
    w            (T, H, V)      ``gdn2`` only: write gate on the value channels; bf16 / fp16 / fp32
    initial_state (N, H, K, V)  fp32, optional; zeros when absent
    o            (T, H, V)      type of v
    final_state  (N, H, K, V)   fp32, only with ``output_final_state=True``

Per token the state ``S`` (K x V) decays by ``exp(g)``, takes a delta-rule write
``S += beta * k (v - S^T k)^T`` and the output is ``o = scale * S^T q``. ``scale`` defaults to
``1 / sqrt(K)`` (``resolved_scale``); ``use_qk_l2norm`` normalises q and k per head first.

Backward ops take the forward inputs plus ``dO`` (T, H, V) and, optionally, ``d_final_state``
(N, H, K, V) fp32, and return ``[dq, dk, dv, dg, dbeta, d_initial_state]``; ``d_initial_state`` exists only
when ``initial_state`` was given. ``dg`` is fp32 (shape of g); the others have their input's type.

``cu_seqlens`` values are data, not geometry: whether they are monotone and end at ``T`` is checked by the
engine at execute time, not here.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional

from .._layout import row_major_strides as _packed_stride
from ..data_type import DataType
from .schema import Attr, InferContext, OpSchema, Output, OutputInfo, Port, TensorInfo, register

__all__ = ["resolved_scale"]

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
    """T, H, K, V, N read off q, v and cu_seqlens after the basic checks."""

    def __init__(self, T: int, H: int, K: int, V: int, N: int):
        self.T, self.H, self.K, self.V, self.N = T, H, K, V, N


def _check_forward_inputs(ctx: InferContext, *, per_channel_gate: bool, per_channel_beta: bool,
                          write_gate: bool) -> _Shapes:
    q, k, v = ctx.need("q"), ctx.need("k"), ctx.need("v")
    if len(q.dim) != 3 or any(d <= 0 for d in q.dim):
        ctx.fail("q", f"must have rank 3 (T, H, K) with positive dims; got {list(q.dim)}")
    T, H, K = q.dim
    _check_type(ctx, "q", q, _IO_TYPES)
    _check_dims(ctx, "k", k, (T, H, K), "(T, H, K) like q")
    if len(v.dim) != 3 or tuple(v.dim[:2]) != (T, H) or v.dim[2] <= 0:
        ctx.fail("v", f"dims must be (T, H, V) with T={T}, H={H} (from q); got {list(v.dim)}")
    V = v.dim[2]
    for port, t in (("k", k), ("v", v)):
        if t.data_type != q.data_type:
            ctx.fail(port, f"data type {t.data_type.name} differs from q's {q.data_type.name}")

    g = ctx.need("g")
    g_dim, g_names = ((T, H, K), "(T, H, K)") if per_channel_gate else ((T, H), "(T, H)")
    _check_dims(ctx, "g", g, g_dim, g_names)
    _check_type(ctx, "g", g, (DataType.FLOAT,))
    beta = ctx.need("beta")
    b_dim, b_names = ((T, H, K), "(T, H, K)") if per_channel_beta else ((T, H), "(T, H)")
    _check_dims(ctx, "beta", beta, b_dim, b_names)
    _check_type(ctx, "beta", beta, _IO_TYPES)
    if write_gate:
        w = ctx.need("w")
        _check_dims(ctx, "w", w, (T, H, V), "(T, H, V)")
        _check_type(ctx, "w", w, _IO_TYPES)

    cu = ctx.need("cu_seqlens")
    if cu.data_type != DataType.INT32:
        ctx.fail("cu_seqlens", f"must be INT32; got {cu.data_type.name}")
    if len(cu.dim) != 1 or cu.dim[0] < 2:
        ctx.fail("cu_seqlens", f"must be 1-D with N + 1 >= 2 entries (sequence boundaries); got dims {list(cu.dim)}")
    N = cu.dim[0] - 1

    h0 = ctx.inputs.get("initial_state")
    if h0 is not None:
        if len(h0.dim) == 4 and h0.dim[0] != N and tuple(h0.dim[1:]) == (H, K, V):
            ctx.fail("initial_state", f"holds {h0.dim[0]} states but cu_seqlens describes N={N} sequences")
        _check_dims(ctx, "initial_state", h0, (N, H, K, V), "(N, H, K, V)")
        _check_type(ctx, "initial_state", h0, (DataType.FLOAT,))
    return _Shapes(T, H, K, V, N)


def _forward_infer(per_channel_gate: bool, per_channel_beta: bool, write_gate: bool):
    def infer(ctx: InferContext) -> dict:
        s = _check_forward_inputs(ctx, per_channel_gate=per_channel_gate, per_channel_beta=per_channel_beta,
                                  write_gate=write_gate)
        out = {"o": _out((s.T, s.H, s.V), ctx.inputs["v"].data_type)}
        if ctx.attrs.get("output_final_state"):
            out["final_state"] = _out((s.N, s.H, s.K, s.V), DataType.FLOAT)
        return out
    return infer


def _backward_infer(per_channel_gate: bool):
    def infer(ctx: InferContext) -> dict:
        s = _check_forward_inputs(ctx, per_channel_gate=per_channel_gate, per_channel_beta=False,
                                  write_gate=False)
        v = ctx.inputs["v"]
        d_o = ctx.need("dO")
        _check_dims(ctx, "dO", d_o, (s.T, s.H, s.V), "(T, H, V) like o")
        if d_o.data_type != v.data_type:
            ctx.fail("dO", f"data type {d_o.data_type.name} differs from v's {v.data_type.name}")
        dht = ctx.inputs.get("d_final_state")
        if dht is not None:
            _check_dims(ctx, "d_final_state", dht, (s.N, s.H, s.K, s.V), "(N, H, K, V)")
            _check_type(ctx, "d_final_state", dht, (DataType.FLOAT,))
        q, k, beta, g = ctx.inputs["q"], ctx.inputs["k"], ctx.inputs["beta"], ctx.inputs["g"]
        out = {
            "dq": _out(q.dim, q.data_type), "dk": _out(k.dim, k.data_type), "dv": _out(v.dim, v.data_type),
            "dg": _out(g.dim, DataType.FLOAT), "dbeta": _out(beta.dim, beta.data_type),
        }
        if ctx.inputs.get("initial_state") is not None:
            out["d_initial_state"] = _out((s.N, s.H, s.K, s.V), DataType.FLOAT)
        return out
    return infer


def _final_state_wanted(attrs, _given) -> bool:
    return bool(attrs.get("output_final_state"))


def _has_initial_state(_attrs, given) -> bool:
    return "initial_state" in given


_SCALE = Attr("scale", None, _to_opt_scale, "query scale; None means 1 / sqrt(K)")
_L2 = Attr("use_qk_l2norm", False, _to_bool, "L2-normalise q and k per token and head before use")
_FINAL = Attr("output_final_state", False, _to_bool, "also return each sequence's final state (N, H, K, V)")


def _forward_ports(g_doc: str, beta_doc: str, with_w: bool) -> tuple:
    ports = [Port("q", doc="(T, H, K)"), Port("k", doc="(T, H, K)"), Port("v", doc="(T, H, V)"),
             Port("g", doc=g_doc), Port("beta", doc=beta_doc)]
    if with_w:
        ports.append(Port("w", doc="(T, H, V) write gate on the value channels"))
    ports += [Port("cu_seqlens", doc="(N + 1,) INT32 sequence boundaries in T"),
              Port("initial_state", optional=True, doc="(N, H, K, V) FLOAT; zeros when absent")]
    return tuple(ports)


def _backward_ports(g_doc: str) -> tuple:
    return _forward_ports(g_doc, "(T, H)", False) + (
        Port("dO", doc="(T, H, V) gradient of o"),
        Port("d_final_state", optional=True, doc="(N, H, K, V) FLOAT gradient of final_state"),
    )


_FWD_OUTPUTS = (Output("o"), Output("final_state", _final_state_wanted))
_BWD_OUTPUTS = (Output("dq"), Output("dk"), Output("dv"), Output("dg"), Output("dbeta"),
                Output("d_initial_state", _has_initial_state))


def _fwd(name: str, doc: str, g_doc: str, beta_doc: str, *, per_channel_gate: bool, per_channel_beta: bool,
         with_w: bool) -> OpSchema:
    positional = ("q", "k", "v", "g", "beta") + (("w",) if with_w else ())
    return OpSchema(
        name=name, family="linear_attention", python_only=True, returns="list", doc=doc,
        inputs=_forward_ports(g_doc, beta_doc, with_w), outputs=_FWD_OUTPUTS,
        infer=_forward_infer(per_channel_gate, per_channel_beta, with_w),
        attrs=(_SCALE, _L2, _FINAL), positional=positional,
    )


def _bwd(name: str, doc: str, g_doc: str, *, per_channel_gate: bool) -> OpSchema:
    return OpSchema(
        name=name, family="linear_attention", python_only=True, returns="list", doc=doc,
        inputs=_backward_ports(g_doc), outputs=_BWD_OUTPUTS, infer=_backward_infer(per_channel_gate),
        attrs=(_SCALE, _L2), positional=("q", "k", "v", "g", "beta", "dO"),
    )


register(
    _fwd("gdn", "Gated delta net forward (one scalar decay per token and head); returns [o, final_state].",
         "(T, H) FLOAT log decay", "(T, H) write strength",
         per_channel_gate=False, per_channel_beta=False, with_w=False),
    _bwd("gdn_bwd", "Gated delta net backward; returns [dq, dk, dv, dg, dbeta, d_initial_state].",
         "(T, H) FLOAT log decay", per_channel_gate=False),
    _fwd("kda", "Kimi delta attention forward (per-key-channel decay); returns [o, final_state].",
         "(T, H, K) FLOAT log decay per key channel", "(T, H) write strength",
         per_channel_gate=True, per_channel_beta=False, with_w=False),
    _bwd("kda_bwd", "Kimi delta attention backward; returns [dq, dk, dv, dg, dbeta, d_initial_state].",
         "(T, H, K) FLOAT log decay per key channel", per_channel_gate=True),
    _fwd("gdn2", "Gated delta net 2 forward (per-channel decay and write strength, value write gate); "
                 "returns [o, final_state].",
         "(T, H, K) FLOAT log decay per key channel", "(T, H, K) write strength per key channel",
         per_channel_gate=True, per_channel_beta=True, with_w=True),
)
