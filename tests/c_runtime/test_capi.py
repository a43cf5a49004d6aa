"""The in-process C API (include/cudnn_graph/cudnn_graph_capi.h, the capsule cudnn_graph._C_API): a C
extension module built here, as a user's would be, imports the table and executes graphs built in Python.

On the CPU: the capsule exists after ``import cudnn_graph`` without loading libcudnn; the table refuses
another major version; a reference-engine graph (a Python engine: the table takes the GIL for it) is
described and executed on host buffers, also from C threads that do not hold the GIL; every bad argument
is a status with a message naming the tensor; a cuDNN graph on the stand-in libcudnn runs through its
PlanRunner with the caller's pointers. On the GPU (marked gpu): a cuDNN matmul executed through the table
equals execute()."""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

import cudnn_graph as cudnn

from _c_build import HERE, build_extension

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ports"))
from _standin import CHILD_PROLOGUE, fake_cuda_builder, run_child  # noqa: E402

F = cudnn.data_type


@pytest.fixture(scope="module")
def probe_folder(tmp_path_factory):
    return build_extension(os.path.join(HERE, "capi_probe.c"), tmp_path_factory.mktemp("capi_probe"), "capi_probe")


@pytest.fixture(scope="module")
def probe(probe_folder):
    sys.path.insert(0, probe_folder)
    try:
        return importlib.import_module("capi_probe")
    finally:
        sys.path.remove(probe_folder)


def scaled_relu_graph(build=True):
    """y = relu(x * 2): x (uid 1) and y (uid 3) are the operands; the scalar two (uid 2) is fixed."""
    g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu", name="scaled_relu")
    x = g.tensor(name="x", dim=[2, 3], stride=[3, 1], uid=1)
    two = g.tensor_scalar(2.0, data_type=F.FLOAT, name="two").set_dim([1, 1]).set_stride([1, 1]).set_uid(2)
    g.relu(g.mul(x, two)).set_output(True).set_uid(3).set_name("y")
    if build:
        g.build()
    return g


def test_the_capsule_is_an_attribute_of_the_package_made_without_loading_cudnn(tmp_path):
    from _standin import run_child as child
    out, _ = child("""
import json, cudnn_graph
from cudnn_graph import _loader
maps = open("/proc/self/maps").read()
print(json.dumps({"capsule": repr(cudnn_graph._C_API), "loaded": _loader.is_loaded(),
                  "libcudnn": "libcudnn" in maps, "libcuda": "libcuda.so" in maps}))
""", {"CUDNN_GRAPH_LIBCUDNN": str(tmp_path / "absent.so")}, tmp_path / "log")
    assert 'capsule object "cudnn_graph._C_API"' in out["capsule"]
    assert out == {**out, "loaded": False, "libcudnn": False, "libcuda": False}


def test_the_table_is_imported_with_its_version_and_size(probe):
    version, size = probe.import_table()
    assert version == 100 and size == 8 + 12 * 8      # version, size, then twelve functions


def test_a_table_of_another_major_version_is_refused_with_an_import_error(probe):
    with pytest.raises(ImportError, match=r"version 1\.0; this extension was built for version 2\.x"):
        probe.import_table(2)


def test_a_built_graph_describes_its_callers_operands(probe):
    operands, workspace, family, engine_id, device = probe.describe(scaled_relu_graph())
    # the scalar the graph fixed (uid 2) is bound by the plan: no caller operand
    # (uid, name, type, dims, strides, alignment: a float's 4 bytes on the host, by value, index)
    assert operands == [(1, "x", int(F.FLOAT), (2, 3), (3, 1), 4, 0, 0),
                        (3, "y", int(F.FLOAT), (2, 3), (3, 1), 4, 0, 1)]
    assert (workspace, family, engine_id, device) == (0, 3, 20000, -1)


def test_a_reference_graph_executes_on_host_buffers_through_the_table(probe):
    g = scaled_relu_graph()
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.full((2, 3), np.nan, np.float32)
    assert probe.execute(g, [3, 1], [y.ctypes.data, x.ctypes.data], 0, 0) == ("CG_STATUS_SUCCESS", "")
    np.testing.assert_array_equal(y, np.maximum(x * 2, 0))


