"""Fuzz graph.execute: random variant packs and random op chains; every outcome a correct result or a
typed error naming the tensor.

A case is one execute of one graph (a random chain of pointwise ops over one random shape, with a
random bad attribute now and then) with a randomly built variant pack: keys of every kind (Tensor,
uid, name, a foreign graph's Tensor, a virtual tensor, duplicates, missing, extra), buffers of every
producer available (NumPy, DLPack capsules; CuPy, torch, JAX, numba and raw ints with a GPU), wrong
dtypes, shapes, strides (negative, zero, overlapping), devices and alignments, and misused DLPack
capsules (reused, wrong name, wrong version, NULL deleter; their deleter calls are counted).

Outcomes: ``ok`` (matches NumPy), ``typed`` (a CudnnGraphError naming the tensor at fault), ``wrong``
(a wrong answer, an untyped exception, a typed one that does not name the tensor at fault, or an
error for a valid pack), ``leak`` (a hand-made capsule's deleter not called exactly once over its
life: by the consumer when consumed, by the capsule's destructor when refused; never when NULL),
``crash`` (the child process running a batch died; the batch's remaining cases are run again one
child each to pin the crasher). The host cases are ``cudnn_graph._testing.pack_fuzz``'s, which the
CI fuzz (tests/core/test_variant_pack_fuzz.py) draws with hypothesis; every io dtype the chains take.

Cases run in child processes in batches of ``--batch``: a crash is counted, not fatal. The engines
fuzzed: the reference engine (host graphs); with a GPU, also the GPU engines on device graphs.
With a GPU, every other case is a device graph (the GPU engines; buffers from CuPy, torch, JAX, numba
or raw ints, as importable); ``--cpu`` keeps to host graphs. ``--cases`` (default 100,000),
``--seed``; prints the table, writes bench/results/fuzz_execute-<host>-seed<seed>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fuzz_common  # noqa: E402  (bench/ is not a package)
from cudnn_graph._testing import pack_fuzz as pf  # noqa: E402

NAME = "fuzz_execute"
# The host cases (graphs, mutations, judging) are shared with the CI fuzz, tests/core/test_variant_pack_fuzz.py.
MUTATIONS = pf.MUTATIONS + ("bad_attribute",)
GPU_MUTATIONS = ("none", "none", "none", "key_uid", "key_name", "foreign", "virtual", "duplicate", "missing",
                 "extra", "dtype", "shape", "misaligned", "host_buffer")
chain_graph, expected = pf.chain_graph, pf.expected


def generate_cases(seed: int, count: int, gpu: bool = False) -> list:
    """Host-graph cases (every io dtype of the chains); with ``gpu``, every other case is a device graph
    on the GPU engines (FLOAT)."""
    rng = np.random.default_rng(seed)
    dtypes = sorted(pf.DTYPES)
    cases = []
    for i in range(count):
        on_gpu = gpu and i % 2 == 1
        table = GPU_MUTATIONS if on_gpu else MUTATIONS
        cases.append({"i": i, "seed": int(rng.integers(2**31)), "chain": int(rng.integers(64)),
                      "mutation": table[int(rng.integers(len(table)))], "gpu": on_gpu,
                      "producer": int(rng.integers(1 << 16)),
                      "dtype": "FLOAT" if on_gpu else dtypes[int(rng.integers(len(dtypes)))]})
    return cases


_PRODUCERS: dict = {}


def run_gpu_case(spec) -> dict:
    """One device-graph case: buffers of a producer picked by the spec (bench/soak.py's producers:
    CuPy, torch, JAX, numba, raw int), compared with NumPy after a synchronize."""
    import cudnn_graph as cudnn
    import soak
    if not _PRODUCERS:
        _PRODUCERS.update(soak.producers(cpu=False))
    try:
        g, x, b, y, virtuals, dims, ops = chain_graph(spec["chain"], "cuda")
    except cudnn.GraphNotSupportedError as exc:
        return {"outcome": "typed", "detail": f"declined: {type(exc).__name__}"}
    names = sorted(_PRODUCERS)
    name = names[spec["producer"] % len(names)]
    make, to_host, _ = _PRODUCERS[name]
    rng = np.random.default_rng(spec["seed"])
    mutation = spec["mutation"]
    xv = rng.uniform(-2, 2, dims).astype(np.float32)
    bv = rng.uniform(-2, 2, dims).astype(np.float32)
    xb, bb, yb = make(xv), make(bv), make(np.zeros(dims, np.float32))
    keys = {x: soak._unwrap(xb[0]), b: soak._unwrap(bb[0]), y: soak._unwrap(yb[0])}
    pack, at_fault = dict(keys), None
    if mutation == "key_uid":
        pack = {t.uid: v for t, v in keys.items()}
    elif mutation == "key_name":
        pack = {t.name: v for t, v in keys.items()}
    elif mutation == "foreign":
        pack = {chain_graph((spec["chain"] + 1) % 64, "cuda")[1]: keys[x], b: keys[b], y: keys[y]}
        at_fault = "x"
    elif mutation == "virtual" and virtuals:
        pack[virtuals[0]] = keys[b]
        at_fault = virtuals[0].name
    elif mutation == "duplicate":
        pack[x.uid] = keys[x]
        at_fault = "x"
    elif mutation == "missing":
        del pack[b]
        at_fault = "b"
    elif mutation == "extra":
        pack[12345] = keys[x]
        at_fault = "12345"
    elif mutation == "dtype":
        pack[x] = soak._unwrap(make(xv.astype(np.float16))[0]) if name != "int" else keys[x]
        at_fault = None if name == "int" else "x"
    elif mutation == "shape":
        pack[x] = soak._unwrap(make(np.zeros(dims + [2], np.float32))[0]) if name != "int" else keys[x]
        at_fault = None if name == "int" else "x"
    elif mutation == "misaligned":
        pack[x] = _PRODUCERS["int"][0](np.zeros(xv.size + 1, np.float32))[0] if "int" in _PRODUCERS else keys[x]
        if isinstance(pack[x], tuple):
            keep_alive = pack[x]
            pack[x] = keep_alive[0] + 2
        at_fault = "x"
    elif mutation == "host_buffer":
        pack[x] = xv
        at_fault = "x"
    try:
        g.execute(pack)
        soak._synchronize(False)
    except cudnn.CudnnGraphError as exc:
        if at_fault is not None and at_fault not in str(exc):
            return {"outcome": "wrong", "detail": f"gpu {name} {mutation}: typed error not naming {at_fault!r}: {str(exc)[:200]}"}
        return {"outcome": "typed", "detail": f"gpu {name} {mutation}: {type(exc).__name__}"}
    except Exception as exc:
        return {"outcome": "wrong", "detail": f"gpu {name} {mutation}: untyped {type(exc).__name__}: {str(exc)[:200]}"}
    got = np.asarray(to_host(yb[0]), np.float32)
    if not np.allclose(got, expected(ops, xv, bv), rtol=2e-3, atol=1e-4, equal_nan=True):
        return {"outcome": "wrong", "detail": f"gpu {name} {mutation}: executed, result differs"}
    return {"outcome": "ok", "detail": f"gpu {name} {mutation}"}


def run_case(spec) -> dict:
    """Run one case in this process; returns {"outcome", "detail"}."""
    import cudnn_graph as cudnn
    if spec.get("gpu"):
        return run_gpu_case(spec)
    if spec["mutation"] != "bad_attribute":
        return pf.run_host_case(spec)
    rng = np.random.default_rng(spec["seed"])
    dims = chain_graph(spec["chain"])[5]
    try:
        bad = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
                            device="cpu")
        t = bad.tensor(name="t", dim=dims, stride=[int(np.prod(dims[i + 1:])) for i in range(len(dims))])
        getattr(bad, "scale")(t, float(rng.choice([np.nan, np.inf])) if rng.random() < 0.5 else "x")
        bad.build()
        return {"outcome": "ok", "detail": "accepted"}   # a NaN scale is a value, not an error
    except cudnn.CudnnGraphError as exc:
        return {"outcome": "typed", "detail": type(exc).__name__}
    except (TypeError, ValueError) as exc:   # argument errors name the argument, where given
        return {"outcome": "typed", "detail": type(exc).__name__}


# ---- batches in child processes ----------------------------------------------------------------------

def child_main(path: str) -> None:
    """Run the cases in ``path`` (JSON); one JSON line per result on stdout."""
    for spec in json.loads(Path(path).read_text()):
        try:
            result = run_case(spec)
        except BaseException as exc:   # a bench bug in one case must not lose the batch
            result = {"outcome": "wrong", "detail": f"harness: {type(exc).__name__}: {exc}"}
        print(json.dumps({"i": spec["i"], **result}), flush=True)


def run_batch(specs, tmp: Path) -> list:
    tmp.write_text(json.dumps(specs))
    proc = subprocess.run([sys.executable, __file__, "--child", str(tmp)], capture_output=True, text=True)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        done = {r["i"] for r in results}
        rest = [s for s in specs if s["i"] not in done]
        if rest:   # the first unfinished case crashed the child; the others run again
            results.append({"i": rest[0]["i"], "outcome": "crash",
                            "detail": f"{rest[0]['mutation']}: exit {proc.returncode}: {proc.stderr[-300:]}"})
            results += run_batch(rest[1:], tmp) if len(rest) > 1 else []
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=5000, help="cases per child process")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="child processes at once")
    parser.add_argument("--cpu", action="store_true", help="host graphs only, even with a GPU")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    from concurrent.futures import ThreadPoolExecutor
    import tempfile
    gpu = False
    if not args.cpu:
        from cudnn_graph import _driver
        gpu = _driver.driver_available() and _driver.device_count() > 0
    specs = generate_cases(args.seed, args.cases, gpu)
    batches = [specs[i:i + args.batch] for i in range(0, len(specs), args.batch)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmpdir, ThreadPoolExecutor(args.jobs) as pool:
        parts = list(pool.map(lambda ib: run_batch(ib[1], Path(tmpdir) / f"b{ib[0]}.json"), enumerate(batches)))
    results = [r for part in parts for r in part]
    elapsed = time.perf_counter() - start
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("ok", "typed", "wrong", "leak", "crash")}
    by_mutation: dict = {}
    for spec, r in zip(sorted(specs, key=lambda s: s["i"]), sorted(results, key=lambda r: r["i"])):
        row = by_mutation.setdefault(("gpu " if spec["gpu"] else "") + spec["mutation"], {k: 0 for k in counts})
        row[r["outcome"]] += 1
    print(f"{'mutation':<24} " + " ".join(f"{k:>7}" for k in counts))
    for m, row in sorted(by_mutation.items()):
        print(f"{m:<24} " + " ".join(f"{row[k]:>7}" for k in counts))
    print(f"{'total':<24} " + " ".join(f"{counts[k]:>7}" for k in counts))
    engines = "reference (host graphs)" + (" + GPU engines (device graphs, every other case)" if gpu else "")
    print(f"{len(results)} cases in {elapsed:.1f} s; engines: {engines}")
    bad = [r for r in results if r["outcome"] in ("wrong", "leak", "crash")]
    for r in bad[:20]:
        print(f"  case {r['i']}: {r['outcome']}: {r['detail']}")
    summary = {"fuzzer": NAME, "seed": args.seed, "cases": len(results), "seconds": elapsed, "gpu": gpu, **counts,
               "by_mutation": by_mutation, "failures": bad[:200], "failed": len(bad)}
    print(f"wrote {_fuzz_common.write_json(summary, args.json)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
