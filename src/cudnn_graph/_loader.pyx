"""libcudnn, loaded at first use and resolved once into function pointers.

Importing this module loads nothing: the library is opened by the first ``cudnn_api()`` (or
``load()``, ``backend_version()``, ...). The search order is

1. ``$CUDNN_GRAPH_LIBCUDNN``: a path to libcudnn.so.9 (or to the folder holding it);
2. ``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")``: the nvidia-cudnn-cu12/cu13 wheels, conda,
   ``$CUDNN_PATH``, then the system search, as cuda-pathfinder does it;
3. the system loader: ``dlopen("libcudnn.so.9")`` (LD_LIBRARY_PATH, ld.so.cache, RPATH).

A candidate is taken only if it exports every required entry point and reports cuDNN major 9 (the
ABI this build declares). When none qualifies, CudnnNotFoundError lists every place tried and why
it failed. The outcome, success or failure, is kept for the life of the process (``load(retry=True)``
tries again after a failure).
"""
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from cudnn_graph._cudnn_abi cimport (
    CG_CUDNN_ABI_MAJOR, CG_CUDNN_VERSION_CUDA_GRAPH_API, CG_CUDNN_VERSION_PLAN_WORKSPACE_QUERY,
)

import os
import threading
import warnings

from cudnn_graph._cudnn_errors import (
    CudnnNotFoundError, CudnnSymbolError, CudnnVersionError, format_version, raise_for_status,
)

cdef extern from "<dlfcn.h>" nogil:
    # Dl_info / dladdr are GNU extensions; Python.h defines _GNU_SOURCE before dlfcn.h is read.
    ctypedef struct Dl_info:
        const char* dli_fname
        void* dli_fbase
        const char* dli_sname
        void* dli_saddr
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int dlclose(void* handle)
    char* dlerror()
    int dladdr(const void* address, Dl_info* info)
    int RTLD_NOW
    int RTLD_LOCAL

ENV_VAR = "CUDNN_GRAPH_LIBCUDNN"
# What the system loader is asked for, in order (module-level so that tests can point it elsewhere).
_SYSTEM_LIBRARY_NAMES = ("libcudnn.so.9",)
_LIBRARY_FILE_NAME = "libcudnn.so.9"   # looked up inside $CUDNN_GRAPH_LIBCUDNN when it names a folder

cdef enum:
    LAST_ERROR_CAPACITY = 65536        # cuDNN's messages can quote whole descriptors

cdef CudnnApi _api
cdef bint _api_ready = False           # set last, after every field of _api is filled
cdef object _load_lock = threading.Lock()
cdef object _failure = None            # the CudnnNotFoundError of the last failed load
cdef str _loaded_path = None
cdef str _loaded_via = None


# ---- the C-level API ----------------------------------------------------------------------------

cdef CudnnApi* cudnn_api() except NULL:
    if _api_ready:
        return &_api
    _load(False)
    return &_api


cdef CudnnApi* loaded_api() noexcept nogil:
    return &_api if _api_ready else NULL


cdef int raise_status(int status, const char* where) except -1:
    if status == 0:
        return 0
    where_text = where.decode("utf-8", "replace") if where != NULL else ""
    # Read cuDNN's explanation now, on the failing thread: reading clears it, and the next cuDNN
    # call could replace it. Without a library nothing can have produced cuDNN text (a status fed
    # in by hand, a test).
    last_error = _read_last_error() if _api_ready else ""
    error_string = _read_error_string(status) if _api_ready else ""
    raise_for_status(status, where_text, last_error, error_string)
    return -1   # not reached: raise_for_status raises for every status but success


cdef str _read_last_error():
    if _api.cudnnGetLastErrorString == NULL:
        return ""
    cdef char* buffer = <char*>malloc(LAST_ERROR_CAPACITY)
    if buffer == NULL:
        return ""
    try:
        buffer[0] = 0
        with nogil:
            _api.cudnnGetLastErrorString(buffer, LAST_ERROR_CAPACITY)
        buffer[LAST_ERROR_CAPACITY - 1] = 0
        return buffer.decode("utf-8", "replace")
    finally:
        free(buffer)


