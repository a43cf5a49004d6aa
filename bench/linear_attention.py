"""Linear attention (delta rule) forward: the cuTile engine vs flash-linear-attention (fla-core 0.6, Triton).

Run on a GPU machine with torch, fla-core, cuda-tile and a tileiras compiler:

    python bench/linear_attention.py [--iters 50]

Shape (issue 8): T = 8192 tokens as 4 sequences of 2048 (varlen, cu_seqlens), H = 16, K = V = 128, bf16
q/k/v/beta, f32 gates, L2-normalised q/k, initial state in, final state out. Ops: gdn (fla
``chunk_gated_delta_rule``) and kda (fla ``chunk_kda``). Times are CUDA-event means over back-to-back
calls after a warm-up (so the first call's compilation is excluded and reported apart), taken in
``--rounds`` alternating rounds (fla, ours, fla, ours, ...): the table shows each side's median and the
median of the per-round ratios, since fla's time (Triton launches from Python, host-side chunk tables)
moves with the host's speed from run to run. ``--backward``
also times our gdn_bwd / kda_bwd (fla's backward refuses to run correctly on Hopper with Triton 3.6, issue 8).
Also prints each op's max |difference| between the two outputs. Prints a table; writes
bench/results/linear_attention-<host>.json (and $OUT/linear_attention.json when OUT is set).

    --variants all | NAME,NAME   also time the engine's other plans (knob sets: engines/cutile/engine.py
                                 VARIANT_KNOBS; each compiles at its first call, tens of seconds)
    --breakdown                  time each kernel launch of our plans apart (gates, prepare, state_pass,
                                 output; the backward's prefixed bwd:) with CUDA events around each launch
    --gpu-time                   also each side's GPU time per call from the torch profiler (fla's calls
                                 are host-bound on some hosts: this is the kernels' cost alone)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa import event_ms  # noqa: E402  (one CUDA-event timer for the benchmarks)

N_SEQ, SEQ_LEN, H, K, V = 4, 2048, 16, 128, 128


def make_inputs(torch, op: str, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = N_SEQ * SEQ_LEN
    dev, bf16 = "cuda", torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=gen)

    gate_shape = (T, H, K) if op == "kda" else (T, H)
    return {
        "q": randn(T, H, K).to(bf16), "k": randn(T, H, K).to(bf16), "v": randn(T, H, V).to(bf16),
        "g": torch.nn.functional.logsigmoid(randn(*gate_shape)).float() / 4,
        "beta": torch.rand(T, H, device=dev, generator=gen).to(bf16),
        "cu_seqlens": torch.arange(0, T + 1, SEQ_LEN, device=dev, dtype=torch.int32),
        "initial_state": randn(N_SEQ, H, K, V).float() * 0.1,
    }


class _Prefer:
    """A router putting the plan named ``name`` first (the others keep their order)."""

    def __new__(cls, name):
        from cudnn_graph.router import Router

        class Prefer(Router):
            def heuristics_sort(self, graph, entries):
                return sorted(entries, key=lambda e: e.label != name)
        return Prefer()


def _started_runner(torch, g, pack: dict):
    """``run()``, which executes ``g`` on ``pack`` on torch's current stream, after one call of it (and a
    synchronize); also the perf_counter time that first call began, for the caller to time it."""
    stream = torch.cuda.current_stream().cuda_stream

    def run():
        g.execute(pack, stream=stream)

    began = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return run, began


def ours(torch, op: str, x: dict, variant: str = ""):
    """(run, o, final_state, build seconds, first-call seconds, compiled plan) for our cuTile plan
    (its variant ``variant``, '' for the default) on ``x``."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    name = f"cutile_{op}_chunk64" + (f"_{variant}" if variant else "")
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda", router=_Prefer(name))
    types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT}
    t = {name: g.tensor(name=name, dim=list(a.shape), stride=list(a.stride()), data_type=types.get(name, F.BFLOAT16))
         for name, a in x.items()}
    o, fs = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                           initial_state=t["initial_state"], output_final_state=True, use_qk_l2norm=True)
    o.set_output(True)
    fs.set_output(True)
    began = time.perf_counter()
    g.build([cudnn.heur_mode.A])
    built = time.perf_counter() - began
    if g.selected_plan.label != name:
        raise RuntimeError(f"plan {name} was not selected: {g.selected_plan} (declines: {g.declines})")
    out = torch.empty_like(x["v"])
    final = torch.empty_like(x["initial_state"])
    pack = {t[name]: a for name, a in x.items()}
    pack.update({o: out, fs: final})
    run, began = _started_runner(torch, g, pack)
    first = time.perf_counter() - began
    compiled = g.compiled_plan()
    return run, out, final, built, first, compiled


