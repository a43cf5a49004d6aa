"""Contract tests of the graph IR and the plan list (docs: /work/shared/ARCHITECTURE.md, "Graph IR" and
"Engines and the plan list").

A toy python engine (registered with ``register_engine`` under an out-of-tree id, removed again by its
fixture) proves the engine contract end to end: proposals rank into one plan list next to the reference
engine, a decline (``NotImplementedError`` / ``GraphNotSupportedError``) advances, a pinned decline raises,
anything else propagates unchanged, and ``execute`` hands the engine VariantPack slots only.
"""
from __future__ import annotations

import json
import sys

import ml_dtypes
import numpy as np
from _helpers import host_address
import pytest

import cudnn_graph as cudnn
from cudnn_graph import GraphFrozenError, GraphNotSupportedError, GraphValidationError, PlanEntryError
from cudnn_graph.engines import manifest
from cudnn_graph.engines.base import BaseEngine, CompiledPlan, ExecutionContext, PlanConfig
from cudnn_graph.engines.reference import ReferenceEngine
from cudnn_graph.ops import SCHEMAS
from cudnn_graph.router import Router, get_default_router, set_default_router

FLOAT, HALF = cudnn.data_type.FLOAT, cudnn.data_type.HALF
TOY_ID = 30_417


# ---------------------------------------------------------------------------------------- toy engine

class ToyPlan(CompiledPlan):
    """Runs ``Y = a + b`` reading and writing the slots through their own DLPack export."""

    def __init__(self, plan, graph, engine):
        super().__init__(plan, workspace_size=plan.workspace_size or 0)
        node = graph.nodes[0]
        self.a, self.b = node.inputs["a"].uid, node.inputs["b"].uid
        self.y = node.outputs["Y"].uid
        self.engine = engine

    def execute(self, graph, variant_pack, ctx):
        seen = self.engine.seen
        seen.append({
            "pack": type(variant_pack), "slots": [type(s) for s in variant_pack.slots],
            "uids": variant_pack.uids, "ctx": type(ctx), "workspace": type(ctx.workspace),
            "label": self.plan.label,
        })
        a = np.from_dlpack(variant_pack[self.a])
        b = np.from_dlpack(variant_pack[self.b])
        y = np.from_dlpack(variant_pack[self.y])
        y[...] = a + b + self.plan.knobs.get("bump", 0.0)


class ToyEngine(BaseEngine):
    """Claims graphs made of one ``add``; ``fail`` = (where, exception) makes it misbehave on purpose."""

    name = "toy"
    engine_id = TOY_ID
    binds_provisional_strides = False

    def __init__(self, plans=1, fail=None, priority=10.0):
        self.n_plans = plans
        self.fail = fail or (None, None)
        self.priority = priority
        self.seen = []
        self.built = []

    def propose_plans(self, graph):
        where, exc = self.fail
        if where == "propose":
            raise exc
        if [n.op for n in graph.nodes] != ["add"] or graph.device[0] != "cpu":
            raise NotImplementedError("toy runs one host add only")
        return [PlanConfig(TOY_ID, knobs={"bump": 0.0} if i == 0 else {"bump": 100.0}, name=f"toy-{i}",
                           priority=self.priority - i, workspace_size=64 * (i + 1))
                for i in range(self.n_plans)]

    def build_plan(self, graph, plan, ctx):
        assert isinstance(ctx, ExecutionContext)
        where, exc = self.fail
        if where == "build" and plan.name == "toy-0":
            raise exc
        self.built.append(plan.name)
        return ToyPlan(plan, graph, self)


@pytest.fixture
def register():
    """register(engine) adds an out-of-tree engine for this test only."""
    added = []

    def add(engine):
        manifest.register_engine(engine)
        added.append(engine)
        return engine

    yield add
    for engine in added:
        manifest.unregister_engine(engine)
    assert all(e.engine_id != TOY_ID for e in manifest.engines())


@pytest.fixture
def reference_only(monkeypatch):
    """The in-tree engine list reduced to the reference engine (machine independent plan lists)."""
    monkeypatch.setattr(manifest, "_loaded", [ReferenceEngine()])


def add_graph(**kw):
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device=kw.pop("device", "cpu"), **kw)
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1])
    b = g.tensor(name="b", dim=[2, 3], stride=[3, 1])
    y = g.add(a, b).set_output(True)
    return g, a, b, y


def buffers():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    return a, b, np.zeros((2, 3), np.float32)


# --------------------------------------------------------------------------------- engine contract

