"""cuTile linear-attention engine (gdn, kda, gdn2; forward and backward) against the reference engine, on
the GPU.

Each case builds the same graph twice (host: the reference engine; CUDA: the cuTile plan must be the one
selected), feeds the same inputs from CuPy or JAX and compares o and final_state. Inputs are rounded to
the I/O type first, so both engines see identical values; tolerances are per output type, relative to
max(1, max |reference|): the kernels' matrix products run in TF32 on the tensor cores (like
flash-linear-attention's), so the error grows with the sequence length.

The default plan runs the state pass in value blocks of 32 and the output over all of V, with BF16 products
and scratch for BF16 inputs; the other plans (engines/cutile/engine.py VARIANT_KNOBS: TF32 products, other
value blocks, f32 scratch) run once each on the small case, pinned by a router
(``-k "not variants"`` leaves them out; they compile 2-3 kernels each on a cold cache).

Compile time dominates the first run (cuTile compiles each specialisation once and caches it on disk):
cases share specialisations (same op, dtype, K, V, N and flags) where they can.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cudnn = pytest.importorskip("cudnn_graph")
from gpu_support import gpu_run, reference_run  # noqa: E402

F = cudnn.data_type

# Max |error| / max(1, max |reference|) per output: o in the I/O type, final_state in f32 (TF32 products).
TOLERANCE = {("o", "bfloat16"): 3e-2, ("o", "float16"): 1e-2,
             ("final_state", "bfloat16"): 2e-2, ("final_state", "float16"): 1e-2}

# Four sequences each (one specialisation per op/flags): uneven, a length-1 one, one shorter than a chunk.
SMALL = [0, 1, 40, 200, 333]
BIG = [0, 2048, 4096, 6144, 8192]          # T = 8192 as 4 x 2048


def _require_engine():
    from cudnn_graph.engines import manifest
    engine = next((e for e in manifest.engines() if e.name == "cutile_linear_attention"), None)
    if engine is None or engine.missing is not None:
        from cudnn_graph.engines.cutile import CutileLinearAttentionEngine
        pytest.skip(f"the cuTile engine is absent: {(engine or CutileLinearAttentionEngine()).missing}")


def make_inputs(op, cu, H, K, V, io_np, seed, with_h0):
    import ml_dtypes  # noqa: F401
    rng = np.random.default_rng(seed)
    T, N = cu[-1], len(cu) - 1
    per_channel = op in ("kda", "gdn2")
    d = {
        "q": rng.standard_normal((T, H, K)).astype(io_np),
        "k": (rng.standard_normal((T, H, K)) / math.sqrt(K)).astype(io_np),
        "v": rng.standard_normal((T, H, V)).astype(io_np),
        "g": (-rng.uniform(0.02, 0.5, (T, H, K) if per_channel else (T, H))).astype(np.float32),
        "beta": rng.uniform(0.2, 0.9, (T, H, K) if op == "gdn2" else (T, H)).astype(io_np),
        "cu_seqlens": np.array(cu, np.int32),
    }
    if op == "gdn2":
        d["w"] = rng.uniform(0.2, 1.2, (T, H, V)).astype(io_np)
    if with_h0:
        d["initial_state"] = rng.standard_normal((N, H, K, V)).astype(np.float32)
    return d


def prefer_plan(name):
    """A router that ranks the plan called ``name`` first (to run one of the engine's variants)."""
    from cudnn_graph.router import Router

    class Prefer(Router):
        def heuristics_sort(self, graph, entries):
            return sorted(entries, key=lambda e: e.label != name)
    return Prefer()


def builder_for(op, host, io_type, l2, final, plan=None):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=io_type, compute_data_type=F.FLOAT, device=device, router=router)
        types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT}
        t = {}
        for name, arr in host.items():
            t[name] = g.tensor(name=name, dim=list(arr.shape), stride=[s // arr.itemsize for s in arr.strides],
                               data_type=types.get(name, io_type))
        args = [t["q"], t["k"], t["v"], t["g"], t["beta"]] + ([t["w"]] if "w" in t else [])
        o, fs, _ = getattr(g, op)(*args, cu_seqlens=t["cu_seqlens"], initial_state=t.get("initial_state"),
                               output_final_state=final, use_qk_l2norm=l2)
        o.set_output(True)
        t["o"] = o
        if final:
            fs.set_output(True)
            t["final_state"] = fs
        return g, t
    return builder


def _reference_and_cutile_run(builder, host, outs, producer, plan):
    """(reference outputs, GPU outputs) of ``builder``; the GPU run must pick the cuTile engine, and the plan
    ``plan`` when one is named."""
    want = reference_run(builder, host, outs)
    got, graph = gpu_run(builder, host, outs, producer)
    assert graph.selected_plan.engine_id == 20_200, graph.selected_plan
    if plan:
        assert graph.selected_plan.label == plan, graph.selected_plan
    return want, got


def run_case(op, cu, *, H=2, K=128, V=128, dtype="bfloat16", l2=True, h0=True, final=True, producer="cupy",
             seed=0, plan=None):
    import ml_dtypes
    _require_engine()
    io_np = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    io_type = {"bfloat16": F.BFLOAT16, "float16": F.HALF}[dtype]
    host = make_inputs(op, cu, H, K, V, io_np, seed, h0)
    builder = builder_for(op, host, io_type, l2, final, plan)
    outs = ["o"] + (["final_state"] if final else [])
    want, got = _reference_and_cutile_run(builder, host, outs, producer, plan)
    errors = {}
    for name in outs:
        ref = np.asarray(want[name], np.float64)
        err = float(np.max(np.abs(np.asarray(got[name], np.float64) - ref)))
        scale = max(1.0, float(np.max(np.abs(ref))))
        errors[name] = err / scale
        assert np.all(np.isfinite(np.asarray(got[name], np.float64))), f"{name}: non-finite values"
        tol = TOLERANCE[(name, dtype)]
        assert err <= tol * scale, (f"{op} {dtype} {name} ({producer}): max error {err:.3g} "
                                    f"(scale {scale:.3g}, tolerance {tol})")
    print(f"{op} {dtype} K={K} V={V} cu={cu[:3]}..{cu[-1]} l2={l2} h0={h0} {producer} {plan or ''}: "
          + ", ".join(f"{k} rel err {v:.2e}" for k, v in errors.items()))
    return got


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_small_uneven_sequences_cupy(op):
    run_case(op, SMALL)


def test_gdn2_small_uneven_sequences_k64():
    run_case("gdn2", SMALL, K=64, V=64)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_small_uneven_sequences_jax(op):
    pytest.importorskip("jax")
    run_case(op, SMALL, producer="jax", seed=1)


@pytest.mark.parametrize("cu", [[0, 64, 65, 190, 300], [0, 3, 100, 101, 250]])
def test_gdn_float16_without_state_or_l2norm_k64(cu):
    run_case("gdn", cu, K=64, V=64, dtype="float16", l2=False, h0=False, final=False, seed=cu[1])


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_long_sequences_h16(op):
    """T = 8192 as 4 x 2048, H = 16, K = V = 128 (the benchmark's shape)."""
    run_case(op, BIG, H=16, seed=4)


def test_gdn_long_sequences_jax():
    pytest.importorskip("jax")
    run_case("gdn", BIG, H=16, producer="jax", seed=5)


# Each plan variant (engines/cutile/engine.py VARIANT_KNOBS) once, on a small case: (variant, op).
VARIANT_CASES = [("tf32", "gdn"), ("tf32", "kda"), ("bv64", "kda"), ("bv128", "gdn"), ("out32", "gdn"),
                 ("out64", "kda"), ("f32_scratch", "gdn"), ("f32_scratch", "kda")]


@pytest.mark.parametrize("variant, op", VARIANT_CASES)
def test_plan_variants_match_the_reference(variant, op):
    # K = 64 compiles faster than 128; V = 128 leaves every block_v valid.
    run_case(op, SMALL, K=64, V=128, seed=11, plan=f"cutile_{op}_chunk64_{variant}")


def test_executes_on_the_callers_stream_with_a_workspace():
    """An explicit stream and workspace (a CuPy buffer) give the same result as the default path."""
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    _require_engine()
    host = make_inputs("gdn", SMALL, 2, 128, 128, ml_dtypes.bfloat16, 6, True)
    builder = builder_for("gdn", host, F.BFLOAT16, True, True)
    want, _ = gpu_run(builder, host, ["o", "final_state"], "cupy")
    g, t = builder("cuda")
    g.build([cudnn.heur_mode.A])
    ws = cp.zeros(g.get_workspace_size(), cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    pack = {}
    keep = []
    for name, arr in host.items():
        raw = np.ascontiguousarray(arr)
        dev = cp.asarray(raw.view(np.uint16) if raw.dtype.itemsize == 2 and raw.dtype.kind == "V" else raw)
        keep.append(dev)
        pack[t[name]] = cudnn.Slot.from_address(dev.data.ptr, arr.shape, None, arr.dtype.name, ("cuda", 0))
    o = cp.zeros(t["o"].dim, cp.uint16)
    fs = cp.zeros(t["final_state"].dim, cp.float32)
    pack[t["o"]] = cudnn.Slot.from_address(o.data.ptr, o.shape, None, "bfloat16", ("cuda", 0))
    pack[t["final_state"]] = fs
    g.execute(pack, workspace=ws, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(o).view(ml_dtypes.bfloat16), want["o"])
    np.testing.assert_array_equal(cp.asnumpy(fs), want["final_state"])


# --------------------------------------------------------------------- backward (gdn_bwd, kda_bwd, gdn2_bwd)

BWD_TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2}      # max |error| / max(1, max |reference|), every output


def bwd_outputs(op, h0):
    """The backward op's gradients in its output order (gdn2_bwd's dw after dbeta)."""
    return (["dq", "dk", "dv", "dg", "dbeta"] + (["dw"] if op == "gdn2_bwd" else [])
            + (["d_initial_state"] if h0 else []))


def bwd_builder_for(op, host, io_type, l2, plan=None):
    def builder(device):
        router = prefer_plan(plan) if plan and device == "cuda" else None
        g = cudnn.pygraph(io_data_type=io_type, compute_data_type=F.FLOAT, device=device, router=router)
        types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT, "d_final_state": F.FLOAT}
        t = {name: g.tensor(name=name, dim=list(arr.shape), stride=[s // arr.itemsize for s in arr.strides],
                            data_type=types.get(name, io_type)) for name, arr in host.items()}
        positional = [t[p] for p in ("q", "k", "v", "g", "beta", "w") if p in t]
        outs = getattr(g, op)(*positional, t["dO"], cu_seqlens=t["cu_seqlens"],
                              initial_state=t.get("initial_state"), d_final_state=t.get("d_final_state"),
                              use_qk_l2norm=l2)
        names = bwd_outputs(op, "initial_state" in t)
        for name, tensor in zip(names, outs):
            tensor.set_output(True)
            t[name] = tensor
        return g, t
    return builder


def run_bwd_case(op, cu, *, H=2, K=128, V=128, dtype="bfloat16", l2=True, h0=True, dht=True,
                 producer="cupy", seed=0, plan=None, q_in_qk=False):
    """The GPU's gradients (host arrays), checked against the reference engine's. ``q_in_qk``: q is the first
    half of a (T, H, 2K) buffer, as a fused q/k projection gives it (its rows not packed)."""
    import ml_dtypes
    _require_engine()
    io_np = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    io_type = {"bfloat16": F.BFLOAT16, "float16": F.HALF}[dtype]
    host = make_inputs(op[:-4], cu, H, K, V, io_np, seed, h0)
    if q_in_qk:
        qk = np.concatenate([host["q"], host["k"]], axis=2)
        host["q"] = qk[:, :, :K]
    rng = np.random.default_rng(seed + 100)
    T, N = cu[-1], len(cu) - 1
    host["dO"] = rng.standard_normal((T, H, V)).astype(io_np)
    if dht:
        host["d_final_state"] = rng.standard_normal((N, H, K, V)).astype(np.float32)
    builder = bwd_builder_for(op, host, io_type, l2, plan)
    outs = bwd_outputs(op, h0)
    want, got = _reference_and_cutile_run(builder, host, outs, producer, plan)
    errors = {}
    failures = []
    for name in outs:
        ref = np.asarray(want[name], np.float64)
        out = np.asarray(got[name], np.float64)
        assert np.all(np.isfinite(out)), f"{name}: non-finite values"
        scale = max(1.0, float(np.max(np.abs(ref))))
        errors[name] = float(np.max(np.abs(out - ref))) / scale
        if errors[name] > BWD_TOLERANCE[dtype]:
            failures.append(name)
    report = ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
    print(f"{op} {dtype} K={K} V={V} cu={cu[:3]}..{cu[-1]} H={H} l2={l2} h0={h0} dht={dht} {producer} {plan or ''}: {report}")
    assert not failures, f"{op} ({producer}) outside tolerance {BWD_TOLERANCE[dtype]}: {report}"
    return got


# Most backward cases share one specialisation per op (K = V = 64, four sequences, states and L2 norm on), so
# the suite compiles few kernels; K = V = 128 and T = 8192 with H = 16 have their own cases.
@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_small_uneven_sequences_cupy(op):
    run_bwd_case(op, SMALL, K=64, V=64)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_small_uneven_sequences_jax(op):
    pytest.importorskip("jax")
    run_bwd_case(op, SMALL, K=64, V=64, producer="jax", seed=2)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_t2048_h4(op):
    """T = 2048 (4 x 512), H = 4."""
    run_bwd_case(op, [0, 512, 1024, 1536, 2048], H=4, K=64, V=64, seed=7)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_head_dim_128(op):
    run_bwd_case(op, SMALL, K=128, V=128, seed=9)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_t8192_h16_k128(op):
    """The issue's largest case: T = 8192 (4 x 2048), H = 16, K = V = 128."""
    run_bwd_case(op, BIG, H=16, K=128, V=128, seed=13)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
@pytest.mark.parametrize("shape", [dict(cu=SMALL, K=64, V=64), dict(cu=BIG, H=16, K=128, V=128)],
                         ids=["small_k64", "t8192_h16_k128"])
def test_backward_with_bf16_products_matches_the_reference(op, shape):
    """The backward's second plan: BF16 products in the forward recompute and the reverse state pass."""
    run_bwd_case(op, seed=17, plan=f"cutile_{op}_chunk64_auto", **shape)


@pytest.mark.parametrize("op", ["gdn_bwd", "kda_bwd", "gdn2_bwd"])
def test_backward_float16_matches_the_reference(op):
    run_bwd_case(op, SMALL, K=64, V=64, dtype="float16", seed=19)


def test_backward_without_states_or_l2norm():
    run_bwd_case("gdn_bwd", [0, 64, 65, 190, 300], K=64, V=64, l2=False, h0=False, dht=False, seed=3)
