"""cg_execute (the C runtime, from raw device pointers) against the C floor, in one run.

The plan is examples/c/make_plan.py's (matmul, conv or sdpa), serialized by Python and loaded by a C
timing loop (bench/c_api_loop.c, built here against the installed runtime) that times bursts of
cg_execute; the floor is cudnn_graph._bench_timing.execute_floor_ns (cudnnBackendExecute from a nogil
loop on a prebuilt variant pack) of the same built plan in this process. Bursts alternate, each on a
drained queue. Prints a table and saves bench/results/c_api-<host>.json (or --out). Needs a GPU.

    python bench/c_api.py [--graphs matmul conv sdpa] [--iterations 200] [--bursts 15]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile

logger = logging.getLogger(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples", "c")


def _make_plan_module():
    spec = importlib.util.spec_from_file_location("make_plan", os.path.join(EXAMPLES, "make_plan.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_loop(folder: str) -> str:
    from cudnn_graph import _c_runtime
    program = os.path.join(folder, "c_api_loop")
    flags = shlex.split(_c_runtime.c_flags()) + shlex.split(_c_runtime.libs())
    subprocess.run(["cc", "-std=c99", "-O2", os.path.join(HERE, "c_api_loop.c"), "-o", program, *flags, "-ldl"],
                   check=True)
    return program


def floor_ns(g, folder: str, iterations: int) -> float:
    """execute_floor_ns of ``g``'s plan on device buffers of its operands."""
    from cudnn_graph import _bench_timing, _driver
    compiled = g.compiled_plan()
    pack_in, keep = {}, []
    for t in list(g.get_inputs()) + list(g.get_outputs()):
        if t.is_pass_by_value:
            continue
        span = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
        allocation = _driver.DeviceAllocation(span * 8, 0)
        keep.append(allocation)
        pack_in[t.uid] = allocation.ptr
    pack = compiled.layout.pack(pack_in)
    _driver.device_synchronize(0)
    value = _bench_timing.execute_floor_ns(compiled.runner, pack, iterations)
    _driver.device_synchronize(0)
    return value


def measure(name: str, program: str, root: str, iterations: int, bursts: int) -> dict:
    from cudnn_graph import _loader
    folder = os.path.join(root, name)
    g = _make_plan_module().write_plan(name, folder)
    env = {**os.environ, "CUDNN_GRAPH_LIBCUDNN": _loader.load()}
    ours, floors = [], []
    for _ in range(bursts):       # alternate: one C burst, one floor burst
        out = subprocess.run([program, folder, str(iterations), "1"], capture_output=True, text=True, env=env,
                             check=True).stdout.split()
        ours.append(float(out[-1]))
        floors.append(floor_ns(g, folder, iterations))
    row = {"graph": name, "engine_id": int(g.selected_plan.engine_id),
           "cg_execute_ns": statistics.median(ours), "floor_ns": statistics.median(floors)}
    row["ratio"] = row["cg_execute_ns"] / row["floor_ns"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=["matmul", "conv", "sdpa"])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=15)
    parser.add_argument("--out", help="JSON path (default bench/results/c_api-<host>.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    with tempfile.TemporaryDirectory() as root:
        program = build_loop(root)
        rows = [measure(name, program, root, args.iterations, args.bursts) for name in args.graphs]
    lines = [f"{'graph':8} {'engine':>6} {'cg_execute us':>14} {'C floor us':>11} {'ratio':>6}"]
    lines += [f"{r['graph']:8} {r['engine_id']:>6} {r['cg_execute_ns'] / 1e3:>14.2f} {r['floor_ns'] / 1e3:>11.2f} "
              f"{r['ratio']:>6.3f}" for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = args.out or os.path.join(HERE, "results", f"c_api-{platform.node()}.json")
    with open(path, "w") as f:
        json.dump({"rows": rows, "iterations": args.iterations, "bursts": args.bursts,
                   "note": "cg_execute bursts run in a child C process; the floor in this process"}, f, indent=2)
    logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