def ours_backward(torch, op: str, x: dict, variant: str = ""):
    """(run, compiled plan, first-call seconds) for our cuTile {op}_bwd plan (its variant ``variant``, ''
    for the default) on ``x`` plus a random dO and d_final_state."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = dict(x, dO=torch.randn(*x["v"].shape, device="cuda", generator=gen).to(torch.bfloat16),
             d_final_state=torch.randn(*x["initial_state"].shape, device="cuda", generator=gen))
    name = f"cutile_{op}_bwd_chunk64" + (f"_{variant}" if variant else "")
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device="cuda", router=_Prefer(name))
    types = {"g": F.FLOAT, "cu_seqlens": F.INT32, "initial_state": F.FLOAT, "d_final_state": F.FLOAT}
    t = {name: g.tensor(name=name, dim=list(a.shape), stride=list(a.stride()), data_type=types.get(name, F.BFLOAT16))
         for name, a in x.items()}
    outs = getattr(g, f"{op}_bwd")(t["q"], t["k"], t["v"], t["g"], t["beta"], t["dO"], cu_seqlens=t["cu_seqlens"],
                                   initial_state=t["initial_state"], d_final_state=t["d_final_state"],
                                   use_qk_l2norm=True)
    outs = [tensor for tensor in outs if tensor is not None]
    for tensor in outs:
        tensor.set_output(True)
    g.build([cudnn.heur_mode.A])
    if g.selected_plan.label != name:
        raise RuntimeError(f"plan {name} was not selected: {g.selected_plan} ({g.declines})")
    pack = {t[name]: a for name, a in x.items()}
    for tensor in outs:
        dtype = torch.float32 if g.view.data_type(tensor) == F.FLOAT else torch.bfloat16
        pack[tensor] = torch.empty(list(tensor.dim), device="cuda", dtype=dtype)
    run, began = _started_runner(torch, g, pack)
    return run, g.compiled_plan(), time.perf_counter() - began


def kernel_breakdown(torch, run, compiled, iters: int) -> dict:
    """Mean milliseconds of each kernel launch of ``compiled`` (CUDA events on the current stream
    around each launch, so host gaps between launches are excluded)."""
    events = []

    def hook(name, launch):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        stop.record()
        events.append((name, start, stop))

    run()
    torch.cuda.synchronize()
    compiled.launch_hook = hook
    try:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    finally:
        compiled.launch_hook = None
    totals = {}
    for name, start, stop in events:
        totals[name] = totals.get(name, 0.0) + start.elapsed_time(stop)
    return {name: total / iters for name, total in totals.items()}


def fla_call(torch, op: str, x: dict):
    """(run, o, final_state) for fla's chunk kernel on the same inputs ([1, T, ...] with cu_seqlens)."""
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from fla.ops.kda import chunk_kda as fn
    args = dict(q=x["q"][None], k=x["k"][None], v=x["v"][None], g=x["g"][None], beta=x["beta"][None],
                initial_state=x["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                cu_seqlens=x["cu_seqlens"].long())
    result = {}

    def run():
        result["o"], result["final"] = fn(**args)

    run()
    torch.cuda.synchronize()
    return run, result


def gpu_ms(torch, fn, iters: int, per_kernel: Optional[dict] = None) -> float:
    """Milliseconds of GPU work per call of ``fn`` (kernels, copies and fills, from the profiler's
    device-side records): what the call costs the GPU, whatever its host side costs. ``per_kernel``, when
    given, receives each kernel's milliseconds per call by name."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    if per_kernel is not None:
        per_kernel.update({e.key[:60]: e.self_device_time_total / iters / 1e3 for e in events})
    return sum(e.self_device_time_total for e in events) / iters / 1e3


def alternate(torch, ours_run, fla_run, iters: int, rounds: int):
    """(our median ms, fla's median ms, [(ours, fla) per round]) from ``rounds`` alternating timings;
    fla's side is 0.0 when fla did not run."""
    pairs = []
    for _ in range(max(1, rounds)):
        fla = event_ms(torch, fla_run, iters) if fla_run is not None else 0.0
        pairs.append((event_ms(torch, ours_run, iters), fla))
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs), pairs


def _variant_names(arg: str) -> list:
    if not arg:
        return []
    if arg == "all":
        from cudnn_graph.engines.cutile.engine import VARIANT_KNOBS
        return list(VARIANT_KNOBS)
    return [v for v in arg.split(",") if v]


HEADER = (f"{'op':5} {'variant':16} {'ours fwd ms':>12} {'fla fwd ms':>11} {'ours/fla':>9} {'|o diff|':>10} "
          f"{'first call s':>13} {'ours bwd ms':>12}  kernels ms")


def row_lines(r: dict) -> list:
    """The table line of one row (and its errors)."""
    def fmt(key, spec):
        return format(r[key], spec) if r.get(key) is not None else "-"
    if r.get("ours_gpu_ms") is not None:
        kernels = (f"gpu ms ours {r['ours_gpu_ms']:.3f} fla {fmt('fla_gpu_ms', '.3f')} "
                   f"ratio {fmt('ours_over_fla_gpu', '.2f')}; ")
    else:
        kernels = ""
    kernels += " ".join([f"{k}={v:.3f}" for k, v in r.get("kernels_ms", {}).items()]
                        + [f"bwd:{k}={v:.3f}" for k, v in r.get("ours_bwd_kernels_ms", {}).items()])
    lines = [f"{r['op']:5} {r['variant']:16} {fmt('ours_fwd_ms', '12.3f')} {fmt('fla_fwd_ms', '11.3f')} "
             f"{fmt('ours_over_fla', '9.2f')} {fmt('max_abs_diff_o', '10.2e')} {fmt('ours_first_call_s', '13.1f')}"
             f" {fmt('ours_bwd_ms', '12.3f')}  {kernels}"]
    lines += [f"  {key}: {r[key]}" for key in r if key in ("ours_error", "fla_error")
              or (key.startswith("ours_bwd") and key.endswith("_error"))]
    lines += [f"  {key}: {r[key]:.3f} ms; kernels {r.get(key[:-3] + '_kernels_ms', {})}" for key in r
              if key.startswith("ours_bwd_") and key.endswith("_ms") and not key.endswith("kernels_ms")
              and key != "ours_bwd_ms" and r[key] is not None]
    if r.get("fla_kernels_ms") and r["variant"] == "default":
        lines += [f"  fla {name}: {ms:.3f}" for name, ms in r["fla_kernels_ms"].items()]
    return lines


def main() -> None:
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--ops", default="gdn,kda")
    parser.add_argument("--variants", default="", help="'all' or a comma list of plan variants to time too")
    parser.add_argument("--breakdown", action="store_true", help="time each kernel launch apart")
    parser.add_argument("--backward", action="store_true", help="also time our gdn_bwd / kda_bwd plans")
    parser.add_argument("--backward-variants", default="",
                        help="with --backward, also these backward plans (auto: BF16 products)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating fla / ours timing rounds")
    parser.add_argument("--gpu-time", action="store_true",
                        help="also report each side's GPU time per call (torch profiler), free of host cost")
    args = parser.parse_args()
    rows = []
    for op in args.ops.split(","):
        x = make_inputs(torch, op)
        fla_ms, fla_result, fla_run = None, None, None
        try:
            fla_run, fla_result = fla_call(torch, op, x)
            fla_ms = event_ms(torch, fla_run, args.iters)
        except Exception as exc:               # noqa: BLE001  (report and go on)
            fla_error = f"{type(exc).__name__}: {exc}"
        for variant in [""] + _variant_names(args.variants):
            row = {"op": op, "variant": variant or "default", "T": N_SEQ * SEQ_LEN, "sequences": N_SEQ, "H": H,
                   "K": K, "V": V, "dtype": "bf16", "fla_fwd_ms": fla_ms}
            if fla_ms is None:
                row["fla_error"] = fla_error
            try:
                run, out, final, built, first, compiled = ours(torch, op, x, variant)
                row["ours_fwd_ms"], row["fla_fwd_ms"], row["rounds"] = alternate(torch, run, fla_run, args.iters,
                                                                                 args.rounds)
                if fla_run is None:
                    row["fla_fwd_ms"] = None
                if args.gpu_time:
                    row["ours_gpu_ms"] = gpu_ms(torch, run, args.iters)
                    if fla_run is not None:
                        row["fla_kernels_ms"] = {}
                        row["fla_gpu_ms"] = gpu_ms(torch, fla_run, args.iters, row["fla_kernels_ms"])
                        row["ours_over_fla_gpu"] = row["ours_gpu_ms"] / row["fla_gpu_ms"]
                row["ours_build_s"], row["ours_first_call_s"] = built, first
                if args.breakdown:
                    row["kernels_ms"] = kernel_breakdown(torch, run, compiled, args.iters)
            except Exception as exc:           # noqa: BLE001  (report and go on to the next)
                row["ours_error"] = f"{type(exc).__name__}: {exc}"
                out = final = None
            if out is not None and fla_result is not None:
                row["max_abs_diff_o"] = float((out.float() - fla_result["o"][0].float()).abs().max())
                row["max_abs_diff_final"] = float((final - fla_result["final"].float()).abs().max())
            if row.get("rounds") and fla_run is not None:
                row["ours_over_fla"] = statistics.median(o / f for o, f in row["rounds"])
            row["ours_bwd_ms"] = None
            for bwd_variant in (([""] + _variant_names(args.backward_variants)) if args.backward and not variant
                                else []):
                key = "ours_bwd" + (f"_{bwd_variant}" if bwd_variant else "")
                try:
                    bwd_run, bwd_plan, row[f"{key}_first_call_s"] = ours_backward(torch, op, x, bwd_variant)
                    row[f"{key}_ms"] = event_ms(torch, bwd_run, args.iters)
                    if args.breakdown:
                        row[f"{key}_kernels_ms"] = kernel_breakdown(torch, bwd_run, bwd_plan, args.iters)
                except Exception as exc:       # noqa: BLE001
                    row[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            # each row as soon as it is measured (a run cut short by a timeout still leaves its rows)
            print("\n".join(row_lines(row)), file=sys.stderr, flush=True)
            save(torch, rows)
            del out, final
            torch.cuda.empty_cache()

    print(HEADER)
    for r in rows:
        print("\n".join(row_lines(r)))


def save(torch, rows: list) -> None:
    """Write the rows so far to bench/results/linear_attention-<host>.json (and $OUT/linear_attention.json)."""
    record = {"host": platform.node(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "results"), exist_ok=True)
    paths = [os.path.join(here, "results", f"linear_attention-{platform.node()}.json")]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], "linear_attention.json"))
    for path in paths:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
