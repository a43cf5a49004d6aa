"""The CuTe GEMM engine keeps its compiled kernels in the disk cache (engines/cute/_disk.py).

- CPU, with nvidia-cutlass-dsl: the first compile of a kernel spec stores one entry under the cache folder
  (a relocatable ELF object); with the cache off nothing is written.
- GPU (``-m gpu``, H200): a second process, where compiling is refused, builds the same graph class from
  the cache, runs it right, and reports its build time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache  # noqa: E402

# Without the DSL the engine package raises ImportError: every test here needs it.
cute_engine = pytest.importorskip("cudnn_graph.engines.cute.engine", reason="nvidia-cutlass-dsl is not installed",
                                 exc_type=ImportError)
from cudnn_graph.engines.cute import _disk, _spec  # noqa: E402


def _class_spec():
    spec = _spec.GemmSpec(ab_dtype="bfloat16", c_dtype="bfloat16", M=256, N=128, K=64, L=1,
                          a_stride=(64, 1, 256 * 64), b_stride=(64, 1, 128 * 64), c_stride=(128, 1, 256 * 128),
                          knobs=_spec.Knobs((128, 128), (1, 1), stages=4))
    return _spec.shape_class(spec)


def test_a_first_compile_stores_its_kernel_in_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_GRAPH_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cute_engine, "_cache", {})
    spec = _class_spec()
    cute_engine.compiled_launcher(spec)
    entry = KernelDiskCache(str(tmp_path)).entry(_disk.key_for(spec))
    assert entry is not None and entry.data[:4] == b"\x7fELF"
    assert entry.meta["function_prefix"] == _disk.FUNCTION_PREFIX


def test_with_the_cache_off_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_GRAPH_KERNEL_CACHE_DIR", "off")
    monkeypatch.setattr(cute_engine, "_cache", {})
    cute_engine.compiled_launcher(_class_spec())
    assert not any(tmp_path.iterdir())


SECOND_PROCESS = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import cupy as cp
    import cudnn_graph as cg
    from cudnn_graph.engines.cute import _kernel, engine as cute_engine

    def refuse(spec):
        raise AssertionError("the second process compiled a kernel")
    _kernel.compile_spec = refuse
    M, N, K = json.loads(sys.argv[1])
    F = cg.data_type
    t0 = time.perf_counter()
    g = cg.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT)
    a = g.tensor(name="A", dim=[1, M, K], stride=[M * K, K, 1], data_type=F.BFLOAT16)
    b = g.tensor(name="B", dim=[1, K, N], stride=[K * N, N, 1], data_type=F.BFLOAT16)
    c = g.matmul(a, b).set_output(True).set_data_type(F.BFLOAT16)
    g.build([cg.heur_mode.A, cg.heur_mode.FALLBACK])
    build_s = time.perf_counter() - t0
    assert g.selected_plan.engine_id == 20_100, g.selected_plan
    import ml_dtypes
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1, M, K)).astype(ml_dtypes.bfloat16)
    B = rng.standard_normal((1, K, N)).astype(ml_dtypes.bfloat16)
    a_dev, b_dev = cp.asarray(A.view(np.uint16)), cp.asarray(B.view(np.uint16))
    y_dev = cp.zeros((1, M, N), dtype=cp.uint16)
    g.execute({a: a_dev.data.ptr, b: b_dev.data.ptr, c: y_dev.data.ptr})
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(y_dev).view(ml_dtypes.bfloat16).astype(np.float32)
    want = A.astype(np.float32) @ B.astype(np.float32)
    err = float(np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want))))
    assert err < 3e-2, err
    print(json.dumps({"build_s": build_s, "disk_hits": len(cute_engine.disk_hits), "error": err}))
""")


def _child(shape, env):
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, json.dumps(shape)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_a_second_process_builds_a_known_class_from_the_disk_without_compiling(tmp_path):
    env = dict(os.environ, CUDNN_GRAPH_KERNEL_CACHE_DIR=str(tmp_path))
    env.pop("CUTE_DSL_ARCH", None)
    first = subprocess.run([sys.executable, "-c", SECOND_PROCESS.replace("_kernel.compile_spec = refuse", ""),
                            json.dumps([256, 256, 128])], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-4000:]
    second = _child([256, 256, 128], env)
    assert second["disk_hits"] >= 1
    print(f"first process build {json.loads(first.stdout.strip().splitlines()[-1])['build_s']:.3f} s; "
          f"second process build {second['build_s'] * 1e3:.1f} ms from the disk cache")
