"""The persistent plan cache (cudnn_graph.plan_cache): a graph planned before is not planned again (in this
process or a fresh one), a corrupt, foreign or other-version entry is a miss that is replaced, two
processes storing one key leave a valid entry, and the opt-in switches (set_plan_cache,
$CUDNN_GRAPH_PLAN_CACHE, graph.use_plan_cache) do what they say."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cudnn_graph as cudnn
from _blob_headers import with_header
from cudnn_graph import _plan_blob, plan_cache, plan_serialization
from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache

F = cudnn.data_type

GRAPH_SOURCE = """
import numpy as np, cudnn_graph as cudnn
def make(m=4):
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[1, m, 3], stride=[3 * m, 3, 1], uid=1)
    b = g.tensor(name="b", dim=[1, 3, 2], stride=[6, 2, 1], uid=2)
    g.relu(g.matmul(a, b)).set_output(True).set_uid(3)
    return g
def run(g, m=4):
    out = np.zeros((1, m, 2), np.float32)
    g.execute({1: np.arange(3 * m, dtype=np.float32).reshape(1, m, 3) - 3, 2: np.ones((1, 3, 2), np.float32), 3: out})
    return out
"""
_ns: dict = {}
exec(GRAPH_SOURCE, _ns)
make, run = _ns["make"], _ns["run"]


@pytest.fixture(autouse=True)
def no_process_cache(monkeypatch):
    monkeypatch.delenv(plan_cache.ENV_PLAN_CACHE, raising=False)
    previous = plan_cache._process_choice
    plan_cache._process_choice = plan_cache._UNSET
    yield
    plan_cache._process_choice = previous


@pytest.fixture
def no_planning(monkeypatch):
    """Make any engine's proposal fail: a graph that plans raises."""
    from cudnn_graph.engines import manifest

    def refuse(*_a, **_k):
        raise AssertionError("the graph was planned (heuristics ran)")
    for engine in manifest.engines():
        monkeypatch.setattr(engine, "propose_plans", refuse)
        monkeypatch.setattr(engine, "propose_plans_for_modes", refuse, raising=False)


def _entry_path(folder, graph) -> str:
    return KernelDiskCache(folder).path_for(plan_cache.plan_key(graph))


def test_a_graph_planned_before_loads_its_plan_from_the_cache(tmp_path, monkeypatch):
    g = make().use_plan_cache(str(tmp_path))
    g.build()
    want = run(g)
    assert os.path.exists(_entry_path(tmp_path, make()))
    from cudnn_graph.engines import manifest
    for engine in manifest.engines():
        monkeypatch.setattr(engine, "propose_plans", lambda *_a, **_k: pytest.fail("planned again"))
    h = make().use_plan_cache(str(tmp_path))
    h.build()
    assert h.get_execution_plan_count() == 1 and h.selected_plan.engine_id == g.selected_plan.engine_id
    assert run(h).tobytes() == want.tobytes()


def test_the_explicit_lifecycle_is_served_too(tmp_path, request):
    cudnn.set_plan_cache(str(tmp_path))
    plan_cache.record_choice(_built(make()))
    request.getfixturevalue("no_planning")
    g = make()
    g.create_execution_plans([cudnn.heur_mode.A])
    g.check_support()
    g.build_plans()
    assert g.plans[0].source == "deserialized" and run(g).shape == (1, 4, 2)


def _built(g, cache=None):
    if cache is not None:
        g.use_plan_cache(cache)
    g.build()
    return g


def test_another_structure_misses(tmp_path):
    _built(make(), str(tmp_path))
    other = _built(make(m=5), str(tmp_path))
    assert plan_cache.lookup(make(m=5).use_plan_cache(str(tmp_path)))["plan"] == other.selected_plan.label
    assert len(os.listdir(tmp_path)) >= 1


def test_hits_and_misses_are_logged_at_info(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="cudnn_graph.plan_cache"):
        _built(make(), str(tmp_path))
        _built(make(), str(tmp_path))
    messages = [r.getMessage() for r in caplog.records if r.name == "cudnn_graph.plan_cache"]
    assert any(m.startswith("plan cache miss") for m in messages)
    assert any(m.startswith("plan cache hit") and "loaded plan 'reference'" in m for m in messages)


def test_hits_and_misses_reach_the_progress_callback(tmp_path):
    events = []
    previous = cudnn.set_progress_callback(lambda stage, detail: events.append((stage, detail)))
    try:
        _built(make(), str(tmp_path))
        _built(make(), str(tmp_path))
    finally:
        cudnn.set_progress_callback(previous)
    hits = [d["hit"] for stage, d in events if stage == "plan_cache"]
    assert hits == [False, True]


def test_a_corrupt_entry_is_a_miss_that_is_replaced(tmp_path, caplog):
    _built(make(), str(tmp_path))
    path = _entry_path(tmp_path, make())
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING):
        g = _built(make(), str(tmp_path))
    assert run(g).shape == (1, 4, 2)
    assert any("invalid" in r.getMessage() for r in caplog.records)
    assert plan_cache.lookup(make().use_plan_cache(str(tmp_path))) is not None     # stored again


def test_a_truncated_entry_is_a_miss(tmp_path):
    _built(make(), str(tmp_path))
    path = _entry_path(tmp_path, make())
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    _built(make(), str(tmp_path))
    assert open(path, "rb").read() == data or os.path.getsize(path) > len(data) // 2


