"""Reference kernels of the linear-attention ops with grouped value heads, the gate options and gdn2_bwd.

The forward is checked against a per-token, per-value-head loop written here (q and k indexed by
``j // (HV // H)``, the gate and beta transforms applied per scalar with ``math``), on uneven cu_seqlens;
the backward (gdn_bwd, kda_bwd, gdn2_bwd, every gradient including d_a_log and d_dt_bias) against central
finite differences of the reference forward in float64, and gdn2_bwd also against an independent
token-by-token backward written here with explicit K x K transition matrices.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from _helpers import package_is_built, reference_linear_attention_kernels

HAVE_PACKAGE = package_is_built()
LA = reference_linear_attention_kernels("_test_kernels_linear_attention_gva")
KERNELS = LA.KERNELS
UNEVEN = [0, 5, 6, 9]            # lengths 5, 1, 3


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _softplus(x):
    return math.log1p(math.exp(x)) if x < 30 else x


def make_inputs(op, cu, H=1, HV=2, K=3, V=2, seed=0, with_h0=True, safe_gate=False, beta_logits=False):
    rng = np.random.default_rng(seed)
    T, N = cu[-1], len(cu) - 1
    fwd = op.removesuffix("_bwd")
    per_channel = fwd in ("kda", "gdn2")
    g_shape = (T, HV, K) if per_channel else (T, HV)
    d = {"q": rng.standard_normal((T, H, K)), "k": rng.standard_normal((T, H, K)) / math.sqrt(K),
         "v": rng.standard_normal((T, HV, V)), "cu_seqlens": np.array(cu, np.int32)}
    d["g"] = rng.uniform(-1.5, 1.0, g_shape) if safe_gate else -rng.uniform(0.05, 0.7, g_shape)
    b_shape = (T, HV, K) if fwd == "gdn2" else (T, HV)
    d["beta"] = rng.uniform(-1.5, 1.5, b_shape) if beta_logits else rng.uniform(0.2, 0.9, b_shape)
    if fwd == "gdn2":
        d["w"] = rng.uniform(0.2, 1.2, (T, HV, V))
    if with_h0:
        d["initial_state"] = rng.standard_normal((N, HV, K, V))
    if safe_gate:
        d["a_log"] = rng.uniform(-1.0, 0.5, (HV,))
        d["dt_bias"] = rng.uniform(-0.5, 0.5, (HV, K) if per_channel else (HV,))
    return d


# --------------------------------------------------------------------- independent per-token loop

def loop_forward(op, d, attrs):
    """o (T, HV, V), final (N, HV, K, V): one token and one value head at a time, scalars through math."""
    q, k, v, g, beta, cu = d["q"], d["k"], d["v"], d["g"], d["beta"], list(d["cu_seqlens"])
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    group = HV // H
    scale = attrs.get("scale") or 1.0 / math.sqrt(K)
    lb = attrs.get("gate_lower_bound")
    beta_factor = (2.0 if attrs.get("allow_neg_eigval") else 1.0) if attrs.get("use_beta_sigmoid") else 0.0
    h0 = d.get("initial_state")

    def log_decay(t, j, c):
        raw = float(g[t, j] if g.ndim == 2 else g[t, j, c])
        if not attrs.get("safe_gate"):
            return raw
        a = float(d["a_log"][j]) if d.get("a_log") is not None else 0.0
        bias = d.get("dt_bias")
        b = 0.0 if bias is None else float(bias[j] if bias.ndim == 1 else bias[j, c])
        if lb is None:
            return -math.exp(a) * _softplus(raw + b)
        return lb * _sigmoid(math.exp(a) * (raw + b))

    def strength(x):
        return beta_factor * _sigmoid(float(x)) if beta_factor else float(x)

    o = np.zeros((T, HV, V))
    final = np.zeros((len(cu) - 1, HV, K, V))
    for n in range(len(cu) - 1):
        for j in range(HV):
            i = j // group
            S = np.zeros((K, V)) if h0 is None else np.array(h0[n, j], np.float64)
            for t in range(cu[n], cu[n + 1]):
                qt, kt = np.array(q[t, i], np.float64), np.array(k[t, i], np.float64)
                if attrs.get("use_qk_l2norm"):
                    qt, kt = qt / np.linalg.norm(qt), kt / np.linalg.norm(kt)
                alpha = np.diag([math.exp(log_decay(t, j, c)) for c in range(K)])
                if op == "gdn2":
                    bvec = np.array([strength(beta[t, j, c]) for c in range(K)])
                    write = np.array(d["w"][t, j], np.float64) * v[t, j]
                else:
                    bvec = np.full(K, strength(beta[t, j]))
                    write = bvec[0] * v[t, j]
                A = (np.eye(K) - np.outer(kt, bvec * kt)) @ alpha
                S = A @ S + np.outer(kt, write)
                o[t, j] = scale * (qt @ S)
            final[n, j] = S
    return o, final


def run_forward(op, d, attrs):
    return KERNELS[op](d, dict(attrs, output_final_state=True), {"o": None, "final_state": None}, np.float64)


FORWARD_ATTRS = {
    "plain": {},
    "l2": {"use_qk_l2norm": True},
    "gates": {"safe_gate": True, "use_beta_sigmoid": True},
    "gates_neg_eig_l2": {"safe_gate": True, "use_beta_sigmoid": True, "allow_neg_eigval": True,
                         "use_qk_l2norm": True},
    "bounded_gate": {"safe_gate": True, "gate_lower_bound": -4.0},
}


@pytest.mark.parametrize("op, case", [(op, case) for op in ("gdn", "kda", "gdn2") for case in sorted(FORWARD_ATTRS)
                                      if op != "gdn" or case != "bounded_gate"])   # a kda / gdn2 attribute
@pytest.mark.parametrize("H, HV", [(1, 2), (2, 6)])
def test_forward_with_grouped_value_heads_matches_the_loop(op, case, H, HV):
    attrs = FORWARD_ATTRS[case]
    d = make_inputs(op, UNEVEN, H=H, HV=HV, K=4, V=3, seed=H * 10 + HV, safe_gate=attrs.get("safe_gate", False),
                    beta_logits=attrs.get("use_beta_sigmoid", False))
    out = run_forward(op, d, attrs)
    o_ref, final_ref = loop_forward(op, d, attrs)
    assert out["o"].shape == (9, HV, 3) and out["final_state"].shape == (3, HV, 4, 3)
    np.testing.assert_allclose(out["o"], o_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(out["final_state"], final_ref, rtol=1e-11, atol=1e-12)


def test_absent_a_log_and_dt_bias_are_zeros():
    d = make_inputs("kda", UNEVEN, seed=3, safe_gate=True)
    zeros = dict(d, a_log=np.zeros_like(d["a_log"]), dt_bias=np.zeros_like(d["dt_bias"]))
    without = {key: val for key, val in d.items() if key not in ("a_log", "dt_bias")}
    attrs = {"safe_gate": True}
    np.testing.assert_array_equal(run_forward("kda", without, attrs)["o"], run_forward("kda", zeros, attrs)["o"])


def test_a_group_of_identical_value_heads_equals_the_ungrouped_op():
    # HV = 2 H with both value heads of a group fed the same v, g, beta: each equals the H-head result.
    d1 = make_inputs("gdn", UNEVEN, H=2, HV=2, seed=4)
    d2 = {key: (np.repeat(val, 2, axis=1) if key in ("v", "g", "beta", "initial_state") else val)
          for key, val in d1.items()}
    o1 = run_forward("gdn", d1, {})["o"]
    o2 = run_forward("gdn", d2, {})["o"]
    np.testing.assert_allclose(o2[:, 0::2], o1, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(o2[:, 1::2], o1, rtol=1e-13, atol=1e-14)


# ------------------------------------------------------------------------ backward: finite differences

GRAD_PORTS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "dw": "w",
              "d_initial_state": "initial_state", "d_a_log": "a_log", "d_dt_bias": "dt_bias"}


def _loss(fwd, d, attrs, d_o, dht):
    out = run_forward(fwd, d, attrs)
    return float(np.sum(out["o"] * d_o) + np.sum(out["final_state"] * dht))


def _finite_difference(fwd, d, attrs, d_o, dht, port, eps=1e-6):
    base = d[port]
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += eps
        minus[idx] -= eps
        grad[idx] = (_loss(fwd, dict(d, **{port: plus}), attrs, d_o, dht)
                     - _loss(fwd, dict(d, **{port: minus}), attrs, d_o, dht)) / (2 * eps)
    return grad


def _backward(op, d, attrs, d_o, dht):
    outputs = {name: None for name, port in GRAD_PORTS.items() if d.get(port) is not None}
    return KERNELS[op](dict(d, dO=d_o, d_final_state=dht), attrs, outputs, np.float64)


BWD_CASES = [
    # (op, attrs, H, HV, cu)
    ("gdn_bwd", {}, 1, 2, UNEVEN),
    ("gdn_bwd", {"safe_gate": True, "use_beta_sigmoid": True, "use_qk_l2norm": True}, 1, 3, UNEVEN),
    ("kda_bwd", {"safe_gate": True, "use_beta_sigmoid": True, "allow_neg_eigval": True}, 1, 2, [0, 4, 6]),
    ("kda_bwd", {"safe_gate": True, "gate_lower_bound": -3.0, "use_qk_l2norm": True}, 1, 2, [0, 1, 5]),
    ("gdn2_bwd", {}, 1, 1, UNEVEN),
    ("gdn2_bwd", {"use_qk_l2norm": True}, 1, 2, [0, 3, 3, 6]),
    ("gdn2_bwd", {"safe_gate": True, "use_beta_sigmoid": True}, 1, 2, [0, 4, 6]),
    ("gdn2_bwd", {"safe_gate": True, "gate_lower_bound": -2.0, "use_beta_sigmoid": True,
                  "allow_neg_eigval": True}, 1, 2, [0, 2, 5]),
]


@pytest.mark.parametrize("op, attrs, H, HV, cu", BWD_CASES,
                         ids=[f"{c[0]}-{'-'.join(c[1]) or 'plain'}-HV{c[3]}" for c in BWD_CASES])
def test_backward_matches_finite_differences(op, attrs, H, HV, cu):
    fwd = op.removesuffix("_bwd")
    d = make_inputs(op, cu, H=H, HV=HV, K=3, V=2, seed=len(cu) + HV, safe_gate=attrs.get("safe_gate", False),
                    beta_logits=attrs.get("use_beta_sigmoid", False))
    rng = np.random.default_rng(77)
    d_o = rng.standard_normal(d["v"].shape)
    dht = rng.standard_normal(d["initial_state"].shape)
    grads = _backward(op, d, attrs, d_o, dht)
    assert ("dw" in grads) == (op == "gdn2_bwd")
    for name, value in grads.items():
        port = GRAD_PORTS[name]
        fd = _finite_difference(fwd, d, attrs, d_o, dht, port)
        assert value.shape == d[port].shape, name
        np.testing.assert_allclose(value, fd, rtol=1e-6, atol=1e-7, err_msg=name)


# ------------------------------------------------- gdn2_bwd against an independent explicit backward

def explicit_gdn2_backward(d, d_o, dht, scale=None):
    """gdn2's gradients token by token with the K x K transitions A_t = (I - k_t c_t^T) Diag(alpha_t),
    c_t = beta_t * k_t, S_t = A_t S_{t-1} + k_t x_t^T, x_t = w_t * v_t, o_t = scale S_t^T q_t (no options)."""
    q, k, v, g, beta, w, cu = d["q"], d["k"], d["v"], d["g"], d["beta"], d["w"], list(d["cu_seqlens"])
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    group = HV // H
    scale = scale or 1.0 / math.sqrt(K)
    grads = {"dq": np.zeros(q.shape), "dk": np.zeros(k.shape), "dv": np.zeros(v.shape), "dg": np.zeros(g.shape),
             "dbeta": np.zeros(beta.shape), "dw": np.zeros(w.shape), "d_initial_state": np.zeros(dht.shape)}
    eye = np.eye(K)
    for n in range(len(cu) - 1):
        for j in range(HV):
            i = j // group
            states = [np.array(d["initial_state"][n, j], np.float64)]
            for t in range(cu[n], cu[n + 1]):
                c = beta[t, j] * k[t, i]
                A = (eye - np.outer(k[t, i], c)) @ np.diag(np.exp(g[t, j]))
                states.append(A @ states[-1] + np.outer(k[t, i], w[t, j] * v[t, j]))
            dS = np.array(dht[n, j], np.float64)
            for t in range(cu[n + 1] - 1, cu[n] - 1, -1):
                S_prev, S_t = states[t - cu[n]], states[t - cu[n] + 1]
                grads["dq"][t, i] += scale * S_t @ d_o[t, j]
                dS = dS + scale * np.outer(q[t, i], d_o[t, j])
                alpha = np.exp(g[t, j])
                c = beta[t, j] * k[t, i]
                M = eye - np.outer(k[t, i], c)
                x = w[t, j] * v[t, j]
                dA = dS @ S_prev.T
                dM = dA * alpha[None, :]                   # dA Diag(alpha)
                dalpha = np.diag(M.T @ dA)
                dk = -dM @ c + dS @ x
                dc = -dM.T @ k[t, i]
                dx = dS.T @ k[t, i]
                grads["dk"][t, i] += dk + beta[t, j] * dc
                grads["dbeta"][t, j] = k[t, i] * dc
                grads["dv"][t, j] = w[t, j] * dx
                grads["dw"][t, j] = v[t, j] * dx
                grads["dg"][t, j] = dalpha * alpha
                dS = (M @ np.diag(alpha)).T @ dS
            grads["d_initial_state"][n, j] = dS
    return grads


@pytest.mark.parametrize("H, HV, cu", [(1, 1, [0, 7]), (2, 2, UNEVEN), (1, 3, [0, 3, 3, 8]), (2, 4, [0, 1, 70, 71])])
def test_gdn2_backward_matches_an_explicit_matrix_backward(H, HV, cu):
    d = make_inputs("gdn2_bwd", cu, H=H, HV=HV, K=4, V=3, seed=HV + len(cu))
    rng = np.random.default_rng(5)
    d_o = rng.standard_normal(d["v"].shape)
    dht = rng.standard_normal(d["initial_state"].shape)
    got = _backward("gdn2_bwd", d, {}, d_o, dht)
    want = explicit_gdn2_backward(d, d_o, dht)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-11, err_msg=name)


# ------------------------------------------------------------------------------- through a host graph

@pytest.mark.skipif(not HAVE_PACKAGE, reason="cudnn_graph's compiled modules are not built")
def test_graph_gdn2_bwd_with_grouped_heads_and_gate_options_on_the_host():
    import cudnn_graph as cudnn
    F = cudnn.data_type
    cu = [0, 4, 5, 9]
    d = make_inputs("gdn2_bwd", cu, H=1, HV=2, K=4, V=3, seed=21, safe_gate=True, beta_logits=True)
    rng = np.random.default_rng(22)
    host = {key: (val.astype(np.float32) if key != "cu_seqlens" else val) for key, val in d.items()}
    host["dO"] = rng.standard_normal(d["v"].shape).astype(np.float32)
    host["d_final_state"] = rng.standard_normal(d["initial_state"].shape).astype(np.float32)
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    t = {name: g.tensor(name=name, dim=list(arr.shape), stride=[s // arr.itemsize for s in arr.strides],
                        data_type=F.INT32 if name == "cu_seqlens" else F.FLOAT) for name, arr in host.items()}
    outs = g.gdn2_bwd(t["q"], t["k"], t["v"], t["g"], t["beta"], t["w"], t["dO"], cu_seqlens=t["cu_seqlens"],
                      initial_state=t["initial_state"], d_final_state=t["d_final_state"], a_log=t["a_log"],
                      dt_bias=t["dt_bias"], safe_gate=True, use_beta_sigmoid=True)
    names = ["dq", "dk", "dv", "dg", "dbeta", "dw", "d_initial_state", "d_a_log", "d_dt_bias"]
    assert len(outs) == len(names) and all(x is not None for x in outs)
    bufs = {}
    for name, x in zip(names, outs):
        x.set_output(True)
        bufs[name] = np.zeros(x.dim, np.float32)
    g.build()
    assert g.selected_plan.label == "reference"
    pack = {t[name]: arr for name, arr in host.items()}
    pack.update({x: bufs[name] for name, x in zip(names, outs)})
    g.execute(pack)
    wide = {key: (np.asarray(val, np.float64) if key != "cu_seqlens" else val) for key, val in host.items()}
    want = KERNELS["gdn2_bwd"](wide, {"safe_gate": True, "use_beta_sigmoid": True}, dict.fromkeys(names),
                               np.float64)
    for name in names:
        np.testing.assert_allclose(bufs[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
