"""cg_execute (the C runtime, from raw device pointers) against the C floor, in one run.

The plan is examples/c/make_plan.py's (matmul, conv, sdpa, cute_matmul: the CuTe GEMM with a fused
bias and relu, or cutile_gdn: the cuTile gated delta rule's three kernels), serialized by Python and
loaded by a C timing loop (bench/c_api_loop.c, built here against the installed runtime) that times
bursts of cg_execute. The floor, of the same built plan in this process: for a cuDNN plan
cudnn_graph._bench_timing.execute_floor_ns (cudnnBackendExecute from a nogil loop on a prebuilt variant
pack), for a CuTe plan _bench_timing.dsl_entry_floor_ns (the kernel's exported entry called from a nogil
loop with its arguments packed once), for a cuTile plan _bench_timing.tile_launch_floor_ns (cuLaunchKernel
per kernel from a nogil loop, every parameter buffer built once). Both sides run on the plan folder's
inputs (a cuTile kernel reads its sequence boundaries from the device). Target: ratio <= 1.05. Bursts alternate,
each on a drained queue. A graph that fails is a row with its error; the others still run. Prints a table
and saves bench/results/c_api-<host>.json (or --out). Needs a GPU.

    python bench/c_api.py [--graphs matmul conv sdpa cute_matmul cutile_gdn] [--iterations 200] [--bursts 15]
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
    """The C floor of ``g``'s plan on device buffers of its operands (the inputs copied from ``folder``):
    execute_floor_ns for a cuDNN plan, dsl_entry_floor_ns (its PackedLaunch: the entry, arguments packed
    once) for a CuTe plan, tile_launch_floor_ns (its TileLaunch: parameter buffers built once) for a cuTile
    plan."""
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
        source = os.path.join(folder, f"{t.uid}.in")
        if os.path.exists(source):
            with open(source, "rb") as f:
                _driver.copy_to_device(allocation, f.read())
    _driver.device_synchronize(0)
    if hasattr(compiled, "runner"):
        value = _bench_timing.execute_floor_ns(compiled.runner, compiled.layout.pack(pack_in), iterations)
    else:
        executor = compiled.fast_executor(compiled.layout)
        launch = getattr(executor, "__self__", None)
        kind = type(launch).__name__
        if kind == "TileLaunch":
            value = _bench_timing.tile_launch_floor_ns(launch, pack_in, iterations)
        elif kind == "PackedLaunch":
            value = _bench_timing.dsl_entry_floor_ns(launch, pack_in, iterations)
        else:
            raise RuntimeError(f"{g.selected_plan.label} has no C launch path to take the floor of ({executor!r})")
    _driver.device_synchronize(0)
    return value


def _child_env() -> dict:
    """The C loop's environment: the libcudnn and the CuTe DSL runtime library this process uses (the C
    runtime has no cuda-pathfinder and no Python package to find them with)."""
    from cudnn_graph import _loader
    env = {**os.environ, "CUDNN_GRAPH_LIBCUDNN": _loader.load()}
    try:
        from cudnn_graph.engines.cute import _shared_object
        runtime = _shared_object.runtime_path()
    except ImportError:           # no CuTe DSL installed: only cuDNN plans run
        runtime = None
    if runtime:
        env.setdefault("CUDNN_GRAPH_CUTE_RUNTIME", runtime)
    return env


def measure(name: str, program: str, root: str, iterations: int, bursts: int) -> dict:
    folder = os.path.join(root, name)
    g = _make_plan_module().write_plan(name, folder)
    env = _child_env()
    ours, floors = [], []
    for _ in range(bursts):       # alternate: one C burst, one floor burst
        done = subprocess.run([program, folder, str(iterations), "1"], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"the C loop exited {done.returncode}: {(done.stderr or done.stdout).strip()[-600:]}")
        ours.append(float(done.stdout.split()[-1]))
        floors.append(floor_ns(g, folder, iterations))
    row = {"graph": name, "engine_id": int(g.selected_plan.engine_id), "plan": g.selected_plan.label,
           "cg_execute_ns": statistics.median(ours), "floor_ns": statistics.median(floors)}
    row["ratio"] = row["cg_execute_ns"] / row["floor_ns"]
    return row


def measure_or_error(name: str, program: str, root: str, iterations: int, bursts: int) -> dict:
    """``measure``'s row, or {graph, error} when the graph fails (logged): the other graphs still run."""
    try:
        return measure(name, program, root, iterations, bursts)
    except Exception as exc:     # noqa: BLE001  (a bench reports every graph's outcome)
        logger.exception("c_api bench: graph %s failed", name)
        return {"graph": name, "error": f"{type(exc).__name__}: {exc}"}


def format_rows(rows: list) -> list:
    lines = [f"{'graph':12} {'engine':>6} {'cg_execute us':>14} {'C floor us':>11} {'ratio':>6}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['graph']:12} FAILED: {r['error']}")
        else:
            lines.append(f"{r['graph']:12} {r['engine_id']:>6} {r['cg_execute_ns'] / 1e3:>14.2f} "
                         f"{r['floor_ns'] / 1e3:>11.2f} {r['ratio']:>6.3f}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=["matmul", "conv", "sdpa", "cute_matmul", "cutile_gdn"],
                        choices=sorted(_make_plan_module().GRAPHS))
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=15)
    parser.add_argument("--out", help="JSON path (default bench/results/c_api-<host>.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    with tempfile.TemporaryDirectory() as root:
        program = build_loop(root)
        rows = [measure_or_error(name, program, root, args.iterations, args.bursts) for name in args.graphs]
    sys.stdout.write("\n".join(format_rows(rows)) + "\n")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = args.out or os.path.join(HERE, "results", f"c_api-{platform.node()}.json")
    with open(path, "w") as f:
        json.dump({"rows": rows, "iterations": args.iterations, "bursts": args.bursts,
                   "note": "cg_execute bursts run in a child C process; the floor in this process"}, f, indent=2)
    logger.info("wrote %s", path)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