@pytest.mark.parametrize("field", ["library_version", "format_version", "arch"])
def test_an_entry_holding_a_blob_of_another_version_is_discarded_and_the_graph_planned(tmp_path, field, caplog):
    g = _built(make(), str(tmp_path))
    key = plan_cache.plan_key(g)
    other = {"library_version": _plan_blob.pack_version(0, 0, 1), "format_version": 99, "arch": 90}[field]
    cache = KernelDiskCache(str(tmp_path), max_bytes=None)
    cache.store(key, with_header(g.serialize(as_bytes=True), **{field: other}), {"plan": "stale"})
    with caplog.at_level(logging.INFO):
        h = _built(make(), str(tmp_path))
    assert run(h).tobytes() == run(g).tobytes()
    assert any("did not load" in r.getMessage() for r in caplog.records)
    assert plan_cache.lookup(make().use_plan_cache(str(tmp_path)))["plan"] == "reference"   # replaced


def test_the_key_holds_the_versions_and_the_device(monkeypatch):
    key = plan_cache.plan_key(make())
    assert key.arch == "host" and key.driver_version == "none"
    assert key.kernel_class["graph"] == make().key()
    monkeypatch.setattr(plan_serialization, "library_version", lambda: _plan_blob.pack_version(7, 0, 0))
    assert plan_cache.plan_key(make()).digest() != key.digest()


def test_set_plan_cache_and_the_environment_turn_the_cache_on_for_every_graph(tmp_path, monkeypatch):
    assert plan_cache.get_plan_cache() is None
    monkeypatch.setenv(plan_cache.ENV_PLAN_CACHE, str(tmp_path / "env"))
    assert plan_cache.get_plan_cache().root == str(tmp_path / "env")
    _built(make())
    assert plan_cache.lookup(make()) is not None
    cudnn.set_plan_cache(None)                 # overrides the environment
    assert plan_cache.get_plan_cache() is None and plan_cache.lookup(make()) is None
    cudnn.set_plan_cache(tmp_path / "set")
    assert plan_cache.get_plan_cache().root == str(tmp_path / "set")
    monkeypatch.setenv(plan_cache.ENV_PLAN_CACHE, "off")
    cudnn.set_plan_cache(None)
    plan_cache._process_choice = plan_cache._UNSET
    assert plan_cache.get_plan_cache() is None


def test_use_plan_cache_false_keeps_a_graph_out_of_the_process_cache(tmp_path):
    cudnn.set_plan_cache(str(tmp_path))
    _built(make().use_plan_cache(False))
    assert os.listdir(tmp_path) == [] or plan_cache.lookup(make()) is None


def test_bad_cache_arguments_raise_typed_errors():
    with pytest.raises(cudnn.InvalidArgumentTypeError):
        cudnn.set_plan_cache(42)
    with pytest.raises(cudnn.InvalidArgumentTypeError):
        make().use_plan_cache(3.5)


def test_record_choice_stores_another_plan_index_and_lookup_reports_it(tmp_path):
    g = make().use_plan_cache(str(tmp_path))
    g.build()
    assert plan_cache.record_choice(g, 0) is True
    assert plan_cache.record_choice(g, g.plans[0]) is True
    assert plan_cache.lookup(g) == {"plan": "reference", "engine": "reference", "engine_id": 20000,
                                    "size": plan_cache.lookup(g)["size"]}
    with pytest.raises(cudnn.InvalidArgumentTypeError):
        plan_cache.record_choice(g, "fastest")


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd="/tmp", timeout=120)


def test_a_fresh_process_with_a_warm_cache_skips_planning(tmp_path):
    env = {plan_cache.ENV_PLAN_CACHE: str(tmp_path), "CUDNN_GRAPH_LOG": ""}
    first = _python(GRAPH_SOURCE + "g = make(); g.build(); print(run(g).tobytes().hex())", env)
    assert first.returncode == 0, first.stderr
    second = _python(GRAPH_SOURCE + """
import logging
from cudnn_graph.engines import manifest
def refuse(*a, **k):
    raise AssertionError("planned in the fresh process")
for engine in manifest.engines():
    engine.propose_plans = refuse
    engine.propose_plans_for_modes = refuse
logging.basicConfig(level=logging.INFO)
g = make(); g.build(); print(run(g).tobytes().hex())
""", env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert "plan cache hit" in second.stderr


def test_two_processes_storing_one_key_leave_a_valid_entry(tmp_path):
    env = {plan_cache.ENV_PLAN_CACHE: str(tmp_path)}
    code = GRAPH_SOURCE + """
from cudnn_graph import plan_cache
for _ in range(40):
    g = make(); g.use_plan_cache(True); g.build()
    assert plan_cache.record_choice(g), "not stored"
print("ok")
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **env}, cwd="/tmp") for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0 and out.strip() == "ok", err
    cudnn.set_plan_cache(str(tmp_path))
    g = make()
    g.build()
    assert g.plans[0].source != "fallback" and run(g).shape == (1, 4, 2)
    entries = [n for d in os.listdir(tmp_path) for n in os.listdir(tmp_path / d)]
    assert [n for n in entries if n.endswith(".kernel")] and not [n for n in entries if n.startswith(".tmp-")]
    assert plan_cache.lookup(make())["plan"] == "reference"


def test_a_stored_plan_this_graphs_filters_decline_is_a_miss_that_keeps_the_entry(tmp_path, monkeypatch):
    _built(make(), str(tmp_path))
    from cudnn_graph.engines import manifest

    def decline(self, graph, plan):
        raise cudnn.GraphNotSupportedError("deselected here")
    reference = next(e for e in manifest.engines() if e.name == "reference")
    monkeypatch.setattr(type(reference), "check_support", decline)
    g = make().use_plan_cache(str(tmp_path))
    with pytest.raises(cudnn.GraphNotSupportedError, match="deselected here"):
        g.build()                       # planned afresh: the filter declines the fresh plan too
    assert plan_cache.lookup(make().use_plan_cache(str(tmp_path))) is not None
