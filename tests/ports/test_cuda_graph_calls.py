"""populate_cuda_graph / update_cuda_graph (cudnn_graph._cuda_graphs): one execute of the selected plan
recorded into a CUDA graph the caller owns, as one child-graph node — by cuDNN's populate / update where
it records the plan, else by a captured execute.

CPU tests check the arguments in process and drive both recording paths against the stand-in
libcudnn / libcuda (tests/engines/cudnn_backend), whose log shows what was populated, captured, added
and updated with which pointers. GPU tests (marked ``gpu``) launch the graph and compare with execute().
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn

F = cudnn.data_type

# The stand-in's caller-graph calls: a child node is a copy of the child graph's recorded line.
_CHILD_NODES = r"""
/* ---- child-graph nodes of a caller's graph (populate_cuda_graph) ---- */
static void *parent_of[64]; static fake_graph_t *child_copy[64];
int cuGraphAddChildGraphNode(void **node, void *parent, const void **deps, size_t n, void *child) {
    fake_graph_t *copy = malloc(sizeof *copy); memcpy(copy, child, sizeof *copy);
    for (int i = 0; i < 64; i++) if (!parent_of[i]) { parent_of[i] = parent; child_copy[i] = copy; break; }
    snprintf(((fake_graph_t *)parent)->text, 16, "node");
    *node = copy;
    char b[2048]; snprintf(b, 2048, "add_child %p %s", parent, copy->text); emit(b); return 0;
}
int cuGraphGetRootNodes(void *g, void **nodes, size_t *n) {
    size_t k = 0;
    for (int i = 0; i < 64; i++) if (parent_of[i] == g) { if (nodes) nodes[k] = child_copy[i]; k++; }
    *n = k; return 0;
}
int cuGraphNodeGetType(void *node, int *kind) { *kind = 4; return 0; }
int cuGraphChildGraphNodeGetGraph(void *node, void **g) { *g = node; return 0; }
int cuGraphDestroyNode(void *node) {
    for (int i = 0; i < 64; i++) if (child_copy[i] == node) {
        ((fake_graph_t *)parent_of[i])->text[0] = 0; parent_of[i] = 0; child_copy[i] = 0; }
    emit("destroy_node"); free(node); return 0;
}
int cudnnBackendUpdateCudaGraph(void *h, void *plan, void *v, void *g) {
    desc_t *x = v; fake_graph_t *graph = g;
    int t = snprintf(graph->text, sizeof graph->text, "%p %p", plan, x->ws);
    for (int i = 0; i < x->n; i++) t += snprintf(graph->text + t, sizeof graph->text - t, " %lld=%p",
                                                 (long long)x->uids[i], x->ptrs[i]);
    char b[2048]; snprintf(b, 2048, "update %s", graph->text); emit(b); return 0;
}
"""


def _standin_env(tmp_path_factory, variant=""):
    from _standin import fake_cuda_builder, fake_cuda_source
    make = fake_cuda_builder(tmp_path_factory.mktemp("cuda_graph_calls"), fake_cuda_source() + _CHILD_NODES)
    return make(variant)


_POPULATE_THEN_UPDATE = """
from cudnn_graph import _driver, _cuda_graphs
g = make(8)
x, y = g.find_tensor("x"), g.get_outputs()[0]
ws = 0x600000 if g.get_workspace_size() else None
cg = _driver.graph_new()
g.populate_cuda_graph(None, {x: 0x200000, y: 0x210000}, ws, cg)
method, nodes = _cuda_graphs.recorded_method(g, cg), _driver.graph_node_count(cg)
errors = []
try:
    g.populate_cuda_graph(None, {x: 0x200000, y: 0x210000}, ws, cg)
except cudnn.CudaGraphError as exc:
    errors.append(str(exc))
try:
    g.update_cuda_graph(None, {x: 0x200000, y: 0x210000}, ws, _driver.graph_new())
except cudnn.CudaGraphError as exc:
    errors.append(str(exc))
start = len(open(__import__("os").environ["FAKE_CUDNN_LOG"]).read().splitlines())
g.update_cuda_graph(None, {x: 0x220000, y: 0x230000}, ws, cg)
print(json.dumps({"method": method, "nodes": nodes, "after": _driver.graph_node_count(cg), "errors": errors,
                  "start": start, "x": x.uid, "y": y.uid}))
