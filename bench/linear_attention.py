"""Linear attention (delta rule): the cuTile engine vs flash-linear-attention (fla-core 0.6, Triton), GPU time.

Run on a GPU machine with torch, fla-core, cuda-tile and a tileiras compiler:

    python bench/linear_attention.py [--ops gdn,kda] [--shapes NAME,...] [--full] [--iters 20]

By default every row reports, for ours and fla side by side, the GPU time per call (torch profiler,
device-side records: the kernels alone, free of either side's host cost) in total and per kernel, forward
and backward (fla's backward through torch autograd of its chunk function; a failure is reported as the
row's ``fla_bwd_error``), our backward over our forward, and the forward's max |difference| from fla.
The targets of issue 25 are printed beside each row: forward GPU time <= 0.8x fla's, backward <= 3x our
forward.

Shapes (``SHAPES``; varlen THD with ``cu_seqlens``; L2-normalised q/k, f32 gates, initial state in and
final state out): 4 x 2048 at H = 16, 2 x 8192 at H = 32, 32 short sequences of 64-512 tokens at H = 16 and
one sequence of 32768 at H = 16. The default cases are each shape at bf16, K = V = 128, plus fp16 and
K = V = 64 on the first shape; ``--full`` runs every shape at bf16 and fp16, K = V = 64 and 128. A row is
printed (stderr) and saved as soon as it is measured; the table follows on stdout, then one line per issue-25
target (the first-ranked rows meeting it, and each one over it); the JSON goes to
bench/results/linear_attention-<host>.json (and $OUT/linear_attention.json when OUT is set).

    --per-call          also the wall time per call of each forward (CUDA events around back-to-back calls, in
                        --rounds alternating rounds), which includes each side's host cost
    --variants all | NAME,NAME   also time the engine's other forward plans (knob sets: engines/cutile/engine.py
                                 VARIANT_KNOBS, and "cutile": the plain default with the cuTile chunk_prepare;
                                 each compiles at its first call, tens of seconds). The default row runs the
                                 plan the engine ranks first (the CuTe chunk_prepare's for gdn on sm_90).
    --bwd-variants NAME,NAME   also time these backward plans (cutile_<op>_bwd_chunk64_<NAME>: auto,
                                 cute_prepare, cute_intra; "cutile": the plain TF32 default) in the default
                                 row, whose own backward runs the plan the engine ranks first (bwd_plan);
                                 with the training pair, each from the forward's checkpoints too
    --breakdown         time each kernel launch of our plans apart with CUDA events around each launch
    --no-backward       forward only
    --no-fla-backward   our backward only (fla's refuses to run on Hopper with Triton < 3.7.1, after ~45 s of
                        compiles a row)
    --no-fla            no fla at all: our plans against each other (fla's forward autotunes 15-70 s a row)
    --no-checkpoints    skip the training pair: our forward writing state_checkpoints (checkpoint_every_n_tokens
                        = 64) and our backward starting from them (no state pass), its bwd/fwd and fwd + bwd;
                        for gdn and kda also the pair with the chunk_cache (the backward runs no prepare)
    --cases OP:SHAPE:DTYPE:DIM,...   exactly these rows (e.g. gdn:4x2048_h16:bf16:128), instead of --ops /
                                 --shapes / --full
    --resume PATH       keep the rows an earlier run on this GPU model saved at PATH and measure only the others,
                        saving every row there too: a table larger than one call's time limit is finished by
                        running the same command again

Each row also records the wall seconds each measurement took (``wall_s``: fla's autotuning and compiles, our
plans' builds), to plan a run within a time limit. fla's autotune results are kept in Triton's disk cache
(``TRITON_CACHE_AUTOTUNING=1`` unless the environment sets it): a later run on the machine, or one handed the
same ``TRITON_CACHE_DIR``, reuses fla's choices instead of timing every configuration again (15-70 s a row).
Keep one cache directory per GPU model: the choices are that device's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa import event_ms  # noqa: E402  (one CUDA-event timer for the benchmarks)

FWD_TARGET = 0.8        # issue 25: forward GPU time <= 0.8x fla's
BWD_TARGET = 3.0        # issue 25: backward <= 3x our forward
CHECKPOINT_EVERY = 64   # the training pair's cadence: the GPU kernels' chunk (one state a 64-token chunk)


def _short_lengths(count: int = 32, low: int = 64, high: int = 512, seed: int = 7) -> list:
    """``count`` sequence lengths in [low, high], the same every run."""
    import random
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


SHAPES = {
    "4x2048_h16": ([2048] * 4, 16),
    "2x8192_h32": ([8192] * 2, 32),
    "short_h16": (_short_lengths(), 16),
    "1x32768_h16": ([32768], 16),
}


@dataclass(frozen=True)
class Case:
    op: str             # gdn | kda
    shape: str          # a key of SHAPES
    dtype: str          # bf16 | fp16
    head_dim: int       # K = V

    @property
    def lengths(self) -> list:
        return SHAPES[self.shape][0]

    @property
    def heads(self) -> int:
        return SHAPES[self.shape][1]

    def row_key(self, variant: str = "") -> tuple:
        """The key of this case's row for ``variant`` (``row_key`` of the row measure_case makes)."""
        return (self.op, self.shape, self.dtype, self.head_dim, variant or "default")


