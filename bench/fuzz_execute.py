"""Fuzz graph.execute: random variant packs and random op chains; every outcome a correct result or a
typed error naming the tensor.

A case is one execute of one graph (a random chain of pointwise ops over one random shape, with a
random bad attribute now and then) with a randomly built variant pack: keys of every kind (Tensor,
uid, name, a foreign graph's Tensor, a virtual tensor, duplicates, missing, extra), buffers of every
producer available (NumPy, DLPack capsules; CuPy, torch, JAX, numba and raw ints with a GPU), wrong
dtypes, shapes, strides (negative, zero, overlapping), devices and alignments, and misused DLPack
capsules (reused, wrong name, wrong version, NULL deleter; their deleter calls are counted).

Outcomes: ``ok`` (matches NumPy), ``typed`` (a CudnnGraphError), ``wrong`` (a wrong answer, or an
untyped exception, or a typed one that does not name the tensor at fault), ``leak`` (a capsule's
deleter not called exactly once when consumed, or called when refused), ``crash`` (the child process
running a batch died; the batch's remaining cases are run again one child each to pin the crasher).

Cases run in child processes in batches of ``--batch``: a crash is counted, not fatal. The engines
fuzzed: the reference engine (host graphs); with a GPU, also the GPU engines on device graphs.
With a GPU, every other case is a device graph (the GPU engines; buffers from CuPy, torch, JAX, numba
or raw ints, as importable); ``--cpu`` keeps to host graphs. ``--cases`` (default 100,000),
``--seed``; prints the table, writes bench/results/fuzz_execute-<host>-seed<seed>.json.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fuzz_common  # noqa: E402  (bench/ is not a package)

NAME = "fuzz_execute"
OPS = ("relu", "tanh", "sigmoid", "abs", "neg", "exp", "add", "mul", "sub")
NUMPY_OPS = {"relu": lambda a: np.maximum(a, 0), "tanh": np.tanh, "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
             "abs": np.abs, "neg": np.negative, "exp": np.exp, "add": np.add, "mul": np.multiply,
             "sub": np.subtract}
MUTATIONS = ("none", "none", "none", "key_uid", "key_name", "foreign", "virtual", "duplicate", "missing",
             "extra", "dtype", "shape", "stride_negative", "stride_zero", "stride_overlap", "misaligned",
             "readonly_output", "capsule", "capsule_reused", "capsule_wrong_name", "capsule_wrong_version",
             "capsule_null_deleter", "int_on_host", "bad_attribute", "capsule_versioned")


# ---- DLPack capsules made by hand (ctypes), to misuse them and count their deleter calls ------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


DELETER_CALLS = [0]
_deleter = _DELETER(lambda _: DELETER_CALLS.__setitem__(0, DELETER_CALLS[0] + 1))
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def versioned_capsule(array: np.ndarray, *, major=1, name=b"dltensor_versioned", null_deleter=False):
    """A DLPack 1.x capsule over a float32 NumPy array; returns (capsule, keepalive)."""
    shape = (ctypes.c_int64 * array.ndim)(*array.shape)
    strides = (ctypes.c_int64 * array.ndim)(*(s // array.itemsize for s in array.strides))
    m = _DLManagedVersioned(major, 0, None, _DELETER() if null_deleter else _deleter, 0,
                            _DLTensor(array.ctypes.data, _DLDevice(1, 0), array.ndim, _DLDataType(2, 32, 1),
                                      shape, strides, 0))
    return _new_capsule(ctypes.addressof(m), name, None), (m, shape, strides, array, name)


# ---- one case ----------------------------------------------------------------------------------------

GPU_MUTATIONS = ("none", "none", "none", "key_uid", "key_name", "foreign", "virtual", "duplicate", "missing",
                 "extra", "dtype", "shape", "misaligned", "host_buffer")


def generate_cases(seed: int, count: int, gpu: bool = False) -> list:
    """Host-graph cases; with ``gpu``, every other case is a device graph on the GPU engines."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        on_gpu = gpu and i % 2 == 1
        table = GPU_MUTATIONS if on_gpu else MUTATIONS
        cases.append({"i": i, "seed": int(rng.integers(2**31)), "chain": int(rng.integers(64)),
                      "mutation": table[int(rng.integers(len(table)))], "gpu": on_gpu,
                      "producer": int(rng.integers(1 << 16))})
    return cases


_GRAPHS: dict = {}


def chain_graph(chain: int, device: str = "cpu"):
    """A small graph: a chain of 1-4 ops over one shape, built once per (chain number, device)."""
    if (chain, device) in _GRAPHS:
        return _GRAPHS[chain, device]
    import cudnn_graph as cudnn
    F = cudnn.data_type
    rng = np.random.default_rng(1000 + chain)
    dims = [int(d) for d in rng.integers(1, 9, int(rng.integers(1, 4)))]
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)
    strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
    x = g.tensor(name="x", dim=dims, stride=strides)
    b = g.tensor(name="b", dim=dims, stride=strides)
    ops = [OPS[int(k)] for k in rng.integers(len(OPS), size=int(rng.integers(0, 4)))]
    ops.insert(int(rng.integers(len(ops) + 1)), ("add", "mul", "sub")[chain % 3])   # b is always used
    t, virtuals = x, []
    for op in ops:
        t = getattr(g, op)(t, b) if op in ("add", "mul", "sub") else getattr(g, op)(t)
        virtuals.append(t)
    t.set_output(True).set_name("y")
    g.build([cudnn.heur_mode.A])
    _GRAPHS[chain, device] = (g, x, b, t, virtuals[:-1], dims, ops)
    return _GRAPHS[chain, device]


