"""A DSL-compiled kernel launched from C: ``execute()``'s one-call path for CuTe DSL plans.

A CuTe DSL program compiles to a host entry (C ABI: one ``void**``, the addresses of each argument's
value, then a cell for the CUDA result and the loaded module's kernel handles) that encodes the TMA
descriptors and launches the kernel. The DSL's own Python call path rebuilds that array per call;
``PackedLaunch`` takes it once, as the DSL packs it (the template), and per call only writes the operand
addresses, the host scalars and the stream into cells on the C stack and calls the entry with the GIL
released. Packing the caller's mapping is ``pack_into``'s (the checks of every execute); nothing here
allocates, and two threads never share a cell.

The launch itself is plain C (``DslLaunch``) and ``dsl_fill`` packs it from raw (uid, address) arrays
without the GIL: execute() fills from its variant pack, the XLA FFI handler (cudnn_graph._xla_ffi) from
XLA's buffers, and both call the entry with no Python on the way.

The template's layout (pointers, then f32 scalars, then int32 extents, then the stream) is checked by
the engine against the DSL's own packing before a PackedLaunch is made (engines/cute/_launch.py), or is
the exported entry's (engines/cute/_shared_launch.py).

CUDA-graph replay, as for cuDNN plans (``cudnn_graph._graph_replay``; the same switch,
``set_cuda_graph_replay`` / ``$CUDNN_GRAPH_CUDA_GRAPHS``): when execute() repeats the previous call's
operand addresses and scalars, one entry call is recorded as a CUDA graph by a thread-local capture on a
private stream, and from then on calls with those arguments launch the graph (one cuGraphLaunch instead of
the entry's descriptor encodes and kernel launch). A graph freezes what the entry computed on the host (TMA
descriptors, scalars), so it is keyed by exactly those values. Nothing is recorded while the caller's
stream is itself being captured.
"""
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t
from libc.string cimport memcmp, memcpy, memset

from cudnn_graph._variant_pack cimport PACK_INLINE, PackLayout, pack_into
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._cudnn_handle cimport cuda_graph_replay_on
from cudnn_graph._driver cimport (
    CAPTURING_STREAM, graphs_available, capture_available, capture_begin, capture_end, graph_instantiate,
    graph_destroy, graph_exec_destroy, graph_launch, stream_capturing,
)

import logging

_logger = logging.getLogger(__name__)

from cudnn_graph.errors import CudaDriverError, InvalidArgumentError