def row_key(row: dict) -> tuple:
    """A measured row's identity: op, shape, type, K = V and plan variant (``Case.row_key``)."""
    return (row["op"], row["shape"], row["dtype"], row["K"], row["variant"])


def resumed_rows(path: str, gpu: str) -> list:
    """``--resume``: the rows an earlier run saved at ``path`` (none where there is no such file yet), which this
    run keeps instead of measuring them again. Rows of another GPU model would make a table of two machines:
    ValueError naming both."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        record = json.load(f)
    if record.get("gpu") != gpu:
        raise ValueError(f"--resume {path}: its rows were measured on {record.get('gpu')!r}, this GPU is {gpu!r}")
    return list(record.get("rows", []))


def parse_cases(text: str) -> list:
    """``--cases``: OP:SHAPE:DTYPE:DIM rows, comma-separated (ValueError naming a malformed one).

    >>> parse_cases("gdn:4x2048_h16:bf16:128")
    [Case(op='gdn', shape='4x2048_h16', dtype='bf16', head_dim=128)]
    """
    out = []
    for item in (c for c in text.split(",") if c):
        parts = item.split(":")
        if len(parts) != 4 or parts[0] not in ("gdn", "kda") or parts[1] not in SHAPES \
                or parts[2] not in ("bf16", "fp16") or parts[3] not in ("64", "128"):
            raise ValueError(f"case {item!r}: expected OP:SHAPE:DTYPE:DIM with OP gdn or kda, SHAPE one of "
                             f"{', '.join(SHAPES)}, DTYPE bf16 or fp16, DIM 64 or 128")
        out.append(Case(parts[0], parts[1], parts[2], int(parts[3])))
    return out


def cases(ops: list, shapes: list, full: bool) -> list:
    """The cases to run: see the module docstring."""
    if full:
        return [Case(op, s, dt, d) for op in ops for s in shapes for dt in ("bf16", "fp16") for d in (128, 64)]
    out = [Case(op, s, "bf16", 128) for op in ops for s in shapes]
    first = shapes[0]
    out += [Case(op, first, "fp16", 128) for op in ops] + [Case(op, first, "bf16", 64) for op in ops]
    return sorted(out, key=lambda c: (c.op, list(SHAPES).index(c.shape), c.dtype, -c.head_dim))


def _torch_dtype(torch, name: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(torch, case: Case, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths, H, K = case.lengths, case.heads, case.head_dim
    T, V, dev, io = sum(lengths), case.head_dim, "cuda", _torch_dtype(torch, case.dtype)

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=gen)

    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    gate_shape = (T, H, K) if case.op == "kda" else (T, H)
    return {
        "q": randn(T, H, K).to(io), "k": randn(T, H, K).to(io), "v": randn(T, H, V).to(io),
        "g": torch.nn.functional.logsigmoid(randn(*gate_shape)).float() / 4,
        "beta": torch.rand(T, H, device=dev, generator=gen).to(io),
        "cu_seqlens": torch.tensor(cu, device=dev, dtype=torch.int32),
        "initial_state": randn(len(lengths), H, K, V).float() * 0.1,
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


def _graph_types(torch, cudnn, x: dict) -> dict:
    """The cudnn data type of each input of ``x`` (float32, int32, the q/k/v type or a chunk cache's uint8)."""
    F = cudnn.data_type
    by_torch = {torch.float32: F.FLOAT, torch.int32: F.INT32, torch.bfloat16: F.BFLOAT16, torch.float16: F.HALF,
                torch.uint8: F.UINT8}
    return {name: by_torch[a.dtype] for name, a in x.items()}


def ours(torch, op: str, x: dict, variant: str = "", checkpoints: bool = False, chunk_cache: bool = False):
    """(run, o, final_state, build seconds, first-call seconds, compiled plan, kept) for our plan on ``x``: the
    engine's first-ranked one for ``variant`` '', else the cuTile engine's variant ``variant`` ("cutile": its
    plain default, the cuTile chunk_prepare). ``checkpoints``: the forward also writes the state at each 64-token
    chunk's start (checkpoint_every_n_tokens=64, in the input type); ``chunk_cache`` (gdn): and its per-chunk
    factors; ``kept`` names those buffers ({} without), which ``ours_backward`` then starts from."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    name = None if not variant else f"cutile_{op}_chunk64" + ("" if variant == "cutile" else f"_{variant}")
    if "_seg" in variant:
        # a segmented variant named to be timed: proposed even before its GPU tests have passed
        from cudnn_graph.engines.cutile import engine as cutile_engine
        cutile_engine.SEGMENTS_GPU_TESTED = True
    types = _graph_types(torch, cudnn, x)
    g = cudnn.pygraph(io_data_type=types["q"], compute_data_type=F.FLOAT, device="cuda",
                      router=_Prefer(name) if name else None)
    t = {name: g.tensor(name=name, dim=list(a.shape), stride=list(a.stride()), data_type=types[name])
         for name, a in x.items()}
    cache = g.tensor(name="chunk_cache") if chunk_cache else None
    o, fs, ckpt = getattr(g, op)(t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=t["cu_seqlens"],
                                 initial_state=t["initial_state"], output_final_state=True, use_qk_l2norm=True,
                                 checkpoint_every_n_tokens=CHECKPOINT_EVERY if checkpoints else 0,
                                 **({"chunk_cache": cache} if chunk_cache else {}))
    o.set_output(True)
    fs.set_output(True)
    for kept_tensor in (ckpt, cache):
        if kept_tensor is not None:
            kept_tensor.set_output(True)
    began = time.perf_counter()
    g.build([cudnn.heur_mode.A])
    built = time.perf_counter() - began
    if name and g.selected_plan.label != name:
        raise RuntimeError(f"plan {name} was not selected: {g.selected_plan} (declines: {g.declines})")
    out = torch.empty_like(x["v"])
    final = torch.empty_like(x["initial_state"])
    pack = {t[name]: a for name, a in x.items()}
    pack.update({o: out, fs: final})
    kept = {}
    if ckpt is not None:
        kept["state_checkpoints"] = pack[ckpt] = torch.empty(list(ckpt.dim), device="cuda", dtype=x["q"].dtype)
    if cache is not None:
        kept["chunk_cache"] = pack[cache] = torch.empty(list(cache.dim), device="cuda", dtype=torch.uint8)
    run, began = _started_runner(torch, g, pack)
    first = time.perf_counter() - began
    compiled = g.compiled_plan()
    return run, out, final, built, first, compiled, kept


def backward_seeds(torch, x: dict) -> dict:
    """dO and d_final_state for ``x`` (the same for ours and fla)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    return {"dO": torch.randn(*x["v"].shape, device="cuda", generator=gen).to(x["v"].dtype),
            "d_final_state": torch.randn(*x["initial_state"].shape, device="cuda", generator=gen)}


def ours_backward(torch, op: str, x: dict, variant: str = "", kept=None):
    """(run, compiled plan, first-call seconds) for our {op}_bwd plan on ``x`` plus backward_seeds: the
    engine's first-ranked one for ``variant`` '', else the cuTile engine's variant ``variant`` ("cutile": its
    plain TF32 default). ``kept``: the forward's state_checkpoints and chunk_cache (``ours(checkpoints=True)``),
    which the backward starts from instead of recomputing the states (and the per-chunk factors)."""
    import cudnn_graph as cudnn
    F = cudnn.data_type
    x = dict(x, **backward_seeds(torch, x), **(kept or {}))
    given = {"checkpoint_every_n_tokens": CHECKPOINT_EVERY} if kept else {}
    name = None if not variant else f"cutile_{op}_bwd_chunk64" + ("" if variant == "cutile" else f"_{variant}")
    gates = {"_overlap": "OVERLAP_GPU_TESTED", "_rev16": "REVERSE_NARROW_GPU_TESTED",
             "_seg": "BACKWARD_SEGMENTS_GPU_TESTED"}
    if any(part in variant for part in gates):
        # an overlapping or segmented backward, or one with the narrow reverse pass, named to be timed: proposed
        # even before its GPU tests have passed
        from cudnn_graph.engines.cutile import _backward
        for part, gate in gates.items():
            if part in variant:
                setattr(_backward, gate, True)
    types = _graph_types(torch, cudnn, x)
    g = cudnn.pygraph(io_data_type=types["q"], compute_data_type=F.FLOAT, device="cuda",
                      router=_Prefer(name) if name else None)
    t = {name: g.tensor(name=name, dim=list(a.shape), stride=list(a.stride()), data_type=types[name])
         for name, a in x.items()}
    given.update({name: t[name] for name in (kept or {})})
    outs = getattr(g, f"{op}_bwd")(t["q"], t["k"], t["v"], t["g"], t["beta"], t["dO"], cu_seqlens=t["cu_seqlens"],
                                   initial_state=t["initial_state"], d_final_state=t["d_final_state"],
                                   use_qk_l2norm=True, **given)
    outs = [tensor for tensor in outs if tensor is not None]
    for tensor in outs:
        tensor.set_output(True)
    g.build([cudnn.heur_mode.A])
    if name and g.selected_plan.label != name:
        raise RuntimeError(f"plan {name} was not selected: {g.selected_plan} ({g.declines})")
    pack = {t[name]: a for name, a in x.items()}
    for tensor in outs:
        dtype = torch.float32 if g.view.data_type(tensor) == F.FLOAT else x["q"].dtype
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


def _fla_function(op: str):
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from fla.ops.kda import chunk_kda as fn
    return fn


def _fla_arguments(x: dict) -> dict:
    return dict(q=x["q"][None], k=x["k"][None], v=x["v"][None], g=x["g"][None], beta=x["beta"][None],
                initial_state=x["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                cu_seqlens=x["cu_seqlens"].long())


def fla_call(torch, op: str, x: dict):
    """(run, o, final_state) for fla's chunk kernel on the same inputs ([1, T, ...] with cu_seqlens)."""
    fn, args, result = _fla_function(op), _fla_arguments(x), {}

    def run():
        result["o"], result["final"] = fn(**args)

    run()
    torch.cuda.synchronize()
    return run, result


def fla_backward(torch, op: str, x: dict):
    """``run`` computing fla's gradients (torch autograd through its chunk function, the graph kept) of
    q, k, v, g, beta and the initial state for backward_seeds: its backward kernels alone per call."""
    fn = _fla_function(op)
    seeds = backward_seeds(torch, x)
    leaves = {name: x[name].detach().clone().requires_grad_(True)
              for name in ("q", "k", "v", "g", "beta", "initial_state")}
    o, final = fn(**_fla_arguments(dict(x, **leaves)))
    inputs = list(leaves.values())

    def run():
        torch.autograd.grad((o, final), inputs, (seeds["dO"][None], seeds["d_final_state"]), retain_graph=True)

    run()
    torch.cuda.synchronize()
    return run


# the CuTe DSL's kernel names start with the module path: dropped, so that the class names tell kernels apart
_CUTE_PREFIX = "kernel_cutlass_kernel_cudnn_graphenginescute_"


def kernel_label(key: str) -> str:
    """A kernel's name as the per-kernel tables give it: the first 60 characters, past the CuTe prefix."""
    return ("cute_" + key[len(_CUTE_PREFIX):] if key.startswith(_CUTE_PREFIX) else key)[:60]


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
        for e in events:
            name = kernel_label(e.key)
            per_kernel[name] = per_kernel.get(name, 0.0) + e.self_device_time_total / iters / 1e3
    return sum(e.self_device_time_total for e in events) / iters / 1e3


def gpu_span_ms(torch, fn, iters: int, rounds: int = 3) -> float:
    """Milliseconds the GPU spends on one call of ``fn`` from its first kernel's start to its last one's end:
    CUDA events around the call, queued behind a sleep kernel so that the host's launches are all queued
    before the GPU reaches them (the best of ``rounds`` means). What a plan whose kernels overlap (a
    segmented forward: engines/cutile/_segments) costs the GPU, where the profiler's per-kernel times add
    up the overlapping stretches twice."""
    best = float("inf")
    for _ in range(max(1, rounds)):
        fn()
        torch.cuda.synchronize()
        total = 0.0
        for _ in range(iters):
            torch.cuda._sleep(20_000_000)     # some 10 ms: far more than any call's launches take the host
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            total += start.elapsed_time(stop)
        best = min(best, total / iters)
    return best


def _overlaps(compiled) -> bool:
    """Whether a plan's kernels run on more than one stream (a segmented forward, an overlapping backward)."""
    variant = getattr(compiled, "variant", None)
    return bool(getattr(variant, "segments", 0) or getattr(variant, "overlap", False))


def ours_gpu_ms(torch, run, compiled, iters: int, row: dict, key: str) -> None:
    """Our plan's GPU milliseconds a call into ``row``: ``{key}_kernels_gpu_ms`` (per kernel, the profiler's) and
    ``{key}_gpu_ms``, the kernels' sum, or where they overlap the GPU's span of a call (the sum then kept as
    ``{key}_kernel_sum_gpu_ms``, the span also as ``{key}_span_gpu_ms``)."""
    row[f"{key}_kernels_gpu_ms"] = {}
    row[f"{key}_gpu_ms"] = gpu_ms(torch, run, iters, row[f"{key}_kernels_gpu_ms"])
    if _overlaps(compiled):
        row[f"{key}_kernel_sum_gpu_ms"] = row[f"{key}_gpu_ms"]
        row[f"{key}_gpu_ms"] = row[f"{key}_span_gpu_ms"] = gpu_span_ms(torch, run, iters)


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
        return ["cutile", *VARIANT_KNOBS]
    return [v for v in arg.split(",") if v]


HEADER = (f"{'op':4} {'shape':12} {'type':4} {'K=V':>4} {'variant':12} {'ours fwd':>9} {'fla fwd':>9} {'ratio':>6} "
          f"{'<=0.8':>5} {'ours bwd':>9} {'fla bwd':>9} {'bwd/fwd':>7} {'<=3':>4} {'|o diff|':>9}")


def _fmt(r: dict, key: str, spec: str) -> str:
    """``r[key]`` formatted by ``spec``; a missing value is a dash of the same width."""
    return format(r[key], spec) if r.get(key) is not None else format("-", ">" + spec.split(".")[0])


def _met(value: Optional[float], target: float) -> str:
    return "-" if value is None else ("yes" if value <= target else "NO")


def row_lines(r: dict) -> list:
    """The table line of one row (GPU milliseconds per call), then its kernels and errors."""
    line = (f"{r['op']:4} {r['shape']:12} {r['dtype']:4} {r['K']:>4} {r['variant']:12} "
            f"{_fmt(r, 'ours_gpu_ms', '9.3f')} {_fmt(r, 'fla_gpu_ms', '9.3f')} {_fmt(r, 'ours_over_fla_gpu', '6.2f')} "
            f"{_met(r.get('ours_over_fla_gpu'), FWD_TARGET):>5} {_fmt(r, 'ours_bwd_gpu_ms', '9.3f')} "
            f"{_fmt(r, 'fla_bwd_gpu_ms', '9.3f')} {_fmt(r, 'bwd_over_fwd', '7.2f')} "
            f"{_met(r.get('bwd_over_fwd'), BWD_TARGET):>4} {_fmt(r, 'max_abs_diff_o', '9.2e')}")
    lines = [line]
    for side in ("ours", "fla", "ours_bwd", "fla_bwd"):
        kernels = r.get(f"{side}_kernels_gpu_ms")
        if kernels:
            lines.append(f"  {side} kernels: " + ", ".join(f"{k} {v:.3f}" for k, v in kernels.items()))
    plain = (r.get("ours_gpu_ms") or 0.0) + (r.get("ours_bwd_gpu_ms") or 0.0)
    for key, what in (("ckpt", f"state_checkpoints (n = {CHECKPOINT_EVERY})"),
                      ("cache", "state_checkpoints and chunk_cache")):
        if r.get(f"ours_{key}_bwd_gpu_ms") is None:
            continue
        fwd, bwd, ratio = r[f"ours_{key}_gpu_ms"], r[f"ours_{key}_bwd_gpu_ms"], r[f"{key}_bwd_over_fwd"]
        lines.append(f"  with {what}: forward {fwd:.3f}, backward {bwd:.3f}, bwd/fwd {ratio:.2f} (<= {BWD_TARGET:g}: "
                     f"{_met(ratio, BWD_TARGET)}); forward + backward {fwd + bwd:.3f} against {plain:.3f} recomputing")
        for side in (f"ours_{key}", f"ours_{key}_bwd"):
            kernels = r.get(f"{side}_kernels_gpu_ms")
            if kernels:
                lines.append(f"  {side} kernels: " + ", ".join(f"{k} {v:.3f}" for k, v in kernels.items()))
    for key in [k for k in r if k.endswith("_span_gpu_ms")]:
        side = key[:-len("_span_gpu_ms")]
        lines.append(f"  {side} is the GPU's span of a call (its kernels overlap): {r[key]:.3f}; its kernels' times "
                     f"add up to {r[side + '_kernel_sum_gpu_ms']:.3f}")
    if r.get("ours_fwd_ms") is not None:
        lines.append(f"  per call (events, host included): ours {r['ours_fwd_ms']:.3f} "
                     f"fla {_fmt(r, 'fla_fwd_ms', '.3f')}")
    if r.get("kernels_ms"):
        lines.append("  our launches (events): " + ", ".join(f"{k} {v:.3f}" for k, v in r["kernels_ms"].items()))
    for key in r:
        for prefix, what in (("ours_bwd_", "backward plan"), ("ours_ckpt_bwd_", "backward from the checkpoints, plan")):
            if key.startswith(prefix) and key.endswith("_gpu_ms") and key != f"{prefix}gpu_ms" \
                    and not key.endswith(("kernels_gpu_ms", "_span_gpu_ms", "_kernel_sum_gpu_ms")):
                kernels = r.get(key.replace("_gpu_ms", "_kernels_gpu_ms")) or {}
                lines.append(f"  {what} {key[len(prefix):-len('_gpu_ms')]}: {r[key]:.3f} ("
                             + ", ".join(f"{k} {v:.3f}" for k, v in kernels.items()) + ")")
    lines += [f"  {key}: {r[key]}" for key in r if key.endswith("_error")]
    if r.get("wall_s"):
        lines.append("  wall seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in r["wall_s"].items()))
    return lines


# issue 25's ratios: (the row's key, what it compares, its target)
TARGETS = (("ours_over_fla_gpu", "forward <= 0.8x fla's", FWD_TARGET),
           ("bwd_over_fwd", "backward <= 3x our forward, recomputing", BWD_TARGET),
           ("ckpt_bwd_over_fwd", "from the checkpoints", BWD_TARGET),
           ("cache_bwd_over_fwd", "from the chunk cache", BWD_TARGET))


def target_lines(rows: list) -> list:
    """One line per issue-25 target over the rows of the plan ranked first (variant rows are our plans against
    each other): how many met it, and each row that did not, with its ratio.

    >>> target_lines([{"op": "gdn", "shape": "s", "dtype": "bf16", "K": 64, "variant": "default",
    ...                "ours_over_fla_gpu": 0.82}])[0]
    "forward <= 0.8x fla's: 0 of 1 rows; over: gdn s bf16 64 (0.820)"
    """
    lines = []
    ranked_first = [r for r in rows if r.get("variant") == "default"]
    for key, what, target in TARGETS:
        measured = [r for r in ranked_first if r.get(key) is not None]
        if not measured:
            continue
        over = [f"{r['op']} {r['shape']} {r['dtype']} {r['K']} ({r[key]:.3f})" for r in measured if r[key] > target]
        lines.append(f"{what}: {len(measured) - len(over)} of {len(measured)} rows"
                     + (f"; over: {', '.join(over)}" if over else ""))
    return lines


def _measure(what: str, row: dict, fn) -> None:
    """Run ``fn(row)``; an exception becomes ``row[what + '_error']`` (the other measurements go on). Its wall
    seconds go to ``row['wall_s'][what]``."""
    began = time.perf_counter()
    try:
        fn(row)
    except Exception as exc:                   # noqa: BLE001  (report and go on)
        row[f"{what}_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    finally:
        row.setdefault("wall_s", {})[what] = round(time.perf_counter() - began, 1)


def measure_case(torch, case: Case, args, variant: str = "") -> dict:
    """One row: GPU time per call (total and per kernel) of ours and fla, forward and backward."""
    x = make_inputs(torch, case)
    row = {"op": case.op, "shape": case.shape, "variant": variant or "default", "T": sum(case.lengths),
           "sequences": len(case.lengths), "H": case.heads, "K": case.head_dim, "V": case.head_dim,
           "dtype": case.dtype}
    state = {}

    def fla_forward(r):
        state["fla_run"], state["fla"] = fla_call(torch, case.op, x)
        r["fla_kernels_gpu_ms"] = {}
        r["fla_gpu_ms"] = gpu_ms(torch, state["fla_run"], args.iters, r["fla_kernels_gpu_ms"])

    def our_forward(r):
        run, out, final, r["ours_build_s"], r["ours_first_call_s"], compiled, _ = ours(torch, case.op, x, variant)
        r["plan"] = compiled.plan.label
        state["run"] = run
        ours_gpu_ms(torch, run, compiled, args.iters, r, "ours")
        if "fla" in state:
            r["max_abs_diff_o"] = float((out.float() - state["fla"]["o"][0].float()).abs().max())
            r["max_abs_diff_final"] = float((final - state["fla"]["final"].float()).abs().max())
        if args.per_call:
            r["ours_fwd_ms"], r["fla_fwd_ms"], r["rounds"] = alternate(torch, run, state.get("fla_run"),
                                                                       args.iters, args.rounds)
        if args.breakdown:
            r["kernels_ms"] = kernel_breakdown(torch, run, compiled, args.iters)

    def our_backward(r):
        run, compiled, r["ours_bwd_first_call_s"] = ours_backward(torch, case.op, x)
        r["bwd_plan"] = compiled.plan.label
        ours_gpu_ms(torch, run, compiled, args.iters, r, "ours_bwd")

    def our_backward_variant(name):
        def measure(r):
            run, compiled, _ = ours_backward(torch, case.op, x, name)
            ours_gpu_ms(torch, run, compiled, args.iters, r, f"ours_bwd_{name}")
        return measure

    def measure_pair(r, key: str, **kept) -> dict:
        # our forward keeping what its backward starts from, then that backward: the row's ``key`` fields
        run, _, _, _, _, compiled, saved = ours(torch, case.op, x, checkpoints=True, **kept)
        r[f"{key}_plan"] = compiled.plan.label
        r[f"ours_{key}_kernels_gpu_ms"] = {}
        r[f"ours_{key}_gpu_ms"] = gpu_ms(torch, run, args.iters, r[f"ours_{key}_kernels_gpu_ms"])
        run, compiled, _ = ours_backward(torch, case.op, x, kept=saved)
        r[f"{key}_bwd_plan"] = compiled.plan.label
        r[f"ours_{key}_bwd_kernels_gpu_ms"] = {}
        r[f"ours_{key}_bwd_gpu_ms"] = gpu_ms(torch, run, args.iters, r[f"ours_{key}_bwd_kernels_gpu_ms"])
        r[f"{key}_bwd_over_fwd"] = r[f"ours_{key}_bwd_gpu_ms"] / r[f"ours_{key}_gpu_ms"]
        return saved

    def training_pair(r):
        # the forward that keeps its chunk-start states (state_checkpoints) and the backward that starts there
        states = measure_pair(r, "ckpt")
        for name in _variant_names(args.bwd_variants):
            # the backward variants from the same checkpoints (one failing leaves the others' rows)
            def from_checkpoints(r, name=name):
                variant_run, _, _ = ours_backward(torch, case.op, x, name, kept=states)
                r[f"ours_ckpt_bwd_{name}_kernels_gpu_ms"] = {}
                r[f"ours_ckpt_bwd_{name}_gpu_ms"] = gpu_ms(torch, variant_run, args.iters,
                                                           r[f"ours_ckpt_bwd_{name}_kernels_gpu_ms"])
            _measure(f"ours_ckpt_bwd_{name}", r, from_checkpoints)

    def cached_pair(r):
        # the forward that keeps its chunk cache too, and the backward that reads it instead of a prepare
        measure_pair(r, "cache", chunk_cache=True)

    def fla_bwd(r):
        r["fla_bwd_kernels_gpu_ms"] = {}
        r["fla_bwd_gpu_ms"] = gpu_ms(torch, fla_backward(torch, case.op, x), args.iters, r["fla_bwd_kernels_gpu_ms"])

    if not variant and args.fla:
        _measure("fla", row, fla_forward)
    _measure("ours", row, our_forward)
    if args.backward and not variant:
        _measure("ours_bwd", row, our_backward)
        for name in _variant_names(args.bwd_variants):
            _measure(f"ours_bwd_{name}", row, our_backward_variant(name))
        if args.checkpoints:
            _measure("ours_ckpt", row, training_pair)
            if case.op in ("gdn", "kda"):
                _measure("ours_cache", row, cached_pair)
        if args.fla_backward and args.fla:
            _measure("fla_bwd", row, fla_bwd)
    if row.get("ours_gpu_ms") and row.get("fla_gpu_ms"):
        row["ours_over_fla_gpu"] = row["ours_gpu_ms"] / row["fla_gpu_ms"]
    if row.get("ours_gpu_ms") and row.get("ours_bwd_gpu_ms"):
        row["bwd_over_fwd"] = row["ours_bwd_gpu_ms"] / row["ours_gpu_ms"]
    state.clear()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> None:
    # before fla is imported: its autotuners read the setting when they are created
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ops", default="gdn,kda")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"a comma list of {', '.join(SHAPES)}")
    parser.add_argument("--full", action="store_true", help="every shape at bf16 and fp16, K = V = 64 and 128")
    parser.add_argument("--variants", default="", help="'all' or a comma list of forward plan variants to time too")
    parser.add_argument("--breakdown", action="store_true", help="time each kernel launch of ours apart (events)")
    parser.add_argument("--per-call", action="store_true", help="also the wall time per forward call (events)")
    parser.add_argument("--rounds", type=int, default=5, help="with --per-call: alternating fla / ours rounds")
    parser.add_argument("--no-backward", dest="backward", action="store_false", help="forward only")
    parser.add_argument("--no-fla", dest="fla", action="store_false",
                        help="no fla at all (our plans against each other; fla's forward autotunes ~15-70 s a row)")
    parser.add_argument("--no-fla-backward", dest="fla_backward", action="store_false",
                        help="skip fla's backward (it refuses Hopper with Triton < 3.7.1, after its compiles)")
    parser.add_argument("--bwd-variants", default="", help="a comma list of backward plan variants to time too "
                        "(cutile_<op>_bwd_chunk64_<variant>: auto, cute_prepare, cute_intra; cutile: the TF32 default)")
    parser.add_argument("--no-checkpoints", dest="checkpoints", action="store_false",
                        help="skip the training pair (the forward with state_checkpoints, the backward from them)")
    parser.add_argument("--cases", default="", help="exactly these rows: OP:SHAPE:DTYPE:DIM,... "
                        "(e.g. gdn:4x2048_h16:bf16:128)")
    parser.add_argument("--resume", default="", metavar="PATH",
                        help="keep the rows saved at PATH by an earlier run on this GPU model (a run a time limit "
                        "cut short) instead of measuring them again, and save every row there too")
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    try:
        picked = parse_cases(args.cases) if args.cases else cases([op for op in args.ops.split(",") if op], shapes,
                                                                 args.full)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        rows = resumed_rows(args.resume, torch.cuda.get_device_name()) if args.resume else []
    except ValueError as exc:
        parser.error(str(exc))
    kept = {row_key(r) for r in rows}
    for case in picked:
        for variant in [""] + _variant_names(args.variants):
            key = case.row_key(variant)
            if key in kept:
                print(f"{' '.join(map(str, key))}: kept from {args.resume}", file=sys.stderr)
                continue
            row = measure_case(torch, case, args, variant)
            rows.append(row)
            # each row as soon as it is measured (a run cut short by a timeout still leaves its rows)
            print("\n".join(row_lines(row)), file=sys.stderr, flush=True)
            save(torch, rows, args.resume)
    print("GPU milliseconds per call (torch profiler, kernels alone; a plan whose kernels overlap: the GPU's span "
          "of a call); ratio = ours / fla forward; bwd/fwd = our backward / our forward")
    print(HEADER)
    for r in rows:
        print("\n".join(row_lines(r)))
    print("\n".join(target_lines(rows)))


def save(torch, rows: list, resume_path: str = "") -> None:
    """Write the rows so far to bench/results/linear_attention-<host>.json (and $OUT/linear_attention.json, and
    ``resume_path`` where --resume names one)."""
    record = {"host": platform.node(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "results"), exist_ok=True)
    paths = [os.path.join(here, "results", f"linear_attention-{platform.node()}.json")]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], "linear_attention.json"))
    if resume_path:
        paths.append(resume_path)
    for path in paths:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
