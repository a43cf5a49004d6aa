"""The in-process C API: the function table of include/cudnn_graph/cudnn_graph_capi.h, published as the
capsule ``cudnn_graph._C_API`` (``PyCapsule_Import("cudnn_graph._C_API", 0)`` after ``import
cudnn_graph``), so that a C or Cython extension holding raw pointers executes a graph built in Python
with no Python call per execute.

A handle (``plan_from_graph``) is the graph's selected, built plan with its operand table in C. The
queries and execute's checks read only C data, without the GIL. A cuDNN plan then runs through its
``PlanRunner`` (the path ``pygraph.execute`` takes: variant-pack cache, CUDA-graph replay,
cudnnBackendExecute with the GIL released), holding the GIL only while the runner resolves its handle
and workspace; a Python engine's plan (the reference engine's, CuTe's, cuTile's) runs with the GIL,
its pointers made DLPack slots of the declared geometry. Nothing here loads libcudnn at import.

Example (from C; see docs/c_api.md):
    >>> import cudnn_graph
    >>> type(cudnn_graph._C_API).__name__
    'PyCapsule'
"""
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t, intptr_t, uintptr_t, uint8_t, uint32_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset
from libc.stdio cimport snprintf

from cudnn_graph.capi cimport (
    cg_capi_t, cg_status_t, cg_tensor_info_t, cg_engine_family_t, cg_graph_plan_t, CG_CAPI_VERSION,
    CG_CAPI_CAPSULE_NAME, CG_STATUS_SUCCESS, CG_STATUS_INVALID_ARGUMENT, CG_STATUS_NULL_POINTER,
    CG_STATUS_MISALIGNED, CG_STATUS_UNKNOWN_UID, CG_STATUS_MISSING_TENSOR, CG_STATUS_DUPLICATE_UID,
    CG_STATUS_CUDNN_ERROR, CG_STATUS_CUDA_ERROR, CG_STATUS_OUT_OF_MEMORY, CG_STATUS_NOT_BUILT,
    CG_STATUS_PYTHON_ERROR,
)
from cudnn_graph._plan_runner cimport PlanRunner
from cudnn_graph._variant_pack cimport PackLayout, TensorSpec
from cudnn_graph._graph_replay cimport Operands
from cudnn_graph._slot cimport slot_from_address
from cudnn_graph._dlpack cimport kDLCPU

cdef extern from "cudnn_graph_rt/cg_status_names.h":
    const char* cg_status_text(cg_status_t status) noexcept nogil

cdef extern from *:
    """
    /* The calling thread's last failure, as the C runtime keeps its own (cg_error.c). */
    static __thread char cg_capi_error_text[1024];
    static void cg_capi_set_error(const char *text) {
        snprintf(cg_capi_error_text, sizeof cg_capi_error_text, "%s", text);
    }
    static const char *cg_capi_error(void) { return cg_capi_error_text; }
    """
    void cg_capi_set_error(const char* text) noexcept nogil
    const char* cg_capi_error() noexcept nogil

cdef enum:
    _MESSAGE = 1024
    _DEVICE_ALIGNMENT = 16      # what the cuDNN plan's tensor descriptors promise (PlanRunner checks it too)


cdef inline cg_status_t _fail(cg_status_t status, const char* text) noexcept nogil:
    cg_capi_set_error(text)
    return status


cdef cg_status_t _fail_python(cg_status_t status, str text) noexcept:
    cdef bytes raw = text.encode("utf-8", "replace")
    cg_capi_set_error(raw)
    return status


cdef cg_status_t _status_of(BaseException exc) noexcept:
    """A raised exception as a status whose message is the exception (the typed errors keep their words)."""
    from cudnn_graph.errors import (AlignmentError, CudaDriverError, MissingTensorError, NotBuiltError,
                                    UnknownTensorError)
    from cudnn_graph._cudnn_errors import CudnnStatusError
    cdef cg_status_t status = CG_STATUS_PYTHON_ERROR
    if isinstance(exc, AlignmentError):
        status = CG_STATUS_MISALIGNED
    elif isinstance(exc, MissingTensorError):
        status = CG_STATUS_MISSING_TENSOR
    elif isinstance(exc, UnknownTensorError):
        status = CG_STATUS_UNKNOWN_UID
    elif isinstance(exc, NotBuiltError):
        status = CG_STATUS_NOT_BUILT
    elif isinstance(exc, CudnnStatusError):
        status = CG_STATUS_CUDNN_ERROR
    elif isinstance(exc, CudaDriverError):
        status = CG_STATUS_CUDA_ERROR
    elif isinstance(exc, MemoryError):
        status = CG_STATUS_OUT_OF_MEMORY
    return _fail_python(status, f"{type(exc).__name__}: {exc}")


