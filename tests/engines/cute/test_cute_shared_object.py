"""A CuTe kernel as a shared object (engines/cute/_shared_object.py, _shared_launch.py): loaded and launched
with no CuTe DSL import.

Stand-ins here, no GPU and no DSL import needed (the engine package is there only with the DSL installed): a C "exported kernel" with the DSL's init / load-to-device / entry
convention, and a C "runtime library" with the device shims. The tests pin what the engine relies on: the
header's entry symbol is found, the module initialises once and loads per device, execute()'s C path
(PackedLaunch) and the Python path hand the entry its arguments at the exported convention's positions
(six pointer slots, three floats, four extents, the stream, the result cell), a failed launch is a typed
error, and a broken shared object is refused with SharedObjectError (the disk then falls back).

With the DSL installed (CI's toolchain stage): a compiled kernel is stored as both artifacts, and a process
in which the DSL cannot be imported loads it from the disk as a shared object.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")    # the compile target when no GPU is there to ask

from _helpers import build_shared_library  # noqa: E402

# Without the DSL the engine package raises ImportError (CI's toolchain stage runs these).
pytest.importorskip("cudnn_graph.engines.cute", reason="nvidia-cutlass-dsl is not installed", exc_type=ImportError)
from cudnn_graph.engines.cute import _shared_object  # noqa: E402

KERNEL_SOURCE = r"""
#include <stdint.h>
struct record { void* ptrs[6]; float floats[3]; int32_t ints[4]; void* stream; int32_t num_args;
                int32_t calls, inits, loads, loaded_device; };
struct record rec;
int32_t fail_with = 0;
void _mlir_cgtest_cuda_init(void** args) {
    **(void***)args[0] = (void*)0x1234; *(int32_t*)args[1] = 0; rec.inits++;
}
void _mlir_cgtest_cuda_load_to_device(void** args) {
    rec.loaded_device = *(int32_t*)args[1]; *(int32_t*)args[2] = 0; rec.loads++;
}
int32_t _mlir_cgtest__mlir_ciface_gemm_kernel(void** args, int32_t num_args) {
    for (int i = 0; i < 6; i++) rec.ptrs[i] = *(void**)args[i];
    for (int i = 0; i < 3; i++) rec.floats[i] = *(float*)args[6 + i];
    for (int i = 0; i < 4; i++) rec.ints[i] = *(int32_t*)args[9 + i];
    rec.stream = *(void**)args[13];
    *(int32_t*)args[14] = fail_with;
    rec.num_args = num_args; rec.calls++;
    return fail_with;
}
"""

RUNTIME_SOURCE = r"""
int current = 0;
int _cudaGetDevice(int* d) { *d = current; return 0; }
int _cudaSetDevice(int d) { current = d; return 0; }
"""

HEADER = """
void _mlir_cgtest_cuda_init(void **);
#ifdef __cplusplus
extern "C"
#endif
void _mlir_cgtest__mlir_ciface_gemm_kernel(void **args, int32_t num_args);
"""

# Runs in a child: the stand-in runtime is loaded RTLD_GLOBAL once per process, which must not leak into
# this test process (a real kernel later in it would resolve against the stand-in).
CHILD = textwrap.dedent("""
    import ctypes, json, sys
    from types import SimpleNamespace
    kernel_so, runtime_so = sys.argv[1], sys.argv[2]
    from cudnn_graph.engines.cute._shared_object import SharedKernel, SharedObjectError
    from cudnn_graph.engines.cute._shared_launch import SharedLauncher, RESULT_INDEX
    from cudnn_graph._dsl_launch import PackedLaunch
    from cudnn_graph._variant_pack import PackLayout, TensorSpec
    from cudnn_graph.errors import CudaDriverError

    class Record(ctypes.Structure):
        _fields_ = [("ptrs", ctypes.c_void_p * 6), ("floats", ctypes.c_float * 3), ("ints", ctypes.c_int32 * 4),
                    ("stream", ctypes.c_void_p), ("num_args", ctypes.c_int32), ("calls", ctypes.c_int32),
                    ("inits", ctypes.c_int32), ("loads", ctypes.c_int32), ("loaded_device", ctypes.c_int32)]

    kernel = SharedKernel.load(open(kernel_so, "rb").read(), "_mlir_cgtest__mlir_ciface_gemm_kernel", "cgtest",
                               runtime_so)
    rec = Record.in_dll(kernel._library, "rec")
    spec = SimpleNamespace(M=64, N=32, K=16, L=1)
    launcher = SharedLauncher(kernel, spec, 0, extents=(64, 32, 16, 2))
    entry, template, result_index = launcher.c_entry()
    out = {"inits_after_entry": rec.inits, "loaded_device": rec.loaded_device, "result_index": result_index,
           "template_len": len(template)}
    specs = [TensorSpec(1, (4, 8), "bfloat16", device="cuda", name="A"),
             TensorSpec(2, (8, 4), "bfloat16", device="cuda", name="B"),
             TensorSpec(3, (4, 4), "bfloat16", device="cuda", name="C", is_output=True)]
    launch = PackedLaunch.create(PackLayout(specs), entry, template, (1, 2, 3), (16, 16, 16), ("A", "B", "output"),
                                 3, (), (), (), launcher.extents, result_index, launcher, pointer_slots=6)
    launch.execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, 77)
    out["c_path"] = {"ptrs": list(rec.ptrs), "floats": list(rec.floats), "ints": list(rec.ints),
                     "stream": rec.stream, "num_args": rec.num_args}
    launcher([0x40000, 0x50000, 0x60000, 0, 0, 0], [0.5, 0.25, 0.0], 88)
    out["python_path"] = {"ptrs": list(rec.ptrs), "floats": list(rec.floats), "stream": rec.stream,
                          "num_args": rec.num_args}
    out["inits"], out["loads"], out["calls"] = rec.inits, rec.loads, rec.calls
    ctypes.c_int32.in_dll(kernel._library, "fail_with").value = 700
    try:
        launcher([0x40000, 0x50000, 0x60000, 0, 0, 0], [0.0, 0.0, 0.0], 0)
        out["python_failure"] = None
    except CudaDriverError as exc:
        out["python_failure"] = str(exc)
    try:
        launch.execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, 0)
        out["c_failure"] = None
    except CudaDriverError as exc:
        out["c_failure"] = str(exc)
    try:
        SharedKernel.load(b"not an ELF file", "x", "cgtest", runtime_so)
        out["broken"] = None
    except SharedObjectError as exc:
        out["broken"] = str(exc)
    out["dsl_imported"] = "cutlass" in sys.modules
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared_kernel")
    return (build_shared_library(KERNEL_SOURCE, folder, "kernel.so"),
            build_shared_library(RUNTIME_SOURCE, folder, "libcute_dsl_runtime.so"))


