"""Lanes: a second stream beside a caller's stream, and the events that order launches across the two.

A plan whose launches may overlap (the cuTile engine's segmented forward: one segment's state pass beside
the next segment's prepare and the last one's output) issues some of them on a side stream. Every dependency
between the two streams is an event recorded on one and waited on by the other, and the plan's last launch
on the caller's stream waits for the side stream's last: to the caller the plan behaves as if it ran on its
stream alone (later work waits for all of it; a graph capture of the caller's stream records the whole
DAG, the side stream joining the capture through the first event it waits on).

A Lanes serves one caller stream (a plan keeps one per stream, as it keeps workspaces): its events are
reused by every call, so a sequence of launches holds its lock from the first wait to the last record.
"""
from libc.stdint cimport intptr_t, uintptr_t
from cpython.pythread cimport (PyThread_allocate_lock, PyThread_free_lock, PyThread_acquire_lock,
                               PyThread_release_lock, WAIT_LOCK)

from cudnn_graph._driver cimport enter_device, leave_device, late_symbol, finalizing, _checked

from cudnn_graph.errors import InvalidArgumentError

ctypedef int (*cuStreamCreateWithPriority_t)(void** stream, unsigned int flags, int priority) noexcept nogil
ctypedef int (*cuCtxGetStreamPriorityRange_t)(int* least, int* greatest) noexcept nogil
ctypedef int (*cuStreamDestroy_t)(void* stream) noexcept nogil
ctypedef int (*cuEventCreate_t)(void** event, unsigned int flags) noexcept nogil
ctypedef int (*cuEventDestroy_t)(void* event) noexcept nogil
ctypedef int (*cuEventRecord_t)(void* event, void* stream) noexcept nogil
ctypedef int (*cuStreamWaitEvent_t)(void* stream, void* event, unsigned int flags) noexcept nogil

cdef enum:
    CU_STREAM_NON_BLOCKING = 1     # no implicit order with the legacy default stream
    CU_EVENT_DISABLE_TIMING = 2    # ordering only: the cheapest events

cdef cuStreamDestroy_t _stream_destroy = NULL
cdef cuEventDestroy_t _event_destroy = NULL
cdef cuEventRecord_t _event_record = NULL
cdef cuStreamWaitEvent_t _stream_wait_event = NULL


cdef int _resolve() except -1:
    """The hot calls' entry points, once (a driver without one raises CudaDriverError naming it)."""
    global _stream_destroy, _event_destroy, _event_record, _stream_wait_event
    if _stream_wait_event != NULL:
        return 0
    _stream_destroy = <cuStreamDestroy_t>late_symbol("cuStreamDestroy", ("cuStreamDestroy_v2",))
    _event_destroy = <cuEventDestroy_t>late_symbol("cuEventDestroy", ("cuEventDestroy_v2",))
    _event_record = <cuEventRecord_t>late_symbol("cuEventRecord", ("cuEventRecord",))
    _stream_wait_event = <cuStreamWaitEvent_t>late_symbol("cuStreamWaitEvent", ("cuStreamWaitEvent",))
    return 0


cdef class Lanes:
    """A side stream for one caller stream on ``device`` and ``n_events`` ordering events.

    Example (on a machine with a GPU; the cuTile plans make theirs):
        >>> lanes = Lanes.create(0, 4)                     # doctest: +SKIP
        >>> lanes.side_stream != 0                         # doctest: +SKIP
        True
    """

    def __cinit__(self):
        self._side = NULL
        self._n_events = 0
        self.device = 0
        self._lock = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("Lanes objects are made by Lanes.create()")

    @staticmethod
    def create(int device, int n_events) -> Lanes:
        """A side stream (non-blocking, at the context's highest priority: it carries the critical path of
        the plans that use it) and ``n_events`` events with timing off, made on ``device``'s primary
        context."""
        cdef Lanes self = Lanes.__new__(Lanes)
        cdef bint pushed = False
        cdef int least = 0, greatest = 0, i
        if not 0 < n_events <= LANES_MAX_EVENTS:
            raise InvalidArgumentError("n_events", f"1 to {LANES_MAX_EVENTS}", str(n_events))
        _resolve()
        create_stream = <cuStreamCreateWithPriority_t>late_symbol("cuStreamCreateWithPriority",
                                                                  ("cuStreamCreateWithPriority",))
        priority_range = <cuCtxGetStreamPriorityRange_t>late_symbol("cuCtxGetStreamPriorityRange",
                                                                    ("cuCtxGetStreamPriorityRange",))
        create_event = <cuEventCreate_t>late_symbol("cuEventCreate", ("cuEventCreate",))
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError()
        self.device = device
        enter_device(device, &pushed)
        try:
            if priority_range(&least, &greatest) != 0:
                greatest = 0
            _checked(create_stream(&self._side, CU_STREAM_NON_BLOCKING, greatest), "cuStreamCreateWithPriority")
            for i in range(n_events):
                _checked(create_event(&self._events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                self._n_events = i + 1
        finally:
            leave_device(pushed)
        return self

    def __dealloc__(self):
        cdef int i
        # At interpreter exit the driver may be gone before us: leave the handles to the process's end.
        if not finalizing():
            if _event_destroy != NULL:
                for i in range(self._n_events):
                    _event_destroy(self._events[i])
            if self._side != NULL and _stream_destroy != NULL:
                _stream_destroy(self._side)     # returns at once; the stream goes when its work is done
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    @property
    def side_stream(self) -> int:
        """The side stream's handle."""
        return <uintptr_t>self._side

    @property
    def event_count(self) -> int:
        return self._n_events

    cdef intptr_t stream_of(self, int lane, intptr_t caller) noexcept nogil:
        return caller if lane == 0 else <intptr_t>self._side

    cdef int wait(self, intptr_t stream, int event) noexcept nogil:
        if not 0 <= event < self._n_events:
            return 1                      # CUDA_ERROR_INVALID_VALUE: a plan's schedule names no such event
        return _stream_wait_event(<void*>stream, self._events[event], 0)

    cdef int record(self, int event, intptr_t stream) noexcept nogil:
        if not 0 <= event < self._n_events:
            return 1
        return _event_record(self._events[event], <void*>stream)

    cdef void hold(self) noexcept nogil:
        PyThread_acquire_lock(self._lock, WAIT_LOCK)

    cdef void release(self) noexcept nogil:
        PyThread_release_lock(self._lock)

    def issue(self, intptr_t caller, schedule, launch) -> None:
        """The Python launch path's sequence: for each ``(lane, wait, record)`` of ``schedule`` (an event
        index or -1), wait on the lane's stream, call ``launch(i, stream)`` for the i-th entry, then record,
        all under the lock (CudaDriverError naming the failed call)."""
        cdef intptr_t stream
        with nogil:
            self.hold()         # waiting without the GIL: the holder may need it to finish
        try:
            for i, (lane, wait, record) in enumerate(schedule):
                stream = self.stream_of(lane, caller)
                if wait >= 0:
                    _checked(self.wait(stream, wait), f"cuStreamWaitEvent (launch {i})")
                launch(i, stream)
                if record >= 0:
                    _checked(self.record(record, stream), f"cuEventRecord (launch {i})")
        finally:
            self.release()
