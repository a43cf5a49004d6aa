"""cuDNN backend objects and the execute hot path.

``Descriptor`` owns one ``cudnnBackendDescriptor_t`` (destroyed with the object) and sets / gets its
attributes with typed helpers; the lowering builds operation graphs, heuristics and execution plans
out of them. ``Handle`` is a ``cudnnHandle_t``: one per (device, thread) is created on demand and kept
in ``ThreadState``, together with this thread's cache of finalized variant packs.

The hot path is ``PlanRunner.execute(graph, pack, ctx)``: it resolves the handle and stream
(``cudnnSetStream`` only when the stream changed), the workspace (the caller's, checked for size, or
one cached per plan and stream), checks device operands for the 16-byte alignment the tensor
descriptors promise, and calls ``execute_plan``, which builds (or reuses) the variant pack from the
VariantPack's C arrays and runs ``cudnnBackendExecute`` with the GIL released.

Example (on a machine with cuDNN and a GPU):
    >>> from cudnn_graph import _backend
    >>> h = _backend.create_handle()                          # doctest: +SKIP
    >>> _backend.set_stream(handle=h, stream=0)               # doctest: +SKIP
    >>> d = _backend.Descriptor("CUDNN_BACKEND_MATMUL_DESCRIPTOR")   # doctest: +SKIP
    >>> d.set("CUDNN_ATTR_MATMUL_COMP_TYPE", "CUDNN_TYPE_DATA_TYPE", 0).finalize()  # doctest: +SKIP
"""
cimport cython
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t, uint8_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memcmp, memset

from cudnn_graph._cudnn_abi cimport *
from cudnn_graph._loader cimport CudnnApi, cudnn_api, loaded_api, check, check_nogil, raise_status
from cudnn_graph._dlpack cimport kDLCPU, kDLCUDA, kDLCUDAManaged
from cudnn_graph._dtypes cimport dtype_bits
from cudnn_graph._slot cimport Slot, slot_from_object, slot_numel
from cudnn_graph._variant_pack cimport VariantPack, PackLayout, TensorSpec, pack_from_mapping
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._driver cimport enter_device, leave_device, stream_device, DeviceAllocation

import atexit
import threading

from cudnn_graph.errors import AlignmentError, CudnnGraphError, DeviceMismatchError

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clock_id, timespec* tp)
    int CLOCK_MONOTONIC


from cudnn_graph.errors import MissingTensorError, StreamDeviceError, WorkspaceError


cdef bint _finalizing = False          # interpreter exit: leave descriptors and handles to the OS
cdef bint _variant_pack_cache = True   # reuse finalized variant packs when uids/pointers repeat

# Capacities for attribute queries: generous bounds on what cuDNN returns (an engine has fewer
# knobs than there are knob types; 9.28 has 46 types).
cdef enum:
    _NOTES_CAPACITY = 32
    _KNOBS_CAPACITY = 64


def _mark_finalizing():
    global _finalizing
    _finalizing = True


atexit.register(_mark_finalizing)


