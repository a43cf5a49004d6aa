"""``KernelCache``: compiled kernels shared by the graphs built with it (``pygraph(kernel_cache=)``).

The cache itself is engine-neutral: it holds one slot per engine (``state(engine, factory)``) and
each engine that can reuse kernels keeps its own object there. The cuDNN backend keeps a
``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`` per device and attaches it to every execution plan it
finalizes for a graph that carries the cache (``CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE``, cuDNN >=
9.4), so a later graph of the same topology binds the kernel compiled for an earlier one instead of
compiling again. An engine that cannot reuse kernels ignores the cache; ``used_by`` says which
engines did.

Example:
    >>> import cudnn_graph as cudnn
    >>> cache = cudnn.create_kernel_cache()
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu", kernel_cache=cache)
    >>> g.kernel_cache is cache
    True
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

__all__ = ["KernelCache", "create_kernel_cache"]


class KernelCache:
    """Kernels compiled by one graph's plans, reused by the next graph built with the same cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict = {}

    def state(self, engine: str, factory: Optional[Callable[[], Any]] = None) -> Any:
        """The slot of engine ``engine`` (its name): made by ``factory`` on first use, else None."""
        with self._lock:
            found = self._states.get(engine)
            if found is None and factory is not None:
                found = self._states[engine] = factory()
            return found

    @property
    def used_by(self) -> list:
        """Names of the engines that keep kernels in this cache."""
        with self._lock:
            return sorted(self._states)

    def serialize(self) -> str:
        """cudnn.KernelCache.serialize: not implemented (cuDNN's JSON form needs 9.10; not wired yet)."""
        raise NotImplementedError("KernelCache.serialize() is not implemented: the cuDNN kernel cache's "
                                  "JSON form (CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION) is not read yet")

    def deserialize(self, text) -> None:
        """cudnn.KernelCache.deserialize: not implemented (see serialize)."""
        raise NotImplementedError("KernelCache.deserialize() is not implemented: the cuDNN kernel cache's "
                                  "JSON form (CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION) is not written yet")

    def __repr__(self) -> str:
        return f"KernelCache(used_by={self.used_by})"


def create_kernel_cache() -> KernelCache:
    """A new, empty kernel cache to pass to ``pygraph(kernel_cache=)`` (cudnn.create_kernel_cache).

    >>> import cudnn_graph as cudnn
    >>> cudnn.create_kernel_cache().used_by
    []
    """
    return KernelCache()
