"""The CuTe GEMM's compiled kernels on disk, shared by every process of the user through
``engines/_kernel_disk_cache.py``, and the kernel bytes a serialized CuTe plan carries.

Two artifacts per kernel spec (a shape class or a static shape):

- the DSL's ahead-of-time export of the compiled host entry and its cubin (``export_to_c``: a relocatable
  object), which ``cute.runtime.load_module`` reloads in milliseconds once the DSL is imported;
- that object linked into a shared object (``_shared_object.link``; where a C compiler is found), which a
  later process loads with no DSL import at all: the DSL's import (over a second) was most of a new
  process's first CuTe graph.

A load tries the shared object first. Keys hold the DSL version, the driver version, the target
architecture and the whole spec (types, layouts or shape-class symbols, epilogue, knobs, the persistent
grid's size), so an entry is only ever loaded where it was built for; computing one imports no DSL.
Anything that goes wrong on the way back (an entry a loader rejects) is logged, the entry discarded, and
the caller compiles: the disk never fails a build.

The device facts the specs depend on (SM count, co-resident clusters per cluster size, asked of the DSL's
HardwareInfo) are kept too, per GPU model and driver, so a warm process needs the DSL for neither.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import logging
import os
import shutil
import tempfile

from .._kernel_disk_cache import KernelDiskCache, KernelKey
from . import _shared_object

logger = logging.getLogger(__name__)

ENGINE = "cute_gemm"
SHARED_OBJECT_ENGINE = "cute_gemm_shared_object"
DEVICE_FACTS_ENGINE = "cute_gemm_device"
FUNCTION_PREFIX = "cudnn_graph_cute_gemm"
PLAN_RECORD_FORMAT = 2      # the JSON line a serialized CuTe plan's kernel bytes start with
_scratch = None             # this process's folder for export / load files (load_module takes a path)


def _scratch_dir() -> str:
    global _scratch
    if _scratch is None:
        _scratch = tempfile.mkdtemp(prefix="cudnn_graph_cute_")
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


@functools.lru_cache(maxsize=1)
def dsl_version() -> str:
    """The installed nvidia-cutlass-dsl's version, read from its metadata (no import); a DSL without
    metadata (a source checkout) is asked itself, and "unknown" where that fails too (a broken install,
    which compiles nothing: its keys are never stored)."""
    import importlib.metadata
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import cutlass
        return str(cutlass.__version__)
    except Exception:                   # noqa: BLE001  (whatever a broken DSL raises: the engine declines)
        return "unknown"


def _driver_version() -> str:
    try:
        from ..._driver import driver_version
        version = driver_version()
    except Exception:                       # no driver (the CPU export tests): keys stay distinct by "none"
        version = 0
    return str(version) if version else "none"


def _arch() -> str:
    target = os.environ.get("CUTE_DSL_ARCH")
    if target:
        return target
    try:
        from .._device import compute_capability
        major, minor = compute_capability(0)
        return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    except Exception:
        return "unknown"


def key_for(spec, engine: str = ENGINE) -> KernelKey:
    """The disk-cache key of a kernel spec's artifact (``engine`` tells the two artifacts apart)."""
    return KernelKey(engine=engine, dsl="nvidia-cutlass-dsl", dsl_version=dsl_version(),
                     driver_version=_driver_version(), arch=_arch(), kernel_class=dataclasses.asdict(spec))


@dataclasses.dataclass(frozen=True)
class Export:
    """A compiled kernel's export: the relocatable object, its host entry's symbol, and (where it could
    be linked) the shared object."""
    object_bytes: bytes
    entry_symbol: str | None
    shared_object: bytes | None


