"""The persistent plan cache: a graph planned once is not planned again, in this process or the next.

A graph that uses the cache looks its plan up when it is planned (``create_execution_plans()``, which
``build()`` runs): on a hit the stored blob (``graph.serialize()``'s) is loaded, and the plan list is
that one plan, built, with no heuristics and no compile; on a miss the graph plans as usual and the plan
``build_plans()`` builds is stored. The bytes live in the kernel disk cache's layer
(``engines/_kernel_disk_cache.py``: versioned keys, atomic writes, a corrupt or foreign entry is a miss
that is removed and written again), under a folder of their own.

Which graphs use it:

- process-wide: ``set_plan_cache(path)`` (None turns it off), or the environment variable
  ``CUDNN_GRAPH_PLAN_CACHE`` naming the folder (read when nothing was set; empty / ``off`` / ``0``: off);
- per graph: ``graph.use_plan_cache(True | path | KernelDiskCache | False)``, which wins over the
  process setting (True with no process cache uses ``~/.cache/cudnn_graph/plans``).

The key (``plan_key``): the graph's structural key (``graph.key()``: dims, strides, data types, uids, ops,
attributes), its device kind, the GPU architecture, the cuDNN version and the library version. A hit or
a miss is logged at INFO (``cudnn_graph.plan_cache``) and reported to the progress callback as a
``"plan_cache"`` event (detail: ``graph``, ``key``, ``hit``, ``plan``, ``ms``).

``record_choice(graph, plan)`` stores a built plan as the graph's (autotune records its winner so);
``lookup(graph)`` says what the cache holds for a graph.

Example:
    >>> import tempfile, numpy as np, cudnn_graph as cudnn
    >>> from cudnn_graph import plan_cache
    >>> folder = tempfile.mkdtemp()
    >>> def make():
    ...     g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu").use_plan_cache(folder)
    ...     x = g.tensor(name="x", dim=[4], stride=[1], uid=1)
    ...     g.relu(x).set_output(True).set_uid(2)
    ...     return g
    >>> g = make(); g.build()                 # a miss: planned, built, stored
    >>> plan_cache.lookup(make())["plan"]     # the next graph of this structure finds it
    'reference'
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Optional, Union

from .errors import CudnnGraphError, GraphNotSupportedError, InvalidArgumentTypeError
from . import _progress

logger = logging.getLogger(__name__)

__all__ = ["ENV_PLAN_CACHE", "set_plan_cache", "get_plan_cache", "plan_key", "lookup", "record_choice",
           "load_into", "store_built", "resolve_choice"]

ENV_PLAN_CACHE = "CUDNN_GRAPH_PLAN_CACHE"
KEY_ENGINE = "plan"                 # KernelKey.engine of every plan entry (kernels use engine names)

_UNSET = object()
_lock = threading.Lock()
_process_choice = _UNSET            # set_plan_cache's KernelDiskCache / None; _UNSET: read the environment
_by_root: dict = {}                 # folder -> KernelDiskCache (one per folder, so its counts add up)


def _disk_cache(root: str):
    from .engines._kernel_disk_cache import KernelDiskCache
    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    with _lock:
        cache = _by_root.get(root)
        if cache is None:
            cache = _by_root[root] = KernelDiskCache(root, max_bytes=None)
        return cache


def _from_environment():
    from .engines._kernel_disk_cache import DISABLING_VALUES
    raw = os.environ.get(ENV_PLAN_CACHE)
    if raw is None or raw.strip().lower() in DISABLING_VALUES:
        return None
    return _disk_cache(raw)


def _as_cache(value, what: str):
    from .engines._kernel_disk_cache import KernelDiskCache
    if value is None:
        return None
    if isinstance(value, KernelDiskCache):
        return value
    if isinstance(value, (str, os.PathLike)):
        return _disk_cache(value)
    raise InvalidArgumentTypeError(what, "a folder (str or path), a KernelDiskCache or None",
                                   type(value).__name__)


def set_plan_cache(path_or_none: Union[str, "os.PathLike", object, None]) -> None:
    """Use the plan cache in folder ``path_or_none`` for every graph of this process (None: no graph uses
    one unless it opts in with ``graph.use_plan_cache``). Overrides ``$CUDNN_GRAPH_PLAN_CACHE``.

    >>> import cudnn_graph
    >>> cudnn_graph.set_plan_cache("/tmp/my_plans")       # doctest: +SKIP
    >>> cudnn_graph.set_plan_cache(None)
    """
    global _process_choice
    _process_choice = _as_cache(path_or_none, "set_plan_cache(path)")


def get_plan_cache():
    """The process's plan cache (a KernelDiskCache), or None when the process uses none."""
    choice = _process_choice
    return _from_environment() if choice is _UNSET else choice


def resolve_choice(cache) -> object:
    """What ``graph.use_plan_cache(cache)`` stores: True, False, or a KernelDiskCache."""
    if cache is True or cache is False:
        return cache
    return _as_cache(cache, "use_plan_cache(cache)") if cache is not None else False


def cache_for(graph):
    """The KernelDiskCache ``graph`` uses, or None."""
    choice = getattr(graph, "_plan_cache_choice", None)
    if choice is False:
        return None
    if choice is None:
        return get_plan_cache()
    if choice is True:
        found = get_plan_cache()
        if found is not None:
            return found
        from .engines._kernel_disk_cache import user_cache_folder
        folder = user_cache_folder("plans")
        return None if folder is None else _disk_cache(folder)
    return choice


