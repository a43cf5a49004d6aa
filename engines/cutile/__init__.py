"""cuTile (cuda-tile) engines: chunked delta-rule linear attention (gdn, kda, gdn2; forward and backward).

Optional: without the ``cuda.tile`` package or a ``tileiras`` compiler the engine reports itself
unavailable and the manifest leaves it out (nothing else changes). See docs/engines_cutile.md.
"""
from .engine import CutileLinearAttentionEngine

__all__ = ["CutileLinearAttentionEngine"]
