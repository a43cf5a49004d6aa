"""What a build tells its user: one INFO line per build (key, plan, engine, times), a DEBUG line per
decline, progress events to ``set_progress_callback``'s callback, ``CUDNN_GRAPH_LOG`` for a stderr log;
and what execute() tells nobody: no logging call on its path."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

cg = pytest.importorskip("cudnn_graph")
from cudnn_graph import _progress                              # noqa: E402
from cudnn_graph.engines import manifest                       # noqa: E402
from cudnn_graph.engines.base import BaseEngine                # noqa: E402
from cudnn_graph.engines.reference import engine as reference  # noqa: E402

F = cg.data_type


class DecliningEngine(BaseEngine):
    """An out-of-tree engine that declines every graph (the host box has no other engine to decline)."""
    name, engine_id = "declines_all", 30_926

    def propose_plans(self, graph):
        raise cg.GraphNotSupportedError("it runs no graph at all")


@pytest.fixture
def declining_engine():
    manifest.register_engine(engine := DecliningEngine())
    try:
        yield engine
    finally:
        manifest.unregister_engine(engine)


@pytest.fixture
def events():
    got = []
    previous = cg.set_progress_callback(lambda stage, detail: got.append((stage, detail)))
    yield got
    cg.set_progress_callback(previous)


def host_graph(name="mm"):
    g = cg.pygraph(name=name, io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1])
    b = g.tensor(name="B", dim=[1, 8, 2], stride=[16, 2, 1])
    c = g.relu(g.matmul(a, b)).set_output(True)
    pack = {a: np.ones((1, 4, 8), np.float32), b: np.ones((1, 8, 2), np.float32), c: np.zeros((1, 4, 2), np.float32)}
    return g, pack


def _records(caplog, level):
    return [r for r in caplog.records if r.name.startswith("cudnn_graph") and r.levelno == level]


# ----------------------------------------------------------------------------------------- the build line

def test_a_host_build_logs_one_info_line_with_the_plan_and_its_times(caplog):
    caplog.set_level(logging.INFO, logger="cudnn_graph")
    g, _ = host_graph()
    g.build([cg.heur_mode.A])
    lines = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"graph 'mm' (key {g.key()[:8]}): built plan 0/"), line
    assert "'reference' (engine reference) in " in line and " ms (planning " in line, line


def test_a_build_from_its_steps_logs_the_line_too(caplog):
    caplog.set_level(logging.INFO, logger="cudnn_graph")
    g, _ = host_graph()
    g.create_execution_plans()
    g.check_support()
    g.build_plans()
    assert [r for r in _records(caplog, logging.INFO) if "built plan" in r.getMessage()]


def test_declines_are_debug_lines_naming_the_engine_and_its_reason(caplog, declining_engine):
    caplog.set_level(logging.DEBUG, logger="cudnn_graph")
    g, _ = host_graph()
    g.build()
    debug = [r.getMessage() for r in _records(caplog, logging.DEBUG)]
    assert "graph 'mm': declines_all declined: it runs no graph at all" in debug, debug
    # Other engines present in this process (e.g. the cuDNN backend, listed even without libcudnn) decline
    # a host graph too: the INFO line counts every DEBUG decline line.
    declines = [m for m in debug if " declined: " in m]
    info = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert len(info) == 1 and f"{len(declines)} declined" in info[0], info


def test_nothing_is_logged_at_the_default_level(caplog, declining_engine):
    caplog.set_level(logging.WARNING)
    g, pack = host_graph()
    g.build()
    g.execute(pack)
    assert not [r for r in caplog.records if r.name.startswith("cudnn_graph")]


# ----------------------------------------------------------------------------------- progress callback

def test_the_progress_callback_gets_declines_and_the_build(events, declining_engine):
    g, _ = host_graph()
    g.build()
    stages = [stage for stage, _ in events]
    assert stages[-1] == "build" and set(stages[:-1]) == {"decline"}, events
    declines = [detail for stage, detail in events if stage == "decline"]
    build = events[-1][1]
    assert {"graph": "mm", "engine": "declines_all", "reason": "it runs no graph at all"} in declines
    assert build["plan"] == "reference" and build["engine"] == "reference" and build["key"] == g.key()[:8]
    assert build["build_ms"] >= build["planning_ms"] > 0 and build["compile_ms"] is None
    assert build["declined"] == len(declines) and build["index"] == 0


def test_a_callback_that_raises_is_logged_and_the_build_goes_on(caplog):
    def broken(stage, detail):
        raise RuntimeError("display gone")
    previous = cg.set_progress_callback(broken)
    try:
        g, pack = host_graph()
        g.build()
        g.execute(pack)
    finally:
        cg.set_progress_callback(previous)
    assert any("progress callback raised" in r.getMessage() for r in _records(caplog, logging.WARNING))
    assert pack[g.get_outputs()[0]].sum() == 64.0


def test_set_progress_callback_takes_a_callable_or_none():
    with pytest.raises(cg.errors.InvalidArgumentTypeError, match="set_progress_callback"):
        cg.set_progress_callback(42)
    assert cg.set_progress_callback(None) is None


@pytest.fixture
def fast_watch(monkeypatch):
    """Progress reports within a fraction of a second instead of seconds."""
    monkeypatch.setattr(_progress, "POLL_S", 0.02)
    monkeypatch.setattr(_progress, "HEARTBEAT_S", 0.15)
    monkeypatch.setattr(_progress, "LONG_RUN_S", 0.1)


def test_a_long_compile_reports_start_running_and_done(events, fast_watch, caplog):
    caplog.set_level(logging.INFO, logger="cudnn_graph")
    log = logging.getLogger("cudnn_graph.engines.toy")
    with _progress.compiling("toy", "kernel k", log) as watch:
        time.sleep(0.8)                  # > HEARTBEAT_S plus the watcher's first poll
        seconds = watch.elapsed_s
    states = [d["state"] for stage, d in events if stage == "compile"]
    assert states[0] == "start" and states[-1] == "done" and "running" in states, states
    assert seconds >= 0.8 and events[-1][1]["elapsed_s"] >= 0.8
    lines = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert lines[0] == "toy: compiling kernel k (a first compile can take tens of seconds)"
    assert any(line.startswith("toy: still compiling kernel k (") for line in lines), lines
    assert lines[-1].startswith("toy: compiled kernel k in "), lines


def test_a_long_reference_run_is_reported_while_it_runs(events, fast_watch, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="cudnn_graph")
    g, pack = host_graph()
    g.build()
    real = reference.run_steps

    def slow(steps, values):
        time.sleep(0.6)
        real(steps, values)

    monkeypatch.setattr(reference, "run_steps", slow)
    g.execute(pack)
    runs = [d for stage, d in events if stage == "run"]
    assert [d["state"] for d in runs][-1] == "done" and "running" in [d["state"] for d in runs], runs
    assert runs[-1]["engine"] == "reference" and "graph 'mm' (2 nodes)" in runs[-1]["what"]
    assert any(r.getMessage().startswith("reference: ran graph 'mm' (2 nodes) in ")
               for r in _records(caplog, logging.INFO))


def test_a_short_reference_run_reports_nothing(events, fast_watch):
    g, pack = host_graph()
    g.build()
    del events[:]
    g.execute(pack)
    time.sleep(0.2)
    assert events == []


# --------------------------------------------------------------------------------- the execute path

def test_execute_makes_no_logging_call(monkeypatch, caplog, events):
    """1000 executes with the logger at DEBUG and a callback set: no Logger method is called."""
    caplog.set_level(logging.DEBUG, logger="cudnn_graph")
    g, pack = host_graph()
    g.build()
    g.execute(pack)
    calls = []
    for method in ("debug", "info", "warning", "error", "exception", "critical", "log", "isEnabledFor",
                   "getEffectiveLevel", "_log", "handle"):
        real = getattr(logging.Logger, method)
        monkeypatch.setattr(logging.Logger, method,
                            lambda self, *a, _m=method, _real=real, **k: (calls.append((self.name, _m)),
                                                                          _real(self, *a, **k))[1])
    del events[:]
    for _ in range(1000):
        g.execute(pack)
    monkeypatch.undo()
    assert calls == [] and events == []


# --------------------------------------------------------------------------------- CUDNN_GRAPH_LOG

_SCRIPT = textwrap.dedent("""
    import numpy as np
    import cudnn_graph as cg
    from cudnn_graph.engines import manifest
    from cudnn_graph.engines.base import BaseEngine
    class DecliningEngine(BaseEngine):
        name, engine_id = "declines_all", 30_926
        def propose_plans(self, graph):
            raise cg.GraphNotSupportedError("it runs no graph at all")
    manifest.register_engine(DecliningEngine())
    F = cg.data_type
    g = cg.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
    a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1])
    b = g.tensor(name="B", dim=[1, 8, 2], stride=[16, 2, 1])
    c = g.matmul(a, b).set_output(True)
    g.build()
    g.execute({a: np.ones((1, 4, 8), np.float32), b: np.ones((1, 8, 2), np.float32),
               c: np.zeros((1, 4, 2), np.float32)})
    print("ok")
""")


def _run_with_log_env(value):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("CUDNN_GRAPH_LOG", None)
    if value is not None:
        env["CUDNN_GRAPH_LOG"] = value
    result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    return result.stderr


def test_cudnn_graph_log_debug_prints_the_build_and_the_declines_to_stderr():
    err = _run_with_log_env("debug")
    assert "INFO cudnn_graph.graph: graph (key " in err and "built plan 0/1 'reference'" in err, err
    assert "DEBUG cudnn_graph.graph: graph: declines_all declined: it runs no graph at all" in err, err


def test_cudnn_graph_log_info_prints_the_build_line_only():
    err = _run_with_log_env("INFO")
    assert "built plan 0/1 'reference'" in err and "DEBUG" not in err, err


def test_without_cudnn_graph_log_nothing_is_printed():
    assert _run_with_log_env(None) == ""
    assert _run_with_log_env("off") == ""


def test_an_unknown_cudnn_graph_log_value_warns_and_installs_nothing():
    from cudnn_graph import _log_env
    with pytest.warns(RuntimeWarning, match="CUDNN_GRAPH_LOG='loud' is not one of debug, info, warning"):
        assert _log_env.install_from_environment({"CUDNN_GRAPH_LOG": "loud"}) is None
