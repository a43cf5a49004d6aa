"""The cuTile engine without a GPU: every kernel compiles to a cubin for sm_80, sm_90 and sm_100, the
chunked algorithm the kernels implement agrees with the reference recurrence, and the engine declines
(or is absent) with its reason.

The export tests need ``cuda.tile`` and a tileiras compiler (pip: cuda-tile, nvidia-cuda-tileiras,
nvidia-cuda-nvcc, nvidia-nvvm, all 13.4) and skip with the reason otherwise. They load engines/cutile's
kernel modules by path, so they do not need cudnn_graph's compiled modules either.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import math
import types

import numpy as np

import pytest
from _helpers import REPO_ROOT, load_by_path, reference_linear_attention_kernels

ROOT = REPO_ROOT
CUTILE = ROOT / "engines" / "cutile"
ARCHS = ("sm_80", "sm_90", "sm_100")


_toolchain, _variants = load_by_path("_cutile_under_test", CUTILE, "_toolchain", "_variants")
MISSING = _toolchain.missing()
needs_cutile = pytest.mark.skipif(MISSING is not None, reason=f"cannot compile cuTile kernels: {MISSING}")


def export_variants() -> list:
    """The default plan's specialisation per op (state pass value blocks of 32, output over all of V, BF16
    products and scratch) with every optional feature on (initial/final state, L2 norm)."""
    return [_variants.Variant(op, "bfloat16", "bfloat16", "bfloat16", 128, 128, 32, 4, 128 ** -0.5,
                              True, True, True, low_mma=True, output_block_v=128, scratch_dtype="bfloat16")
            for op in _variants.OP_FEATURES]


@needs_cutile
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", export_variants(), ids=lambda v: v.op)
def test_every_kernel_exports_a_cubin(variant, arch):
    from cuda.tile.compilation import export_kernel
    for kernel, signature in _variants.signatures(variant):
        buffer = io.BytesIO()
        export_kernel(kernel, [signature], buffer, gpu_code=arch, output_format="cubin")
        cubin = buffer.getvalue()
        assert cubin[:4] == b"\x7fELF", f"{signature.symbol} for {arch} is not an ELF cubin"


# The plan variants (engine.VARIANT_KNOBS) compile to other kernel instances: each knob once, sm_90 only
# (the H200's), to keep CI's export time down. Kernels a knob leaves as the default's are not exported again.
VARIANT_EXPORTS = [
    ("gdn", {"low_mma": False}),
    ("kda", {"block_v": 128}),
    ("gdn", {"block_v": 16}),
    ("gdn", {"output_block_v": 32}),
    ("kda", {"output_block_v": 64}),
    ("kda", {"scratch_dtype": "float32"}),
]


@needs_cutile
@pytest.mark.parametrize("op, knobs", VARIANT_EXPORTS, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()))
def test_every_plan_variant_exports_a_cubin_for_sm90(op, knobs):
    import dataclasses
    from cuda.tile.compilation import export_kernel
    base = export_variants()[list(_variants.OP_FEATURES).index(op)]
    variant = dataclasses.replace(base, **knobs)
    same_prepare = (variant.prepare_constants(), variant.scratch_dtype) == (base.prepare_constants(),
                                                                            base.scratch_dtype)
    for kernel, signature in _variants.signatures(variant):
        if signature.symbol.startswith("chunk_gates") or (signature.symbol.startswith("chunk_prepare")
                                                          and same_prepare):
            continue                   # the default's instance, exported above
        buffer = io.BytesIO()
        export_kernel(kernel, [signature], buffer, gpu_code="sm_90", output_format="cubin")
        assert buffer.getvalue()[:4] == b"\x7fELF", f"{signature.symbol} for sm_90 is not an ELF cubin"


@needs_cutile
def test_the_segment_bounds_kernel_exports_a_cubin_for_sm90():
    from cuda.tile.compilation import export_kernel
    kernel, signature = _variants.segment_bounds_signature(8192)
    buffer = io.BytesIO()
    export_kernel(kernel, [signature], buffer, gpu_code="sm_90", output_format="cubin")
    assert buffer.getvalue()[:4] == b"\x7fELF", f"{signature.symbol} for sm_90 is not an ELF cubin"


# The backward kernels at K = V = 64 for sm_90 (about a minute on 2 cores for the three ops); K = V = 128,
# minutes more, with CUDNN_GRAPH_EXPORT_BACKWARD=1.
BACKWARD_HEAD_DIMS = [64] + ([128] if os.environ.get("CUDNN_GRAPH_EXPORT_BACKWARD") == "1" else [])


@needs_cutile
@pytest.mark.parametrize("head_dim", BACKWARD_HEAD_DIMS)
@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_backward_kernels_export_a_cubin_for_sm90(op, head_dim):
    """gdn_bwd / kda_bwd / gdn2_bwd: the four backward kernels (the forward recompute is the forward's)."""
    from cuda.tile.compilation import export_kernel
    variant = _variants.Variant(op, "bfloat16", "bfloat16", "bfloat16", head_dim, head_dim, 32, 4,
                                head_dim ** -0.5, True, True, False, has_dht=True)
    for kernel, signature in _variants.backward_signatures(variant)[-4:]:
        buffer = io.BytesIO()
        export_kernel(kernel, [signature], buffer, gpu_code="sm_90", output_format="cubin")
        assert buffer.getvalue()[:4] == b"\x7fELF", f"{signature.symbol} for sm_90 is not an ELF cubin"


@needs_cutile
def test_backward_kernels_in_value_blocks_of_64_export_a_cubin_for_sm90():
    """The backward plans' ``_bv64`` twins: the reverse state pass, chunk_bwd_values and chunk_bwd_grads over
    value blocks of 64 (gdn, K = V = 64)."""
    from cuda.tile.compilation import export_kernel
    variant = _variants.Variant("gdn", "bfloat16", "bfloat16", "bfloat16", 64, 64, 64, 4, 0.125, True, True, False,
                                has_dht=True)
    for kernel, signature in _variants.backward_signatures(variant)[-3:]:
        buffer = io.BytesIO()
        export_kernel(kernel, [signature], buffer, gpu_code="sm_90", output_format="cubin")
        assert buffer.getvalue()[:4] == b"\x7fELF", f"{signature.symbol} for sm_90 is not an ELF cubin"


# Grouped value heads (group = HV // H = 2: q / k read at h // 2; the backward's dq / dk shares summed by
# group_sum) and the gate options (gate_activation before the chunked kernels, gate_activation_bwd after the
# backward's), K = V = 64 for sm_90: every kernel they change or add.
def gated_variant(op, form, beta_factor, backward=False):
    gates = _variants.GateOptions(form, -5.0 if form == "sigmoid" else 0.0, beta_factor, "bfloat16", "bfloat16",
                                  "float32", "bfloat16")
    extra = {"has_dht": True} if backward else {"low_mma": True, "output_block_v": 64, "scratch_dtype": "bfloat16"}
    return _variants.Variant(op, "bfloat16", "float32" if beta_factor else "bfloat16", "bfloat16", 64, 64, 32, 4,
                             0.125, True, True, not backward, group=2, gates=gates, **extra)


def _export_sm90(kernel, signature):
    from cuda.tile.compilation import export_kernel
    buffer = io.BytesIO()
    export_kernel(kernel, [signature], buffer, gpu_code="sm_90", output_format="cubin")
    assert buffer.getvalue()[:4] == b"\x7fELF", f"{signature.symbol} for sm_90 is not an ELF cubin"


@needs_cutile
@pytest.mark.parametrize("op, form, beta_factor", [("gdn", "softplus", 1.0), ("kda", "sigmoid", 2.0),
                                                   ("gdn2", "none", 1.0)])
def test_grouped_heads_and_gate_options_forward_kernels_export_for_sm90(op, form, beta_factor):
    signatures = _variants.signatures(gated_variant(op, form, beta_factor))
    assert signatures[0][1].symbol.startswith("gate_activation")
    for kernel, signature in signatures:
        _export_sm90(kernel, signature)


@needs_cutile
@pytest.mark.parametrize("op, form, beta_factor", [("gdn", "softplus", 1.0), ("kda", "sigmoid", 0.0),
                                                   ("gdn2", "sigmoid", 2.0)])
def test_grouped_heads_and_gate_options_backward_kernels_export_for_sm90(op, form, beta_factor):
    """The backward's kernels past the forward recompute, then group_sum and gate_activation_bwd."""
    signatures = _variants.backward_signatures(gated_variant(op, form, beta_factor, backward=True))
    symbols = [sig.symbol.split("_Kt")[0] for _, sig in signatures]
    assert symbols[-6:] == ["chunk_bwd_intra", "chunk_bwd_state_pass", "chunk_bwd_values", "chunk_bwd_grads",
                            "group_sum", "gate_activation_bwd"]
    for kernel, signature in signatures[-6:]:
        _export_sm90(kernel, signature)


def test_a_variant_without_options_launches_no_gate_or_group_kernels():
    pytest.importorskip("cuda.tile")
    base = export_variants()[0]
    symbols = [sig.symbol for _, sig in _variants.signatures(base)]
    assert not any(s.startswith(("gate_activation", "group_sum")) for s in symbols)


# ----------------------------------------------------------------- the chunked algorithm, in NumPy

C = _variants.CHUNK


def _locate(cu, c):
    """engines/cutile/_kernels._locate_chunk: (sequence, start, stop) of global chunk c."""
    lo, hi = np.asarray(cu[:-1]), np.asarray(cu[1:])
    count = (hi - lo + C - 1) // C
    ends = np.cumsum(count)
    n = int(np.sum(ends <= c))
    if n >= len(lo):
        return n, 0, 0
    start = int(lo[n] + (c - (ends[n] - count[n])) * C)
    return n, start, min(start + C, int(hi[n]))


def _pad(x, start, stop):
    out = np.zeros((C,) + x.shape[1:])
    out[:stop - start] = x[start:stop]
    return out


def _l2(x):
    ss = np.sum(x * x, 1, keepdims=True)
    return x / np.sqrt(np.where(ss > 0, ss, 1.0))


def _scores(a, b, gc, mid, inclusive, per_channel):
    rows, cols = np.arange(C)[:, None], np.arange(C)[None, :]
    keep = rows >= cols if inclusive else rows > cols
    if per_channel:
        return np.where(keep, (a * np.exp(gc - mid)) @ (b * np.exp(mid - gc)).T, 0.0)
    return np.where(keep, (a @ b.T) * np.exp(np.where(keep, gc - gc.T, -1e30)), 0.0)


def _inverse(a):
    power, inv = -a, np.eye(C) - a
    for _ in range(5):
        power = power @ power
        inv = inv @ power + inv
    return inv


def chunked_forward(op, d, l2):
    """The two kernels' math in float64: chunk_prepare over every chunk, then chunk_recurrence."""
    q, k, v, g, beta, cu = d["q"], d["k"], d["v"], d["g"], d["beta"], list(d["cu_seqlens"])
    T, H, K = q.shape
    V, N = v.shape[2], len(cu) - 1
    per_channel, beta_per_channel, has_w = _variants.OP_FEATURES[op]
    W, U, G = np.zeros((T, H, K)), np.zeros((T, H, V)), np.zeros((T, H, K if per_channel else 1))
    for c in range(-(-T // C) + N):
        n, s, e = _locate(cu, c)
        if n >= N:
            continue
        for h in range(H):
            kt = _pad(k[:, h], s, e)
            kt = _l2(kt) if l2 else kt
            gt = _pad(g[:, h], s, e)
            gc = np.cumsum(gt if per_channel else gt[:, None], 0)
            bt = _pad(beta[:, h], s, e)
            bt = bt if beta_per_channel else bt[:, None]
            read = bt * kt
            x = (_pad(d["w"][:, h], s, e) if has_w else bt) * _pad(v[:, h], s, e)
            m = min(C // 2 - 1, e - s - 1)
            inv = _inverse(_scores(read, kt, gc, gc[m:m + 1], False, per_channel))
            W[s:e, h], U[s:e, h], G[s:e, h] = (inv @ (read * np.exp(gc)))[:e - s], (inv @ x)[:e - s], gc[:e - s]
    o, final = np.zeros((T, H, V)), np.zeros((N, H, K, V))
    h0 = d.get("initial_state")
    scale = 1.0 / math.sqrt(K)
    for n in range(N):
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else np.array(h0[n, h], np.float64)
            for s in range(cu[n], cu[n + 1], C):
                e = min(s + C, cu[n + 1])
                qt, kt = _pad(q[:, h], s, e), _pad(k[:, h], s, e)
                qt, kt = (_l2(qt), _l2(kt)) if l2 else (qt, kt)
                gc = _pad(G[:, h], s, e)
                last = gc[e - s - 1:e - s]
                m = min(C // 2 - 1, e - s - 1)
                mid = gc[m:m + 1]
                gc = np.where(np.arange(C)[:, None] < e - s, gc, last)
                delta = _pad(U[:, h], s, e) - _pad(W[:, h], s, e) @ S
                out = _scores(qt * scale, kt, gc, mid, True, per_channel) @ delta + (qt * np.exp(gc) * scale) @ S
                o[s:e, h] = out[:e - s]
                decay = np.exp(last).reshape(-1, 1)
                S = S * decay + (kt * np.exp(last - gc)).T @ delta
            final[n, h] = S
    return o, final


def _reference():
    return reference_linear_attention_kernels("_cutile_test_reference")


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("cu, l2, with_h0", [
    ([0, 150, 151, 170, 300], True, True),     # uneven, a length-1 sequence, one shorter than a chunk
    ([0, 64, 128], False, False),              # whole chunks only
    ([0, 1], True, True),
    ([0, 0, 70], False, True),                 # an empty sequence passes its state through
])
def test_chunked_algorithm_matches_the_reference_recurrence(op, cu, l2, with_h0):
    ref = _reference()
    rng = np.random.default_rng(len(cu) + 7 * l2)
    T, H, K, V = cu[-1], 2, 16, 8
    per_channel, beta_per_channel, has_w = _variants.OP_FEATURES[op]
    d = {"q": rng.standard_normal((T, H, K)), "k": rng.standard_normal((T, H, K)) / 4,
         "v": rng.standard_normal((T, H, V)), "g": -rng.uniform(0.05, 0.7, (T, H, K) if per_channel else (T, H)),
         "beta": rng.uniform(0.2, 0.9, (T, H, K) if beta_per_channel else (T, H)),
         "cu_seqlens": np.array(cu, np.int32),
         "initial_state": rng.standard_normal((len(cu) - 1, H, K, V)) if with_h0 else None}
    if has_w:
        d["w"] = rng.uniform(0.2, 1.2, (T, H, V))
    o_ref, final_ref, _ = ref.linear_attention_forward(d, {"use_qk_l2norm": l2})
    o, final = chunked_forward(op, d, l2)
    np.testing.assert_allclose(o, o_ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(final, final_ref, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- declines and absence

def _package():
    cg = pytest.importorskip("cudnn_graph")
    if not hasattr(cg, "pygraph"):
        pytest.skip("cudnn_graph's compiled modules are not built")
    if importlib.util.find_spec("cudnn_graph.engines.cutile") is None:
        pytest.skip("the installed cudnn_graph predates engines/cutile (reinstall the package)")
    return cg


def test_engine_is_absent_from_the_manifest_without_cuda_tile_and_declines_without_a_compiler():
    """Listed when ``cuda.tile`` is installed (found, not imported); ``missing`` (which imports it) says
    why kernels cannot be built: no package, or no tileiras compiler."""
    _package()
    from cudnn_graph.engines import manifest
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    engine = CutileLinearAttentionEngine()
    names = [e.name for e in manifest.engines()]
    assert engine.available == _toolchain.installed()
    assert (engine.name in names) == engine.available
    if engine.missing is not None:
        assert "cuda.tile" in engine.missing or "tileiras" in engine.missing
    if not engine.available:
        assert "cuda.tile" in engine.missing


def _gdn_graph(cg, io_type, K, V, H=2, n_seq=2, T=100):
    F = cg.data_type
    g = cg.pygraph(io_data_type=io_type, compute_data_type=F.FLOAT, device="cuda")
    q = g.tensor(name="q", dim=[T, H, K], stride=[H * K, K, 1], data_type=io_type)
    k = g.tensor(name="k", dim=[T, H, K], stride=[H * K, K, 1], data_type=io_type)
    v = g.tensor(name="v", dim=[T, H, V], stride=[H * V, V, 1], data_type=io_type)
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1], data_type=io_type)
    cu = g.tensor(name="cu", dim=[n_seq + 1], stride=[1], data_type=F.INT32)
    o, _, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    return g


@pytest.mark.parametrize("io, K, V, words", [
    ("FLOAT", 128, 128, "BFLOAT16 or HALF"),
    ("BFLOAT16", 96, 128, "head dims"),
    ("HALF", 64, 256, "head dims"),
])
def test_unsupported_nodes_are_declined_with_the_reason(io, K, V, words):
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _gdn_graph(cg, getattr(cg.data_type, io), K, V)
    g.validate()
    reason = cutile_engine._support_reason(g, g.nodes[0])
    assert reason is not None and words in reason, reason


def test_a_host_graph_is_declined():
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cpu")
    T, H, K = 10, 1, 64
    t = [g.tensor(name=n, dim=[T, H, K], stride=[H * K, K, 1], data_type=F.BFLOAT16) for n in "qkv"]
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1], data_type=F.BFLOAT16)
    cu = g.tensor(name="cu", dim=[2], stride=[1], data_type=F.INT32)
    o, _, _ = g.gdn(*t, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    g.validate()
    assert "CUDA" in cutile_engine._support_reason(g, g.nodes[0])


def test_declines_do_not_repeat_the_engine_name():
    """The graph tags each decline with the engine's name; the engine's reason must not say it again."""
    cg = _package()
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 96, 128)
    g.validate()
    engine = CutileLinearAttentionEngine()
    engine.missing = None                      # reach the node checks without a toolchain
    with pytest.raises(cg.errors.GraphNotSupportedError) as info:
        engine.propose_plans(g)
    message = str(info.value)
    assert message.startswith("node 'gdn_0' (gdn): head dims"), message
    assert engine.name not in message


def _proposed(cg, g, cute_reason=None):
    """The engine's plans for ``g`` with the device checks stubbed (no GPU here to query); the CuTe
    kernels' device check answers ``cute_reason`` (their op and type checks are the engine's own)."""
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    saved = cutile_engine._support_reason, cutile_engine._cute_device_reason
    cutile_engine._support_reason = lambda graph, node: None
    cutile_engine._cute_device_reason = lambda graph: cute_reason
    try:
        return engine.propose_plans(g)
    finally:
        cutile_engine._support_reason, cutile_engine._cute_device_reason = saved


def test_the_default_plan_ranks_first_and_each_variant_is_proposed():
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128)
    g.validate()
    plans = _proposed(cg, g, cute_reason="not sm_90")
    names = [p.label for p in plans]
    assert names[0] == "cutile_gdn_chunk64" and plans[0].knobs == cutile_engine.DEFAULT_KNOBS
    assert names[1:] == [f"cutile_gdn_chunk64_{v}" for v in cutile_engine.VARIANT_KNOBS if not v.startswith("cute")]
    assert all(p.priority < plans[0].priority for p in plans[1:])
    wide = [p for p in plans if p.knobs["scratch"] == "f32"]
    assert wide and all(p.workspace_size > plans[0].workspace_size for p in wide)


@pytest.mark.parametrize("dtype, K, H, n_seq, first, state_pass", [
    ("BFLOAT16", 128, 2, 2, "cute_bv16", "cutile"),   # 16 state-pass CTAs: the cuTile one, 16 columns a CTA
    ("BFLOAT16", 128, 16, 1, "cute_bv16", "cutile"),  # 64 CTAs (one 32k sequence's shape): the same
    ("BFLOAT16", 128, 6, 3, "cute", "cutile"),        # 72 CTAs, more than half the SMs: 32 columns a CTA
    # 256 CTAs (4 x 2048 tokens): the eight-warp one forming o, its scores formed by gdn's prepare
    ("BFLOAT16", 128, 16, 4, "cute_all_fused_prepare_scores", "cute"),
    # K = 64 at 128 CTAs: the four-warp fused one, scores by the prepare
    ("BFLOAT16", 64, 16, 4, "cute_all_fused_bv32_prepare_scores", "cute"),
    ("BFLOAT16", 64, 4, 2, "cute_bv8", "cutile"),     # K = 64 at 16 CTAs: the cuTile one, 8 columns a CTA
    ("BFLOAT16", 64, 16, 1, "cute_bv8", "cutile"),    # K = 64, one 32k sequence's shape (32 CTAs): the same
    ("BFLOAT16", 64, 16, 2, "cute_bv16", "cutile"),   # K = 64 at 64 CTAs: 8 columns a CTA past one wave, so 16
    # FP16 at K = 128 and few CTAs: the CuTe one (the cuTile one was slower, timed with TF32 products), 16 columns
    ("HALF", 128, 2, 2, "cute_all_bv16", "cute"),
    ("HALF", 128, 16, 1, "cute_all_bv16", "cute"),
    ("HALF", 64, 2, 2, "cute_bv16", "cutile"),        # FP16 at K = 64 and few CTAs: the cuTile one, FP16 products
    ("HALF", 64, 16, 1, "cute_bv16", "cutile"),       # the same at one 32k sequence's shape (8 columns: BF16 only)
    ("HALF", 128, 6, 3, "cute_all", "cute"),          # FP16 at 72 CTAs, more than half the SMs: 32 columns
    ("HALF", 128, 16, 4, "cute_all_fused_prepare_scores", "cute"),   # FP16 at 256 CTAs: the same as BF16
    ("HALF", 64, 16, 4, "cute_all_fused_bv32_prepare_scores", "cute"),   # FP16 at K = 64, 128 CTAs: as BF16
])
def test_the_cute_plan_ranks_first_where_its_kernels_can_run(dtype, K, H, n_seq, first, state_pass):
    cg = _package()
    g = _gdn_graph(cg, getattr(cg.data_type, dtype), K, K, H=H, n_seq=n_seq)
    g.validate()
    plans = _proposed(cg, g)
    best = max(plans, key=lambda p: p.priority)
    assert best.label == f"cutile_gdn_chunk64_{first}" and best.knobs["prepare"] == best.knobs["output"] == "cute"
    assert best.knobs["state_pass"] == state_pass
    assert sum(p.priority == best.priority for p in plans) == 1


def test_the_transposed_state_pass_forms_are_plans_to_pin_or_time():
    cg = _package()
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128, H=16, n_seq=4)
    g.validate()
    plans = {p.label: p for p in _proposed(cg, g)}
    forms = {"cutile_gdn_chunk64_cute_all_resident": "resident", "cutile_gdn_chunk64_cute_all_wg": "warpgroup"}
    for label, form in forms.items():
        plan = plans[label]
        assert plan.knobs["state_form"] == form and plan.knobs["block_v"] == 64
        assert plan.priority < plans["cutile_gdn_chunk64"].priority
    assert all(p.knobs["state_form"] in ("staged", "split", "fused") for label, p in plans.items() if label not in forms)


def test_the_fused_state_pass_is_a_plan_with_the_cute_output_and_sixty_four_columns():
    cg = _package()
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128, H=16, n_seq=4)
    g.validate()
    plan = {p.label: p for p in _proposed(cg, g)}["cutile_gdn_chunk64_cute_all_fused"]
    assert plan.knobs["state_form"] == "fused" and plan.knobs["block_v"] == 64
    assert plan.knobs["prepare"] == plan.knobs["output"] == plan.knobs["state_pass"] == "cute"