# ---- name tables (cold path: lowering speaks names, the C calls take the header's values) ----------
DESCRIPTOR_TYPES = {
    "CUDNN_BACKEND_POINTWISE_DESCRIPTOR": CUDNN_BACKEND_POINTWISE_DESCRIPTOR,
    "CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR": CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR,
    "CUDNN_BACKEND_ENGINE_DESCRIPTOR": CUDNN_BACKEND_ENGINE_DESCRIPTOR,
    "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR": CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
    "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR": CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
    "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR": CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
    "CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR": CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR,
    "CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR": CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
    "CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR": CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR,
    "CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR": CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR": CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR": CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR": CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR": CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
    "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR": CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
    "CUDNN_BACKEND_TENSOR_DESCRIPTOR": CUDNN_BACKEND_TENSOR_DESCRIPTOR,
    "CUDNN_BACKEND_MATMUL_DESCRIPTOR": CUDNN_BACKEND_MATMUL_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR": CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR": CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR,
    "CUDNN_BACKEND_REDUCTION_DESCRIPTOR": CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR": CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR": CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR,
    "CUDNN_BACKEND_RESAMPLE_DESCRIPTOR": CUDNN_BACKEND_RESAMPLE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR": CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_SIGNAL_DESCRIPTOR": CUDNN_BACKEND_OPERATION_SIGNAL_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
    "CUDNN_BACKEND_RNG_DESCRIPTOR": CUDNN_BACKEND_RNG_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR": CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR,
    "CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR": CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_BLOCK_SCALE_QUANTIZE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_BLOCK_SCALE_QUANTIZE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR,
    "CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR": CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_EXPAND_BAND_MATRIX_DESCRIPTOR": CUDNN_BACKEND_OPERATION_EXPAND_BAND_MATRIX_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_CONTRACT_BAND_MATRIX_DESCRIPTOR": CUDNN_BACKEND_OPERATION_CONTRACT_BAND_MATRIX_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR": CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR": CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_SOFTMAX_DESCRIPTOR": CUDNN_BACKEND_OPERATION_SOFTMAX_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_TRANSPOSE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR": CUDNN_BACKEND_OPERATION_SLICE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_BWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_BWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_ROPE_FWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_ROPE_FWD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR": CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR,
}
ATTRIBUTE_TYPES = {
    "CUDNN_TYPE_HANDLE": CUDNN_TYPE_HANDLE,
    "CUDNN_TYPE_DATA_TYPE": CUDNN_TYPE_DATA_TYPE,
    "CUDNN_TYPE_BOOLEAN": CUDNN_TYPE_BOOLEAN,
    "CUDNN_TYPE_INT64": CUDNN_TYPE_INT64,
    "CUDNN_TYPE_FLOAT": CUDNN_TYPE_FLOAT,
    "CUDNN_TYPE_DOUBLE": CUDNN_TYPE_DOUBLE,
    "CUDNN_TYPE_VOID_PTR": CUDNN_TYPE_VOID_PTR,
    "CUDNN_TYPE_CONVOLUTION_MODE": CUDNN_TYPE_CONVOLUTION_MODE,
    "CUDNN_TYPE_HEUR_MODE": CUDNN_TYPE_HEUR_MODE,
    "CUDNN_TYPE_KNOB_TYPE": CUDNN_TYPE_KNOB_TYPE,
    "CUDNN_TYPE_NAN_PROPOGATION": CUDNN_TYPE_NAN_PROPOGATION,
    "CUDNN_TYPE_NUMERICAL_NOTE": CUDNN_TYPE_NUMERICAL_NOTE,
    "CUDNN_TYPE_LAYOUT_TYPE": CUDNN_TYPE_LAYOUT_TYPE,
    "CUDNN_TYPE_ATTRIB_NAME": CUDNN_TYPE_ATTRIB_NAME,
    "CUDNN_TYPE_POINTWISE_MODE": CUDNN_TYPE_POINTWISE_MODE,
    "CUDNN_TYPE_BACKEND_DESCRIPTOR": CUDNN_TYPE_BACKEND_DESCRIPTOR,
    "CUDNN_TYPE_GENSTATS_MODE": CUDNN_TYPE_GENSTATS_MODE,
    "CUDNN_TYPE_BN_FINALIZE_STATS_MODE": CUDNN_TYPE_BN_FINALIZE_STATS_MODE,
    "CUDNN_TYPE_REDUCTION_OPERATOR_TYPE": CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
    "CUDNN_TYPE_BEHAVIOR_NOTE": CUDNN_TYPE_BEHAVIOR_NOTE,
    "CUDNN_TYPE_TENSOR_REORDERING_MODE": CUDNN_TYPE_TENSOR_REORDERING_MODE,
    "CUDNN_TYPE_RESAMPLE_MODE": CUDNN_TYPE_RESAMPLE_MODE,
    "CUDNN_TYPE_PADDING_MODE": CUDNN_TYPE_PADDING_MODE,
    "CUDNN_TYPE_INT32": CUDNN_TYPE_INT32,
    "CUDNN_TYPE_CHAR": CUDNN_TYPE_CHAR,
    "CUDNN_TYPE_SIGNAL_MODE": CUDNN_TYPE_SIGNAL_MODE,
    "CUDNN_TYPE_FRACTION": CUDNN_TYPE_FRACTION,
    "CUDNN_TYPE_NORM_MODE": CUDNN_TYPE_NORM_MODE,
    "CUDNN_TYPE_NORM_FWD_PHASE": CUDNN_TYPE_NORM_FWD_PHASE,
    "CUDNN_TYPE_RNG_DISTRIBUTION": CUDNN_TYPE_RNG_DISTRIBUTION,
    "CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE": CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE,
    "CUDNN_TYPE_RESHAPE_MODE": CUDNN_TYPE_RESHAPE_MODE,
    "CUDNN_TYPE_OPERATIONGRAPH_MODE": CUDNN_TYPE_OPERATIONGRAPH_MODE,
    "CUDNN_TYPE_CUDA_GRAPH_RETENTION": CUDNN_TYPE_CUDA_GRAPH_RETENTION,
}
# The attributes the matmul / pointwise / reduction lowering, heuristics, plans and variant packs use;
# any other attribute can be passed by value (an int).
ATTRIBUTES = {
    "CUDNN_ATTR_POINTWISE_MODE": CUDNN_ATTR_POINTWISE_MODE,
    "CUDNN_ATTR_POINTWISE_MATH_PREC": CUDNN_ATTR_POINTWISE_MATH_PREC,
    "CUDNN_ATTR_POINTWISE_NAN_PROPAGATION": CUDNN_ATTR_POINTWISE_NAN_PROPAGATION,
    "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP": CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP,
    "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP": CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP,
    "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE": CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE,
    "CUDNN_ATTR_POINTWISE_ELU_ALPHA": CUDNN_ATTR_POINTWISE_ELU_ALPHA,
    "CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA": CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA,
    "CUDNN_ATTR_POINTWISE_SWISH_BETA": CUDNN_ATTR_POINTWISE_SWISH_BETA,
    "CUDNN_ATTR_POINTWISE_AXIS": CUDNN_ATTR_POINTWISE_AXIS,
    "CUDNN_ATTR_ENGINEHEUR_MODE": CUDNN_ATTR_ENGINEHEUR_MODE,
    "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH": CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
    "CUDNN_ATTR_ENGINEHEUR_RESULTS": CUDNN_ATTR_ENGINEHEUR_RESULTS,
    "CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET": CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET,
    "CUDNN_ATTR_ENGINECFG_ENGINE": CUDNN_ATTR_ENGINECFG_ENGINE,
    "CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO": CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO,
    "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES": CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
    "CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE": CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE,
    "CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED": CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED,
    "CUDNN_ATTR_EXECUTION_PLAN_HANDLE": CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
    "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG": CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
    "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE": CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
    "CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS": CUDNN_ATTR_EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS,
    "CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS": CUDNN_ATTR_EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS,
    "CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION": CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
    "CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE": CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
    "CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE": CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
    "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
    "CUDNN_ATTR_OPERATION_POINTWISE_XDESC": CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_BDESC": CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_YDESC": CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1": CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1,
    "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2": CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2,
    "CUDNN_ATTR_OPERATION_POINTWISE_DXDESC": CUDNN_ATTR_OPERATION_POINTWISE_DXDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_DYDESC": CUDNN_ATTR_OPERATION_POINTWISE_DYDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_TDESC": CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
    "CUDNN_ATTR_OPERATIONGRAPH_HANDLE": CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
    "CUDNN_ATTR_OPERATIONGRAPH_OPS": CUDNN_ATTR_OPERATIONGRAPH_OPS,
    "CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT": CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
    "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
    "CUDNN_ATTR_TENSOR_DATA_TYPE": CUDNN_ATTR_TENSOR_DATA_TYPE,
    "CUDNN_ATTR_TENSOR_DIMENSIONS": CUDNN_ATTR_TENSOR_DIMENSIONS,
    "CUDNN_ATTR_TENSOR_STRIDES": CUDNN_ATTR_TENSOR_STRIDES,
    "CUDNN_ATTR_TENSOR_VECTOR_COUNT": CUDNN_ATTR_TENSOR_VECTOR_COUNT,
    "CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION": CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION,
    "CUDNN_ATTR_TENSOR_UNIQUE_ID": CUDNN_ATTR_TENSOR_UNIQUE_ID,
    "CUDNN_ATTR_TENSOR_IS_VIRTUAL": CUDNN_ATTR_TENSOR_IS_VIRTUAL,
    "CUDNN_ATTR_TENSOR_IS_BY_VALUE": CUDNN_ATTR_TENSOR_IS_BY_VALUE,
    "CUDNN_ATTR_TENSOR_REORDERING_MODE": CUDNN_ATTR_TENSOR_REORDERING_MODE,
    "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC": CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC,
    "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS": CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
    "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS": CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
    "CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES": CUDNN_ATTR_VARIANT_PACK_INTERMEDIATES,
    "CUDNN_ATTR_VARIANT_PACK_WORKSPACE": CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
    "CUDNN_ATTR_KNOB_INFO_TYPE": CUDNN_ATTR_KNOB_INFO_TYPE,
    "CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE": CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE,
    "CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE": CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE,
    "CUDNN_ATTR_KNOB_INFO_STRIDE": CUDNN_ATTR_KNOB_INFO_STRIDE,
    "CUDNN_ATTR_ENGINE_OPERATION_GRAPH": CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
    "CUDNN_ATTR_ENGINE_GLOBAL_INDEX": CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
    "CUDNN_ATTR_ENGINE_KNOB_INFO": CUDNN_ATTR_ENGINE_KNOB_INFO,
    "CUDNN_ATTR_ENGINE_NUMERICAL_NOTE": CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
    "CUDNN_ATTR_ENGINE_LAYOUT_INFO": CUDNN_ATTR_ENGINE_LAYOUT_INFO,
    "CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE": CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
    "CUDNN_ATTR_ENGINE_SM_COUNT_TARGET": CUDNN_ATTR_ENGINE_SM_COUNT_TARGET,
    "CUDNN_ATTR_MATMUL_COMP_TYPE": CUDNN_ATTR_MATMUL_COMP_TYPE,
    "CUDNN_ATTR_MATMUL_PADDING_VALUE": CUDNN_ATTR_MATMUL_PADDING_VALUE,
    "CUDNN_ATTR_OPERATION_MATMUL_ADESC": CUDNN_ATTR_OPERATION_MATMUL_ADESC,
    "CUDNN_ATTR_OPERATION_MATMUL_BDESC": CUDNN_ATTR_OPERATION_MATMUL_BDESC,
    "CUDNN_ATTR_OPERATION_MATMUL_CDESC": CUDNN_ATTR_OPERATION_MATMUL_CDESC,
    "CUDNN_ATTR_OPERATION_MATMUL_DESC": CUDNN_ATTR_OPERATION_MATMUL_DESC,
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC": CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC": CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
    "CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC": CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
    "CUDNN_ATTR_REDUCTION_OPERATOR": CUDNN_ATTR_REDUCTION_OPERATOR,
    "CUDNN_ATTR_REDUCTION_COMP_TYPE": CUDNN_ATTR_REDUCTION_COMP_TYPE,
    "CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC": CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC,
    "CUDNN_ATTR_OPERATION_REDUCTION_XDESC": CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
    "CUDNN_ATTR_OPERATION_REDUCTION_YDESC": CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
    "CUDNN_ATTR_OPERATION_REDUCTION_DESC": CUDNN_ATTR_OPERATION_REDUCTION_DESC,
}