# ---- handles -----------------------------------------------------------------------------------------

cdef void _release(GraphPlanData* d) noexcept:
    """Free a handle's C data and drop its owner (the GIL is held)."""
    if d == NULL:
        return
    if d.owner != NULL:
        Py_DECREF(<object>d.owner)
    free(d.operands)
    free(d.geometry)
    free(d.nonempty)
    free(d)


cdef int _fill(GraphPlanData* d, object graph, object compiled) except -1:
    from cudnn_graph import _plan_blob
    from cudnn_graph.engines.ids import family_of
    cdef PackLayout layout = compiled.layout
    runner = getattr(compiled, "runner", None)
    d.runs_in_c = isinstance(runner, PlanRunner)
    # The caller's operands: the layout's required ones (a scalar the graph fixed is supplied by the plan).
    specs = [s for s in layout.specs if (<TensorSpec>s).required]
    tensors = [graph.tensor_by_uid(s.uid) for s in specs]
    names = [(s.name or "").encode("utf-8") for s in specs]
    strides = [tuple(s.strides) if s.strides is not None else tuple(t.stride) for s, t in zip(specs, tensors)]
    cdef int n = len(specs), i, j, at = 0
    cdef size_t total = sum(2 * len(s.shape) for s in specs)
    d.operands = <cg_tensor_info_t*>calloc(max(n, 1), sizeof(cg_tensor_info_t))
    d.geometry = <int64_t*>malloc(max(total, 1) * sizeof(int64_t))
    d.nonempty = <uint8_t*>calloc(max(n, 1), 1)
    if d.operands == NULL or d.geometry == NULL or d.nonempty == NULL:
        raise MemoryError()
    cdef TensorSpec spec
    cdef cg_tensor_info_t* info
    cdef bytes name
    for i in range(n):
        spec = <TensorSpec>specs[i]
        t = tensors[i]
        info = &d.operands[i]
        info.uid = spec.uid
        name = names[i]            # kept alive by the owner tuple
        info.name = name
        info.data_type = int(t.data_type)
        info.rank = len(spec.shape)
        info.dims = d.geometry + at
        for j in range(info.rank):
            d.geometry[at] = spec.shape[j]
            at += 1
        info.strides = d.geometry + at
        for j in range(info.rank):
            d.geometry[at] = strides[i][j]
            at += 1
        info.is_pass_by_value = bool(t.is_pass_by_value)
        device_operand = spec._device.device_type != kDLCPU
        info.alignment = max(int(spec.alignment), _DEVICE_ALIGNMENT if (d.runs_in_c and device_operand) else 0)
        d.nonempty[i] = all(int(e) > 0 for e in spec.shape)
    d.n_operands = n
    entry = graph.selected_plan
    d.engine_id = int(entry.engine_id)
    d.family = <cg_engine_family_t>_plan_blob.ENGINE_FAMILY_CODES[family_of(d.engine_id)]
    d.workspace_size = int(compiled.workspace_size)
    kind, ordinal = graph.device
    d.device = int(ordinal) if kind == "cuda" else -1
    owner = (graph, compiled, runner if d.runs_in_c else None, layout, tuple(specs), tuple(names), tuple(strides))
    Py_INCREF(owner)
    d.owner = <PyObject*>owner
    return 0