@pytest.mark.parametrize("K, V", [(64, 64), (64, 128), (128, 64), (128, 128)])
def test_the_fused_state_pass_scores_lie_in_the_deltas_and_states_place(K, V):
    """The fused pass writes no deltas or chunk-start states: scale q e^gc and attn (input type) take their
    place, inside it and clear of every other region."""
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, K, V, H=3, n_seq=5)
    g.validate()
    node = g.nodes[0]
    plain = cutile_engine._Geometry(node, io_scratch="bfloat16")
    fused = cutile_engine._Geometry(node, io_scratch="bfloat16", fused=True)
    assert fused.workspace_size == plain.workspace_size
    chunks, H = fused.chunks, fused.H

    def span(name):
        offset, shape = fused.regions[name]
        count = 1
        for d in shape:
            count *= d
        return offset, offset + {"float32": 4}.get(fused.dtypes[name], 2) * count

    assert fused.regions["scores_qg"][1] == (chunks, H, 64, K) and fused.regions["scores_attn"][1] == (chunks, H, 64, 64)
    place = (span("d")[0], span("hs")[1])
    for name in ("scores_qg", "scores_attn"):
        begin, end = span(name)
        assert place[0] <= begin < end <= place[1] and fused.dtypes[name] == "bfloat16"
        for other in set(fused.regions) - {"d", "hs", "scores_qg", "scores_attn"}:
            o_begin, o_end = span(other)
            assert end <= o_begin or o_end <= begin, (name, other)
    assert span("scores_qg")[1] <= span("scores_attn")[0]