def test_c_threads_without_the_gil_execute_a_python_engines_plan(probe):
    g = scaled_relu_graph()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    y = np.zeros((2, 3), np.float32)
    assert probe.execute(g, [1, 3], [x.ctypes.data, y.ctypes.data], 0, 0, 4, 5) == ("CG_STATUS_SUCCESS", "")
    np.testing.assert_array_equal(y, np.maximum(x * 2, 0))


def test_a_graph_not_built_or_not_a_graph_has_no_plan(probe):
    status, message = probe.plan_status(scaled_relu_graph(build=False))
    assert status == "CG_STATUS_NOT_BUILT" and "'scaled_relu'" in message and "build()" in message
    status, message = probe.plan_status(42)
    assert status == "CG_STATUS_INVALID_ARGUMENT" and "pygraph" in message and "int" in message


@pytest.mark.parametrize("uids, pointers, status, words", [
    ([1, 99], [0x1000, 0x2000], "CG_STATUS_UNKNOWN_UID", ["uids[1] = 99"]),
    ([1, 2], [0x1000, 0x2000], "CG_STATUS_UNKNOWN_UID", ["uids[1] = 2", "fixed"]),
    ([1, 3], [0, 0x2000], "CG_STATUS_NULL_POINTER", ["'x'", "uid 1"]),
    ([3], [0x2000], "CG_STATUS_MISSING_TENSOR", ["'x'", "uid 1", "1 of the plan's 2"]),
    ([3, 3], [0x2000, 0x2000], "CG_STATUS_DUPLICATE_UID", ["'y'", "uid 3"]),
])
def test_a_bad_uid_or_pointer_is_a_status_naming_the_tensor(probe, uids, pointers, status, words):
    got, message = probe.execute(scaled_relu_graph(), uids, pointers, 0, 0)
    assert got == status, message
    for word in words:
        assert word in message


def test_null_and_out_of_range_arguments_are_invalid(probe):
    cases = {name: (status, message) for name, status, message in probe.null_arguments(scaled_relu_graph())}
    assert cases["plan_from_graph_null_out"][0] == "CG_STATUS_INVALID_ARGUMENT"
    assert cases["plan_from_graph_null_graph"][0] == "CG_STATUS_INVALID_ARGUMENT"
    assert cases["execute_null_plan"] == ("CG_STATUS_INVALID_ARGUMENT", "execute: the plan is NULL")
    assert cases["count_null_plan"][0] == "CG_STATUS_INVALID_ARGUMENT"
    assert cases["count_null_out"] == ("CG_STATUS_INVALID_ARGUMENT", "plan_tensor_count: the result pointer is NULL")
    assert cases["tensor_out_of_range"] == ("CG_STATUS_INVALID_ARGUMENT", "plan_tensor: index 99, the plan has 2 "
                                                                         "operands")
    assert cases["index_of_unknown_uid"][0] == "CG_STATUS_UNKNOWN_UID"
    assert cases["execute_negative_count"][0] == "CG_STATUS_INVALID_ARGUMENT"
    assert cases["execute_null_arrays"][0] == "CG_STATUS_INVALID_ARGUMENT"


def test_a_python_engines_error_comes_back_as_a_status_with_the_exception(probe, monkeypatch):
    g = scaled_relu_graph()

    def refuse(*args, **kwargs):
        raise RuntimeError("the engine refused")

    monkeypatch.setattr(g.compiled_plan(), "execute", refuse)
    x = np.zeros((2, 3), np.float32)
    status, message = probe.execute(g, [1, 3], [x.ctypes.data, x.ctypes.data], 0, 0)
    assert status == "CG_STATUS_PYTHON_ERROR" and message == "RuntimeError: the engine refused"


# ---- a cuDNN plan on the stand-in libcudnn ------------------------------------------------------------

