"""Cheap counters of what the runtime holds, for soak tests and leak hunts (bench/soak.py).

Nothing here is on a hot path; each call walks a few small fixed-size tables. The counts are for the
calling thread where the state is per thread (cached variant packs and their CUDA graphs), and for the
process otherwise (operation graphs the cuDNN engine keeps finalized).
"""
from __future__ import annotations

__all__ = ["debug_counters"]


def debug_counters() -> dict:
    """``{"variant_packs", "cuda_graphs", "lowered_graphs", "built_plans"}``: the calling thread's cached
    variant packs and the CUDA graphs replaying them, the engines' cached lowered graphs and the plans
    built on them. Each is bounded by a cache size; a count that keeps growing is a leak."""
    from . import _cudnn_handle
    from .engines import manifest
    state = _cudnn_handle.current_thread_state()
    lowered = plans = 0
    for engine in manifest.engines():
        counts = engine.cache_counts()
        lowered += counts.get("lowered_graphs", 0)
        plans += counts.get("built_plans", 0)
    return {"variant_packs": state.cached_variant_packs, "cuda_graphs": state.cached_graphs,
            "lowered_graphs": lowered, "built_plans": plans}
