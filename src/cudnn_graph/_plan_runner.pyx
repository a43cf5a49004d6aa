"""Compiled plans: ``PlanRunner`` runs one finalized execution plan; ``ShapeOverrides`` carries
execute-time shapes and strides.

The hot path is ``PlanRunner.execute(graph, pack, ctx)``: it resolves the handle and stream
(``cudnnSetStream`` only when the stream changed), the workspace (the caller's, checked for size, or
one cached per plan and stream), checks device operands for the 16-byte alignment the tensor
descriptors promise, adds the operands the plan supplies itself, and calls
cudnn_graph._graph_replay.execute_plan (variant-pack cache, CUDA graph replay, cudnnBackendExecute
with the GIL released).
"""
cimport cython
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int64_t, intptr_t, uintptr_t, uint8_t
from libc.stdlib cimport malloc, free

from cudnn_graph._loader cimport CudnnApi, cudnn_api, check
from cudnn_graph._dlpack cimport kDLCPU, kDLCUDA, kDLCUDAManaged
from cudnn_graph._dtypes cimport dtype_bits
from cudnn_graph._slot cimport Slot, slot_from_object, slot_numel
from cudnn_graph._variant_pack cimport VariantPack, PackLayout, TensorSpec, pack_from_mapping, pack_into, PACK_INLINE
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._driver cimport enter_device, leave_device, zero_async, DeviceAllocation
from cudnn_graph._cudnn_descriptor cimport Descriptor
from cudnn_graph._cudnn_handle cimport Handle, ThreadState, thread_state, cuda_graph_replay_on
from cudnn_graph._graph_replay cimport (
    Operands, OverrideArrays, GraphReplay, Int64Row, Int64Rows, execute_plan, execute_operands,
    GRAPH_UNTRIED, GRAPH_BY_POPULATE, GRAPH_BY_CAPTURE,
)

import threading

from cudnn_graph.errors import AlignmentError, MissingTensorError, WorkspaceError

cdef enum:
    _WORKSPACES_PER_PLAN = 8     # workspaces a plan keeps for the streams it ran on (oldest goes first)


@cython.final
cdef class ShapeOverrides:
    """Execute-time shapes and strides of some tensors, laid out the way cuDNN reads them.

    Example:
        >>> ov = ShapeOverrides([3], [(2, 64, 32)], [(2048, 32, 1)])
        >>> ov.uids, ov.shapes
        ((3,), ((2, 64, 32),))
    """

    def __cinit__(self):
        self._rows = NULL
        self._values = NULL

    def __init__(self, uids, shapes, strides):
        uids = tuple(PyNumber_Index(u) for u in uids)
        shapes = tuple(tuple(PyNumber_Index(d) for d in shape) for shape in shapes)
        strides = tuple(tuple(PyNumber_Index(d) for d in row) for row in strides)
        if not (len(uids) == len(shapes) == len(strides)):
            raise ValueError(f"override_uids, override_shapes and override_strides must have one entry per "
                             f"uid; got {len(uids)}, {len(shapes)} and {len(strides)}")
        for uid, shape, row in zip(uids, shapes, strides):
            if len(shape) != len(row):
                raise ValueError(f"uid {uid}: override shape {shape} and strides {row} differ in rank")
        cdef int n = len(uids), i, j, at
        cdef size_t count = n + 2 * sum(len(shape) for shape in shapes)
        self._values = <int64_t*>malloc(max(count, 1) * sizeof(int64_t))
        self._rows = <Int64Row*>malloc(max(2 * n, 1) * sizeof(Int64Row))
        if self._values == NULL or self._rows == NULL:
            raise MemoryError()
        for i in range(n):
            self._values[i] = uids[i]
        at = n
        for i, table in enumerate((shapes, strides)):
            for j in range(n):
                self._rows[i * n + j].begin = self._values + at
                for value in table[j]:
                    self._values[at] = value
                    at += 1
                self._rows[i * n + j].end = self._values + at
                self._rows[i * n + j].capacity_end = self._values + at
        self._shapes.begin = self._rows
        self._shapes.end = self._rows + n
        self._shapes.capacity_end = self._rows + n
        self._strides.begin = self._rows + n
        self._strides.end = self._rows + 2 * n
        self._strides.capacity_end = self._rows + 2 * n
        self.arrays.n = n
        self.arrays.uids = self._values
        self.arrays.shapes = &self._shapes
        self.arrays.strides = &self._strides
        self.uids, self.shapes, self.strides = uids, shapes, strides

    def __dealloc__(self):
        free(self._rows)
        free(self._values)

    def __repr__(self):
        return f"ShapeOverrides(uids={self.uids}, shapes={self.shapes}, strides={self.strides})"