"""


def _lines(records, kind):
    return [" ".join(r) for r in records if r[0] == kind]


def test_a_plan_cudnn_populates_becomes_one_child_node_and_updates_in_place(tmp_path_factory, tmp_path):
    from _standin import CHILD_PROLOGUE, run_child
    out, records = run_child(CHILD_PROLOGUE + _POPULATE_THEN_UPDATE, _standin_env(tmp_path_factory),
                             tmp_path / "log")
    assert out["method"] == "populate" and out["nodes"] == 1 and out["after"] == 1
    assert "must be empty" in out["errors"][0] and "was not filled" in out["errors"][1]
    populated = _lines(records, "populate")
    assert len(populated) == 1 and f"{out['x']}=0x200000" in populated[0] and f"{out['y']}=0x210000" in populated[0]
    added = _lines(records, "add_child")
    assert len(added) == 1 and f"{out['x']}=0x200000" in added[0]
    # The update rewrites the child node's graph with the new pointers: no new node, no execute.
    after = records[out["start"]:]
    updated = [" ".join(r) for r in after if r[0] == "update"]
    assert len(updated) == 1 and f"{out['x']}=0x220000" in updated[0] and f"{out['y']}=0x230000" in updated[0]
    assert not [r for r in after if r[0] in ("add_child", "execute", "capture")]
    assert not _lines(records, "execute")          # populating runs nothing


def test_a_plan_cudnn_refuses_to_populate_is_captured_and_captured_again_on_update(tmp_path_factory, tmp_path):
    from _standin import CHILD_PROLOGUE, run_child
    env = dict(_standin_env(tmp_path_factory), FAKE_POPULATE_STATUS="3013")
    out, records = run_child(CHILD_PROLOGUE + _POPULATE_THEN_UPDATE, env, tmp_path / "log")
    assert out["method"] == "capture" and out["nodes"] == 1 and out["after"] == 1
    before = records[:out["start"]]
    captured = [" ".join(r) for r in before if r[0] == "capture"]
    assert len(captured) == 1 and f"{out['x']}=0x200000" in captured[0]
    assert [r for r in before if r[0] == "begin_capture"][0][2] == "1"      # thread-local capture mode
    assert not [r for r in before if r[0] == "execute"]                     # recorded, not run
    after = records[out["start"]:]
    kinds = [r[0] for r in after if r[0] in ("capture", "destroy_node", "add_child")]
    assert kinds == ["capture", "destroy_node", "add_child"]               # the node is replaced
    assert f"{out['x']}=0x220000" in [" ".join(r) for r in after if r[0] == "add_child"][0]


def test_a_host_operand_is_refused_before_anything_is_recorded(tmp_path_factory, tmp_path):
    from _standin import CHILD_PROLOGUE, run_child
    out, records = run_child(CHILD_PROLOGUE + """
import numpy as np
from cudnn_graph import _driver
g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
x = g.tensor(name="x", dim=[4, 8], stride=[8, 1])
s = g.tensor(name="scale", dim=[1, 1], stride=[1, 1], data_type=F.FLOAT, is_pass_by_value=True)
y = g.mul(x, s).set_output(True)
g.build([cudnn.heur_mode.A])
try:
    g.populate_cuda_graph(None, {x: 0x200000, s: np.float32(2), y: 0x210000}, None, _driver.graph_new())
    print(json.dumps({"error": None}))
except cudnn.CudaGraphError as exc:
    print(json.dumps({"error": str(exc)}))
