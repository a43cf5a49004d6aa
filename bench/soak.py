"""Soak: many executes of one small graph per producer, then threads; nothing may grow.

Per producer (CuPy, torch, JAX, numba, raw int pointers: those importable; NumPy with --cpu), one
relu graph is executed ``--count`` times (default 1,000,000) and the bench checks:

* RSS growth < 1 MB (after a warm-up of 1% of the count, from /proc/self/statm);
* GPU memory growth 0 (cuMemGetInfo through cuda.bindings; not measured with --cpu);
* no growth in what the runtime caches (``cudnn_graph.debug.debug_counters``: variant packs, CUDA
  graphs, lowered graphs, built plans) nor in open file descriptors or threads (handles, streams and
  events the driver creates show up there, and in GPU memory);
* then 16 threads share one graph, each with its own buffers, producer and stream, results checked.

Prints a table, writes bench/results/soak-<host>.json, exits 1 when a criterion fails.
``--cpu --count N`` runs it on the reference engine (host graph, NumPy) to check the bench itself.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import resource
import sys
import threading
import time
from pathlib import Path

import numpy as np

# JAX would otherwise take most of the GPU at import, leaving the other producers (and the fuzzer's
# child processes, which import this module) without memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = (64, 64)
RSS_LIMIT = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def gpu_used_bytes(cpu: bool) -> int | None:
    if cpu:
        return None
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    _make_current()
    err, free, total = driver.cuMemGetInfo()
    return int(total - free) if int(err) == 0 else None


def process_counts() -> dict:
    from cudnn_graph.debug import debug_counters
    counts = dict(debug_counters())
    counts["open_fds"] = len(os.listdir("/proc/self/fd"))
    counts["threads"] = threading.active_count()
    return counts


def make_graph(cpu: bool):
    import cudnn_graph as cudnn
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu" if cpu else "cuda")
    x = g.tensor(name="x", dim=list(SHAPE), stride=[SHAPE[1], 1])
    y = g.relu(x).set_output(True)
    g.build([cudnn.heur_mode.A])
    return g, x, y


def producers(cpu: bool) -> dict:
    """name -> (make(host array) -> (buffer, keepalive), to_host(buffer) -> ndarray, stream or None)."""
    found = {}
    if cpu:
        found["numpy"] = (lambda a: (a.copy(), None), lambda b: b, None)
        return found
    try:
        import cupy as cp
        found["cupy"] = (lambda a: (cp.asarray(a), None), lambda b: cp.asnumpy(b), None)
        found["int"] = (lambda a: _int_pointer(cp, a), lambda b: cp.asnumpy(b[1]), None)
    except ImportError:
        pass
    try:
        import torch
        found["torch"] = (lambda a: (torch.from_numpy(a).cuda(), None), lambda b: b.cpu().numpy(), None)
    except ImportError:
        pass
    try:
        import jax
        if any(d.platform == "gpu" for d in jax.devices()):
            found["jax"] = (lambda a: (jax.device_put(a, jax.devices("gpu")[0]), None),
                            lambda b: np.asarray(b), None)
    except Exception:   # JAX without a GPU backend raises RuntimeError on jax.devices("gpu")
        pass
    try:
        from numba import cuda
        found["numba"] = (lambda a: (cuda.to_device(a), None), lambda b: b.copy_to_host(), None)
    except Exception:
        pass
    return found


def _int_pointer(cp, array):
    dev = cp.asarray(array)
    return (dev.data.ptr, dev), None


def _unwrap(buffer):
    return buffer[0] if isinstance(buffer, tuple) else buffer


_PRIMARY = []


def _make_current():
    """Make device 0's primary context current on the calling thread (the driver calls below need one;
    the producers and cudnn_graph use the same primary context)."""
    from cuda.bindings import driver
    if not _PRIMARY:
        driver.cuInit(0)
        _, dev = driver.cuDeviceGet(0)
        err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
        assert int(err) == 0, f"cuDevicePrimaryCtxRetain: {err}"
        _PRIMARY.append(ctx)
    driver.cuCtxSetCurrent(_PRIMARY[0])
    return driver


def _synchronize(cpu: bool):
    if not cpu:
        err, = _make_current().cuCtxSynchronize()
        assert int(err) == 0, f"cuCtxSynchronize: {err}"


def soak_one(cpu: bool, name: str, producer, count: int) -> dict:
    make, to_host, _ = producer
    g, x, y = make_graph(cpu)
    rng = np.random.default_rng(0)
    host = rng.standard_normal(SHAPE).astype(np.float32)
    xb, _ = make(host)
    yb, _ = make(np.zeros(SHAPE, np.float32))
    pack = {x: _unwrap(xb), y: _unwrap(yb)}
    warm = max(1, count // 100)
    for _ in range(warm):
        g.execute(pack)
    _synchronize(cpu)
    gc.collect()
    rss0, gpu0, counts0 = rss_bytes(), gpu_used_bytes(cpu), process_counts()
    start = time.perf_counter()
    for _ in range(count):
        g.execute(pack)
    _synchronize(cpu)
    elapsed = time.perf_counter() - start
    gc.collect()
    rss1, gpu1, counts1 = rss_bytes(), gpu_used_bytes(cpu), process_counts()
    got = to_host(yb)
    correct = bool(np.array_equal(got, np.maximum(host, 0)))
    grown = {k: counts1[k] - counts0[k] for k in counts0 if counts1[k] > counts0[k]}
    gpu_growth = None if gpu0 is None or gpu1 is None or cpu else gpu1 - gpu0
    ok = correct and rss1 - rss0 < RSS_LIMIT and not grown and gpu_growth in (None, 0)
    return {"producer": name, "executes": count, "seconds": elapsed, "us_per_execute": 1e6 * elapsed / count,
            "rss_growth_bytes": rss1 - rss0, "gpu_growth_bytes": gpu_growth, "counters_grown": grown,
            "counters": counts1, "correct": correct, "ok": ok}


def soak_threads(cpu: bool, found: dict, threads: int, count: int) -> dict:
    """``threads`` threads share one graph; thread i uses producer i mod n, its own buffers and (on a
    GPU) its own stream; every thread checks its result after every 100 executes."""
    g, x, y = make_graph(cpu)
    names = sorted(found)
    failures, done = [], [0] * threads
    streams = [None] * threads
    if not cpu:
        driver = _make_current()
        for i in range(threads):
            err, stream = driver.cuStreamCreate(1)    # CU_STREAM_NON_BLOCKING
            assert int(err) == 0, f"cuStreamCreate: {err}"
            streams[i] = int(stream)

    def work(i):
        make, to_host, _ = found[names[i % len(names)]]
        host = np.random.default_rng(i).standard_normal(SHAPE).astype(np.float32)
        want = np.maximum(host, 0)
        xb, _ = make(host)
        yb, _ = make(np.zeros(SHAPE, np.float32))
        pack = {x: _unwrap(xb), y: _unwrap(yb)}
        try:
            for k in range(count):
                g.execute(pack, stream=streams[i])
                if k % 100 == 99 or k == count - 1:
                    if not cpu:
                        err, = _make_current().cuStreamSynchronize(streams[i])
                        assert int(err) == 0, f"cuStreamSynchronize: {err}"
                    if not np.array_equal(to_host(yb), want):
                        failures.append(f"thread {i} ({names[i % len(names)]}): wrong result at {k}")
                        return
                done[i] += 1
        except BaseException as exc:   # counted, the other threads go on
            failures.append(f"thread {i}: {type(exc).__name__}: {exc}")

    rss0 = rss_bytes()
    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - start
    if not cpu:
        driver = _make_current()
        for s in streams:
            driver.cuStreamDestroy(s)
    return {"producer": "threads x" + str(threads) + " (" + "+".join(names) + ")",
            "executes": sum(done), "seconds": elapsed, "us_per_execute": 1e6 * elapsed / max(1, sum(done)),
            "rss_growth_bytes": rss_bytes() - rss0, "gpu_growth_bytes": None, "counters_grown": {},
            "failures": failures[:20], "correct": not failures, "ok": not failures}


def table(rows) -> str:
    head = f"{'producer':<34} {'executes':>10} {'us/exec':>8} {'RSS +B':>10} {'GPU +B':>8} {'grown':<16} {'ok':>3}"
    lines = [head, "-" * len(head)]
    for r in rows:
        gpu = "-" if r["gpu_growth_bytes"] is None else str(r["gpu_growth_bytes"])
        grown = ",".join(f"{k}+{v}" for k, v in r["counters_grown"].items()) or "none"
        lines.append(f"{r['producer']:<34} {r['executes']:>10} {r['us_per_execute']:>8.2f} "
                     f"{r['rss_growth_bytes']:>10} {gpu:>8} {grown:<16} {'yes' if r['ok'] else 'NO':>3}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000, help="executes per producer (default 1e6)")
    parser.add_argument("--threads", type=int, default=16, help="threads sharing one graph (default 16)")
    parser.add_argument("--thread-count", type=int, default=None,
                        help="executes per thread (default count / 100, at least 100)")
    parser.add_argument("--cpu", action="store_true", help="host graph on the reference engine (NumPy)")
    parser.add_argument("--json", default=None, help="where to write the results (default bench/results/)")
    args = parser.parse_args(argv)
    if not args.cpu:
        from cudnn_graph import _driver
        if _driver.device_count() == 0:
            parser.error("no CUDA GPU is visible; use --cpu to check the bench on the reference engine")
    found = producers(args.cpu)
    if not found:
        parser.error("no producer is importable (CuPy, torch, JAX, numba)")
    rows = []
    for name, producer in found.items():
        try:
            rows.append(soak_one(args.cpu, name, producer, args.count))
        except Exception as exc:   # a producer the graph refuses (say a read-only output) is a failed row
            rows.append({"producer": name, "executes": 0, "us_per_execute": 0.0, "rss_growth_bytes": 0,
                         "gpu_growth_bytes": None, "counters_grown": {}, "correct": False, "ok": False,
                         "failures": [f"{type(exc).__name__}: {exc}"]})
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    per_thread = args.thread_count or max(100, args.count // 100)
    rows.append(soak_threads(args.cpu, found, args.threads, per_thread))
    print()
    print(table(rows))
    for r in rows:
        for failure in r.get("failures", []):
            print("  " + failure)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node() or "host")
    path = Path(args.json) if args.json else RESULTS / f"soak-{host}{'-cpu' if args.cpu else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": platform.node(), "cpu": args.cpu, "count": args.count,
                                "threads": args.threads, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
