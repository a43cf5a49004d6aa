"""Host cost of building graphs: a tensor, an op node, validate() per node, build() of a small graph.

What is timed (each on fresh graphs, so no number depends on how big a graph already is):

* ``tensor``: ``g.tensor(name=..., dim=[4, 8], stride=[8, 1], data_type=HALF)``;
* ``add`` / ``relu`` / ``matmul`` / ``layernorm``: one op node on tensors that already exist;
* ``validate / node``: ``validate()`` of a 64-node pointwise chain, divided by 64;
* ``build (3 nodes)``: ``build()`` of matmul + bias + relu on the reference engine (validate, freeze,
  plan list, build the plan), the graph construction excluded;
* ``construct + build``: the same graph made from nothing and built (what a new shape costs).

Per-call times are medians over repeats (bursts of calls, each burst on a fresh graph) with the cyclic
garbage collector paused, as ``timeit`` does; the ``gc on`` column repeats the burst with it running
(graphs are reference cycles: tensor -> graph -> tensor, so the collector's passes are real cost in a
process that builds many graphs).

The table goes to stdout; JSON to bench/results/ir_build-<hostname>.json.

Usage: python bench/ir_build.py [--quick] [--out PATH]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import socket
import statistics
import sys
import time

import cudnn_graph as cudnn

TARGETS_US = {"tensor": 1.0, "add": 3.0, "relu": 3.0, "matmul": 3.0}
HALF, FLOAT = cudnn.data_type.HALF, cudnn.data_type.FLOAT


def _graph():
    return cudnn.pygraph(io_data_type=HALF, compute_data_type=FLOAT, device="cpu")


def _two_inputs(g):
    return (g.tensor(name="a", dim=[4, 8], stride=[8, 1]), g.tensor(name="b", dim=[4, 8], stride=[8, 1]))


def _time_burst(setup, body, calls, repeats, gc_on):
    """Median and min microseconds per call of ``body(state, calls)`` over ``repeats`` fresh setups."""
    samples = []
    for _ in range(repeats):
        state = setup()
        gc.collect()
        if not gc_on:
            gc.disable()
        try:
            t0 = time.perf_counter_ns()
            body(state, calls)
            t1 = time.perf_counter_ns()
        finally:
            gc.enable()
        samples.append((t1 - t0) / calls / 1000.0)
    return statistics.median(samples), min(samples)


# ---- what is timed --------------------------------------------------------------------------------

def _tensor(state, n):
    g = state
    for _ in range(n):
        g.tensor(name="x", dim=[4, 8], stride=[8, 1], data_type=HALF)


def _add(state, n):
    g, a, b = state
    for _ in range(n):
        g.add(a, b)


def _relu(state, n):
    g, a, _ = state
    for _ in range(n):
        g.relu(a)


def _matmul_setup():
    g = _graph()
    return g, g.tensor(name="A", dim=[1, 16, 32], stride=[512, 32, 1]), g.tensor(name="B", dim=[1, 32, 8],
                                                                                   stride=[256, 8, 1])


def _matmul(state, n):
    g, a, b = state
    for _ in range(n):
        g.matmul(a, b)


def _layernorm_setup():
    g = _graph()
    x = g.tensor(name="x", dim=[8, 64], stride=[64, 1])
    s = g.tensor(name="s", dim=[1, 64], stride=[64, 1])
    bias = g.tensor(name="bias", dim=[1, 64], stride=[64, 1])
    eps = g.tensor_scalar(1e-5)
    return g, x, s, bias, eps


def _layernorm(state, n):
    g, x, s, bias, eps = state
    phase = cudnn.norm_forward_phase.TRAINING
    for _ in range(n):
        g.layernorm(norm_forward_phase=phase, input=x, scale=s, bias=bias, epsilon=eps)


CHAIN = 64


def _chain_graph():
    g = _graph()
    t = g.tensor(name="x", dim=[4, 8], stride=[8, 1])
    for _ in range(CHAIN):
        t = g.relu(t)
    t.set_output(True)
    return g


def _validate(state, n):
    # ``state`` is a list of fresh chain graphs (validate() of a validated graph is not the cost).
    for g in state[:n]:
        g.validate()


def _small_graph():
    g = _graph()
    a = g.tensor(name="a", dim=[1, 16, 32], stride=[512, 32, 1])
    b = g.tensor(name="b", dim=[1, 32, 8], stride=[256, 8, 1])
    bias = g.tensor(name="bias", dim=[1, 1, 8], stride=[8, 8, 1])
    g.relu(g.bias(g.matmul(a, b), bias)).set_output(True)
    return g


def _build(state, n):
    for g in state[:n]:
        g.build([cudnn.heur_mode.A])


def _construct_build(state, n):
    for _ in range(n):
        _small_graph().build([cudnn.heur_mode.A])


def measure(quick: bool) -> list[dict]:
    calls = 300 if quick else 2000
    repeats = 5 if quick else 15
    few = 20 if quick else 100          # graphs per burst for validate / build
    rows = []

    def row(name, setup, body, n, per=1):
        med, best = _time_burst(setup, body, n, repeats, gc_on=False)
        med_gc, _ = _time_burst(setup, body, n, max(3, repeats // 3), gc_on=True)
        rows.append({"what": name, "median_us": med / per, "min_us": best / per, "gc_on_median_us": med_gc / per,
                     "target_us": TARGETS_US.get(name)})

    row("tensor", _graph, _tensor, calls)
    row("add", lambda: (lambda g: (g,) + _two_inputs(g))(_graph()), _add, calls)
    row("relu", lambda: (lambda g: (g,) + _two_inputs(g))(_graph()), _relu, calls)
    row("matmul", _matmul_setup, _matmul, calls)
    row("layernorm", _layernorm_setup, _layernorm, calls)
    row("validate / node", lambda: [_chain_graph() for _ in range(few)], _validate, few, per=CHAIN)
    row("build (3 nodes)", lambda: [_small_graph() for _ in range(few)], _build, few)
    row("construct + build", lambda: None, _construct_build, few)
    return rows


def _print(rows):
    print(f"{'what':<20}{'median us':>12}{'min us':>10}{'gc on us':>11}{'target us':>11}  verdict")
    for r in rows:
        target = r["target_us"]
        verdict = "" if target is None else ("ok" if r["median_us"] <= target else "MISSES")
        t = "" if target is None else f"{target:.1f}"
        print(f"{r['what']:<20}{r['median_us']:>12.2f}{r['min_us']:>10.2f}{r['gc_on_median_us']:>11.2f}{t:>11}  {verdict}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/ir_build-<host>.json)")
    args = ap.parse_args(argv)
    rows = measure(args.quick)
    _print(rows)
    host = socket.gethostname()
    out = pathlib.Path(args.out) if args.out else pathlib.Path(__file__).resolve().parent / "results" / f"ir_build-{host}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "bench": "ir_build", "host": host, "python": sys.version.split()[0], "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "quick": args.quick, "cudnn_graph": getattr(cudnn, "__version__", None),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
