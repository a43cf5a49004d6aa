"""The CuTe GEMM's compiled kernels on disk: one relocatable object per kernel spec (a shape class or a
static shape), shared by every process of the user through ``engines/_kernel_disk_cache.py``.

The artifact is the DSL's ahead-of-time export of the compiled host entry and its cubin
(``export_to_c``); a later process reloads it with ``cute.runtime.load_module`` in milliseconds instead of
compiling for about a second. The key holds the DSL version, the driver version, the target architecture
and the whole spec (types, layouts or shape-class symbols, epilogue, knobs, the persistent grid's size), so
an entry is only ever loaded where it was built for. Anything that goes wrong on the way back (an entry the
loader rejects) is logged, the entry discarded, and the caller compiles: the disk never fails a build.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import shutil
import tempfile

from .._kernel_disk_cache import KernelDiskCache, KernelKey

logger = logging.getLogger(__name__)

ENGINE = "cute_gemm"
FUNCTION_PREFIX = "cudnn_graph_cute_gemm"
_scratch = None           # this process's folder for export / load files (load_module takes a path)


def _scratch_dir() -> str:
    global _scratch
    if _scratch is None:
        _scratch = tempfile.mkdtemp(prefix="cudnn_graph_cute_")
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def _driver_version() -> str:
    try:
        import cuda.bindings.driver as cuda
        err, version = cuda.cuDriverGetVersion()
        return str(version) if int(err) == 0 else "unknown"
    except Exception:                       # no driver (the CPU export tests): keys stay distinct by "none"
        return "none"


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


def key_for(spec) -> KernelKey:
    """The disk-cache key of a kernel spec."""
    import cutlass
    return KernelKey(engine=ENGINE, dsl="nvidia-cutlass-dsl", dsl_version=str(cutlass.__version__),
                     driver_version=_driver_version(), arch=_arch(), kernel_class=dataclasses.asdict(spec))


def export_bytes(compiled) -> bytes | None:
    """The DSL's ahead-of-time export of ``compiled`` (a relocatable object), or None (logged) if the
    export failed: the kernel in memory is unaffected."""
    folder = tempfile.mkdtemp(dir=_scratch_dir())
    try:
        compiled.export_to_c(file_path=folder, file_name="gemm", function_prefix=FUNCTION_PREFIX)
        with open(os.path.join(folder, "gemm.o"), "rb") as f:
            return f.read()
    except Exception as exc:
        logger.warning("CuTe GEMM kernel export failed (%s: %s)", type(exc).__name__, exc)
        return None
    finally:
        shutil.rmtree(folder, True)


def load_bytes(data: bytes, function_prefix: str = FUNCTION_PREFIX):
    """The compiled kernel an ``export_bytes`` object holds (raises what the DSL's loader raises)."""
    import cutlass.cute as cute
    fd, path = tempfile.mkstemp(suffix=".o", dir=_scratch_dir())
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return getattr(cute.runtime.load_module(path), function_prefix)


def load(spec, cache: KernelDiskCache | None = None):
    """The compiled kernel of ``spec`` from the disk cache, or None (a miss, or an entry that did not load)."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return None
    key = key_for(spec)
    entry = cache.entry(key)
    if entry is None:
        return None
    try:
        return load_bytes(entry.data, entry.meta.get("function_prefix", FUNCTION_PREFIX))
    except Exception as exc:
        cache.discard(key, f"the DSL could not load it ({type(exc).__name__}: {exc})")
        return None


def store(spec, compiled, cache: KernelDiskCache | None = None) -> bool:
    """Export ``compiled`` and keep it for later processes; False when the cache is off or the export
    failed."""
    cache = cache or KernelDiskCache.default()
    if not cache.enabled:
        return False
    data = export_bytes(compiled)
    return data is not None and cache.store(key_for(spec), data, {"function_prefix": FUNCTION_PREFIX})


def plan_kernels(spec, compiled) -> bytes | None:
    """What a serialized CuTe plan carries: a one-line JSON record (the kernel's disk key: DSL version,
    architecture, spec) then the exported object; None if the export failed."""
    data = export_bytes(compiled)
    if data is None:
        return None
    return json.dumps(key_for(spec).as_json(), sort_keys=True).encode() + b"\n" + data


def kernel_from_plan(spec, payload: bytes):
    """The compiled kernel of ``spec`` from ``plan_kernels``' bytes, or None (logged) when they were made
    for another DSL, architecture or spec, or do not load: the caller then compiles."""
    record, _, data = payload.partition(b"\n")
    try:
        same = json.loads(record) == json.loads(json.dumps(key_for(spec).as_json(), sort_keys=True))
    except ValueError:
        same = False
    if not same:
        logger.info("CuTe GEMM: the serialized plan's kernel was built for another DSL, GPU or spec; compiling")
        return None
    try:
        return load_bytes(data)
    except Exception as exc:
        logger.warning("CuTe GEMM: the serialized plan's kernel did not load (%s: %s); compiling",
                       type(exc).__name__, exc)
        return None
