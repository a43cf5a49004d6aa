from libc.stdint cimport int32_t, intptr_t, uintptr_t

cdef int pointer_device(intptr_t ptr, int32_t* device_type, int32_t* ordinal) except -1

# Make a device's primary context current on this thread (pushed only when another one is current:
# pass the flag back to leave_device).
cdef int enter_device(int device, bint* pushed) except -1
cdef int leave_device(bint pushed) except -1
# The same without the GIL, for a device whose primary context enter_device retained already: 0, the
# failed CUresult, or -1 when that context is not known yet. A thread with none current keeps it.
cdef int enter_device_nogil(int device, bint* pushed) noexcept nogil
cdef void leave_device_nogil(bint pushed) noexcept nogil

# The device ordinal a stream belongs to; -1 for the special handles (0, legacy 1, per-thread 2).
cdef int stream_device(intptr_t stream) except -2
# The same without the GIL (the XLA FFI handler): a primary context enter_device retained is recognised
# by comparison; another context is asked (pushed, queried, popped). -1: unknown.
cdef int stream_device_nogil(intptr_t stream) noexcept nogil

cdef uintptr_t device_alloc(size_t nbytes, int device) except 0
cdef int device_free(uintptr_t address, int device) noexcept
cdef int zero_async(uintptr_t address, size_t nbytes, intptr_t stream) except -1
# zero_async for callers without the GIL: returns 0 or the CUresult (-1: no driver or no cuMemsetD8Async).
cdef int zero_async_nogil(uintptr_t address, size_t nbytes, intptr_t stream) noexcept nogil

# CUDA graphs. Each returns 0 or the CUresult of the failed driver call (-1: no driver or no such
# entry point); the destroys accept NULL and do nothing at interpreter exit.
cdef enum:
    CAPTURING_STREAM = -2               # graph_launch refused: the stream is being captured
    EMPTY_CAPTURE = -3                  # capture_end: the capture recorded no work
cdef bint graphs_available() noexcept nogil
cdef int graph_create(void** graph) noexcept nogil
cdef int graph_instantiate(void** graph_exec, void* graph) noexcept nogil
cdef int graph_destroy(void* graph) noexcept nogil
cdef int graph_exec_destroy(void* graph_exec) noexcept nogil
cdef bint stream_capturing(intptr_t stream) noexcept nogil
# Recording a graph from a private stream (for plans cuDNN cannot populate natively).
cdef bint capture_available() noexcept nogil
cdef int capture_begin(intptr_t* stream) noexcept nogil
cdef int capture_end(intptr_t stream, void** graph) noexcept nogil
# Only after graphs_available(): the hot path does not test the entry points again.
cdef int graph_launch(void* graph_exec, intptr_t stream) noexcept nogil
cdef bint device_memory(const void* ptr) noexcept nogil


cdef class DeviceAllocation:
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef readonly int device

# A driver entry point off the hot paths: the first of ``spellings`` libcuda exports, resolved once and kept
# under ``name`` (CudaDriverError where there is no driver or none of them).
cdef void* late_symbol(str name, tuple spellings) except NULL
# CudaDriverError "<call> failed: <the CUresult's name>" where ``result`` is not 0.
cdef int _checked(int result, str call) except -1
cdef bint finalizing() noexcept nogil

# Kernels loaded from a cubin (cuLibraryLoadData) and launched with cuLaunchKernel: the cuTile C launch
# path. tile_launch's entry point is resolved by library_load (call that first); it returns the CUresult.
cdef int tile_launch(void* function, const unsigned int* grid, const unsigned int* block, unsigned int shared_bytes,
                     intptr_t stream, void** params) noexcept nogil
