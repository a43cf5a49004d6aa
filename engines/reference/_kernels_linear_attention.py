"""Reference (NumPy, CPU) kernels for the delta-rule linear-attention ops: ``gdn``, ``kda``, ``gdn2`` and the
backward ops ``gdn_bwd``, ``kda_bwd`` and ``gdn2_bwd``.

They are the numerical oracle for the chunked GPU engines, so they run the recurrence one token at a time,
per sequence (``cu_seqlens``), all heads at once, in float64, and cast to the output types the graph asks for.

Semantics (see ``cudnn_graph.ops._linear_attention``; issue 8). Per sequence and head the state ``S`` is
K x V, starting from ``initial_state`` or zeros; with ``use_qk_l2norm`` q_t and k_t are first divided by
their L2 norms (a zero vector stays zero); ``alpha_t = exp(g_t)``; ``scale`` multiplies the (normalised)
query, so it survives the normalisation::

    gdn:  S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T          g_t, beta_t scalars
    kda:  S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T    g_t in R^K, beta_t scalar
    gdn2: S_t = (I - k_t (beta_t * k_t)^T) Diag(alpha_t) S_{t-1} + k_t (w_t * v_t)^T   g_t, beta_t in R^K
    o_t = scale * S_t^T q_t

(k, q, v column vectors here.) All three are one update: ``D = Diag(alpha) S``, ``c = beta * k`` (beta
broadcast over K), ``x = beta * v`` (``w * v`` for gdn2), ``S_t = D + k (x - D^T c)^T``; a scalar decay
times (I - beta k k^T) commutes, so gdn is the kda update with alpha broadcast over K.

The backward ops are exact reverse-mode gradients of that recurrence (including the L2 normalisation).
To bound memory on long sequences the backward keeps a checkpoint of S every ``_CHECKPOINT`` tokens and
replays one block of states at a time from its checkpoint. Given the forward's ``state_checkpoints`` (every
``checkpoint_every_n_tokens`` tokens) it starts each block from those instead of running the recurrence
first, as the GPU engines do: the gradients are then those of the states as stored (rounded to their type).
``dg`` is the gradient with respect to the log gate ``g``
(``d alpha * alpha``); ``d_final_state`` (zeros when absent) seeds the gradient of each sequence's last
state, and ``d_initial_state`` is the gradient that reaches ``S_0``.

Grouped value heads (HV = G * H value heads, q and k with H): q and k are repeated G times along the head
axis (value head j reads query/key head j // G), the recurrence runs per value head, and dq / dk are the
sums of the repeated copies' gradients. The gate options (``cudnn_graph.ops._linear_attention``:
``safe_gate``, ``use_beta_sigmoid``) map the raw ``g`` / ``beta`` ports to the log decay and the write
strength first (``_GateInputs``); the backward carries the gradients back through those maps to the raw
inputs and to ``a_log`` / ``dt_bias``.

``cu_seqlens`` is data: it must start at 0, be non-decreasing and end at T, which is checked here (a
``ValueError`` at execute time). An empty sequence passes its initial state (and its gradient) through.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from cudnn_graph.ops._linear_attention import beta_transform, checkpoint_rows, gate_transform, resolved_scale

__all__ = ["KERNELS", "linear_attention_forward", "linear_attention_backward", "checkpoint_row_starts"]

_F = np.float64
_CHECKPOINT = 64


def _f64(x) -> Optional[np.ndarray]:
    return None if x is None else np.asarray(x).astype(_F)


def _bounds(cu_seqlens, total: int) -> list[tuple[int, int]]:
    cu = np.asarray(cu_seqlens).astype(np.int64).reshape(-1)
    if cu.size < 2 or cu[0] != 0 or cu[-1] != total or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={total}; got {cu.tolist()}")
    return [(int(cu[n]), int(cu[n + 1])) for n in range(cu.size - 1)]


def _vec_mat(x: np.ndarray, M: np.ndarray) -> np.ndarray:
    """x^T M per head: (H, K), (H, K, V) -> (H, V)."""
    return np.matmul(x[:, None, :], M)[:, 0, :]


def _mat_vec(M: np.ndarray, y: np.ndarray) -> np.ndarray:
    """M y per head: (H, K, V), (H, V) -> (H, K)."""
    return np.matmul(M, y[:, :, None])[:, :, 0]


def _l2norm(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x / ||x|| over the last axis, and the norm used (1 where ||x|| == 0: a zero vector stays zero)."""
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    norm = np.where(norm == 0.0, 1.0, norm)
    return x / norm, norm


