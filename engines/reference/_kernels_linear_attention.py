"""Reference (NumPy, CPU) kernels for the delta-rule linear-attention ops: ``gdn``, ``kda``, ``gdn2`` and the
backward ops ``gdn_bwd`` and ``kda_bwd``.

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
Nothing from the forward is given: the states are recomputed. To bound memory on long sequences the
forward keeps a checkpoint of S every ``_CHECKPOINT`` tokens and the backward replays one block of states
at a time from its checkpoint. ``dg`` is the gradient with respect to the log gate ``g``
(``d alpha * alpha``); ``d_final_state`` (zeros when absent) seeds the gradient of each sequence's last
state, and ``d_initial_state`` is the gradient that reaches ``S_0``.

``cu_seqlens`` is data: it must start at 0, be non-decreasing and end at T, which is checked here (a
``ValueError`` at execute time). An empty sequence passes its initial state (and its gradient) through.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from cudnn_graph.ops._linear_attention import resolved_scale

__all__ = ["KERNELS", "linear_attention_forward", "linear_attention_backward"]

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


class _Problem:
    """Float64 copies of the inputs, broadcast to the per-channel form the update uses."""

    def __init__(self, inputs: Mapping[str, Any], attrs: Mapping[str, Any]):
        q, k, v = _f64(inputs["q"]), _f64(inputs["k"]), _f64(inputs["v"])
        self.T, self.H, self.K = q.shape
        self.V = v.shape[2]
        self.scale = resolved_scale(attrs, self.K)
        self.l2 = bool(attrs.get("use_qk_l2norm", False))
        if self.l2:
            self.qn, self.q_norm = _l2norm(q)
            self.kn, self.k_norm = _l2norm(k)
        else:
            self.qn, self.kn = q, k
        g = _f64(inputs["g"])
        self.scalar_gate = g.ndim == 2
        self.alpha = np.broadcast_to(np.exp(g)[..., None] if self.scalar_gate else np.exp(g),
                                     (self.T, self.H, self.K))
        beta = _f64(inputs["beta"])
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


def linear_attention_forward(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(o (T, H, V), final_state (N, H, K, V)) in float64."""
    p = _Problem(inputs, attrs)
    o = np.zeros((p.T, p.H, p.V), _F)
    final = np.empty((p.N, p.H, p.K, p.V), _F)
    for n, (bos, eos) in enumerate(p.bounds):
        S = p.h0[n].copy()
        for t in range(bos, eos):
            S = p.step(S, t)
            o[t] = p.scale * _vec_mat(p.qn[t], S)
        final[n] = S
    return o, final


def linear_attention_backward(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Float64 gradients: dq, dk, dv, dg, dbeta, d_initial_state (and dw when w is given)."""
    p = _Problem(inputs, attrs)
    d_o = _f64(inputs["dO"])
    dht = inputs.get("d_final_state")
    dht = _f64(dht) if dht is not None else np.zeros((p.N, p.H, p.K, p.V), _F)
    dqn = np.zeros((p.T, p.H, p.K), _F)
    dkn = np.zeros((p.T, p.H, p.K), _F)
    dx = np.zeros((p.T, p.H, p.V), _F)
    dc = np.zeros((p.T, p.H, p.K), _F)
    dalpha = np.zeros((p.T, p.H, p.K), _F)
    dh0 = np.empty((p.N, p.H, p.K, p.V), _F)

    for n, (bos, eos) in enumerate(p.bounds):
        # Checkpoints: the state before token t for t = bos, bos + C, ...
        checkpoints = {}
        S = p.h0[n].copy()
        for t in range(bos, eos):
            if (t - bos) % _CHECKPOINT == 0:
                checkpoints[t] = S
            S = p.step(S, t)
        dS = dht[n].copy()                         # gradient w.r.t. the state after the last token
        for start in sorted(checkpoints, reverse=True):
            stop = min(start + _CHECKPOINT, eos)
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
    out.update(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta, d_initial_state=dh0)
    return out


def linear_attention_forward_kernel(inputs, attrs, outputs, compute_dtype=np.float32):
    o, final = linear_attention_forward(inputs, attrs)
    result = {"o": o}
    if "final_state" in outputs:
        result["final_state"] = final
    return result


def linear_attention_backward_kernel(inputs, attrs, outputs, compute_dtype=np.float32):
    grads = linear_attention_backward(inputs, attrs)
    return {name: grads[name] for name in outputs}


KERNELS = {
    "gdn": linear_attention_forward_kernel,
    "kda": linear_attention_forward_kernel,
    "gdn2": linear_attention_forward_kernel,
    "gdn_bwd": linear_attention_backward_kernel,
    "kda_bwd": linear_attention_backward_kernel,
}
