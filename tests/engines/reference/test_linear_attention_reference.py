"""Reference kernels of the linear-attention ops (gdn, kda, gdn2 and the gdn_bwd / kda_bwd backward).

The forward kernels are checked against a per-token, per-head loop written here from the issue's matrix
formulas (explicit K x K transition matrices built with numpy.outer and numpy.diag, one matrix product per
token), the backward kernels against central finite differences of the forward in float64, and both again
end to end through a host graph (pygraph on the CPU, executed with NumPy buffers).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from _helpers import host_address, package_is_built, reference_linear_attention_kernels

HAVE_PACKAGE = package_is_built()
LA = reference_linear_attention_kernels("_test_kernels_linear_attention")
KERNELS = LA.KERNELS

# cu_seqlens cases: N=1, N=3 with uneven lengths, a length-1 sequence, sequences shorter than a chunk.
SEQLENS = {
    "one": [0, 7],
    "uneven3": [0, 5, 6, 9],        # lengths 5, 1, 3
    "short3": [0, 3, 4, 11],        # lengths 3, 1, 7
    "single": [0, 1],
}


# ------------------------------------------------------------------------- independent per-token loop

def loop_forward(op, q, k, v, g, beta, cu, w=None, h0=None, scale=None, l2=False):
    """o (T, H, V) and the final states (N, H, K, V), one token and one head at a time."""
    T, H, K = q.shape
    V = v.shape[2]
    N = len(cu) - 1
    if scale is None:
        scale = 1.0 / math.sqrt(K)
    o = np.zeros((T, H, V))
    final = np.zeros((N, H, K, V))
    eye = np.eye(K)
    for n in range(N):
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else np.array(h0[n, h], dtype=np.float64)
            for t in range(cu[n], cu[n + 1]):
                qt = np.array(q[t, h], dtype=np.float64)
                kt = np.array(k[t, h], dtype=np.float64)
                vt = np.array(v[t, h], dtype=np.float64)
                if l2:
                    qt = qt / np.linalg.norm(qt)
                    kt = kt / np.linalg.norm(kt)
                if op == "gdn":
                    a, b = math.exp(float(g[t, h])), float(beta[t, h])
                    A = a * (eye - b * np.outer(kt, kt))
                    S = A @ S + b * np.outer(kt, vt)
                elif op == "kda":
                    b = float(beta[t, h])
                    A = (eye - b * np.outer(kt, kt)) @ np.diag(np.exp(np.array(g[t, h], np.float64)))
                    S = A @ S + b * np.outer(kt, vt)
                elif op == "gdn2":
                    bt = np.array(beta[t, h], np.float64)
                    wt = np.array(w[t, h], np.float64)
                    A = (eye - np.outer(kt, bt * kt)) @ np.diag(np.exp(np.array(g[t, h], np.float64)))
                    S = A @ S + np.outer(kt, wt * vt)
                else:
                    raise AssertionError(op)
                o[t, h] = scale * (qt @ S)
            final[n, h] = S
    return o, final


def make_inputs(op, cu, H=2, K=5, V=4, seed=0, with_h0=False):
    rng = np.random.default_rng(seed)
    T = cu[-1]
    N = len(cu) - 1
    per_channel = op in ("kda", "kda_bwd", "gdn2")
    d = {
        "q": rng.standard_normal((T, H, K)),
        "k": rng.standard_normal((T, H, K)) / math.sqrt(K),
        "v": rng.standard_normal((T, H, V)),
        "g": -rng.uniform(0.05, 0.7, (T, H, K) if per_channel else (T, H)),
        "beta": rng.uniform(0.2, 0.9, (T, H, K) if op == "gdn2" else (T, H)),
        "cu_seqlens": np.array(cu, np.int32),
        "initial_state": rng.standard_normal((N, H, K, V)) if with_h0 else None,
    }
    if op == "gdn2":
        d["w"] = rng.uniform(0.2, 1.2, (T, H, V))
    return d


def run_forward(op, d, attrs):
    T, H, K = d["q"].shape
    N, V = len(d["cu_seqlens"]) - 1, d["v"].shape[2]
    outputs = {"o": ((T, H, V), np.float64)}
    if attrs.get("output_final_state"):
        outputs["final_state"] = ((N, H, K, V), np.float32)
    return KERNELS[op](d, attrs, outputs, np.float32)


def attrs_of(scale=None, l2=False, final=True):
    return {"scale": scale, "use_qk_l2norm": l2, "output_final_state": final}


# ------------------------------------------------------------------------------------- forward tests

@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("seqlens", sorted(SEQLENS))
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("l2", [False, True])
def test_forward_matches_loop(op, seqlens, with_h0, l2):
    cu = SEQLENS[seqlens]
    K, V = (4, 8) if seqlens in ("one", "single") else (8, 5)
    d = make_inputs(op, cu, K=K, V=V, seed=len(cu) * 7 + K, with_h0=with_h0)
    out = run_forward(op, d, attrs_of(l2=l2))
    o_ref, final_ref = loop_forward(op, d["q"], d["k"], d["v"], d["g"], d["beta"], cu, w=d.get("w"),
                                    h0=d["initial_state"], l2=l2)
    np.testing.assert_allclose(out["o"], o_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(out["final_state"], final_ref, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_forward_without_final_state_and_custom_scale(op):
    cu = SEQLENS["uneven3"]
    d = make_inputs(op, cu, K=6, V=6, seed=3, with_h0=True)
    out = run_forward(op, d, attrs_of(scale=0.3, final=False))
    assert set(out) == {"o"}
    o_ref, _ = loop_forward(op, d["q"], d["k"], d["v"], d["g"], d["beta"], cu, w=d.get("w"),
                            h0=d["initial_state"], scale=0.3)
    np.testing.assert_allclose(out["o"], o_ref, rtol=1e-11, atol=1e-12)


def test_scale_applies_after_l2norm():
    # With use_qk_l2norm the scale multiplies the normalised query: doubling q changes nothing,
    # doubling scale doubles o.
    cu = SEQLENS["one"]
    d = make_inputs("gdn", cu, seed=4)
    a = run_forward("gdn", d, attrs_of(scale=0.5, l2=True))["o"]
    b = run_forward("gdn", dict(d, q=2 * d["q"], k=3 * d["k"]), attrs_of(scale=0.5, l2=True))["o"]
    c = run_forward("gdn", d, attrs_of(scale=1.0, l2=True))["o"]
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(c, 2 * a, rtol=1e-12, atol=1e-14)


def test_gdn_equals_kda_with_a_gate_shared_by_all_channels():
    cu = SEQLENS["short3"]
    d = make_inputs("gdn", cu, seed=5, with_h0=True)
    K = d["q"].shape[2]
    dk = dict(d, g=np.repeat(d["g"][..., None], K, axis=2))
    np.testing.assert_allclose(run_forward("gdn", d, attrs_of())["o"], run_forward("kda", dk, attrs_of())["o"],
                               rtol=1e-12, atol=1e-13)


def test_empty_sequence_passes_initial_state_through():
    cu = [0, 3, 3, 5]
    d = make_inputs("kda", cu, seed=6, with_h0=True)
    out = run_forward("kda", d, attrs_of())
    np.testing.assert_array_equal(out["final_state"][1], d["initial_state"][1])
    o_ref, final_ref = loop_forward("kda", d["q"], d["k"], d["v"], d["g"], d["beta"], cu, h0=d["initial_state"])
    np.testing.assert_allclose(out["o"], o_ref, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("cu", [[1, 5], [0, 4], [0, 3, 2, 5], [0, 6]])
def test_bad_cu_seqlens_raise(cu):
    d = make_inputs("gdn", [0, 5], seed=7)
    d["cu_seqlens"] = np.array(cu, np.int32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        run_forward("gdn", d, attrs_of())


def test_low_precision_inputs_are_widened():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    cu = SEQLENS["uneven3"]
    d = make_inputs("gdn", cu, seed=8)
    low = {key: (val.astype(ml_dtypes.bfloat16) if key in ("q", "k", "v", "beta") else val)
           for key, val in d.items()}
    out = run_forward("gdn", low, attrs_of())
    wide = {key: (val.astype(np.float64) if key in ("q", "k", "v", "beta") else val) for key, val in low.items()}
    o_ref, _ = loop_forward("gdn", wide["q"], wide["k"], wide["v"], wide["g"], wide["beta"], cu)
    np.testing.assert_allclose(out["o"], o_ref, rtol=1e-11, atol=1e-12)


# ------------------------------------------------------------------------------------ backward tests

def _loss(fwd_op, d, attrs, d_o, dht):
    """<o, dO> + <final_state, d_final_state> from the forward kernel, in float64."""
    out = KERNELS[fwd_op](d, dict(attrs, output_final_state=True), {"o": None, "final_state": None}, np.float64)
    return float(np.sum(out["o"] * d_o) + (0.0 if dht is None else np.sum(out["final_state"] * dht)))


def _finite_difference(fwd_op, d, attrs, d_o, dht, port, eps=1e-6):
    base = d[port]
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += eps
        minus[idx] -= eps
        lp = _loss(fwd_op, dict(d, **{port: plus}), attrs, d_o, dht)
        lm = _loss(fwd_op, dict(d, **{port: minus}), attrs, d_o, dht)
        grad[idx] = (lp - lm) / (2 * eps)
    return grad


BWD_CASES = [
    # (op, seqlens, with_h0, with_dht, l2)
    ("gdn_bwd", [0, 4, 5, 8], False, False, False),
    ("gdn_bwd", [0, 4, 5, 8], True, True, False),
    ("gdn_bwd", [0, 2, 7], True, True, True),
    ("gdn_bwd", [0, 1], True, False, True),
    ("kda_bwd", [0, 4, 5, 8], False, False, False),
    ("kda_bwd", [0, 3, 4, 8], True, True, True),
    ("kda_bwd", [0, 6], True, True, False),
]


@pytest.mark.parametrize("op, cu, with_h0, with_dht, l2", BWD_CASES)
def test_backward_matches_finite_differences(op, cu, with_h0, with_dht, l2):
    fwd_op = op[:-4]
    H, K, V = 2, 3, 2
    d = make_inputs(op, cu, H=H, K=K, V=V, seed=sum(cu) + with_h0 + 2 * with_dht + 4 * l2, with_h0=with_h0)
    rng = np.random.default_rng(99)
    T, N = cu[-1], len(cu) - 1
    d_o = rng.standard_normal((T, H, V))
    dht = rng.standard_normal((N, H, K, V)) if with_dht else None
    attrs = {"scale": None, "use_qk_l2norm": l2}
    bwd_inputs = dict(d, dO=d_o, d_final_state=dht)
    outputs = {name: (d[port].shape, np.float64)
               for name, port in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"), ("dbeta", "beta"))}
    if with_h0:
        outputs["d_initial_state"] = ((N, H, K, V), np.float64)
    grads = KERNELS[op](bwd_inputs, attrs, outputs, np.float32)
    assert set(grads) == set(outputs)
    ports = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "d_initial_state": "initial_state"}
    for name in outputs:
        fd = _finite_difference(fwd_op, d, attrs, d_o, dht, ports[name])
        assert grads[name].shape == fd.shape, name
        np.testing.assert_allclose(grads[name], fd, rtol=1e-6, atol=1e-7, err_msg=name)


def test_backward_checkpoint_replay_on_a_long_sequence():
    # A sequence longer than the checkpoint interval: the replayed blocks give the same gradients as
    # one block holding every state.
    cu = [0, 150, 151]
    d = make_inputs("kda_bwd", cu, H=2, K=4, V=3, seed=10, with_h0=True)
    rng = np.random.default_rng(11)
    d_o = rng.standard_normal((151, 2, 3))
    dht = rng.standard_normal((2, 2, 4, 3))
    inputs = dict(d, dO=d_o, d_final_state=dht)
    attrs = {"scale": None, "use_qk_l2norm": True}
    a = LA.linear_attention_backward(inputs, attrs)
    saved = LA._CHECKPOINT
    try:
        LA._CHECKPOINT = 10_000
        b = LA.linear_attention_backward(inputs, attrs)
    finally:
        LA._CHECKPOINT = saved
    for name in ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=1e-12, err_msg=name)
    # and one directional derivative against finite differences
    direction = rng.standard_normal(d["g"].shape)
    eps = 1e-6
    lp = _loss("kda", dict(d, g=d["g"] + eps * direction), attrs, d_o, dht)
    lm = _loss("kda", dict(d, g=d["g"] - eps * direction), attrs, d_o, dht)
    np.testing.assert_allclose(np.sum(a["dg"] * direction), (lp - lm) / (2 * eps), rtol=1e-6)


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("every", [1, 3, 64])
def test_forward_checkpoints_hold_the_state_before_every_nth_token_of_each_sequence(op, every):
    cu = [0, 7, 7, 8, 15]                      # lengths 7, 0 (no rows), 1, 7
    d = make_inputs(op, cu, seed=21, with_h0=True)
    o, final, checkpoints = LA.linear_attention_forward(d, {"checkpoint_every_n_tokens": every}, op)
    T, N = cu[-1], len(cu) - 1
    assert checkpoints.shape == (max(T // every + N, 1),) + d["initial_state"].shape[1:]
    row = 0
    for n in range(N):
        bos, eos = cu[n], cu[n + 1]
        for t in range(bos, eos, every):
            want = d["initial_state"][n] if t == bos else _state_before(op, d, n, t)
            np.testing.assert_allclose(checkpoints[row], want, rtol=1e-12, atol=1e-12, err_msg=f"seq {n} t {t}")
            row += 1
    assert not checkpoints[row:].any()         # rows past the last sequence's are not written


def _state_before(op, d, n, t):
    """Sequence n's state before token t, by the independent loop over the sequence cut there."""
    bos = int(d["cu_seqlens"][n])
    part = {key: d[key][bos:t] for key in ("q", "k", "v", "g", "beta")}
    w = d["w"][bos:t] if d.get("w") is not None else None
    _, final = loop_forward(op, part["q"], part["k"], part["v"], part["g"], part["beta"], [0, t - bos], w=w,
                            h0=d["initial_state"][n:n + 1])
    return final[0]


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
@pytest.mark.parametrize("every", [2, 64])
def test_backward_from_the_forwards_checkpoints_matches_the_recomputing_backward(op, every):
    cu = [0, 9, 9, 14]
    d = make_inputs(op if op != "gdn2_bwd" else "gdn2", cu, seed=23, with_h0=True)
    rng = np.random.default_rng(24)
    T, H, V = cu[-1], d["v"].shape[1], d["v"].shape[2]
    inputs = dict(d, dO=rng.standard_normal((T, H, V)), d_final_state=rng.standard_normal(d["initial_state"].shape))
    attrs = {"scale": None, "use_qk_l2norm": True}
    _, _, checkpoints = LA.linear_attention_forward(d, dict(attrs, checkpoint_every_n_tokens=every), op[:-4])
    recomputed = LA.linear_attention_backward(inputs, attrs, op)
    given = LA.linear_attention_backward(dict(inputs, state_checkpoints=checkpoints),
                                         dict(attrs, checkpoint_every_n_tokens=every), op)
    assert set(given) == set(recomputed)
    for name in recomputed:
        np.testing.assert_allclose(given[name], recomputed[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_backward_takes_the_states_it_is_given():
    # the checkpoints are the backward's starting states: other states give other gradients (the GPU engines
    # read them the same way, so a reference and a GPU run on the same checkpoints agree)
    cu = [0, 6]
    d = make_inputs("gdn_bwd", cu, seed=25, with_h0=True)
    rng = np.random.default_rng(26)
    inputs = dict(d, dO=rng.standard_normal((6, 2, 4)))
    attrs = {"checkpoint_every_n_tokens": 3}
    _, _, checkpoints = LA.linear_attention_forward(d, attrs, "gdn")
    moved = checkpoints.copy()
    moved[1] += 0.5
    a = LA.linear_attention_backward(dict(inputs, state_checkpoints=checkpoints), attrs, "gdn_bwd")
    b = LA.linear_attention_backward(dict(inputs, state_checkpoints=moved), attrs, "gdn_bwd")
    assert not np.allclose(a["dg"][3:], b["dg"][3:])
    np.testing.assert_allclose(a["dv"][:3], b["dv"][:3])    # the tokens before the moved state see dS alone


# --------------------------------------------------------------------------------- through the graph

needs_package = pytest.mark.skipif(not HAVE_PACKAGE, reason="cudnn_graph's compiled modules are not built")


def _graph_forward(op, d, l2, io_type):
    import cudnn_graph as cudnn
    F32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io_type, compute_data_type=F32, device="cpu")

    def tensor(name, arr, dt=None):
        strides = [s // arr.itemsize for s in arr.strides]
        return g.tensor(name=name, dim=list(arr.shape), stride=strides, data_type=io_type if dt is None else dt)

    host = {}
    for name in ("q", "k", "v", "beta", "w"):
        if d.get(name) is not None:
            host[name] = d[name]
    host["g"] = d["g"].astype(np.float32)
    host["cu_seqlens"] = d["cu_seqlens"]
    if d.get("initial_state") is not None:
        host["initial_state"] = d["initial_state"].astype(np.float32)
    types_ = {"g": F32, "cu_seqlens": cudnn.data_type.INT32, "initial_state": F32}
    t = {name: tensor(name, arr, types_.get(name)) for name, arr in host.items()}
    args = [t["q"], t["k"], t["v"], t["g"], t["beta"]] + ([t["w"]] if "w" in t else [])
    o, final, _ = getattr(g, op)(*args, cu_seqlens=t["cu_seqlens"], initial_state=t.get("initial_state"),
                              output_final_state=True, use_qk_l2norm=l2)
    o.set_output(True)
    final.set_output(True)
    g.build()
    assert g.selected_plan.label == "reference"
    T, H, _ = d["q"].shape
    N, K, V = len(d["cu_seqlens"]) - 1, d["q"].shape[2], d["v"].shape[2]
    O = np.zeros((T, H, V), d["v"].dtype)
    FS = np.zeros((N, H, K, V), np.float32)
    # NumPy cannot export ml_dtypes (bf16) arrays through DLPack: those go in as raw host addresses,
    # shaped by the graph's declared geometry.
    def buf(arr):
        return host_address(arr) if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16" else arr

    pack = {t[name]: buf(arr) for name, arr in host.items()}
    pack.update({o: buf(O), final: FS})
    g.execute(pack)
    return O, FS, host


@needs_package
@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("l2", [False, True])
def test_graph_forward_fp32(op, l2):
    import cudnn_graph as cudnn
    cu = SEQLENS["short3"]
    d = make_inputs(op, cu, K=8, V=6, seed=12, with_h0=True)
    d = {key: (val.astype(np.float32) if val is not None and key != "cu_seqlens" else val) for key, val in d.items()}
    O, FS, host = _graph_forward(op, d, l2, cudnn.data_type.FLOAT)
    o_ref, final_ref = loop_forward(op, host["q"], host["k"], host["v"], host["g"], host["beta"], cu,
                                    w=host.get("w"), h0=host["initial_state"], l2=l2)
    np.testing.assert_allclose(O, o_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(FS, final_ref, rtol=1e-5, atol=1e-5)


@needs_package
def test_graph_forward_bf16_without_initial_state():
    import cudnn_graph as cudnn
    import ml_dtypes
    cu = SEQLENS["uneven3"]
    d = make_inputs("gdn", cu, K=8, V=8, seed=13)
    d = {key: (val.astype(ml_dtypes.bfloat16) if key in ("q", "k", "v", "beta") else val) for key, val in d.items()}
    O, FS, host = _graph_forward("gdn", d, True, cudnn.data_type.BFLOAT16)
    wide = {key: np.asarray(val, np.float64) for key, val in host.items()}
    o_ref, final_ref = loop_forward("gdn", wide["q"], wide["k"], wide["v"], wide["g"], wide["beta"], cu, l2=True)
    assert O.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(O.astype(np.float64), o_ref, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(FS, final_ref, rtol=1e-5, atol=1e-5)


@needs_package
@pytest.mark.parametrize("op, with_h0", [("gdn_bwd", True), ("kda_bwd", False)])
def test_graph_backward_fp32(op, with_h0):
    import cudnn_graph as cudnn
    F32, I32 = cudnn.data_type.FLOAT, cudnn.data_type.INT32
    cu = [0, 3, 4, 9]
    H, K, V = 2, 4, 5
    d = make_inputs(op, cu, H=H, K=K, V=V, seed=14, with_h0=with_h0)
    rng = np.random.default_rng(15)
    T, N = cu[-1], len(cu) - 1
    host = {key: (val.astype(np.float32) if key != "cu_seqlens" else val) for key, val in d.items() if val is not None}
    host["dO"] = rng.standard_normal((T, H, V)).astype(np.float32)
    host["d_final_state"] = rng.standard_normal((N, H, K, V)).astype(np.float32)

    g = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, device="cpu")
    t = {name: g.tensor(name=name, dim=list(arr.shape), stride=[s // arr.itemsize for s in arr.strides],
                        data_type=I32 if name == "cu_seqlens" else F32)
         for name, arr in host.items()}
    outs = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], t["dO"], cu_seqlens=t["cu_seqlens"],
                          initial_state=t.get("initial_state"), d_final_state=t["d_final_state"],
                          use_qk_l2norm=True)
    names = ["dq", "dk", "dv", "dg", "dbeta"] + (["d_initial_state"] if with_h0 else [])
    outs = [x for x in outs if x is not None]
    assert len(outs) == len(names)
    for x in outs:
        x.set_output(True)
    g.build()
    shapes = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "d_initial_state": "d_final_state"}
    bufs = {name: np.zeros(host[shapes[name]].shape, np.float32) for name in names}
    pack = {t[name]: arr for name, arr in host.items()}
    pack.update({x: bufs[name] for x, name in zip(outs, names)})
    g.execute(pack)

    # the expected gradients: finite differences of the independent loop (float64 inputs rounded to fp32)
    wide = {key: (np.asarray(val, np.float64) if key != "cu_seqlens" else val) for key, val in host.items()}
    fwd = op[:-4]

    def loss(**over):
        x = dict(wide, **over)
        o, final = loop_forward(fwd, x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
                                h0=x.get("initial_state"), l2=True)
        return np.sum(o * wide["dO"]) + np.sum(final * wide["d_final_state"])

    ports = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "d_initial_state": "initial_state"}
    for name in names:
        port = ports[name]
        direction = rng.standard_normal(wide[port].shape)
        eps = 1e-6
        fd = (loss(**{port: wide[port] + eps * direction}) - loss(**{port: wide[port] - eps * direction})) / (2 * eps)
        np.testing.assert_allclose(np.sum(bufs[name] * direction), fd, rtol=1e-4, err_msg=name)