cdef cg_status_t _plan_from_graph(PyObject* graph_object, cg_graph_plan_t* out) noexcept with gil:
    if out == NULL:
        return _fail(CG_STATUS_INVALID_ARGUMENT, b"plan_from_graph: out is NULL")
    out[0] = NULL
    if graph_object == NULL:
        return _fail(CG_STATUS_INVALID_ARGUMENT, b"plan_from_graph: the graph is NULL")
    cdef GraphPlanData* d = NULL
    try:
        from cudnn_graph.graph import pygraph
        graph = <object>graph_object
        if not isinstance(graph, pygraph):
            return _fail_python(CG_STATUS_INVALID_ARGUMENT, f"plan_from_graph: a cudnn_graph.pygraph is expected; "
                                                           f"got {type(graph).__name__}")
        compiled = graph.compiled_plan()
        if compiled is None or compiled.layout is None:
            return _fail_python(CG_STATUS_NOT_BUILT, f"plan_from_graph: graph '{graph.context.name}' has no built "
                                                    f"plan: build() it first (the handle takes the selected plan)")
        d = <GraphPlanData*>calloc(1, sizeof(GraphPlanData))
        if d == NULL:
            raise MemoryError()
        _fill(d, graph, compiled)
    except BaseException as exc:
        _release(d)
        return _status_of(exc)
    out[0] = <cg_graph_plan_t>d
    return CG_STATUS_SUCCESS


cdef void _plan_free(cg_graph_plan_t plan) noexcept nogil:
    if plan == NULL:
        return
    with gil:
        _release(<GraphPlanData*>plan)


# ---- queries (C data only: no GIL) -------------------------------------------------------------------

cdef inline cg_status_t _check_query(cg_graph_plan_t plan, const void* out, const char* what) noexcept nogil:
    cdef char text[_MESSAGE]
    if plan == NULL:
        snprintf(text, _MESSAGE, "%s: the plan is NULL", what)
        return _fail(CG_STATUS_INVALID_ARGUMENT, text)
    if out == NULL:
        snprintf(text, _MESSAGE, "%s: the result pointer is NULL", what)
        return _fail(CG_STATUS_INVALID_ARGUMENT, text)
    return CG_STATUS_SUCCESS


cdef inline int _operand_index(const GraphPlanData* d, int64_t uid) noexcept nogil:
    # The operands are uid ascending: binary search; -1 when absent.
    cdef int lo = 0, hi = d.n_operands - 1, mid
    while lo <= hi:
        mid = (lo + hi) >> 1
        if d.operands[mid].uid == uid:
            return mid
        if d.operands[mid].uid < uid:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


cdef cg_status_t _plan_tensor_count(cg_graph_plan_t plan, int* count) noexcept nogil:
    cdef cg_status_t status = _check_query(plan, count, "plan_tensor_count")
    if status == CG_STATUS_SUCCESS:
        count[0] = (<GraphPlanData*>plan).n_operands
    return status


cdef cg_status_t _plan_tensor(cg_graph_plan_t plan, int index, cg_tensor_info_t* info) noexcept nogil:
    cdef char text[_MESSAGE]
    cdef cg_status_t status = _check_query(plan, info, "plan_tensor")
    if status != CG_STATUS_SUCCESS:
        return status
    cdef GraphPlanData* d = <GraphPlanData*>plan
    if index < 0 or index >= d.n_operands:
        snprintf(text, _MESSAGE, "plan_tensor: index %d, the plan has %d operands", index, d.n_operands)
        return _fail(CG_STATUS_INVALID_ARGUMENT, text)
    info[0] = d.operands[index]
    return CG_STATUS_SUCCESS


cdef cg_status_t _plan_tensor_index(cg_graph_plan_t plan, int64_t uid, int* index) noexcept nogil:
    cdef char text[_MESSAGE]
    cdef cg_status_t status = _check_query(plan, index, "plan_tensor_index")
    if status != CG_STATUS_SUCCESS:
        return status
    index[0] = _operand_index(<GraphPlanData*>plan, uid)
    if index[0] < 0:
        snprintf(text, _MESSAGE, "plan_tensor_index: the plan has no operand uid %lld", <long long>uid)
        return _fail(CG_STATUS_UNKNOWN_UID, text)
    return CG_STATUS_SUCCESS


cdef cg_status_t _plan_workspace_size(cg_graph_plan_t plan, size_t* size) noexcept nogil:
    cdef cg_status_t status = _check_query(plan, size, "plan_workspace_size")
    if status == CG_STATUS_SUCCESS:
        size[0] = (<GraphPlanData*>plan).workspace_size
    return status


