"""Autotune on cuDNN matmul graphs: every plan's time, the default plan and autotune's choice.

Run on a GPU machine (buffers come from CuPy):

    python bench/autotune.py [--shapes 512x512x512 2048x2048x2048 ...] [--iterations 100] [--json PATH]

For each shape (M x N x K, one batch, fp16 in and out, fp32 compute) the graph is built with heuristics
A, B and FALLBACK; the plan ``build()`` selects is the default; ``g.autotune(...)`` times every plan of
the list with CUDA events (after a warm-up) and selects the fastest. Each plan's time is then measured
once more the same way (``measure``), so the table shows the default and the choice side by side on
equal terms. Prints one table per shape and writes bench/results/autotune-<host>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SHAPES = ("256x256x256", "1024x1024x1024", "4096x4096x512")


def matmul_graph(cudnn, m: int, n: int, k: int):
    """(graph planned and built with heuristics A, B, FALLBACK; its A, B, C tensors)."""
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0")
    a = g.tensor(name="A", dim=[1, m, k], stride=[m * k, k, 1])
    b = g.tensor(name="B", dim=[1, k, n], stride=[k * n, n, 1])
    c = g.matmul(name="mm", A=a, B=b).set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    return g, a, b, c


def measure(graph, variant_pack, workspace, index: int, iterations: int) -> float:
    """Milliseconds per execute of plan ``index``, timed as autotune times it (CUDA events around a graph
    of ``iterations`` captured executes, after one warm-up)."""
    from cudnn_graph import Slot
    from cudnn_graph._autotune import CudaEventTimer
    from cudnn_graph._cuda_graphs import imported_operands
    # Imported before the capture begins, as autotune does: a DLPack export inside it would join CuPy's
    # stream to the capture.
    operands = imported_operands(graph, index, variant_pack)
    workspace = Slot.from_object(workspace) if workspace is not None and type(workspace) is not int else workspace

    def run(stream):
        graph.execute_plan_at_index(operands, workspace, index=index, stream=stream)
    return CudaEventTimer().time_ms(run, 1, iterations, 0)


def tune_shape(m: int, n: int, k: int, iterations: int = 100) -> dict:
    """Autotune one matmul shape; returns the plans' times, the default and the chosen index."""
    import cupy as cp
    import numpy as np
    import cudnn_graph as cudnn
    g, a, b, c = matmul_graph(cudnn, m, n, k)
    default = next(i for i, entry in enumerate(g.plans) if entry is g.selected_plan)
    rng = np.random.default_rng(0)
    A = cp.asarray(rng.standard_normal((1, m, k)).astype(np.float16))
    B = cp.asarray(rng.standard_normal((1, k, n)).astype(np.float16))
    C = cp.empty((1, m, n), cp.float16)
    pack = {a: A, b: B, c: C}
    count = g.get_execution_plan_count()
    sizes = []
    for i in range(count):
        try:
            g.build_plan_at_index(i)
            sizes.append(g.get_workspace_size_plan_at_index(i))
        except NotImplementedError:      # a plan that declines; autotune skips it too
            pass
    ws = cp.empty(max(sizes + [1]), cp.uint8)
    result = g.autotune(pack, ws, iterations=iterations)
    remeasured = {i: measure(g, pack, ws, i, iterations) for i in sorted(result.times_ms)}
    rows = []
    for i, label, ms, _ in result.rows():
        notes = [word for word, yes in (("selected", i == result.best_index), ("default", i == default)) if yes]
        rows.append({"index": i, "plan": label, "autotune_ms": ms, "remeasured_ms": remeasured.get(i),
                     "note": ", ".join(notes + ([result.failures[i]] if i in result.failures else []))})
    return {"shape": f"{m}x{n}x{k}", "plans": count, "default_index": default, "best_index": result.best_index,
            "default_ms": result.times_ms.get(default), "best_ms": result.times_ms[result.best_index],
            "rows": rows}


def print_table(record: dict) -> None:
    print(f"\nmatmul {record['shape']} (fp16, fp32 compute): {record['plans']} plans; default {record['default_index']}, "
          f"autotune chose {record['best_index']}")
    print(f"{'idx':>4}  {'plan':<40} {'autotune ms':>12} {'again ms':>10}  note")
    for row in record["rows"]:
        ms = "-" if row["autotune_ms"] is None else f"{row['autotune_ms']:.4f}"
        again = "-" if row["remeasured_ms"] is None else f"{row['remeasured_ms']:.4f}"
        print(f"{row['index']:>4}  {row['plan'][:40]:<40} {ms:>12} {again:>10}  {row['note'][:60]}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="MxNxK, e.g. 1024x1024x1024")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    args = parser.parse_args(argv)
    import cudnn_graph as cudnn
    records = []
    for shape in args.shapes:
        m, n, k = (int(v) for v in shape.lower().split("x"))
        record = tune_shape(m, n, k, args.iterations)
        print_table(record)
        records.append(record)
    out = {"host": platform.node(), "cudnn": cudnn.backend_version(), "iterations": args.iterations,
           "shapes": records}
    path = args.json or RESULTS / f"autotune-{platform.node() or 'host'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {path}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
