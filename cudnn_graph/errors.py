"""The exceptions of cudnn_graph's graph, buffer and plan machinery, and their base ``CudnnGraphError``.

cuDNN's own failures (a ``cudnnStatus_t``, a missing or too old libcudnn) are in
``cudnn_graph._cudnn_errors`` and ``PlanEntryError`` (no plan of the list could be built) is in
``cudnn_graph.graph``; every one of them subclasses ``CudnnGraphError`` and is importable from
``cudnn_graph`` itself.

Buffer errors name the tensor (name and uid), what was expected and what arrived. They subclass
``ValueError`` or ``TypeError`` so callers that already catch those keep working.
"""
from __future__ import annotations

__all__ = [
    "CudnnGraphError", "BufferError_", "BufferImportError", "MalformedBufferError", "TensorMismatchError",
    "DataTypeMismatchError", "ShapeMismatchError", "StrideMismatchError", "DeviceMismatchError",
    "AlignmentError", "ReadOnlyOutputError", "HostAddressError", "MissingTensorError", "UnknownTensorError",
    "WorkspaceError", "StreamDeviceError", "CudaDriverError", "DeviceMemoryError",
    "GraphValidationError", "GraphNotSupportedError", "cudnnGraphNotSupportedError", "GraphFrozenError",
]


class CudnnGraphError(Exception):
    """Base of every cudnn_graph error."""


class BufferImportError(CudnnGraphError, TypeError):
    """An object is not a buffer cudnn_graph can read (no DLPack, no CUDA array interface, ...)."""


class MalformedBufferError(CudnnGraphError, ValueError):
    """A producer handed over something that breaks the DLPack or CUDA-array-interface rules."""


BufferError_ = MalformedBufferError


def _label(name, uid) -> str:
    if name and uid is not None:
        return f"tensor '{name}' (uid {uid})"
    if uid is not None:
        return f"tensor uid {uid}"
    if name:
        return f"tensor '{name}'"
    return "tensor"


class TensorMismatchError(CudnnGraphError, ValueError):
    """A buffer does not match the geometry the graph declares for its tensor."""

    def __init__(self, name, uid, what: str, expected, got):
        self.tensor_name = name
        self.uid = uid
        self.what = what
        self.expected = expected
        self.got = got
        super().__init__(f"{_label(name, uid)}: {what} expected {expected}; got {got}")


class DataTypeMismatchError(TensorMismatchError, TypeError):
    pass


class ShapeMismatchError(TensorMismatchError):
    pass


class StrideMismatchError(TensorMismatchError):
    pass


class DeviceMismatchError(TensorMismatchError):
    pass


class AlignmentError(TensorMismatchError):
    pass


class ReadOnlyOutputError(TensorMismatchError):
    pass


class HostAddressError(BufferImportError):
    """A bare int address for a tensor on a host device: this process would dereference memory it cannot
    prove is there. Pass a host buffer (NumPy, any DLPack producer) or an explicit ``Slot.from_address``."""

    def __init__(self, name, uid, device: str):
        self.tensor_name = name
        self.uid = uid
        super().__init__(
            f"{_label(name, uid)}: expected a host buffer (a NumPy array, any DLPack producer) or an explicit "
            f"Slot.from_address(ptr, shape, dtype=..., device='cpu'); got an int address for a {device} tensor")


class WorkspaceError(CudnnGraphError, ValueError):
    """The workspace handed to execute() cannot serve the plan (too small, or not device memory)."""

    def __init__(self, message, required=0, given=0):
        self.required = int(required)
        self.given = int(given)
        super().__init__(message)


class CudaDriverError(CudnnGraphError, RuntimeError):
    """A CUDA driver call failed (or the driver is missing): the message names the call and its result."""


class DeviceMemoryError(CudaDriverError, MemoryError):
    """cuMemAlloc could not provide device memory (a workspace, a scratch buffer)."""


class StreamDeviceError(CudnnGraphError, ValueError):
    """A stream of one device was given for a graph that runs on another."""


class MissingTensorError(CudnnGraphError, ValueError):
    """The variant pack lacks a buffer for a tensor the plan reads or writes."""


class UnknownTensorError(CudnnGraphError, ValueError):
    """The variant pack names a tensor (or uid) the graph does not have."""


class GraphValidationError(CudnnGraphError, ValueError):
    """A graph is ill-formed; names the node, the op and the port."""

    def __init__(self, node: str, op: str, port: str, message: str):
        self.node = node
        self.op = op
        self.port = port
        super().__init__(f"node '{node}' ({op}), port '{port}': {message}")


class GraphNotSupportedError(CudnnGraphError, NotImplementedError):
    """No engine (or the engine asked) can run this graph; the message says why."""


# The name cudnn.pygraph users catch.
cudnnGraphNotSupportedError = GraphNotSupportedError


class GraphFrozenError(CudnnGraphError, RuntimeError):
    """The graph was lowered or planned and can no longer change."""


class ArgumentTypeError(CudnnGraphError, TypeError):
    """An argument of the wrong kind (e.g. ``pygraph(kernel_cache=)`` given something that is not a
    ``KernelCache``); the message names the argument, what it takes and what arrived."""



class KernelCacheError(CudnnGraphError, ValueError):
    """A kernel cache cannot do what was asked: serialize an empty cache, deserialize text it did not
    write, or deserialize into a cache that is in use."""


__all__ += ["ArgumentTypeError", "KernelCacheError"]
