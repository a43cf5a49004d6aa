"""The few CUDA driver calls the DLPack boundary needs, resolved from libcuda at first use.

Nothing here links against CUDA: libcuda.so.1 is dlopen'ed when first needed, and a machine without
a driver simply reports "no driver" (CPU machines, CI).
"""
from libc.stdint cimport int32_t, intptr_t, uintptr_t
from cudnn_graph._dlpack cimport kDLCUDA, kDLCUDAHost, kDLCUDAManaged

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flag)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_LOCAL

# CUpointer_attribute and CUmemorytype values (CUDA driver API facts).
cdef enum:
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    CU_MEMORYTYPE_HOST = 1
    CU_MEMORYTYPE_DEVICE = 2

ctypedef int (*cuInit_t)(unsigned int) noexcept nogil
ctypedef int (*cuPointerGetAttribute_t)(void* data, int attribute, uintptr_t ptr) noexcept nogil

ctypedef int (*cuDeviceGetCount_t)(int* count) noexcept nogil
ctypedef int (*cuDeviceGetName_t)(char* name, int length, int device) noexcept nogil
ctypedef int (*cuDeviceGetAttribute_t)(int* value, int attribute, int device) noexcept nogil
ctypedef int (*cuDriverGetVersion_t)(int* version) noexcept nogil

cdef enum:
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

cdef cuPointerGetAttribute_t _get_attribute = NULL
cdef cuDeviceGetCount_t _device_count = NULL
cdef cuDeviceGetName_t _device_name = NULL
cdef cuDeviceGetAttribute_t _device_attribute = NULL
cdef cuDriverGetVersion_t _driver_version = NULL
cdef int _load_state = 0   # 0: not tried, 1: loaded, -1: no driver


cdef int _load() noexcept nogil:
    global _get_attribute, _load_state, _device_count, _device_name, _device_attribute, _driver_version
    if _load_state != 0:
        return _load_state
    cdef void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        _load_state = -1
        return _load_state
    cdef cuInit_t init = <cuInit_t>dlsym(lib, "cuInit")
    _get_attribute = <cuPointerGetAttribute_t>dlsym(lib, "cuPointerGetAttribute")
    _device_count = <cuDeviceGetCount_t>dlsym(lib, "cuDeviceGetCount")
    _device_name = <cuDeviceGetName_t>dlsym(lib, "cuDeviceGetName")
    _device_attribute = <cuDeviceGetAttribute_t>dlsym(lib, "cuDeviceGetAttribute")
    _driver_version = <cuDriverGetVersion_t>dlsym(lib, "cuDriverGetVersion")
    if init == NULL or _get_attribute == NULL or init(0) != 0:
        _load_state = -1
    else:
        _load_state = 1
    return _load_state


cdef int pointer_device(intptr_t ptr, int32_t* device_type, int32_t* ordinal) except -1:
    """Where a CUDA-array-interface pointer lives; (kDLCUDA, 0) when no driver can tell."""
    cdef int memory_type = 0, is_managed = 0, dev = 0
    device_type[0] = kDLCUDA
    ordinal[0] = 0
    if ptr == 0 or _load() != 1:
        return 0
    with nogil:
        if _get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, <uintptr_t>ptr) != 0:
            return 0   # not memory the driver knows (e.g. plain host memory): keep the default
        _get_attribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, <uintptr_t>ptr)
        _get_attribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, <uintptr_t>ptr)
    if is_managed:
        device_type[0] = kDLCUDAManaged
    elif memory_type == CU_MEMORYTYPE_HOST:
        device_type[0] = kDLCUDAHost
    ordinal[0] = dev
    return 0


def driver_available() -> bool:
    """True when libcuda loaded and initialised."""
    return _load() == 1


def device_count() -> int:
    """CUDA devices the driver sees (0 without a driver)."""
    cdef int n = 0
    if _load() != 1 or _device_count == NULL or _device_count(&n) != 0:
        return 0
    return n


def device_info(int ordinal) -> dict:
    """Name and compute capability of one device."""
    cdef char name[256]
    cdef int major = 0, minor = 0
    if _load() != 1 or _device_name(name, 256, ordinal) != 0:
        raise RuntimeError(f"CUDA device {ordinal} is not available")
    _device_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal)
    _device_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal)
    return {"ordinal": ordinal, "name": name.decode(errors="replace"), "compute_capability": (major, minor)}


def driver_version() -> int:
    """The driver's CUDA version as an int (e.g. 13000), 0 without a driver."""
    cdef int v = 0
    if _load() != 1 or _driver_version == NULL or _driver_version(&v) != 0:
        return 0
    return v
