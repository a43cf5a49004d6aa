# The cuDNN backend descriptor object: one cudnnBackendDescriptor_t, its typed attribute set / get
# (element load / store per attribute type), finalize, and destruction with the object.
from libc.stdint cimport int32_t, int64_t


cdef class Descriptor:
    cdef void* ptr                      # cudnnBackendDescriptor_t, destroyed in __dealloc__
    cdef readonly int descriptor_type
    cdef readonly bint finalized
    cdef object _children               # descriptors this one references (kept alive with it)

    cdef int set_raw(self, int32_t attribute, int32_t attribute_type, int64_t count,
                     const void* elements) except -1
    cdef int64_t get_raw(self, int32_t attribute, int32_t attribute_type, int64_t capacity,
                         void* elements) except -1
    cdef int finalize_raw(self) except -1
    cdef list _get_numbers(self, object attribute, int32_t kind, Py_ssize_t capacity)
