"""What the DSL engines (cute, cutile) share: an engine gated on an optional kernel toolchain."""
from __future__ import annotations

from types import ModuleType

from .base import BaseEngine
from ..enums import behavior_note
from ..errors import GraphNotSupportedError

_NOT_ASKED = object()      # ToolchainGatedEngine.missing before its first read


class ToolchainGatedEngine(BaseEngine):
    """An engine whose kernels need an optional toolchain (a DSL package and its compiler).

    Importing a DSL costs a fraction of a second to a second, so it is put off until the engine first
    considers a graph on a device it can serve: ``available`` (the manifest leaves an unavailable engine
    out of every plan list) only says the DSL package is installed, found without importing it;
    ``missing`` (why kernels cannot be built here, None when they can) imports the DSL at its first
    read. A subclass runs its cheap checks (device kind, ops, data types) first and calls
    ``_require_toolchain()`` after them, so a host graph never imports a GPU DSL.

    A subclass sets ``toolchain``: a module with ``installed()`` (cheap) and ``missing()`` (imports).
    """

    toolchain: ModuleType

    def __init__(self) -> None:
        self.available = self.toolchain.installed()
        self._missing = _NOT_ASKED

    @property
    def missing(self) -> str | None:
        """Why this engine's kernels cannot be built here (None when they can); the first read imports
        the DSL (``toolchain.missing()``), later reads return that answer."""
        if self._missing is _NOT_ASKED:
            self._missing = self.toolchain.missing()
        return self._missing

    @missing.setter
    def missing(self, reason: str | None) -> None:
        self._missing = reason     # tests reach the node checks without a toolchain

    def plan_notes(self, plan) -> tuple[list, list]:
        """Every plan of a DSL engine compiles its kernel when it is built: RUNTIME_COMPILATION, as
        cuDNN says of its runtime-fused engines (callers filter slow first builds by this note)."""
        behavior, numerical = super().plan_notes(plan)
        if behavior_note.RUNTIME_COMPILATION not in behavior:
            behavior.append(behavior_note.RUNTIME_COMPILATION)
        return behavior, numerical

    def _require_toolchain(self) -> None:
        """Decline the graph (GraphNotSupportedError) when the toolchain is missing; the first call
        imports the DSL, so call it after the checks that need none."""
        if self.missing:
            raise GraphNotSupportedError(self.missing)