def test_gdn_alone_gets_the_fused_plan_whose_prepare_forms_the_scores():
    cg = _package()
    gdn = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128, H=16, n_seq=4)
    gdn.validate()
    plan = {p.label: p for p in _proposed(cg, gdn)}["cutile_gdn_chunk64_cute_all_fused_prepare_scores"]
    assert plan.knobs["scores"] == "prepare" and plan.knobs["state_form"] == "fused" and plan.knobs["prepare"] == "cute"
    kda = _grouped_gated_graph(cg, "kda", gate_lower_bound=-2.5)
    kda.validate()
    labels = [p.label for p in _proposed(cg, kda)]
    assert "cutile_kda_chunk64_cute_all_fused" in labels and not [n for n in labels if "prepare_scores" in n]
    assert {"cutile_gdn_chunk64_cute_all_fused_prepare_scores", "cutile_gdn_chunk64_cute_all_fused_bv32_prepare_scores"} \
        <= {p.label for p in _proposed(cg, gdn)}


def test_the_fused_state_pass_needs_the_cute_output(monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine, engine as cutile_engine
    from cudnn_graph import GraphNotSupportedError
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128, H=16, n_seq=4)
    g.validate()
    monkeypatch.setattr(cutile_engine, "_support_reason", lambda graph, node: None)
    monkeypatch.setattr(cutile_engine, "_cute_device_reason", lambda graph: None)
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    plan = {p.label: p for p in engine.propose_plans(g)}["cutile_gdn_chunk64_cute_all_fused"]
    plan = dataclasses.replace(plan, knobs={**plan.knobs, "output": "cutile"})
    with pytest.raises(GraphNotSupportedError, match="state_form='fused' forms o from the CuTe output kernel's "
                                                     "scores \\(output='cute'\\); got output='cutile'"):
        engine.build_plan(g, plan, None)
    plan = dataclasses.replace(plan, knobs={**plan.knobs, "output": "cute", "state_form": "split", "scores": "prepare"})
    with pytest.raises(GraphNotSupportedError, match="scores='prepare': one of \\('kernel', 'prepare'\\), 'prepare' "
                                                     "for gdn with state_form='fused'"):
        engine.build_plan(g, plan, None)


