"""The cuTile engine without a GPU: every kernel compiles to a cubin for sm_80, sm_90 and sm_100, the
chunked algorithm the kernels implement agrees with the reference recurrence, and the engine declines
(or is absent) with its reason.

The export tests need ``cuda.tile`` and a tileiras compiler (pip: cuda-tile, nvidia-cuda-tileiras,
nvidia-cuda-nvcc, nvidia-nvvm, all 13.4) and skip with the reason otherwise. They load engines/cutile's
kernel modules by path, so they do not need cudnn_graph's compiled modules either.
"""
from __future__ import annotations

import importlib
import importlib.util
import io
import math
import pathlib
import sys
import types

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CUTILE = ROOT / "engines" / "cutile"
ARCHS = ("sm_80", "sm_90", "sm_100")


def _load_by_path(package: str, folder: pathlib.Path, *names: str) -> list:
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = [str(folder)]
        sys.modules[package] = pkg
    return [importlib.import_module(f"{package}.{name}") for name in names]


_toolchain, _variants = _load_by_path("_cutile_under_test", CUTILE, "_toolchain", "_variants")
MISSING = _toolchain.missing()
needs_cutile = pytest.mark.skipif(MISSING is not None, reason=f"cannot compile cuTile kernels: {MISSING}")


def export_variants() -> list:
    """One specialisation per op with every optional feature on (initial/final state, L2 norm)."""
    return [_variants.Variant(op, "bfloat16", "bfloat16", "bfloat16", 128, 128, 64, 4, 128 ** -0.5,
                              True, True, True) for op in _variants.OP_FEATURES]


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
    if "cudnn_graph" not in sys.modules:
        try:
            import cudnn_graph  # noqa: F401
        except ImportError:
            stub = types.ModuleType("cudnn_graph")
            stub.__path__ = [str(ROOT / "cudnn_graph")]
            sys.modules["cudnn_graph"] = stub
    spec = importlib.util.spec_from_file_location(
        "_cutile_test_reference", ROOT / "engines" / "reference" / "_kernels_linear_attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    o_ref, final_ref = ref.linear_attention_forward(d, {"use_qk_l2norm": l2})
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


def test_engine_is_absent_from_the_manifest_without_a_toolchain():
    _package()
    from cudnn_graph.engines import manifest
    from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
    engine = CutileLinearAttentionEngine()
    names = [e.name for e in manifest.engines()]
    if engine.missing is None:
        assert engine.available and engine.name in names
    else:
        assert not engine.available and engine.name not in names
        assert "cuda.tile" in engine.missing or "tileiras" in engine.missing


def _gdn_graph(cg, io_type, K, V):
    F = cg.data_type
    g = cg.pygraph(io_data_type=io_type, compute_data_type=F.FLOAT, device="cuda")
    T, H = 100, 2
    q = g.tensor(name="q", dim=[T, H, K], stride=[H * K, K, 1], data_type=io_type)
    k = g.tensor(name="k", dim=[T, H, K], stride=[H * K, K, 1], data_type=io_type)
    v = g.tensor(name="v", dim=[T, H, V], stride=[H * V, V, 1], data_type=io_type)
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1], data_type=io_type)
    cu = g.tensor(name="cu", dim=[3], stride=[1], data_type=F.INT32)
    o, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu)
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
    o, _ = g.gdn(*t, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    g.validate()
    assert "CUDA" in cutile_engine._support_reason(g, g.nodes[0])
