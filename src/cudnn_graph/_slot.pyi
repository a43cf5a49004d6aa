"""Type stubs for cudnn_graph._slot (compiled): one operand as a DLTensor."""
from typing import Any, final

@final
class Slot:
    """One operand as a DLTensor that owns its shape/stride storage and keeps its memory alive."""

    @staticmethod
    def from_object(obj: Any, *, stream: Any = None) -> Slot:
        """Import any buffer: DLPack (C exchange table or ``__dlpack__``), CUDA array interface, a Slot."""
    @staticmethod
    def from_address(ptr: int, shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int] | None = None,
                     dtype: str = "float32", device: str | int | tuple[Any, int] = "cuda", *,
                     readonly: bool = False) -> Slot:
        """A slot over raw memory with a declared geometry; ``strides`` in elements (None: row-major)."""
    @property
    def data_ptr(self) -> int:
        """The address of the first element (data plus byte offset)."""
    @property
    def ndim(self) -> int:
        """Number of dimensions."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Extents, outermost first."""
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements."""
    @property
    def dtype(self) -> str:
        """The element type's name ('float16', 'bfloat16', ...)."""
    @property
    def dtype_code(self) -> tuple[int, int, int]:
        """The DLPack (code, bits, lanes) of the element type."""
    @property
    def device(self) -> tuple[str, int]:
        """('cpu', 0), ('cuda', N), ..."""
    @property
    def readonly(self) -> bool:
        """True when the producer marked the memory read-only."""
    @property
    def owner(self) -> Any:
        """What keeps the memory alive: the producer object, the slot itself, or None (a bare address)."""
    @property
    def producer_stream(self) -> int:
        """The stream a CUDA-array-interface v3 producer declared (0 when none)."""
    @property
    def numel(self) -> int:
        """Number of elements."""
    @property
    def nbytes(self) -> int:
        """Bytes the elements occupy when packed (sub-byte types round up)."""
    __dlpack_c_exchange_api__: Any
    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack (device type, ordinal)."""
    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export as a DLPack capsule: versioned when ``max_version`` allows it, legacy otherwise."""

def device_name(device_type: int, device_id: int) -> str:
    """'cpu', 'cuda:1', ... for messages."""
def refresh_exchange_api_cache() -> None:
    """Forget every cached per-type decision (exchange tables found or missed)."""