cdef int32_t _resolve(object value, dict table, str what) except? -1:
    """A table name (str) or its int value."""
    if isinstance(value, str):
        found = table.get(value)
        if found is None:
            raise ValueError(f"unknown {what} {value!r}")
        return found
    return PyNumber_Index(value)


cdef inline int _element_size(int32_t attribute_type) noexcept:
    """Bytes of one element of an attribute array (every enum crosses the ABI as int32)."""
    if attribute_type == CUDNN_TYPE_INT64:
        return 8
    if attribute_type == CUDNN_TYPE_DOUBLE:
        return 8
    if attribute_type == CUDNN_TYPE_FLOAT or attribute_type == CUDNN_TYPE_INT32:
        return 4
    if attribute_type == CUDNN_TYPE_BOOLEAN or attribute_type == CUDNN_TYPE_CHAR:
        return 1      # C bool
    if (attribute_type == CUDNN_TYPE_HANDLE or attribute_type == CUDNN_TYPE_VOID_PTR
            or attribute_type == CUDNN_TYPE_BACKEND_DESCRIPTOR):
        return sizeof(void*)
    if attribute_type == CUDNN_TYPE_FRACTION:
        return sizeof(cudnnFraction_t)
    return 4


cdef dict _ATTRIBUTE_NAMES = {value: name for name, value in ATTRIBUTES.items()}
cdef dict _DESCRIPTOR_NAMES = {value: name for name, value in DESCRIPTOR_TYPES.items()}


cdef str _attribute_label(int32_t attribute):
    return _ATTRIBUTE_NAMES.get(attribute, f"attribute {attribute}")


cdef str _descriptor_label(int32_t kind):
    return _DESCRIPTOR_NAMES.get(kind, f"descriptor type {kind}")


cdef int _raise_described(int status, str where) except -1:
    encoded = where.encode()
    return raise_status(status, encoded)


# ---- descriptors ------------------------------------------------------------------------------------

