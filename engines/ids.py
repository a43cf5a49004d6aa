"""The one flat engine-id space. Ids are stable: plans are pinned and autotune records keyed by them."""
from __future__ import annotations

CUDNN_BACKEND = range(0, 10_000)        # cuDNN's own engine ids (its heuristics entries)
NATIVE_COMPILED = range(10_000, 20_000)  # in-tree engines compiled ahead of time
PYTHON = range(20_000, 30_000)           # python DSL engines, a block of 100 per family
OUT_OF_TREE = 30_000                     # and above: engines registered by other packages

REFERENCE = 20_000                       # engines.reference (NumPy, host)
CUTE_BASE = 20_100                       # engines.cute (CuTe DSL)
CUTILE_BASE = 20_200                     # engines.cutile (cuTile)
FAMILY_BLOCK = 100                       # the ids of one python family: [base, base + FAMILY_BLOCK)


def family_block(base: int) -> range:
    """The engine ids of the python family whose first id is ``base``."""
    return range(base, base + FAMILY_BLOCK)


def family_of(engine_id: int) -> str:
    """'cudnn', 'native', 'python' or 'external' for an engine id."""
    if engine_id in CUDNN_BACKEND:
        return "cudnn"
    if engine_id in NATIVE_COMPILED:
        return "native"
    if engine_id in PYTHON:
        return "python"
    if engine_id >= OUT_OF_TREE:
        return "external"
    raise ValueError(f"engine id {engine_id} is negative")
