"""cuTile plans launched from C: ``execute()``'s one-call path for the cuTile engine's plans.

A cuTile plan is a fixed sequence of kernel launches (e.g. chunk_prepare, then the state pass, then the
output kernel) whose grids, extents and strides are known when the plan is built. ``TileLaunch`` holds,
per kernel, the loaded CUkernel, the grid and the kernel's parameter buffer with everything but the
addresses already written (the layout is engines/cutile/_abi.py's, checked against each cubin). A call
packs the caller's mapping (``pack_into``: the checks of every execute), checks each operand's alignment
against the one the kernels were compiled for, then with the GIL released copies each buffer to the C
stack, writes the operand and workspace addresses into it and calls cuLaunchKernel on the caller's
stream. Nothing allocates; two threads never share a buffer.

The workspace is the plan's own block for the stream (the fast path runs only without a caller
workspace): its address per stream is remembered here, asked of the plan the first time a stream is seen.
"""
from libc.stdint cimport int64_t, intptr_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from cudnn_graph._variant_pack cimport PackLayout, pack_into
from cudnn_graph._lanes cimport Lanes
from cudnn_graph._stream cimport stream_handle
from cudnn_graph._driver cimport enter_device, leave_device, enter_device_nogil, leave_device_nogil, tile_launch

from cudnn_graph._driver import SHARED_BYTES_OPT_IN_MAX
from cudnn_graph.errors import AlignmentError, CudaDriverError, InvalidArgumentError


