from libc.stdint cimport int32_t, int64_t, intptr_t
from cudnn_graph._dlpack cimport (DLTensor, DLDataType, DLDevice, DLManagedTensor,
                                  DLManagedTensorVersioned)

cdef enum:
    SLOT_INLINE_DIMS = 6       # shapes up to this rank need no heap storage
    SLOT_MAX_NDIM = 64         # anything larger is treated as a malformed tensor

cdef class ManagedRef:
    """Owns one imported managed tensor and calls its deleter exactly once."""
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    cdef void release(self) noexcept


cdef class Slot:
    # data has the producer's byte_offset folded in; tensor.byte_offset is always 0.
    cdef DLTensor tensor
    cdef int64_t _inline[2 * SLOT_INLINE_DIMS]
    cdef int64_t* _heap
    cdef readonly object owner          # whatever keeps the memory alive
    cdef bint _readonly
    cdef intptr_t _producer_stream      # CUDA-array-interface v3 stream, 0 when none

    cdef int _alloc_geometry(self, int ndim) except -1
    cdef int _fill(self, const DLTensor* src, bint null_strides_are_row_major, object what) except -1


cdef Slot slot_from_object(object obj, object stream)
cdef Slot slot_from_address(intptr_t ptr, object shape, object strides, DLDataType dtype,
                            DLDevice device, bint readonly)
cdef int64_t slot_numel(Slot s) noexcept
cdef int borrow_view(object obj, DLTensor* view) except -1