# ---- compiled plans -----------------------------------------------------------------------------------

cdef int _store_operands(int64_t* uids, void** ptrs, int capacity, list entries, str what) except -1:
    """Copy (uid, address) ``entries`` into the plan's C arrays of ``capacity``; returns how many."""
    if len(entries) > capacity:
        raise ValueError(f"a plan supplies at most {capacity} {what}")
    cdef int i
    for i, (uid, address) in enumerate(entries):
        uids[i] = uid
        ptrs[i] = <void*><uintptr_t>address
    return len(entries)


@cython.final
cdef class PlanRunner:
    """A finalized execution plan and everything its execute needs, prepared once.

    ``execute(graph, pack, ctx)`` is the CompiledPlan contract (the engine binds it as the compiled
    plan's ``execute``); ``run(pack, handle=, stream=, workspace=)`` is the same without a graph.
    ``constants`` are ``(uid, host array)`` pairs of pass-by-value scalars whose value the graph
    fixed: the plan supplies them when the pack lacks them. ``aliases`` are ``(view uid, source uid,
    byte offset)``: cuDNN reads the view at the source operand's pointer plus the offset (a slice of
    a graph input on a cuDNN without a slice operation). ``fixed`` are ``(uid, address, keepalive)``
    operands the plan always supplies (constants its lowering made). ``scratch`` are ``(uid,
    nbytes, zero)`` plan-owned device tensors: each is carved from the workspace past cuDNN's part
    (so ``workspace_size`` covers them) and, with ``zero``, cleared on the stream before each execute.
    ``omit`` are uids the caller passes that no cuDNN operation reads (the source of a view that
    replaced it): they are kept out of the variant pack, which cuDNN wants exact.
    """

    def __cinit__(self):
        self._device_operand = NULL
        self._n_specs = -1
        self._n_constants = 0
        self._n_aliases = 0
        self._n_fixed = 0
        self._n_scratch = 0
        self._graph_support = 0
        self._device_uids = NULL
        self._n_device_uids = 0
        self._last_stream = 0
        self._last_workspace = NULL

    def __init__(self, Descriptor plan, int64_t workspace_size, int device=0, str name="",
                 constants=(), keepalive=None, aliases=(), fixed=(), scratch=(), omit=()):
        if not plan.finalized:
            raise ValueError("PlanRunner needs a finalized execution plan")
        self._plan = plan
        self.cudnn_workspace_size = workspace_size
        self.workspace_size = workspace_size
        self.device = device
        self.name = name
        self._keepalive = keepalive
        self._workspaces = {}
        self._workspace_lock = threading.Lock()
        self._checked_layout = None
        # Constants (host arrays) and fixed operands (an address and what keeps it alive) are both
        # (uid, pointer) entries the plan adds to every variant pack.
        constants = list(constants)
        self._n_constants = _store_operands(self._constant_uids, self._constant_ptrs, PLAN_MAX_CONSTANTS,
                                            [(uid, array.ctypes.data) for uid, array in constants],
                                            "scalar constants")
        self._constant_storage = [array for _, array in constants]
        aliases = list(aliases)
        if len(aliases) > PLAN_MAX_ALIASES:
            raise ValueError(f"a plan feeds at most {PLAN_MAX_ALIASES} views from other operands")
        for i, (view, source, offset) in enumerate(aliases):
            self._alias_views[i] = view
            self._alias_sources[i] = source
            self._alias_offsets[i] = offset
        self._n_aliases = len(aliases)
        fixed = list(fixed)
        self._n_fixed = _store_operands(self._fixed_uids, self._fixed_ptrs, PLAN_MAX_FIXED,
                                        [(uid, address) for uid, address, _ in fixed], "operands of its own")
        self._fixed_storage = [alive for _, _, alive in fixed]
        scratch = list(scratch)
        if len(scratch) > PLAN_MAX_SCRATCH:
            raise ValueError(f"a plan owns at most {PLAN_MAX_SCRATCH} scratch tensors")
        offset = _align_up(workspace_size, _SCRATCH_ALIGNMENT)
        for i, (uid, nbytes, zero) in enumerate(scratch):
            self._scratch_uids[i] = uid
            self._scratch_offsets[i] = offset
            self._scratch_bytes[i] = nbytes
            self._scratch_zero[i] = bool(zero)
            offset = _align_up(offset + nbytes, _SCRATCH_ALIGNMENT)
        self._n_scratch = len(scratch)
        if scratch:
            self.workspace_size = offset
        omit = sorted(set(int(u) for u in omit))
        if len(omit) > PLAN_MAX_ALIASES:
            raise ValueError(f"a plan withholds at most {PLAN_MAX_ALIASES} operands from cuDNN")
        for i, uid in enumerate(omit):
            self._omit_uids[i] = uid
        self._n_omit = len(omit)

    def __dealloc__(self):
        free(self._device_operand)
        free(self._device_uids)
        self._device_operand = NULL
        self._device_uids = NULL

    @property
    def plan(self) -> Descriptor:
        return self._plan

    @property
    def cuda_graph_support(self):
        """True once a CUDA graph was recorded for this plan, False when none could be (the plan then
        always executes), None before either happened."""
        return None if self._graph_support == GRAPH_UNTRIED else self._graph_support > 0

    @property
    def cuda_graph_method(self):
        """How this plan's graphs are recorded: ``"populate"`` (cuDNN's cudnnBackendPopulateCudaGraph),
        ``"capture"`` (a captured execute, where cuDNN refuses to populate), or None (not yet, or never)."""
        return {GRAPH_BY_POPULATE: "populate", GRAPH_BY_CAPTURE: "capture"}.get(self._graph_support)

    @property
    def zeroes_scratch(self) -> bool:
        """Whether each execute zero-fills scratch in the workspace first: a stream operation a graph
        cuDNN populates would not hold (a captured execute does)."""
        cdef int i
        for i in range(self._n_scratch):
            if self._scratch_zero[i]:
                return True
        return False

    def execute(self, graph, VariantPack pack, ctx):
        """CompiledPlan.execute: ctx carries handle, stream and workspace."""
        self._run(pack, ctx.handle, ctx.stream, ctx.workspace)

    def run(self, VariantPack pack, *, handle=None, stream=None, workspace=None):
        self._run(pack, handle, stream, workspace)

    def bind_layout(self, PackLayout layout):
        """Remember the graph's layout so ``execute_mapping`` packs and runs in one call."""
        self._bound_layout = layout

    def execute_mapping(self, mapping, handle, stream):
        """pygraph.execute's fast path: normalise ``{tensor | uid: buffer}`` and run, with no Python frame.

        The operands go into arrays on the C stack (no VariantPack object) unless the layout is too
        large for them.
        """
        cdef PackLayout layout = self._bound_layout
        cdef int64_t uids[PACK_INLINE]
        cdef void* ptrs[PACK_INLINE]
        cdef Py_ssize_t n
        cdef Operands operands
        if layout is None or len(layout.specs) > PACK_INLINE:
            self._run(pack_from_mapping(mapping, layout, stream), handle, stream, None)
            return
        # Slots made for the call (imported tensors they own) live until the launch is issued.
        keepalive = pack_into(mapping, layout, stream, uids, ptrs, PACK_INLINE, &n)
        operands.n = <int>n
        operands.uids = uids
        operands.ptrs = ptrs
        self._run_operands(layout, &operands, handle, stream, None, None)
        del keepalive

    def run_with_overrides(self, VariantPack pack, ShapeOverrides overrides, *, handle=None, stream=None,
                           workspace=None):
        """``run`` with execute-time shapes and strides for the uids ``overrides`` names (a graph
        built with override shapes enabled; cuDNN >= 9.18 reads them)."""
        self._run(pack, handle, stream, workspace, overrides)

    cdef int _run(self, VariantPack pack, object handle, object stream, object workspace,
                  ShapeOverrides overrides=None) except -1:
        cdef Operands operands
        operands.n = pack._n
        operands.uids = pack._uids
        operands.ptrs = pack._ptrs
        return self._run_operands(pack.layout, &operands, handle, stream, workspace, overrides)

    cdef int _run_operands(self, PackLayout layout, const Operands* operands, object handle, object stream,
                           object workspace, ShapeOverrides overrides) except -1:
        # The common call (no handle, no stream or an int one, the plan's own workspace, no extras) runs
        # straight through here with no Python object made: every branch below is a C compare.
        cdef ThreadState state = thread_state()
        cdef Handle h
        cdef void* handle_ptr
        cdef intptr_t stream_ptr = 0
        cdef bint have_stream = stream is not None
        cdef bint stream_known = True
        cdef CudnnApi* api
        cdef GraphReplay replay
        cdef GraphReplay* replay_ptr = NULL
        if have_stream:
            stream_ptr = stream if type(stream) is int else stream_handle(stream)
        if handle is None:
            # The thread's own handle: a stream given to one call must not outlive it (the caller may
            # destroy it), so no stream means the legacy default stream.
            h = state.handle_for(self.device)
            h.bind_stream(stream_ptr)
            handle_ptr = h.ptr
        elif type(handle) is Handle:
            # The caller's handle keeps the stream the caller bound to it (cudnn.set_stream).
            h = <Handle>handle
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
            else:
                stream_known = False    # whatever the other binding set: no graph could follow it
        cdef void* ws = self._workspace_pointer(workspace, stream_ptr)
        if layout is not None:
            self._check_alignment(layout, operands)

        # What the plan supplies itself: fixed scalars, views, its own constants and scratch.
        cdef int64_t extra_uids[PLAN_MAX_EXTRA]
        cdef void* extra_ptrs[PLAN_MAX_EXTRA]
        cdef int n_extra = 0, i
        if self._n_constants or self._n_aliases or self._n_fixed or self._n_scratch:
            n_extra = self._extras(operands, ws, extra_uids, extra_ptrs)
        if cuda_graph_replay_on and self._graph_support >= 0 and stream_known:
            # A graph launches on the caller's stream itself; the handle's binding does not matter to it.
            replay.stream = stream_ptr
            replay.plan_support = &self._graph_support
            replay.plan_owner = <void*>self._plan
            replay_ptr = &replay
        # cuDNN launches on the current context: make it this plan's device (a cheap compare when it is).
        cdef bint pushed = False
        enter_device(self.device, &pushed)
        try:
            for i in range(self._n_scratch):
                if self._scratch_zero[i]:
                    zero_async(<uintptr_t>ws + self._scratch_offsets[i], self._scratch_bytes[i], stream_ptr)
            # Zero fills above and a graph launched below are ordered on the same stream.
            if self._n_omit == 0:
                return execute_plan(handle_ptr, self._plan.ptr, operands, ws, extra_uids, extra_ptrs, n_extra,
                                    state, NULL if overrides is None else &overrides.arrays, replay_ptr)
            return self._execute_without_omitted(handle_ptr, operands, ws, extra_uids, extra_ptrs, n_extra, state,
                                                 overrides, replay_ptr)
        finally:
            leave_device(pushed)

    cdef int _extras(self, const Operands* operands, void* ws, int64_t* extra_uids, void** extra_ptrs) except -1:
        """Fill the operands the plan supplies (PLAN_MAX_EXTRA at most); returns how many."""
        cdef int n_extra = 0, i, at
        # Scalars the graph fixed and the caller did not pass.
        if self._n_constants and operands.n != self._n_specs:
            for i in range(self._n_constants):
                if _uid_index(operands, self._constant_uids[i]) < 0:
                    extra_uids[n_extra] = self._constant_uids[i]
                    extra_ptrs[n_extra] = self._constant_ptrs[i]
                    n_extra += 1
        for i in range(self._n_aliases):
            at = _uid_index(operands, self._alias_sources[i])
            if at < 0:
                raise MissingTensorError(f"{self.name}: the pack has no operand with uid "
                                         f"{self._alias_sources[i]}, which uid {self._alias_views[i]} is a view of")
            extra_uids[n_extra] = self._alias_views[i]
            extra_ptrs[n_extra] = <void*>(<char*>operands.ptrs[at] + self._alias_offsets[i])
            n_extra += 1
        for i in range(self._n_fixed):
            extra_uids[n_extra] = self._fixed_uids[i]
            extra_ptrs[n_extra] = self._fixed_ptrs[i]
            n_extra += 1
        for i in range(self._n_scratch):
            extra_uids[n_extra] = self._scratch_uids[i]
            extra_ptrs[n_extra] = <void*>(<char*>ws + self._scratch_offsets[i])
            n_extra += 1
        return n_extra

    cdef int _kept_operands(self, const Operands* operands, int64_t* uids, void** ptrs) noexcept:
        """Copy the operands but the omitted ones into ``uids`` / ``ptrs``; returns the count."""
        cdef int i, j, kept = 0
        cdef bint skip
        for i in range(operands.n):
            skip = False
            for j in range(self._n_omit):
                if operands.uids[i] == self._omit_uids[j]:
                    skip = True
                    break
            if not skip:
                uids[kept] = operands.uids[i]
                ptrs[kept] = operands.ptrs[i]
                kept += 1
        return kept

    cdef int _execute_without_omitted(self, void* handle_ptr, const Operands* operands, void* ws,
                                      const int64_t* extra_uids, void* const* extra_ptrs, int n_extra,
                                      ThreadState state, ShapeOverrides overrides,
                                      GraphReplay* replay) except -1:
        cdef int64_t* uids = <int64_t*>malloc(max(operands.n, 1) * sizeof(int64_t))
        cdef void** ptrs = <void**>malloc(max(operands.n, 1) * sizeof(void*))
        cdef int kept
        if uids == NULL or ptrs == NULL:
            free(uids)
            free(ptrs)
            raise MemoryError()
        try:
            kept = self._kept_operands(operands, uids, ptrs)
            return execute_operands(handle_ptr, self._plan.ptr, kept, uids, ptrs, ws, extra_uids, extra_ptrs,
                                     n_extra, state, NULL if overrides is None else &overrides.arrays, replay)
        finally:
            free(uids)
            free(ptrs)

    cdef void* _workspace_pointer(self, object workspace, intptr_t stream_key) except? NULL:
        cdef Slot slot
        cdef DeviceAllocation allocation
        cdef int64_t nbytes
        if workspace is None:
            if self.workspace_size <= 0:
                return NULL
            if self._last_workspace != NULL and self._last_stream == stream_key:
                return self._last_workspace
            # One allocation per (plan, stream): work on one stream is ordered, so reuse is safe.
            found = self._workspaces.get(stream_key)
            if found is None:
                with self._workspace_lock:
                    found = self._workspaces.get(stream_key)
                    if found is None:
                        if len(self._workspaces) >= _WORKSPACES_PER_PLAN:
                            # Callers that make a stream per step must not grow this without bound;
                            # freeing waits for work still using the block (cuMemFree synchronizes).
                            # The remembered workspace may be the one going: forget it first (the
                            # free releases the GIL).
                            self._last_workspace = NULL
                            del self._workspaces[next(iter(self._workspaces))]
                        found = DeviceAllocation(self.workspace_size, self.device)
                        self._workspaces[stream_key] = found
            # Both fields are written with the GIL held and no call between: readers see a pair.
            self._last_stream = stream_key
            self._last_workspace = <void*>(<DeviceAllocation>found).ptr
            return self._last_workspace
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

    cdef int _check_alignment(self, PackLayout layout, const Operands* operands) except -1:
        """Device operands must honour the 16-byte alignment the tensor descriptors declare."""
        cdef uintptr_t misaligned = 0
        cdef int i, j = 0, n = operands.n
        if layout is None:
            return 0
        if layout is not self._checked_layout:
            self._prepare_layout(layout)
        if n == self._n_specs:
            # Every operand of the layout: pack positions are layout positions.
            for i in range(n):
                if self._device_operand[i]:
                    misaligned |= (<uintptr_t>operands.ptrs[i]) & 15
        else:
            # Some optional operands left out: walk the operands' uids and the device uids (both
            # ascending) together.
            for i in range(n):
                while j < self._n_device_uids and self._device_uids[j] < operands.uids[i]:
                    j += 1
                if j == self._n_device_uids:
                    break
                if self._device_uids[j] == operands.uids[i]:
                    misaligned |= (<uintptr_t>operands.ptrs[i]) & 15
        if misaligned == 0:
            return 0
        for i in range(n):
            position = layout._index.get(operands.uids[i])
            if position is None or not self._device_operand[<int>position]:
                continue
            if (<uintptr_t>operands.ptrs[i]) & 15:
                spec = <TensorSpec>layout.specs[<int>position]
                raise AlignmentError(spec.name, spec.uid, "data address aligned to 16 bytes (the cuDNN plan "
                                     "was built for 16-byte aligned operands)", "a multiple of 16",
                                     f"0x{<uintptr_t>operands.ptrs[i]:x}")
        return 0

    cdef int _prepare_layout(self, PackLayout layout) except -1:
        cdef int i, n = len(layout.specs), n_device = 0
        cdef uint8_t* flags = <uint8_t*>malloc(max(n, 1))
        cdef int64_t* device_uids = <int64_t*>malloc(max(n, 1) * sizeof(int64_t))
        if flags == NULL or device_uids == NULL:
            free(flags)
            free(device_uids)
            raise MemoryError()
        for i in range(n):
            flags[i] = (<TensorSpec>layout.specs[i])._device.device_type != kDLCPU
            if flags[i]:
                device_uids[n_device] = (<TensorSpec>layout.specs[i]).uid     # specs are sorted by uid
                n_device += 1
        free(self._device_operand)
        free(self._device_uids)
        self._device_operand = flags
        self._device_uids = device_uids
        self._n_device_uids = n_device
        self._n_specs = n
        self._checked_layout = layout
        return 0

    def __repr__(self):
        return f"PlanRunner({self.name or 'plan'}, workspace={self.workspace_size}, device={self.device})"


