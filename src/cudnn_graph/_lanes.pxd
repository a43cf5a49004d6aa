from libc.stdint cimport intptr_t
from cpython.pythread cimport PyThread_type_lock

cdef enum:
    LANES_MAX_EVENTS = 64          # events one Lanes orders its launches with

# A second stream beside one caller stream, and the events that order launches across the two (_lanes.pyx).
cdef class Lanes:
    cdef void* _side               # CUstream, non-blocking, the context's highest priority
    cdef void* _events[LANES_MAX_EVENTS]
    cdef int _n_events
    cdef readonly int device
    cdef PyThread_type_lock _lock

    # The stream of ``lane``: 0 the caller's, 1 the side stream.
    cdef intptr_t stream_of(self, int lane, intptr_t caller) noexcept nogil
    # cuStreamWaitEvent / cuEventRecord on event ``event``: 0 or the CUresult.
    cdef int wait(self, intptr_t stream, int event) noexcept nogil
    cdef int record(self, int event, intptr_t stream) noexcept nogil
    # Held for a whole sequence of launches: a second thread on the same caller stream waits for it.
    cdef void hold(self) noexcept nogil
    cdef void release(self) noexcept nogil