def test_toy_engine_proposes_builds_and_executes_on_slots_only(register, reference_only):
    toy = register(ToyEngine())
    g, a, b, y = add_graph()
    g.build()
    assert [p.label for p in g.plans] == ["toy-0", "reference"]
    assert g.plans[0].engine is toy and g.plans[0].engine_id == TOY_ID
    assert g.selected_plan.label == "toy-0"
    assert toy.built == ["toy-0"]
    assert g.get_workspace_size() == 64

    A, B, Y = buffers()
    g.execute({a: A, b: B, y: Y}, workspace=np.zeros(64, np.uint8))
    np.testing.assert_array_equal(Y, A + B)
    rec = toy.seen[-1]
    assert rec["pack"] is cudnn.VariantPack
    assert rec["slots"] == [cudnn.Slot] * 3
    assert rec["ctx"] is ExecutionContext
    assert rec["workspace"] is cudnn.Slot            # the caller's array never reaches the engine
    assert rec["uids"] == tuple(sorted((a.uid, b.uid, y.uid)))

    # Raw addresses and keys by uid or by name reach the engine as the same slots.
    Y2 = np.zeros_like(Y)
    g.execute({a.uid: host_address(A), "b": B, y: host_address(Y2)})
    np.testing.assert_array_equal(Y2, A + B)
    assert toy.seen[-1]["slots"] == [cudnn.Slot] * 3 and toy.seen[-1]["workspace"] is type(None)


def test_workspace_smaller_than_the_plan_needs_is_refused(register, reference_only):
    register(ToyEngine())
    g, a, b, y = add_graph()
    g.build()
    A, B, Y = buffers()
    with pytest.raises(ValueError, match="64"):
        g.execute({a: A, b: B, y: Y}, workspace=np.zeros(16, np.uint8))
    ws = np.zeros(64, np.uint8)
    g.execute({a: A, b: B, y: Y}, workspace=ws.ctypes.data)   # an address: sized by the plan
    np.testing.assert_array_equal(Y, A + B)


@pytest.mark.parametrize("where", ["propose", "build"])
@pytest.mark.parametrize("exc_type", [NotImplementedError, GraphNotSupportedError])
def test_a_decline_advances_to_the_next_entry(register, reference_only, where, exc_type):
    toy = register(ToyEngine(fail=(where, exc_type(f"toy declines in {where}"))))
    g, a, b, y = add_graph()
    g.build()
    assert g.selected_plan.label == "reference"
    labels = [p.label for p in g.plans]
    assert labels == (["reference"] if where == "propose" else ["toy-0", "reference"])
    who, why = g.declines[0]
    assert who in ("toy", "toy-0") and why == f"toy declines in {where}"
    A, B, Y = buffers()
    g.execute({a: A, b: B, y: Y})
    np.testing.assert_array_equal(Y, A + B)
    assert toy.seen == []


def test_a_pinned_decline_raises_and_names_the_plan(register, reference_only):
    register(ToyEngine(fail=("build", GraphNotSupportedError("no tiles for this shape"))))
    g, a, b, y = add_graph()
    g.build_operation_graph()
    g.create_execution_plans()
    g.select_plan(0)
    with pytest.raises(GraphNotSupportedError, match="pinned.*toy-0.*no tiles for this shape"):
        g.build_plans()
    g.select_plan(1)
    g.build_plans()
    assert g.selected_plan.label == "reference"


def test_pinning_a_plan_that_builds_selects_it(register, reference_only):
    toy = register(ToyEngine(plans=2))
    g, a, b, y = add_graph()
    g.build_operation_graph()
    g.create_execution_plans()
    g.select_plan(1)
    g.build_plans()
    assert g.selected_plan.label == "toy-1" and toy.built == ["toy-1"]
    A, B, Y = buffers()
    g.execute({a: A, b: B, y: Y}, workspace=np.zeros(128, np.uint8))
    np.testing.assert_array_equal(Y, A + B + 100.0)


@pytest.mark.parametrize("where", ["propose", "build"])
@pytest.mark.parametrize("exc", [RuntimeError("engine bug"), KeyError("missing knob"), ValueError("bad"),
                                 AssertionError("broken invariant")])
def test_any_other_exception_propagates_unchanged(register, reference_only, where, exc):
    register(ToyEngine(fail=(where, exc)))
    g, *_ = add_graph()
    with pytest.raises(type(exc)) as info:
        g.build()
    assert info.value is exc


def test_plan_list_is_one_shot(reference_only):
    g, *_ = add_graph()
    g.create_execution_plans()
    with pytest.raises(cudnn.AlreadyPlannedError, match="already"):
        g.create_execution_plans()
    with pytest.raises(cudnn.AlreadyPlannedError, match="already"):
        g.build()


def test_build_plans_all_policy_builds_every_entry(register, reference_only):
    toy = register(ToyEngine(plans=2))
    g, *_ = add_graph()
    g.build_operation_graph()
    g.create_execution_plans()
    g.build_plans(cudnn.build_plan_policy.ALL)
    assert toy.built == ["toy-0", "toy-1"]
    assert g.selected_plan.label == "toy-0"