@cython.final
cdef class Descriptor:
    """One cuDNN backend descriptor, destroyed when the object goes away.

    ``Descriptor(kind)`` creates it (``kind`` a ``CUDNN_BACKEND_*_DESCRIPTOR`` name or value);
    ``set(attribute, attribute_type, value)`` and the ``get_*`` methods take names or values;
    ``finalize()`` finalizes it. A descriptor set as another's attribute is kept alive with it.
    """

    def __cinit__(self, descriptor_type):
        cdef CudnnApi* api = cudnn_api()
        cdef void* created = NULL
        cdef int32_t kind = _resolve(descriptor_type, DESCRIPTOR_TYPES, "descriptor type")
        self.ptr = NULL
        self.descriptor_type = kind
        self.finalized = False
        self._children = None
        check(api.cudnnBackendCreateDescriptor(kind, &created), b"cudnnBackendCreateDescriptor")
        self.ptr = created

    def __dealloc__(self):
        cdef CudnnApi* api
        if self.ptr != NULL and not _finalizing:
            api = loaded_api()
            if api != NULL:
                api.cudnnBackendDestroyDescriptor(self.ptr)
        self.ptr = NULL

    @property
    def ptr(self) -> int:
        """The raw cudnnBackendDescriptor_t."""
        return <uintptr_t>self.ptr

    cdef int set_raw(self, int32_t attribute, int32_t attribute_type, int64_t count,
                     const void* elements) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int status = api.cudnnBackendSetAttribute(self.ptr, attribute, attribute_type, count, elements)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendSetAttribute({_attribute_label(attribute)}, type "
                                     f"{attribute_type}) on {_descriptor_label(self.descriptor_type)}")
        return 0

    cdef int64_t get_raw(self, int32_t attribute, int32_t attribute_type, int64_t capacity,
                         void* elements) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int64_t count = 0
        cdef int status = api.cudnnBackendGetAttribute(self.ptr, attribute, attribute_type, capacity,
                                                       &count, elements)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendGetAttribute({_attribute_label(attribute)}, type "
                                     f"{attribute_type}) on {_descriptor_label(self.descriptor_type)}")
        return count

    cdef int finalize_raw(self) except -1:
        cdef CudnnApi* api = cudnn_api()
        cdef int status
        with nogil:   # finalizing a plan can compile kernels for seconds
            status = api.cudnnBackendFinalize(self.ptr)
        if status != CUDNN_STATUS_SUCCESS:
            _raise_described(status, f"cudnnBackendFinalize({_descriptor_label(self.descriptor_type)})")
        self.finalized = True
        return 0

    def finalize(self):
        """Finalize; returns self. cuDNN's refusal raises the typed CudnnStatusError."""
        self.finalize_raw()
        return self

    def set(self, attribute, attribute_type, value):
        """Set an attribute; returns self (calls chain).

        ``value`` is a scalar or a sequence, as the type wants: ints for INT64 / INT32 / every enum
        type, floats for FLOAT / DOUBLE, bools for BOOLEAN, Descriptors for BACKEND_DESCRIPTOR, a
        Handle or an int for HANDLE, an int address for VOID_PTR.
        """
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int32_t kind = _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type")
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        cdef Py_ssize_t n = len(values), i
        cdef int size = _element_size(kind)
        cdef char* buffer = <char*>malloc(max(n, 1) * size)
        if buffer == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                _store_element(buffer + i * size, kind, values[i])
            self.set_raw(name, kind, n, buffer)
        finally:
            free(buffer)
        if kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
            if self._children is None:
                self._children = []
            self._children.extend(values)
        return self

    def get_int64s(self, attribute, Py_ssize_t capacity=1) -> list:
        return self._get_numbers(attribute, CUDNN_TYPE_INT64, capacity)

    def get_int64(self, attribute) -> int:
        values = self._get_numbers(attribute, CUDNN_TYPE_INT64, 1)
        return values[0] if values else 0

    def get_enums(self, attribute, attribute_type, Py_ssize_t capacity=_NOTES_CAPACITY) -> list:
        """An attribute of an enum type (notes, knob types, modes) as a list of ints."""
        return self._get_numbers(attribute, _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type"),
                                 capacity)

    def get_double(self, attribute) -> float:
        values = self._get_numbers(attribute, CUDNN_TYPE_DOUBLE, 1)
        return values[0] if values else 0.0

    def get_text(self, attribute, Py_ssize_t capacity=1 << 20) -> str:
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef char* buffer = <char*>malloc(capacity + 1)
        cdef int64_t count
        if buffer == NULL:
            raise MemoryError()
        try:
            count = self.get_raw(name, CUDNN_TYPE_CHAR, capacity, buffer)
            buffer[min(count, capacity)] = 0
            return buffer.decode("utf-8", "replace")
        finally:
            free(buffer)

    def get_descriptors(self, attribute, descriptor_type, Py_ssize_t capacity=1) -> list:
        """A BACKEND_DESCRIPTOR attribute: ``capacity`` descriptors of ``descriptor_type`` are made
        for cuDNN to fill; the ones it filled come back."""
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        made = [Descriptor(descriptor_type) for _ in range(capacity)]
        cdef void** raw = <void**>malloc(max(capacity, 1) * sizeof(void*))
        cdef Py_ssize_t i
        cdef int64_t count
        if raw == NULL:
            raise MemoryError()
        try:
            for i in range(capacity):
                raw[i] = (<Descriptor>made[i]).ptr
            count = self.get_raw(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, capacity, raw)
        finally:
            free(raw)
        return made[:min(count, capacity)]

    def count(self, attribute, attribute_type) -> int:
        """How many elements an attribute holds (asks with capacity 0)."""
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int32_t kind = _resolve(attribute_type, ATTRIBUTE_TYPES, "attribute type")
        return self.get_raw(name, kind, 0, NULL)

    cdef list _get_numbers(self, object attribute, int32_t kind, Py_ssize_t capacity):
        cdef int32_t name = _resolve(attribute, ATTRIBUTES, "attribute")
        cdef int size = _element_size(kind)
        cdef char* buffer = <char*>malloc(max(capacity, 1) * size)
        cdef int64_t count, i
        if buffer == NULL:
            raise MemoryError()
        try:
            memset(buffer, 0, max(capacity, 1) * size)
            count = min(self.get_raw(name, kind, capacity, buffer), capacity)
            return [_load_element(buffer + i * size, kind) for i in range(count)]
        finally:
            free(buffer)

    def __repr__(self):
        return (f"Descriptor(type={self.descriptor_type}, ptr=0x{<uintptr_t>self.ptr:x}"
                f"{', finalized' if self.finalized else ''})")


