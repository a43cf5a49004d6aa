"""Type stubs for cudnn_graph._ir (compiled): the graph IR (tensors, nodes, the graph core).

The op builders (``matmul``, ``sdpa``, ...) live on ``cudnn_graph.pygraph``, the Python subclass of Graph.
"""
from collections.abc import Mapping, Sequence
from typing import Any, final

from cudnn_graph.data_type import DataType

@final
class GraphContext:
    """A graph's default data types and name (as ``cudnn.pygraph``'s constructor takes them)."""

    def __init__(self, io_data_type: Any = None, intermediate_data_type: Any = None,
                 compute_data_type: Any = None, name: str = "") -> None:
        """Unset types become DataType.NOT_SET."""
    @property
    def io_data_type(self) -> DataType:
        """The type of graph inputs and outputs not set otherwise."""
    @property
    def intermediate_data_type(self) -> DataType:
        """The type of virtual tensors not set otherwise."""
    @property
    def compute_data_type(self) -> DataType:
        """The math type of ops not set otherwise."""
    @property
    def name(self) -> str:
        """The graph's name ('' when none)."""

@final
class Tensor:
    """A graph tensor. Created by ``graph.tensor(...)``, ``graph.tensor_like(...)`` or an op builder; setters chain."""

    def set_name(self, name: str) -> Tensor:
        """Rename the tensor."""
    def set_dim(self, dim: Sequence[int]) -> Tensor:
        """Set the extents, outermost first."""
    def set_stride(self, stride: Sequence[int]) -> Tensor:
        """Set the strides in elements."""
    def set_data_type(self, data_type: Any) -> Tensor:
        """Set the data type (a DataType, or anything ``data_type_of`` accepts)."""
    def set_output(self, is_output: bool = True) -> Tensor:
        """Make an op's result a graph output (True) or virtual (False)."""
    def set_is_virtual(self, is_virtual: bool) -> Tensor:
        """Make the tensor virtual (an intermediate no buffer backs) or not."""
    def set_is_pass_by_value(self, value: bool) -> Tensor:
        """Pass the tensor by value (a host scalar) or not."""
    def set_ragged_offset(self, offset: Tensor | None) -> Tensor:
        """The ragged-offset tensor of a packed (THD) layout, of the same graph."""
    def set_reordering_type(self, reordering: Any) -> Tensor:
        """Set the tensor's reordering (a ``tensor_reordering`` member)."""
    def set_uid(self, uid: int) -> Tensor:
        """Give the tensor this uid (refused when another tensor of the graph holds it)."""
    def get_name(self) -> str:
        """The tensor's name."""
    def get_uid(self) -> int:
        """The tensor's uid."""
    def get_dim(self) -> list[int]:
        """The extents as a list."""
    def get_stride(self) -> list[int]:
        """The strides as a list."""
    def get_is_virtual(self) -> bool:
        """True for an intermediate no buffer backs."""
    def get_is_pass_by_value(self) -> bool:
        """True for a pass-by-value scalar."""
    def get_ragged_offset(self) -> Tensor | None:
        """The ragged-offset tensor, or None."""
    def get_data_type(self) -> DataType:
        """The user's data type, else the one inference resolved; NOT_SET where none applies."""
    @property
    def name(self) -> str:
        """The tensor's name."""
    @property
    def uid(self) -> int:
        """The tensor's uid."""
    @property
    def is_virtual(self) -> bool:
        """True for an intermediate no buffer backs."""
    @property
    def data_type(self) -> DataType:
        """As get_data_type()."""
    @property
    def dim(self) -> tuple[int, ...]:
        """The extents (inferred for op results)."""
    @property
    def stride(self) -> tuple[int, ...]:
        """The strides in elements (row-major when none was set or inferred)."""
    @property
    def is_output(self) -> bool:
        """True for an op result that is not virtual."""
    @property
    def device(self) -> tuple[int, int] | None:
        """The device of the buffer ``tensor_like`` read this tensor from (None otherwise)."""
    @property
    def graph(self) -> Graph | None:
        """The graph the tensor belongs to."""
    @property
    def uid_assigned_by_user(self) -> bool:
        """True when the user set the uid (auto uids may be renumbered)."""
    @property
    def data_type_set_by_user(self) -> bool:
        """True when the user set the data type."""
    @property
    def dim_set_by_user(self) -> bool:
        """True when the user set the extents."""
    @property
    def stride_set_by_user(self) -> bool:
        """True when the user set the strides (inferred ones are provisional)."""
    @property
    def is_pass_by_value(self) -> bool:
        """True for a pass-by-value scalar."""
    @property
    def value(self) -> Any:
        """The host value of a tensor_scalar tensor (None otherwise)."""
    @property
    def ragged_offset(self) -> Tensor | None:
        """The ragged-offset tensor of a packed (THD) layout, or None."""
    @property
    def producer(self) -> Node | None:
        """The node that computes this tensor (None for graph inputs)."""
    @property
    def reordering_type(self) -> int:
        """The reordering code (0: none)."""

