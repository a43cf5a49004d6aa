"""What the cuTile engine could keep in the kernel disk cache (engines/_kernel_disk_cache.py), before the
engine is wired to it: a kernel's cubin, exported with ``cuda.tile.compilation.export_kernel``, and its
reload in a fresh process with the driver alone (cuModuleLoadData, cuModuleGetFunction), no cuTile import.

- CPU, with cuda.tile and tileiras: the default forward plan's kernels export cubins for sm_90, and the disk
  cache keeps them byte for byte under keys that differ per kernel.
- GPU (``-m gpu``): a second process that never imports cuda.tile loads each cubin from the cache into the
  device's context and finds the kernel's symbol. Launching it from C is scope item 3 of issue 21 (the
  calling convention's parameter layout); this pins that the artifact is enough to get there.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey
from cudnn_graph.engines.cutile import _toolchain, _variants

MISSING = _toolchain.missing()
needs_cutile = pytest.mark.skipif(MISSING is not None, reason=f"cannot compile cuTile kernels: {MISSING}")


def _variant() -> "_variants.Variant":
    """The default gdn plan's specialisation (K = V = 128, four sequences, BF16 products and scratch)."""
    return _variants.Variant("gdn", "bfloat16", "bfloat16", "bfloat16", 128, 128, 32, 4, 128 ** -0.5, True,
                             True, True, low_mma=True, output_block_v=128, scratch_dtype="bfloat16")


def _exports(arch: str) -> list:
    """[(KernelKey, symbol, cubin)] for every forward kernel of the variant."""
    import cuda.tile
    from cuda.tile.compilation import export_kernel
    variant = _variant()
    out = []
    for kernel, signature in _variants.signatures(variant):
        buffer = io.BytesIO()
        export_kernel(kernel, [signature], buffer, gpu_code=arch, output_format="cubin")
        key = KernelKey(engine="cutile_linear_attention", dsl="cuda-tile",
                        dsl_version=str(getattr(cuda.tile, "__version__", "unknown")), driver_version="any",
                        arch=arch, kernel_class={"symbol": signature.symbol,
                                                 "variant": dataclasses.asdict(variant)})
        out.append((key, signature.symbol, buffer.getvalue()))
    return out


@needs_cutile
def test_each_kernel_of_a_plan_exports_a_cubin_that_the_disk_cache_keeps(tmp_path):
    cache = KernelDiskCache(str(tmp_path / "cache"))
    exports = _exports("sm_90")
    assert len({key.digest() for key, _, _ in exports}) == len(exports)
    for key, symbol, cubin in exports:
        assert cubin[:4] == b"\x7fELF", f"{symbol}: not an ELF cubin"
        assert cache.store(key, cubin, {"symbol": symbol})
    for key, symbol, cubin in exports:
        assert cache.load(key) == cubin
        assert cache.entry(key).meta["symbol"] == symbol


SECOND_PROCESS = textwrap.dedent("""
    import json, sys, time
    import cuda.bindings.driver as cuda
    from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey

    def check(result):
        assert int(result[0]) == 0, result[0]
        return result[1] if len(result) == 2 else None

    check(cuda.cuInit(0))
    check(cuda.cuCtxSetCurrent(check(cuda.cuDevicePrimaryCtxRetain(check(cuda.cuDeviceGet(0))))))
    cache = KernelDiskCache.default()
    t0 = time.perf_counter()
    found = []
    for fields in json.loads(sys.argv[1]):
        entry = cache.entry(KernelKey(**fields))
        assert entry is not None, f"no entry for {fields['kernel_class']['symbol']}"
        module = check(cuda.cuModuleLoadData(entry.data))
        function = check(cuda.cuModuleGetFunction(module, entry.meta["symbol"].encode()))
        regs = check(cuda.cuFuncGetAttribute(cuda.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, function))
        found.append((entry.meta["symbol"], regs))
    load_s = time.perf_counter() - t0
    assert "cuda.tile" not in sys.modules, "the second process imported cuTile"
    print(json.dumps({"load_s": load_s, "kernels": found}))
""")


@needs_cutile
@pytest.mark.gpu
def test_a_second_process_loads_the_cached_cubins_with_the_driver_alone(tmp_path):
    from cudnn_graph.engines._device import compute_capability
    major, minor = compute_capability(0)
    exports = _exports(f"sm_{major}{minor}")
    cache_dir = tmp_path / "cache"
    cache = KernelDiskCache(str(cache_dir))
    for key, symbol, cubin in exports:
        assert cache.store(key, cubin, {"symbol": symbol})
    env = dict(os.environ, CUDNN_GRAPH_KERNEL_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, json.dumps([k.as_json() for k, _, _ in exports])],
                          env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name, _ in report["kernels"]] == [symbol for _, symbol, _ in exports]
    assert all(regs > 0 for _, regs in report["kernels"])
    print(f"{len(exports)} cubins loaded in {report['load_s'] * 1e3:.1f} ms: {report['kernels']}")
