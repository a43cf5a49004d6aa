"""Deferred proposals (create_execution_plans): an engine whose plans all rank below every plan already
proposed (the cuDNN backend behind a Python engine's plan) is asked only when the plan list is read past
them, so a build whose first plan builds skips its heuristics queries. The list a reader sees is the same
as if every engine had been asked at once."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph.engines import manifest
from cudnn_graph.engines.base import BaseEngine, CompiledPlan, PlanConfig
from cudnn_graph.errors import GraphNotSupportedError
from cudnn_graph import PlanEntryError
from cudnn_graph.router import PreferFamily

F = cudnn.data_type
FAST_ID, SLOW_ID = 30000 + 40, 30000 + 50


class _Plan(CompiledPlan):
    def execute(self, graph, variant_pack, ctx):
        pass


class _FastEngine(BaseEngine):
    """Proposes ranked plans (priority 10); ``fail`` makes every build decline."""
    name = "fast"
    engine_id = FAST_ID
    binds_provisional_strides = False

    def __init__(self, count=2, fail=False):
        self.count, self.fail = count, fail

    def propose_plans(self, graph):
        return [PlanConfig(FAST_ID + i, name=f"fast-{i}", priority=10.0 - i) for i in range(self.count)]

    def build_plan(self, graph, plan, ctx):
        if self.fail:
            raise GraphNotSupportedError(f"{plan.name}: no kernel here")
        return _Plan(plan, 0)


class _SlowEngine(BaseEngine):
    """Stands for the cuDNN backend: deferrable, priority 0, counts how often it is asked."""
    name = "slow"
    engine_id = SLOW_ID
    binds_provisional_strides = False
    max_priority = 0.0

    def __init__(self, decline_now=False, decline_later=False):
        self.asked = 0
        self.decline_now, self.decline_later = decline_now, decline_later

    def deferred_proposals(self, graph, modes):
        if self.decline_now:
            raise GraphNotSupportedError("slow: not this device")
        return self._propose

    def _propose(self):
        self.asked += 1
        if self.decline_later:
            raise GraphNotSupportedError("slow: heuristics offered nothing")
        return [PlanConfig(SLOW_ID + i, name=f"slow-{i}") for i in range(3)]

    def propose_plans(self, graph):
        return self._propose()

    def build_plan(self, graph, plan, ctx):
        return _Plan(plan, 0)


@pytest.fixture
def engines(monkeypatch):
    def install(*engines):
        monkeypatch.setattr(manifest, "_loaded", list(engines))
        return engines
    return install


def _graph(router=None):
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu", router=router)
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    g.relu(x).set_output(True)
    return g


def test_a_build_whose_first_plan_builds_never_asks_the_deferred_engine(engines):
    fast, slow = engines(_FastEngine(), _SlowEngine())
    g = _graph()
    g.build()
    assert slow.asked == 0
    assert g.selected_plan.name == "fast-0"


def test_reading_the_plan_list_asks_once_and_appends_below_every_listed_plan(engines):
    fast, slow = engines(_FastEngine(), _SlowEngine())
    g = _graph()
    g.build()
    assert [p.name for p in g.plans] == ["fast-0", "fast-1", "slow-0", "slow-1", "slow-2"]
    assert g.get_execution_plan_count() == 5
    assert slow.asked == 1
    assert g.selected_plan.name == "fast-0"          # no index moved


def test_the_deferred_engine_is_asked_when_every_listed_plan_declines(engines):
    fast, slow = engines(_FastEngine(fail=True), _SlowEngine())
    g = _graph()
    g.build()
    assert slow.asked == 1
    assert g.selected_plan.name == "slow-0"
    assert any("fast-0" in who for who, _ in g.declines)


def test_a_deferred_decline_lands_in_the_declines_of_the_error(engines):
    engines(_FastEngine(fail=True), _SlowEngine(decline_later=True))
    g = _graph()
    with pytest.raises(PlanEntryError, match="heuristics offered nothing"):
        g.build()


def test_a_cheap_decline_is_immediate(engines):
    fast, slow = engines(_FastEngine(), _SlowEngine(decline_now=True))
    g = _graph()
    g.build()
    assert ("slow", "slow: not this device") in g.declines
    assert slow.asked == 0


def test_another_router_sees_every_proposal_at_once(engines):
    fast, slow = engines(_FastEngine(), _SlowEngine())
    g = _graph(router=PreferFamily("external"))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans()
    assert slow.asked == 1


def test_without_a_plan_above_it_the_engine_is_asked_at_once(engines):
    (slow,) = engines(_SlowEngine())
    g = _graph()
    g.build()
    assert slow.asked == 1 and g.selected_plan.name == "slow-0"


def test_select_plan_past_the_listed_plans_asks_the_deferred_engine(engines):
    fast, slow = engines(_FastEngine(), _SlowEngine())
    g = _graph()
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans()
    g.select_plan(3)
    g.build_plans()
    assert g.selected_plan.name == "slow-1" and slow.asked == 1


def test_a_deferred_plan_runs(engines):
    engines(_FastEngine(fail=True), _SlowEngine())
    g = _graph()
    g.build()
    X = np.ones((2, 3), np.float32)
    g.execute({"x": X, g.get_outputs()[0]: np.empty_like(X)})
