"""Which engines exist in this process. Optional engines whose dependencies are missing are absent."""
from __future__ import annotations

import importlib
import logging
import threading

from .base import BaseEngine
from .ids import OUT_OF_TREE

logger = logging.getLogger(__name__)

# In-tree engines: module, class, optional. Each is tried once; an ImportError means "absent", silently.
# An optional engine whose import fails otherwise (a broken dependency) is absent too, with a warning:
# the graphs still run on the other engines.
_IN_TREE = (
    ("cudnn_graph.engines.reference", "ReferenceEngine", False),
    ("cudnn_graph.engines.cudnn_backend", "CudnnBackendEngine", False),
    ("cudnn_graph.engines.cute", "CuteGemmEngine", True),
    ("cudnn_graph.engines.cutile", "CutileLinearAttentionEngine", True),
)

_lock = threading.Lock()
_loaded: list[BaseEngine] | None = None
_registered: list[BaseEngine] = []


def _load_in_tree() -> list[BaseEngine]:
    engines = []
    for module, cls, optional in _IN_TREE:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            logger.debug("engine %s absent: %s", module, exc)
            continue
        except Exception as exc:     # noqa: BLE001
            if not optional:
                raise
            logger.warning("engine %s left out: importing it raised %s: %s", module, type(exc).__name__, exc)
            continue
        factory = getattr(mod, cls, None)
        if factory is None:
            continue
        engine = factory()
        if getattr(engine, "available", True):
            engines.append(engine)
    return engines


def engines() -> list[BaseEngine]:
    """Every engine of this process: in-tree ones whose dependencies import, then registered ones."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load_in_tree()
        return list(_loaded) + list(_registered)


def register_backend(engine: BaseEngine) -> None:
    """Add an out-of-tree engine (engine ids 30000 and above) to every graph's plan list."""
    if not isinstance(engine, BaseEngine):
        raise TypeError(f"register_backend takes a BaseEngine; got {type(engine).__name__}")
    if engine.engine_id < OUT_OF_TREE:
        raise ValueError(f"out-of-tree engines use ids >= {OUT_OF_TREE}; {engine.name} has {engine.engine_id}")
    with _lock:
        if any(e.engine_id == engine.engine_id for e in _registered):
            raise ValueError(f"engine id {engine.engine_id} is already registered")
        _registered.append(engine)


def unregister_backend(engine: BaseEngine) -> None:
    with _lock:
        _registered[:] = [e for e in _registered if e is not engine]
