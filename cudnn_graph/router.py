"""Ranking of the plan list. Replace ``heuristics_sort`` (the cost-model seam) in a Router subclass.

A router sees the graph as engines do: ``graph`` is its ``GraphView`` (``cudnn_graph.view``).

Example:
    >>> from cudnn_graph.router import Router, set_default_router
    >>> class PreferPython(Router):
    ...     def heuristics_sort(self, graph, entries):
    ...         return sorted(entries, key=lambda e: e.engine_id < 20_000)
"""
from __future__ import annotations

import threading
from typing import Sequence

__all__ = ["Router", "PreferFamily", "get_default_router", "set_default_router"]


class Router:
    """Default policy: engines' own priorities (higher first), ties kept in proposal order.

    Proposal order is: python engines in manifest order, then the backend's heuristics entries in
    the order its heuristics returned them (A, then B, then FALLBACK).
    """

    def rank(self, graph, entries: Sequence) -> list:
        ranked = list(self.heuristics_sort(graph, list(entries)))
        if sorted(map(id, ranked)) != sorted(map(id, entries)):
            raise ValueError(f"{type(self).__name__}.heuristics_sort must return a permutation of the entries")
        return ranked

    def heuristics_sort(self, graph, entries: list) -> list:
        order = {id(e): i for i, e in enumerate(entries)}
        return sorted(entries, key=lambda e: (-e.priority, order[id(e)]))


class PreferFamily(Router):
    """The default ranking, with the plans of the named engine families first ('cudnn', 'native',
    'python', 'external': ``engines.ids.family_of``), e.g. to compare cuDNN's own plan with another
    binding's while a python engine also claims the graph.

    Example:
        >>> from cudnn_graph.router import PreferFamily
        >>> router = PreferFamily("cudnn")          # pygraph(..., router=router) or set_default_router
    """

    def __init__(self, *families: str):
        self.families = frozenset(families)

    def heuristics_sort(self, graph, entries: list) -> list:
        from .engines.ids import family_of
        return sorted(super().heuristics_sort(graph, entries),
                      key=lambda e: family_of(e.engine_id) not in self.families)


_default = Router()
_lock = threading.Lock()


def get_default_router() -> Router:
    return _default


def set_default_router(router: Router) -> Router:
    """Set the process default router; returns the previous one."""
    global _default
    if not isinstance(router, Router):
        raise TypeError(f"expected a Router; got {type(router).__name__}")
    with _lock:
        previous, _default = _default, router
    return previous
