"""cuDNN handles, the per-thread state and the process-wide switches of the execute path.

``Handle`` is a ``cudnnHandle_t``: ``create_handle`` / ``destroy_handle`` / ``set_stream`` /
``get_stream`` are the public handle calls. One handle per (device, thread) is created on demand and
kept in ``ThreadState``, together with this thread's cache of finalized variant packs (its entries
live here; cudnn_graph._graph_replay fills, reuses and replays them).

The switches: the variant-pack cache (``set_variant_pack_cache``), CUDA graph replay
(``set_cuda_graph_replay``, ``$CUDNN_GRAPH_CUDA_GRAPHS``) and stream capture for plans cuDNN cannot
populate (``set_cuda_graph_capture``, ``$CUDNN_GRAPH_CUDA_GRAPH_CAPTURE``).

Example (on a machine with cuDNN and a GPU):
    >>> from cudnn_graph import _cudnn_handle
    >>> h = _cudnn_handle.create_handle()                     # doctest: +SKIP
    >>> _cudnn_handle.set_stream(handle=h, stream=0)          # doctest: +SKIP
"""
cimport cython
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetItem
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from cpython.pystate cimport PyThreadState_GetDict
from libc.stdint cimport intptr_t, uintptr_t
from libc.string cimport memset

from cudnn_graph._loader cimport CudnnApi, cudnn_api, loaded_api, check
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._driver cimport enter_device, leave_device, stream_device, graph_exec_destroy

import atexit
import os
import warnings

from cudnn_graph.errors import StreamDeviceError

CUDA_GRAPHS_ENV_VAR = "CUDNN_GRAPH_CUDA_GRAPHS"
CUDA_GRAPH_CAPTURE_ENV_VAR = "CUDNN_GRAPH_CUDA_GRAPH_CAPTURE"
_SWITCH_WORDS = {"1": True, "true": True, "on": True, "yes": True,
                 "0": False, "false": False, "off": False, "no": False}


def _switch_from_env(value, bint default, variable=CUDA_GRAPHS_ENV_VAR, what="CUDA graph replay") -> bool:
    """The on/off value of an environment switch: 1/0 (or true/false, on/off, yes/no); unset or empty
    keeps ``default``, anything else keeps it too, with a RuntimeWarning naming the variable."""
    if value is None or not value.strip():
        return default
    found = _SWITCH_WORDS.get(value.strip().lower())
    if found is None:
        warnings.warn(f"${variable}={value!r} is not 0 or 1; {what} stays "
                      f"{'on' if default else 'off'}", RuntimeWarning, stacklevel=2)
        return default
    return found


interpreter_finalizing = False
variant_pack_cache_enabled = True
# Both graph switches are read once from the environment (set_cuda_graph_replay / _capture change them).
cuda_graph_replay_on = _switch_from_env(os.environ.get(CUDA_GRAPHS_ENV_VAR), True)
cuda_graph_capture_on = _switch_from_env(os.environ.get(CUDA_GRAPH_CAPTURE_ENV_VAR), True,
                                         CUDA_GRAPH_CAPTURE_ENV_VAR, "CUDA graph capture")

def _mark_finalizing():
    global interpreter_finalizing
    interpreter_finalizing = True


atexit.register(_mark_finalizing)

# ---- handles ------------------------------------------------------------------------------------------

@cython.final
cdef class Handle:
    """A cudnnHandle_t. ``int(handle)`` is the raw pointer (what other bindings take)."""

    def __cinit__(self):
        self.ptr = NULL
        self.device = 0
        self._stream = 0
        self._owned = False

    def __init__(self, *args, **kwargs):
        raise TypeError("use cudnn_graph._cudnn_handle.create_handle(device=0)")

    def __dealloc__(self):
        cdef CudnnApi* api
        if self._owned and self.ptr != NULL and not interpreter_finalizing:
            api = loaded_api()
            if api != NULL:
                api.cudnnDestroy(self.ptr)
        self.ptr = NULL

    cdef int bind_stream(self, intptr_t stream) except -1:
        """cudnnSetStream, only when the stream differs from the one last set through us."""
        cdef CudnnApi* api
        cdef int owner
        if stream == self._stream:
            return 0
        owner = stream_device(stream)
        if owner >= 0 and owner != self.device:
            raise StreamDeviceError(f"the stream 0x{<uintptr_t>stream:x} belongs to cuda:{owner}; this "
                                    f"handle (and the graph it executes) is on cuda:{self.device}")
        api = cudnn_api()
        check(api.cudnnSetStream(self.ptr, <void*>stream), b"cudnnSetStream")
        self._stream = stream
        return 0

    @property
    def stream(self) -> int:
        return self._stream

    @property
    def ptr(self) -> int:
        return <uintptr_t>self.ptr

    def __int__(self):
        return <uintptr_t>self.ptr

    def __index__(self):
        return <uintptr_t>self.ptr

    def __repr__(self):
        return f"Handle(0x{<uintptr_t>self.ptr:x}, device={self.device}, stream=0x{self._stream:x})"