def _l2norm_backward(xn: np.ndarray, norm: np.ndarray, dxn: np.ndarray) -> np.ndarray:
    return (dxn - xn * np.sum(xn * dxn, axis=-1, keepdims=True)) / norm


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


class _GateInputs:
    """The log decay ``g`` and the write strength ``beta`` the recurrence uses, from the ports as given
    (``gate_transform`` / ``beta_transform``), and the backward through those maps."""

    def __init__(self, op: str, inputs: Mapping[str, Any], attrs: Mapping[str, Any]):
        g_raw = _f64(inputs["g"])
        beta_raw = _f64(inputs["beta"])
        HV = g_raw.shape[1]
        self.form = gate_transform(op, attrs)
        self.beta_factor = beta_transform(attrs)
        if self.form == "none":
            self.g = g_raw
        else:
            a_log = inputs.get("a_log")
            a_log = np.zeros(HV) if a_log is None else _f64(a_log).reshape(HV)
            dt_bias = inputs.get("dt_bias")
            dt_bias = np.zeros(g_raw.shape[1:]) if dt_bias is None else _f64(dt_bias).reshape(g_raw.shape[1:])
            # a_log per head, broadcast over the key channels of a per-channel gate
            self.rate = np.exp(a_log).reshape((1, HV) + (1,) * (g_raw.ndim - 2))
            self.x = g_raw + dt_bias[None]
            if self.form == "softplus":
                self.g = -self.rate * np.logaddexp(0.0, self.x)
            else:
                self.lower_bound = float(attrs["gate_lower_bound"])
                self.z = self.rate * self.x
                self.g = self.lower_bound * _sigmoid(self.z)
        if self.beta_factor:
            self.beta_sig = _sigmoid(beta_raw)
            self.beta = self.beta_factor * self.beta_sig
        else:
            self.beta = beta_raw

    def backward(self, dg: np.ndarray, dbeta: np.ndarray) -> dict[str, np.ndarray]:
        """{dg, dbeta, d_a_log, d_dt_bias} of the raw inputs from the gradients of g and beta."""
        out = {}
        if self.form == "none":
            out["dg"] = dg
        else:
            if self.form == "softplus":
                dx = -dg * self.rate * _sigmoid(self.x)
                d_rate_log = dg * self.g                         # d(-e^a sp) / da = g
            else:
                s = _sigmoid(self.z)
                dz = dg * self.lower_bound * s * (1.0 - s)
                dx = dz * self.rate
                d_rate_log = dz * self.z                         # d(e^a x) / da = z
            out["dg"] = dx
            out["d_dt_bias"] = np.sum(dx, axis=0)
            out["d_a_log"] = np.sum(d_rate_log.reshape(d_rate_log.shape[0], d_rate_log.shape[1], -1), axis=(0, 2))
        if self.beta_factor:
            out["dbeta"] = dbeta * self.beta_factor * self.beta_sig * (1.0 - self.beta_sig)
        else:
            out["dbeta"] = dbeta
        return out


