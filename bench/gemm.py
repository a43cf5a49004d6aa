"""bf16 GEMM: the CuTe DSL engine's plan against cuBLAS (torch.matmul) and the cuDNN backend's plan.

Run on an H200 with torch, nvidia-cutlass-dsl and cuDNN:

    python bench/gemm.py [--quick] [--plans K] [--out bench/results/gemm-h200.json]

Sizes (M x N x K, bf16 in, bf16 out, f32 accumulation, row-major A and B): 8192^3, 4096^3, 1024^3 and
16x8192x8192. Kernel time: CUDA events around back-to-back executes (mean per call); TFLOP/s = 2MNK / t.
For each size the graph is built once; its plan list holds the CuTe plans (ranked first) and the cuDNN
backend's; each is timed through ``execute_plan_at_index`` (``--plans K``: the first K CuTe plans, default
1; 3 at 8192^3). Compile time: seconds each CuTe plan took to compile (first build in the process). Host
time: a 256^3 graph, per execute of the selected (CuTe) plan from torch tensors, as bench/host_overhead.py
measures it (median of bursts issued from a drained queue), next to torch.matmul's. Target: CuTe >= 0.9x
cuBLAS at 8192^3. Prints a table; writes the JSON (default bench/results/gemm-<host>.json, and
$OUT/gemm.json when OUT is set).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_overhead import burst_us  # noqa: E402
from sdpa import event_ms  # noqa: E402

SIZES = [(8192, 8192, 8192), (4096, 4096, 4096), (1024, 1024, 1024), (16, 8192, 8192)]
CUTE_ID = 20_100


def build_graph(cudnn, M, N, K):
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0", name=f"gemm_{M}x{N}x{K}")
    a = g.tensor(name="A", dim=[1, M, K], stride=[M * K, K, 1], data_type=F.BFLOAT16)
    b = g.tensor(name="B", dim=[1, K, N], stride=[K * N, N, 1], data_type=F.BFLOAT16)
    c = g.matmul(a, b).set_output(True).set_data_type(F.BFLOAT16)
    t0 = time.perf_counter()
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    first_build_s = time.perf_counter() - t0
    return g, (a, b, c), first_build_s


def compile_seconds(g, index):
    from cudnn_graph.engines.cute import engine as cute_engine
    compiled = g.compiled_plan(index)
    spec = getattr(compiled, "spec", None)
    return cute_engine.compile_seconds.get(cute_engine.kernel_spec(spec)) if spec is not None else None


def time_size(torch, cudnn, M, N, K, n_cute, iters):
    g, (a, b, c), first_build_s = build_graph(cudnn, M, N, K)
    gen = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(1, M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    B = torch.randn(1, K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    C = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    pack = {a: A, b: B, c: C}
    tflop = 2.0 * M * N * K / 1e12
    out = {"M": M, "N": N, "K": K, "first_build_s": first_build_s, "selected": g.selected_plan.label}
    ref = torch.matmul(A, B)

    def record(name, fn, **extra):
        try:
            ms = event_ms(torch, fn, iters)
            out[name] = {"ms": ms, "tflops": tflop / (ms * 1e-3), **extra}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", **extra}

    record("cublas", lambda: torch.matmul(A, B, out=C))
    cute_idx = [i for i, p in enumerate(g.plans) if p.engine_id == CUTE_ID][:n_cute]
    cudnn_idx = [i for i, p in enumerate(g.plans) if p.engine_id < 10_000][:1]
    for rank, i in enumerate(cute_idx):
        label = g.plans[i].label
        try:
            g.build_plan_at_index(i)
        except Exception as exc:
            out[f"cute{rank}"] = {"plan": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        C.zero_()
        g.execute_plan_at_index(pack, None, index=i)
        torch.cuda.synchronize()
        err = float((C.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1))
        record(f"cute{rank}", lambda i=i: g.execute_plan_at_index(pack, None, index=i), plan=label,
               compile_s=compile_seconds(g, i), max_rel_err=err)
    for i in cudnn_idx:
        record("cudnn", lambda i=i: g.execute_plan_at_index(pack, None, index=i), plan=g.plans[i].label)
    best = [v["tflops"] for k, v in out.items() if k.startswith("cute") and isinstance(v, dict) and "tflops" in v]
    if best and "tflops" in out["cublas"]:
        out["best_cute_vs_cublas"] = max(best) / out["cublas"]["tflops"]
    return out


def host_time(torch, cudnn, reps):
    g, (a, b, c), _ = build_graph(cudnn, 256, 256, 256)
    A = torch.randn(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(1, 256, 256, device="cuda", dtype=torch.bfloat16)
    pack = {a: A, b: B, c: C}
    sync = torch.cuda.synchronize
    res = {"plan": g.selected_plan.label,
           "cute execute us": burst_us(lambda: g.execute(pack), sync, reps=reps),
           "torch.matmul us": burst_us(lambda: torch.matmul(A, B, out=C), sync, reps=reps)}
    compiled = g.compiled_plan()
    launcher = getattr(compiled, "_launch", None)
    res["packed launch"] = getattr(launcher, "packed", None)
    return res


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations; 8192^3 and 16x8192x8192 only")
    parser.add_argument("--plans", type=int, default=1, help="CuTe plans timed per size (3 at 8192^3 at least)")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/gemm-<host>.json)")
    args = parser.parse_args(argv)
    iters, reps = (5, 9) if args.quick else (20, 25)

    import torch
    import cudnn_graph as cudnn
    from cudnn_graph.engines import manifest
    result = {"host": platform.node(), "gpu": torch.cuda.get_device_name(), "torch_version": torch.__version__,
              "engines": [e.name for e in manifest.engines()], "sizes": []}
    sizes = [SIZES[0], SIZES[3]] if args.quick else SIZES
    for M, N, K in sizes:
        n_cute = max(args.plans, 3) if (M, N, K) == (8192, 8192, 8192) else args.plans
        try:
            result["sizes"].append(time_size(torch, cudnn, M, N, K, n_cute, iters))
        except Exception as exc:
            result["sizes"].append({"M": M, "N": N, "K": K, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
    try:
        result["host_time"] = host_time(torch, cudnn, reps)
    except Exception as exc:
        result["host_time"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    lines = [f"bf16 GEMM on {result['gpu']} (TFLOP/s; CuTe plans ranked by the engine's model)",
             f"{'M x N x K':<18}{'cuBLAS':>9}{'cuDNN':>9}{'CuTe':>9}{'CuTe/cuBLAS':>13}  best CuTe plan (compile s)"]
    for s in result["sizes"]:
        name = f"{s['M']}x{s['N']}x{s['K']}"
        if "error" in s:
            lines.append(f"{name:<18} error: {s['error']}")
            continue
        cutes = [(k, v) for k, v in s.items() if k.startswith("cute") and isinstance(v, dict)]
        timed = [(k, v) for k, v in cutes if "tflops" in v]
        best = max(timed, key=lambda kv: kv[1]["tflops"]) if timed else None

        def cell(entry):
            return f"{entry['tflops']:>9.1f}" if entry and "tflops" in entry else f"{'n/a':>9}"
        ratio = f"{s['best_cute_vs_cublas']:>13.3f}" if "best_cute_vs_cublas" in s else f"{'-':>13}"
        plan = f"{best[1]['plan']} ({best[1].get('compile_s') or 0:.1f})" if best else ""
        lines.append(f"{name:<18}{cell(s.get('cublas'))}{cell(s.get('cudnn'))}{cell(best[1] if best else None)}"
                     f"{ratio}  {plan}")
        for k, v in cutes:
            if "error" in v:
                lines.append(f"  {k} {v.get('plan')}: {v['error']}")
            else:
                lines.append(f"  {k} {v['plan']}: {v['tflops']:.1f} TF/s, compile {v.get('compile_s') or 0:.1f} s, "
                             f"max rel err {v['max_rel_err']:.2e}")
        if "error" in s.get("cudnn", {}):
            lines.append(f"  cudnn: {s['cudnn']['error']}")
    h = result["host_time"]
    if "error" in h:
        lines.append(f"host time: {h['error']}")
    else:
        lines.append(f"host us per execute, 256^3 ({h['plan']}, packed launch {h['packed launch']}): "
                     f"CuTe execute {h['cute execute us']:.2f}, torch.matmul {h['torch.matmul us']:.2f}")
    print("\n".join(lines))

    here = os.path.dirname(os.path.abspath(__file__))
    targets = [args.out or os.path.join(here, "results", f"gemm-{platform.node()}.json")]
    if os.environ.get("OUT"):
        targets.append(os.path.join(os.environ["OUT"], "gemm.json"))
    for path in targets:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=2)
        except OSError as exc:
            print(f"could not write {path}: {exc}")
    return result


if __name__ == "__main__":
    main()
