"""The Python side of the XLA FFI handler's plan table (cudnn_graph._xla_ffi): how a graph's tensor becomes
a custom-call buffer (its XLA data-type code and dense row-major shape), the record a registration
returns, and what the GIL fallback needs to run a Python engine's plan from XLA's raw addresses.

Example:
    >>> XLA_DTYPE_CODES["bfloat16"]
    16
"""
from __future__ import annotations

import weakref

from ._layout import row_major_strides
from .errors import FfiRegistrationError

# XLA_FFI_DataType codes (the ABI's numbering) by the NumPy / ml_dtypes name that stores the type.
XLA_DTYPE_CODES = {
    "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7, "uint32": 8,
    "uint64": 9, "float16": 10, "float32": 11, "float64": 12, "bfloat16": 16, "float8_e5m2": 19,
    "float8_e4m3fn": 20,
}


def tensor_entry(tensor, role: str, position: int, max_rank: int) -> tuple:
    """(name, uid, buffer shape, XLA dtype code, numpy dtype name, dims, strides) of a tensor the call
    passes; FfiRegistrationError (naming the tensor) for one no XLA buffer can feed.

    Example (a row-major (2, 3) float32 tensor ``t`` named 'x'):
        >>> tensor_entry(t, "input", 0, 8)[2:5]      # doctest: +SKIP
        ((2, 3), 11, 'float32')
    """
    from .data_type import numpy_dtype
    name = tensor.name or f"uid {tensor.uid}"
    if tensor.is_virtual:
        raise FfiRegistrationError(f"{role} {position} (tensor '{name}') is virtual: only tensors the graph "
                                   f"reads or writes in memory can be custom-call operands")
    if tensor.is_pass_by_value:
        raise FfiRegistrationError(f"{role} {position} (tensor '{name}') is pass-by-value: XLA passes device "
                                   f"buffers; give the value when the graph is built instead")
    shape = tuple(int(d) for d in tensor.get_dim())
    if len(shape) > max_rank:
        raise FfiRegistrationError(f"{role} {position} (tensor '{name}') has rank {len(shape)}; at most "
                                   f"{max_rank}")
    strides = tuple(int(s) for s in tensor.get_stride())
    # XLA buffers are dense row-major: the buffer of a tensor is its memory, its dims ordered by stride
    # (outermost first), e.g. an (N, C, H, W) tensor with channels-last strides is an (N, H, W, C) buffer.
    order = sorted(range(len(shape)), key=lambda i: (-strides[i], i))
    memory_shape = tuple(shape[i] for i in order)
    packed = row_major_strides(memory_shape)
    if any(shape[i] != 1 and strides[i] != p for i, p in zip(order, packed)):
        raise FfiRegistrationError(f"{role} {position} (tensor '{name}') has dims {shape} and strides {strides}, "
                                   f"which are not a dense buffer: XLA passes dense row-major buffers")
    dtype = numpy_dtype(tensor.get_data_type()).name
    code = XLA_DTYPE_CODES.get(dtype)
    if code is None:
        raise FfiRegistrationError(f"{role} {position} (tensor '{name}') has data type {dtype}, which the XLA "
                                   f"FFI handler does not map")
    return name, int(tensor.uid), memory_shape, code, dtype, shape, strides


class PlanRegistration:
    """A graph's plan in the handler's table: ``plan_id`` (the custom call's attribute), ``kind``
    ('cudnn': run in C; 'dsl': a DSL plan's compiled entry called from C; 'python': the GIL fallback),
    ``workspace_size`` (bytes of the workspace result), ``device`` (CUDA ordinal, -1 for a host graph),
    ``command_buffer_compatible``.

    Example:
        >>> PlanRegistration(1, "dsl", 0, 0, False, []).kind
        'dsl'
    """

    def __init__(self, plan_id: int, kind: str, workspace_size: int, device: int, command_buffer_compatible: bool,
                 tensors: list):
        self.plan_id = plan_id
        self.kind = kind
        self.workspace_size = workspace_size
        self.device = device
        self.command_buffer_compatible = command_buffer_compatible
        self.tensors = tensors      # [(name, uid, buffer shape, numpy dtype name)], inputs then outputs

    def __repr__(self) -> str:
        return (f"PlanRegistration(plan_id={self.plan_id}, kind={self.kind!r}, workspace={self.workspace_size}, "
                f"device={self.device}, command_buffer_compatible={self.command_buffer_compatible})")


class PythonPlan:
    """What the GIL fallback needs to run a Python engine's plan from XLA's raw addresses: the graph (by
    weak reference: the table entry goes with it), per operand (uid, dims, strides, numpy dtype name),
    inputs then outputs, the workspace size and the device (-1: the host).

    Example (a registered host graph ``g``):
        >>> PythonPlan(g, [(uid, (2, 3), (3, 1), "float32")], 0, -1).run(g, [a], [y], 0)   # doctest: +SKIP
    """

    def __init__(self, graph, tensors: list, workspace_size: int, device: int):
        self.graph = weakref.ref(graph)
        self.tensors = tensors          # uids, not Tensors: a Tensor would keep its graph alive
        self.workspace_size = workspace_size
        self.device = device

    def run(self, graph, arguments: list, results: list, stream: int) -> None:
        from ._slot import Slot
        addresses = list(arguments) + list(results)
        if self.device < 0:
            mapping = {uid: Slot.from_address(a, dims, strides, dtype=dtype, device="cpu")
                       for (uid, dims, strides, dtype), a in zip(self.tensors, addresses)}
        else:
            mapping = {uid: a for (uid, _, _, _), a in zip(self.tensors, addresses)}
        workspace = results[len(self.tensors) - len(arguments)] if self.workspace_size > 0 else None
        if workspace is not None and self.device < 0:
            workspace = Slot.from_address(workspace, (self.workspace_size,), dtype="uint8", device="cpu")
        graph.execute(mapping, workspace=workspace, stream=stream if self.device >= 0 else None)
