"""PlanEntryError ("no engine supports this graph") names every engine's decline on its first line, shortened,
so a caller that shows one line (a test runner's skip reason, a log line) still says who declined and why."""
from __future__ import annotations

import pytest

import cudnn_graph as cudnn
from cudnn_graph import PlanEntryError
from cudnn_graph.engines import manifest
from cudnn_graph.engines.reference import ReferenceEngine

VERSION_DECLINE = ("a graph with override shapes enabled (dynamic shapes) needs cuDNN >= 9.21.0; "
                   "the loaded cuDNN is 9.19.0")


def test_the_first_line_carries_each_engines_reason():
    exc = PlanEntryError("no engine supports this graph", [
        ("reference", "the reference engine runs host graphs; this graph is on cuda"),
        ("cudnn_backend", VERSION_DECLINE)])
    first, *rest = str(exc).splitlines()
    assert first == ("no engine supports this graph (reference: the reference engine runs host graphs; this "
                     f"graph is on cuda; cudnn_backend: {VERSION_DECLINE})")
    assert rest == ["  - reference: the reference engine runs host graphs; this graph is on cuda",
                    f"  - cudnn_backend: {VERSION_DECLINE}"]


def test_long_reasons_are_cut_and_many_declines_counted():
    long = "cuDNN's heuristics offered no engine for this graph " + "x" * 400
    declines = [(f"eng{i}", long) for i in range(6)] + [("last", "short")]
    declines[1] = ("eng1", "two\n  lines")
    exc = PlanEntryError("no plan of the list could be built", declines)
    first = str(exc).splitlines()[0]
    assert first.startswith("no plan of the list could be built (eng0: cuDNN's heuristics offered no engine")
    assert "eng1: two lines;" in first
    assert "..." in first and "eng3:" in first and "eng4:" not in first and first.endswith("; 3 more below)")
    assert len(first) < 800
    assert str(exc).count("\n  - ") == 7      # every decline in full below
    assert PlanEntryError("nothing", []).args[0] == "nothing"


@pytest.fixture
def reference_only(monkeypatch):
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def test_a_declined_build_says_why_on_its_first_line(reference_only):
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cuda")
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    g.relu(x).set_output(True)
    with pytest.raises(PlanEntryError) as info:
        g.build()
    assert str(info.value).splitlines()[0] == ("no engine supports this graph (reference: the reference engine "
                                               "runs host graphs; this graph is on cuda)")