""", _standin_env(tmp_path_factory), tmp_path / "log")
    assert out["error"] and "'scale'" in out["error"] and "pass-by-value" in out["error"]
    assert not [r for r in records if r[0] in ("populate", "capture", "add_child")]


def _built_host_graph():
    g = cudnn.pygraph(io_data_type=F.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[1, 4], stride=[4, 1])
    y = g.relu(x).set_output(True)
    return g, x, y


@pytest.mark.parametrize("method", ["populate_cuda_graph", "update_cuda_graph"])
@pytest.mark.parametrize("handle, said", [(0, "no graph"), (-5, "no graph"), (True, "got a bool"),
                                          ("0x1234", "got str"), (1.5, "got float"), (None, "got NoneType")])
def test_a_bad_cuda_graph_handle_is_refused(method, handle, said):
    g, x, y = _built_host_graph()
    g.build()
    with pytest.raises(cudnn.CudaGraphError, match=said):
        getattr(g, method)(None, {x: 0, y: 0}, None, handle)


@pytest.mark.parametrize("method", ["populate_cuda_graph", "update_cuda_graph"])
def test_a_graph_without_a_built_plan_is_refused(method):
    g, x, y = _built_host_graph()
    with pytest.raises(cudnn.NotBuiltError, match="not planned"):
        getattr(g, method)(None, {}, None, 0x1000)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans()
    with pytest.raises(cudnn.NotBuiltError, match="not built"):
        getattr(g, method)(None, {}, None, 0x1000)


def test_a_host_graph_records_no_cuda_graph():
    g, x, y = _built_host_graph()
    g.build()
    with pytest.raises(cudnn.CudaGraphError, match="runs on cpu"):
        g.populate_cuda_graph(None, {x: np.zeros((1, 4), np.float32), y: np.zeros((1, 4), np.float32)}, None,
                              0x1000)


# ---- on the GPU: launch the populated graph, compare with execute(), update and compare again ------------

def _matmul_graph():
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0")
    a = g.tensor(name="A", dim=[1, 64, 32], stride=[64 * 32, 32, 1])
    b = g.tensor(name="B", dim=[1, 32, 48], stride=[32 * 48, 48, 1])
    c = g.matmul(name="mm", A=a, B=b).set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return g, a, b, c


def _launch_and_compare(g, a, b, c, buffers, cg, cp):
    from cudnn_graph import _driver
    A, B, C, C_ref, ws = buffers
    exe = _driver.graph_exec_new(cg)
    try:
        C[...] = 0
        cp.cuda.runtime.deviceSynchronize()
        _driver.graph_exec_launch(exe, 0)
        cp.cuda.runtime.deviceSynchronize()
    finally:
        _driver.graph_exec_free(exe)
    g.execute({a: A, b: B, c: C_ref}, ws)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(cp.asnumpy(C), cp.asnumpy(C_ref))     # the same plan: bitwise equal
    assert float(cp.abs(C).max()) > 0


def _gpu_buffers(cp, g, seed):
    rng = np.random.default_rng(seed)
    A = cp.asarray(rng.standard_normal((1, 64, 32)).astype(np.float16))
    B = cp.asarray(rng.standard_normal((1, 32, 48)).astype(np.float16))
    C = cp.empty((1, 64, 48), cp.float16)
    C_ref = cp.empty_like(C)
    ws = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    return A, B, C, C_ref, ws


@pytest.mark.gpu
@pytest.mark.parametrize("force_capture", [False, True], ids=["cudnn_populate_or_capture", "capture"])
def test_a_populated_graph_launches_like_execute_and_updates_to_new_buffers(prefer_cudnn, force_capture,
                                                                           monkeypatch):
    cp = pytest.importorskip("cupy")
    from cudnn_graph import _driver, _cuda_graphs
    if force_capture:
        monkeypatch.setattr(_cuda_graphs, "_uses_populate", lambda compiled: False)
    g, a, b, c = _matmul_graph()
    first = _gpu_buffers(cp, g, 0)
    cg = _driver.graph_new()
    try:
        g.populate_cuda_graph(None, {a: first[0], b: first[1], c: first[2]}, first[4], cg)
        method = _cuda_graphs.recorded_method(g, cg)
        print(f"plan {g.selected_plan.label}: recorded by {method}")
        assert method in ("populate", "capture") and (method == "capture" or not force_capture)
        _launch_and_compare(g, a, b, c, first, cg, cp)
        second = _gpu_buffers(cp, g, 1)
        g.update_cuda_graph(None, {a: second[0], b: second[1], c: second[2]}, second[4], cg)
        first[2][...] = 0
        _launch_and_compare(g, a, b, c, second, cg, cp)
        assert float(cp.abs(first[2]).max()) == 0      # the updated graph no longer writes the first output
    finally:
        _driver.graph_free(cg)


@pytest.mark.gpu
def test_an_updated_graph_applies_to_an_executable_with_exec_update(prefer_cudnn):
    cp = pytest.importorskip("cupy")
    from cudnn_graph import _driver
    g, a, b, c = _matmul_graph()
    first, second = _gpu_buffers(cp, g, 2), _gpu_buffers(cp, g, 3)
    cg = _driver.graph_new()
    exe = 0
    try:
        g.populate_cuda_graph(None, {a: first[0], b: first[1], c: first[2]}, first[4], cg)
        exe = _driver.graph_exec_new(cg)
        g.update_cuda_graph(None, {a: second[0], b: second[1], c: second[2]}, second[4], cg)
        if not _driver.graph_exec_update(exe, cg):
            _driver.graph_exec_free(exe)
            exe = _driver.graph_exec_new(cg)
        second[2][...] = 0
        cp.cuda.runtime.deviceSynchronize()
        _driver.graph_exec_launch(exe, 0)
        cp.cuda.runtime.deviceSynchronize()
        g.execute({a: second[0], b: second[1], c: second[3]}, second[4])
        cp.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(cp.asnumpy(second[2]), cp.asnumpy(second[3]))
    finally:
        _driver.graph_exec_free(exe)
        _driver.graph_free(cg)


@pytest.mark.gpu
def test_a_python_engine_plan_is_captured_into_the_callers_graph():
    """The default router (no cuDNN preference): where a Python engine (CuTe GEMM) serves the matmul, its
    execute is captured; the launched graph matches execute(), also after an update."""
    cp = pytest.importorskip("cupy")
    from cudnn_graph import _driver, _cuda_graphs
    g, a, b, c = _matmul_graph()
    if g.selected_engine is None:
        pytest.skip(f"cuDNN serves this matmul here ({g.selected_plan.label}); no Python engine claimed it")
    first, second = _gpu_buffers(cp, g, 4), _gpu_buffers(cp, g, 5)
    cg = _driver.graph_new()
    try:
        g.populate_cuda_graph(None, {a: first[0], b: first[1], c: first[2]}, first[4], cg)
        assert _cuda_graphs.recorded_method(g, cg) == "capture"
        _launch_and_compare(g, a, b, c, first, cg, cp)
        g.update_cuda_graph(None, {a: second[0], b: second[1], c: second[2]}, second[4], cg)
        _launch_and_compare(g, a, b, c, second, cg, cp)
    finally:
        _driver.graph_free(cg)
