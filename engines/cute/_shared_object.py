"""A compiled CuTe kernel as a shared object, loaded and launched without importing the CuTe DSL.

The DSL's ahead-of-time export (``export_to_c``) is a relocatable object holding the kernel's host entry
(TMA descriptor encodes and the launch), its cubin, and init / load-to-device functions. Its only outside
references are the CUDA shims of the DSL's runtime library (``_cudaLaunchKernelEx`` and the like, defined
in ``libcute_dsl_runtime.so``, which needs neither Python nor the DSL's compiler). Linked once into a
shared object by the system C compiler (when the kernel was just compiled, so the DSL is loaded anyway),
it loads in a later process with two ``dlopen`` calls, about ten milliseconds, instead of importing the
DSL (over a second) and relinking the object in its JIT.

Where no C compiler is found the link is skipped (logged once) and the object-file path stays in use.

Example (what ``_disk`` does with a kernel it just compiled, then a later process):

    >>> artifact = link(exported_object)                               # doctest: +SKIP
    >>> kernel = SharedKernel.load(artifact, entry_symbol, "cudnn_graph_cute_gemm", runtime_path())
    >>> kernel.entry_address(0)                                        # doctest: +SKIP
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import threading

logger = logging.getLogger(__name__)

RUNTIME_NAME = "libcute_dsl_runtime.so"
LINK_TIMEOUT_S = 60.0
# The exported host entry: ``int32_t <symbol>(void** args, int32_t num_args)``; its name is the DSL's
# mangling of the prefix and the kernel's signature, read from the header export_to_c writes beside the
# object.
_ENTRY_DECLARATION = re.compile(r"void\s+(_mlir_\w+__mlir_ciface_\w+)\s*\(\s*void\s*\*\*\s*\w+\s*,\s*int32_t")

_runtime_lock = threading.Lock()
_runtime_handle = None                 # the runtime library, loaded once per process (RTLD_GLOBAL)
_warned_no_linker = False


def entry_symbol(header_text: str) -> str | None:
    """The packed-argument host entry's symbol declared in an export's header, or None."""
    found = _ENTRY_DECLARATION.search(header_text)
    return found.group(1) if found else None


def _compiler() -> list | None:
    """The C compiler driver that links: ``$CC``, else the one Python was built with, else cc / gcc."""
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if not candidate:
            continue
        words = candidate.split()
        if shutil.which(words[0]):
            return words
    return None


def link(object_bytes: bytes) -> bytes | None:
    """``object_bytes`` (an ``export_to_c`` object) linked into a shared object, or None (logged) where
    there is no C compiler or the link fails: callers then keep the object-file path."""
    global _warned_no_linker
    cc = _compiler()
    if cc is None:
        if not _warned_no_linker:
            _warned_no_linker = True
            logger.info("no C compiler found ($CC, cc, gcc, clang): CuTe kernels load from the disk cache "
                        "through the DSL (slower first graph in a new process)")
        return None
    with tempfile.TemporaryDirectory(prefix="cudnn_graph_cute_link_") as folder:
        obj, shared = os.path.join(folder, "kernel.o"), os.path.join(folder, "kernel.so")
        with open(obj, "wb") as f:
            f.write(object_bytes)
        try:
            done = subprocess.run(cc + ["-shared", "-o", shared, obj], capture_output=True, text=True,
                                  timeout=LINK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("linking a CuTe kernel failed (%s); it loads through the DSL", exc)
            return None
        if done.returncode != 0 or not os.path.exists(shared):
            logger.warning("linking a CuTe kernel failed (%s exit %d: %s); it loads through the DSL",
                           cc[0], done.returncode, (done.stderr or "").strip()[:300])
            return None
        with open(shared, "rb") as f:
            return f.read()


def _loaded_runtime() -> str | None:
    """The runtime library this process has mapped already (the DSL loads it when it is imported)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith("/" + RUNTIME_NAME):
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def _installed_runtimes() -> list:
    """Runtime libraries of an installed nvidia-cutlass-dsl (``<nvidia_cutlass_dsl>/cu*/lib``), found
    from the ``cutlass`` package's location without importing it; newest CUDA flavour first."""
    try:
        spec = importlib.util.find_spec("cutlass")
    except (ImportError, ValueError):
        return []
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin:
        return []
    here = os.path.dirname(origin)
    while here and os.path.basename(here) != "nvidia_cutlass_dsl":
        parent = os.path.dirname(here)
        if parent == here:
            return []
        here = parent
    found = glob.glob(os.path.join(here, "cu*", "lib", RUNTIME_NAME))

    def flavour(path: str) -> int:
        digits = re.sub(r"\D", "", os.path.basename(os.path.dirname(os.path.dirname(path))))
        return int(digits or 0)
    return sorted(found, key=flavour, reverse=True)


