"""What bench/fuzz_conv.py and bench/fuzz_matmul.py share: seeded case lists, one case run on the GPU
against the reference engine, outcomes counted (passed / declined by reason / failed), a table and a
JSON record under bench/results/.

A fuzzer is a module (or any object) with:

* ``NAME``: the file stem its results take;
* ``generate_cases(seed, count) -> [spec]``: JSON-able dicts, the same list for the same seed;
* ``build(device, spec) -> (graph, {name: Tensor})``: the graph of one case;
* ``host_inputs(spec) -> {name: ndarray}``: inputs laid out with the strides ``build`` declares
  (the values are seeded by the spec);
* ``outputs(spec) -> tuple``: the output names compared;
* ``tolerance(spec) -> float``: max error allowed relative to ``max(1, max |reference|)``.

A case passes when the GPU matches the reference engine; it is declined when building it for the GPU
raises GraphNotSupportedError (the reason is recorded and counted); anything else is a failure.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import time
import traceback
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

# Max error per io data type, relative to max(1, max |reference|). FLOAT allows TF32 tensor cores.
TOLERANCE = {"FLOAT": 5e-3, "HALF": 1e-2, "BFLOAT16": 5e-2, "DOUBLE": 1e-9}


# ---- layouts and host arrays ------------------------------------------------------------------------

def packed_strides(dims, order) -> tuple:
    """Element strides of a packed tensor of ``dims`` whose axes lie in memory outermost-first ``order``."""
    strides = [0] * len(dims)
    acc = 1
    for axis in reversed(order):
        strides[axis] = acc
        acc *= dims[axis]
    return tuple(strides)


def host_dtype(name: str):
    """The NumPy dtype of a DataType name (bfloat16 through ml_dtypes)."""
    import ml_dtypes
    return {"FLOAT": np.float32, "HALF": np.float16, "BFLOAT16": ml_dtypes.bfloat16, "DOUBLE": np.float64,
            "INT32": np.int32, "INT64": np.int64, "INT8": np.int8, "UINT8": np.uint8}[name]


def random_packed(rng, dims, order, dtype, scale=1.0) -> np.ndarray:
    """Uniform values in [-scale, scale) in a packed buffer with axis ``order``, viewed with logical dims."""
    physical = tuple(dims[a] for a in order)
    values = (rng.uniform(-1.0, 1.0, physical) * scale).astype(dtype)
    return np.transpose(values, [list(order).index(a) for a in range(len(dims))])


def strided_empty(dtype, dims, strides) -> np.ndarray:
    """A zeroed host array of ``dims`` viewed with element ``strides``."""
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(d > 0 for d in dims) else 1
    base = np.zeros(max(span, 1), dtype)
    item = base.dtype.itemsize
    return np.lib.stride_tricks.as_strided(base, shape=tuple(dims), strides=tuple(s * item for s in strides))


def _exotic(dtype) -> bool:
    return np.dtype(dtype).kind == "V" or np.dtype(dtype).name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def host_buffer(array):
    """NumPy exports no bfloat16 through DLPack: such arrays go in as host Slots over the same memory."""
    import cudnn_graph as cudnn
    if _exotic(array.dtype):
        item = array.dtype.itemsize
        return cudnn.Slot.from_address(array.ctypes.data, array.shape, tuple(s // item for s in array.strides),
                                       array.dtype.name, "cpu")
    return array


# ---- running one case -------------------------------------------------------------------------------

def reference_outputs(fuzzer, spec, inputs) -> dict:
    """Run the case on the host reference engine; {output name: array}."""
    import cudnn_graph as cudnn
    g, t = fuzzer.build("cpu", spec)
    g.build([cudnn.heur_mode.A])
    outs, pack = {}, {}
    for name, tensor in t.items():
        if name in fuzzer.outputs(spec):
            outs[name] = strided_empty(host_dtype(g.view.data_type(tensor).name), tensor.dim, tensor.stride)
            pack[tensor] = host_buffer(outs[name])
        elif name in inputs:
            pack[tensor] = host_buffer(inputs[name])
    g.execute(pack)
    return outs


def build_gpu(fuzzer, spec):
    """The case's graph built for the GPU (raises GraphNotSupportedError when every engine declines)."""
    import cudnn_graph as cudnn
    g, t = fuzzer.build("cuda", spec)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, t