cdef int _store_element(char* slot, int32_t kind, object value) except -1:
    if kind == CUDNN_TYPE_INT64:
        (<int64_t*>slot)[0] = PyNumber_Index(value)
    elif kind == CUDNN_TYPE_DOUBLE:
        (<double*>slot)[0] = value
    elif kind == CUDNN_TYPE_FLOAT:
        (<float*>slot)[0] = value
    elif kind == CUDNN_TYPE_BOOLEAN:
        (<uint8_t*>slot)[0] = 1 if value else 0
    elif kind == CUDNN_TYPE_CHAR:
        (<char*>slot)[0] = value
    elif kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
        if not isinstance(value, Descriptor):
            raise TypeError(f"a BACKEND_DESCRIPTOR attribute takes Descriptors; got {type(value).__name__}")
        (<void**>slot)[0] = (<Descriptor>value).ptr
    elif kind == CUDNN_TYPE_HANDLE:
        (<void**>slot)[0] = (<Handle>value).ptr if isinstance(value, Handle) else <void*><uintptr_t>PyNumber_Index(value)
    elif kind == CUDNN_TYPE_VOID_PTR:
        (<void**>slot)[0] = <void*><uintptr_t>PyNumber_Index(value)
    elif kind == CUDNN_TYPE_FRACTION:
        (<cudnnFraction_t*>slot)[0].numerator = value[0]
        (<cudnnFraction_t*>slot)[0].denominator = value[1]
    else:   # every enum type, and INT32
        (<int32_t*>slot)[0] = PyNumber_Index(value)
    return 0


cdef object _load_element(const char* slot, int32_t kind):
    if kind == CUDNN_TYPE_INT64:
        return (<const int64_t*>slot)[0]
    if kind == CUDNN_TYPE_DOUBLE:
        return (<const double*>slot)[0]
    if kind == CUDNN_TYPE_FLOAT:
        return (<const float*>slot)[0]
    if kind == CUDNN_TYPE_BOOLEAN:
        return (<const uint8_t*>slot)[0] != 0
    if kind == CUDNN_TYPE_HANDLE or kind == CUDNN_TYPE_VOID_PTR or kind == CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return <uintptr_t>(<void* const*>slot)[0]
    return (<const int32_t*>slot)[0]


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
        raise TypeError("use cudnn_graph._backend.create_handle(device=0)")

    def __dealloc__(self):
        cdef CudnnApi* api
        if self._owned and self.ptr != NULL and not _finalizing:
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
        memset(self._entries, 0, sizeof(self._entries))

    def __dealloc__(self):
        cdef CudnnApi* api = loaded_api()
        cdef int i
        if api == NULL or _finalizing:
            return
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            if self._entries[i].descriptor != NULL:
                api.cudnnBackendDestroyDescriptor(self._entries[i].descriptor)
                self._entries[i].descriptor = NULL

    cdef Handle handle_for(self, int device):
        cdef Handle handle
        if device < len(self._handles):
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
        """Destroy the cached variant packs of this thread."""
        cdef CudnnApi* api = loaded_api()
        cdef int i
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            if self._entries[i].descriptor != NULL and api != NULL:
                api.cudnnBackendDestroyDescriptor(self._entries[i].descriptor)
            self._entries[i].descriptor = NULL

    @property
    def cached_variant_packs(self) -> int:
        cdef int i, n = 0
        for i in range(VARIANT_PACK_CACHE_ENTRIES):
            if self._entries[i].descriptor != NULL:
                n += 1
        return n


_thread_local = threading.local()


cdef ThreadState thread_state():
    state = getattr(_thread_local, "state", None)
    if state is None:
        state = ThreadState()
        _thread_local.state = state
    return <ThreadState>state


def current_thread_state() -> ThreadState:
    return thread_state()


def thread_handle(int device=0) -> Handle:
    """The calling thread's cuDNN handle for ``device`` (created on first use, reused after)."""
    return thread_state().handle_for(device)


def set_variant_pack_cache(bint enabled) -> bool:
    """Turn the reuse of finalized variant packs on or off; returns the previous setting."""
    global _variant_pack_cache
    previous = _variant_pack_cache
    _variant_pack_cache = enabled
    return previous


# ---- the execute hot path -----------------------------------------------------------------------------

cdef enum:
    _STAGE_CREATE = 1
    _STAGE_UIDS = 2
    _STAGE_POINTERS = 3
    _STAGE_WORKSPACE = 4
    _STAGE_FINALIZE = 5
    _STAGE_EXECUTE = 6

cdef const char* _STAGE_NAMES[7]
_STAGE_NAMES[0] = b"cudnnBackendExecute"
_STAGE_NAMES[1] = b"cudnnBackendCreateDescriptor(VARIANT_PACK)"
_STAGE_NAMES[2] = b"cudnnBackendSetAttribute(VARIANT_PACK_UNIQUE_IDS)"
_STAGE_NAMES[3] = b"cudnnBackendSetAttribute(VARIANT_PACK_DATA_POINTERS)"
_STAGE_NAMES[4] = b"cudnnBackendSetAttribute(VARIANT_PACK_WORKSPACE)"
_STAGE_NAMES[5] = b"cudnnBackendFinalize(VARIANT_PACK)"
_STAGE_NAMES[6] = b"cudnnBackendExecute"


