"""Scaled dot-product attention: kernel TFLOP/s and host time per execute, ours vs cudnn-frontend vs torch.

Run on a GPU machine with torch and nvidia-cudnn-frontend (``import cudnn``) installed:

    python bench/sdpa.py [--quick]

Kernel: causal bf16 attention b4 h16 s4096 d128, forward (with Stats, as for training) and backward, timed
with CUDA events over a run of back-to-back executes; TFLOP/s counts 4*b*h*s*s*d / 2 for the causal
forward and 2.5x that for the backward (the flash-attention convention). Compared: our plan (this package's
cuDNN backend), cudnn-frontend's plan for the same graph, and torch.nn.functional.scaled_dot_product_attention.

Host time: b1 h8 s128 d64 causal bf16 forward, per execute, as bench/host_overhead.py measures it (median
over bursts of calls issued from a drained queue), for our execute() from torch tensors and from raw
pointers, the C floor (the same cudnnBackendExecute issued from a nogil loop) and cudnn-frontend's
execute(). Prints a table; writes bench/results/sdpa-<host>.json (and $OUT/sdpa.json when OUT is set).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_overhead import burst_us  # noqa: E402  (same burst method as the matmul host benchmark)

BIG = dict(b=4, h=16, s=4096, d=128)
SMALL = dict(b=1, h=8, s=128, d=64)
TORCH_EXPORT_US_PER_OPERAND = 0.1   # torch read through its exchange table (ARCHITECTURE.md)


def causal_fwd_flops(b, h, s, d) -> float:
    return 4.0 * b * h * s * s * d / 2


def event_ms(torch, fn, iters: int, warmup: int = 3) -> float:
    """Mean milliseconds per call of ``fn`` over ``iters`` back-to-back calls, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def bhsd(torch, b, h, s, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)


# ---- ours ----------------------------------------------------------------------------------------------