def test_plan_list_apis_before_planning_raise():
    g, *_ = add_graph()
    assert g.get_execution_plan_count() == 0      # cudnn.pygraph's answer for an unplanned graph
    for call in (lambda: g.plans, lambda: g.select_plan(0),
                 lambda: g.get_plan_name_at_index(0), lambda: g.build_plans(), g.check_support):
        with pytest.raises(cudnn.NotPlannedError, match="create_execution_plans"):
            call()
    with pytest.raises(cudnn.NotBuiltError, match="no plan is built"):
        g.execute({})


# -------------------------------------------------------------------------------------- at-index APIs

def test_at_index_apis_address_the_ranked_list(register, reference_only):
    toy = register(ToyEngine(plans=2))
    g, a, b, y = add_graph()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    assert g.get_execution_plan_count() == 3
    assert [g.get_plan_name_at_index(i) for i in range(3)] == ["toy-0", "toy-1", "reference"]
    assert g.get_workspace_size_plan_at_index(1) == 128
    assert g.get_workspace_size_plan_at_index(2) == 0
    g.build_plan_at_index(0)
    g.build_plan_at_index(0)                      # built once, cached
    assert toy.built == ["toy-1", "toy-0"]

    A, B, _ = buffers()
    outs = [np.zeros((2, 3), np.float32) for _ in range(3)]
    for i, out in enumerate(outs):
        g.execute_plan_at_index({a: A, b: B, y: out}, np.zeros(128, np.uint8), index=i)
    np.testing.assert_array_equal(outs[0], A + B)
    np.testing.assert_array_equal(outs[1], A + B + 100.0)
    np.testing.assert_array_equal(outs[2], A + B)
    assert [r["label"] for r in toy.seen] == ["toy-0", "toy-1"]

    for bad in (3, -1, 99):
        for call in (g.get_plan_name_at_index, g.build_plan_at_index, g.get_workspace_size_plan_at_index,
                     g.select_plan, lambda i: g.execute_plan_at_index({}, None, index=i)):
            with pytest.raises(IndexError):
                call(bad)


# ------------------------------------------------------------------------------ plan list contents

def test_plan_entries_and_declines(register, reference_only):
    register(ToyEngine())
    g, *_ = add_graph()
    g.create_execution_plans()
    for p in g.plans:
        assert isinstance(p, PlanConfig) and isinstance(p.engine, BaseEngine)
        assert p.label and p.source == "python"
    assert g.plans[0].priority > g.plans[1].priority
    assert g.declines == []

    # A graph the toy engine does not claim: its reason is in the list, the reference runs it.
    g2 = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    x = g2.tensor(name="x", dim=[4], stride=[1])
    g2.relu(x).set_output(True)
    g2.build()
    assert g2.declines == [("toy", "toy runs one host add only")]
    assert [p.label for p in g2.plans] == ["reference"]


def test_cuda_graph_on_cpu_machine_says_who_declined_and_why(register, reference_only):
    register(ToyEngine())
    g, *_ = add_graph(device="cuda")
    assert g.device == ("cuda", 0)
    with pytest.raises(PlanEntryError) as info:
        g.build()
    err = info.value
    assert isinstance(err, GraphNotSupportedError)
    msg = str(err)
    assert "no engine supports this graph" in msg
    assert "reference: the reference engine runs host graphs; this graph is on cuda" in msg
    assert "toy: toy runs one host add only" in msg
    assert dict(err.declines)["reference"].startswith("the reference engine runs host graphs")
    assert g.plans == []


def test_an_op_without_a_reference_kernel_is_declined_by_name(reference_only, monkeypatch):
    from cudnn_graph.engines.reference import engine as reference_engine
    monkeypatch.delitem(reference_engine.KERNELS, "gdn", raising=False)
    g = cudnn.pygraph(io_data_type=HALF, device="cpu")
    T, H, K, V = 8, 2, 4, 4
    q = g.tensor(name="q", dim=[T, H, K], stride=[H * K, K, 1])
    k = g.tensor(name="k", dim=[T, H, K], stride=[H * K, K, 1])
    v = g.tensor(name="v", dim=[T, H, V], stride=[H * V, V, 1])
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1])
    cu = g.tensor(name="cu", dim=[3], stride=[1], data_type=cudnn.data_type.INT32)
    o, _, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    with pytest.raises(PlanEntryError, match="reference: the reference engine has no kernel for gdn"):
        g.build()


# ----------------------------------------------------------------------------------------- routing

class PreferReference(Router):
    def heuristics_sort(self, graph, entries):
        return sorted(entries, key=lambda e: e.engine_id != 20_000)