def export(compiled) -> Export | None:
    """``compiled``'s ahead-of-time export (and its link), or None (logged) if the export failed: the
    kernel in memory is unaffected."""
    if isinstance(compiled, _shared_object.SharedKernel):
        return Export(b"", compiled.symbol, compiled.shared_object)
    folder = tempfile.mkdtemp(dir=_scratch_dir())
    try:
        compiled.export_to_c(file_path=folder, file_name="gemm", function_prefix=FUNCTION_PREFIX)
        with open(os.path.join(folder, "gemm.o"), "rb") as f:
            object_bytes = f.read()
        with open(os.path.join(folder, "gemm.h")) as f:
            symbol = _shared_object.entry_symbol(f.read())
    except Exception as exc:
        logger.warning("CuTe GEMM kernel export failed (%s: %s)", type(exc).__name__, exc)
        return None
    finally:
        shutil.rmtree(folder, True)
    shared = _shared_object.link(object_bytes) if symbol else None
    return Export(object_bytes, symbol, shared)


def load_object(data: bytes, function_prefix: str = FUNCTION_PREFIX):
    """The compiled kernel an exported object holds, through the DSL (raises what its loader raises)."""
    import cutlass.cute as cute
    fd, path = tempfile.mkstemp(suffix=".o", dir=_scratch_dir())
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return getattr(cute.runtime.load_module(path), function_prefix)


def load_shared(data: bytes, meta: dict) -> "_shared_object.SharedKernel":
    """The kernel a linked shared object holds, with no DSL import (raises SharedObjectError)."""
    return _shared_object.SharedKernel.load(data, meta["entry_symbol"],
                                            meta.get("function_prefix", FUNCTION_PREFIX),
                                            _shared_object.runtime_path(meta.get("runtime")), _scratch_dir())


def available(spec, cache: KernelDiskCache | None = None) -> bool:
    """Whether the disk holds an artifact of ``spec`` (a file lookup: nothing is read or loaded)."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return False
    return any(os.path.exists(cache.path_for(key_for(spec, engine)) or "")
               for engine in (SHARED_OBJECT_ENGINE, ENGINE))


def load(spec, cache: KernelDiskCache | None = None):
    """The compiled kernel of ``spec`` from the disk cache (the shared object first: no DSL import), or
    None (a miss, or entries that did not load)."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return None
    key = key_for(spec, SHARED_OBJECT_ENGINE)
    entry = cache.entry(key)
    if entry is not None:
        try:
            return load_shared(entry.data, entry.meta)
        except (_shared_object.SharedObjectError, KeyError) as exc:
            cache.discard(key, f"it did not load ({type(exc).__name__}: {exc})")
    key = key_for(spec)
    entry = cache.entry(key)
    if entry is None:
        return None
    try:
        return load_object(entry.data, entry.meta.get("function_prefix", FUNCTION_PREFIX))
    except Exception as exc:
        cache.discard(key, f"the DSL could not load it ({type(exc).__name__}: {exc})")
        return None


def _shared_meta(found: Export) -> dict:
    return {"function_prefix": FUNCTION_PREFIX, "entry_symbol": found.entry_symbol,
            "runtime": _shared_object.runtime_path()}


def store(spec, compiled, cache: KernelDiskCache | None = None) -> bool:
    """Export ``compiled`` (and link it) and keep both for later processes; False when the cache is off
    or the export failed."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return False
    found = export(compiled)
    if found is None:
        return False
    stored = bool(found.object_bytes) and cache.store(key_for(spec), found.object_bytes,
                                                      {"function_prefix": FUNCTION_PREFIX})
    if found.shared_object is not None:
        stored = cache.store(key_for(spec, SHARED_OBJECT_ENGINE), found.shared_object,
                             _shared_meta(found)) or stored
    return stored


def plan_kernels(spec, compiled) -> bytes | None:
    """What a serialized CuTe plan carries: a one-line JSON record (format, the kernel's disk key, the
    host entry's symbol, the parts' sizes) then the exported object and the linked shared object; None
    if the export failed."""
    found = export(compiled)
    if found is None:
        return None
    shared = found.shared_object or b""
    record = {"format": PLAN_RECORD_FORMAT, "key": key_for(spec).as_json(), "entry_symbol": found.entry_symbol,
              "function_prefix": FUNCTION_PREFIX, "object_size": len(found.object_bytes),
              "shared_object_size": len(shared), "runtime": _shared_object.runtime_path()}
    return json.dumps(record, sort_keys=True).encode() + b"\n" + found.object_bytes + shared


def _split(payload: bytes):
    """(record, offset of the object, its size, offset of the shared object, its size) of
    ``plan_kernels``' bytes, or None when they are not of this format."""
    line, newline, data = payload.partition(b"\n")
    try:
        record = json.loads(line)
        n_object, n_shared = int(record["object_size"]), int(record["shared_object_size"])
        ok = record.get("format") == PLAN_RECORD_FORMAT and newline and n_object >= 0 and n_shared >= 0
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not ok or n_object + n_shared != len(data):
        return None
    start = len(line) + 1
    return record, start, n_object, start + n_object, n_shared