def ours_forward(cudnn, torch, b, h, s, d):
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0", name="sdpa_fwd")
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q, k, v = (g.tensor(name=n, dim=dims, stride=strides, data_type=F.BFLOAT16) for n in "qkv")
    o, st = g.sdpa(q, k, v, generate_stats=True, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    o.set_output(True)
    st.set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, (q, k, v, o, st)


def ours_backward(cudnn, torch, b, h, s, d):
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0", name="sdpa_bwd")
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q, k, v, o, do = (g.tensor(name=n, dim=dims, stride=strides, data_type=F.BFLOAT16)
                      for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor(name="stats", dim=[b, h, s, 1], stride=[h * s, s, 1, 1], data_type=F.FLOAT)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    for x in (dq, dk, dv):
        x.set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, (q, k, v, o, do, st, dq, dk, dv)


# ---- cudnn-frontend ------------------------------------------------------------------------------------

def frontend_forward(fe, handle, b, h, s, d):
    g = fe.pygraph(io_data_type=fe.data_type.BFLOAT16, intermediate_data_type=fe.data_type.FLOAT,
                   compute_data_type=fe.data_type.FLOAT, handle=handle)
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q, k, v = (g.tensor(name=n, dim=dims, stride=strides, data_type=fe.data_type.BFLOAT16) for n in "qkv")
    try:
        o, st = g.sdpa(q, k, v, generate_stats=True, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    except TypeError:   # releases that predate generate_stats
        o, st = g.sdpa(q, k, v, is_inference=False, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    o.set_output(True).set_dim(dims).set_stride(strides)
    st.set_output(True).set_data_type(fe.data_type.FLOAT)
    g.build([fe.heur_mode.A, fe.heur_mode.FALLBACK])
    return g, (q, k, v, o, st)


def frontend_backward(fe, handle, b, h, s, d):
    g = fe.pygraph(io_data_type=fe.data_type.BFLOAT16, intermediate_data_type=fe.data_type.FLOAT,
                   compute_data_type=fe.data_type.FLOAT, handle=handle)
    dims, strides = [b, h, s, d], [h * s * d, s * d, d, 1]
    q, k, v, o, do = (g.tensor(name=n, dim=dims, stride=strides, data_type=fe.data_type.BFLOAT16)
                      for n in ("q", "k", "v", "o", "dO"))
    st = g.tensor(name="stats", dim=[b, h, s, 1], stride=[h * s, s, 1, 1], data_type=fe.data_type.FLOAT)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    for x in (dq, dk, dv):
        x.set_output(True).set_dim(dims).set_stride(strides)
    g.build([fe.heur_mode.A, fe.heur_mode.FALLBACK])
    return g, (q, k, v, o, do, st, dq, dk, dv)


# ---- the measurements -----------------------------------------------------------------------------------

def kernels(torch, cudnn, fe, handle, iters: int) -> dict:
    b, h, s, d = BIG["b"], BIG["h"], BIG["s"], BIG["d"]
    fwd_tflop = causal_fwd_flops(b, h, s, d) / 1e12
    bwd_tflop = 2.5 * fwd_tflop
    q, k, v, do = (bhsd(torch, b, h, s, d, seed) for seed in (1, 2, 3, 4))
    # zeros, not empty: when our forward fails the backward still reads finite O and Stats
    o = torch.zeros_like(q)
    st = torch.zeros(b, h, s, 1, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    out = {"shape": dict(BIG, causal=True, dtype="bf16"), "fwd_tflop": fwd_tflop, "bwd_tflop": bwd_tflop}

    def record(name, ms, tflop, **extra):
        out[name] = {"ms": ms, "tflops": tflop / (ms / 1e3), **extra}

    # ours: forward, then the backward fed with our forward's O and Stats
    try:
        g, (tq, tk, tv, to, tst) = ours_forward(cudnn, torch, b, h, s, d)
        pack = {tq: q, tk: k, tv: v, to: o, tst: st}
        record("ours_fwd", event_ms(torch, lambda: g.execute(pack), iters), fwd_tflop, plan=g.selected_plan.label)
    except Exception as exc:
        out["ours_fwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        gb, (bq, bk, bv, bo, bdo, bst, bdq, bdk, bdv) = ours_backward(cudnn, torch, b, h, s, d)
        packb = {bq: q, bk: k, bv: v, bo: o, bdo: do, bst: st, bdq: dq, bdk: dk, bdv: dv}
        record("ours_bwd", event_ms(torch, lambda: gb.execute(packb), iters), bwd_tflop,
               plan=gb.selected_plan.label)
    except Exception as exc:
        out["ours_bwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    if fe is not None:
        try:
            fg, (fq, fk, fv, fo, fst) = frontend_forward(fe, handle, b, h, s, d)
            ws = torch.empty(max(1, fg.get_workspace_size()), device="cuda", dtype=torch.uint8)
            fpack = {fq: q, fk: k, fv: v, fo: o, fst: st}
            record("frontend_fwd", event_ms(torch, lambda: fg.execute(fpack, ws, handle=handle), iters), fwd_tflop)
        except Exception as exc:
            out["frontend_fwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        try:
            fb, (xq, xk, xv, xo, xdo, xst, xdq, xdk, xdv) = frontend_backward(fe, handle, b, h, s, d)
            wsb = torch.empty(max(1, fb.get_workspace_size()), device="cuda", dtype=torch.uint8)
            fpackb = {xq: q, xk: k, xv: v, xo: o, xdo: do, xst: st, xdq: dq, xdk: dk, xdv: dv}
            record("frontend_bwd", event_ms(torch, lambda: fb.execute(fpackb, wsb, handle=handle), iters),
                   bwd_tflop)
        except Exception as exc:
            out["frontend_bwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    import torch.nn.functional as tf
    scale = 1.0 / math.sqrt(d)
    try:
        record("torch_fwd", event_ms(torch, lambda: tf.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                    scale=scale), iters),
               fwd_tflop)
    except Exception as exc:
        out["torch_fwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        og = tf.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale)

        def torch_bwd():
            torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)

        record("torch_bwd", event_ms(torch, torch_bwd, iters), bwd_tflop)
    except Exception as exc:
        out["torch_bwd"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def host_time(torch, cudnn, fe, handle, reps: int) -> dict:
    from cudnn_graph import _cudnn_handle, _bench_timing
    b, h, s, d = SMALL["b"], SMALL["h"], SMALL["s"], SMALL["d"]
    sync = torch.cuda.synchronize
    q, k, v = (bhsd(torch, b, h, s, d, seed) for seed in (5, 6, 7))
    o = torch.empty_like(q)
    st = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    out = {"shape": dict(SMALL, causal=True, dtype="bf16")}
    g, (tq, tk, tv, to, tst) = ours_forward(cudnn, torch, b, h, s, d)
    out["plan"] = g.selected_plan.label
    pack_t = {tq: q, tk: k, tv: v, to: o, tst: st}
    pack_i = {t: x.data_ptr() for t, x in pack_t.items()}
    g.execute(pack_t)
    sync()
    replay_default = _cudnn_handle.cuda_graph_replay_enabled()
    for replay, suffix in ((True, ""), (False, " (replay off)")):
        # replay on is the default: a repeated call launches a CUDA graph of its execute
        _cudnn_handle.set_cuda_graph_replay(replay)
        out["ours torch" + suffix] = burst_us(lambda: g.execute(pack_t), sync, reps=reps)
        out["ours raw int" + suffix] = burst_us(lambda: g.execute(pack_i), sync, reps=reps)
    _cudnn_handle.set_cuda_graph_replay(replay_default)
    out["exports torch us"] = TORCH_EXPORT_US_PER_OPERAND * len(pack_t)

    compiled = g.compiled_plan()
    runner, layout = compiled.runner, compiled.layout
    packed = layout.pack(pack_i)
    per = []
    _bench_timing.execute_floor_ns(runner, packed, 100, reuse_variant_pack=True)   # warm-up
    for _ in range(reps):
        sync()
        per.append(_bench_timing.execute_floor_ns(runner, packed, 100, reuse_variant_pack=True))
    sync()
    out["c floor"] = statistics.median(per) / 1e3
    out["cuda graph method"] = runner.cuda_graph_method
    try:
        per = []
        for _ in range(reps):
            sync()
            per.append(_bench_timing.execute_graph_floor_ns(runner, packed, 100))
        sync()
        out["graph launch floor"] = statistics.median(per) / 1e3
    except Exception as exc:      # no graph for this plan: the replay rows are plain executes
        out["graph launch floor"] = f"n/a ({type(exc).__name__}: {str(exc)[:80]})"

    if fe is not None:
        try:
            fg, (fq, fk, fv, fo, fst) = frontend_forward(fe, handle, b, h, s, d)
            ws = torch.empty(max(1, fg.get_workspace_size()), device="cuda", dtype=torch.uint8)
            fpack = {fq: q, fk: k, fv: v, fo: o, fst: st}
            out["frontend torch"] = burst_us(lambda: fg.execute(fpack, ws, handle=handle), sync, reps=reps)
        except Exception as exc:
            out["frontend torch"] = f"n/a ({type(exc).__name__}: {str(exc)[:100]})"
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    iters, reps = (10, 9) if args.quick else (30, 25)

    import torch
    import cudnn_graph as cudnn
    try:
        import cudnn as fe
        handle = fe.create_handle()
        fe_version = fe.__version__
    except Exception as exc:
        fe, handle, fe_version = None, None, f"unavailable: {type(exc).__name__}: {str(exc)[:100]}"

    result = {"host": platform.node(), "gpu": torch.cuda.get_device_name(), "frontend_version": fe_version,
              "torch_version": torch.__version__}
    try:
        result["kernels"] = kern = kernels(torch, cudnn, fe, handle, iters)
    except Exception as exc:   # e.g. out of memory allocating the big shape: still measure host time
        result["kernels"] = kern = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        result["host_time"] = host = host_time(torch, cudnn, fe, handle, reps)
    except Exception as exc:   # our small graph failed: report the kernels anyway
        result["host_time"] = host = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    lines = [f"causal bf16 attention b{BIG['b']} h{BIG['h']} s{BIG['s']} d{BIG['d']}; cudnn-frontend {fe_version}",
             f"{'':<10}{'ours TF/s':>11}{'frontend':>11}{'torch':>11}{'ours/fe':>9}"]
    for phase in ("fwd", "bwd"):
        cells, values = [], {}
        for who in ("ours", "frontend", "torch"):
            entry = kern.get(f"{who}_{phase}", {})
            values[who] = entry.get("tflops")
            cells.append(f"{entry['tflops']:>11.1f}" if "tflops" in entry else f"{'n/a':>11}")
        ratio = f"{values['ours'] / values['frontend']:>9.3f}" if values["ours"] and values["frontend"] else f"{'-':>9}"
        lines.append(f"{phase:<10}{''.join(cells)}{ratio}   (target ours/fe >= 0.98)")
        for who in ("ours", "frontend"):
            if "error" in kern.get(f"{who}_{phase}", {}):
                lines.append(f"  {who} {phase}: {kern[f'{who}_{phase}']['error']}")
    if "error" in host:
        lines.append(f"host time: {host['error']}")
    else:
        floor = host["c floor"]
        launch = host.get("graph launch floor")
        launch = f"{launch:.2f}" if isinstance(launch, float) else launch
        lines.append(f"host us per execute, b{SMALL['b']} h{SMALL['h']} s{SMALL['s']} d{SMALL['d']} causal, "
                     f"plan {host['plan']}: C floor {floor:.2f} (cudnnBackendExecute); graph launch floor "
                     f"{launch} (graphs by {host.get('cuda graph method')}); rows without a suffix replay "
                     f"graphs (the default)")
        fe_us = host.get("frontend torch")
        for name in ("ours torch", "ours raw int", "ours torch (replay off)", "ours raw int (replay off)"):
            us = host[name]
            bound = floor + (host["exports torch us"] if name.startswith("ours torch") else 0.0) + 1.0
            vs_fe = f"{us / fe_us:.2f}x frontend (target <= 0.6)" if isinstance(fe_us, float) else ""
            lines.append(f"  {name:<26}{us:>8.2f} us  (target <= {bound:.2f})  {vs_fe}")
        lines.append(f"  {'frontend torch':<14}{fe_us:>8.2f} us" if isinstance(fe_us, float)
                     else f"  frontend: {fe_us}")
    if "error" in kern:
        lines.append(f"kernels: {kern['error']}")
    print("\n".join(lines))

    here = os.path.dirname(os.path.abspath(__file__))
    targets = [os.path.join(here, "results", f"sdpa-{platform.node()}.json")]
    if os.environ.get("OUT"):
        targets.append(os.path.join(os.environ["OUT"], "sdpa.json"))
    for path in targets:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=2, default=str)
        except OSError as exc:
            print(f"could not write {path}: {exc}")
    return result


if __name__ == "__main__":
    main()
