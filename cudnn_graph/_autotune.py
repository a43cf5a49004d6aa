"""``pygraph.autotune``: build every candidate plan, time each on the caller's buffers, select the fastest.

The plan list (``graph.plans``) is the candidate set: every entry that builds is timed, an entry that
declines to build or fails to execute is skipped (logged, and kept in the result's ``failures``), and
the fastest is selected (``select_plan``; a tie goes to the better-ranked entry, the lower index).
``build_plan_policy.ALL`` and the at-index loop (``build_plan_at_index`` / ``execute_plan_at_index`` /
``select_plan``) stay available to callers who time plans themselves; this is that loop, done once.

Timing is behind a small protocol (``PlanTimer``) so that the selection logic runs on the CPU against a
fake timer: ``CudaEventTimer`` (CUDA events on the execute stream, through cudnn_graph's own driver
layer) for graphs on a GPU, ``HostTimer`` (the host clock) for graphs on the host.

What autotune chose is handed to ``_record_choice(graph, entry)``, which logs it; the persistent plan
cache records it there.

cudnn-frontend's Python ``pygraph`` has no autotune method (its C++ ``Graph::autotune`` times each plan
with CUDA events after one warm-up execute, up to 100 times); the signature here is
``autotune(variant_pack, workspace=None, *, iterations=100, stream=None)``.

Example:
    >>> import numpy as np, cudnn_graph as cudnn
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu")
    >>> x = g.tensor(name="x", dim=[1, 4], stride=[4, 1])
    >>> y = g.relu(x).set_output(True)
    >>> g.build()
    >>> X = np.ones((1, 4), np.float32); Y = np.empty_like(X)
    >>> g.autotune({x: X, y: Y}, iterations=2).best_index
    0
"""
from __future__ import annotations

import logging
import operator
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from ._slot import Slot

from .errors import AutotuneError, CudnnGraphError, GraphNotSupportedError, InvalidArgumentError, \
    InvalidArgumentTypeError

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_ITERATIONS", "DEFAULT_WARMUP", "PlanTimer", "HostTimer", "CudaEventTimer", "AutotuneResult",
           "autotune", "select_fastest"]

DEFAULT_ITERATIONS = 100     # timed executes per plan (cudnn-frontend's C++ autotune: at most 100)
DEFAULT_WARMUP = 1           # untimed executes first (kernel load, workspace, caches), as the frontend's


class PlanTimer(Protocol):
    """Times a plan: ``time_ms(run, warmup, iterations, stream)`` calls ``run(s)`` (one execute queued
    on stream ``s``) ``warmup`` times untimed, then times ``iterations`` executes, and returns the
    milliseconds one execute takes."""

    def time_ms(self, run: Callable[[int], None], warmup: int, iterations: int, stream: int) -> float:
        ...


class HostTimer:
    """The host clock around a burst of calls (graphs on the host: their executes are synchronous)."""

    def time_ms(self, run: Callable[[int], None], warmup: int, iterations: int, stream: int) -> float:
        for _ in range(warmup):
            run(stream)
        start = time.perf_counter()
        for _ in range(iterations):
            run(stream)
        return (time.perf_counter() - start) * 1e3 / iterations


class CudaEventTimer:
    """GPU milliseconds per execute, from CUDA events on ``stream``.

    The ``iterations`` executes are captured into one CUDA graph (from a private stream), and the
    events time one launch of it: the kernels run back to back, so a small plan's time is its own and
    not the host's launch cost (a 256^3 matmul runs for less time than one Python execute takes to
    issue). A plan whose execute cannot be captured is timed as a burst of executes on ``stream``.
    """

    def time_ms(self, run: Callable[[int], None], warmup: int, iterations: int, stream: int) -> float:
        from ._driver import TimingEvents
        from .errors import CudaDriverError
        events = TimingEvents()
        for _ in range(warmup):
            run(stream)
        events.start(stream)
        events.stop(stream)
        events.elapsed_ms()          # waits for the warm-up's work
        try:
            return self._captured_ms(run, iterations, stream, events)
        except (CudaDriverError, CudnnGraphError, NotImplementedError) as exc:
            logger.debug("autotune: the executes could not be captured (%s); timing a burst of executes", exc)
        events.start(stream)
        for _ in range(iterations):
            run(stream)
        events.stop(stream)
        return events.elapsed_ms() / iterations

    @staticmethod
    def _captured_ms(run, iterations: int, stream: int, events) -> float:
        from . import _driver
        from ._cuda_graphs import captured_graph

        def record(private):
            for _ in range(iterations):
                run(private)
        graph = captured_graph(record)
        graph_exec = 0
        try:
            graph_exec = _driver.graph_exec_new(graph)
            _driver.graph_exec_launch(graph_exec, stream)        # warm (uploads the graph)
            events.start(stream)
            _driver.graph_exec_launch(graph_exec, stream)
            events.stop(stream)
            return events.elapsed_ms() / iterations
        finally:
            _driver.graph_exec_free(graph_exec)
            _driver.graph_free(graph)


@dataclass
class AutotuneResult:
    """What autotune measured: milliseconds per execute of each plan it timed (by plan index), the
    plans it skipped and why, and the index it selected."""
    best_index: int
    times_ms: dict = field(default_factory=dict)      # plan index -> ms per execute
    failures: dict = field(default_factory=dict)      # plan index -> why it was skipped
    labels: dict = field(default_factory=dict)        # plan index -> plan label

    def rows(self) -> list:
        """``[(index, label, ms or None, note)]`` for every plan, in plan-list order."""
        out = []
        for i in sorted(set(self.times_ms) | set(self.failures)):
            note = "selected" if i == self.best_index else self.failures.get(i, "")
            out.append((i, self.labels.get(i, ""), self.times_ms.get(i), note))
        return out