cdef Handle _new_handle(int device):
    cdef CudnnApi* api = cudnn_api()
    cdef void* created = NULL
    cdef bint pushed = False
    cdef int status
    if device < 0 or device >= BACKEND_MAX_DEVICES:
        raise ValueError(f"CUDA device ordinal {device} is out of range")
    # cudnnCreate binds the handle to the current device: make the wanted one current first.
    enter_device(device, &pushed)
    try:
        with nogil:
            status = api.cudnnCreate(&created)
    finally:
        leave_device(pushed)
    check(status, b"cudnnCreate")
    cdef Handle handle = Handle.__new__(Handle)
    handle.ptr = created
    handle.device = device
    handle._owned = True
    return handle


def create_handle(int device=0) -> Handle:
    """A new cuDNN handle on ``device`` (destroyed when the object goes away, or by destroy_handle)."""
    return _new_handle(device)


def destroy_handle(handle) -> None:
    """Destroy a handle made by create_handle (idempotent); a raw int handle is destroyed too."""
    cdef CudnnApi* api = cudnn_api()
    cdef Handle h
    if isinstance(handle, Handle):
        h = <Handle>handle
        if h.ptr != NULL and h._owned:
            check(api.cudnnDestroy(h.ptr), b"cudnnDestroy")
        h.ptr = NULL
        h._owned = False
        return
    check(api.cudnnDestroy(<void*><uintptr_t>PyNumber_Index(handle)), b"cudnnDestroy")


def set_stream(*, handle, stream) -> None:
    """cudnnSetStream(handle, stream); ``stream`` is None, an int or any ``__cuda_stream__`` object."""
    cdef intptr_t raw = stream_handle(stream)
    cdef CudnnApi* api
    if isinstance(handle, Handle):
        (<Handle>handle).bind_stream(raw)
        return
    api = cudnn_api()
    check(api.cudnnSetStream(<void*><uintptr_t>PyNumber_Index(handle), <void*>raw), b"cudnnSetStream")


def get_stream(handle) -> int:
    """cudnnGetStream(handle) as an int."""
    cdef CudnnApi* api = cudnn_api()
    cdef void* raw = NULL
    cdef void* h = (<Handle>handle).ptr if isinstance(handle, Handle) else <void*><uintptr_t>PyNumber_Index(handle)
    check(api.cudnnGetStream(h, &raw), b"cudnnGetStream")
    return <uintptr_t>raw


# ---- per-thread state ---------------------------------------------------------------------------------

@cython.final
cdef class ThreadState:
    """This thread's handles (one per device) and its cache of finalized variant packs."""

    def __cinit__(self):
        self._handles = []
        self._next_victim = 0
        self._graph_plans = [None] * VARIANT_PACK_CACHE_ENTRIES
        memset(self._entries, 0, sizeof(self._entries))

    def __dealloc__(self):
        cdef CudnnApi* api = loaded_api()
        cdef int i
        if api == NULL or interpreter_finalizing:
            return
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            # The graph first: it may replay the plan that _graph_plans keeps alive until after this.
            graph_exec_destroy(self._entries[i].graph_exec)
            self._entries[i].graph_exec = NULL
            if self._entries[i].descriptor != NULL:
                api.cudnnBackendDestroyDescriptor(self._entries[i].descriptor)
                self._entries[i].descriptor = NULL

    cdef void _drop_graph(self, int at) noexcept:
        """Destroy the CUDA graph of cache entry ``at`` (if any), then let go of the plan it replays."""
        cdef VariantPackCacheEntry* e = &self._entries[at]
        graph_exec_destroy(e.graph_exec)
        e.graph_exec = NULL
        e.graph_plan = NULL
        self._graph_plans[at] = None

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef Handle handle_for(self, int device):
        cdef Handle handle
        if 0 <= device < len(self._handles):
            found = self._handles[device]
            if found is not None:
                return <Handle>found
        handle = _new_handle(device)
        while len(self._handles) <= device:
            self._handles.append(None)
        self._handles[device] = handle
        return handle

    def handle(self, int device=0) -> Handle:
        return self.handle_for(device)

    def clear_variant_packs(self) -> None:
        """Destroy the cached variant packs of this thread (and the CUDA graphs replaying them)."""
        cdef CudnnApi* api = loaded_api()
        cdef int i
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            self._drop_graph(i)
            if self._entries[i].descriptor != NULL and api != NULL:
                api.cudnnBackendDestroyDescriptor(self._entries[i].descriptor)
            memset(&self._entries[i], 0, sizeof(VariantPackCacheEntry))

    cdef int _count_entries(self, bint with_graph) noexcept:
        """Cache entries holding a finalized variant pack (``with_graph``: a CUDA graph replaying one)."""
        cdef int i, n = 0
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            if (self._entries[i].graph_exec if with_graph else self._entries[i].descriptor) != NULL:
                n += 1
        return n

    @property
    def cached_variant_packs(self) -> int:
        return self._count_entries(False)

    @property
    def cached_graphs(self) -> int:
        """How many cached variant packs have a CUDA graph that replays them."""
        return self._count_entries(True)