class DropsEntries(Router):
    def heuristics_sort(self, graph, entries):
        return entries[:1]


def test_per_graph_router_ranks_the_list(register, reference_only):
    register(ToyEngine())
    g, a, b, y = add_graph(router=PreferReference())
    g.build()
    assert [p.label for p in g.plans] == ["reference", "toy-0"]
    assert g.selected_plan.label == "reference"
    g2, *_ = add_graph()
    g2.build()
    assert [p.label for p in g2.plans] == ["toy-0", "reference"]


def test_prefer_family_ranks_that_familys_plans_first_and_keeps_the_rest_in_order(register, reference_only):
    from cudnn_graph.router import PreferFamily
    register(ToyEngine())
    g, *_ = add_graph(router=PreferFamily("python"))
    g.build()
    assert [p.label for p in g.plans] == ["reference", "toy-0"]      # the reference engine is a python one
    g2, *_ = add_graph(router=PreferFamily("cudnn"))                 # no cuDNN plan: the default order
    g2.build()
    assert [p.label for p in g2.plans] == ["toy-0", "reference"]


def test_process_default_router_is_used_and_restored(register, reference_only):
    register(ToyEngine())
    before = get_default_router()
    previous = set_default_router(PreferReference())
    try:
        assert previous is before
        g, *_ = add_graph()
        g.create_execution_plans()
        assert g.plans[0].label == "reference"
        # A per-graph router wins over the process default.
        g2, *_ = add_graph(router=Router())
        g2.create_execution_plans()
        assert g2.plans[0].label == "toy-0"
    finally:
        set_default_router(previous)
    assert get_default_router() is before
    g3, *_ = add_graph()
    g3.create_execution_plans()
    assert g3.plans[0].label == "toy-0"
    with pytest.raises(TypeError):
        set_default_router(object())


def test_router_must_return_a_permutation(register, reference_only):
    register(ToyEngine())
    g, *_ = add_graph(router=DropsEntries())
    with pytest.raises(ValueError, match="permutation"):
        g.create_execution_plans()


def test_register_engine_rules():
    with pytest.raises(ValueError, match="30000"):
        manifest.register_engine(type("Low", (BaseEngine,), {"engine_id": 20_500, "name": "low"})())
    with pytest.raises(TypeError):
        manifest.register_engine(object())
    e = ToyEngine()
    manifest.register_engine(e)
    try:
        with pytest.raises(ValueError, match="already registered"):
            manifest.register_engine(ToyEngine())
        assert e in manifest.engines()
    finally:
        manifest.unregister_engine(e)
    assert e not in manifest.engines()


# ------------------------------------------------------------------------------------------- freezing

def _frozen_graph():
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu")
    off = g.tensor(name="off", dim=[3], stride=[1], data_type=cudnn.data_type.INT32)
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1], ragged_offset=off)   # a side tensor, read through a
    b = g.tensor(name="b", dim=[2, 3], stride=[3, 1])
    y = g.relu(g.add(a, b, name="sum"), name="act").set_output(True)
    return g, a, b, y, off


TENSOR_MUTATIONS = {
    "set_name": lambda t, o: t.set_name("z"),
    "set_dim": lambda t, o: t.set_dim([6]),
    "set_stride": lambda t, o: t.set_stride([1, 2]),
    "set_data_type": lambda t, o: t.set_data_type(HALF),
    "set_output": lambda t, o: t.set_output(False),
    "set_is_virtual": lambda t, o: t.set_is_virtual(True),
    "set_is_pass_by_value": lambda t, o: t.set_is_pass_by_value(True),
    "set_uid": lambda t, o: t.set_uid(999),
    "set_ragged_offset": lambda t, o: t.set_ragged_offset(o),
    "set_reordering_type": lambda t, o: t.set_reordering_type(1),
}

GRAPH_MUTATIONS = {
    "tensor": lambda g, a: g.tensor(name="new", dim=[1], stride=[1]),
    "tensor_like(Tensor)": lambda g, a: g.tensor_like(a),
    "tensor_like(buffer)": lambda g, a: g.tensor_like(np.zeros(3, np.float32)),
    "tensor_scalar": lambda g, a: g.tensor_scalar(2.0),
    "set_device": lambda g, a: g.set_device("cpu"),
}


@pytest.mark.parametrize("name", sorted(TENSOR_MUTATIONS))
@pytest.mark.parametrize("which", ["input", "output"])
def test_frozen_tensor_setters_raise(name, which):
    g, a, b, y, off = _frozen_graph()
    g.build_operation_graph()
    t = a if which == "input" else y
    before = repr(t), t.uid
    with pytest.raises(GraphFrozenError):
        TENSOR_MUTATIONS[name](t, off)
    assert (repr(t), t.uid) == before