def _cupy_strided(cp, array):
    """A CuPy array with the values and element strides of a host array (bf16 by its bits)."""
    raw = np.ascontiguousarray(array)
    if _exotic(array.dtype):
        raw = raw.view({2: np.uint16, 1: np.uint8}[array.dtype.itemsize])
    item = array.dtype.itemsize
    span = 1 + sum((d - 1) * s for d, s in zip(array.shape, array.strides)) // item if array.size else 1
    base = cp.zeros(max(span, 1), raw.dtype)
    view = cp.lib.stride_tricks.as_strided(base, shape=array.shape, strides=array.strides)
    view[...] = cp.asarray(raw)
    return view


def _cupy_buffer(array_dev, dtype):
    """What execute takes for a CuPy array holding ``dtype`` (bf16 bits go in as a Slot)."""
    import cudnn_graph as cudnn
    if not _exotic(dtype):
        return array_dev
    a = array_dev
    return cudnn.Slot.from_address(a.data.ptr, a.shape, tuple(s // a.itemsize for s in a.strides),
                                   np.dtype(dtype).name, ("cuda", a.device.id))


def gpu_outputs(fuzzer, spec, inputs, graph=None):
    """Run the case on the GPU from CuPy arrays; ({output name: host array}, graph)."""
    import cupy as cp
    g, t = graph if graph is not None else build_gpu(fuzzer, spec)
    pack, keep, outs = {}, [], {}
    for name, tensor in t.items():
        if name in fuzzer.outputs(spec):
            dtype = host_dtype(g.view.data_type(tensor).name)
            dev = _cupy_strided(cp, strided_empty(dtype, tensor.dim, tensor.stride))
            if np.dtype(dev.dtype).kind == "f":
                dev.fill(np.nan)      # an output the plan leaves unwritten shows as NaN
            outs[name] = (dev, dtype)
            pack[tensor] = _cupy_buffer(dev, dtype)
        elif name in inputs:
            dev = _cupy_strided(cp, inputs[name])
            keep.append(dev)
            pack[tensor] = _cupy_buffer(dev, inputs[name].dtype)
    g.execute(pack)
    cp.cuda.Device().synchronize()
    return {name: _host_copy(cp, dev, dtype) for name, (dev, dtype) in outs.items()}, g


def _host_copy(cp, dev, dtype) -> np.ndarray:
    """A device output on the host, as ``dtype`` (CuPy holds exotic types as same-width integers)."""
    raw = cp.asnumpy(dev)
    return raw.view(dtype) if raw.dtype != np.dtype(dtype) else raw


def max_error(got, want) -> tuple:
    """(max |got - want|, max(1, max |want|)); NaN anywhere counts as an infinite error."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != reference {want.shape}")
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    if want.size == 0:
        return 0.0, scale
    diff = np.abs(got - want)
    err = float("inf") if np.isnan(diff).any() else float(np.max(diff))
    return err, scale


_DIGITS = re.compile(r"\d+")
_PLAN = re.compile(r"\beng(?:ine)?\d+(?:_k\d+=\d+)*")


def reason_key(exc: BaseException) -> str:
    """A short, stable key for a decline: the GPU engines' first reason with numbers and plan names elided.

    The reference engine's "runs host graphs" decline is skipped (it always declines a CUDA graph).
    """
    declines = [(who, why) for who, why in getattr(exc, "declines", ())
                if "runs host graphs" not in why]
    who, why = declines[0] if declines else (type(exc).__name__, str(exc))
    who = _PLAN.sub("<plan>", who)
    first = why.splitlines()[0] if why else type(exc).__name__
    first = first.split(" (", 1)[0] if "cuDNN's heuristics" in first else first
    first = _PLAN.sub("<plan>", first)
    return f"{who}: {_DIGITS.sub('#', first)[:160]}"


def run_case(fuzzer, spec) -> dict:
    """Run one case; a record with ``outcome`` passed / declined / failed and what explains it."""
    from cudnn_graph.errors import GraphNotSupportedError
    record = {"spec": spec}
    start = time.perf_counter()
    try:
        built = build_gpu(fuzzer, spec)
    except GraphNotSupportedError as exc:
        record.update(outcome="declined", reason=reason_key(exc), detail=str(exc)[:4000])
        record["seconds"] = round(time.perf_counter() - start, 3)
        return record
    except Exception as exc:   # anything but a clean decline is a bug to report
        record.update(outcome="failed", error=f"{type(exc).__name__}: {exc}"[:4000],
                      traceback=traceback.format_exc()[-4000:], stage="build")
        record["seconds"] = round(time.perf_counter() - start, 3)
        return record
    try:
        g = built[0]
        plan = g.selected_plan
        record["plan"] = getattr(plan, "label", str(plan))
        inputs = fuzzer.host_inputs(spec)
        want = reference_outputs(fuzzer, spec, inputs)
        got, _ = gpu_outputs(fuzzer, spec, inputs, graph=built)
        tol = fuzzer.tolerance(spec)
        errors = {}
        for name in fuzzer.outputs(spec):
            err, scale = max_error(got[name], want[name])
            errors[name] = {"max_error": err, "scale": scale, "tolerance": tol}
            if not err <= tol * scale:
                raise AssertionError(f"{name}: max error {err:.3g} > {tol} x {scale:.3g}")
        record.update(outcome="passed", errors=errors)
    except Exception as exc:
        record.update(outcome="failed", error=f"{type(exc).__name__}: {exc}"[:4000],
                      traceback=traceback.format_exc()[-4000:], stage="execute/compare")
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def run(fuzzer, seed: int, count: int, log=None) -> dict:
    """Run ``count`` cases of ``seed``; a summary with every record and the counts."""
    records = []
    for spec in fuzzer.generate_cases(seed, count):
        rec = run_case(fuzzer, spec)
        records.append(rec)
        if log is not None:
            log(_line(rec))
    return summarize(fuzzer, seed, records)


def summarize(fuzzer, seed, records) -> dict:
    declined = {}
    for r in records:
        if r["outcome"] == "declined":
            declined[r["reason"]] = declined.get(r["reason"], 0) + 1
    return {
        "fuzzer": fuzzer.NAME, "seed": seed, "cases": len(records),
        "passed": sum(r["outcome"] == "passed" for r in records),
        "declined": dict(sorted(declined.items(), key=lambda kv: -kv[1])),
        "failed": sum(r["outcome"] == "failed" for r in records),
        "records": records,
        "host": platform.node(), "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _line(rec) -> str:
    spec = rec["spec"]
    what = rec["outcome"]
    extra = rec.get("reason") or rec.get("error") or rec.get("plan", "")
    return f"  case {spec['id']:>4} {spec.get('label', '')[:70]:<70} {what:<8} {str(extra)[:110]}"


def table(summary) -> str:
    """The summary as text: passed, declined by reason, failed (with their errors)."""
    lines = [f"{summary['fuzzer']}: seed {summary['seed']}, {summary['cases']} cases",
             f"  {'passed':<10} {summary['passed']:>5}",
             f"  {'declined':<10} {sum(summary['declined'].values()):>5}"]
    for reason, n in summary["declined"].items():
        lines.append(f"    {n:>5}  {reason}")
    lines.append(f"  {'failed':<10} {summary['failed']:>5}")
    for r in summary["records"]:
        if r["outcome"] == "failed":
            lines.append(f"    case {r['spec']['id']}: {r['spec'].get('label', '')}: {r['error'][:300]}")
    return "\n".join(lines)


def write_json(summary, path=None) -> Path:
    """Write the summary to ``path`` (default bench/results/<fuzzer>-<host>-seed<seed>.json)."""
    if path is None:
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node() or "host")
        path = RESULTS / f"{summary['fuzzer']}-{host}-seed{summary['seed']}.json"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return path


def main(fuzzer, doc: str, argv=None) -> int:
    """Command line shared by the fuzzers: --seed, --cases, --json, --quiet; exit 1 when a case failed."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="seed of the case list (default 0)")
    parser.add_argument("--cases", type=int, default=200, help="how many cases (default 200)")
    parser.add_argument("--json", default=None, help="where to write the results (default bench/results/)")
    parser.add_argument("--quiet", action="store_true", help="no line per case")
    args = parser.parse_args(argv)
    from cudnn_graph import _driver
    if _driver.device_count() == 0:
        parser.error("no CUDA GPU is visible; the fuzzer compares GPU runs with the reference engine")
    log = None if args.quiet else (lambda line: print(line, flush=True))
    summary = run(fuzzer, args.seed, args.cases, log)
    print(table(summary))
    print(f"wrote {write_json(summary, args.json)}")
    return 1 if summary["failed"] else 0
