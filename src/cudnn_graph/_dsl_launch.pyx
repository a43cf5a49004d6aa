"""A DSL-compiled kernel launched from C: ``execute()``'s one-call path for CuTe DSL plans.

A CuTe DSL program compiles to a host entry (C ABI: one ``void**``, the addresses of each argument's
value, then a cell for the CUDA result and the loaded module's kernel handles) that encodes the TMA
descriptors and launches the kernel. The DSL's own Python call path rebuilds that array per call;
``PackedLaunch`` takes it once, as the DSL packs it (the template), and per call only writes the operand
addresses, the host scalars and the stream into cells on the C stack and calls the entry with the GIL
released. Packing the caller's mapping is ``pack_into``'s (the checks of every execute); nothing here
allocates, and two threads never share a cell.

CUDA-graph replay, as for cuDNN plans (``cudnn_graph._graph_replay``; the same switch,
``set_cuda_graph_replay`` / ``$CUDNN_GRAPH_CUDA_GRAPHS``): when a call repeats the previous call's operand
addresses and scalars, one entry call is recorded as a CUDA graph by a thread-local capture on a private
stream, and from then on calls with those arguments launch the graph (one cuGraphLaunch instead of the
entry's descriptor encodes and kernel launch). A graph freezes what the entry computed on the host (TMA
descriptors, scalars), so it is keyed by exactly those values. Nothing is recorded while the caller's
stream is itself being captured.

The template's layout (pointers, then f32 scalars, then int32 extents, then the stream) is checked by
the engine against the DSL's own packing before a PackedLaunch is made (engines/cute/_launch.py).
"""
from libc.stdint cimport int32_t, int64_t, intptr_t, uintptr_t
from libc.string cimport memcmp, memcpy

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
        self._layout = None
        self._entry = NULL
        self._nargs = 0
        self._n_pointers = self._pointer_slots = self._n_floats = self._n_scalars = self._n_ints = 0
        self._result_index = -1
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
        self._entry = <dsl_entry_t><void*>entry
        self._nargs = len(template)
        for i in range(self._nargs):
            self._template[i] = <void*><uintptr_t>template[i]
        self._n_pointers = len(pointer_uids)
        self._pointer_slots = pointer_slots
        for i in range(self._n_pointers):
            self._pointer_uids[i] = pointer_uids[i]
            self._pointer_align[i] = pointer_align[i]
        self._n_floats = n_floats
        self._n_scalars = len(scalar_uids)
        for i in range(self._n_scalars):
            self._scalar_uids[i] = scalar_uids[i]
            self._scalar_is_double[i] = bool(scalar_is_double[i])
            self._scalar_has_default[i] = scalar_defaults[i] is not None
            self._scalar_default[i] = 0.0 if scalar_defaults[i] is None else float(scalar_defaults[i])
        self._n_ints = len(ints)
        for i in range(self._n_ints):
            self._ints[i] = ints[i]
        self._result_index = result_index
        self._names = tuple(names)
        self._keepalive = keepalive
        return self

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
            self._entry(cells.args, self._nargs)
        del keepalive
        if cells.result != 0:
            raise CudaDriverError(f"the CuTe DSL kernel launch failed: CUDA error {cells.result}")

    @property
    def replay_graphs(self) -> int:
        """How many CUDA graphs this launch has recorded (one per repeated argument set)."""
        return self._n_graphs

    cdef bint _same(self, const ReplayArgs* a, LaunchCells* cells) noexcept nogil:
        return memcmp(a.pointers, cells.pointers, self._n_pointers * sizeof(void*)) == 0 and \
            memcmp(a.floats, cells.floats, self._n_floats * sizeof(float)) == 0

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
                self._entry(cells.args, self._nargs)
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

    cdef dsl_entry_t entry(self) noexcept nogil:
        return self._entry

    cdef int nargs(self) noexcept nogil:
        return self._nargs

    cdef object fill(self, object mapping, object stream, LaunchCells* cells):
        cdef int64_t uids[PACK_INLINE]
        cdef void* ptrs[PACK_INLINE]
        cdef Py_ssize_t n = 0
        cdef int i, at
        cdef void* p
        keepalive = pack_into(mapping, self._layout, stream, uids, ptrs, PACK_INLINE, &n)
        for i in range(self._n_pointers):
            p = _find(uids, ptrs, n, self._pointer_uids[i])
            if <uintptr_t>p % <uintptr_t>self._pointer_align[i]:
                raise ValueError(f"{self._names[i]} is at address {<uintptr_t>p:#x}, not "
                                 f"{self._pointer_align[i]}-byte aligned; the CuTe GEMM needs it")
            cells.pointers[i] = p
        for i in range(self._n_floats):
            cells.floats[i] = 0.0
        for i in range(self._n_scalars):
            p = _find(uids, ptrs, n, self._scalar_uids[i])
            if p == NULL:
                if not self._scalar_has_default[i]:
                    raise InvalidArgumentError("variant_pack", f"a buffer for scalar uid {self._scalar_uids[i]}",
                                               "none")
                cells.floats[i] = self._scalar_default[i]
            elif self._scalar_is_double[i]:
                cells.floats[i] = <float>(<double*>p)[0]
            else:
                cells.floats[i] = (<float*>p)[0]
        for i in range(self._n_ints):
            cells.ints[i] = self._ints[i]
        cells.stream = 0
        if stream is not None:
            cells.stream = stream if type(stream) is int else stream_handle(stream)
        cells.result = 0
        memcpy(cells.args, self._template, self._nargs * sizeof(void*))
        at = 0
        for i in range(self._n_pointers):
            cells.args[at] = &cells.pointers[i]
            at += 1
        at = self._pointer_slots             # unused pointer slots keep the template's cells
        for i in range(self._n_floats):
            cells.args[at] = &cells.floats[i]
            at += 1
        for i in range(self._n_ints):
            cells.args[at] = &cells.ints[i]
            at += 1
        cells.args[at] = &cells.stream
        if self._result_index >= 0:
            cells.args[self._result_index] = &cells.result
        return keepalive


cdef inline void* _find(const int64_t* uids, void** ptrs, Py_ssize_t n, int64_t uid) noexcept nogil:
    """The address packed for ``uid`` (NULL when the pack has no such operand: the layout requires
    every one the kernel reads, so only an empty extent gets here)."""
    cdef Py_ssize_t k
    for k in range(n):
        if uids[k] == uid:
            return ptrs[k]
    return NULL