@pytest.mark.parametrize("name", sorted(GRAPH_MUTATIONS))
def test_frozen_graph_constructors_raise(name):
    g, a, *_ = _frozen_graph()
    g.build_operation_graph()
    n = len(g.tensors)
    with pytest.raises(GraphFrozenError):
        GRAPH_MUTATIONS[name](g, a)
    assert len(g.tensors) == n


@pytest.mark.parametrize("op", sorted(SCHEMAS))
def test_frozen_graph_every_op_builder_raises(op):
    g, a, b, *_ = _frozen_graph()
    g.create_execution_plans()     # planning freezes too
    n_nodes, n_tensors = len(g.nodes), len(g.tensors)
    with pytest.raises(GraphFrozenError):
        getattr(g, op)(a, b) if op in ("add", "matmul", "mul") else getattr(g, op)()
    with pytest.raises(GraphFrozenError):
        getattr(g, op)(**{SCHEMAS[op].inputs[0].name: a})
    assert (len(g.nodes), len(g.tensors)) == (n_nodes, n_tensors)


def test_frozen_graph_inspection_keeps_working():
    g, a, b, y, off = _frozen_graph()
    g.build()
    assert g.frozen
    assert [n.op for n in g.nodes] == ["add", "relu"]
    add, relu = g.nodes
    assert add.name == "sum" and relu.name == "act"
    assert dict(add.inputs) == {"a": a, "b": b}
    assert relu.inputs["input"] is add.outputs["Y"]
    assert dict(relu.outputs) == {"Y": y}
    assert dict(relu.params) == {"negative_slope": None, "lower_clip": None, "upper_clip": None}
    assert y.producer is relu and a.producer is None
    assert (y.dim, y.stride, y.data_type, y.is_virtual, y.is_output) == ((2, 3), (3, 1), FLOAT, False, True)
    assert a.data_type == FLOAT                       # the graph's io type, after validation
    assert add.outputs["Y"].is_virtual and add.outputs["Y"].data_type == FLOAT
    assert y.get_dim() == [2, 3] and y.get_stride() == [3, 1] and y.get_uid() == y.uid
    assert g.tensor_by_uid(a.uid) is a
    assert json.loads(g.to_json()) == g.to_dict()
    assert isinstance(g.key(), str)
    g.validate()                                      # re-validating a frozen graph is inspection
    A, B, _ = buffers()
    Y = np.zeros((2, 3), np.float32)
    g.execute({a: A, b: B, y: Y, off: np.zeros(3, np.int32)})
    np.testing.assert_array_equal(Y, np.maximum(A + B, 0))


@pytest.mark.parametrize("frozen", [False, True])
def test_node_mappings_are_read_only(frozen):
    g, a, b, y, _ = _frozen_graph()
    if frozen:
        g.build_operation_graph()
    node = g.nodes[0]
    for mapping, key, value in ((node.inputs, "a", b), (node.outputs, "Y", a), (node.params, "padding", 1.0)):
        with pytest.raises(TypeError):
            mapping[key] = value
        with pytest.raises(TypeError):
            del mapping[key]
    with pytest.raises(AttributeError):
        node.inputs = {}
    with pytest.raises(AttributeError):
        node.op = "mul"
    with pytest.raises(AttributeError):
        g.frozen = False
    assert node.inputs["a"] is a


def test_a_change_after_validate_is_validated_again():
    g, a, b, y = add_graph()
    g.validate()
    stray = g.tensor(name="stray", dim=[7, 5], stride=[5, 1])
    g.add(a, stray, name="late").set_output(True)      # a node added after validate() that cannot broadcast
    with pytest.raises(GraphValidationError, match="late"):
        g.build()
    g2, a2, b2, y2 = add_graph()
    g2.validate()
    b2.set_dim([4, 3])
    with pytest.raises(GraphValidationError) as info:
        g2.build_operation_graph()
    assert info.value.port == "b" and not g2.frozen


# ----------------------------------------------------------------------------------------------- uids

def test_user_uids_win_and_auto_uids_are_renumbered():
    g = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[4], stride=[1])
    b = g.tensor(name="b", dim=[4], stride=[1])
    assert not a.uid_assigned_by_user
    taken = a.uid
    b.set_uid(taken)                                   # claims the uid an auto tensor holds
    assert b.uid == taken and b.uid_assigned_by_user
    assert a.uid != taken and not a.uid_assigned_by_user
    c = g.tensor(name="c", dim=[4], stride=[1], uid=a.uid + 100)
    assert c.uid == a.uid + 100 and c.name == "c"
    y = g.add(g.add(a, b), c).set_output(True)
    a_uid = a.uid
    y.set_uid(a_uid)                                   # an output can claim one too
    assert y.uid == a_uid and y.uid_assigned_by_user and a.uid != a_uid
    uids = [t.uid for t in g.tensors]
    assert len(set(uids)) == len(uids)
    assert all(g.tensor_by_uid(t.uid) is t for t in g.tensors)
    b.set_uid(b.uid)                                   # re-claiming its own uid is a no-op
    # Packs keyed by uid reach the right tensors.
    g.build()
    A = np.arange(4, dtype=np.float32)
    Y = np.zeros(4, np.float32)
    g.execute({a.uid: A, taken: 10 * A, c.uid: 100 * A, y.uid: Y})
    np.testing.assert_array_equal(Y, 111 * A)