cdef cg_status_t _plan_engine_family(cg_graph_plan_t plan, cg_engine_family_t* family) noexcept nogil:
    cdef cg_status_t status = _check_query(plan, family, "plan_engine_family")
    if status == CG_STATUS_SUCCESS:
        family[0] = (<GraphPlanData*>plan).family
    return status


cdef cg_status_t _plan_engine_id(cg_graph_plan_t plan, int64_t* engine_id) noexcept nogil:
    cdef cg_status_t status = _check_query(plan, engine_id, "plan_engine_id")
    if status == CG_STATUS_SUCCESS:
        engine_id[0] = (<GraphPlanData*>plan).engine_id
    return status


cdef cg_status_t _plan_device(cg_graph_plan_t plan, int* device) noexcept nogil:
    cdef cg_status_t status = _check_query(plan, device, "plan_device")
    if status == CG_STATUS_SUCCESS:
        device[0] = (<GraphPlanData*>plan).device
    return status


# ---- execute -----------------------------------------------------------------------------------------

cdef cg_status_t _check_operands(const GraphPlanData* d, int count, const int64_t* uids, void* const* pointers,
                                 void* workspace, int* position) noexcept nogil:
    """The C runtime's per-call checks (cg_plan.c), in its words; position[k]: operand k's place in the call."""
    cdef char text[_MESSAGE]
    cdef int i, at, k
    cdef uintptr_t address
    cdef const cg_tensor_info_t* info
    if count < 0:
        snprintf(text, _MESSAGE, "execute: count is %d", count)
        return _fail(CG_STATUS_INVALID_ARGUMENT, text)
    if count > 0 and (uids == NULL or pointers == NULL):
        snprintf(text, _MESSAGE, "execute: %d operands but uids or pointers is NULL", count)
        return _fail(CG_STATUS_INVALID_ARGUMENT, text)
    for k in range(d.n_operands):
        position[k] = -1
    for i in range(count):
        at = _operand_index(d, uids[i])
        if at < 0:
            snprintf(text, _MESSAGE, "execute: uids[%d] = %lld is not an operand of the plan (a virtual tensor, "
                     "a scalar the graph fixed or an unknown uid)", i, <long long>uids[i])
            return _fail(CG_STATUS_UNKNOWN_UID, text)
        info = &d.operands[at]
        if position[at] >= 0:
            snprintf(text, _MESSAGE, "execute: uid %lld ('%s') is passed twice", <long long>info.uid, info.name)
            return _fail(CG_STATUS_DUPLICATE_UID, text)
        position[at] = i
        address = <uintptr_t>pointers[i]
        if address == 0 and (d.nonempty[at] or info.is_pass_by_value):
            snprintf(text, _MESSAGE, "execute: tensor '%s' (uid %lld) has a NULL pointer", info.name,
                     <long long>info.uid)
            return _fail(CG_STATUS_NULL_POINTER, text)
        if info.alignment and not info.is_pass_by_value and (address & (info.alignment - 1)) != 0:
            snprintf(text, _MESSAGE, "execute: tensor '%s' (uid %lld) at %p is not %u-byte aligned", info.name,
                     <long long>info.uid, pointers[i], info.alignment)
            return _fail(CG_STATUS_MISALIGNED, text)
    if count != d.n_operands:
        for k in range(d.n_operands):
            if position[k] < 0:
                snprintf(text, _MESSAGE, "execute: tensor '%s' (uid %lld) is not passed (%d of the plan's %d "
                         "operands were)", d.operands[k].name, <long long>d.operands[k].uid, count, d.n_operands)
                return _fail(CG_STATUS_MISSING_TENSOR, text)
    if workspace == NULL and d.workspace_size > 0:
        snprintf(text, _MESSAGE, "execute: the plan needs %zu bytes of workspace and workspace is NULL",
                 d.workspace_size)
        return _fail(CG_STATUS_NULL_POINTER, text)
    return CG_STATUS_SUCCESS