def _plan_parts(spec, payload: bytes):
    """(record, object bytes, shared-object bytes) of ``plan_kernels``' bytes, or None when they were made
    for another DSL, architecture or spec, or are not of this format."""
    found = _split(payload)
    if found is None:
        return None
    record, at_object, n_object, at_shared, n_shared = found
    try:
        same = record["key"] == json.loads(json.dumps(key_for(spec).as_json(), sort_keys=True))
    except (KeyError, TypeError):
        return None
    if not same:
        return None
    return record, payload[at_object:at_object + n_object], payload[at_shared:at_shared + n_shared]


def plan_shared_object(payload: bytes):
    """(record, offset, size) of the linked shared object inside ``plan_kernels``' bytes (what the blob's
    DSL launch section points the C runtime at), or None where they hold none (no C compiler linked it)."""
    found = _split(payload)
    if found is None or not found[4] or not found[0].get("entry_symbol"):
        return None
    record, _, _, at_shared, n_shared = found
    return record, at_shared, n_shared


def kernel_from_plan(spec, payload: bytes):
    """The compiled kernel of ``spec`` from ``plan_kernels``' bytes (the shared object first), or None
    (logged) when they were made for another DSL, architecture or spec, or do not load: the caller then
    compiles."""
    parts = _plan_parts(spec, payload)
    if parts is None:
        logger.info("CuTe GEMM: the serialized plan's kernel was built for another DSL, GPU or spec; compiling")
        return None
    record, object_bytes, shared = parts
    if shared and record.get("entry_symbol"):
        try:
            return load_shared(shared, record)
        except _shared_object.SharedObjectError as exc:
            logger.info("CuTe GEMM: the serialized plan's shared object did not load (%s); trying its object",
                        exc)
    if not object_bytes:
        return None
    try:
        return load_object(object_bytes)
    except Exception as exc:
        logger.warning("CuTe GEMM: the serialized plan's kernel did not load (%s: %s); compiling",
                       type(exc).__name__, exc)
        return None


def _device_key(name: str, ordinal_cc: tuple) -> KernelKey:
    return KernelKey(engine=DEVICE_FACTS_ENGINE, dsl="nvidia-cutlass-dsl", dsl_version=dsl_version(),
                     driver_version=_driver_version(), arch=_arch(),
                     kernel_class={"device_name": name, "compute_capability": list(ordinal_cc)})


def load_device_facts(name: str, cc: tuple, cache: KernelDiskCache | None = None) -> dict | None:
    """The device facts kept for this GPU model and driver, or None."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return None
    entry = cache.entry(_device_key(name, cc))
    if entry is None:
        return None
    try:
        facts = json.loads(entry.data)
        return {"sm_count": int(facts["sm_count"]),
                "clusters": {int(k): int(v) for k, v in facts["clusters"].items()}}
    except (ValueError, KeyError, TypeError, AttributeError):
        cache.discard(_device_key(name, cc), "its device facts are malformed")
        return None


def store_device_facts(name: str, cc: tuple, sm_count: int, clusters: dict,
                       cache: KernelDiskCache | None = None) -> bool:
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return False
    data = json.dumps({"sm_count": sm_count, "clusters": {str(k): v for k, v in clusters.items()}}).encode()
    return cache.store(_device_key(name, cc), data, {})