def test_the_cute_plans_are_left_out_where_their_kernels_cannot_run():
    cg = _package()
    g = _gdn_graph(cg, cg.data_type.BFLOAT16, 128, 128)
    g.validate()
    names = [p.label for p in _proposed(cg, g, cute_reason="the CuTe kernels are built for sm_90")]
    assert not [n for n in names if "cute" in n.removeprefix("cutile")] and "cutile_gdn_chunk64" in names


def test_the_cute_kernels_stay_on_device_0():
    _package()
    import types
    from cudnn_graph.engines.cutile import engine as cutile_engine
    graph = types.SimpleNamespace(device=("cuda", 1))
    reason = cutile_engine._cute_kernels_reason(graph, types.SimpleNamespace(op="gdn"))
    assert reason == "the CuTe kernels run on CUDA device 0; this graph is on device 1"


def test_the_cute_kernels_say_which_ops_they_compute():
    _package()
    import types
    from cudnn_graph.engines.cutile import engine as cutile_engine
    # the backward ops' recompute may take the CuTe prepare and state pass (checked further: device, dtype, and
    # the state pass only with scratch="io"); not the output
    for op, kernels in (("gdn2", ("prepare", "output", "state_pass")),
                        ("gdn2_bwd", ("prepare", "output", "state_pass")), ("kda_bwd", ("output",)),
                        ("gdn_bwd", ("output",))):
        for kernel in kernels:
            reason = cutile_engine._cute_kernels_reason(None, types.SimpleNamespace(op=op), kernel)
            assert reason == f"the CuTe chunk_{kernel} computes gdn / kda, not {op}"