def select_fastest(times_ms: dict) -> int:
    """The plan index with the least time; among equal times the lowest index (the router ranked it
    higher). Raises ValueError on an empty mapping."""
    if not times_ms:
        raise ValueError("select_fastest: no timed plan")
    return min(times_ms, key=lambda i: (times_ms[i], i))


def _checked_count(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentTypeError(name, f"an int >= {minimum}", value)
    count = operator.index(value)
    if count < minimum:
        raise InvalidArgumentError(name, f"an int >= {minimum}", count)
    return count


def _record_choice(graph, entry) -> None:
    """Record autotune's choice for ``graph``: ``entry`` (a PlanConfig) is the plan it selected.

    The plan cache (``cudnn_graph.plan_cache``, where one is in use for the graph) stores it, so that a
    later build of the same graph, here or in another process, starts with it; logged at INFO.
    """
    from . import plan_cache
    stored = plan_cache.record_choice(graph, entry)
    logger.info("autotune: graph %r (key %s) runs plan '%s' (engine %s, id %d, knobs %s)%s", graph.context.name,
                graph.key()[:8], entry.label, getattr(entry.engine, "name", entry.engine), entry.engine_id,
                dict(entry.knobs), "; stored in the plan cache" if stored else
                " (no plan cache for this graph: set_plan_cache() or use_plan_cache() keeps the choice)")


def _shared_workspace(graph, workspace, built):
    """The caller's workspace, or (a GPU graph given none) one allocation holding the largest built plan's
    bytes: every plan is then timed on the same memory, and no execute allocates one for the private
    stream a timing capture runs on."""
    if workspace is not None or graph.device[0] != "cuda":
        return workspace
    largest = max((graph.get_workspace_size_plan_at_index(i) for i in built), default=0)
    if largest <= 0:
        return None
    from ._driver import DeviceAllocation
    return DeviceAllocation(largest, graph.device[1])


def _default_timer(graph) -> PlanTimer:
    return CudaEventTimer() if graph.device[0] == "cuda" else HostTimer()


# What a plan that fails to execute raises (a status, a workspace too small for it, a decline): it is
# skipped. Anything else is a bug and propagates.
_EXECUTE_FAILURES = (CudnnGraphError, NotImplementedError)


def autotune(graph, variant_pack, workspace=None, *, iterations: int = DEFAULT_ITERATIONS, stream=None,
             warmup: int = DEFAULT_WARMUP, timer: Optional[PlanTimer] = None) -> AutotuneResult:
    """Build every plan of ``graph``'s list, time each on ``variant_pack`` (and ``workspace``, which must
    hold the largest plan's bytes; None: one allocation of that size for a GPU graph), select the
    fastest and record the choice.

    ``iterations`` timed executes per plan follow ``warmup`` untimed ones, on ``stream`` (None: the
    default stream). A plan that fails to build or to execute is skipped and logged; when every plan
    fails, AutotuneError lists why. The graph must be planned (``create_execution_plans()`` or
    ``build()``); afterwards the selected plan is built and pinned, so ``execute()`` runs it.
    """
    from .errors import NotPlannedError
    iterations = _checked_count(iterations, "iterations")
    warmup = _checked_count(warmup, "warmup", minimum=0)
    count = graph.get_execution_plan_count()
    if count == 0:
        raise NotPlannedError("autotune()", "not planned", "build() or create_execution_plans() first",
                              "the graph has no plan list")
    if timer is None:
        timer = _default_timer(graph)
    from ._stream import as_stream_handle
    raw_stream = 0 if stream is None else as_stream_handle(stream)
    result = AutotuneResult(best_index=-1)
    built = []
    for i in range(count):
        label = graph.get_plan_name_at_index(i)
        result.labels[i] = label
        try:
            graph.build_plan_at_index(i)
        except (NotImplementedError, GraphNotSupportedError) as exc:
            result.failures[i] = f"build: {exc}"
            logger.info("autotune: plan %d (%s) skipped, it did not build: %s", i, label, exc)
            continue
        built.append(i)
    allocation = workspace = _shared_workspace(graph, workspace, built)   # (kept alive while timing)
    if type(allocation) is not int and hasattr(allocation, "ptr"):
        workspace = allocation.ptr
    from ._cuda_graphs import imported_operands
    if workspace is not None and type(workspace) is not int and type(workspace) is not Slot:
        workspace = Slot.from_object(workspace)      # imported once, before any capture (see below)
    for i in built:
        label = result.labels[i]
        operands = imported_operands(graph, i, variant_pack)    # the timer may capture the executes

        def run(on_stream, i=i, operands=operands):
            graph.execute_plan_at_index(operands, workspace, index=i, stream=on_stream)

        try:
            result.times_ms[i] = float(timer.time_ms(run, warmup, iterations, raw_stream))
        except _EXECUTE_FAILURES as exc:
            result.failures[i] = f"execute: {type(exc).__name__}: {exc}"
            logger.info("autotune: plan %d (%s) skipped, it failed to execute: %s", i, label, exc)
            continue
        logger.debug("autotune: plan %d (%s): %.4f ms", i, label, result.times_ms[i])
    if not result.times_ms:
        raise AutotuneError(f"autotune(): none of the {count} plans could be timed",
                            [(i, result.labels[i], why) for i, why in sorted(result.failures.items())])
    result.best_index = select_fastest(result.times_ms)
    graph.select_plan(result.best_index)
    graph.build_plans()
    _record_choice(graph, graph.plans[result.best_index])
    return result
