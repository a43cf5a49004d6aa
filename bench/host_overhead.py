"""Host time per execute() for a 128x128x128 bf16 matmul, per producer, against cudnn-frontend and a C floor.

Run on a GPU machine (CuPy, torch, JAX, numba and nvidia-cudnn-frontend are used when importable):

    python bench/host_overhead.py [--quick]

Host time per call = the median, over bursts, of (wall time of N calls started from a drained queue) / N,
with N small enough that the GPU queue never fills. The C floor is the same cudnnBackendExecute
sequence issued from a nogil Cython loop in this process. Prints a table; writes
bench/results/host_overhead-<host>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

M = N = K = 128


def burst_us(fn, sync, n=100, reps=25, warmup=50):
    for _ in range(warmup):
        fn()
    sync()
    per = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t) / n)
    sync()
    return statistics.median(per) * 1e6


def export_us(fn, n=20000):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    reps = 9 if args.quick else 25

    import torch
    import cudnn_graph as cudnn
    from cudnn_graph import _backend

    F = cudnn.data_type
    sync = torch.cuda.synchronize
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0")
    A = g.tensor(name="A", dim=[1, M, K], stride=[M * K, K, 1])
    B = g.tensor(name="B", dim=[1, K, N], stride=[K * N, N, 1])
    C = g.matmul(A, B).set_output(True).set_data_type(F.BFLOAT16)
    g.build([cudnn.heur_mode.A])
    a = torch.randn(1, M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    g.execute({A: a, B: b, C: c})
    sync()
    err = float((c.float() - a.float() @ b.float()).abs().max())

    rows = {}
    exports = {}
    rows["raw int"] = burst_us(lambda: g.execute({A: a.data_ptr(), B: b.data_ptr(), C: c.data_ptr()}), sync, reps=reps)
    pack_i = {A: a.data_ptr(), B: b.data_ptr(), C: c.data_ptr()}
    rows["raw int (prebuilt dict)"] = burst_us(lambda: g.execute(pack_i), sync, reps=reps)
    exports["raw int"] = 0.0
    pack_t = {A: a, B: b, C: c}
    rows["torch"] = burst_us(lambda: g.execute(pack_t), sync, reps=reps)
    # torch is read through its exchange table (~0.1 us per operand, measured in ARCHITECTURE.md)
    exports["torch"] = 0.3
    try:
        import cupy as cp
        ca, cb, cc = cp.from_dlpack(a), cp.from_dlpack(b), cp.from_dlpack(c)
        pack_c = {A: ca, B: cb, C: cc}
        rows["cupy"] = burst_us(lambda: g.execute(pack_c), sync, reps=reps)
        exports["cupy"] = 3 * export_us(lambda: ca.__dlpack__())
    except Exception as exc:   # a producer that cannot hold bf16 is reported, not fatal
        rows["cupy"] = f"n/a ({type(exc).__name__}: {str(exc)[:60]})"
    try:
        import jax.dlpack
        ja, jb = jax.dlpack.from_dlpack(a), jax.dlpack.from_dlpack(b)
        pack_j = {A: ja, B: jb, C: c}
        rows["jax (A, B) + torch (C)"] = burst_us(lambda: g.execute(pack_j), sync, reps=reps)
        exports["jax (A, B) + torch (C)"] = 2 * export_us(lambda: ja.__dlpack__()) + 0.1
    except Exception as exc:
        rows["jax (A, B) + torch (C)"] = f"n/a ({type(exc).__name__}: {str(exc)[:60]})"
    try:
        from numba import cuda as ncuda
        # numba has no bf16 type, so it cannot feed this graph; its export cost is reported alone.
        na = ncuda.device_array((1, M, K), dtype=np.float16)
        exports["numba (CAI export)"] = export_us(lambda: na.__cuda_array_interface__)
    except Exception:
        pass

    compiled = g._state.compiled[g._state.selected]
    runner, layout = compiled.runner, compiled.layout
    pack = layout.pack(pack_i)
    def floor_burst(reuse):
        # Drained queue before every burst, as for the execute() bursts: a full launch queue would
        # make cudnnBackendExecute wait and inflate the floor.
        per = []
        for _ in range(reps):
            sync()
            per.append(_backend.execute_floor_ns(runner, pack, 100, reuse_variant_pack=reuse))
        sync()
        return statistics.median(per)

    floor_burst(True)   # warm-up
    floor_ns = floor_burst(True)
    floor_fresh_ns = floor_burst(False)
    floor = floor_ns / 1e3
    fe_rows = {}
    try:
        import cudnn as fe
        handle = fe.create_handle()
        fg = fe.pygraph(io_data_type=fe.data_type.BFLOAT16, intermediate_data_type=fe.data_type.FLOAT,
                        compute_data_type=fe.data_type.FLOAT, handle=handle)
        FA = fg.tensor(name="A", dim=[1, M, K], stride=[M * K, K, 1], data_type=fe.data_type.BFLOAT16)
        FB = fg.tensor(name="B", dim=[1, K, N], stride=[K * N, N, 1], data_type=fe.data_type.BFLOAT16)
        FC = fg.matmul(FA, FB)
        FC.set_output(True).set_data_type(fe.data_type.BFLOAT16)
        fg.build([fe.heur_mode.A])
        ws = torch.empty(max(1, fg.get_workspace_size()), device="cuda", dtype=torch.uint8)
        fe_t = {FA: a, FB: b, FC: c}
        fe_rows["frontend torch"] = burst_us(lambda: fg.execute(fe_t, ws, handle=handle), sync, reps=reps)
        fe_i = {FA: a.data_ptr(), FB: b.data_ptr(), FC: c.data_ptr()}
        fe_rows["frontend raw int"] = burst_us(lambda: fg.execute(fe_i, ws, handle=handle), sync, reps=reps)
        fe_version = fe.__version__
    except Exception as exc:
        fe_version = f"unavailable: {type(exc).__name__}: {str(exc)[:100]}"

    lines = [f"host us per execute, 128^3 bf16 matmul, plan {g.selected_plan.label}, max |err| {err:.3g}",
             f"C floor (nogil loop, reused variant pack): {floor:.2f} us; fresh variant pack per call: "
             f"{floor_fresh_ns / 1e3:.2f} us; cudnn-frontend {fe_version}",
             f"{'producer':<28}{'ours us':>9}{'/floor':>8}{'target':>22}{'/frontend':>11}"]
    result = {"host": platform.node(), "plan": g.selected_plan.label, "max_abs_err": err, "c_floor_us": floor,
              "c_floor_fresh_pack_us": floor_fresh_ns / 1e3, "frontend": fe_rows, "frontend_version": fe_version,
              "ours": {}, "exports_us": exports}
    for name, us in rows.items():
        if isinstance(us, str):
            lines.append(f"{name:<28}{us}")
            continue
        if name.startswith("raw int"):
            target = f"<= 1.15x floor ({1.15 * floor:.2f})"
            fe = fe_rows.get("frontend raw int")
            fe_ratio = f"{us / fe:.2f} (<=0.25)" if fe else "-"
        else:
            bound = floor + exports.get(name, 0.0) + 1.0
            target = f"<= {bound:.2f}"
            fe = fe_rows.get("frontend torch")
            fe_ratio = f"{us / fe:.2f} (<=0.6)" if fe and name == "torch" else "-"
        lines.append(f"{name:<28}{us:>9.2f}{us / floor:>8.2f}{target:>22}{fe_ratio:>11}")
        result["ours"][name] = us
    for name, us in fe_rows.items():
        lines.append(f"{name:<28}{us:>9.2f}{us / floor:>8.2f}")
    print("\n".join(lines))
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", f"host_overhead-{platform.node()}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "host_overhead.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