def test_colliding_user_uids_raise_naming_both_tensors():
    g = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    first = g.tensor(name="first", dim=[4], stride=[1], uid=7)
    n = len(g.tensors)
    with pytest.raises(ValueError) as info:
        g.tensor(name="second", dim=[4], stride=[1], uid=7)
    assert "first" in str(info.value) and "second" in str(info.value) and "7" in str(info.value)
    assert len(g.tensors) == n                           # no half-made tensor left behind
    other = g.tensor(name="other", dim=[4], stride=[1], uid=8)
    with pytest.raises(ValueError, match="'first'.*'other'"):
        other.set_uid(7)
    assert (first.uid, other.uid) == (7, 8)
    g.add(first, other).set_output(True)
    g.validate()


def test_failed_tensor_calls_leave_the_graph_unchanged():
    g = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[4], stride=[1])
    for bad in (dict(dim=[2, 2], stride=[1]), dict(dim=["x"]), dict(dim=[2.5]), dict(data_type="no-such-type"),
                dict(ragged_offset=np.zeros(3)), dict(uid=1.5), dict(uid=2 ** 70), dict(uid=a.uid, dim=[4], stride=[1, 1])):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            g.tensor(name="bad", **bad)
    assert g.tensors == (a,) and a.uid == 1 and g.tensor_by_uid(1) is a
    with pytest.raises(GraphValidationError):
        g.add(a, "not a tensor")
    with pytest.raises(GraphValidationError):
        g.add(a, 2.0, compute_data_type="no-such-type")
    assert g.tensors == (a,) and g.nodes == ()
    g.relu(a).set_output(True)
    g.validate()


# ------------------------------------------------------------------------------------------------ JSON

def _simple_graph(n=16, name_prefix=""):
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT,
                      device="cpu", name=name_prefix + "graph")
    a = g.tensor(name=name_prefix + "a", dim=[1, 8, n], stride=[8 * n, n, 1])
    b = g.tensor(name=name_prefix + "b", dim=[1, n, 4], stride=[4 * n, 4, 1])
    bias = g.tensor(name=name_prefix + "bias", dim=[1, 1, 4], stride=[4, 4, 1])
    c = g.matmul(a, b, name=name_prefix + "mm")
    d = g.bias(c, bias)
    g.relu(d, negative_slope=0.1).set_output(True)
    return g


def _rebuild(d):
    """A graph built with the pygraph builders from ``to_dict()`` output (the JSON is complete)."""
    ctx = d["context"]
    g = cudnn.pygraph(io_data_type=ctx["io_data_type"], intermediate_data_type=ctx["intermediate_data_type"],
                      compute_data_type=ctx["compute_data_type"], device="cpu", name=ctx["name"])
    made = {}
    produced = {uid for n in d["nodes"] for uid in n["outputs"].values()}
    for t in d["tensors"]:
        if t["uid"] not in produced:
            made[t["uid"]] = g.tensor(name=t["name"], dim=t["dim"], stride=t["stride"],
                                      data_type=None if t["data_type"] == "NOT_SET" else t["data_type"],
                                      uid=t["uid"] if t["uid_user"] else None)
    by_uid = {t["uid"]: t for t in d["tensors"]}
    for n in d["nodes"]:
        inputs = {k: made[v["tensor"]] for k, v in n["inputs"].items() if v is not None}
        outs = getattr(g, n["op"])(name=n["name"], **inputs, **n["params"])
        outs = outs if isinstance(outs, list) else [outs]
        for (port, uid), t in zip(n["outputs"].items(), outs):
            made[uid] = t
            if not by_uid[uid]["is_virtual"]:
                t.set_output(True)
    return g


