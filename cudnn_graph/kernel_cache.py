"""``KernelCache``: compiled kernels shared by the graphs built with it (``pygraph(kernel_cache=)``).

The cache itself is engine-neutral: it holds one slot per engine (``state(engine, factory)``) and
each engine that can reuse kernels keeps its own object there. The cuDNN backend keeps a
``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`` per device and attaches it to every execution plan it
finalizes for a graph that carries the cache (``CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE``, cuDNN >=
9.4), so a later graph of the same topology binds the kernel compiled for an earlier one instead of
compiling again. A graph with a kernel cache is a dynamic-shape graph (``is_dynamic_shape_enabled``, as
cudnn.pygraph makes it): cuDNN compiles its kernels for a class of shapes, so another shape of the same
structure binds them. The cache is honoured or declined, never ignored: an engine that cannot reuse
kernels (``BaseEngine.reuses_kernel_cache`` False), or a cuDNN older than 9.4, builds without it and
records why (``declined_by``, and an INFO log line); ``used_by`` says which engines did use it. ``serialize()`` / ``deserialize()`` carry the kernels to another process (each engine's
part in its own form: cuDNN's JSON needs cuDNN >= 9.10).

Example:
    >>> import cudnn_graph as cudnn
    >>> cache = cudnn.create_kernel_cache()
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu", kernel_cache=cache)
    >>> g.kernel_cache is cache
    True
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable, Optional

from .errors import KernelCacheError

logger = logging.getLogger(__name__)

__all__ = ["KernelCache", "create_kernel_cache"]

_FORMAT = "cudnn_graph_kernel_cache"    # the key that marks serialize()'s text, and its version
_FORMAT_VERSION = 1


class KernelCache:
    """Kernels compiled by one graph's plans, reused by the next graph built with the same cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict = {}
        self._loaded: dict = {}      # engine name -> its part of a deserialized cache
        self._declines: dict = {}    # engine name -> why it built without this cache (the latest reason)

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

    def decline(self, engine: str, reason: str) -> None:
        """Record that engine ``engine`` built a plan without this cache, and why (logged at INFO once
        per engine and reason). ``kernel_cache=`` is honoured or declined this way, never ignored."""
        with self._lock:
            seen = self._declines.get(engine) == reason
            self._declines[engine] = reason
        if not seen:
            logger.info("kernel_cache declined by engine %s: %s", engine, reason)

    @property
    def declined_by(self) -> dict:
        """``{engine name: why}`` for every engine that built a plan without this cache.

        >>> import cudnn_graph as cudnn
        >>> cudnn.create_kernel_cache().declined_by
        {}
        """
        with self._lock:
            return dict(self._declines)

    def serialized_state(self, engine: str):
        """What ``deserialize`` gave for engine ``engine`` (its own text), for the engine to load when it
        makes its slot; None when nothing was given."""
        with self._lock:
            return self._loaded.get(engine)

    def serialize(self) -> str:
        """The cache as text: each engine's kernels in its own form (cuDNN's JSON, cuDNN >= 9.10).

        Raises KernelCacheError when no engine has compiled into the cache yet (there is nothing to save).
        """
        with self._lock:
            states = dict(self._states)
        engines = {name: state.serialize() for name, state in sorted(states.items())
                   if hasattr(state, "serialize")}
        if not engines:
            raise KernelCacheError("KernelCache.serialize(): no engine has compiled a kernel into this cache yet "
                             "(build a graph with kernel_cache= first)")
        return json.dumps({_FORMAT: _FORMAT_VERSION, "engines": engines})

    def deserialize(self, text: str) -> None:
        """Load what ``serialize`` wrote into this new cache (each engine reads its part on first use).

        A cache that holds kernels already, or was loaded before, refuses (as cudnn.KernelCache does).
        """
        try:
            record = json.loads(text)
            engines = record["engines"] if record.get(_FORMAT) == _FORMAT_VERSION else None
        except (TypeError, ValueError, AttributeError, KeyError):
            engines = None
        if not isinstance(engines, dict):
            raise KernelCacheError("KernelCache.deserialize(): the text is not a kernel cache serialize() wrote")
        with self._lock:
            if self._states or self._loaded:
                raise KernelCacheError("KernelCache.deserialize(): this cache is in use or loaded already; "
                                   "deserialize into a new cache from create_kernel_cache()")
            self._loaded = dict(engines)

    def __repr__(self) -> str:
        return f"KernelCache(used_by={self.used_by}, declined_by={sorted(self.declined_by)})"


def create_kernel_cache() -> KernelCache:
    """A new, empty kernel cache to pass to ``pygraph(kernel_cache=)`` (cudnn.create_kernel_cache).

    >>> import cudnn_graph as cudnn
    >>> cudnn.create_kernel_cache().used_by
    []
    """
    return KernelCache()