def test_the_entry_symbol_is_read_from_the_exports_header():
    assert _shared_object.entry_symbol(HEADER) == "_mlir_cgtest__mlir_ciface_gemm_kernel"
    assert _shared_object.entry_symbol("void other(void **);") is None


def test_a_shared_kernel_launches_at_the_exported_convention_with_no_dsl(stand_ins):
    kernel_so, runtime_so = stand_ins
    done = subprocess.run([sys.executable, "-c", CHILD, str(kernel_so), str(runtime_so)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["inits_after_entry"] == 1 and out["loaded_device"] == 0
    assert out["result_index"] == 14 and out["template_len"] == 15
    c_path = out["c_path"]
    assert c_path["ptrs"] == [0x10000, 0x20000, 0x30000, 256, 256, 256]     # unused slots: placeholders
    assert c_path["ints"] == [64, 32, 16, 2] and c_path["stream"] == 77 and c_path["num_args"] == 15
    py_path = out["python_path"]
    assert py_path["ptrs"] == [0x40000, 0x50000, 0x60000, 256, 256, 256]
    assert py_path["floats"] == [0.5, 0.25, 0.0] and py_path["stream"] == 88 and py_path["num_args"] == 15
    assert out["inits"] == 1 and out["loads"] == 1 and out["calls"] == 2    # loaded once, launched twice
    assert "CUDA error 700" in out["python_failure"] and "CUDA error 700" in out["c_failure"]
    assert "did not load" in out["broken"]
    assert out["dsl_imported"] is False


def test_link_makes_a_loadable_shared_object_of_an_object_file(tmp_path):
    cc = _shared_object._compiler()
    if cc is None:
        pytest.skip("no C compiler")
    source = tmp_path / "k.c"
    source.write_text("int exported_value(void) { return 42; }\n")
    subprocess.run(cc + ["-c", "-fPIC", str(source), "-o", str(tmp_path / "k.o")], check=True)
    shared = _shared_object.link((tmp_path / "k.o").read_bytes())
    assert shared is not None and shared[:4] == b"\x7fELF"
    assert _shared_object.link(b"garbage, not an object") is None


def test_no_runtime_library_is_a_shared_object_error():
    with pytest.raises(_shared_object.SharedObjectError, match="runtime library"):
        _shared_object.SharedKernel.load(b"", "x", "y", None)


def test_direct_construction_is_refused():
    with pytest.raises(TypeError, match="SharedKernel.load"):
        _shared_object.SharedKernel()


# ---- with the DSL (CI's toolchain stage): the disk keeps both artifacts; a DSL-less process loads one ----

CLASS_SPEC = """_spec.shape_class(_spec.GemmSpec(
    ab_dtype="bfloat16", c_dtype="bfloat16", M=256, N=128, K=64, L=1, a_stride=(64, 1, 256 * 64),
    b_stride=(64, 1, 128 * 64), c_stride=(128, 1, 256 * 128), knobs=_spec.Knobs((128, 128), (1, 1), stages=4)))"""

WITHOUT_DSL = textwrap.dedent("""
    import json, sys
    from cudnn_graph.engines.cute import _disk, _spec, _shared_object
    sys.modules["cutlass"] = None             # importing the DSL now fails: the load must not need it
    spec = """ + CLASS_SPEC + """
    found = _disk.load(spec)
    print(json.dumps({"type": type(found).__name__, "symbol": getattr(found, "symbol", None)}))
""")


def test_a_compiled_kernel_is_stored_as_a_shared_object_that_loads_without_the_dsl(tmp_path, monkeypatch):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    if _shared_object._compiler() is None:
        pytest.skip("no C compiler to link the kernel")
    from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache
    from cudnn_graph.engines.cute import _disk, _spec, engine as cute_engine
    monkeypatch.setenv("CUDNN_GRAPH_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cute_engine, "_cache", {})
    spec = eval(CLASS_SPEC)
    cute_engine.compiled_launcher(spec)
    entry = KernelDiskCache(str(tmp_path)).entry(_disk.key_for(spec, _disk.SHARED_OBJECT_ENGINE))
    assert entry is not None and entry.data[:4] == b"\x7fELF"
    assert entry.meta["entry_symbol"].startswith(f"_mlir_{_disk.FUNCTION_PREFIX}__mlir_ciface_")
    assert entry.meta["runtime"].endswith("libcute_dsl_runtime.so")
    env = dict(os.environ, CUDNN_GRAPH_KERNEL_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", WITHOUT_DSL], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"type": "SharedKernel", "symbol": entry.meta["entry_symbol"]}