cdef str _read_error_string(int status):
    cdef const char* text = _api.cudnnGetErrorString(status)
    return text.decode("utf-8", "replace") if text != NULL else ""


# ---- loading (cold path, once per process) ------------------------------------------------------

cdef int _load(bint retry) except -1:
    global _failure
    with _load_lock:
        if _api_ready:
            return 0
        if _failure is not None and not retry:
            raise _failure.with_traceback(None)
        _failure = None
        try:
            _search()
        except CudnnNotFoundError as error:
            _failure = error
            raise
    return 0


def _find_with_pathfinder():
    """Ask cuda-pathfinder for libcudnn; return the absolute path of the library it loaded."""
    from cuda.pathfinder import load_nvidia_dynamic_lib
    loaded = load_nvidia_dynamic_lib("cudnn")
    # LoadedDL.abs_path is public in every pathfinder release (its handle is the private
    # _handle_uint). dlopen of that path returns the very handle pathfinder holds.
    path = getattr(loaded, "abs_path", None)
    if not path:
        raise RuntimeError(f"it returned no path ({loaded!r})")
    return path


cdef int _search() except -1:
    attempts = []              # (place, reason) for every candidate rejected
    missing_symbols = []

    env_value = os.environ.get(ENV_VAR, "")
    env_place = f"${ENV_VAR}={env_value!r}" if env_value else f"${ENV_VAR}"
    if env_value:
        path = os.path.join(env_value, _LIBRARY_FILE_NAME) if os.path.isdir(env_value) else env_value
        if _try_library(path, env_place, attempts, missing_symbols):
            return 0
    else:
        attempts.append((env_place, "not set"))

    pathfinder_place = "cuda.pathfinder.load_nvidia_dynamic_lib('cudnn')"
    try:
        path = _find_with_pathfinder()
    except ImportError as error:
        attempts.append((pathfinder_place, f"cuda-pathfinder is not importable ({error})"))
    except Exception as error:   # DynamicLibNotFoundError and kin, or anything a broken install raises
        attempts.append((pathfinder_place, f"{type(error).__name__}: {error}".strip()))
    else:
        if _try_library(path, f"{pathfinder_place} -> {path}", attempts, missing_symbols):
            _warn_if_env_ignored(env_value, attempts)
            return 0

    for name in _SYSTEM_LIBRARY_NAMES:
        if _try_library(name, f"system loader dlopen({name!r})", attempts, missing_symbols):
            _warn_if_env_ignored(env_value, attempts)
            return 0

    if missing_symbols:
        raise CudnnSymbolError(attempts, missing_symbols[0])
    raise CudnnNotFoundError(attempts)


cdef _warn_if_env_ignored(str env_value, list attempts):
    # The caller asked for a specific library and got another: say so rather than hide it.
    if env_value:
        warnings.warn(f"{ENV_VAR}={env_value!r} was not usable ({attempts[0][1]}); "
                      f"loaded {_loaded_path} via {_loaded_via} instead", RuntimeWarning, stacklevel=3)