# The key's cuDNN slot. The cuDNN version is not part of the key: asking it loads libcudnn (tens of
# milliseconds, and most of a warm first graph whose plan is a DSL engine's), and a stored cuDNN plan
# already records it: a blob from another cuDNN is refused when it loads (check_compatible), discarded,
# planned afresh and stored again.
CUDNN_CHECKED_AT_LOAD = "checked-at-load"


def plan_key(graph):
    """The cache key of ``graph``'s plan (a KernelKey): its structure, device, the library's version (the
    cuDNN version is checked when a stored cuDNN plan loads)."""
    from .engines._kernel_disk_cache import KernelKey
    from .plan_serialization import _version_text, device_arch, library_version
    from ._plan_blob import FORMAT_VERSION
    device = graph.device
    arch = device_arch(device)
    return KernelKey(engine=KEY_ENGINE, dsl="cudnn_graph", dsl_version=_version_text(library_version()),
                     driver_version=CUDNN_CHECKED_AT_LOAD if device[0] == "cuda" else "none",
                     arch=f"sm_{arch}" if arch else "host",
                     kernel_class={"graph": graph.key(), "device": device[0],
                                   "override_shapes": bool(graph.is_override_shape_enabled),
                                   "plan_format": FORMAT_VERSION})


def _report(graph, key, hit: bool, plan: str, started: float, why: str = "") -> None:
    ms = (time.perf_counter() - started) * 1e3
    name = f"graph {graph.context.name!r}" if graph.context.name else "graph"
    if hit:
        logger.info("plan cache hit: %s (key %s) loaded plan '%s' in %.1f ms (no heuristics, no compile)",
                    name, key.digest()[:8], plan, ms)
    else:
        logger.info("plan cache miss: %s (key %s)%s", name, key.digest()[:8], f": {why}" if why else "")
    _progress.emit("plan_cache", {"graph": graph.context.name, "key": key.digest()[:8], "hit": hit,
                                  "plan": plan, "ms": round(ms, 3)})


def load_into(graph) -> bool:
    """On planning ``graph`` (frozen, not planned): install its stored plan and return True (a hit), or
    remember its key for ``store_built`` and return False (a miss, or the graph uses no cache)."""
    cache = cache_for(graph)
    if cache is None or not cache.enabled or getattr(graph, "device_properties", None) is not None:
        return False        # (a deviceless build plans for described properties, not this process's device)
    started = time.perf_counter()
    from .plan_serialization import load_into_built_graph
    try:
        key = plan_key(graph)
    except CudnnGraphError as exc:       # a graph the key cannot describe is planned as usual
        logger.debug("plan cache: no key for this graph (%s)", exc)
        return False
    graph._plans.plan_cache_key = key
    data = cache.load(key)
    if data is None:
        _report(graph, key, False, "", started)
        return False
    try:
        load_into_built_graph(graph, data)
    except GraphNotSupportedError as exc:
        # This graph's own filters (deselect_engines, ...) decline the stored plan: it plans afresh and
        # the entry stays for the graphs it suits.
        _report(graph, key, False, "", started, f"the stored plan is declined here ({exc})")
        return False
    except (CudnnGraphError, NotImplementedError) as exc:
        # A stored plan that does not load here (a filter declines it, cuDNN refuses it): plan afresh.
        # Nothing of the graph's plan state changed (a load installs only once it has the plan built).
        cache.discard(key, f"{type(exc).__name__}: {exc}")
        _report(graph, key, False, "", started, f"the stored plan did not load ({exc})")
        return False
    graph._plans.plan_cache_key = None       # nothing to store: it came from the cache
    _report(graph, key, True, graph._plans.entries[0].label, started)
    return True


def _store(graph, key, index: Optional[int]) -> bool:
    from .plan_serialization import serialize
    cache = cache_for(graph)
    if cache is None:
        return False
    try:
        blob = serialize(graph, index=index)
    except (CudnnGraphError, NotImplementedError) as exc:
        logger.info("plan cache: the plan of graph %r is not stored (%s)", graph.context.name, exc)
        return False
    entry = graph.selected_plan if index is None else graph.plans[index]
    return cache.store(key, blob, {"plan": entry.label, "engine": getattr(entry.engine, "name", ""),
                                   "engine_id": int(entry.engine_id)})


def store_built(graph) -> None:
    """After ``build_plans()`` built ``graph``'s selected plan: store it when planning was a miss."""
    st = graph._plans
    key = getattr(st, "plan_cache_key", None)
    if key is None:
        return
    st.plan_cache_key = None             # once per planning
    _store(graph, key, None)


def record_choice(graph, plan=None) -> bool:
    """Store ``graph``'s built plan ``plan`` (a plan-list index, a PlanConfig of ``graph.plans``, or None
    for the selected one) as the plan its structure gets from now on; True when it was written. Used by
    autotuning to remember the fastest plan.

    >>> plan_cache.record_choice(g, 2)                    # doctest: +SKIP
    True
    """
    if plan is not None and not isinstance(plan, int):
        plans = graph.plans
        matches = [i for i, p in enumerate(plans) if p is plan or p == plan]
        if not matches:
            raise InvalidArgumentTypeError("record_choice(plan)", "an index or an entry of graph.plans", plan)
        plan = matches[0]
    return _store(graph, plan_key(graph), plan)


def lookup(graph) -> Optional[dict]:
    """What the cache holds for ``graph``'s structure: ``{"plan", "engine", "engine_id", "size"}`` or None.
    It loads nothing into the graph."""
    cache = cache_for(graph)
    if cache is None:
        return None
    entry = cache.entry(plan_key(graph))
    if entry is None:
        return None
    return {**entry.meta, "size": len(entry.data)}