cdef int _build_variant_pack(CudnnApi* api, int n, const int64_t* uids, void* const* ptrs,
                             void* workspace, void** out, int* stage) noexcept nogil:
    """A finalized variant pack; on failure the status is returned, ``stage`` says which call."""
    cdef void* vp = NULL
    cdef void* ws = workspace
    cdef int status
    out[0] = NULL
    stage[0] = _STAGE_CREATE
    status = api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)
    if status != CUDNN_STATUS_SUCCESS:
        return status
    stage[0] = _STAGE_UIDS
    status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_POINTERS
        status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                              n, ptrs)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_WORKSPACE
        status = api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                              1, &ws)
    if status == CUDNN_STATUS_SUCCESS:
        stage[0] = _STAGE_FINALIZE
        status = api.cudnnBackendFinalize(vp)
    if status != CUDNN_STATUS_SUCCESS:
        api.cudnnBackendDestroyDescriptor(vp)
        return status
    out[0] = vp
    return CUDNN_STATUS_SUCCESS


cdef inline VariantPackCacheEntry* _cached_entry(VariantPackCacheEntry* entries, int n,
                                                 const int64_t* uids, void* const* ptrs,
                                                 void* workspace) noexcept nogil:
    cdef int i
    cdef VariantPackCacheEntry* e
    for i in range(VARIANT_PACK_CACHE_ENTRIES):
        e = &entries[i]
        if (e.descriptor != NULL and e.count == n and e.workspace == workspace
                and memcmp(e.ptrs, ptrs, n * sizeof(void*)) == 0
                and memcmp(e.uids, uids, n * sizeof(int64_t)) == 0):
            return e
    return NULL


cdef int _variant_pack_from_cache(CudnnApi* api, VariantPackCacheEntry* entries, int* next_victim,
                                  int n, const int64_t* uids, void* const* ptrs, void* workspace,
                                  void** out, int* stage) noexcept nogil:
    """The cached variant pack for these (uids, pointers, workspace), built into a cache slot on a miss."""
    cdef VariantPackCacheEntry* e = _cached_entry(entries, n, uids, ptrs, workspace)
    cdef int status
    if e != NULL:
        out[0] = e.descriptor
        return CUDNN_STATUS_SUCCESS
    status = _build_variant_pack(api, n, uids, ptrs, workspace, out, stage)
    if status != CUDNN_STATUS_SUCCESS:
        return status
    e = &entries[next_victim[0] % VARIANT_PACK_CACHE_ENTRIES]
    next_victim[0] = (next_victim[0] + 1) % VARIANT_PACK_CACHE_ENTRIES
    if e.descriptor != NULL:
        api.cudnnBackendDestroyDescriptor(e.descriptor)
    e.descriptor = out[0]
    e.workspace = workspace
    e.count = n
    memcpy(e.uids, uids, n * sizeof(int64_t))
    memcpy(e.ptrs, ptrs, n * sizeof(void*))
    return CUDNN_STATUS_SUCCESS


cdef int execute_plan(void* handle, void* plan, VariantPack pack, void* workspace,
                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                      ThreadState state) except -1:
    cdef CudnnApi* api = loaded_api()
    if api == NULL:
        api = cudnn_api()
    cdef int n = pack._n
    cdef int total = n + n_extra
    cdef const int64_t* uids = pack._uids
    cdef void* const* ptrs = pack._ptrs
    # Small merged arrays live on the stack; only oversized packs touch the heap.
    cdef int64_t merged_uids[VARIANT_PACK_CACHE_OPERANDS]
    cdef void* merged_ptrs[VARIANT_PACK_CACHE_OPERANDS]
    cdef int64_t* heap_uids = NULL
    cdef void** heap_ptrs = NULL
    cdef int64_t* dst_uids
    cdef void** dst_ptrs
    cdef VariantPackCacheEntry* entries = NULL
    cdef int* next_victim = NULL
    cdef void* vp = NULL
    cdef int status = CUDNN_STATUS_SUCCESS, stage = 0
    if n_extra > 0:
        if total <= VARIANT_PACK_CACHE_OPERANDS:
            dst_uids, dst_ptrs = merged_uids, merged_ptrs
        else:
            heap_uids = <int64_t*>malloc(total * sizeof(int64_t))
            heap_ptrs = <void**>malloc(total * sizeof(void*))
            if heap_uids == NULL or heap_ptrs == NULL:
                free(heap_uids)
                free(heap_ptrs)
                raise MemoryError()
            dst_uids, dst_ptrs = heap_uids, heap_ptrs
        memcpy(dst_uids, uids, n * sizeof(int64_t))
        memcpy(dst_ptrs, ptrs, n * sizeof(void*))
        memcpy(dst_uids + n, extra_uids, n_extra * sizeof(int64_t))
        memcpy(dst_ptrs + n, extra_ptrs, n_extra * sizeof(void*))
        uids, ptrs = dst_uids, dst_ptrs
    if state is not None and _variant_pack_cache and total <= VARIANT_PACK_CACHE_OPERANDS:
        entries = state._entries
        next_victim = &state._next_victim
    with nogil:
        if entries != NULL:
            status = _variant_pack_from_cache(api, entries, next_victim, total, uids, ptrs, workspace,
                                              &vp, &stage)
        else:
            status = _build_variant_pack(api, total, uids, ptrs, workspace, &vp, &stage)
        if status == CUDNN_STATUS_SUCCESS:
            stage = _STAGE_EXECUTE
            status = api.cudnnBackendExecute(handle, plan, vp)
            if entries == NULL:
                api.cudnnBackendDestroyDescriptor(vp)
    free(heap_uids)
    free(heap_ptrs)
    if status != CUDNN_STATUS_SUCCESS:
        return raise_status(status, _STAGE_NAMES[stage])
    return 0


# ---- compiled plans -----------------------------------------------------------------------------------