cdef bint _try_library(str path, str place, list attempts, list missing_symbols) except -1:
    """Open one candidate and bind it; on rejection record why, close it and return False."""
    global _api, _api_ready, _loaded_path, _loaded_via
    cdef bytes encoded = os.fsencode(path)
    cdef const char* c_path = encoded
    cdef void* handle
    cdef const char* reason
    cdef CudnnApi api
    cdef Dl_info info
    with nogil:   # opening libcudnn can take a while; other threads may run meanwhile
        handle = dlopen(c_path, RTLD_NOW | RTLD_LOCAL)
        reason = dlerror() if handle == NULL else NULL
    if handle == NULL:
        attempts.append((place, reason.decode("utf-8", "replace") if reason != NULL else "dlopen failed"))
        return False

    memset(&api, 0, sizeof(api))
    missing = _bind_required(handle, &api)
    if missing:
        dlclose(handle)
        attempts.append((place, "missing required symbol(s) " + ", ".join(missing)))
        missing_symbols.extend(missing)
        return False

    api.version = api.cudnnGetVersion()
    api.cudart_version = api.cudnnGetCudartVersion()
    if api.version // 10000 != CG_CUDNN_ABI_MAJOR:
        dlclose(handle)
        attempts.append((place, f"it is cuDNN {format_version(api.version)}; this build speaks the cuDNN "
                                f"{CG_CUDNN_ABI_MAJOR} ABI"))
        return False

    _bind_optional(handle, &api)
    # Report the file actually mapped (a bare soname or a symlink says little).
    if dladdr(<void*>api.cudnnGetVersion, &info) != 0 and info.dli_fname != NULL and info.dli_fname[0] != 0:
        path = os.fsdecode(<bytes>info.dli_fname)
    _api = api
    _loaded_path = os.path.realpath(path) if os.path.isabs(path) else path
    _loaded_via = place
    _api_ready = True   # last: other threads read _api without the lock once this is set
    return True


cdef void* _required(void* handle, const char* name, list missing):
    cdef void* address = dlsym(handle, name)
    if address == NULL:
        missing.append(name.decode())
    return address


cdef list _bind_required(void* handle, CudnnApi* api):
    """Fill the required entry points; return the names of those the library lacks."""
    missing = []
    api.cudnnGetVersion = <cg_cudnnGetVersion_t>_required(handle, b"cudnnGetVersion", missing)
    api.cudnnGetCudartVersion = <cg_cudnnGetCudartVersion_t>_required(handle, b"cudnnGetCudartVersion", missing)
    api.cudnnGetErrorString = <cg_cudnnGetErrorString_t>_required(handle, b"cudnnGetErrorString", missing)
    api.cudnnCreate = <cg_cudnnCreate_t>_required(handle, b"cudnnCreate", missing)
    api.cudnnDestroy = <cg_cudnnDestroy_t>_required(handle, b"cudnnDestroy", missing)
    api.cudnnSetStream = <cg_cudnnSetStream_t>_required(handle, b"cudnnSetStream", missing)
    api.cudnnGetStream = <cg_cudnnGetStream_t>_required(handle, b"cudnnGetStream", missing)
    api.cudnnBackendCreateDescriptor = <cg_cudnnBackendCreateDescriptor_t>_required(
        handle, b"cudnnBackendCreateDescriptor", missing)
    api.cudnnBackendDestroyDescriptor = <cg_cudnnBackendDestroyDescriptor_t>_required(
        handle, b"cudnnBackendDestroyDescriptor", missing)
    api.cudnnBackendFinalize = <cg_cudnnBackendFinalize_t>_required(handle, b"cudnnBackendFinalize", missing)
    api.cudnnBackendSetAttribute = <cg_cudnnBackendSetAttribute_t>_required(
        handle, b"cudnnBackendSetAttribute", missing)
    api.cudnnBackendGetAttribute = <cg_cudnnBackendGetAttribute_t>_required(
        handle, b"cudnnBackendGetAttribute", missing)
    api.cudnnBackendExecute = <cg_cudnnBackendExecute_t>_required(handle, b"cudnnBackendExecute", missing)
    return missing


cdef void _bind_optional(void* handle, CudnnApi* api) noexcept:
    """Optional entry points: NULL when absent, and NULL below the release that introduced them
    (a symbol an older library happens to export is not a contract)."""
    api.cudnnGetLastErrorString = <cg_cudnnGetLastErrorString_t>dlsym(handle, b"cudnnGetLastErrorString")
    api.cudnnBackendInitialize = <cg_cudnnBackendInitialize_t>dlsym(handle, b"cudnnBackendInitialize")
    if api.version >= CG_CUDNN_VERSION_CUDA_GRAPH_API:
        api.cudnnBackendPopulateCudaGraph = <cg_cudnnBackendPopulateCudaGraph_t>dlsym(
            handle, b"cudnnBackendPopulateCudaGraph")
        api.cudnnBackendUpdateCudaGraph = <cg_cudnnBackendUpdateCudaGraph_t>dlsym(
            handle, b"cudnnBackendUpdateCudaGraph")
    if api.version >= CG_CUDNN_VERSION_PLAN_WORKSPACE_QUERY:
        api.cudnnGetExecutionPlanWorkspaceSize = <cg_cudnnGetExecutionPlanWorkspaceSize_t>dlsym(
            handle, b"cudnnGetExecutionPlanWorkspaceSize")


