from libc.stdint cimport int64_t
from cudnn_graph._dlpack cimport DLDataType

cdef int validate_dtype(DLDataType dt, object what) except -1
cdef str dtype_name(DLDataType dt)
cdef DLDataType parse_dtype(object value) except *
cdef DLDataType parse_typestr(str typestr, object descr) except *
cdef int64_t dtype_bits(DLDataType dt) noexcept nogil