class _Problem:
    """Float64 copies of the inputs, q and k repeated to the value heads, broadcast to the per-channel form
    the update uses. ``H`` here counts value heads (the recurrence's heads); ``group`` value heads share one
    query/key head."""

    def __init__(self, op: str, inputs: Mapping[str, Any], attrs: Mapping[str, Any]):
        q, k, v = _f64(inputs["q"]), _f64(inputs["k"]), _f64(inputs["v"])
        self.T, self.HQ, self.K = q.shape
        self.H, self.V = v.shape[1], v.shape[2]
        if self.H % self.HQ:
            raise ValueError(f"v has {self.H} heads; a multiple of q's {self.HQ} was expected")
        self.group = self.H // self.HQ
        if self.group > 1:
            q, k = np.repeat(q, self.group, axis=1), np.repeat(k, self.group, axis=1)
        self.scale = resolved_scale(attrs, self.K)
        self.l2 = bool(attrs.get("use_qk_l2norm", False))
        if self.l2:
            self.qn, self.q_norm = _l2norm(q)
            self.kn, self.k_norm = _l2norm(k)
        else:
            self.qn, self.kn = q, k
        self.gates = _GateInputs(op, inputs, attrs)
        g = self.gates.g
        self.scalar_gate = g.ndim == 2
        self.alpha = np.broadcast_to(np.exp(g)[..., None] if self.scalar_gate else np.exp(g),
                                     (self.T, self.H, self.K))
        beta = self.gates.beta
        self.scalar_beta = beta.ndim == 2
        self.beta = np.broadcast_to(beta[..., None] if self.scalar_beta else beta, (self.T, self.H, self.K))
        self.v = v
        w = inputs.get("w")
        self.w = _f64(w)
        if self.w is None:
            if not self.scalar_beta:
                raise ValueError("a per-channel beta needs the write gate w (gdn2)")
            self.x = beta[..., None] * v           # beta v
        else:
            self.x = self.w * v                    # w * v
        self.c = self.beta * self.kn               # beta * k
        self.bounds = _bounds(inputs["cu_seqlens"], self.T)
        self.N = len(self.bounds)
        h0 = inputs.get("initial_state")
        self.h0 = _f64(h0) if h0 is not None else np.zeros((self.N, self.H, self.K, self.V), _F)

    def step(self, S: np.ndarray, t: int) -> np.ndarray:
        """S_t from S_{t-1} (all heads: S is H x K x V)."""
        D = self.alpha[t][:, :, None] * S
        u = _vec_mat(self.c[t], D)
        return D + self.kn[t][:, :, None] * (self.x[t] - u)[:, None, :]


    def group_sum(self, x: np.ndarray) -> np.ndarray:
        """A (T, HV, K) gradient of the repeated q or k, summed over each group: (T, H, K)."""
        if self.group == 1:
            return x
        return x.reshape(self.T, self.HQ, self.group, x.shape[2]).sum(axis=2)