cdef int64_t _SCRATCH_ALIGNMENT = 256


cdef inline int64_t _align_up(int64_t n, int64_t alignment) noexcept nogil:
    return (n + alignment - 1) // alignment * alignment


cdef inline int _uid_index(const Operands* operands, int64_t uid) noexcept nogil:
    # The operands' uids are sorted: binary search; -1 when absent.
    cdef int lo = 0, hi = operands.n - 1, mid
    while lo <= hi:
        mid = (lo + hi) >> 1
        if operands.uids[mid] == uid:
            return mid
        if operands.uids[mid] < uid:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


cdef int operands_as_executed(PlanRunner runner, const Operands* operands, void* ws, int64_t** uids,
                              void*** ptrs) except -1:
    """The operands exactly as an execute passes them (the pack's, less omitted ones, plus the plan's),
    in arrays malloc'ed here (the caller frees them); returns how many."""
    cdef int n
    uids[0] = <int64_t*>malloc((operands.n + PLAN_MAX_EXTRA) * sizeof(int64_t))
    ptrs[0] = <void**>malloc((operands.n + PLAN_MAX_EXTRA) * sizeof(void*))
    try:
        if uids[0] == NULL or ptrs[0] == NULL:
            raise MemoryError()
        n = runner._kept_operands(operands, uids[0], ptrs[0])
        return n + runner._extras(operands, ws, uids[0] + n, ptrs[0] + n)
    except BaseException:
        free(uids[0])
        free(ptrs[0])
        uids[0] = NULL
        ptrs[0] = NULL
        raise