def test_a_cudnn_plan_runs_through_its_plan_runner_with_the_callers_pointers(probe_folder, tmp_path):
    (tmp_path / "standin").mkdir()
    env = fake_cuda_builder(tmp_path / "standin")()
    out, records = run_child(CHILD_PROLOGUE + f"""
import sys
sys.path.insert(0, {probe_folder!r})
import capi_probe
g = make(8)
x, y = g.get_inputs()[0], g.get_outputs()[0]
operands, workspace, family, engine_id, device = capi_probe.describe(g)
good = capi_probe.execute(g, [y.uid, x.uid], [0x210000, 0x200000], 0, 0x5000)
misaligned = capi_probe.execute(g, [x.uid, y.uid], [0x200004, 0x210000], 0, 0x5000)
print(json.dumps({{"operands": operands, "family": family, "device": device, "good": good,
                  "misaligned": misaligned, "x": x.uid, "y": y.uid}}))
""", env, tmp_path / "calls.log")
    assert out["family"] == 1 and out["device"] == 0
    assert [(row[0], row[5]) for row in out["operands"]] == [(out["x"], 16), (out["y"], 16)]
    assert out["good"] == ["CG_STATUS_SUCCESS", ""]
    status, message = out["misaligned"]
    assert status == "CG_STATUS_MISALIGNED" and "'x'" in message and "0x200004" in message
    executes = [r for r in records if r[0] == "execute"]
    assert len(executes) == 1
    assert sorted(executes[0][3:]) == sorted([f"{out['x']}=0x200000", f"{out['y']}=0x210000"])
    assert ["stream", "0x5000"] in records


# ---- the GPU ------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_a_cudnn_matmul_through_the_table_equals_execute(probe):
    cp = pytest.importorskip("cupy")
    from cudnn_graph.router import PreferFamily
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda", router=PreferFamily("cudnn"))
    a = g.tensor(name="A", dim=[2, 64, 32], stride=[2048, 32, 1])
    b = g.tensor(name="B", dim=[2, 32, 48], stride=[1536, 48, 1])
    c = g.matmul(a, b).set_output(True).set_name("C")
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    rng = np.random.default_rng(0)
    A = cp.asarray(rng.standard_normal((2, 64, 32)).astype(np.float16))
    B = cp.asarray(rng.standard_normal((2, 32, 48)).astype(np.float16))
    want, got = cp.zeros((2, 64, 48), cp.float16), cp.full((2, 64, 48), np.nan, cp.float16)
    workspace = cp.empty(max(g.get_workspace_size(), 1), cp.uint8)
    g.execute({a: A, b: B, c: want}, workspace)
    _, size, family, _, _ = probe.describe(g)
    assert family == 1
    stream = cp.cuda.get_current_stream().ptr
    status = probe.execute(g, [a.uid, b.uid, c.uid], [A.data.ptr, B.data.ptr, got.data.ptr], workspace.data.ptr,
                           stream)
    assert status == ("CG_STATUS_SUCCESS", ""), status
    status = probe.execute(g, [a.uid, b.uid, c.uid], [A.data.ptr, B.data.ptr, got.data.ptr], workspace.data.ptr,
                           stream, 4, 10)
    assert status == ("CG_STATUS_SUCCESS", ""), status
    cp.cuda.Device().synchronize()
    assert cp.asnumpy(got).tobytes() == cp.asnumpy(want).tobytes()


CYTHON_USER = """
from cpython.object cimport PyObject
from cudnn_graph.capi cimport cg_capi_t, cg_capi_import, cg_graph_plan_t, CG_STATUS_SUCCESS

def operand_count(graph):
    cdef const cg_capi_t* api = cg_capi_import()
    cdef cg_graph_plan_t plan
    cdef int n = -1
    if api.plan_from_graph(<PyObject*>graph, &plan) != CG_STATUS_SUCCESS:
        raise RuntimeError(api.last_error().decode())
    with nogil:
        api.plan_tensor_count(plan, &n)
        api.plan_free(plan)
    return n
"""


def test_a_cython_extension_cimports_the_table_from_the_installed_pxd(tmp_path):
    """cudnn_graph/capi.pxd is installed with the package: Cython finds it on sys.path."""
    import shlex
    import subprocess
    import sysconfig
    pytest.importorskip("Cython")
    from _helpers import c_compiler_or_skip
    from cudnn_graph import _c_runtime
    cc = c_compiler_or_skip("a Cython extension test module")
    (tmp_path / "capi_cython_user.pyx").write_text(CYTHON_USER)
    subprocess.run([sys.executable, "-m", "cython", "-3", "capi_cython_user.pyx"], cwd=tmp_path, check=True,
                   capture_output=True, text=True)
    output = tmp_path / ("capi_cython_user" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}",
                    *shlex.split(_c_runtime.c_flags()), str(tmp_path / "capi_cython_user.c"), "-o", str(output)],
                   check=True, capture_output=True, text=True)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("capi_cython_user")
    finally:
        sys.path.remove(str(tmp_path))
    assert module.operand_count(scaled_relu_graph()) == 2
