"""What the DSL engines (cute, cutile) share: an engine gated on an optional kernel toolchain."""
from __future__ import annotations

from types import ModuleType

from .base import BaseEngine
from ..enums import behavior_note
from ..errors import GraphNotSupportedError


class ToolchainGatedEngine(BaseEngine):
    """An engine whose kernels need an optional toolchain (a DSL package and its compiler). Without it the
    engine is unavailable (the manifest leaves an unavailable engine out of every plan list) and declines
    every graph with the reason the toolchain gave.

    A subclass sets ``toolchain``: the module whose ``missing()`` says why kernels cannot be built here
    (None when they can); it is asked once, when the engine is made.
    """

    toolchain: ModuleType

    def __init__(self) -> None:
        self.missing = self.toolchain.missing()
        self.available = self.missing is None

    def plan_notes(self, plan) -> tuple[list, list]:
        """Every plan of a DSL engine compiles its kernel when it is built: RUNTIME_COMPILATION, as
        cuDNN says of its runtime-fused engines (callers filter slow first builds by this note)."""
        behavior, numerical = super().plan_notes(plan)
        if behavior_note.RUNTIME_COMPILATION not in behavior:
            behavior.append(behavior_note.RUNTIME_COMPILATION)
        return behavior, numerical

    def _require_toolchain(self) -> None:
        """Decline the graph (GraphNotSupportedError) when the toolchain is missing."""
        if self.missing:
            raise GraphNotSupportedError(self.missing)
