"""``OwnedBuffer``: memory cudnn_graph allocated itself, handed out as a DLPack producer.

What a call returns as an output when the caller's inputs name no framework that can allocate it (raw
addresses, an unknown producer, a data type the framework lacks): a strided tensor over device memory
from ``cuMemAlloc`` (``cudnn_graph._driver.DeviceAllocation``), or over host memory for a host graph.
It publishes ``__dlpack__`` / ``__dlpack_device__`` (so ``torch.from_dlpack``, ``cupy.from_dlpack``,
``jax.dlpack.from_dlpack`` or ``numpy.from_dlpack`` take it without a copy) and the CUDA array interface
(numba, CuPy) for device memory. The memory lives as long as the buffer or any consumer of an export.

Device memory is written by the execute it was allocated for, on a stream the buffer does not know: its
first export to a consumer (DLPack, or the CUDA array interface) waits for the device, once. A later
execute that writes the buffer again is ordered by whoever reads it.

Example:
    >>> import numpy as np
    >>> from cudnn_graph import OwnedBuffer
    >>> buf = OwnedBuffer.empty((2, 3), (1, 2), "float32", device="cpu")
    >>> buf.shape, buf.strides, buf.device
    ((2, 3), (1, 2), ('cpu', 0))
    >>> np.from_dlpack(buf).strides        # bytes: column-major, as asked
    (4, 8)
"""
from __future__ import annotations

import logging
from typing import Sequence

from ._slot import Slot, _parse_device
from ._dtypes import _dtype_name_of
from .data_type import data_type_of, itemsize_bits
from .errors import InvalidArgumentError

logger = logging.getLogger(__name__)

__all__ = ["OwnedBuffer", "span_elements"]


