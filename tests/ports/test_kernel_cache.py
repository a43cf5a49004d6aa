"""create_kernel_cache() and pygraph(kernel_cache=): the cuDNN backend attaches one kernel cache per
device (CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR, bound to the first operation graph) to every execution
plan it finalizes for graphs that carry the cache (CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE)."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn

F = cudnn.data_type

# cudnnBackendDescriptorType_t / attribute numbers of the ABI header
KERNEL_CACHE_DESCRIPTOR = 34
KERNEL_CACHE_OPERATION_GRAPH = 2400
EXECUTION_PLAN_KERNEL_CACHE = 406


def test_a_kernel_cache_is_engine_neutral_and_host_graphs_ignore_it():
    cache = cudnn.create_kernel_cache()
    g = cudnn.pygraph(io_data_type=F.FLOAT, device="cpu", kernel_cache=cache)
    assert g.kernel_cache is cache and g.view.kernel_cache is cache
    x = g.tensor(name="x", dim=[1, 4], stride=[4, 1])
    y = g.relu(x).set_output(True)
    g.build([cudnn.heur_mode.A])
    X = np.array([[-1, 2, -3, 4]], np.float32)
    Y = np.empty_like(X)
    g.execute({x: X, y: Y})
    np.testing.assert_array_equal(Y, np.maximum(X, 0))
    assert cache.used_by == []          # the reference engine compiles nothing


def test_kernel_cache_must_come_from_create_kernel_cache():
    with pytest.raises(cudnn.ArgumentTypeError, match="kernel_cache.*KernelCache.*got dict"):
        cudnn.pygraph(device="cpu", kernel_cache={})


def test_serializing_a_kernel_cache_says_it_is_not_implemented():
    with pytest.raises(NotImplementedError, match="JSON"):
        cudnn.create_kernel_cache().serialize()


_TWO_GRAPHS = """
cache = cudnn.create_kernel_cache() if USE_CACHE else None
graphs = [make(8, cache), make(16, cache)]
print(json.dumps({"used_by": cache.used_by if cache else None,
                  "plan_type": __import__("cudnn_graph._cudnn_names", fromlist=["x"]).DESCRIPTOR_TYPES[
                      "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR"]}))
"""


def _run(tmp_path_factory, tmp_path, use_cache, version=91900):
    from _standin import CHILD_PROLOGUE, fake_cuda_builder, run_child
    make = fake_cuda_builder(tmp_path_factory.mktemp("kernel_cache_cuda"))
    return run_child(CHILD_PROLOGUE + f"USE_CACHE = {use_cache}\n" + _TWO_GRAPHS, make(version=version),
                     tmp_path / "log")


def test_two_graphs_share_one_cudnn_kernel_cache(tmp_path_factory, tmp_path):
    out, records = _run(tmp_path_factory, tmp_path, True)
    assert out["used_by"] == ["cudnn_backend"]
    made = [r for r in records if r[0] == "create" and int(r[1]) == KERNEL_CACHE_DESCRIPTOR]
    bound = [r for r in records if r[0] == "set" and int(r[1]) == KERNEL_CACHE_DESCRIPTOR
             and int(r[2]) == KERNEL_CACHE_OPERATION_GRAPH]
    finalized = [r for r in records if r[0] == "finalize" and int(r[1]) == KERNEL_CACHE_DESCRIPTOR]
    assert len(made) == len(bound) == len(finalized) == 1       # one cache for both graphs
    attached = [r for r in records if r[0] == "set" and int(r[1]) == out["plan_type"]
                and int(r[2]) == EXECUTION_PLAN_KERNEL_CACHE]
    assert len(attached) == 2 and attached[0][5] == attached[1][5]   # each plan, the same cache
    first_cache = records.index(made[0])
    first_plan_finalize = next(i for i, r in enumerate(records)
                               if r[0] == "finalize" and int(r[1]) == out["plan_type"])
    assert first_cache < first_plan_finalize       # attached before the plan is finalized


def test_graphs_without_a_cache_attach_none(tmp_path_factory, tmp_path):
    _, records = _run(tmp_path_factory, tmp_path, False)
    assert not [r for r in records if r[0] == "create" and int(r[1]) == KERNEL_CACHE_DESCRIPTOR]
    assert not [r for r in records if r[0] == "set" and int(r[2]) == EXECUTION_PLAN_KERNEL_CACHE]


def test_a_cudnn_without_kernel_caches_builds_plans_without_one(tmp_path_factory, tmp_path):
    out, records = _run(tmp_path_factory, tmp_path, True, version=90300)
    assert out["used_by"] == []
    assert not [r for r in records if r[0] == "set" and int(r[2]) == EXECUTION_PLAN_KERNEL_CACHE]


@pytest.mark.gpu
def test_kernel_cache_shared_by_matmul_graphs_on_the_gpu(prefer_cudnn):
    """The frontend's test_kernel_cache: five fp16 matmul graphs built with one cache run correctly."""
    cp = pytest.importorskip("cupy")
    cache = cudnn.create_kernel_cache()
    rng = np.random.default_rng(0)
    for b, m, n, k in ((16, 32, 32, 128), (16, 64, 64, 128), (16, 80, 80, 128), (32, 128, 128, 256),
                       (32, 64, 64, 256)):
        g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                          device="cuda:0", kernel_cache=cache)
        a = g.tensor(name="A", dim=[b, m, k], stride=[m * k, k, 1])
        bb = g.tensor(name="B", dim=[b, k, n], stride=[k * n, n, 1])
        c = g.matmul(name="matmul", A=a, B=bb).set_output(True)
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        assert g.plans[0].engine.name == "cudnn_backend"
        A = rng.standard_normal((b, m, k)).astype(np.float16)
        B = rng.standard_normal((b, k, n)).astype(np.float16)
        C = cp.empty((b, m, n), dtype=cp.float16)
        ws = cp.empty(max(g.get_workspace_size(), 1), dtype=cp.uint8)
        g.execute({a: cp.asarray(A), bb: cp.asarray(B), c: C}, ws)
        cp.cuda.runtime.deviceSynchronize()
        want = np.matmul(A.astype(np.float32), B.astype(np.float32))
        np.testing.assert_allclose(cp.asnumpy(C).astype(np.float32), want, atol=5e-2 * float(np.abs(want).max()),
                                   rtol=5e-2)
    assert cache.used_by == ["cudnn_backend"]