def test_to_json_round_trips_the_structure():
    g = _simple_graph()
    d = g.to_dict()
    assert json.loads(g.to_json()) == d
    assert d["format"] == "cudnn_graph/1"
    assert d["context"] == {"io_data_type": "HALF", "intermediate_data_type": "FLOAT",
                            "compute_data_type": "FLOAT", "name": "graph"}
    assert [n["op"] for n in d["nodes"]] == ["matmul", "bias", "relu"]
    uids = {t["uid"] for t in d["tensors"]}
    for n in d["nodes"]:
        assert all(v["tensor"] in uids for v in n["inputs"].values())
        assert set(n["outputs"].values()) <= uids
    assert d["nodes"][2]["params"]["negative_slope"] == 0.1
    g2 = _rebuild(json.loads(g.to_json()))
    assert g2.key() == g.key()
    g2.validate()
    assert json.loads(g2.to_json())["nodes"] == d["nodes"]


def test_key_is_stable_and_tracks_structure():
    k1 = _simple_graph().key()
    assert k1 == _simple_graph().key()
    assert k1 == _simple_graph(name_prefix="other_").key()     # names are not structure
    assert k1 != _simple_graph(n=32).key()                       # a dim changed
    g = _simple_graph()
    g.nodes[-1].outputs["Y"].set_data_type(HALF)
    assert g.key() != k1
    g3 = _simple_graph()
    g3.build()
    assert g3.key() == k1                                        # validating / building does not move it
    g4 = cudnn.pygraph(io_data_type=FLOAT)                       # device resolved lazily
    g4.relu(g4.tensor(name="x", dim=[2], stride=[1])).set_output(True)
    k4 = g4.key()
    g4.device
    assert g4.key() == k4


# ---------------------------------------------------------------------------------------------- device

def test_device_from_argument_handle_and_buffers():
    assert cudnn.pygraph(device="cpu").device == ("cpu", 0)
    g = cudnn.pygraph(device="cuda:1")
    assert g.device == ("cuda", 1) and g.device_explicit

    class Handle:
        device = "cpu"

    gh = cudnn.pygraph(handle=Handle())
    assert gh.device == ("cpu", 0) and gh.device_explicit and gh.handle is not None

    gb = cudnn.pygraph()
    t = gb.tensor_like(np.zeros((2, 3), np.float16), name="from_numpy")
    assert gb.device[0] == "cpu" and t.device == ("cpu", 0)
    assert (t.dim, t.stride, t.data_type) == ((2, 3), (3, 1), HALF)
    view = np.zeros((4, 6), np.float32)[::2, 1::2]
    tv = gb.tensor_like(view)
    assert tv.dim == (2, 3) and tv.stride == (12, 2) and tv.data_type == FLOAT
    copy = gb.tensor_like(t, name="copy")
    assert (copy.dim, copy.stride, copy.data_type) == (t.dim, t.stride, t.data_type)
    with pytest.raises(ValueError):
        cudnn.pygraph(device="tpu")


def test_tensor_like_templates_on_two_devices_raise():
    g = cudnn.pygraph()
    cuda_buf = cudnn.Slot.from_address(0x7F0000000000, (4, 8), dtype="bfloat16", device="cuda:0")
    t = g.tensor_like(cuda_buf, name="on_gpu")
    assert g.device == ("cuda", 0) and t.device == ("cuda", 0)
    with pytest.raises(ValueError, match="cpu.*cuda:0|cuda:0.*cpu"):
        g.tensor_like(np.zeros((4, 8), np.float32), name="on_host")
    assert g.tensors == (t,)
    other = cudnn.Slot.from_address(0x7F0000000000, (4, 8), dtype="bfloat16", device="cuda:1")
    with pytest.raises(ValueError, match="cuda:1"):
        g.tensor_like(other)
    g_cpu = cudnn.pygraph(device="cpu")
    with pytest.raises(ValueError):
        g_cpu.tensor_like(cuda_buf)
    assert g_cpu.tensors == ()


# -------------------------------------------------------------------------------- pygraph compatibility

class TorchLikeDtype:
    """Prints like torch.bfloat16 (no torch import)."""

    def __str__(self):
        return "torch.bfloat16"


class NamedDtype:
    """An enum-like dtype from another binding: only .name says what it is."""

    name = "bfloat16"


@pytest.mark.parametrize("spelling,expected", [
    (np.float16, HALF), (np.dtype("float32"), FLOAT), (ml_dtypes.bfloat16, cudnn.data_type.BFLOAT16),
    ("torch.float16", HALF), ("torch.bfloat16", cudnn.data_type.BFLOAT16), (TorchLikeDtype(), cudnn.data_type.BFLOAT16),
    (NamedDtype(), cudnn.data_type.BFLOAT16), ("jnp.float32", FLOAT), (cudnn.data_type.INT32, cudnn.data_type.INT32),
])
def test_data_type_spellings(spelling, expected):
    g = cudnn.pygraph(device="cpu")
    t = g.tensor(name="t", dim=[1], stride=[1], data_type=spelling)
    assert t.data_type == expected
    assert t.set_data_type(spelling).get_data_type() == expected


