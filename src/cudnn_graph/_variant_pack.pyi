"""Type stubs for cudnn_graph._variant_pack (compiled): expected operands and one call's buffers."""
from collections.abc import Iterable, Mapping
from typing import Any, final

from cudnn_graph._slot import Slot

@final
class TensorSpec:
    """What a plan expects of one operand: uid, shape, strides, dtype, device, alignment."""

    def __init__(self, uid: int, shape: Iterable[int], dtype: str, *, strides: Iterable[int] | None = None,
                 device: str | int | tuple[Any, int] = "cuda", name: str = "", alignment: int | None = None,
                 is_output: bool = False, required: bool = True) -> None:
        """Declare an operand; bad geometry raises ValueError."""
    @property
    def name(self) -> str:
        """The tensor's name ('' when none)."""
    @property
    def uid(self) -> int:
        """The tensor's uid."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Extents, outermost first."""
    @property
    def strides(self) -> tuple[int, ...] | None:
        """Strides in elements, or None when any layout is accepted."""
    @property
    def is_output(self) -> bool:
        """True for a tensor the plan writes."""
    @property
    def required(self) -> bool:
        """False for an operand a call may leave out."""
    @property
    def alignment(self) -> int:
        """The byte alignment a buffer must have."""
    @property
    def dtype(self) -> str:
        """The element type's name."""
    @property
    def device(self) -> tuple[str, int]:
        """('cpu', 0) or ('cuda', N)."""
    @property
    def row_major_strides(self) -> tuple[int, ...]:
        """The row-major strides of ``shape``."""
    def label(self) -> str:
        """"tensor 'x' (uid 3)" for messages."""

def check(slot: Slot, expected: TensorSpec) -> None:
    """Check one slot against what the graph expects; raises a typed error naming the tensor."""

@final
class PackLayout:
    """The immutable, shareable list of operands a plan needs (sorted by uid)."""

    def __init__(self, specs: Iterable[TensorSpec], *, graph: Any = None, ignored: Iterable[Any] = ()) -> None:
        """``graph``: the Graph whose tensors may key a pack; ``ignored``: uids and names no node reads."""
    @property
    def specs(self) -> tuple[TensorSpec, ...]:
        """The operands, uids ascending."""
    @property
    def graph(self) -> Any:
        """The graph the layout was made for (None: none, or no longer alive)."""
    def spec(self, uid: int) -> TensorSpec:
        """The spec of ``uid`` (KeyError when absent)."""
    def pack(self, mapping: Mapping[Any, Any], *, stream: Any = None) -> VariantPack:
        """Normalise ``{Tensor | uid | name: buffer}`` into a checked VariantPack for one call."""
    def __len__(self) -> int: ...

@final
class VariantPack:
    """One call's operands: slots sorted by uid, with C arrays of uids and data pointers."""

    @staticmethod
    def from_mapping(mapping: Mapping[Any, Any], layout: PackLayout | None = None, *,
                     stream: Any = None) -> VariantPack:
        """Normalise ``{Tensor | uid: buffer}``; with a layout, also check every slot against it."""
    @property
    def uids(self) -> tuple[int, ...]:
        """The operands' uids, ascending."""
    @property
    def data_ptrs(self) -> tuple[int, ...]:
        """The operands' data pointers, in uid order."""
    @property
    def uid_array_address(self) -> int:
        """Address of the int64 uid array (valid while the pack lives)."""
    @property
    def pointer_array_address(self) -> int:
        """Address of the void* data-pointer array (valid while the pack lives)."""
    @property
    def slots(self) -> tuple[Slot, ...]:
        """One Slot per operand, uids ascending."""
    @property
    def layout(self) -> PackLayout | None:
        """The layout the pack was checked against (None: none)."""
    def __len__(self) -> int: ...
    def __getitem__(self, uid: int, /) -> Slot: ...
