"""Which engines exist in this process. Optional engines whose dependencies are missing are absent."""
from __future__ import annotations

import importlib
import logging
import threading
import warnings
from typing import Callable

from .base import BaseEngine
from . import ids
from .ids import OUT_OF_TREE

logger = logging.getLogger(__name__)

# In-tree engines: module, class, optional, adds graph methods, the engine ids it owns. Each is tried once; an ImportError means
# "absent", silently. An optional engine whose import fails otherwise (a broken dependency) is absent
# too, with a warning: the graphs still run on the other engines. An engine that adds graph methods
# (BaseEngine.graph_methods) is imported with cudnn_graph, so that its methods exist on every graph
# before anything is planned; the others are imported at first planning. Importing an engine imports
# no GPU DSL: the DSL engines (ToolchainGatedEngine) only look their DSL up here and import it when they
# first consider a graph on a device they serve, so that a host graph's first build stays cheap.
_IN_TREE = (
    ("cudnn_graph.engines.reference", "ReferenceEngine", False, False, ids.family_block(ids.REFERENCE)),
    ("cudnn_graph.engines.cudnn_backend", "CudnnBackendEngine", False, True, ids.CUDNN_BACKEND),
    ("cudnn_graph.engines.cute", "CuteGemmEngine", True, False, ids.family_block(ids.CUTE_BASE)),
    ("cudnn_graph.engines.cutile", "CutileLinearAttentionEngine", True, False, ids.family_block(ids.CUTILE_BASE)),
)

_lock = threading.Lock()
_loaded: list[BaseEngine] | None = None
_registered: list[BaseEngine] = []


_ABSENT = object()
_made: dict = {}      # index in _IN_TREE -> its engine, or _ABSENT (each entry is tried once)


def _make(index: int):
    """The engine of ``_IN_TREE[index]`` (imported and made on first use), or None where it is absent.
    The caller holds ``_lock``."""
    found = _made.get(index)
    if found is not None:
        return None if found is _ABSENT else found
    module, cls, optional, _, _ = _IN_TREE[index]
    engine = None
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        logger.debug("engine %s absent: %s", module, exc)
        mod = None
    except Exception as exc:     # noqa: BLE001
        if not optional:
            raise
        logger.warning("engine %s left out: importing it raised %s: %s", module, type(exc).__name__, exc)
        mod = None
    factory = getattr(mod, cls, None) if mod is not None else None
    if factory is not None:
        engine = factory()
        # A required engine stays even when it cannot run here (the cuDNN backend without libcudnn): it
        # declines every graph it would serve with the reason, so a plan list says what is missing. Its
        # ``available`` is not read here: the backend's probe loads libcudnn.
        if optional and not getattr(engine, "available", True):
            engine = None
    _made[index] = _ABSENT if engine is None else engine
    return engine


def _load_in_tree() -> list[BaseEngine]:
    return [engine for engine in map(_make, range(len(_IN_TREE))) if engine is not None]


def engine_owning(engine_id: int):
    """The in-tree engine whose id block holds ``engine_id``, making no other in-tree engine (what a plan
    loaded from a blob needs: one engine, not the list), or None (no in-tree engine owns the id, or it is
    absent here)."""
    for index, entry in enumerate(_IN_TREE):
        if engine_id in entry[4]:
            with _lock:
                if _loaded is not None:      # the list exists (or a test set it): the caller searches it
                    return None
                return _make(index)
    return None


def engines() -> list[BaseEngine]:
    """Every engine of this process: in-tree ones whose dependencies import, then registered ones."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load_in_tree()
        return list(_loaded) + list(_registered)


def install_graph_methods(register: Callable[[str, Callable], None]) -> None:
    """Hand every in-tree engine's ``graph_methods`` to ``register`` (``cudnn_graph.graph.register_graph_method``).

    Called once by ``cudnn_graph.graph`` when it is imported; an engine that is absent adds none.
    """
    for module, cls, _, adds_methods, _ in _IN_TREE:
        if not adds_methods:
            continue
        try:
            engine_class = getattr(importlib.import_module(module), cls)
        except ImportError as exc:   # an install without this engine: its methods are simply absent
            logger.debug("graph methods of %s not added: %s", module, exc)
            continue
        for name, function in engine_class.graph_methods.items():
            register(name, function)


def _register_methods_of(engine: BaseEngine) -> None:
    methods = type(engine).graph_methods
    if methods:
        from ..graph import register_graph_method
        for name, function in methods.items():
            register_graph_method(name, function)


def register_engine(engine: BaseEngine) -> None:
    """Add an out-of-tree engine (engine ids 30000 and above) to every graph's plan list.

    Its ``graph_methods`` (if any) become methods of every graph.
    """
    if not isinstance(engine, BaseEngine):
        raise TypeError(f"register_engine takes a BaseEngine; got {type(engine).__name__}")
    if engine.engine_id < OUT_OF_TREE:
        raise ValueError(f"out-of-tree engines use ids >= {OUT_OF_TREE}; {engine.name} has {engine.engine_id}")
    with _lock:
        if any(e.engine_id == engine.engine_id for e in _registered):
            raise ValueError(f"engine id {engine.engine_id} is already registered")
        _registered.append(engine)
    _register_methods_of(engine)


def unregister_engine(engine: BaseEngine) -> None:
    """Take a registered engine out of the plan lists made from now on (its graph methods stay)."""
    with _lock:
        _registered[:] = [e for e in _registered if e is not engine]


def register_backend(engine: BaseEngine) -> None:
    """Deprecated spelling of ``register_engine`` (it registers any engine, not only a backend)."""
    warnings.warn("register_backend is deprecated; use register_engine", DeprecationWarning, stacklevel=2)
    register_engine(engine)


def unregister_backend(engine: BaseEngine) -> None:
    """Deprecated spelling of ``unregister_engine``."""
    warnings.warn("unregister_backend is deprecated; use unregister_engine", DeprecationWarning, stacklevel=2)
    unregister_engine(engine)