@cython.final
cdef class PlanRunner:
    """A finalized execution plan and everything its execute needs, prepared once.

    ``execute(graph, pack, ctx)`` is the CompiledPlan contract (the engine binds it as the compiled
    plan's ``execute``); ``run(pack, handle=, stream=, workspace=)`` is the same without a graph.
    ``constants`` are ``(uid, host array)`` pairs of pass-by-value scalars whose value the graph
    fixed: the plan supplies them when the pack lacks them. ``aliases`` are ``(view uid, source uid,
    byte offset)``: cuDNN reads the view at the source operand's pointer plus the offset (a slice of
    a graph input on a cuDNN without a slice operation).
    """

    def __cinit__(self):
        self._device_operand = NULL
        self._n_specs = -1
        self._n_constants = 0
        self._n_aliases = 0

    def __init__(self, Descriptor plan, int64_t workspace_size, int device=0, str name="",
                 constants=(), keepalive=None, aliases=()):
        if not plan.finalized:
            raise ValueError("PlanRunner needs a finalized execution plan")
        self._plan = plan
        self.workspace_size = workspace_size
        self.device = device
        self.name = name
        self._keepalive = keepalive
        self._workspaces = {}
        self._workspace_lock = threading.Lock()
        self._checked_layout = None
        constants = list(constants)
        if len(constants) > PLAN_MAX_CONSTANTS:
            raise ValueError(f"a plan supplies at most {PLAN_MAX_CONSTANTS} scalar constants")
        storage = []
        for i, (uid, array) in enumerate(constants):
            self._constant_uids[i] = uid
            self._constant_ptrs[i] = <void*><uintptr_t>array.ctypes.data
            storage.append(array)
        self._constant_storage = storage
        self._n_constants = len(constants)
        aliases = list(aliases)
        if len(aliases) > PLAN_MAX_ALIASES:
            raise ValueError(f"a plan feeds at most {PLAN_MAX_ALIASES} views from other operands")
        for i, (view, source, offset) in enumerate(aliases):
            self._alias_views[i] = view
            self._alias_sources[i] = source
            self._alias_offsets[i] = offset
        self._n_aliases = len(aliases)

    def __dealloc__(self):
        free(self._device_operand)
        self._device_operand = NULL

    @property
    def plan(self) -> Descriptor:
        return self._plan

    def execute(self, graph, VariantPack pack, ctx):
        """CompiledPlan.execute: ctx carries handle, stream and workspace."""
        self._run(pack, ctx.handle, ctx.stream, ctx.workspace)

    def run(self, VariantPack pack, *, handle=None, stream=None, workspace=None):
        self._run(pack, handle, stream, workspace)

    def bind_layout(self, PackLayout layout):
        """Remember the graph's layout so ``execute_mapping`` packs and runs in one call."""
        self._bound_layout = layout

    def execute_mapping(self, mapping, handle, stream):
        """pygraph.execute's fast path: normalise ``{tensor | uid: buffer}`` and run, with no Python frame."""
        self._run(pack_from_mapping(mapping, self._bound_layout, stream), handle, stream, None)

    cdef int _run(self, VariantPack pack, object handle, object stream, object workspace) except -1:
        cdef ThreadState state = thread_state()
        cdef Handle h = None
        cdef void* handle_ptr
        cdef intptr_t stream_ptr = 0
        cdef bint have_stream = stream is not None
        cdef CudnnApi* api
        if have_stream:
            stream_ptr = stream if type(stream) is int else stream_handle(stream)
        if handle is None:
            h = state.handle_for(self.device)
        elif type(handle) is Handle:
            h = <Handle>handle
        if h is not None:
            if have_stream:
                h.bind_stream(stream_ptr)
            else:
                stream_ptr = h._stream
            handle_ptr = h.ptr
        else:
            # A foreign handle (another binding's int): its stream is set when one is given.
            handle_ptr = <void*><uintptr_t>PyNumber_Index(handle)
            if have_stream:
                api = cudnn_api()
                check(api.cudnnSetStream(handle_ptr, <void*>stream_ptr), b"cudnnSetStream")
        cdef void* ws = self._workspace_pointer(workspace, stream_ptr)
        self._check_alignment(pack)

        # Scalars the graph fixed and the caller did not pass: the plan supplies them.
        cdef int64_t extra_uids[PLAN_MAX_CONSTANTS + PLAN_MAX_ALIASES]
        cdef void* extra_ptrs[PLAN_MAX_CONSTANTS + PLAN_MAX_ALIASES]
        cdef int n_extra = 0, i, at
        if self._n_constants and pack._n != self._n_specs:
            for i in range(self._n_constants):
                if _uid_index(pack, self._constant_uids[i]) < 0:
                    extra_uids[n_extra] = self._constant_uids[i]
                    extra_ptrs[n_extra] = self._constant_ptrs[i]
                    n_extra += 1
        for i in range(self._n_aliases):
            at = _uid_index(pack, self._alias_sources[i])
            if at < 0:
                raise MissingTensorError(f"{self.name}: the pack has no operand with uid "
                                         f"{self._alias_sources[i]}, which uid {self._alias_views[i]} is a view of")
            extra_uids[n_extra] = self._alias_views[i]
            extra_ptrs[n_extra] = <void*>(<char*>pack._ptrs[at] + self._alias_offsets[i])
            n_extra += 1
        # cuDNN launches on the current context: make it this plan's device (a cheap compare when it is).
        cdef bint pushed = False
        enter_device(self.device, &pushed)
        try:
            return execute_plan(handle_ptr, self._plan.ptr, pack, ws, extra_uids, extra_ptrs, n_extra, state)
        finally:
            leave_device(pushed)

    cdef void* _workspace_pointer(self, object workspace, intptr_t stream_key) except? NULL:
        cdef Slot slot
        cdef DeviceAllocation allocation
        cdef int64_t nbytes
        if workspace is None:
            if self.workspace_size <= 0:
                return NULL
            # One allocation per (plan, stream): work on one stream is ordered, so reuse is safe.
            found = self._workspaces.get(stream_key)
            if found is None:
                with self._workspace_lock:
                    found = self._workspaces.get(stream_key)
                    if found is None:
                        found = DeviceAllocation(self.workspace_size, self.device)
                        self._workspaces[stream_key] = found
            return <void*>(<DeviceAllocation>found).ptr
        if type(workspace) is int:
            return <void*><uintptr_t>workspace   # a raw address: the caller vouches for its size
        if isinstance(workspace, DeviceAllocation):
            allocation = <DeviceAllocation>workspace
            if <int64_t>allocation.nbytes < self.workspace_size:
                raise WorkspaceError(f"{self.name}: the workspace holds {allocation.nbytes} bytes; the plan "
                                     f"needs {self.workspace_size}", self.workspace_size, allocation.nbytes)
            return <void*>allocation.ptr
        slot = <Slot>workspace if type(workspace) is Slot else slot_from_object(workspace, None)
        if slot.tensor.device.device_type != kDLCUDA and slot.tensor.device.device_type != kDLCUDAManaged:
            raise WorkspaceError(f"{self.name}: the workspace must be CUDA device memory; got a buffer on "
                                 f"{slot.device}", self.workspace_size, 0)
        nbytes = (slot_numel(slot) * dtype_bits(slot.tensor.dtype)) // 8
        if nbytes < self.workspace_size:
            raise WorkspaceError(f"{self.name}: the workspace holds {nbytes} bytes; the plan needs "
                                 f"{self.workspace_size}", self.workspace_size, nbytes)
        return slot.tensor.data

    cdef int _check_alignment(self, VariantPack pack) except -1:
        """Device operands must honour the 16-byte alignment the tensor descriptors declare."""
        cdef PackLayout layout = pack.layout
        cdef uintptr_t misaligned = 0
        cdef int i, n = pack._n
        if layout is None:
            return 0
        if layout is not self._checked_layout:
            self._prepare_layout(layout)
        if n == self._n_specs:
            for i in range(n):
                if self._device_operand[i]:
                    misaligned |= (<uintptr_t>pack._ptrs[i]) & 15
            if misaligned == 0:
                return 0
        for i in range(n):
            position = layout._index.get(pack._uids[i])
            if position is None or not self._device_operand[<int>position]:
                continue
            if (<uintptr_t>pack._ptrs[i]) & 15:
                spec = <TensorSpec>layout.specs[<int>position]
                raise AlignmentError(spec.name, spec.uid, "data address aligned to 16 bytes (the cuDNN plan "
                                     "was built for 16-byte aligned operands)", "a multiple of 16",
                                     f"0x{<uintptr_t>pack._ptrs[i]:x}")
        return 0

    cdef int _prepare_layout(self, PackLayout layout) except -1:
        cdef int i, n = len(layout.specs)
        cdef uint8_t* flags = <uint8_t*>malloc(max(n, 1))
        if flags == NULL:
            raise MemoryError()
        for i in range(n):
            flags[i] = (<TensorSpec>layout.specs[i])._device.device_type != kDLCPU
        free(self._device_operand)
        self._device_operand = flags
        self._n_specs = n
        self._checked_layout = layout
        return 0

    def __repr__(self):
        return f"PlanRunner({self.name or 'plan'}, workspace={self.workspace_size}, device={self.device})"