def runtime_path(recorded: str | None = None) -> str | None:
    """The DSL runtime library to load: ``$CUTE_DSL_LIBS``' entry, the one this process has mapped, the
    one recorded when the kernel was linked (if it still exists), else an installed one."""
    for entry in (os.environ.get("CUTE_DSL_LIBS") or "").split(os.pathsep):
        if entry.endswith(RUNTIME_NAME) and os.path.exists(entry):
            return entry
    loaded = _loaded_runtime()
    if loaded:
        return loaded
    if recorded and os.path.exists(recorded):
        return recorded
    installed = _installed_runtimes()
    return installed[0] if installed else None


def _load_runtime(path: str) -> None:
    global _runtime_handle
    with _runtime_lock:
        if _runtime_handle is None:
            # RTLD_GLOBAL: the kernel's shared object resolves its CUDA shims against this library.
            _runtime_handle = ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOW)


class SharedObjectError(RuntimeError):
    """A kernel shared object that cannot be used here (its loader says why); callers fall back."""


class SharedKernel:
    """A loaded kernel shared object: ``entry_address(ordinal)`` is its host entry, the kernel loaded on
    that device first. Made by ``SharedKernel.load``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("SharedKernel objects are made by SharedKernel.load()")

    @classmethod
    def load(cls, shared_object: bytes, symbol: str, function_prefix: str, runtime: str | None,
             scratch: str | None = None) -> "SharedKernel":
        """Load ``shared_object`` (``link``'s bytes) whose entry is ``symbol``; SharedObjectError when the
        runtime library is missing or the loader refuses it."""
        if not runtime:
            raise SharedObjectError(f"the CuTe DSL runtime library ({RUNTIME_NAME}) was not found")
        try:
            _load_runtime(runtime)
        except OSError as exc:
            raise SharedObjectError(f"the CuTe DSL runtime library did not load: {exc}") from None
        fd, path = tempfile.mkstemp(suffix=".so", prefix="cute_kernel_", dir=scratch)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(shared_object)
            library = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as exc:
            raise SharedObjectError(f"the kernel's shared object did not load: {exc}") from None
        finally:
            try:
                os.unlink(path)                # mapped now: the file is not needed
            except OSError:
                pass
        self = object.__new__(cls)
        self._library = library
        self.symbol = symbol
        self.function_prefix = function_prefix
        self.shared_object = shared_object
        self.runtime = runtime
        self._devices: set = set()
        self._lock = threading.Lock()
        try:
            self._entry = ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
            self._init = getattr(library, f"_mlir_{function_prefix}_cuda_init")
            self._load_to_device = getattr(library, f"_mlir_{function_prefix}_cuda_load_to_device")
        except AttributeError as exc:
            raise SharedObjectError(f"the kernel's shared object lacks a symbol: {exc}") from None
        self._module = ctypes.c_void_p(0)                      # the kernel library (cudaLibrary_t)
        self._module_cell = ctypes.pointer(self._module)
        return self

    def _call(self, function, *cells) -> int:
        result = ctypes.c_int32(0)
        args = (ctypes.c_void_p * (len(cells) + 1))(*[ctypes.addressof(c) for c in cells],
                                                     ctypes.addressof(result))
        function(args)
        return result.value

    def entry_address(self, ordinal: int) -> int:
        """The host entry's address, the kernel loaded on device ``ordinal`` (once per device)."""
        if ordinal not in self._devices:
            with self._lock:
                if ordinal not in self._devices:
                    if not self._devices:
                        status = self._call(self._init, self._module_cell)
                        if status != 0:
                            raise SharedObjectError(f"the kernel's module did not initialise: CUDA error "
                                                    f"{status}")
                    status = self._call(self._load_to_device, self._module_cell, ctypes.c_int32(ordinal))
                    if status != 0:
                        raise SharedObjectError(f"the kernel did not load on device {ordinal}: CUDA error "
                                                f"{status}")
                    self._devices.add(ordinal)
        return self._entry

    def set_device(self, ordinal: int) -> int:
        """Make ``ordinal`` the CUDA runtime's current device on this thread (the entry launches there);
        returns the previous one."""
        current = ctypes.c_int(0)
        _runtime_handle._cudaGetDevice(ctypes.byref(current))
        if current.value != ordinal:
            _runtime_handle._cudaSetDevice(ctypes.c_int(ordinal))
        return current.value


__all__ = ["SharedKernel", "SharedObjectError", "entry_symbol", "link", "runtime_path"]
