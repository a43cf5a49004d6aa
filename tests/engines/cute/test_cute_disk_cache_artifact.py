"""What the CuTe GEMM could keep in the kernel disk cache (engines/_kernel_disk_cache.py), before the engine
is wired to it: the DSL's ahead-of-time export (``JitCompiledFunction.export_to_c``: a relocatable object
holding the host entry and the cubin) of a compiled GEMM, and its reload in a fresh process with
``cute.runtime.load_module`` and no compile.

- CPU, with nvidia-cutlass-dsl: a compiled specialisation exports an ELF object, and the disk cache keeps
  it byte for byte.
- GPU (``-m gpu``, H200): a second process, where ``cute.compile`` raises, loads the object from the cache,
  runs the GEMM from raw device pointers and matches NumPy; it prints the load time next to the compile
  time of the first process. A pass says the artifact is the one to wire (docs/performance.md, "Disk cache
  of compiled kernels"); a failure says which step of the route does not hold.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey  # noqa: E402

try:
    from cudnn_graph.engines.cute import _spec
    from cudnn_graph.engines.cute import engine as cute_engine
    HAVE_DSL = True
except ImportError:
    HAVE_DSL = False

needs_dsl = pytest.mark.skipif(not HAVE_DSL, reason="nvidia-cutlass-dsl is not installed")

PREFIX = "cudnn_graph_gemm"
M = N = K = 128


def _spec_128() -> "_spec.GemmSpec":
    """bf16 C = A B^T, A (M, K) and B (N, K) row-major (K-major), C (M, N) row-major, no epilogue."""
    return _spec.GemmSpec(ab_dtype="bfloat16", c_dtype="bfloat16", M=M, N=N, K=K, L=1,
                          a_stride=(K, 1, M * K), b_stride=(K, 1, N * K), c_stride=(N, 1, M * N),
                          knobs=_spec.Knobs((128, 128), (1, 1)))


def _key(spec) -> KernelKey:
    import cutlass
    return KernelKey(engine="cute_gemm", dsl="nvidia-cutlass-dsl", dsl_version=str(cutlass.__version__),
                     driver_version="any", arch=os.environ["CUTE_DSL_ARCH"],
                     kernel_class=dataclasses.asdict(spec))


def _export(compiled, folder) -> bytes:
    compiled.export_to_c(file_path=str(folder), file_name="gemm", function_prefix=PREFIX)
    return (folder / "gemm.o").read_bytes()


@needs_dsl
def test_a_compiled_gemm_exports_an_object_that_the_disk_cache_keeps(tmp_path):
    spec = _spec_128()
    blob = _export(cute_engine.compiled_launcher(spec), tmp_path)
    assert blob[:4] == b"\x7fELF", "export_to_c did not write an ELF object"
    cache = KernelDiskCache(str(tmp_path / "cache"))
    assert cache.store(_key(spec), blob, {"function_prefix": PREFIX})
    assert cache.load(_key(spec)) == blob


SECOND_PROCESS = textwrap.dedent("""
    import json, os, sys, tempfile, time
    import numpy as np, ml_dtypes
    import cutlass, cutlass.cute as cute
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr
    from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey

    def refuse(*args, **kwargs):
        raise AssertionError("cute.compile was called in the second process")
    cute.compile = refuse

    key_fields, prefix, m, n, k = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    entry = KernelDiskCache.default().entry(KernelKey(**key_fields))
    assert entry is not None, "the first process's entry is not in the cache"
    with tempfile.NamedTemporaryFile(suffix=".o", delete=False) as f:   # load_module takes a path
        f.write(entry.data)
    function = getattr(cute.runtime.load_module(f.name), entry.meta["function_prefix"])
    load_s = time.perf_counter() - t0

    def check(result):
        err = result[0] if isinstance(result, tuple) else result
        assert int(err) == 0, err
        return result[1] if isinstance(result, tuple) and len(result) == 2 else result

    check(cuda.cuInit(0))
    device = check(cuda.cuDeviceGet(0))
    check(cuda.cuCtxSetCurrent(check(cuda.cuDevicePrimaryCtxRetain(device))))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    c = np.zeros((m, n), ml_dtypes.bfloat16)
    buffers = []
    for host in (a, b, c):
        ptr = check(cuda.cuMemAlloc(host.nbytes))
        check(cuda.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes))
        buffers.append(int(ptr))
    scratch = int(check(cuda.cuMemAlloc(256)))
    gmem = cute.AddressSpace.gmem
    ptrs = [make_ptr(cutlass.BFloat16, p, gmem, assumed_align=16) for p in buffers]
    ptrs += [make_ptr(cutlass.Float32, scratch, gmem, assumed_align=4) for _ in range(3)]
    extents = [cutlass.Int32(x) for x in (m, n, k, 1)]      # read by a shape-class kernel, else ignored
    function(*ptrs, cutlass.Float32(0.0), cutlass.Float32(0.0), cutlass.Float32(0.0), *extents,
             cuda.CUstream(0))
    check(cuda.cuCtxSynchronize())
    check(cuda.cuMemcpyDtoH(c.ctypes.data, buffers[2], c.nbytes))
    want = a.astype(np.float32) @ b.astype(np.float32).T
    err = float(np.max(np.abs(c.astype(np.float32) - want))) / max(1.0, float(np.max(np.abs(want))))
    assert err < 3e-2, f"max relative error {err}"
    print(json.dumps({"load_s": load_s, "error": err}))
""")


@needs_dsl
@pytest.mark.gpu
def test_a_second_process_runs_the_cached_gemm_object_without_compiling(tmp_path):
    spec = _spec_128()
    compiled = cute_engine.compiled_launcher(spec)
    compile_s = cute_engine.compile_seconds.get(spec, float("nan"))
    cache_dir = tmp_path / "cache"
    assert KernelDiskCache(str(cache_dir)).store(_key(spec), _export(compiled, tmp_path),
                                                 {"function_prefix": PREFIX})
    args = json.dumps([_key(spec).as_json(), PREFIX, M, N, K])
    env = dict(os.environ, CUDNN_GRAPH_KERNEL_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"compile {compile_s:.2f} s in the first process; load {report['load_s'] * 1e3:.1f} ms in the second")
