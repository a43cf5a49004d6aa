from libc.stdint cimport int32_t, intptr_t

cdef int pointer_device(intptr_t ptr, int32_t* device_type, int32_t* ordinal) except -1