cdef class PackedLaunch:
    """``launch.execute_mapping(mapping, handle, stream)`` runs the compiled entry on ``mapping``'s
    buffers. Made by ``PackedLaunch.create``; ``handle`` is accepted for the executor signature (a DSL
    plan uses no cuDNN handle).

    Example (what the CuTe engine does; ``template`` from the DSL's packing of one call):
        >>> launch = PackedLaunch.create(layout, entry_address, template, (a_uid, b_uid, c_uid),
        ...                              (16, 16, 16), ("A", "B", "output"), 3, (), (), (), (256, 256, 256, 1),
        ...                              14, executor)                        # doctest: +SKIP
        >>> launch.execute_mapping({a: A, b: B, c: C}, None, stream)        # doctest: +SKIP
    """

    def __cinit__(self):
        memset(&self._launch, 0, sizeof(DslLaunch))
        self._launch.result_index = -1
        self._layout = None
        self._names = ()
        self._keepalive = None
        self._has_last = False
        self._n_graphs = 0
        self._replay_off = False

    def __dealloc__(self):
        cdef int i
        for i in range(self._n_graphs):
            graph_exec_destroy(self._graphs[i])
            self._graphs[i] = NULL
        self._n_graphs = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("PackedLaunch objects are made by PackedLaunch.create()")

    @staticmethod
    def create(PackLayout layout, uintptr_t entry, template, pointer_uids, pointer_align, names,
               int n_floats, scalar_uids, scalar_is_double, scalar_defaults, ints, int result_index,
               keepalive, int pointer_slots=-1):
        """A launch of the host entry at ``entry`` with ``template`` (the DSL's packed-argument array as
        ints) for operands ``pointer_uids`` (each checked against its alignment in bytes), ``n_floats``
        f32 arguments of which the first ``len(scalar_uids)`` are read from those host operands,
        ``ints`` fixed int32 arguments, the stream, and the result cell at ``result_index`` (-1: none).
        ``scalar_defaults``: per scalar, the value used when the mapping leaves it out, or None.
        ``pointer_slots``: how many pointer arguments the entry takes (default: one per operand); the
        slots past ``pointer_uids`` keep the template's cells (a kernel compiled with room for more
        epilogue operands than this plan has), and the scalars start after all of them."""
        cdef PackedLaunch self = PackedLaunch.__new__(PackedLaunch)
        cdef DslLaunch* c = &self._launch
        cdef int i
        if pointer_slots < 0:
            pointer_slots = len(pointer_uids)
        if pointer_slots < len(pointer_uids) or pointer_slots > DSL_MAX_POINTERS:
            raise InvalidArgumentError("pointer_slots", f"{len(pointer_uids)} to {DSL_MAX_POINTERS} pointer "
                                       "arguments", str(pointer_slots))
        n_base = pointer_slots + n_floats + len(ints) + 1
        if entry == 0 or len(template) > DSL_MAX_ARGS or len(template) < n_base:
            raise InvalidArgumentError("template", f"a packed-argument array of {n_base} to {DSL_MAX_ARGS} "
                                       "entries and a host entry address", f"{len(template)} entries")
        if len(pointer_uids) > DSL_MAX_POINTERS or n_floats > DSL_MAX_FLOATS or len(ints) > DSL_MAX_INTS \
                or len(scalar_uids) > n_floats:
            raise InvalidArgumentError("arguments", f"at most {DSL_MAX_POINTERS} pointers, {DSL_MAX_FLOATS} "
                                       f"floats, {DSL_MAX_INTS} ints",
                                       f"{len(pointer_uids)} / {n_floats} / {len(ints)}")
        self._layout = layout
        c.entry = <dsl_entry_t><void*>entry
        c.nargs = len(template)
        for i in range(c.nargs):
            c.template[i] = <void*><uintptr_t>template[i]
        c.n_pointers = len(pointer_uids)
        c.pointer_slots = pointer_slots
        for i in range(c.n_pointers):
            c.pointer_uids[i] = pointer_uids[i]
            c.pointer_align[i] = max(1, int(pointer_align[i]))
        c.n_floats = n_floats
        c.n_scalars = len(scalar_uids)
        for i in range(c.n_scalars):
            c.scalar_uids[i] = scalar_uids[i]
            c.scalar_is_double[i] = bool(scalar_is_double[i])
            c.scalar_has_default[i] = scalar_defaults[i] is not None
            c.scalar_default[i] = 0.0 if scalar_defaults[i] is None else float(scalar_defaults[i])
        c.n_ints = len(ints)
        for i in range(c.n_ints):
            c.ints[i] = ints[i]
        c.result_index = result_index
        self._names = tuple(names)
        self._keepalive = keepalive
        return self

    @property
    def pointer_uids(self) -> tuple:
        """The uids of the operands the entry reads by address, in its pointer-argument order."""
        return tuple(self._launch.pointer_uids[i] for i in range(self._launch.n_pointers))

    @property
    def scalars_have_values(self) -> bool:
        """Whether every host scalar has the graph's value (so the operands may leave them all out, as an
        XLA custom call does: XLA passes device buffers only)."""
        return all(self._launch.scalar_has_default[i] for i in range(self._launch.n_scalars))

    def execute_mapping(self, mapping, handle, stream):
        """Pack ``mapping`` (every check of execute()), then launch with the GIL released: a recorded CUDA
        graph of these arguments, or the entry."""
        cdef LaunchCells cells
        cdef int at, result
        keepalive = self.fill(mapping, stream, &cells)
        if cuda_graph_replay_on and not self._replay_off:
            at = self._find_graph(&cells)
            if at < 0 and self._repeats_last(&cells) and self._n_graphs < DSL_REPLAY_GRAPHS:
                at = self._record(&cells)
            if at >= 0:
                with nogil:
                    result = graph_launch(self._graphs[at], cells.stream)
                if result == 0:
                    return
                if result != CAPTURING_STREAM:
                    self._replay_off = True
                    _logger.debug("cuGraphLaunch failed (CUresult %d): this CuTe plan launches its entry "
                                  "from now on", result)
            self._remember(&cells)
        with nogil:
            self._launch.entry(cells.args, self._launch.nargs)
        del keepalive
        if cells.result != 0:
            raise CudaDriverError(f"the CuTe DSL kernel launch failed: CUDA error {cells.result}")

    @property
    def replay_graphs(self) -> int:
        """How many CUDA graphs this launch has recorded (one per repeated argument set)."""
        return self._n_graphs

    cdef bint _same(self, const ReplayArgs* a, LaunchCells* cells) noexcept nogil:
        return memcmp(a.pointers, cells.pointers, self._launch.n_pointers * sizeof(void*)) == 0 and \
            memcmp(a.floats, cells.floats, self._launch.n_floats * sizeof(float)) == 0

    cdef int _find_graph(self, LaunchCells* cells) noexcept nogil:
        cdef int i
        for i in range(self._n_graphs):
            if self._same(&self._graph_args[i], cells):
                return i
        return -1

    cdef bint _repeats_last(self, LaunchCells* cells) noexcept nogil:
        return self._has_last and self._same(&self._last, cells)

    cdef void _remember(self, LaunchCells* cells) noexcept nogil:
        memcpy(self._last.pointers, cells.pointers, sizeof(self._last.pointers))
        memcpy(self._last.floats, cells.floats, sizeof(self._last.floats))
        self._has_last = True

    cdef int _record(self, LaunchCells* cells) noexcept:
        """Record one entry call on ``cells`` as a CUDA graph (a capture on a private stream); its index,
        or -1 (the caller runs the entry; a failure turns replay off for this launch)."""
        cdef intptr_t caller = cells.stream, private = 0
        cdef void* graph = NULL
        cdef void* graph_exec = NULL
        cdef int result
        if not (graphs_available() and capture_available()) or stream_capturing(caller):
            return -1
        with nogil:
            result = capture_begin(&private)
            if result == 0:
                cells.stream = private
                cells.result = 0
                self._launch.entry(cells.args, self._launch.nargs)
                result = capture_end(private, &graph)
                cells.stream = caller
                if result == 0 and cells.result == 0:
                    result = graph_instantiate(&graph_exec, graph)
                graph_destroy(graph)
        if result != 0 or cells.result != 0 or graph_exec == NULL:
            self._replay_off = True
            cells.result = 0
            _logger.debug("recording a CuTe plan's launch as a CUDA graph failed (CUresult %d); it launches "
                          "its entry from now on", result)
            return -1
        memcpy(self._graph_args[self._n_graphs].pointers, cells.pointers, sizeof(cells.pointers))
        memcpy(self._graph_args[self._n_graphs].floats, cells.floats, sizeof(cells.floats))
        self._graphs[self._n_graphs] = graph_exec
        self._n_graphs += 1
        return self._n_graphs - 1

    def launch_unchecked(self, uids, addresses, stream=None):
        """Launch on raw ``(uid, address)`` operands with the GIL released: dsl_fill, the path of callers
        that checked the operands' geometry themselves (the XLA FFI handler calls it from C). Only the
        alignment and the host scalars are checked here.

        Example (what the XLA handler does in C):
            >>> launch.launch_unchecked([a_uid, b_uid, c_uid], [A, B, C], stream)   # doctest: +SKIP
        """
        cdef LaunchCells cells
        cdef DslFillFailure failure
        cdef int64_t c_uids[DSL_MAX_ARGS]
        cdef void* c_ptrs[DSL_MAX_ARGS]
        cdef Py_ssize_t i, n = len(uids)
        cdef intptr_t handle = 0
        cdef int status
        if n != len(addresses) or n > DSL_MAX_ARGS:
            raise InvalidArgumentError("operands", f"as many addresses as uids, at most {DSL_MAX_ARGS}",
                                       f"{n} uids, {len(addresses)} addresses")
        for i in range(n):
            c_uids[i] = uids[i]
            c_ptrs[i] = <void*><uintptr_t>addresses[i]
        if stream is not None:
            handle = stream if type(stream) is int else stream_handle(stream)
        with nogil:
            status = dsl_fill(&self._launch, c_uids, c_ptrs, n, handle, &cells, &failure)
            if status == DSL_FILL_OK:
                self._launch.entry(cells.args, self._launch.nargs)
        if status != DSL_FILL_OK:
            self._raise_failure(&failure)
        if cells.result != 0:
            raise CudaDriverError(f"the CuTe DSL kernel launch failed: CUDA error {cells.result}")

    cdef dsl_entry_t entry(self) noexcept nogil:
        return self._launch.entry

    cdef int nargs(self) noexcept nogil:
        return self._launch.nargs

    cdef const DslLaunch* c_launch(self) noexcept nogil:
        return &self._launch

    cdef object fill(self, object mapping, object stream, LaunchCells* cells):
        cdef int64_t uids[PACK_INLINE]
        cdef void* ptrs[PACK_INLINE]
        cdef Py_ssize_t n = 0
        cdef DslFillFailure failure
        cdef intptr_t handle = 0
        keepalive = pack_into(mapping, self._layout, stream, uids, ptrs, PACK_INLINE, &n)
        if stream is not None:
            handle = stream if type(stream) is int else stream_handle(stream)
        if dsl_fill(&self._launch, uids, ptrs, n, handle, cells, &failure) != DSL_FILL_OK:
            self._raise_failure(&failure)
        return keepalive

    cdef _raise_failure(self, DslFillFailure* failure):
        if failure.what == DSL_FILL_MISALIGNED:
            raise ValueError(f"{self._names[failure.index]} is at address {<uintptr_t>failure.address:#x}, not "
                             f"{failure.align}-byte aligned; the CuTe GEMM needs it")
        raise InvalidArgumentError("variant_pack", f"a buffer for scalar uid {failure.uid}", "none")


