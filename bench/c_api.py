"""cg_execute (the C runtime, from raw device pointers) against the C floor, in one run.

The plan is examples/c/make_plan.py's (matmul, conv, sdpa, cute_matmul: the CuTe GEMM with a fused
bias and relu, or cutile_gdn: the cuTile gated delta rule's three kernels), serialized by Python. Its blob
is loaded into this process by libcudnn_graph_rt (cg_plan_load through ctypes) and bursts of cg_execute are
timed from a nogil C loop (_bench_timing.c_runtime_execute_ns), alternating with bursts of the floor of
the same built plan, on the same device buffers and context: for a cuDNN plan
_bench_timing.execute_floor_ns (cudnnBackendExecute from a nogil loop on a prebuilt variant pack), for a
CuTe plan _bench_timing.dsl_entry_floor_ns (the kernel's exported entry called from a nogil loop with its
arguments packed once), for a cuTile plan _bench_timing.tile_launch_floor_ns (cuLaunchKernel per kernel
from a nogil loop, every parameter buffer built once). Timing both in one process takes out what two
processes differ by (their CPU placement and caches: +-13% in one run when the floor was taken here and
cg_execute in a child). The standalone C loop (bench/c_api_loop.c, built here against the installed
runtime, no Python in its process) still runs each graph; its figure is the "C program" column. Both
sides run on the plan folder's inputs (a cuTile kernel reads its sequence boundaries from the device).
Target: ratio <= 1.05 (ratio: of the two medians; paired: the median of each burst pair's ratio). Each
burst starts on a drained queue; the order of the two sides alternates. A graph that fails is a row with
its error; the others still run. Prints a table and saves bench/results/c_api-<host>.json (or --out).
Needs a GPU.

    python bench/c_api.py [--graphs matmul conv sdpa cute_matmul cutile_gdn] [--iterations 200] [--bursts 15]
"""
from __future__ import annotations

import argparse
import ctypes
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


def operand_buffers(g, folder: str) -> tuple:
    """Device buffers for ``g``'s operands, each input holding its bytes from ``folder``: ``({uid: address},
    keep)``, keep holding the allocations. A pass-by-value operand is left out (its value is host bytes)."""
    from cudnn_graph import _driver
    addresses, keep = {}, []
    for t in list(g.get_inputs()) + list(g.get_outputs()):
        if t.is_pass_by_value:
            continue
        span = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
        allocation = _driver.DeviceAllocation(span * 8, 0)
        keep.append(allocation)
        addresses[t.uid] = allocation.ptr
        source = os.path.join(folder, f"{t.uid}.in")
        if os.path.exists(source):
            with open(source, "rb") as f:
                _driver.copy_to_device(allocation, f.read())
    _driver.device_synchronize(0)
    return addresses, keep


def floor_ns(g, addresses: dict, iterations: int) -> float:
    """The C floor of ``g``'s plan on ``addresses`` (uid -> device address): execute_floor_ns for a cuDNN plan,
    dsl_entry_floor_ns (its PackedLaunch: the entry, arguments packed once) for a CuTe plan,
    tile_launch_floor_ns (its TileLaunch: parameter buffers built once) for a cuTile plan."""
    from cudnn_graph import _bench_timing, _driver
    compiled = g.compiled_plan()
    if hasattr(compiled, "runner"):
        value = _bench_timing.execute_floor_ns(compiled.runner, compiled.layout.pack(addresses), iterations)
    else:
        executor = compiled.fast_executor(compiled.layout)
        launch = getattr(executor, "__self__", None)
        kind = type(launch).__name__
        if kind == "TileLaunch":
            value = _bench_timing.tile_launch_floor_ns(launch, addresses, iterations)
        elif kind == "PackedLaunch":
            value = _bench_timing.dsl_entry_floor_ns(launch, addresses, iterations)
        else:
            raise RuntimeError(f"{g.selected_plan.label} has no C launch path to take the floor of ({executor!r})")
    _driver.device_synchronize(0)
    return value


class RuntimePlan:
    """A blob loaded into this process by libcudnn_graph_rt (ctypes for load, query and free; the timed
    cg_execute calls come from _bench_timing's nogil loop through the function's address)."""

    def __init__(self, blob: bytes, addresses: dict, folder: str):
        from cudnn_graph import _c_runtime, _driver
        self.library = ctypes.CDLL(_c_runtime.library_path())
        self.library.cg_last_error.restype = ctypes.c_char_p
        self.plan = ctypes.c_void_p()
        self._blob = ctypes.create_string_buffer(blob, len(blob))
        self._check(self.library.cg_plan_load(self._blob, ctypes.c_size_t(len(blob)), 0, ctypes.byref(self.plan)),
                    "cg_plan_load")
        size = ctypes.c_size_t()
        self._check(self.library.cg_plan_workspace_size(self.plan, ctypes.byref(size)), "cg_plan_workspace_size")
        self._workspace = _driver.DeviceAllocation(size.value, 0) if size.value else None
        self.workspace = self._workspace.ptr if self._workspace else 0
        self.operands, self._host = [], []
        count = ctypes.c_int()
        self._check(self.library.cg_plan_tensor_count(self.plan, ctypes.byref(count)), "cg_plan_tensor_count")
        index = ctypes.c_int()
        for uid in sorted(set(addresses) | set(self._pass_by_value(folder))):
            if self.library.cg_plan_tensor_index(self.plan, ctypes.c_int64(uid), ctypes.byref(index)) != 0:
                continue                  # an operand the plan binds itself
            if uid in addresses:
                self.operands.append((uid, addresses[uid]))
            else:                         # a pass-by-value operand: a pointer to its host bytes
                with open(os.path.join(folder, f"{uid}.in"), "rb") as f:
                    cell = ctypes.create_string_buffer(f.read())
                self._host.append(cell)
                self.operands.append((uid, ctypes.addressof(cell)))
        if len(self.operands) != count.value:
            raise RuntimeError(f"the plan has {count.value} caller operands; the folder gives {len(self.operands)}")
        self.execute = ctypes.cast(self.library.cg_execute, ctypes.c_void_p).value

    @staticmethod
    def _pass_by_value(folder: str) -> list:
        return [int(name[:-3]) for name in os.listdir(folder) if name.endswith(".in") and name[:-3].isdigit()]

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {self.library.cg_last_error().decode()}")

    def execute_ns(self, iterations: int) -> float:
        from cudnn_graph import _bench_timing, _driver
        _driver.device_synchronize(0)
        value, status = _bench_timing.c_runtime_execute_ns(self.execute, self.plan.value, self.operands,
                                                           self.workspace, iterations)
        self._check(status, "cg_execute")
        _driver.device_synchronize(0)
        return value

    def close(self) -> None:
        if self.plan:
            self.library.cg_plan_free(self.plan)
            self.plan = ctypes.c_void_p()