cdef cg_status_t _run(GraphPlanData* d, void* stream, const int64_t* uids, void* const* pointers,
                      void* workspace) noexcept with gil:
    """Run on the operands in layout order (uids ascending, one per operand); the GIL is taken here."""
    cdef Operands operands
    cdef PlanRunner runner
    cdef TensorSpec spec
    cdef int i
    owner = <tuple><object>d.owner
    try:
        ws = None if workspace == NULL else <uintptr_t>workspace
        if d.runs_in_c:
            runner = <PlanRunner>owner[2]
            operands.n = d.n_operands
            operands.uids = <int64_t*>uids
            operands.ptrs = <void**>pointers
            runner._run_operands(<PackLayout>owner[3], &operands, None, <intptr_t>stream, ws, None)
        else:
            # A Python engine's plan: the pointers become slots of the declared geometry, and the graph
            # runs its compiled plan as execute() does (fixed scalars filled in, every slot checked).
            graph, compiled, specs, strides = owner[0], owner[1], owner[4], owner[6]
            mapping = {}
            for i in range(d.n_operands):
                spec = <TensorSpec>specs[i]
                mapping[spec.uid] = slot_from_address(<intptr_t>pointers[i], spec.shape, strides[i], spec._dtype,
                                                      spec._device, False)
            graph._run(compiled, mapping, ws, None, None if stream == NULL else <uintptr_t>stream, None, None,
                       None)
    except BaseException as exc:
        return _status_of(exc)
    return CG_STATUS_SUCCESS


cdef cg_status_t _execute(cg_graph_plan_t plan, void* stream, int count, const int64_t* uids,
                          void* const* pointers, void* workspace) noexcept nogil:
    if plan == NULL:
        return _fail(CG_STATUS_INVALID_ARGUMENT, b"execute: the plan is NULL")
    cdef GraphPlanData* d = <GraphPlanData*>plan
    cdef int position_inline[CAPI_SORT_INLINE]
    cdef int64_t uids_inline[CAPI_SORT_INLINE]
    cdef void* pointers_inline[CAPI_SORT_INLINE]
    cdef int* position = position_inline
    cdef int64_t* sorted_uids = uids_inline
    cdef void** sorted_pointers = pointers_inline
    cdef int k
    cdef cg_status_t status
    if d.n_operands > CAPI_SORT_INLINE:
        position = <int*>malloc(d.n_operands * sizeof(int))
        sorted_uids = <int64_t*>malloc(d.n_operands * sizeof(int64_t))
        sorted_pointers = <void**>malloc(d.n_operands * sizeof(void*))
        if position == NULL or sorted_uids == NULL or sorted_pointers == NULL:
            status = _fail(CG_STATUS_OUT_OF_MEMORY, b"execute: no memory for the operands")
            free(position)
            free(sorted_uids)
            free(sorted_pointers)
            return status
    status = _check_operands(d, count, uids, pointers, workspace, position)
    if status == CG_STATUS_SUCCESS:
        # Every operand was passed once: lay them out in the plan's (uid-ascending) order.
        for k in range(d.n_operands):
            sorted_uids[k] = d.operands[k].uid
            sorted_pointers[k] = pointers[position[k]]
        status = _run(d, stream, sorted_uids, sorted_pointers, workspace)
    if d.n_operands > CAPI_SORT_INLINE:
        free(position)
        free(sorted_uids)
        free(sorted_pointers)
    return status


cdef const char* _last_error() noexcept nogil:
    return cg_capi_error()


cdef const char* _status_name(cg_status_t status) noexcept nogil:
    return cg_status_text(status)


# ---- the table ---------------------------------------------------------------------------------------

cdef cg_capi_t _table
memset(&_table, 0, sizeof(_table))
_table.version = CG_CAPI_VERSION
_table.size = sizeof(cg_capi_t)
_table.plan_from_graph = _plan_from_graph
_table.plan_free = _plan_free
_table.plan_tensor_count = _plan_tensor_count
_table.plan_tensor = _plan_tensor
_table.plan_tensor_index = _plan_tensor_index
_table.plan_workspace_size = _plan_workspace_size
_table.plan_engine_family = _plan_engine_family
_table.plan_engine_id = _plan_engine_id
_table.plan_device = _plan_device
_table.execute = _execute
_table.last_error = _last_error
_table.status_name = _status_name

#: The capsule ``cudnn_graph._C_API`` (re-exported by the package): a pointer to the table.
_C_API = PyCapsule_New(<void*>&_table, CG_CAPI_CAPSULE_NAME, NULL)