# ----------------------------------------- the chunked backward (gdn_bwd, kda_bwd, gdn2_bwd), in NumPy
#
# The design the cuTile backward kernels (engines/cutile/_kernels.py chunk_bwd_state_pass, chunk_bwd_grads)
# follow (verified on the H200: tests/test_cutile_linear_attention.py). Per chunk (start state S0, cumulative
# gates gc, mid row m, last row L), with the forward's
#   A = strict_tril((C e^{gc-m}) (K e^{m-gc})^T),  T = (I + A)^-1,  W = T (C e^{gc}),  U = T X,
#   D = U - W S0,  O = scale (Q e^{gc} S0 + tril((Q e^{gc-m}) (K e^{m-gc})^T) D),
#   S1 = e^{gc_L} S0 + (K e^{gc_L-gc})^T D,
# three passes:
#   1. forward recompute (the split forward's prepare + state pass): W, U, gc, S0 per chunk (hs), D;
#   2. reverse state pass per (sequence, head, value block), chunks last to first, keeping dS (K x BV):
#      store dS1 (the gradient at the chunk's end) then dD = scale M^T dO + (K e^{gc_L-gc}) dS1 and
#      dS0 = scale (Q e^{gc})^T dO + e^{gc_L} dS1 - W^T dD  (dS0 is the previous chunk's dS1);
#   3. per (chunk, head), in parallel over all V: every other gradient from S0, dS1, D, dD, U, W:
#      dW = -dD S0^T, dX = T^T dD, dCg = T^T dW, dA = -strict_tril(dX U^T + dCg W^T),
#      the decayed products' factor gradients, the decays' log gradients, then dg = reverse in-chunk
#      cumsum of dgc, dbeta, dv, and the L2-norm backward.
# With C = beta * K and X = beta * V (gdn, kda; beta one per token) or X = w * V (gdn2; beta per key channel):
#   dK += beta * dC,  dbeta = K * dC (gdn2, per channel) or rowsum(K * dC) + rowsum(V * dX),
#   dv = beta * dX or w * dX,  dw = V * dX (gdn2).
# float64 here, checked against engines/reference's token-by-token backward.

def _tril(x, inclusive):
    rows, cols = np.arange(C)[:, None], np.arange(C)[None, :]
    return np.where(rows >= cols if inclusive else rows > cols, x, 0.0)


def _l2_backward(x, dxn):
    norm = np.sqrt(np.sum(x * x, 1, keepdims=True))
    norm = np.where(norm == 0, 1.0, norm)
    xn = x / norm
    return (dxn - xn * np.sum(xn * dxn, 1, keepdims=True)) / norm