def _runtime_env() -> dict:
    """Where the C runtime finds libcudnn and the CuTe DSL runtime library: the ones this process uses (the C
    runtime has no cuda-pathfinder and no Python package to find them with)."""
    from cudnn_graph import _loader
    env = {"CUDNN_GRAPH_LIBCUDNN": _loader.load()}
    try:
        from cudnn_graph.engines.cute import _shared_object
        runtime = _shared_object.runtime_path()
    except ImportError:           # no CuTe DSL installed: only cuDNN plans run
        runtime = None
    if runtime:
        env["CUDNN_GRAPH_CUTE_RUNTIME"] = runtime
    return env


def _child_env() -> dict:
    """The C loop's environment: this one, with _runtime_env's variables where it has none of its own."""
    return {**_runtime_env(), **os.environ}


def child_program_ns(program: str, folder: str, iterations: int, bursts: int) -> float:
    """The standalone C loop's median ns per cg_execute (its own process, no Python)."""
    done = subprocess.run([program, folder, str(iterations), str(bursts)], capture_output=True, text=True,
                          env=_child_env())
    if done.returncode != 0:
        raise RuntimeError(f"the C loop exited {done.returncode}: {(done.stderr or done.stdout).strip()[-600:]}")
    return statistics.median(float(line) for line in done.stdout.split())


def measure(name: str, program: str, root: str, iterations: int, bursts: int) -> dict:
    folder = os.path.join(root, name)
    g = _make_plan_module().write_plan(name, folder)
    addresses, keep = operand_buffers(g, folder)
    for key, value in _runtime_env().items():     # the runtime loaded into this process searches as the C loop
        os.environ.setdefault(key, value)
    with open(os.path.join(folder, "plan.blob"), "rb") as f:
        plan = RuntimePlan(f.read(), addresses, folder)
    try:
        plan.execute_ns(iterations)               # warm both sides up
        floor_ns(g, addresses, iterations)
        ours, floors = [], []
        for burst in range(bursts):               # alternate which side goes first
            sides = [(ours, plan.execute_ns), (floors, lambda n: floor_ns(g, addresses, n))]
            for values, timed in (sides if burst % 2 == 0 else sides[::-1]):
                values.append(timed(iterations))
    finally:
        plan.close()
        del keep
    row = {"graph": name, "engine_id": int(g.selected_plan.engine_id), "plan": g.selected_plan.label,
           "cg_execute_ns": statistics.median(ours), "floor_ns": statistics.median(floors),
           "c_program_ns": child_program_ns(program, folder, iterations, bursts)}
    row["ratio"] = row["cg_execute_ns"] / row["floor_ns"]
    # Each burst's pair ran back to back: the median of their ratios discounts the host's drift across bursts.
    row["ratio_paired"] = statistics.median(o / f for o, f in zip(ours, floors))
    return row


def measure_or_error(name: str, program: str, root: str, iterations: int, bursts: int) -> dict:
    """``measure``'s row, or {graph, error} when the graph fails (logged): the other graphs still run."""
    try:
        return measure(name, program, root, iterations, bursts)
    except Exception as exc:     # noqa: BLE001  (a bench reports every graph's outcome)
        logger.exception("c_api bench: graph %s failed", name)
        return {"graph": name, "error": f"{type(exc).__name__}: {exc}"}


def format_rows(rows: list) -> list:
    lines = [f"{'graph':12} {'engine':>6} {'cg_execute us':>14} {'C floor us':>11} {'ratio':>6} {'paired':>6} "
             f"{'C program us':>13}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['graph']:12} FAILED: {r['error']}")
        else:
            lines.append(f"{r['graph']:12} {r['engine_id']:>6} {r['cg_execute_ns'] / 1e3:>14.2f} "
                         f"{r['floor_ns'] / 1e3:>11.2f} {r['ratio']:>6.3f} {r['ratio_paired']:>6.3f} "
                         f"{r['c_program_ns'] / 1e3:>13.2f}")
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
                   "note": "cg_execute (libcudnn_graph_rt, loaded here) and the floor alternate in this process on "
                           "the same buffers; c_program_ns is bench/c_api_loop.c's own process"}, f, indent=2)
    logger.info("wrote %s", path)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
