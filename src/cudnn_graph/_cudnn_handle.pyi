"""Type stubs for cudnn_graph._cudnn_handle (compiled): cuDNN handles, per-thread state, process switches."""
from typing import Any, final

CUDA_GRAPHS_ENV_VAR: str
"""The environment variable that sets the CUDA graph replay default (0 or 1)."""
CUDA_GRAPH_CAPTURE_ENV_VAR: str
"""The environment variable that sets the CUDA graph capture default (0 or 1)."""

@final
class Handle:
    """A cudnnHandle_t. ``int(handle)`` is the raw pointer (what other bindings take)."""

    @property
    def device(self) -> int:
        """The CUDA ordinal the handle was created on."""
    @property
    def stream(self) -> int:
        """The raw CUDA stream last bound to the handle."""
    @property
    def ptr(self) -> int:
        """The raw cudnnHandle_t."""
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...

@final
class ThreadState:
    """This thread's handles (one per device) and its cache of finalized variant packs."""

    def handle(self, device: int = 0) -> Handle:
        """This thread's handle on ``device`` (created on first use)."""
    def clear_variant_packs(self) -> None:
        """Destroy the cached variant packs of this thread (and the CUDA graphs replaying them)."""
    @property
    def cached_variant_packs(self) -> int:
        """How many variant packs this thread holds."""
    @property
    def cached_graphs(self) -> int:
        """How many cached variant packs have a CUDA graph that replays them."""

def create_handle(device: int = 0) -> Handle:
    """A new cuDNN handle on CUDA ``device``."""
def destroy_handle(handle: Handle | int) -> None:
    """Destroy a handle (a second call does nothing)."""
def set_stream(*, handle: Handle | int, stream: Any) -> None:
    """Bind ``stream`` (None, an int, or an object with ``__cuda_stream__``) to ``handle``."""
def get_stream(handle: Handle | int) -> int:
    """The raw CUDA stream last bound to ``handle``."""
def current_thread_state() -> ThreadState:
    """This thread's ThreadState."""
def thread_handle(device: int = 0) -> Handle:
    """This thread's handle on ``device``."""
def set_variant_pack_cache(enabled: bool) -> bool:
    """Turn the reuse of finalized variant packs on or off; returns the previous setting."""
def set_cuda_graph_replay(enabled: bool) -> bool:
    """Turn CUDA graph replay of executes on or off; returns the previous setting."""
def cuda_graph_replay_enabled() -> bool:
    """Whether executes replay recorded CUDA graphs."""
def set_cuda_graph_capture(enabled: bool) -> bool:
    """Let replay record a plan cuDNN cannot populate by capturing one execute, or not; returns the previous setting."""
def cuda_graph_capture_enabled() -> bool:
    """Whether CUDA graphs may be recorded by stream capture."""