def chunked_backward(op, d, l2, d_o, dht):
    q, k, v, g, beta, cu = d["q"], d["k"], d["v"], d["g"], d["beta"], list(d["cu_seqlens"])
    T, H, K = q.shape
    V, N = v.shape[2], len(cu) - 1
    per_channel, beta_per_channel, has_w = _variants.OP_FEATURES[op]
    scale = 1.0 / math.sqrt(K)
    h0 = d.get("initial_state")
    grads = {"dq": np.zeros((T, H, K)), "dk": np.zeros((T, H, K)), "dv": np.zeros((T, H, V)),
             "dg": np.zeros(g.shape), "dbeta": np.zeros(beta.shape), "d_initial_state": np.zeros((N, H, K, V))}
    if has_w:
        grads["dw"] = np.zeros((T, H, V))
    for n in range(N):
        for h in range(H):
            spans = [(s, min(s + C, cu[n + 1])) for s in range(cu[n], cu[n + 1], C)]
            # pass 1: per chunk the forward's quantities, the state at its start and its deltas
            chunks, S = [], np.zeros((K, V)) if h0 is None else np.array(h0[n, h], np.float64)
            for s, e in spans:
                kt_raw, qt_raw = _pad(k[:, h], s, e), _pad(q[:, h], s, e)
                kt, qt = (_l2(kt_raw), _l2(qt_raw)) if l2 else (kt_raw, qt_raw)
                gt = _pad(g[:, h], s, e)
                gc = np.cumsum(gt if per_channel else gt[:, None], 0)   # padded rows repeat the last
                bt = _pad(beta[:, h], s, e)
                bt = bt if beta_per_channel else bt[:, None]
                vt = _pad(v[:, h], s, e)
                x_gate = _pad(d["w"][:, h], s, e) if has_w else bt      # X = x_gate * V
                ct_, xt = bt * kt, x_gate * vt
                m = gc[min(C // 2 - 1, e - s - 1)][None]
                last = gc[e - s - 1][None]
                an, bn = ct_ * np.exp(gc - m), kt * np.exp(m - gc)
                A = _tril(an @ bn.T, False)
                Tinv = _inverse(A)
                cg = ct_ * np.exp(gc)
                W, U = Tinv @ cg, Tinv @ xt
                D = U - W @ S
                qn, kn = qt * np.exp(gc - m), kt * np.exp(m - gc)
                M = _tril(qn @ kn.T, True)
                kg = kt * np.exp(last - gc)
                chunks.append(dict(s=s, e=e, kt=kt, qt=qt, kt_raw=kt_raw, qt_raw=qt_raw, gc=gc, bt=bt, vt=vt,
                                   x_gate=x_gate, ct=ct_, xt=xt, m=m, last=last, an=an, bn=bn, Tinv=Tinv, cg=cg,
                                   W=W, U=U, S0=S, D=D, qn=qn, kn=kn, M=M, kg=kg))
                S = np.exp(last).reshape(-1, 1) * S + kg.T @ D
            # pass 2: the reverse state pass
            dS = np.zeros((K, V)) if dht is None else np.array(dht[n, h], np.float64)
            for ch in reversed(chunks):
                dot = _pad(d_o[:, h], ch["s"], ch["e"])
                ch["dS1"], ch["dO"] = dS, dot
                ch["dD"] = scale * ch["M"].T @ dot + ch["kg"] @ dS
                dS = (scale * (ch["qt"] * np.exp(ch["gc"])).T @ dot + np.exp(ch["last"]).reshape(-1, 1) * dS
                      - ch["W"].T @ ch["dD"])
            grads["d_initial_state"][n, h] = dS
            # pass 3: per chunk, independent of the others
            for ch in chunks:
                s, e, gc, dot, dD, S0, dS1 = ch["s"], ch["e"], ch["gc"], ch["dO"], ch["dD"], ch["S0"], ch["dS1"]
                qg = ch["qt"] * np.exp(gc)
                dqt = scale * (dot @ S0.T) * np.exp(gc)
                dgc = scale * qg * (dot @ S0.T)
                dM = _tril(scale * dot @ ch["D"].T, True)
                dqt += (dM @ ch["kn"]) * np.exp(gc - ch["m"])
                dkt = (dM.T @ ch["qn"]) * np.exp(ch["m"] - gc)
                dgc += ch["qn"] * (dM @ ch["kn"]) - ch["kn"] * (dM.T @ ch["qn"])
                dkg = ch["D"] @ dS1.T
                dkt += dkg * np.exp(ch["last"] - gc)
                dgc -= ch["kg"] * dkg
                dlast = np.sum(ch["kg"] * dkg, 0) + np.exp(ch["last"][0]) * np.sum(dS1 * S0, 1)
                dW = -dD @ S0.T
                dX = ch["Tinv"].T @ dD
                dcg = ch["Tinv"].T @ dW
                dA = -_tril(dX @ ch["U"].T + dcg @ ch["W"].T, False)
                dct = dcg * np.exp(gc) + (dA @ ch["bn"]) * np.exp(gc - ch["m"])
                dkt += (dA.T @ ch["an"]) * np.exp(ch["m"] - gc)
                dgc += ch["cg"] * dcg + ch["an"] * (dA @ ch["bn"]) - ch["bn"] * (dA.T @ ch["an"])
                dgc[e - s - 1] += dlast
                dg = np.cumsum(dgc[::-1], 0)[::-1]                 # gc = cumsum(g)
                dkt += ch["bt"] * dct
                if beta_per_channel:
                    dbeta = ch["kt"] * dct
                else:
                    dbeta = np.sum(ch["kt"] * dct, 1) + np.sum(ch["vt"] * dX, 1)
                dvt = ch["x_gate"] * dX
                if l2:
                    dqt, dkt = _l2_backward(ch["qt_raw"], dqt), _l2_backward(ch["kt_raw"], dkt)
                r = e - s
                grads["dq"][s:e, h], grads["dk"][s:e, h], grads["dv"][s:e, h] = dqt[:r], dkt[:r], dvt[:r]
                grads["dg"][s:e, h] = dg[:r] if per_channel else np.sum(dg[:r], 1)
                grads["dbeta"][s:e, h] = dbeta[:r]
                if has_w:
                    grads["dw"][s:e, h] = (ch["vt"] * dX)[:r]
    return grads


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("cu, l2, with_h0, with_dht", [
    ([0, 150, 151, 170, 300], True, True, True),
    ([0, 64, 128], False, False, False),
    ([0, 1], True, True, False),
    ([0, 0, 70], False, True, True),
])
def test_chunked_backward_matches_the_reference_backward(op, cu, l2, with_h0, with_dht):
    ref = _reference()
    rng = np.random.default_rng(len(cu) + 3 * l2 + 5 * with_dht)
    T, H, K, V = cu[-1], 2, 16, 8
    per_channel, beta_per_channel, has_w = _variants.OP_FEATURES[op]
    N = len(cu) - 1
    d = {"q": rng.standard_normal((T, H, K)), "k": rng.standard_normal((T, H, K)) / 4,
         "v": rng.standard_normal((T, H, V)), "g": -rng.uniform(0.05, 0.7, (T, H, K) if per_channel else (T, H)),
         "beta": rng.uniform(0.2, 0.9, (T, H, K) if beta_per_channel else (T, H)),
         "cu_seqlens": np.array(cu, np.int32),
         "initial_state": rng.standard_normal((N, H, K, V)) if with_h0 else None}
    if has_w:
        d["w"] = rng.uniform(0.2, 1.2, (T, H, V))
    d_o = rng.standard_normal((T, H, V))
    dht = rng.standard_normal((N, H, K, V)) if with_dht else None
    want = ref.linear_attention_backward({**d, "dO": d_o, "d_final_state": dht}, {"use_qk_l2norm": l2})
    got = chunked_backward(op, d, l2, d_o, dht)
    for name in ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state") + (("dw",) if has_w else ()):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-8, atol=1e-8, err_msg=name)


def test_backward_ops_are_claimed(monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    T, H, K = 100, 2, 64
    t = [g.tensor(name=n, dim=[T, H, K], stride=[H * K, K, 1], data_type=F.BFLOAT16) for n in ("q", "k", "v", "dO")]
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1], data_type=F.BFLOAT16)
    cu = g.tensor(name="cu", dim=[3], stride=[1], data_type=F.INT32)
    outs = g.gdn_bwd(t[0], t[1], t[2], gate, beta, t[3], cu_seqlens=cu)
    for out in outs:
        if out is not None:                    # d_initial_state: no initial_state given
            out.set_output(True)
    g.validate()
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    assert cutile_engine._support_reason(g, g.nodes[0]) is None


@pytest.mark.parametrize("cu", [[0, 150, 151, 170, 300], [0, 0, 70], [0, 64, 64, 128, 129], [0, 1]])
def test_state_pass_and_output_kernels_number_chunks_alike(cu):
    """chunk_state_pass stores sequence n's j-th chunk state (and deltas) at _first_chunk(n) + j;
    chunk_output reads chunk c's from c as _locate_chunk numbers it: the two must agree."""
    lo, hi = np.array(cu[:-1]), np.array(cu[1:])
    count = (hi - lo + C - 1) // C
    seen = set()
    for n in range(len(cu) - 1):
        first = int(np.sum(np.where(np.arange(len(lo)) < n, count, 0)))    # _kernels._first_chunk
        for j in range(int(count[n])):
            m, start, stop = _locate(cu, first + j)
            assert (m, start, stop) == (n, cu[n] + j * C, min(cu[n] + (j + 1) * C, cu[n + 1]))
            seen.add(first + j)
    assert seen == set(range(int(np.sum(count))))
    assert _locate(cu, int(np.sum(count)))[0] == len(cu) - 1                  # past the last chunk


def _grouped_gated_graph(cg, op, H=2, HV=4, K=64, N=2, io="BFLOAT16", **attrs):
    F = cg.data_type
    g = cg.pygraph(io_data_type=getattr(F, io), compute_data_type=F.FLOAT, device="cuda")
    T, V = 100, 64
    per_channel = op.startswith(("kda", "gdn2"))

    def tensor(name, dims, dt=getattr(F, io)):
        strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
        return g.tensor(name=name, dim=list(dims), stride=strides, data_type=dt)

    args = [tensor("q", (T, H, K)), tensor("k", (T, H, K)), tensor("v", (T, HV, V)),
            tensor("g", (T, HV, K) if per_channel else (T, HV)),
            tensor("beta", (T, HV, K) if op.startswith("gdn2") else (T, HV))]
    if op.startswith("gdn2"):
        args.append(tensor("w", (T, HV, V)))
    keywords = dict(cu_seqlens=tensor("cu", (N + 1,), F.INT32), a_log=tensor("a_log", (HV,), F.FLOAT),
                    dt_bias=tensor("dt_bias", (HV, K) if per_channel else (HV,)), safe_gate=True,
                    use_beta_sigmoid=True, **attrs)
    if op.endswith("_bwd"):
        args.append(tensor("dO", (T, HV, V)))
    outs = getattr(g, op)(*args, **keywords)
    for out in outs:
        if out is not None:
            out.set_output(True)
    g.validate()
    return g


@pytest.mark.parametrize("op", ["kda", "kda_bwd", "gdn2", "gdn2_bwd"])
def test_a_bounded_gate_that_could_overflow_the_split_decays_is_declined_naming_the_bound(op, monkeypatch):
    """A per-channel decay is formed as two factors split at a chunk's middle row, each spanning up to 32
    tokens: a bounded gate below -80 / 32 = -2.5 per token could make one overflow (inf / NaN on the H200 at
    -5). The engine declines it, naming the bound and the limit, and takes the limit itself."""
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    assert _variants.split_safe_lower_bound() == -2.5
    g = _grouped_gated_graph(cg, op, gate_lower_bound=-5.0)
    reason = cutile_engine._support_reason(g, g.nodes[0])
    assert reason is not None and "gate_lower_bound=-5" in reason and ">= -2.5" in reason, reason
    g = _grouped_gated_graph(cg, op, gate_lower_bound=-2.5)
    assert cutile_engine._support_reason(g, g.nodes[0]) is None


def test_gdn2_bwd_is_claimed_with_per_channel_beta_the_write_gate_and_their_gradients(monkeypatch):
    """gdn2_bwd runs gdn2's recompute and the backward kernels with per-channel beta (dbeta (T, HV, K)) and
    the write gate (dw (T, HV, V)): its variant says so, its plans are named for the op, and the gate
    options' scratch has beta's per-channel shape."""
    cg = _package()
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _grouped_gated_graph(cg, "gdn2_bwd")
    node = g.nodes[0]
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    assert cutile_engine._support_reason(g, node) is None
    variant = cutile_engine.variant_of(g, node, 32)
    assert variant.op == "gdn2" and variant.per_channel and variant.beta_per_channel and variant.has_w
    assert variant.w_dtype == "bfloat16" and variant.gates.form == "softplus" and variant.gates.on_beta
    assert set(node.outputs) >= {"dbeta", "dw"}
    geometry = cutile_engine._Geometry(node, backward=True)
    assert geometry.regions["dbeta_act"][1] == geometry.regions["beta_act"][1] == (100, 4, 64)
    assert geometry.regions["dg_act"][1] == (100, 4, 64)
    engine = CutileLinearAttentionEngine()
    engine.missing = None                      # reach the plans without a toolchain
    names = [p.label for p in engine.propose_plans(g)]
    assert names == ["cutile_gdn2_bwd_chunk64", "cutile_gdn2_bwd_chunk64_auto", "cutile_gdn2_bwd_chunk64_bv64"]


@pytest.mark.parametrize("op", ["gdn", "kda_bwd", "gdn2_bwd"])
def test_grouped_heads_and_gate_options_give_their_variant_and_scratch(op, monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _grouped_gated_graph(cg, op)
    node = g.nodes[0]
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    assert cutile_engine._support_reason(g, node) is None
    variant = cutile_engine.variant_of(g, node, 32)
    assert variant.group == 2 and variant.gates.form == "softplus" and variant.gates.beta_factor == 1.0
    assert variant.beta_dtype == "float32" and variant.gates.beta_dtype == "bfloat16"
    assert variant.gates.a_log_dtype == "float32" and variant.gates.dt_bias_dtype == "bfloat16"
    geometry = cutile_engine._Geometry(node, backward=op.endswith("_bwd"))
    assert (geometry.HQ, geometry.H) == (2, 4)
    assert {"g_act", "beta_act"} <= set(geometry.regions)
    assert ({"dq_hv", "dk_hv", "dg_act", "dbeta_act"} <= set(geometry.regions)) == op.endswith("_bwd")
    assert geometry.regions["dq_hv" if op.endswith("_bwd") else "g_act"][1][:2] == (100, 4)


def _kda_float16_graph(cg, H, K, n_seq):
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    T = 100
    q, k, v = (g.tensor(name=n, dim=[T, H, K], stride=[H * K, K, 1], data_type=F.HALF) for n in "qkv")
    gate = g.tensor(name="g", dim=[T, H, K], stride=[H * K, K, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1], data_type=F.HALF)
    cu = g.tensor(name="cu", dim=[n_seq + 1], stride=[1], data_type=F.INT32)
    o, _, _ = g.kda(q, k, v, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    g.validate()
    return g


def test_kda_with_float16_inputs_ranks_the_fused_cute_plan_first_where_it_fills_the_gpu():
    # what kda's BF16 graphs rank first at 4 x 2048 tokens, 16 heads, K = V = 128 (256 state-pass CTAs)
    cg = _package()
    g = _kda_float16_graph(cg, 16, 128, 4)
    best = max(_proposed(cg, g), key=lambda p: p.priority)
    assert best.label == "cutile_kda_chunk64_cute_all_fused"


@pytest.mark.parametrize("kernel", ["prepare", "output", "state_pass", "intra", "grads", "bwd_state", "values"])
def test_kda_with_float16_inputs_may_take_every_cute_kernel(kernel):
    # the split decay factors (up to e^80) overflow FP16: the prepare, the output, chunk_bwd_intra's scores and
    # chunk_bwd_grads' score products hold them in BF16 for FP16 inputs (ChunkKernel.split)
    cg = _package()
    from cudnn_graph.engines.cutile import engine as cutile_engine
    g = _kda_float16_graph(cg, 2, 64, 2)
    reason = cutile_engine._cute_kernels_reason(g, g.nodes[0], kernel)
    if kernel == "intra" and not cutile_engine.FLOAT16_BACKWARD_GPU_TESTED:
        assert reason == ("the CuTe chunk_bwd_intra has not yet run kda's FP16 inputs on a GPU (its scores take the "
                          "split decays in BF16, as the output's)")
    else:
        assert reason is None or "FP16" not in reason


def _checkpointed_gdn(cg, every=64, checkpoint_type=None, backward=False):
    """A gdn (or gdn_bwd) graph with state_checkpoints at ``every`` tokens (BF16 unless ``checkpoint_type``)."""
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda")
    T, H, K, V, N = 256, 2, 64, 64, 2

    def tensor(name, dims, dt=F.BFLOAT16):
        strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
        return g.tensor(name=name, dim=list(dims), stride=strides, data_type=dt)

    args = [tensor("q", (T, H, K)), tensor("k", (T, H, K)), tensor("v", (T, H, V)), tensor("g", (T, H), F.FLOAT),
            tensor("beta", (T, H))]
    cu = tensor("cu", (N + 1,), F.INT32)
    if backward:
        rows = T // every + N
        checkpoints = tensor("checkpoints", (rows, H, K, V), checkpoint_type or F.BFLOAT16)
        outs = g.gdn_bwd(*args, tensor("dO", (T, H, V)), cu_seqlens=cu, state_checkpoints=checkpoints,
                         checkpoint_every_n_tokens=every)
    else:
        outs = g.gdn(*args, cu_seqlens=cu, checkpoint_every_n_tokens=every)
        if checkpoint_type is not None:
            outs[2].set_data_type(checkpoint_type)
    for out in outs:
        if out is not None:
            out.set_output(True)
    g.validate()
    return g


def test_forward_plans_with_checkpoints_are_those_whose_chunk_start_states_have_their_type(monkeypatch):
    """The plans write the chunk-start states (one a 64-token chunk) into state_checkpoints in place of their
    scratch: BF16 checkpoints from the plans with BF16 scratch, FLOAT ones from the f32-scratch plan alone."""
    cg = _package()
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    engine = CutileLinearAttentionEngine()
    engine.missing = None                      # reach the plans without a toolchain
    plain = [p.label for p in engine.propose_plans(_grouped_gated_graph(cg, "gdn"))]
    bf16 = [p.label for p in engine.propose_plans(_checkpointed_gdn(cg))]
    assert bf16 == [name for name in plain if not name.endswith("f32_scratch")] and bf16
    f32 = [p.label for p in engine.propose_plans(_checkpointed_gdn(cg, checkpoint_type=cg.data_type.FLOAT))]
    assert f32 == ["cutile_gdn_chunk64_f32_scratch"]


@pytest.mark.parametrize("backward", [False, True], ids=["gdn", "gdn_bwd"])
def test_a_checkpoint_cadence_other_than_the_chunk_is_named_in_the_decline(backward, monkeypatch):
    cg = _package()
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    from cudnn_graph.engines.cutile import engine as cutile_engine
    monkeypatch.setattr(cutile_engine, "_compute_capability", lambda ordinal: (9, 0))   # no GPU here
    g = _checkpointed_gdn(cg, every=128, backward=backward)
    reason = cutile_engine.checkpoint_reason(g, g.nodes[0], "bfloat16")
    assert "checkpoint_every_n_tokens=128" in reason and "n = 64" in reason
    engine = CutileLinearAttentionEngine()
    engine.missing = None
    if backward:      # a backward recomputes the states it cannot read: its plans stay
        assert engine.propose_plans(g)
    else:
        with pytest.raises(cg.GraphNotSupportedError, match="n = 64"):
            engine.propose_plans(g)
    at_the_chunk = _checkpointed_gdn(cg, backward=backward)
    assert cutile_engine.checkpoint_reason(at_the_chunk, at_the_chunk.nodes[0], "bfloat16") is None
