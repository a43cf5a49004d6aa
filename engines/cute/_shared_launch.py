"""Launching a kernel loaded as a shared object (``_shared_object.SharedKernel``): no CuTe DSL import.

The exported host entry takes ``(void** args, int32_t num_args)``: the addresses of the six operand
pointers, the three f32 scalars, the four int32 extents, the stream, then the cell its CUDA result is
written to (``_spec``'s argument convention). It finds its kernel itself, so nothing follows the result
cell. ``c_entry()`` hands execute()'s C path (``_dsl_launch.PackedLaunch``) the entry and the template of
that array; ``__call__`` is the Python path (a device other than 0, or the C path switched off).
"""
from __future__ import annotations

import ctypes
import threading

from ._shared_object import SharedKernel
from ._spec import N_EXTENTS, N_POINTERS, N_SCALARS

N_ARGS = N_POINTERS + N_SCALARS + N_EXTENTS + 2          # ... the stream, the result cell
RESULT_INDEX = N_ARGS - 1
PLACEHOLDER_ADDRESS = 256          # an aligned address for the pointer slots a plan leaves unused

_ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32)


class SharedLauncher:
    """Runs one kernel of a ``SharedKernel``: ``launcher(addresses, scalars, stream_handle)``; same
    interface as ``_launch.Launcher`` (the DSL path)."""

    def __init__(self, kernel: SharedKernel, spec, ordinal: int = 0, extents=None):
        self._kernel = kernel
        self._ordinal = ordinal
        self._extents = (ctypes.c_int32 * N_EXTENTS)(*(extents or (spec.M, spec.N, spec.K, spec.L)))
        self._placeholders = (ctypes.c_void_p * N_POINTERS)(*([PLACEHOLDER_ADDRESS] * N_POINTERS))
        self._lock = threading.Lock()
        self._entry = None

    @property
    def ordinal(self) -> int:
        return self._ordinal

    @property
    def extents(self) -> tuple:
        return tuple(self._extents)

    @property
    def packed(self) -> bool:
        return True

    def _entry_address(self) -> int:
        if self._entry is None:
            self._entry = self._kernel.entry_address(self._ordinal)
        return self._entry

    def c_entry(self):
        """(host entry address, packed-argument template, result index) for ``PackedLaunch``: the
        template's pointer slots hold placeholder cells, the rest is filled per call."""
        entry = self._entry_address()
        template = [ctypes.addressof(self._placeholders) + 8 * i for i in range(N_POINTERS)]
        template += [0] * (N_ARGS - N_POINTERS)
        return entry, template, RESULT_INDEX

    def __call__(self, addresses, scalars, stream: int) -> None:
        entry = _ENTRY_TYPE(self._entry_address())
        pointers = (ctypes.c_void_p * N_POINTERS)(*([PLACEHOLDER_ADDRESS] * N_POINTERS))
        for i, a in enumerate(addresses[:N_POINTERS]):
            if a:
                pointers[i] = a
        floats = (ctypes.c_float * N_SCALARS)(*scalars[:N_SCALARS])
        stream_cell = ctypes.c_void_p(stream or None)
        result = ctypes.c_int32(0)
        args = (ctypes.c_void_p * N_ARGS)()
        for i in range(N_POINTERS):
            args[i] = ctypes.addressof(pointers) + 8 * i
        for j in range(N_SCALARS):
            args[N_POINTERS + j] = ctypes.addressof(floats) + 4 * j
        for j in range(N_EXTENTS):
            args[N_POINTERS + N_SCALARS + j] = ctypes.addressof(self._extents) + 4 * j
        args[N_ARGS - 2] = ctypes.addressof(stream_cell)
        args[RESULT_INDEX] = ctypes.addressof(result)
        previous = self._kernel.set_device(self._ordinal) if self._ordinal != 0 else None
        try:
            status = entry(args, N_ARGS)
        finally:
            if previous is not None and previous != self._ordinal:
                self._kernel.set_device(previous)
        if status or result.value:
            from ...errors import CudaDriverError
            raise CudaDriverError(f"the CuTe GEMM kernel launch failed: CUDA error {status or result.value}")