@needs_package
@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_graph_forward_checkpoints_feed_the_graph_backward(op):
    """The forward's state_checkpoints output, passed to the backward graph with the same cadence, gives the
    recomputing backward's gradients (host graphs, FLOAT)."""
    import cudnn_graph as cudnn
    F32, I32 = cudnn.data_type.FLOAT, cudnn.data_type.INT32
    cu, every = [0, 5, 5, 12], 2
    d = make_inputs(op, cu, H=2, K=4, V=3, seed=31, with_h0=True)
    host = {key: (val.astype(np.float32) if key != "cu_seqlens" else val) for key, val in d.items() if val is not None}
    T, N = cu[-1], len(cu) - 1
    host["dO"] = np.random.default_rng(32).standard_normal((T, 2, 3)).astype(np.float32)

    def tensors(g, names):
        return {n: g.tensor(name=n, dim=list(host[n].shape), stride=[s // host[n].itemsize for s in host[n].strides],
                            data_type=I32 if n == "cu_seqlens" else F32) for n in names}

    fwd = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, device="cpu")
    t = tensors(fwd, ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state"))
    o, final, ckpt = getattr(fwd, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                                      initial_state=t["initial_state"], checkpoint_every_n_tokens=every)
    assert final is None and ckpt.dim == (T // every + N, 2, 4, 3)
    o.set_output(True)
    ckpt.set_output(True)
    fwd.build()
    checkpoints = np.full(ckpt.dim, np.nan, np.float32)
    fwd.execute({**{t[n]: host[n] for n in t}, o: np.zeros((T, 2, 3), np.float32), ckpt: checkpoints})
    assert not np.isnan(checkpoints[:T // every + 1]).any()       # 3 + 0 + 4 rows written, the rest not

    host["state_checkpoints"] = checkpoints
    given = dict(extra=("state_checkpoints",), checkpoint_every_n_tokens=every)
    for a, b in zip(_graph_backward(op, host, tensors, **given), _graph_backward(op, host, tensors)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _graph_backward(op, host, tensors, extra=(), **attrs) -> list:
    """The gradients (FLOAT) of ``op``'s backward as a host graph on ``host``'s arrays; ``extra``: further
    inputs passed by their port names (``tensors(graph, names)`` makes the graph's tensors)."""
    import cudnn_graph as cudnn
    F32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, device="cpu")
    t = tensors(g, ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "dO") + tuple(extra))
    outs = getattr(g, op + "_bwd")(t["q"], t["k"], t["v"], t["g"], t["beta"], t["dO"], cu_seqlens=t["cu_seqlens"],
                                   initial_state=t["initial_state"], **{n: t[n] for n in extra}, **attrs)
    outs = [x for x in outs if x is not None]
    for x in outs:
        x.set_output(True)
    g.build()
    bufs = [np.zeros(x.dim, np.float32) for x in outs]
    g.execute({**{t[n]: host[n] for n in t}, **dict(zip(outs, bufs))})
    return bufs


@needs_package
def test_a_gdn_forward_asked_for_its_chunk_cache_is_refused_and_a_backward_given_one_ignores_it():
    """The chunk cache holds the GPU kernels' per-chunk factors: the float64 recurrence writes none (the forward
    is declined, saying so) and needs none (a backward given one gives the same gradients as without)."""
    import cudnn_graph as cudnn
    from cudnn_graph.ops._linear_attention import chunk_cache_layout
    F32, I32, U8 = cudnn.data_type.FLOAT, cudnn.data_type.INT32, cudnn.data_type.UINT8
    cu = [0, 5, 12]
    d = make_inputs("gdn", cu, H=2, K=4, V=3, seed=41, with_h0=True)
    host = {key: (val.astype(np.float32) if key != "cu_seqlens" else val) for key, val in d.items() if val is not None}
    T, N = cu[-1], len(cu) - 1
    host["dO"] = np.random.default_rng(42).standard_normal((T, 2, 3)).astype(np.float32)
    host["chunk_cache"] = np.zeros(chunk_cache_layout(T, N, 2, 4, F32)[0], np.uint8)

    def tensors(g, names):
        return {n: g.tensor(name=n, dim=list(host[n].shape), stride=[s // host[n].itemsize for s in host[n].strides],
                            data_type={"cu_seqlens": I32, "chunk_cache": U8}.get(n, F32)) for n in names}

    fwd = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, device="cpu")
    t = tensors(fwd, ("q", "k", "v", "g", "beta", "cu_seqlens"))
    cache = fwd.tensor(name="cache")
    o, _, _ = fwd.gdn(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"], chunk_cache=cache)
    o.set_output(True)
    cache.set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="writes no chunk_cache"):
        fwd.build()

    for a, b in zip(_graph_backward("gdn", host, tensors, extra=("chunk_cache",)),
                    _graph_backward("gdn", host, tensors)):
        np.testing.assert_array_equal(a, b)