# The key of this module's entry in the interpreter's per-thread dict (PyThreadState_GetDict): a lookup
# there is a C call and one dict probe, where threading.local costs an attribute lookup through Python.
cdef str _THREAD_STATE_KEY = "cudnn_graph._cudnn_handle.ThreadState"


cdef ThreadState thread_state():
    cdef PyObject* per_thread = PyThreadState_GetDict()     # borrowed
    cdef PyObject* found
    if per_thread == NULL:
        raise RuntimeError("no per-thread dict: cudnn_graph needs a Python thread state")
    found = PyDict_GetItemWithError(<object>per_thread, _THREAD_STATE_KEY)
    if found != NULL and type(<object>found) is ThreadState:
        return <ThreadState>found
    state = ThreadState()
    PyDict_SetItem(<object>per_thread, _THREAD_STATE_KEY, state)
    return state


def current_thread_state() -> ThreadState:
    return thread_state()


def thread_handle(int device=0) -> Handle:
    """The calling thread's cuDNN handle for ``device`` (created on first use, reused after)."""
    return thread_state().handle_for(device)


def set_variant_pack_cache(bint enabled) -> bool:
    """Turn the reuse of finalized variant packs on or off; returns the previous setting."""
    global variant_pack_cache_enabled
    previous = variant_pack_cache_enabled
    variant_pack_cache_enabled = enabled
    return previous


def set_cuda_graph_replay(bint enabled) -> bool:
    """Turn CUDA graph replay of repeated executes on or off for the process; returns the previous
    setting. The default comes from ``$CUDNN_GRAPH_CUDA_GRAPHS`` (0 or 1, read at import; on when unset).

    Turning it off keeps the graphs already built (they are used again when it is turned back on);
    ``current_thread_state().clear_variant_packs()`` destroys this thread's.

    Example:
        >>> from cudnn_graph import _cudnn_handle
        >>> previous = _cudnn_handle.set_cuda_graph_replay(False)
        >>> _cudnn_handle.cuda_graph_replay_enabled()
        False
        >>> _ = _cudnn_handle.set_cuda_graph_replay(previous)
    """
    global cuda_graph_replay_on
    previous = cuda_graph_replay_on
    cuda_graph_replay_on = enabled
    return previous


def cuda_graph_replay_enabled() -> bool:
    """Whether repeated executes may replay CUDA graphs (see set_cuda_graph_replay)."""
    return cuda_graph_replay_on


def set_cuda_graph_capture(bint enabled) -> bool:
    """Let replay record the graph of a plan cuDNN cannot populate by capturing one execute of it (on a
    private stream, thread-local capture mode), or not; returns the previous setting. The default comes
    from ``$CUDNN_GRAPH_CUDA_GRAPH_CAPTURE`` (0 or 1, read at import; on when unset).

    It decides only how graphs not built yet are made: plans already marked keep their mark (a new
    PlanRunner, e.g. a rebuilt graph, tries again). Used as ``set_cuda_graph_replay`` is (its example).
    """
    global cuda_graph_capture_on
    previous = cuda_graph_capture_on
    cuda_graph_capture_on = enabled
    return previous


def cuda_graph_capture_enabled() -> bool:
    """Whether a plan cuDNN cannot populate may be replayed from a captured execute."""
    return cuda_graph_capture_on