cdef class TileLaunch:
    """``launch.execute_mapping(mapping, handle, stream)`` runs a cuTile plan's kernels on ``mapping``'s
    buffers. Made by ``TileLaunch.create``; ``handle`` is accepted for the executor signature (a cuTile
    plan uses no cuDNN handle).

    Example (what engines/cutile/_c_launch.py does; ``kernels`` from the plan's launch list):
        >>> launch = TileLaunch.create(layout, kernels, [(q_uid, 16, "q"), (o_uid, 16, "o")],
        ...                            plan_workspaces, 0, libraries)          # doctest: +SKIP
        >>> launch.execute_mapping({q: Q, o: O}, None, stream)                 # doctest: +SKIP
    """

    def __cinit__(self):
        self._layout = None
        self._n_kernels = 0
        self._kernels = NULL
        self._n_operands = 0
        self._names = ()
        self._ordinal = 0
        self._n_ws = 0
        self._workspaces = None
        self._keepalive = None
        self._lanes_for = None

    def __init__(self, *args, **kwargs):
        raise TypeError("TileLaunch objects are made by TileLaunch.create()")

    def __dealloc__(self):
        cdef int k
        if self._kernels == NULL:
            return
        for k in range(self._n_kernels):
            free(self._kernels[k].offsets)
            free(self._kernels[k].image)
            free(self._kernels[k].patch_offset)
            free(self._kernels[k].patch_source)
            free(self._kernels[k].patch_add)
        free(self._kernels)

    @staticmethod
    def create(PackLayout layout, kernels, operands, workspaces, int ordinal, keepalive, lanes_for=None):
        """A launcher of ``kernels``, each ``(function, grid, image, offsets, patches[, block,
        shared_bytes[, (lane, wait, record)]])``: the CUkernel as an int (0: never launched), a 3-tuple grid,
        the parameter buffer (bytes), each parameter's offset in it, per call-supplied address ``(offset,
        source, add)`` with ``source`` an index into ``operands`` or -1 for the workspace, for a kernel that
        is not a tile kernel (a CuTe DSL one) its block and dynamic shared bytes (default ``(1, 1, 1)``, 0),
        and where launches overlap its lane (0 the caller's stream, 1 the side stream) and the events it
        waits on and records (-1: none; default ``(0, -1, -1)``). ``operands``: ``(uid, alignment, name)``
        per graph operand the kernels address. ``workspaces(stream)`` gives ``(base, [(stream, base),
        ...])``: the stream's workspace block and every block still alive (None where no kernel reads the
        workspace). ``lanes_for(stream)``: that stream's ``_lanes.Lanes``, required where a kernel has a
        lane or an event."""
        cdef TileLaunch self = TileLaunch.__new__(TileLaunch)
        cdef TileKernel* kern
        cdef int k, i
        cdef const unsigned char[::1] image
        if not 0 < len(kernels) <= TILE_MAX_KERNELS:
            raise InvalidArgumentError("kernels", f"1 to {TILE_MAX_KERNELS} launches", str(len(kernels)))
        if len(operands) > TILE_MAX_OPERANDS:
            raise InvalidArgumentError("operands", f"at most {TILE_MAX_OPERANDS}", str(len(operands)))
        self._layout = layout
        self._kernels = <TileKernel*>calloc(len(kernels), sizeof(TileKernel))
        if self._kernels == NULL:
            raise MemoryError()
        for k, row in enumerate(kernels):
            function, grid, image_bytes, offsets, patches = row[:5]
            block, shared_bytes = (row[5], row[6]) if len(row) > 5 else ((1, 1, 1), 0)
            lane, wait, record = row[7] if len(row) > 7 else (0, -1, -1)
            if (lane != 0 or wait >= 0 or record >= 0) and lanes_for is None:
                raise InvalidArgumentError(f"kernel {k} schedule", "no lane or event without lanes_for",
                                           str((lane, wait, record)))
            if lane not in (0, 1):
                raise InvalidArgumentError(f"kernel {k} lane", "0 (the caller's stream) or 1 (the side stream)",
                                           str(lane))
            if len(offsets) > TILE_MAX_PARAMS or len(image_bytes) > TILE_MAX_PARAM_BYTES:
                raise InvalidArgumentError(f"kernel {k}", f"at most {TILE_MAX_PARAMS} parameters in "
                                           f"{TILE_MAX_PARAM_BYTES} bytes",
                                           f"{len(offsets)} in {len(image_bytes)} bytes")
            if len(grid) != 3 or min(grid) < 1:
                raise InvalidArgumentError(f"kernel {k} grid", "three extents >= 1", str(tuple(grid)))
            if len(block) != 3 or min(block) < 1 or block[0] * block[1] * block[2] > 1024:
                raise InvalidArgumentError(f"kernel {k} block", "three extents >= 1, at most 1024 threads",
                                           str(tuple(block)))
            if not 0 <= shared_bytes <= SHARED_BYTES_OPT_IN_MAX:
                raise InvalidArgumentError(f"kernel {k} shared bytes",
                                           f"0 to {SHARED_BYTES_OPT_IN_MAX} (past 49152 only once the kernel's "
                                           "opt-in is set: _driver.kernel_allow_shared)",
                                           str(shared_bytes))
            kern = &self._kernels[k]
            self._n_kernels = k + 1          # what __dealloc__ frees from here on
            kern.function = <void*><uintptr_t>function
            for i in range(3):
                kern.grid[i] = grid[i]
                kern.block[i] = block[i]
            kern.shared_bytes = shared_bytes
            kern.lane = lane
            kern.wait_event = wait
            kern.record_event = record
            kern.nbytes = len(image_bytes)
            kern.nparams = len(offsets)
            kern.npatches = len(patches)
            kern.offsets = <int*>malloc(max(1, kern.nparams) * sizeof(int))
            kern.image = <unsigned char*>malloc(max(1, kern.nbytes))
            kern.patch_offset = <int*>malloc(max(1, kern.npatches) * sizeof(int))
            kern.patch_source = <int*>malloc(max(1, kern.npatches) * sizeof(int))
            kern.patch_add = <int64_t*>malloc(max(1, kern.npatches) * sizeof(int64_t))
            if (kern.offsets == NULL or kern.image == NULL or kern.patch_offset == NULL
                    or kern.patch_source == NULL or kern.patch_add == NULL):
                raise MemoryError()
            for i in range(kern.nparams):
                if not 0 <= offsets[i] < kern.nbytes:
                    raise InvalidArgumentError(f"kernel {k} parameter {i}", f"an offset below {kern.nbytes}",
                                               str(offsets[i]))
                kern.offsets[i] = offsets[i]
            if kern.nbytes:
                image = image_bytes
                memcpy(kern.image, &image[0], kern.nbytes)
            for i, (offset, source, add) in enumerate(patches):
                if not 0 <= offset <= kern.nbytes - 8 or offset % 8 or not -1 <= source < len(operands):
                    raise InvalidArgumentError(f"kernel {k} address {i}", "an 8-byte aligned offset in the "
                                               "buffer and an operand index or -1", f"({offset}, {source})")
                kern.patch_offset[i] = offset
                kern.patch_source[i] = source
                kern.patch_add[i] = add
        self._n_operands = len(operands)
        names = []
        for i, (uid, alignment, name) in enumerate(operands):
            if alignment <= 0 or alignment & (alignment - 1):
                raise InvalidArgumentError(f"operand {name} alignment", "a power of two", str(alignment))
            self._uids[i] = uid
            self._align[i] = alignment
            names.append(name)
        self._names = tuple(names)
        self._workspaces = workspaces
        self._ordinal = ordinal
        self._keepalive = keepalive
        self._lanes_for = lanes_for
        return self

    @property
    def kernel_count(self) -> int:
        return self._n_kernels

    def execute_mapping(self, mapping, handle, stream):
        """Pack ``mapping`` (every check of execute()), then launch every kernel with the GIL released."""
        cdef uintptr_t addresses[TILE_MAX_OPERANDS]
        cdef intptr_t s = 0
        cdef uintptr_t ws
        cdef int result
        keepalive = self.fill(mapping, stream, addresses, &s)
        ws = self.workspace_for(s)
        cdef Lanes lanes = self.lanes_for(s)
        with nogil:
            result = self.launch_all(addresses, ws, s, lanes)
        del keepalive
        if result != 0:
            _raise_launch(result)

    def execute_addresses(self, addresses, uintptr_t workspace, stream=None):
        """Launch on operand addresses already checked (the plan's execute(), from its variant pack), in
        ``operands`` order, with the workspace at ``workspace``."""
        cdef uintptr_t cells[TILE_MAX_OPERANDS]
        cdef intptr_t s = 0
        cdef int i, result
        if len(addresses) != self._n_operands:
            raise InvalidArgumentError("addresses", f"{self._n_operands} operand addresses", str(len(addresses)))
        for i in range(self._n_operands):
            cells[i] = addresses[i]
            self._check_alignment(i, cells[i])
        if stream is not None:
            s = stream if type(stream) is int else stream_handle(stream)
        cdef Lanes lanes = self.lanes_for(s)
        with nogil:
            result = self.launch_all(cells, workspace, s, lanes)
        if result != 0:
            _raise_launch(result)

    def packed_parameters(self, mapping, stream=None, workspace=None) -> list:
        """The parameter buffers the kernels would be launched with for ``mapping`` (bytes per kernel, in
        launch order), launching nothing: what tests and a serialized plan's reader compare against."""
        cdef uintptr_t addresses[TILE_MAX_OPERANDS]
        cdef unsigned char buffer[TILE_MAX_PARAM_BYTES]
        cdef void* params[TILE_MAX_PARAMS]
        cdef intptr_t s = 0
        cdef int k
        keepalive = self.fill(mapping, stream, addresses, &s)
        ws = self.workspace_for(s) if workspace is None else workspace
        out = []
        for k in range(self._n_kernels):
            self.patch(k, addresses, ws, buffer, params)
            out.append(bytes(buffer[:self._kernels[k].nbytes]))
        del keepalive
        return out

    cdef int _check_alignment(self, int i, uintptr_t p) except -1:
        if p % <uintptr_t>self._align[i]:
            raise AlignmentError(self._names[i], self._uids[i], "base address",
                                 f"a multiple of {self._align[i]} bytes (what the cuTile kernels were compiled "
                                 "for)", f"{p:#x}")
        return 0

    cdef object fill(self, object mapping, object stream, uintptr_t* addresses, intptr_t* stream_out):
        cdef int64_t uids[TILE_MAX_OPERANDS]
        cdef void* ptrs[TILE_MAX_OPERANDS]
        cdef Py_ssize_t n = 0, j
        cdef int i
        cdef uintptr_t p
        keepalive = pack_into(mapping, self._layout, stream, uids, ptrs, TILE_MAX_OPERANDS, &n)
        for i in range(self._n_operands):
            p = 0
            for j in range(n):
                if uids[j] == self._uids[i]:
                    p = <uintptr_t>ptrs[j]
                    break
            self._check_alignment(i, p)
            addresses[i] = p
        stream_out[0] = 0
        if stream is not None:
            stream_out[0] = stream if type(stream) is int else stream_handle(stream)
        return keepalive

    cdef uintptr_t workspace_for(self, intptr_t stream) except? 0:
        cdef int i
        for i in range(self._n_ws):
            if self._ws_stream[i] == stream:
                return self._ws_base[i]
        if self._workspaces is None:
            return 0
        base, live = self._workspaces(stream)
        # The plan may have freed another stream's block to make this one: remember only live blocks.
        self._n_ws = 0
        for s, b in live[:TILE_MAX_WORKSPACES]:
            self._ws_stream[self._n_ws] = s
            self._ws_base[self._n_ws] = b
            self._n_ws += 1
        return base

    cdef Lanes lanes_for(self, intptr_t stream):
        """The caller stream's Lanes (made by the plan at its first call on that stream), or None."""
        if self._lanes_for is None:
            return None
        return self._lanes_for(stream)

    cdef void patch(self, int k, const uintptr_t* addresses, uintptr_t workspace, unsigned char* buffer,
                    void** params) noexcept nogil:
        cdef TileKernel* kern = &self._kernels[k]
        cdef int i, source
        cdef uintptr_t value
        memcpy(buffer, kern.image, kern.nbytes)
        for i in range(kern.npatches):
            source = kern.patch_source[i]
            value = (workspace if source < 0 else addresses[source]) + <uintptr_t>kern.patch_add[i]
            memcpy(buffer + kern.patch_offset[i], &value, 8)
        for i in range(kern.nparams):
            params[i] = buffer + kern.offsets[i]

    cdef int launch_all(self, const uintptr_t* addresses, uintptr_t workspace, intptr_t stream,
                        Lanes lanes) noexcept nogil:
        """Every kernel in order, each on its lane's stream after its wait and before its record (``lanes``
        held throughout; None: every kernel on ``stream``); 0, or the first failed CUresult (-1: no driver
        entry point, or no context for the plan's device)."""
        cdef unsigned char buffer[TILE_MAX_PARAM_BYTES]
        cdef void* params[TILE_MAX_PARAMS]
        cdef TileKernel* kern
        cdef bint pushed = False
        cdef int k, result
        cdef intptr_t on
        result = enter_device_nogil(self._ordinal, &pushed)
        if result != 0:
            return result
        if lanes is not None:
            lanes.hold()
        for k in range(self._n_kernels):
            kern = &self._kernels[k]
            on = stream
            if lanes is not None:
                on = lanes.stream_of(kern.lane, stream)
                if kern.wait_event >= 0:
                    result = lanes.wait(on, kern.wait_event)
                    if result != 0:
                        break
            self.patch(k, addresses, workspace, buffer, params)
            result = tile_launch(kern.function, kern.grid, kern.block, kern.shared_bytes, on, params)
            if result != 0:
                break
            if lanes is not None and kern.record_event >= 0:
                result = lanes.record(kern.record_event, on)
                if result != 0:
                    break
        if lanes is not None:
            lanes.release()
        leave_device_nogil(pushed)
        return result

    cdef int n_kernels(self) noexcept nogil:
        return self._n_kernels

    cdef TileKernel* kernel(self, int k) noexcept nogil:
        return &self._kernels[k]


cdef _raise_launch(int result):
    from cudnn_graph._driver import result_text
    raise CudaDriverError(f"a cuTile kernel launch failed: {result_text(result) if result > 0 else result}")
