"""What the Python GPU engines ask of the CUDA device a plan runs on: its compute capability and the
workspace a plan keeps per stream when the caller gives none.

The cuDNN backend's PlanRunner (src/cudnn_graph/_backend.pyx) keeps its per-stream workspaces the same
way, in Cython, because it hands the pointer to cuDNN without the GIL's help.
"""
from __future__ import annotations

import threading

__all__ = ["compute_capability", "StreamWorkspaces", "WORKSPACES_PER_PLAN"]

WORKSPACES_PER_PLAN = 8   # workspaces a plan keeps for the streams it ran on (oldest goes first)


def compute_capability(ordinal: int) -> tuple:
    """``(major, minor)`` of CUDA device ``ordinal``; RuntimeError when there is no such device."""
    from .._driver import device_info
    return tuple(device_info(ordinal)["compute_capability"])


class StreamWorkspaces:
    """One device allocation of ``nbytes`` per stream, made on the stream's first use.

    Work on one stream is ordered, so a stream reuses its block safely. At most
    ``WORKSPACES_PER_PLAN`` are kept: a caller that makes a stream per step must not grow this
    without bound, and freeing the oldest waits for work still using it (cuMemFree synchronizes).
    """

    def __init__(self, nbytes: int, ordinal: int):
        self.nbytes = nbytes
        self.ordinal = ordinal
        self._blocks: dict = {}          # stream -> DeviceAllocation, oldest first
        self._lock = threading.Lock()

    def address(self, stream: int) -> int:
        """The device address of ``stream``'s block."""
        found = self._blocks.get(stream)
        return found.ptr if found is not None else self._allocate(stream)

    def live(self) -> list:
        """[(stream, device address)] of every block still held (a C launcher's view of them)."""
        with self._lock:
            return [(stream, block.ptr) for stream, block in self._blocks.items()]

    def _allocate(self, stream: int) -> int:
        from .._driver import DeviceAllocation
        with self._lock:
            found = self._blocks.get(stream)   # another thread may have made it meanwhile
            if found is None:
                if len(self._blocks) >= WORKSPACES_PER_PLAN:
                    del self._blocks[next(iter(self._blocks))]
                found = self._blocks[stream] = DeviceAllocation(self.nbytes, self.ordinal)
            return found.ptr
