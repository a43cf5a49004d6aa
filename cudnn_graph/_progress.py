"""Progress of what a user waits for: graph builds, kernel compiles, long reference-engine runs.

Each event goes to the ``cudnn_graph`` loggers (nothing is printed unless the application, or
``CUDNN_GRAPH_LOG``, turns logging on) and to the progress callback, when one is set with
``set_progress_callback(fn)``: ``fn(stage, detail)`` with ``stage`` one of

- ``"build"``: a graph's plan was built (detail: ``graph``, ``key``, ``plan``, ``engine``, ``index``,
  ``plans``, ``build_ms`` (all of ``build()``, or ``build_plans()`` alone), ``planning_ms``, ``compile_ms``
  (None where nothing compiled), ``kernel_reused``, ``declined``, ``caches`` ({name: (before, after)} of
  the engine's ``cache_counts()``));
- ``"decline"``: an engine or a plan declined a graph (detail: ``graph``, ``engine``, ``reason``);
- ``"compile"``: an engine compiles kernels (detail: ``engine``, ``what``, ``state`` = ``"start"``,
  ``"running"`` every ``HEARTBEAT_S`` seconds, then ``"done"``, and ``elapsed_s``);
- ``"run"``: a reference-engine run that takes longer than ``LONG_RUN_S`` (``state`` = ``"running"``
  every ``HEARTBEAT_S`` seconds, then ``"done"``; ``engine``, ``what``, ``elapsed_s``).
- ``"plan_cache"``: a graph that uses the plan cache looked its plan up (detail: ``graph``, ``key``,
  ``hit``, ``plan`` (the loaded plan's name on a hit), ``ms``; ``cudnn_graph.plan_cache``).

The ``"running"`` events come from one daemon thread (started at the first watched step, gone when
nothing has been watched for a while); the others come from the thread doing the work. A callback that
raises is logged (a warning) and does not stop the build. ``execute()`` reports nothing: its only cost
here is the reference engine's watch of a long run (a dict entry, no logging call).

Example:
    >>> import cudnn_graph
    >>> events = []
    >>> cudnn_graph.set_progress_callback(lambda stage, detail: events.append((stage, detail)))
    >>> # build graphs: events gets ("build", {"plan": ..., "build_ms": ...}), ("decline", ...), ...
    >>> cudnn_graph.set_progress_callback(None)                      # doctest: +ELLIPSIS
    <function <lambda> at ...>
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from .errors import InvalidArgumentTypeError

__all__ = ["set_progress_callback", "emit", "compiling", "long_run", "HEARTBEAT_S", "LONG_RUN_S"]

logger = logging.getLogger(__name__)

HEARTBEAT_S = 10.0    # a "still compiling" / "still running" line this often
LONG_RUN_S = 5.0      # a reference run is reported once it has taken this long
POLL_S = 0.5          # how often the watcher thread looks at the watched steps
_IDLE_POLLS = 20      # polls with nothing watched before the watcher thread ends

ProgressCallback = Callable[[str, dict], None]
_callback: Optional[ProgressCallback] = None


def set_progress_callback(callback: Optional[ProgressCallback]) -> Optional[ProgressCallback]:
    """Send progress events to ``callback(stage, detail)`` (None: to the log only); returns the callback
    it replaces. Stages: ``"build"``, ``"decline"``, ``"compile"``, ``"run"`` (``cudnn_graph._progress``
    lists each one's ``detail`` keys).

    Example:
        >>> import cudnn_graph
        >>> def show(stage, detail):
        ...     print(stage, detail.get("plan") or detail.get("what"), detail.get("state", ""))
        >>> cudnn_graph.set_progress_callback(show)
        >>> cudnn_graph.set_progress_callback(None) is show              # back to the log only
        True
    """
    global _callback
    if callback is not None and not callable(callback):
        raise InvalidArgumentTypeError("set_progress_callback(callback)", "a callable (stage, detail) or None",
                                       type(callback).__name__)
    previous, _callback = _callback, callback
    return previous


def wanted(level: int = logging.INFO) -> bool:
    """Whether an event at ``level`` reaches anyone (a log handler or the callback): callers skip
    working out an event's detail when it does not."""
    return _callback is not None or logging.getLogger("cudnn_graph").isEnabledFor(level)


def emit(stage: str, detail: dict) -> None:
    """Hand one event to the progress callback (the caller logs it)."""
    callback = _callback
    if callback is None:
        return
    try:
        callback(stage, detail)
    except Exception:                     # noqa: BLE001  (a progress display must not break a build)
        logger.warning("the progress callback raised on a %r event; ignored", stage, exc_info=True)


class _Watch:
    """One step in progress: reported as ``"running"`` by the watcher thread once ``first_report`` has
    passed, then every ``HEARTBEAT_S``; ``__exit__`` reports ``"done"`` when ``always_done`` or when it
    was reported running. Entering and leaving take no lock and log nothing (a reference run is one)."""

    __slots__ = ("stage", "engine", "what", "started", "next_report", "reported", "always_done", "log", "verbs")

    def __init__(self, stage: str, engine: str, what: str, first_report: float, always_done: bool,
                 log: logging.Logger, verbs: tuple):
        self.stage, self.engine, self.what, self.log, self.verbs = stage, engine, what, log, verbs
        self.always_done = always_done
        self.reported = False
        self.started = self.next_report = first_report     # made absolute by __enter__

    def detail(self, state: str, now: float) -> dict:
        return {"engine": self.engine, "what": self.what, "state": state,
                "elapsed_s": round(now - self.started, 3)}

    def __enter__(self) -> "_Watch":
        now = _monotonic()
        self.next_report += now
        self.started = now
        _active[id(self)] = self
        if _watcher.thread is None:
            _watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        del _active[id(self)]
        if self.reported or self.always_done:
            now = _monotonic()
            self.log.info("%s: %s %s in %.2f s", self.engine, self.verbs[1], self.what, now - self.started)
            emit(self.stage, self.detail("done", now))

    @property
    def elapsed_s(self) -> float:
        return _monotonic() - self.started


_monotonic = time.monotonic
_active: dict = {}        # id(watch) -> each _Watch in progress (dict operations are atomic: no lock)


class _Watcher:
    """The daemon thread that reports the watched steps still in progress; it ends after
    ``_IDLE_POLLS`` polls with nothing watched, and the next watch starts another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        with self._lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="cudnn_graph-progress", daemon=True)
                self.thread.start()

    def _idle_exit(self) -> bool:
        """Whether to end the thread now: nothing is watched, checked again after ``thread`` is cleared
        (a watch entered meanwhile read ``thread`` as set, so this thread must go on)."""
        with self._lock:
            current, self.thread = self.thread, None
            if _active:
                self.thread = current
                return False
            return True

    def _run(self) -> None:
        idle = 0
        while True:
            time.sleep(POLL_S)
            try:
                watches = list(_active.values())
            except RuntimeError:          # changed size while copied (a build without the GIL's guarantee)
                continue
            if not watches:
                idle += 1
                if idle >= _IDLE_POLLS and self._idle_exit():
                    return
                continue
            idle = 0
            now = _monotonic()
            for w in watches:
                if now >= w.next_report:
                    w.next_report = now + HEARTBEAT_S
                    w.reported = True
                    w.log.info("%s: still %s %s (%.0f s so far)", w.engine, w.verbs[0], w.what, now - w.started)
                    emit(w.stage, w.detail("running", now))


_watcher = _Watcher()


def compiling(engine: str, what: str, log: logging.Logger = logger) -> _Watch:
    """``with compiling(engine, what):`` around a kernel compile: an INFO line and a ``"compile"``
    ``"start"`` event now, a "still compiling" line every ``HEARTBEAT_S``, and "done in N s" at the end
    ("compiled ... in N s"; ``watch.elapsed_s`` reads the time so far)."""
    log.info("%s: compiling %s (a first compile can take tens of seconds)", engine, what)
    emit("compile", {"engine": engine, "what": what, "state": "start", "elapsed_s": 0.0})
    return _Watch("compile", engine, what, HEARTBEAT_S, True, log, ("compiling", "compiled"))


def long_run(engine: str, what: str, log: logging.Logger = logger) -> _Watch:
    """``with long_run(engine, what):`` around a run that is usually short: nothing is logged unless it
    takes longer than ``LONG_RUN_S``; then "still running" every ``HEARTBEAT_S`` and "ran ... in N s"."""
    return _Watch("run", engine, what, LONG_RUN_S, False, log, ("running", "ran"))