# ---- the Python-level API -----------------------------------------------------------------------

def load(*, bint retry=False) -> str:
    """Load libcudnn if needed and return the path of the file loaded.

    Raises CudnnNotFoundError (CudnnSymbolError when a library lacked an entry point) listing every
    place tried. A failure is remembered; ``retry=True`` searches again (e.g. after installing the
    cuDNN wheel or setting $CUDNN_GRAPH_LIBCUDNN in this process).
    """
    if not _api_ready:
        _load(retry)
    return _loaded_path


def is_available() -> bool:
    """True when a usable libcudnn is (or can be) loaded. Never raises."""
    if _api_ready:
        return True
    try:
        _load(False)
    except Exception:
        return False
    return True


def is_loaded() -> bool:
    """True when libcudnn is already loaded in this process by cudnn_graph; never loads it."""
    return _api_ready


def backend_version() -> int:
    """cudnnGetVersion() of the loaded library, e.g. 91900 (loads it if needed)."""
    return cudnn_api().version


def backend_version_string() -> str:
    """The loaded cuDNN's version as text, e.g. ``"9.19.0"`` (loads it if needed)."""
    return format_version(cudnn_api().version)


def cudart_version() -> int:
    """cudnnGetCudartVersion(): the CUDA runtime the loaded cuDNN was built against, e.g. 12080."""
    return cudnn_api().cudart_version


def get_last_error_string() -> str:
    """cuDNN's most recent error message on this thread; "" when libcudnn is not loaded.

    Reading consumes the message (cuDNN clears it). A failed call checked through cudnn_graph has
    already read it into the exception's ``last_error``, so look there first.
    """
    return _read_last_error() if _api_ready else ""


def error_string(int status) -> str:
    """cudnnGetErrorString(status) of the loaded library (loads it if needed)."""
    cudnn_api()
    return _read_error_string(status)


def check_status(int status, where: str = "") -> None:
    """Python-level check(): raise the typed CudnnStatusError for a failed status, else return."""
    if status != 0:
        encoded = where.encode("utf-8", "replace")
        raise_status(status, encoded)


def require_version(int min_version, feature: str) -> None:
    """Raise CudnnVersionError naming ``feature`` unless the loaded cuDNN is >= ``min_version``.

    ``min_version`` is encoded like cudnnGetVersion(): 91301 means 9.13.1. Loads libcudnn if needed
    (CudnnNotFoundError when there is none).
    """
    cdef size_t version = cudnn_api().version
    if version < <size_t>min_version:
        raise CudnnVersionError(feature, min_version, version)


def library_info() -> dict:
    """What is loaded, from where, and which optional entry points it has (loads it if needed)."""
    cdef CudnnApi* api = cudnn_api()
    return {
        "path": _loaded_path,
        "found_via": _loaded_via,
        "version": api.version,
        "version_string": format_version(api.version),
        "cudart_version": api.cudart_version,
        "optional_entry_points": {
            "cudnnGetLastErrorString": api.cudnnGetLastErrorString != NULL,
            "cudnnBackendInitialize": api.cudnnBackendInitialize != NULL,
            "cudnnBackendPopulateCudaGraph": api.cudnnBackendPopulateCudaGraph != NULL,
            "cudnnBackendUpdateCudaGraph": api.cudnnBackendUpdateCudaGraph != NULL,
            "cudnnGetExecutionPlanWorkspaceSize": api.cudnnGetExecutionPlanWorkspaceSize != NULL,
        },
    }