@final
class Node:
    """One op of a graph. ``inputs``, ``outputs`` and ``params`` are read-only mappings."""

    @property
    def inputs(self) -> Mapping[str, Any]:
        """Port name -> input Tensor (or None for an optional port left out)."""
    @property
    def outputs(self) -> Mapping[str, Tensor]:
        """Output name -> Tensor."""
    @property
    def params(self) -> Mapping[str, Any]:
        """Attribute name -> value."""
    @property
    def op(self) -> str:
        """The op's name ('matmul', 'sdpa', ...)."""
    @property
    def name(self) -> str:
        """The node's name."""
    @property
    def schema(self) -> Any:
        """The op's schema (cudnn_graph.ops)."""
    @property
    def index(self) -> int:
        """The node's position in the graph."""
    @property
    def compute_data_type(self) -> int:
        """The node's math type code."""

@final
class OpBinding:
    """What an op builder reads at call time, computed once per op schema (internal to cudnn_graph.graph)."""

    def __init__(self, schema: Any, required: Any, generic: tuple[str, ...] = ("compute_data_type", "name")) -> None:
        """Bind the tables of ``schema``; ``required`` is the op tables' "no default" sentinel."""
    schema: Any
    op: str
    order: tuple[str, ...]
    known: frozenset[str]
    expanders: tuple[Any, ...]
    ports: tuple[Any, ...]
    attrs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    static_outputs: Any
    redirect: tuple[str, ...]
    returned: Any

class Graph:
    """The graph core: tensors, nodes, uids, device and freezing. Build graphs with ``cudnn_graph.pygraph``."""

    handle: Any
    def __init__(self, io_data_type: Any = None, intermediate_data_type: Any = None, compute_data_type: Any = None,
                 *, name: str = "", device: Any = None, handle: Any = None, router: Any = None) -> None:
        """Default data types, name, and optionally the device, handle and router."""
    @property
    def router(self) -> Any:
        """The Router that ranks this graph's plan list (None: the process default)."""
    @router.setter
    def router(self, router: Any) -> None: ...
    def tensor(self, name: str | None = None, dim: Sequence[int] | None = None, stride: Sequence[int] | None = None,
               data_type: Any = None, is_virtual: bool = False, is_pass_by_value: bool = False,
               ragged_offset: Tensor | None = None, reordering_type: Any = None, uid: int | None = None) -> Tensor:
        """A graph input (or, with ``is_virtual=True``, an intermediate) tensor."""
    def tensor_like(self, template: Any, name: str | None = None, is_virtual: bool = False) -> Tensor:
        """A tensor with the dims, strides and data type of ``template`` (any buffer, or a Tensor)."""
    def tensor_scalar(self, value: Any, data_type: Any = None, name: str | None = None) -> Tensor:
        """A pass-by-value scalar tensor holding ``value``."""
    def tensor_by_uid(self, uid: int) -> Tensor:
        """The tensor holding ``uid`` (KeyError when none)."""
    def set_device(self, device: Any) -> Graph:
        """Place the graph on ``device`` ('cpu', 'cuda:N', an ordinal, ...)."""
    def to_dict(self) -> dict[str, Any]:
        """The graph's structure (no buffers) as plain data."""
    def to_json(self, **kwargs: Any) -> str:
        """to_dict() as JSON; ``kwargs`` go to json.dumps."""
    def key(self) -> str:
        """A stable fingerprint of the structure (names excluded): equal graphs share plans."""
    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes in the order they were added."""
    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors in the order they were made."""
    @property
    def node_count(self) -> int:
        """``len(graph.nodes)`` without building the tuple."""
    @property
    def device(self) -> tuple[str, int]:
        """('cpu', 0) or ('cuda', N); resolved at first use when nothing set it."""
    @property
    def device_code(self) -> tuple[int, int]:
        """The graph's DLPack (device type, ordinal)."""
    @property
    def context(self) -> GraphContext:
        """The graph's default data types and name."""
    @property
    def frozen(self) -> bool:
        """True once the graph was lowered or planned (it can no longer change)."""
    @property
    def device_explicit(self) -> bool:
        """True when the device was set (not resolved at first use)."""
