from libc.stdint cimport intptr_t

cdef intptr_t stream_handle(object stream) except? -1
