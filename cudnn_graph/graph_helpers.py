"""cudnn-frontend's graph-building helpers: the ``graph(handle, ...)`` context manager and the
``graph_cache`` decorator (``jit``, which builds what they make, is ``cudnn_graph.jit``).

``with graph(handle) as (g, uids):`` makes a ``pygraph`` with cudnn-frontend's defaults (io HALF,
intermediate and compute FLOAT) and yields it with an empty list; leaving the block builds nothing
and an exception in it propagates. ``@graph_cache(key_fn)`` memoises a graph factory on
``key_fn(*args, **kwargs)``, keeping at most ``maxsize`` entries and evicting the oldest one first.

Example:
    >>> import cudnn_graph as cudnn
    >>> @cudnn.graph_cache(key_fn=lambda n: n)
    ... def make(n):
    ...     with cudnn.graph(None, device="cpu") as (g, _):
    ...         x = g.tensor(name="x", dim=[n], stride=[1])
    ...         g.relu(x).set_output(True)
    ...     return g
    >>> make(4) is make(4), make(4) is make(8)
    (True, False)
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any, Callable, Hashable, Iterator

from .data_type import DataType
from .errors import InvalidArgumentError
from .graph import pygraph

logger = logging.getLogger(__name__)

__all__ = ["graph", "graph_cache"]


@contextlib.contextmanager
def graph(handle: Any, name: str = "cudnn_graph", io_data_type=DataType.HALF,
          intermediate_data_type=DataType.FLOAT, compute_data_type=DataType.FLOAT,
          **graph_kwargs) -> Iterator[tuple[pygraph, list]]:
    """A ``pygraph`` on ``handle`` with cudnn-frontend's default data types, yielded as ``(g, [])``.

    ``graph_kwargs`` go to ``pygraph`` (``device=``, ``is_override_shape_enabled=``, ...). ``handle``
    may be None (the graph runs on the runtime's handle for its device and thread). The block's end
    builds nothing: build the graph yourself (``g.build([...])``) or let ``cudnn_graph.jit`` do it.

    Example:
        >>> import cudnn_graph as cudnn
        >>> with cudnn.graph(None, io_data_type=cudnn.data_type.FLOAT, device="cpu") as (g, uids):
        ...     x = g.tensor(name="x", dim=[2, 2], stride=[2, 1])
        >>> g.tensors[0].name, uids
        ('x', [])
    """
    g = pygraph(io_data_type=io_data_type, intermediate_data_type=intermediate_data_type,
                compute_data_type=compute_data_type, handle=handle, name=name, **graph_kwargs)
    yield g, []


def graph_cache(key_fn: Callable[..., Hashable], maxsize: int = 256) -> Callable:
    """Memoise a graph factory on ``key_fn(*args, **kwargs)``: a hit returns the very object the first
    call returned; past ``maxsize`` entries the oldest entry is dropped (insertion order, not LRU).

    Safe to call from several threads (two threads missing on one key may both run the factory; the
    later result is kept).

    Example:
        >>> calls = []
        >>> @graph_cache(key_fn=lambda x: x, maxsize=1)
        ... def factory(x):
        ...     calls.append(x)
        ...     return object()
        >>> a = factory(1); b = factory(1); c = factory(2); d = factory(1)
        >>> calls, a is b, a is d
        ([1, 2, 1], True, False)
    """
    if not callable(key_fn):
        raise InvalidArgumentError(f"graph_cache(key_fn=): expected a callable; got {type(key_fn).__name__}")
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
        raise InvalidArgumentError(f"graph_cache(maxsize=): expected an int >= 1; got {maxsize!r}")

    def decorator(func: Callable) -> Callable:
        cache: dict = {}
        lock = threading.Lock()

        @functools.wraps(func)
        def cached(*args, **kwargs):
            key = key_fn(*args, **kwargs)
            with lock:
                if key in cache:
                    return cache[key]
            result = func(*args, **kwargs)
            with lock:
                while len(cache) >= maxsize and key not in cache:
                    dropped = next(iter(cache))
                    del cache[dropped]
                    logger.debug("graph_cache(%s): evicted %r", getattr(func, "__name__", func), dropped)
                cache[key] = result
            return result

        return cached

    return decorator