def checkpoint_row_starts(bounds: list, every: int) -> list[int]:
    """The first ``state_checkpoints`` row of each sequence: ``ceil(len / every)`` rows a sequence, in order.

    Example:
        >>> checkpoint_row_starts([(0, 100), (100, 100), (100, 164)], 64)
        [0, 2, 2]
    """
    starts, row = [], 0
    for bos, eos in bounds:
        starts.append(row)
        row += -(-(eos - bos) // every)
    return starts


def linear_attention_forward(inputs: Mapping[str, Any], attrs: Mapping[str, Any],
                             op: str = "gdn") -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(o (T, HV, V), final_state (N, HV, K, V), state_checkpoints or None) in float64. ``op`` matters only for
    the gate transform (``gate_lower_bound`` is a kda / gdn2 attribute). With ``checkpoint_every_n_tokens=n``
    the checkpoints hold the state before tokens 0, n, 2n, ... of each sequence; rows no sequence reaches stay
    zero."""
    p = _Problem(op, inputs, attrs)
    every = int(attrs.get("checkpoint_every_n_tokens") or 0)
    o = np.zeros((p.T, p.H, p.V), _F)
    final = np.empty((p.N, p.H, p.K, p.V), _F)
    checkpoints = np.zeros((checkpoint_rows(p.T, p.N, every), p.H, p.K, p.V), _F) if every else None
    row_starts = checkpoint_row_starts(p.bounds, every) if every else None
    for n, (bos, eos) in enumerate(p.bounds):
        S = p.h0[n].copy()
        for t in range(bos, eos):
            if every and (t - bos) % every == 0:
                checkpoints[row_starts[n] + (t - bos) // every] = S
            S = p.step(S, t)
            o[t] = p.scale * _vec_mat(p.qn[t], S)
        final[n] = S
    return o, final, checkpoints


def linear_attention_backward(inputs: Mapping[str, Any], attrs: Mapping[str, Any],
                              op: str = "gdn_bwd") -> dict[str, np.ndarray]:
    """Float64 gradients: dq, dk, dv, dg, dbeta, d_initial_state (and dw when w is given; d_a_log and
    d_dt_bias with safe_gate)."""
    p = _Problem(op, inputs, attrs)
    d_o = _f64(inputs["dO"])
    dht = inputs.get("d_final_state")
    dht = _f64(dht) if dht is not None else np.zeros((p.N, p.H, p.K, p.V), _F)
    dqn = np.zeros((p.T, p.H, p.K), _F)
    dkn = np.zeros((p.T, p.H, p.K), _F)
    dx = np.zeros((p.T, p.H, p.V), _F)
    dc = np.zeros((p.T, p.H, p.K), _F)
    dalpha = np.zeros((p.T, p.H, p.K), _F)
    dh0 = np.empty((p.N, p.H, p.K, p.V), _F)

    given = inputs.get("state_checkpoints")
    every = int(attrs.get("checkpoint_every_n_tokens") or 0) if given is not None else 0
    if every:
        given = _f64(given)
        row_starts = checkpoint_row_starts(p.bounds, every)
    block = every or _CHECKPOINT
    for n, (bos, eos) in enumerate(p.bounds):
        # Checkpoints: the state before token t for t = bos, bos + block, ... (the forward's, where given)
        checkpoints = {}
        if every:
            for j, t in enumerate(range(bos, eos, every)):
                checkpoints[t] = given[row_starts[n] + j]
        else:
            S = p.h0[n].copy()
            for t in range(bos, eos):
                if (t - bos) % block == 0:
                    checkpoints[t] = S
                S = p.step(S, t)
        dS = dht[n].copy()                         # gradient w.r.t. the state after the last token
        for start in sorted(checkpoints, reverse=True):
            stop = min(start + block, eos)
            states = [checkpoints[start]]          # states[i] = S before token start + i
            for t in range(start, stop - 1):
                states.append(p.step(states[-1], t))
            for t in range(stop - 1, start - 1, -1):
                prev = states[t - start]
                D = p.alpha[t][:, :, None] * prev
                u = _vec_mat(p.c[t], D)
                S_t = D + p.kn[t][:, :, None] * (p.x[t] - u)[:, None, :]
                # o_t = scale * S_t^T qn_t
                dqn[t] = p.scale * _mat_vec(S_t, d_o[t])
                dS = dS + p.scale * p.qn[t][:, :, None] * d_o[t][:, None, :]
                # S_t = D + kn (x - D^T c)^T
                dS_k = _vec_mat(p.kn[t], dS)            # dS^T kn
                dx[t] = dS_k
                dkn[t] = _mat_vec(dS, p.x[t] - u)
                dc[t] = -_mat_vec(D, dS_k)
                dD = dS - p.c[t][:, :, None] * dS_k[:, None, :]
                dalpha[t] = np.sum(dD * prev, axis=2)
                dS = p.alpha[t][:, :, None] * dD
        dh0[n] = dS

    # c = beta * kn, x = beta * v (or w * v), alpha = exp(g)
    dkn = dkn + p.beta * dc
    dbeta_vec = p.kn * dc
    out = {}
    if p.w is None:
        dv = p.beta[..., :1] * dx
        dbeta = np.sum(dbeta_vec, axis=-1) + np.sum(p.v * dx, axis=-1)
    else:
        dv = p.w * dx
        out["dw"] = p.v * dx
        dbeta = np.sum(dbeta_vec, axis=-1) if p.scalar_beta else dbeta_vec
    dg = dalpha * p.alpha
    if p.scalar_gate:
        dg = np.sum(dg, axis=-1)
    if p.l2:
        dq = _l2norm_backward(p.qn, p.q_norm, dqn)
        dk = _l2norm_backward(p.kn, p.k_norm, dkn)
    else:
        dq, dk = dqn, dkn
    out.update(dq=p.group_sum(dq), dk=p.group_sum(dk), dv=dv, d_initial_state=dh0)
    out.update(p.gates.backward(dg, dbeta))
    return out


def keeps_no_chunk_cache(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
    """A gdn / kda forward asked for its chunk_cache (the GPU kernels' per-chunk factors, in their layout) is not run
    here: the float64 recurrence forms no such factors. A backward given one ignores it (it forms nothing it
    could skip)."""
    if attrs.get("chunk_cache") is not None:
        raise NotImplementedError("the reference engine writes no chunk_cache (the GPU kernels' per-chunk "
                                  "factors); build the forward without it, and its backward forms them again")


def _forward_kernel(op: str):
    def kernel(inputs, attrs, outputs, compute_dtype=np.float32):
        o, final, checkpoints = linear_attention_forward(inputs, attrs, op)
        result = {"o": o}
        if "final_state" in outputs:
            result["final_state"] = final
        if "state_checkpoints" in outputs:
            result["state_checkpoints"] = checkpoints
        return result
    kernel.__name__ = f"{op}_forward_kernel"
    return kernel


def _backward_kernel(op: str):
    def kernel(inputs, attrs, outputs, compute_dtype=np.float32):
        grads = linear_attention_backward(inputs, attrs, op)
        return {name: grads[name] for name in outputs}
    kernel.__name__ = f"{op}_kernel"
    return kernel


KERNELS = {op: _forward_kernel(op) for op in ("gdn", "kda", "gdn2")}
KERNELS.update({op: _backward_kernel(op) for op in ("gdn_bwd", "kda_bwd", "gdn2_bwd")})