cdef inline int _uid_index(VariantPack pack, int64_t uid) noexcept:
    # The pack's uids are sorted: binary search; -1 when absent.
    cdef int lo = 0, hi = pack._n - 1, mid
    while lo <= hi:
        mid = (lo + hi) >> 1
        if pack._uids[mid] == uid:
            return mid
        if pack._uids[mid] < uid:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


# ---- measurement --------------------------------------------------------------------------------------

cdef inline double _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec * 1e9 + t.tv_nsec


def execute_floor_ns(PlanRunner runner, VariantPack pack, int iterations, *, bint reuse_variant_pack=True,
                     stream=None) -> float:
    """Host nanoseconds per cudnnBackendExecute issued from a nogil C loop on this pack: the C floor.

    ``reuse_variant_pack`` builds the variant pack once (what the cache achieves); otherwise each
    iteration builds, finalizes and destroys one, as an uncached execute does.
    """
    cdef ThreadState state = thread_state()
    cdef Handle h = state.handle_for(runner.device)
    cdef CudnnApi* api = cudnn_api()
    cdef void* ws = runner._workspace_pointer(None, h._stream)
    cdef void* vp = NULL
    cdef void* plan = runner._plan.ptr
    cdef int status = 0, stage = 0, i
    cdef double start, stop
    if stream is not None:
        h.bind_stream(stream_handle(stream))
    if iterations <= 0:
        raise ValueError("iterations must be positive")
    with nogil:
        if reuse_variant_pack:
            status = _build_variant_pack(api, pack._n, pack._uids, pack._ptrs, ws, &vp, &stage)
        start = _now_ns()
        for i in range(iterations):
            if status != CUDNN_STATUS_SUCCESS:
                break
            if not reuse_variant_pack:
                status = _build_variant_pack(api, pack._n, pack._uids, pack._ptrs, ws, &vp, &stage)
                if status != CUDNN_STATUS_SUCCESS:
                    break
            status = api.cudnnBackendExecute(h.ptr, plan, vp)
            if not reuse_variant_pack:
                api.cudnnBackendDestroyDescriptor(vp)
                vp = NULL
        stop = _now_ns()
        if vp != NULL:
            api.cudnnBackendDestroyDescriptor(vp)
    check(status, b"execute_floor_ns")
    return (stop - start) / iterations


def variant_pack_build_ns(VariantPack pack, int iterations) -> float:
    """Host nanoseconds to create, fill, finalize and destroy one variant pack for this pack."""
    cdef CudnnApi* api = cudnn_api()
    cdef void* vp = NULL
    cdef int status = 0, stage = 0, i
    cdef double start, stop
    with nogil:
        start = _now_ns()
        for i in range(iterations):
            status = _build_variant_pack(api, pack._n, pack._uids, pack._ptrs, NULL, &vp, &stage)
            if status != CUDNN_STATUS_SUCCESS:
                break
            api.cudnnBackendDestroyDescriptor(vp)
        stop = _now_ns()
    check(status, _STAGE_NAMES[stage])
    return (stop - start) / max(iterations, 1)