def span_elements(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements a strided tensor reaches from its first one (0 for an empty tensor)."""
    if any(d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * abs(s) for d, s in zip(shape, strides))


def _typestr(dtype_name: str, nbytes: int) -> tuple[str, list]:
    """(typestr, descr) of the array-interface protocols; extension types travel as named raw bytes."""
    import numpy
    try:
        dt = numpy.dtype(dtype_name)
        if dt.isbuiltin == 1:          # NumPy's own types; ml_dtypes' ones are user-defined (0)
            return dt.str, [("", dt.str)]
    except TypeError:
        pass
    raw = f"<V{nbytes}" if nbytes > 1 else "|V1"
    return raw, [(dtype_name, raw)]


class _DeviceMemory:
    """A device allocation and its CUDA-array-interface description: what the export's Slot holds on to."""

    __slots__ = ("allocation", "__cuda_array_interface__")

    def __init__(self, allocation, interface: dict):
        self.allocation = allocation
        self.__cuda_array_interface__ = interface


class _HostMemory:
    """Host bytes, the typed NumPy view over them, and their array-interface description.

    Slot reads host memory through the array interface when ``__dlpack__`` raises BufferError (as
    NumPy's does for its extension types), naming the type by ``dtype.name``: one path for every type,
    bfloat16 and float8_* included.
    """

    __slots__ = ("storage", "array", "dtype", "__array_interface__")

    def __init__(self, storage, array, interface: dict):
        self.storage = storage
        self.array = array
        self.dtype = array.dtype
        self.__array_interface__ = interface

    def __dlpack__(self, **kwargs):
        raise BufferError("read through __array_interface__")


class OwnedBuffer:
    """A strided tensor over memory cudnn_graph owns (device memory, or host memory for host graphs).

    Make one with ``OwnedBuffer.empty(shape, strides, dtype, device=...)``; read it through DLPack
    (``xp.from_dlpack(buf)``) or, on a GPU, the CUDA array interface. Strides are in elements.

    Example (on a machine with a GPU):
        >>> buf = OwnedBuffer.empty((4, 8), (8, 1), "bfloat16", device="cuda:0")   # doctest: +SKIP
        >>> import torch; torch.from_dlpack(buf).dtype                              # doctest: +SKIP
        torch.bfloat16
    """

    __slots__ = ("_memory", "_slot", "_shape", "_strides", "_dtype", "_device", "_nbytes", "_address", "_pending")

    def __init__(self, *args, **kwargs):
        raise TypeError("use OwnedBuffer.empty(shape, strides, dtype, device=...)")

    @classmethod
    def empty(cls, shape: Sequence[int], strides: Sequence[int] | None, dtype, *, device="cuda") -> "OwnedBuffer":
        """Uninitialised memory for a tensor of ``shape`` with element ``strides`` (None: row-major).

        ``dtype`` is any spelling ``data_type_of`` accepts; ``device`` is 'cpu', 'cuda', 'cuda:N' or a
        (kind, ordinal) pair. Packed 4-bit types are refused: the array interfaces cannot describe them.
        """
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"OwnedBuffer.empty: shape {shape} has a negative extent")
        if strides is None:
            strides, acc = [], 1
            for d in reversed(shape):
                strides.insert(0, acc)
                acc *= max(d, 1)
        strides = tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise InvalidArgumentError(f"OwnedBuffer.empty: {len(strides)} strides for the {len(shape)}-d "
                                       f"shape {shape}")
        if any(s < 0 for s in strides):
            raise InvalidArgumentError(f"OwnedBuffer.empty: strides {strides} must not be negative")
        try:
            bits = itemsize_bits(data_type_of(dtype))
            name = _dtype_name_of(dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"OwnedBuffer.empty: dtype {dtype!r}: {exc}") from None
        if bits % 8:
            raise NotImplementedError(f"OwnedBuffer.empty: {name} packs {bits}-bit elements, which the array "
                                      "interfaces cannot describe; pass an output buffer of your own")
        itemsize = bits // 8
        kind, ordinal = _parse_device(device)
        host = kind == 1     # DLPack kDLCPU
        if not host and kind != 2:
            raise InvalidArgumentError(f"OwnedBuffer.empty: device {device!r} is neither the host nor CUDA")
        nbytes = span_elements(shape, strides) * itemsize
        typestr, descr = _typestr(name, itemsize)
        interface = {"shape": shape, "strides": tuple(s * itemsize for s in strides), "typestr": typestr,
                     "descr": descr, "version": 3}
        if host:
            import numpy
            from .data_type import numpy_dtype
            storage = numpy.empty(max(nbytes, 1), numpy.uint8)
            address = storage.ctypes.data
            array = numpy.ndarray(shape, dtype=numpy_dtype(name), buffer=storage, strides=interface["strides"])
            interface["data"] = (address, False)
            memory = _HostMemory(storage, array, interface)
        else:
            from ._driver import DeviceAllocation
            storage = DeviceAllocation(max(nbytes, 1), ordinal)   # cuMemAlloc refuses 0 bytes
            address = storage.ptr
            # "stream": None -- written by an execute, the data is ready on that execute's stream.
            interface.update(data=(address, False), stream=None)
            memory = _DeviceMemory(storage, interface)
        self = object.__new__(cls)
        self._memory = memory
        # The export path: a Slot whose owner is the memory, so every DLPack consumer keeps it alive.
        self._slot = Slot.from_object(memory)
        self._shape = shape
        self._strides = strides
        self._dtype = name
        self._device = ("cpu", 0) if host else ("cuda", ordinal)
        self._nbytes = nbytes
        self._address = address
        # Device memory is written by the execute it was allocated for, on a stream this buffer does not
        # know: the first export to a consumer with a stream of its own waits for the device once.
        self._pending = not host
        logger.debug("OwnedBuffer: %d bytes on %s for %s %s", nbytes, self._device, name, shape)
        return self

    # ---- introspection --------------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def strides(self) -> tuple:
        """Strides in elements."""
        return self._strides

    @property
    def dtype(self) -> str:
        """Canonical name of the element type ('float32', 'bfloat16', ...)."""
        return self._dtype

    @property
    def device(self) -> tuple:
        """('cuda', N) or ('cpu', 0)."""
        return self._device

    @property
    def data_ptr(self) -> int:
        return self._address

    @property
    def nbytes(self) -> int:
        """Bytes the tensor spans in memory."""
        return self._nbytes

    def __repr__(self):
        return (f"OwnedBuffer(shape={self._shape}, strides={self._strides}, dtype={self._dtype}, "
                f"device={self._device[0]}:{self._device[1]}, data_ptr=0x{self.data_ptr:x})")

    # ---- producer protocols ---------------------------------------------------------------------

    def __dlpack_device__(self):
        return self._slot.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule (versioned when ``max_version`` allows it) whose deleter keeps the memory.

        The first export of device memory (to a consumer whose stream is anything but -1, "no
        synchronisation") waits until the device has finished the write of the call that allocated it.
        """
        if self._pending and not (type(stream) is int and stream == -1):
            self._wait_for_the_write()
        return self._slot.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    @property
    def slot(self):
        """The ``Slot`` over this memory: what an execute writes (it skips the consumer handshake)."""
        return self._slot

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface (v3, "stream": None); the first read waits for the write, as
        ``__dlpack__`` does, since the interface can name no stream the write is pending on."""
        if self._device[0] != "cuda":
            raise AttributeError("a host OwnedBuffer has no __cuda_array_interface__")
        if self._pending:
            self._wait_for_the_write()
        return self._memory.__cuda_array_interface__

    def _wait_for_the_write(self) -> None:
        from ._driver import device_synchronize
        device_synchronize(self._device[1])
        self._pending = False

    def numpy(self):
        """A host buffer as the NumPy array over the same memory (device buffers: use a framework)."""
        if self._device[0] != "cpu":
            raise InvalidArgumentError("OwnedBuffer.numpy(): the buffer is on "
                                       f"{self._device[0]}:{self._device[1]}; read it through DLPack")
        return self._memory.array
