"""GPU time of gdn's CuTe chunk_prepare in its two forms, the same process and buffers: k, q and v read in
four global round trips one after another, or issued by cp.async at the chunk's start (``prefetch``).

Each form's launches are captured 40 at a time in a CUDA graph (the DSL launch's host time would otherwise
show between launches) and replayed in alternating rounds between CUDA events; the table gives each form's
fastest round per launch and their ratio; the JSON goes to bench/results/ (``--out``).

    python bench/delta_prepare.py --kinds scores,prepare --shapes 4x2048_h16,1x32768_h16
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from linear_attention import SHAPES  # noqa: E402  (the issue's shapes, one list for both benches)

logger = logging.getLogger(__name__)

LAUNCHES = 40          # a graph's launches of one form
ROUNDS = 6             # alternating replays of each form's graph


def _slot(array) -> types.SimpleNamespace:
    return types.SimpleNamespace(data_ptr=array.data.ptr, shape=array.shape, numel=array.size,
                                 strides=tuple(s // array.itemsize for s in array.strides))


def _buffers(lengths: list, H: int, K: int, V: int, kind: str) -> list:
    """The launch's slots in order: k, v, g, beta, cu_seqlens, w, u, g_out, kd (and q, qg, attn for ``scores``).
    16-bit values are held as float16 arrays (the kernels read the bits as the given type)."""
    import cupy as cp
    tokens, chunks = sum(lengths), sum(-(-n // 64) for n in lengths)
    rng = cp.random.default_rng(1)
    half = cp.float16
    k, q = (rng.standard_normal((tokens, H, K), dtype=cp.float32).astype(half) for _ in range(2))
    v = rng.standard_normal((tokens, H, V), dtype=cp.float32).astype(half)
    beta = cp.full((tokens, H), 0.5, dtype=half)
    g = -rng.uniform(0.0, 0.2, (tokens, H), dtype=cp.float32)
    cu = cp.asarray([0, *itertools.accumulate(lengths)], dtype=cp.int32)
    slots = [k, v, g, beta, cu, cp.empty((chunks, H, 64, K), half), cp.empty((chunks, H, 64, V), half),
             cp.empty((tokens, H), cp.float32), cp.empty((chunks, H, 64, K), half)]
    if kind == "scores":
        slots += [q, cp.empty((chunks, H, 64, K), half), cp.empty((chunks, H, 64, 64), half)]
    return slots


def _launcher(kind: str, io: str, K: int, V: int, H: int, n_seq: int, prefetch: bool):
    from cudnn_graph.engines.cute import _delta_prepare
    if kind == "prepare":
        return _delta_prepare.prepare_launcher(io, "float32", io, io, K, V, H, H, True, n_seq, prefetch=prefetch)
    return _delta_prepare.prepare_scores_launcher(io, "float32", io, io, K, V, H, H, True, K ** -0.5, n_seq,
                                                  prefetch=prefetch)


def time_forms(kind: str, shape: str, io: str, K: int) -> dict:
    """One row: both forms' fastest round per launch (ms) over the same buffers."""
    import cupy as cp
    lengths, H = SHAPES[shape]
    tokens, chunks = sum(lengths), sum(-(-n // 64) for n in lengths)
    slots = [_slot(a) for a in _buffers(lengths, H, K, K, kind)]
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = {}
    with stream:
        for prefetch in (False, True):
            launch = _launcher(kind, io, K, K, H, len(lengths), prefetch)
            for _ in range(3):                 # compiles, and loads the module outside the capture
                if not launch(stream.ptr, slots, tokens, chunks):
                    raise RuntimeError(f"the {kind} kernel refused the buffers or did not compile")
            stream.synchronize()
            stream.begin_capture()
            for _ in range(LAUNCHES):
                launch(stream.ptr, slots, tokens, chunks)
            graphs[prefetch] = stream.end_capture()
        times = {False: [], True: []}
        for _ in range(ROUNDS):
            for prefetch, graph in graphs.items():
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                graph.launch(stream)
                end.record(stream)
                end.synchronize()
                times[prefetch].append(cp.cuda.get_elapsed_time(start, end) / LAUNCHES)
    round_trip, prefetched = min(times[False]), min(times[True])
    return {"kind": kind, "shape": shape, "io": io, "K": K, "V": K, "round_trip_ms": round_trip,
            "prefetch_ms": prefetched, "ratio": prefetched / round_trip}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="scores,prepare", help="scores (the fused forward's), prepare (plain)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"a comma list of {', '.join(SHAPES)}")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--dims", default="128,64", help="K = V values")
    parser.add_argument("--out", default="", help="the JSON's path (default: bench/results/delta_prepare-<gpu>.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import cupy as cp
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    logger.info("%s\n%-8s %-12s %-9s %4s %13s %12s %6s", gpu, "kind", "shape", "dtype", "K", "round trip ms",
                "prefetch ms", "ratio")
    for kind, shape, io, K in itertools.product(args.kinds.split(","), args.shapes.split(","),
                                                args.dtypes.split(","), [int(d) for d in args.dims.split(",")]):
        row = time_forms(kind, shape, io, K)
        rows.append(row)
        logger.info("%-8s %-12s %-9s %4d %13.4f %12.4f %6.3f", kind, shape, io, K, row["round_trip_ms"],
                    row["prefetch_ms"], row["ratio"])
    tag = gpu.split()[-1].lower() if gpu else "gpu"
    out = Path(args.out or Path(__file__).parent / "results" / f"delta_prepare-{tag}.json")
    out.write_text(json.dumps({"gpu": gpu, "launches": LAUNCHES, "rounds": ROUNDS, "rows": rows}, indent=1))
    logger.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