def test_pygraph_style_code_runs_unchanged():
    had_torch, had_jax = "torch" in sys.modules, "jax" in sys.modules
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, device="cpu", name="mlp")
    X = graph.tensor(name="X", dim=[2, 4, 8], stride=[32, 8, 1], data_type=np.float16)
    W = graph.tensor(name="W", dim=[2, 8, 3], stride=[24, 3, 1], data_type="torch.float16")
    B = graph.tensor(name="B", dim=[1, 1, 3], stride=[3, 3, 1], data_type=TorchLikeDtype())
    S = graph.tensor(name="S", dim=[2, 4, 3], stride=[12, 3, 1], data_type=NamedDtype())
    C = graph.matmul(name="mm", A=X, B=W, compute_data_type=cudnn.data_type.FLOAT)
    D = graph.bias(name="bias", input=C, bias=B)
    E = graph.relu(input=D, name="relu")
    F = graph.mul(E, S)
    F.set_output(True).set_data_type(ml_dtypes.bfloat16)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
    assert graph.get_workspace_size() == 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 8)).astype(np.float16)
    w = rng.standard_normal((2, 8, 3)).astype(np.float16)
    bias = rng.standard_normal((1, 1, 3)).astype(ml_dtypes.bfloat16)
    s = rng.standard_normal((2, 4, 3)).astype(ml_dtypes.bfloat16)
    out = np.zeros((2, 4, 3), ml_dtypes.bfloat16)
    # NumPy cannot export ml_dtypes arrays through DLPack: bf16 buffers go in as raw host addresses,
    # shaped by the geometry the graph declares (cudnn.pygraph takes int pointers too).
    graph.execute({X: x, W: w, B: host_address(bias), S: host_address(s), F: host_address(out)}, np.zeros(0, np.uint8))
    ref = np.maximum(np.matmul(x.astype(np.float64), w.astype(np.float64)) + bias.astype(np.float64), 0)
    ref *= s.astype(np.float64)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    assert ("torch" in sys.modules, "jax" in sys.modules) == (had_torch, had_jax)


def test_builders_follow_pygraph_signatures():
    import inspect
    sig = inspect.signature(cudnn.pygraph.matmul)
    assert list(sig.parameters)[:6] == ["self", "A", "B", "compute_data_type", "padding", "name"]
    g = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[1, 2, 2], stride=[4, 2, 1])
    c = g.matmul(a, a, FLOAT, 0.0, "positional")
    assert c.producer.name == "positional" and c.producer.compute_data_type == FLOAT
    assert "Inputs: A, B" in cudnn.pygraph.matmul.__doc__
    with pytest.raises(TypeError, match="unexpected keyword argument 'alpha'"):
        g.matmul(a, a, alpha=1.0)
    with pytest.raises(TypeError, match="multiple values"):
        g.matmul(a, a, A=a)


def test_scalar_defaults_can_be_overridden_by_tensor_uid_or_name(reference_only):
    g = cudnn.pygraph(io_data_type=FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[3], stride=[1])
    alpha = g.tensor_scalar(2.0, name="alpha")
    y = g.mul(x, alpha).set_output(True)
    g.build()
    X, Y = np.arange(3, dtype=np.float32), np.zeros(3, np.float32)
    g.execute({x: X, y: Y})                                     # the value given at build time
    np.testing.assert_array_equal(Y, 2 * X)
    for key, value in ((alpha, 3.0), (alpha.uid, 5.0), ("alpha", 7.0)):
        g.execute({x: X, y: Y, key: np.array([value], np.float32)})
        np.testing.assert_array_equal(Y, value * X)


def test_router_cannot_change_after_the_plan_list_is_ranked():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[1, 2, 2], stride=[4, 2, 1])
    g.relu(a).set_output(True)
    g.router = cudnn.Router()          # allowed before planning
    g.build()
    with pytest.raises(cudnn.GraphFrozenError):
        g.router = cudnn.Router()
    assert isinstance(g.router, cudnn.Router)


def test_reordering_type_accepts_the_enum_its_int_or_name_and_refuses_others():
    import cudnn_graph as cudnn
    g = cudnn.pygraph(device="cpu")
    t = g.tensor(name="x", dim=[4], stride=[1], reordering_type=cudnn.tensor_reordering.F16x16)
    assert t.reordering_type == 2
    assert t.set_reordering_type(1).reordering_type == 1
    assert t.set_reordering_type("F8_128x4").reordering_type == 3
    with pytest.raises(ValueError, match=r"tensor 'x': reordering_type must be one of .*got 7"):
        t.set_reordering_type(7)
    with pytest.raises(ValueError, match="tensor 'y'"):
        g.tensor(name="y", dim=[4], stride=[1], reordering_type="sideways")