cdef int dsl_fill(const DslLaunch* launch, const int64_t* uids, void** ptrs, Py_ssize_t n, intptr_t stream,
                  LaunchCells* cells, DslFillFailure* failure) noexcept nogil:
    cdef int i, at
    cdef void* p
    for i in range(launch.n_pointers):
        p = _find(uids, ptrs, n, launch.pointer_uids[i])
        if <uintptr_t>p % <uintptr_t>launch.pointer_align[i]:
            failure.what = DSL_FILL_MISALIGNED
            failure.index = i
            failure.uid = launch.pointer_uids[i]
            failure.align = launch.pointer_align[i]
            failure.address = p
            return DSL_FILL_MISALIGNED
        cells.pointers[i] = p
    for i in range(launch.n_floats):
        cells.floats[i] = 0.0
    for i in range(launch.n_scalars):
        p = _find(uids, ptrs, n, launch.scalar_uids[i])
        if p == NULL:
            if not launch.scalar_has_default[i]:
                failure.what = DSL_FILL_NO_SCALAR
                failure.index = i
                failure.uid = launch.scalar_uids[i]
                failure.align = 0
                failure.address = NULL
                return DSL_FILL_NO_SCALAR
            cells.floats[i] = launch.scalar_default[i]
        elif launch.scalar_is_double[i]:
            cells.floats[i] = <float>(<double*>p)[0]
        else:
            cells.floats[i] = (<float*>p)[0]
    for i in range(launch.n_ints):
        cells.ints[i] = launch.ints[i]
    cells.stream = stream
    cells.result = 0
    memcpy(cells.args, launch.template, launch.nargs * sizeof(void*))
    at = 0
    for i in range(launch.n_pointers):
        cells.args[at] = &cells.pointers[i]
        at += 1
    at = launch.pointer_slots            # unused pointer slots keep the template's cells
    for i in range(launch.n_floats):
        cells.args[at] = &cells.floats[i]
        at += 1
    for i in range(launch.n_ints):
        cells.args[at] = &cells.ints[i]
        at += 1
    cells.args[at] = &cells.stream
    if launch.result_index >= 0:
        cells.args[launch.result_index] = &cells.result
    return DSL_FILL_OK


cdef inline void* _find(const int64_t* uids, void** ptrs, Py_ssize_t n, int64_t uid) noexcept nogil:
    """The address packed for ``uid`` (NULL when the pack has no such operand: the layout requires
    every one the kernel reads, so only an empty extent gets here)."""
    cdef Py_ssize_t k
    for k in range(n):
        if uids[k] == uid:
            return ptrs[k]
    return NULL
