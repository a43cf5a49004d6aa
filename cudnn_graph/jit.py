"""``jit``: cudnn.jit, a decorator that builds the graph a function makes.

The decorated function makes a graph and returns ``(graph, tensors)``; the wrapper builds the graph
with ``heur_modes`` unless it already has a plan list (a function cached with ``graph_cache`` hands
back a built graph), and returns ``(graph, uids)``, the uid of each tensor in order. The undecorated
function stays reachable as ``__wrapped__``.

Example:
    >>> import numpy as np
    >>> import cudnn_graph as cudnn
    >>> @cudnn.jit(heur_modes=cudnn.heur_mode.A)
    ... def relu_graph(x):
    ...     g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu")
    ...     X = g.tensor_like(x)
    ...     Y = g.relu(X).set_output(True)
    ...     return g, [X, Y]
    >>> x = np.array([[-1.0, 2.0]], np.float32)
    >>> g, (x_uid, y_uid) = relu_graph(x)
    >>> y = np.empty_like(x)
    >>> g.execute({x_uid: x, y_uid: y})
    >>> y.tolist()
    [[0.0, 2.0]]
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Sequence, Union

logger = logging.getLogger(__name__)

__all__ = ["jit"]


def jit(heur_modes: Union[Sequence, object, None] = None, **options) -> Callable:
    """A decorator: the function's ``(graph, tensors)`` become ``(built graph, [uid, ...])``.

    ``heur_modes`` is one heuristics mode or a list of them (default: ``heur_mode.A``). Further
    keywords are accepted for cudnn.jit compatibility and, as there, not used.
    """
    from .enums import heur_mode
    from .errors import ArgumentTypeError
    if heur_modes is None:
        heur_modes = heur_mode.A
    modes = list(heur_modes) if isinstance(heur_modes, (list, tuple)) else [heur_modes]
    if options:
        logger.debug("jit: options %s are accepted and unused (as in cudnn.jit)", sorted(options))

    def decorator(make_graph: Callable) -> Callable:
        @functools.wraps(make_graph)
        def build_and_number(*args, **kwargs):
            made = make_graph(*args, **kwargs)
            try:
                graph, tensors = made
            except (TypeError, ValueError):
                raise ArgumentTypeError(f"a cudnn_graph.jit function returns (graph, [tensors]); "
                                f"{getattr(make_graph, '__name__', make_graph)!r} returned "
                                f"{type(made).__name__}") from None
            if graph.get_execution_plan_count() <= 0:
                graph.build(modes)
            return graph, [t.get_uid() for t in tensors]
        return build_and_number

    return decorator