def expected(ops, xv, bv):
    t = xv.astype(np.float32)
    for op in ops:
        t = NUMPY_OPS[op](t, bv) if op in ("add", "mul", "sub") else NUMPY_OPS[op](t)
    return t.astype(np.float32)


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
    g, x, b, y, virtuals, dims, ops = chain_graph(spec["chain"])
    rng = np.random.default_rng(spec["seed"])
    mutation = spec["mutation"]
    xv = rng.uniform(-2, 2, dims).astype(np.float32)
    bv = rng.uniform(-2, 2, dims).astype(np.float32)
    out = np.full(dims, np.nan, np.float32)
    pack = {x: xv, b: bv, y: out}
    at_fault, keep, capsule, deleters_before = None, [], None, DELETER_CALLS[0]
    if mutation == "bad_attribute":
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
    if mutation == "key_uid":
        pack = {x.uid: xv, b.uid: bv, y.uid: out}
    elif mutation == "key_name":
        pack = {"x": xv, "b": bv, "y": out}
    elif mutation == "foreign":
        other = chain_graph((spec["chain"] + 1) % 64)
        pack = {other[1]: xv, b: bv, y: out}
        at_fault = "x"
    elif mutation == "virtual" and virtuals:
        pack[virtuals[0]] = np.zeros(dims, np.float32)
        at_fault = virtuals[0].name
    elif mutation == "duplicate":
        pack = {x: xv, x.uid: xv.copy(), b: bv, y: out}
        at_fault = "x"
    elif mutation == "missing":
        del pack[b]
        at_fault = "b"
    elif mutation == "extra":
        pack[12345] = xv
        at_fault = "12345"
    elif mutation == "dtype":
        pack[x] = xv.astype(np.float64)
        at_fault = "x"
    elif mutation == "shape":
        pack[x] = np.zeros(dims + [2], np.float32)
        at_fault = "x"
    elif mutation in ("stride_negative", "stride_zero", "stride_overlap"):
        if mutation == "stride_negative":
            pack[x] = np.ascontiguousarray(xv[::-1])[::-1] if len(dims) else xv
            xv = pack[x]
        elif mutation == "stride_zero":
            pack[x] = np.broadcast_to(xv.reshape(-1)[:1].reshape([1] * len(dims)), dims)
            xv = np.asarray(pack[x])
        else:
            pack[y] = np.lib.stride_tricks.as_strided(out, dims, [0] * len(dims))
        at_fault = "y" if mutation == "stride_overlap" else "x"
    elif mutation == "misaligned":
        raw = np.zeros(xv.size * 4 + 2, np.uint8)
        pack[x] = np.frombuffer(raw.data, np.float32, xv.size, offset=2).reshape(dims)   # 2-byte aligned
        pack[x][...] = xv
        keep.append(raw)
    elif mutation == "readonly_output":
        out.flags.writeable = False
        at_fault = "y"
    elif mutation == "capsule":
        pack[x] = xv.__dlpack__()
    elif mutation == "capsule_reused":
        capsule = xv.__dlpack__()
        try:
            g.execute({x: capsule, b: bv, y: np.empty(dims, np.float32)})
        except cudnn.CudnnGraphError:
            pass
        pack[x] = capsule
        at_fault = "x"
    elif mutation == "capsule_wrong_name":
        capsule, k = versioned_capsule(xv, name=b"not_a_tensor")
        keep.append(k)
        pack[x] = capsule
        at_fault = "x"
    elif mutation == "capsule_wrong_version":
        capsule, k = versioned_capsule(xv, major=99)
        keep.append(k)
        pack[x] = capsule
        at_fault = "x"
    elif mutation == "capsule_null_deleter":
        capsule, k = versioned_capsule(xv, null_deleter=True)
        keep.append(k)
        pack[x] = capsule
    elif mutation == "int_on_host":
        pack[x] = int(xv.ctypes.data) + 64
        at_fault = "x"
    elif mutation == "capsule_versioned":
        capsule, k = versioned_capsule(xv)   # a well-formed DLPack 1.x capsule: consumed, deleter once
        keep.append(k)
        pack[x] = capsule
    try:
        g.execute(pack)
    except cudnn.CudnnGraphError as exc:
        message = str(exc)
        if at_fault is not None and at_fault not in message:
            return {"outcome": "wrong", "detail": f"{mutation}: typed error not naming {at_fault!r}: {message[:200]}"}
        outcome = {"outcome": "typed", "detail": f"{mutation}: {type(exc).__name__}"}
    except Exception as exc:   # anything untyped counts as wrong
        return {"outcome": "wrong", "detail": f"{mutation}: untyped {type(exc).__name__}: {str(exc)[:200]}"}
    else:
        want = expected(ops, np.asarray(xv), bv)
        got = out
        if mutation == "stride_overlap" or not np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True):
            return {"outcome": "wrong", "detail": f"{mutation}: executed, result differs or output overlaps"}
        outcome = {"outcome": "ok", "detail": mutation}
    if mutation.startswith("capsule_") and mutation != "capsule_reused":
        name = _capsule_name(capsule)
        calls = DELETER_CALLS[0] - deleters_before
        consumed = bool(name) and name.startswith(b"used_")
        expected_calls = 1 if consumed and mutation != "capsule_null_deleter" else 0
        if calls != expected_calls:
            return {"outcome": "leak", "detail": f"{mutation}: deleter called {calls}x, consumed={consumed}"}
    return outcome


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
