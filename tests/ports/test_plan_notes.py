"""Plan notes: get_behavior_notes_for_plan_at_index / get_behavior_notes answer from each plan's engine
(``BaseEngine.plan_notes``): cuDNN's from its engine configs (CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE /
NUMERICAL_NOTE), the DSL engines' RUNTIME_COMPILATION, none for the reference engine."""
from __future__ import annotations

import pytest

import cudnn_graph as cudnn
from cudnn_graph.engines.base import BaseEngine, CompiledPlan, PlanConfig
from cudnn_graph.engines import manifest

F = cudnn.data_type


def _relu_graph(device="cpu"):
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    g.relu(x).set_output(True)
    return g


def test_reference_plans_have_no_notes():
    g = _relu_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    assert g.get_behavior_notes_for_plan_at_index(0) == []
    g.check_support()
    g.build_plans()
    assert g.get_behavior_notes() == []


class _NotedPlan(CompiledPlan):
    def execute(self, graph, variant_pack, ctx):
        pass


class _NotedEngine(BaseEngine):
    """An engine whose plan says it compiles at runtime and is nondeterministic."""
    name, engine_id = "noted", 30_101

    def propose_plans(self, graph):
        return [PlanConfig(self.engine_id, name="noted-0", engine=self, priority=1e9,
                           behavior_notes=(cudnn.behavior_note.RUNTIME_COMPILATION,),
                           numerical_notes=(cudnn.numerical_note.NONDETERMINISTIC,))]

    def build_plan(self, graph, plan, ctx):
        return _NotedPlan(plan)


def test_notes_come_from_the_plans_engine_as_enum_members():
    noted_engine = _NotedEngine()
    manifest.register_engine(noted_engine)
    try:
        g = _relu_graph()
        g.create_execution_plans([cudnn.heur_mode.A])
    finally:
        manifest.unregister_engine(noted_engine)
    index = next(i for i, p in enumerate(g.plans) if p.engine is noted_engine)
    notes = g.get_behavior_notes_for_plan_at_index(index)
    assert notes == [cudnn.behavior_note.RUNTIME_COMPILATION]
    assert noted_engine.plan_notes(g.plans[index])[1] == [cudnn.numerical_note.NONDETERMINISTIC]
    other = [i for i, p in enumerate(g.plans) if p.engine is not noted_engine]
    assert all(g.get_behavior_notes_for_plan_at_index(i) == [] for i in other)


def test_notes_of_an_index_outside_the_list_raise():
    g = _relu_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    with pytest.raises(IndexError):
        g.get_behavior_notes_for_plan_at_index(len(g.plans))


def test_dsl_engine_plans_say_runtime_compilation():
    from cudnn_graph.engines._dsl_common import ToolchainGatedEngine
    behavior, numerical = ToolchainGatedEngine.plan_notes(object.__new__(ToolchainGatedEngine),
                                                          PlanConfig(20_000, name="dsl"))
    assert behavior == [cudnn.behavior_note.RUNTIME_COMPILATION] and numerical == []


# ---- cuDNN's notes, read from the stand-in's engine configs -------------------------------------------

def _noting_source():
    from _standin import fake_cuda_source
    source = fake_cuda_source()
    anchor = "int cudnnBackendGetAttribute(void *d, int name, int type, long long r, long long *c, void *e) {"
    assert anchor in source
    # The engine's notes: behavior SUPPORTS_CUDA_GRAPH_NATIVE_API (3) and RUNTIME_COMPILATION (0),
    # numerical NONDETERMINISTIC (4).
    return source.replace(anchor, anchor + """
    if (name == 1305) { int notes[2] = {3, 0}; if (c) *c = 2; if (e) memcpy(e, notes, 4 * (r < 2 ? r : 2)); return 0; }
    if (name == 1303) { if (c) *c = 1; if (e && r >= 1) *(int *)e = 4; return 0; }""")


def test_cudnn_notes_are_read_from_the_engine_config(tmp_path_factory, tmp_path):
    from _standin import CHILD_PROLOGUE, fake_cuda_builder, run_child
    env = fake_cuda_builder(tmp_path_factory.mktemp("noting_cuda"), _noting_source())()
    out, _ = run_child(CHILD_PROLOGUE + """
g = make(8)
print(json.dumps({"engine": g.plans[0].engine.name,
                  "at0": [n.name for n in g.get_behavior_notes_for_plan_at_index(0)],
                  "selected": [n.name for n in g.get_behavior_notes()],
                  "numerical": [n.name for n in g.plans[0].engine.plan_notes(g.plans[0])[1]]}))
""", env, tmp_path / "log")
    assert out["engine"] == "cudnn_backend"
    assert out["at0"] == ["SUPPORTS_CUDA_GRAPH_NATIVE_API", "RUNTIME_COMPILATION"]
    assert out["selected"] == out["at0"]
    assert out["numerical"] == ["NONDETERMINISTIC"]


@pytest.mark.gpu
def test_cudnn_matmul_bias_plan_notes_on_the_gpu():
    """The frontend's test_matmul_bias check: plan 0 of an fp16 matmul + bias graph (ranked as a port
    would get it: the default router) and the built plan report RUNTIME_COMPILATION."""
    g = cudnn.pygraph(intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda:0")
    x = g.tensor(name="X", dim=[4, 128, 64], stride=[128 * 64, 64, 1], data_type=F.HALF)
    w = g.tensor(name="W", dim=[1, 64, 256], stride=[64 * 256, 256, 1], data_type=F.HALF)
    b = g.tensor(name="B", dim=[1, 1, 256], stride=[256, 256, 1], data_type=F.HALF)
    g.bias(name="bias", input=g.matmul(name="matmul", A=x, B=w), bias=b).set_output(True).set_data_type(F.HALF)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    notes = g.get_behavior_notes_for_plan_at_index(0)
    assert all(isinstance(n, cudnn.behavior_note) for n in notes)
    assert cudnn.behavior_note.RUNTIME_COMPILATION in notes, (g.plans[0].label, notes)
    g.check_support()
    g.build_plans()
    assert cudnn.behavior_note.RUNTIME_COMPILATION in g.get_behavior_notes()
    cudnn_entries = g.backend_plan_entries()
    assert cudnn_entries and all(isinstance(n, cudnn.behavior_note)
                                 for e in cudnn_entries for n in e.engine.plan_notes(e)[0])
