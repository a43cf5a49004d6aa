"""The cuDNN loader, the status mapping and the declared ABI: all checkable without a GPU or cuDNN.

Loading is process-wide and happens once, so every scenario that loads (or fails to load) a library
runs in a fresh interpreter. Where a scenario needs a library, the tests build a stand-in libcudnn
from C (a few entry points that report a chosen version), which exercises the search order, the
version gates and the error path exactly as the real library would.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cudnn_graph import _cudnn_errors as errs
from cudnn_graph import _loader, enums
from cudnn_graph.errors import CudnnGraphError, GraphNotSupportedError
from _helpers import REPO_ROOT

REPO = REPO_ROOT
HEADER = REPO / "include" / "cudnn_graph" / "cudnn_backend.h"
ABI_PXD = REPO / "src" / "cudnn_graph" / "_cudnn_abi.pxd"


# ---- helpers -------------------------------------------------------------------------------------

def run_python(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter that imports cudnn_graph as this one does; it prints JSON."""
    full_env = {k: v for k, v in os.environ.items() if k != _loader.ENV_VAR}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full_env.update(env or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=full_env, cwd=os.getcwd(), timeout=120)
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def header_constants() -> dict[str, int]:
    text = HEADER.read_text()
    return {name: int(value) for name, value in re.findall(r"^\s+(CUDNN_\w+)\s+=\s+(-?\d+),", text, re.M)}


FAKE_LIBCUDNN = r"""
#include <stddef.h>
#include <string.h>
static char last_error[256];
size_t cudnnGetVersion(void) { return FAKE_VERSION; }
size_t cudnnGetCudartVersion(void) { return 12080; }
const char *cudnnGetErrorString(int status) { return status ? "fake error string" : "CUDNN_STATUS_SUCCESS"; }
void cudnnGetLastErrorString(char *message, size_t size) {
    strncpy(message, last_error, size); message[size - 1] = 0; last_error[0] = 0;
}
int cudnnCreate(void **handle) {   /* fails on purpose, leaving a message like cuDNN does */
    *handle = 0; strcpy(last_error, "fake: no GPU in this test"); return 3007;
}
int cudnnDestroy(void *handle) { return 0; }
int cudnnSetStream(void *handle, void *stream) { return 0; }
int cudnnGetStream(void *handle, void **stream) { return 0; }
int cudnnBackendCreateDescriptor(int type, void **desc) { return 0; }
int cudnnBackendDestroyDescriptor(void *desc) { return 0; }
int cudnnBackendFinalize(void *desc) { return 0; }
int cudnnBackendSetAttribute(void *d, int n, int t, long long c, const void *e) { return 0; }
int cudnnBackendGetAttribute(void *d, int n, int t, long long r, long long *c, void *e) { return 0; }
#ifndef OMIT_EXECUTE
int cudnnBackendExecute(void *h, void *p, void *v) { return 0; }
#endif
int cudnnBackendPopulateCudaGraph(void *h, void *p, void *v, void *g) { return 0; }
int cudnnBackendUpdateCudaGraph(void *h, void *p, void *v, void *g) { return 0; }
int cudnnGetExecutionPlanWorkspaceSize(void *h, void *p, void *v, size_t *s) { *s = 0; return 0; }
"""


@pytest.fixture(scope="module")
def fake_libcudnn(tmp_path_factory):
    """Build stand-in libraries: ``make(version, omit_execute=False) -> path``."""
    from _helpers import c_compiler_or_skip
    cc = c_compiler_or_skip("a stand-in libcudnn")
    folder = tmp_path_factory.mktemp("fake_cudnn")
    source = folder / "fake_cudnn.c"
    source.write_text(FAKE_LIBCUDNN)
    built = {}

    def make(version: int, omit_execute: bool = False) -> str:
        key = (version, omit_execute)
        if key not in built:
            out = folder / f"v{version}{'_noexec' if omit_execute else ''}" / "libcudnn.so.9"
            out.parent.mkdir()
            cmd = [cc, "-shared", "-fPIC", f"-DFAKE_VERSION={version}", str(source), "-o", str(out)]
            if omit_execute:
                cmd.insert(1, "-DOMIT_EXECUTE")
            subprocess.run(cmd, check=True)
            built[key] = str(out)
        return built[key]

    return make


# A child prologue: make the pathfinder step and the system step fail, counting pathfinder calls.
NO_OTHER_PLACES = """
import json, warnings
from cudnn_graph import _loader
calls = []
def no_pathfinder():
    calls.append(1)
    raise RuntimeError("pathfinder disabled by the test")
_loader._find_with_pathfinder = no_pathfinder
_loader._SYSTEM_LIBRARY_NAMES = ("libcudnn_graph_test_absent.so.9",)
"""


# ---- importing loads nothing ---------------------------------------------------------------------

def test_import_does_not_load_libcudnn():
    out = run_python("""
        import json
        import cudnn_graph, cudnn_graph.enums, cudnn_graph._cudnn_errors
        from cudnn_graph import _loader
        maps = open("/proc/self/maps").read()
        print(json.dumps({"mapped": "libcudnn" in maps, "loaded": _loader.is_loaded(),
                          "last": _loader.get_last_error_string()}))
    """)
    assert out == {"mapped": False, "loaded": False, "last": ""}


# ---- the search order and its failures -----------------------------------------------------------

def test_missing_library_lists_every_place_tried():
    out = run_python(NO_OTHER_PLACES + """
available = _loader.is_available()          # must not raise
try:
    _loader.load()
except Exception as e:
    error = e
again = None
try:
    _loader.load()                          # the failure is remembered: no second search
except Exception as e:
    again = type(e).__name__
calls_before_retry = len(calls)
try:
    _loader.load(retry=True)
except Exception:
    pass
print(json.dumps({"available": available, "type": type(error).__name__, "message": str(error),
                  "attempts": error.attempts, "again": again, "calls": calls_before_retry,
                  "calls_after_retry": len(calls), "loaded": _loader.is_loaded(),
                  "mro": [c.__name__ for c in type(error).__mro__]}))
""", env={"CUDNN_GRAPH_LIBCUDNN": "/nonexistent"})
    assert out["available"] is False and out["loaded"] is False
    assert out["type"] == "CudnnNotFoundError"
    assert {"CudnnGraphError", "RuntimeError"} <= set(out["mro"])
    places = [place for place, _ in out["attempts"]]
    assert len(places) == 3
    assert places[0] == "$CUDNN_GRAPH_LIBCUDNN='/nonexistent'" and "/nonexistent" in out["attempts"][0][1]
    assert places[1].startswith("cuda.pathfinder") and "pathfinder disabled by the test" in out["attempts"][1][1]
    assert "libcudnn_graph_test_absent.so.9" in places[2]
    for place, reason in out["attempts"]:
        assert place in out["message"] and reason in out["message"]
    assert out["again"] == "CudnnNotFoundError" and out["calls"] == 1 and out["calls_after_retry"] == 2


def test_unset_env_var_is_reported_and_real_pathfinder_is_consulted():
    # No patching: on a machine without cuDNN every place fails and says why; where cuDNN is
    # installed (the GPU machine) the same call loads it. Either way the answer is coherent.
    out = run_python("""
        import json
        from cudnn_graph import _loader
        try:
            path = _loader.load()
            print(json.dumps({"loaded": True, "path": path, "version": _loader.backend_version()}))
        except Exception as e:
            print(json.dumps({"loaded": False, "type": type(e).__name__, "attempts": e.attempts}))
    """)
    if out["loaded"]:
        assert "libcudnn" in out["path"] and out["version"] // 10000 == 9
    else:
        assert out["type"] in ("CudnnNotFoundError", "CudnnSymbolError")
        assert out["attempts"][0] == ["$CUDNN_GRAPH_LIBCUDNN", "not set"]
        assert out["attempts"][1][0].startswith("cuda.pathfinder") and out["attempts"][1][1]
        assert out["attempts"][2][0].startswith("system loader") and out["attempts"][2][1]


@pytest.mark.parametrize("version, cuda_graph, plan_workspace", [
    (91900, True, False),    # the H200 machine's cuDNN: CUDA-graph API yes, workspace query (9.23) no
    (90400, False, False),   # below 9.5: the CUDA-graph entry points stay NULL although exported
    (92800, True, True),
])
def test_loads_from_env_var_and_gates_optional_entry_points(fake_libcudnn, version, cuda_graph,
                                                             plan_workspace):
    path = fake_libcudnn(version)
    out = run_python(NO_OTHER_PLACES + """
loaded = _loader.load()
info = _loader.library_info()
import ctypes
handle = ctypes.c_void_p()
status = ctypes.CDLL(loaded).cudnnCreate(ctypes.byref(handle))   # the stand-in fails on purpose
try:
    _loader.check_status(status, "cudnnCreate")
except Exception as e:
    error = e
result = {"path": loaded, "version": _loader.backend_version(),
          "version_string": _loader.backend_version_string(), "cudart": _loader.cudart_version(),
          "info": info, "calls": len(calls), "type": type(error).__name__, "status": error.status,
          "status_name": error.status_name, "last_error": error.last_error,
          "error_string": error.error_string, "where": error.where,
          "last_after": _loader.get_last_error_string()}
try:
    _loader.require_version(92200, "transpose")
    result["gate"] = None
except Exception as e:
    result["gate"] = [type(e).__name__, str(e), isinstance(e, NotImplementedError)]
_loader.require_version(90000, "anything in 9.x")
print(json.dumps(result))
""", env={"CUDNN_GRAPH_LIBCUDNN": os.path.dirname(path)})   # a folder holding libcudnn.so.9 works too
    assert out["path"] == os.path.realpath(path)
    assert out["calls"] == 0   # the env var won: pathfinder was never asked
    assert out["version"] == version and out["cudart"] == 12080
    assert out["version_string"] == f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    assert out["info"]["found_via"].startswith("$CUDNN_GRAPH_LIBCUDNN")
    optional = out["info"]["optional_entry_points"]
    assert optional["cudnnGetLastErrorString"] is True
    assert optional["cudnnBackendPopulateCudaGraph"] is cuda_graph
    assert optional["cudnnBackendUpdateCudaGraph"] is cuda_graph
    assert optional["cudnnGetExecutionPlanWorkspaceSize"] is plan_workspace
    # A failed status carries cuDNN's texts, read from the library right after the failure.
    assert out["type"] == "CudnnNotSupportedError" and out["status"] == 3007
    assert out["status_name"] == "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"
    assert out["last_error"] == "fake: no GPU in this test" and out["error_string"] == "fake error string"
    assert out["where"] == "cudnnCreate" and out["last_after"] == ""
    if version >= 92200:
        assert out["gate"] is None
    else:
        name, message, declines = out["gate"]
        assert name == "CudnnVersionError" and declines
        assert "transpose" in message and "9.22.0" in message
        assert out["version_string"] in message


def test_wrong_major_version_is_rejected(fake_libcudnn):
    path = fake_libcudnn(81000)
    out = run_python(NO_OTHER_PLACES + """
try:
    _loader.load()
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "attempts": e.attempts, "loaded": _loader.is_loaded()}))
""", env={"CUDNN_GRAPH_LIBCUDNN": path})
    assert out["type"] == "CudnnNotFoundError" and out["loaded"] is False
    assert "8.10.0" in out["attempts"][0][1] and "cuDNN 9 ABI" in out["attempts"][0][1]


def test_missing_required_symbol_is_named(fake_libcudnn):
    path = fake_libcudnn(91900, omit_execute=True)
    out = run_python(NO_OTHER_PLACES + """
from cudnn_graph._cudnn_errors import CudnnNotFoundError
try:
    _loader.load()
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "symbol": e.symbol, "message": str(e),
                      "not_found": isinstance(e, CudnnNotFoundError)}))
""", env={"CUDNN_GRAPH_LIBCUDNN": path})
    assert out["type"] == "CudnnSymbolError" and out["not_found"]
    assert out["symbol"] == "cudnnBackendExecute" and "cudnnBackendExecute" in out["message"]


def test_unusable_env_var_falls_through_with_a_warning(fake_libcudnn):
    path = fake_libcudnn(91900)
    out = run_python(f"""
import json, warnings
from cudnn_graph import _loader
_loader._find_with_pathfinder = lambda: {path!r}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = _loader.load()
print(json.dumps({{"path": loaded, "via": _loader.library_info()["found_via"],
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}}))
""", env={"CUDNN_GRAPH_LIBCUDNN": "/nonexistent/libcudnn.so.9"})
    assert out["path"] == os.path.realpath(path) and out["via"].startswith("cuda.pathfinder")
    assert len(out["warnings"]) == 1 and "/nonexistent/libcudnn.so.9" in out["warnings"][0]


# ---- the status mapping --------------------------------------------------------------------------

@pytest.mark.parametrize("status, cls, name, also", [
    (2000, errs.CudnnBadParamError, "CUDNN_STATUS_BAD_PARAM", ValueError),
    (2008, errs.CudnnBadParamError, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH", ValueError),
    (2001, errs.CudnnBadParamError, "CUDNN_STATUS_INVALID_VALUE", ValueError),
    (3001, errs.CudnnNotSupportedError, "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN", GraphNotSupportedError),
    (3014, errs.CudnnNotSupportedError, "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE", NotImplementedError),
    (4000, errs.CudnnInternalError, "CUDNN_STATUS_INTERNAL_ERROR", RuntimeError),
    (4001, errs.CudnnInternalError, "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED", RuntimeError),
    (4003, errs.CudnnAllocFailedError, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", MemoryError),
    (4004, errs.CudnnAllocFailedError, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", MemoryError),
    (5000, errs.CudnnExecutionFailedError, "CUDNN_STATUS_EXECUTION_FAILED", RuntimeError),
    (5002, errs.CudnnExecutionFailedError, "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS", RuntimeError),
    (1001, errs.CudnnLibraryError, "CUDNN_STATUS_NOT_INITIALIZED", RuntimeError),
    (1008, errs.CudnnLibraryError, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", RuntimeError),
    (2042, errs.CudnnBadParamError, "CUDNN_STATUS_BAD_PARAM_42", ValueError),    # a sub-code after 9.28
    (3077, errs.CudnnNotSupportedError, "CUDNN_STATUS_NOT_SUPPORTED_77", GraphNotSupportedError),
    (7000, errs.CudnnStatusError, "CUDNN_STATUS_UNKNOWN_7000", CudnnGraphError),
])
def test_raise_for_status_maps_by_family_and_keeps_the_exact_name(status, cls, name, also):
    with pytest.raises(cls) as info:
        errs.raise_for_status(status, "cudnnBackendFinalize(OPERATIONGRAPH)", "  what cuDNN said \n",
                              "text of cudnnGetErrorString")
    error = info.value
    assert type(error) is cls and isinstance(error, also) and isinstance(error, errs.CudnnStatusError)
    assert error.status == status and error.status_name == name
    assert error.last_error == "what cuDNN said" and error.error_string == "text of cudnnGetErrorString"
    assert error.where == "cudnnBackendFinalize(OPERATIONGRAPH)"
    message = str(error)
    assert message.startswith(f"cudnnBackendFinalize(OPERATIONGRAPH): {name} ({status})")
    assert "what cuDNN said" in message
    import pickle
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls and clone.status == status and str(clone) == message


def test_success_raises_nothing():
    assert errs.raise_for_status(0, "cudnnCreate") is None
    assert _loader.check_status(0, "cudnnCreate") is None


def test_check_status_without_a_library_maps_the_same_way():
    with pytest.raises(errs.CudnnBadParamError) as info:
        _loader.check_status(2004, "cudnnBackendExecute")
    assert info.value.status_name == "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"
    assert info.value.where == "cudnnBackendExecute"


def test_status_names_match_the_header():
    constants = header_constants()
    deprecated_aliases = {"CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ARCH_MISMATCH", "CUDNN_STATUS_MAPPING_ERROR",
                          "CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING", "CUDNN_STATUS_VERSION_MISMATCH"}
    statuses = {n: v for n, v in constants.items() if n.startswith("CUDNN_STATUS_") and n not in deprecated_aliases}
    assert {v: n for n, v in statuses.items()} == errs.STATUS_NAMES


def test_loader_errors_are_typed():
    error = errs.CudnnVersionError("native SDPA forward", 91301, 91200)
    assert isinstance(error, GraphNotSupportedError) and isinstance(error, NotImplementedError)
    assert str(error) == "native SDPA forward needs cuDNN >= 9.13.1; the loaded cuDNN is 9.12.0"
    symbol_error = errs.CudnnSymbolError([("x", "y")], "cudnnBackendExecute")
    assert isinstance(symbol_error, errs.CudnnNotFoundError) and isinstance(symbol_error, RuntimeError)
    assert symbol_error.symbol == "cudnnBackendExecute" and "  - x: y" in str(symbol_error)


# ---- the declared ABI ----------------------------------------------------------------------------

# Values checked by hand against cuDNN 9.28's cudnn_graph.h (and, for all of them at once, by
# compiling static assertions against that header).
KNOWN_VALUES = {
    "CUDNN_STATUS_SUCCESS": 0,
    "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH": 2008,
    "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN": 3001,
    "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS": 5002,
    "CUDNN_STATUS_ALLOC_FAILED": 4003,
    "CUDNN_DATA_BFLOAT16": 9,
    "CUDNN_DATA_FP8_E8M0": 15,
    "CUDNN_DATA_FP8_E5M3": 23,
    "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR": 15,
    "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR": 16,
    "CUDNN_BACKEND_TENSOR_DESCRIPTOR": 17,
    "CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR": 41,
    "CUDNN_BACKEND_OPERATION_ROPE_BWD_DESCRIPTOR": 50,
    "CUDNN_ATTR_ENGINEHEUR_MODE": 200,
    "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE": 402,
    "CUDNN_ATTR_TENSOR_UNIQUE_ID": 906,
    "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC": 913,
    "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS": 1001,
    "CUDNN_ATTR_VARIANT_PACK_OVERRIDE_STRIDES": 1012,
    "CUDNN_ATTR_OPERATION_MATMUL_ADESC": 1520,
    "CUDNN_ATTR_OPERATION_REDUCTION_GROUP_OFFSET_DESC": 1613,
    "CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC": 2800,
    "CUDNN_ATTR_OPERATION_SOFTMAX_STATS_LOG2": 3106,
    "CUDNN_ATTR_OPERATION_ROPE_BWD_ROPE_DIM": 3414,
    "CUDNN_TYPE_BACKEND_DESCRIPTOR": 15,
    "CUDNN_TYPE_FRACTION": 26,
    "CUDNN_TYPE_CUDA_GRAPH_RETENTION": 33,
    "CUDNN_POINTWISE_SQRT": 4,
    "CUDNN_POINTWISE_GELU_APPROX_TANH_FWD": 107,
    "CUDNN_POINTWISE_BINARY_SELECT": 601,
    "CUDNN_HEUR_MODE_A": 3,
    "CUDNN_KNOB_TYPE_TILE_CGA_M": 27,
    "CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING": 4,
    "CUDNN_OPERATIONGRAPH_MODE_AUTO": -1,
}


def test_header_values_spot_check():
    constants = header_constants()
    assert {name: constants.get(name) for name in KNOWN_VALUES} == KNOWN_VALUES


def test_header_enums_are_complete():
    constants = header_constants()
    descriptors = sorted(v for n, v in constants.items() if n.startswith("CUDNN_BACKEND_") and n.endswith("_DESCRIPTOR"))
    assert descriptors == list(range(51))   # every descriptor type cuDNN 9.28 has, no gap
    attributes = [v for n, v in constants.items() if n.startswith("CUDNN_ATTR_")]
    assert len(attributes) == 383 and len(set(attributes)) == 383
    attribute_types = sorted(v for n, v in constants.items() if n.startswith("CUDNN_TYPE_"))
    assert attribute_types == list(range(34))


def test_pxd_declares_every_header_constant():
    declared = set(re.findall(r"^\s+(CUDNN_\w+)\s*$", ABI_PXD.read_text(), re.M))
    assert declared == set(header_constants())


def test_header_compiles_as_c_and_cxx():
    compilers = [(shutil.which(name), flags) for name, flags in
                 (("cc", ["-std=c99", "-pedantic", "-x", "c"]), ("c++", ["-x", "c++"]))]
    compilers = [(exe, flags) for exe, flags in compilers if exe]
    if not compilers:
        pytest.skip("no C compiler")
    for exe, flags in compilers:
        subprocess.run([exe, "-fsyntax-only", "-Wall", "-Wextra", "-Werror", *flags, str(HEADER)], check=True)


# ---- the pygraph-compatible enums ----------------------------------------------------------------

def test_enum_values_are_the_backend_constants():
    constants = header_constants()
    checked = 0
    for enum_cls, (_ctype, prefix) in enums.BACKEND_ENUMS.items():
        for member in enum_cls:
            if member.value < 0:
                with pytest.raises(ValueError):
                    enums.backend_value(member)
                continue
            assert constants[prefix + member.name] == member.value, (enum_cls.__name__, member.name)
            assert enums.backend_name(member) == prefix + member.name
            checked += 1
    assert checked > 100


def test_enum_spot_values_and_maps():
    assert enums.heur_mode.A == 3 and enums.heur_mode.B == 1 and enums.heur_mode.FALLBACK == 2
    assert enums.HEUR_MODE_TO_BACKEND == {enums.heur_mode.A: 3, enums.heur_mode.B: 1, enums.heur_mode.FALLBACK: 2}
    assert enums.norm_forward_phase.INFERENCE == 0 and enums.norm_forward_phase.TRAINING == 1
    assert enums.reduction_mode.AMAX == 4 and enums.pointwise_mode.RELU_FWD == 100
    assert enums.knob_type.SWIZZLE == 1 and enums.convolution_mode.CROSS_CORRELATION == 1
    assert enums.numerical_note.STRICT_NAN_PROP == 9 and enums.behavior_note.CUBLASLT_DEPENDENCY == 4
    assert enums.norm_forward_phase.NOT_SET not in enums.NORM_FORWARD_PHASE_TO_BACKEND
    assert [m.name for m in enums.build_plan_policy] == ["HEURISTICS_CHOICE", "ALL"]
    assert [m.name for m in enums.diagonal_alignment] == ["TOP_LEFT", "BOTTOM_RIGHT"]
    assert [m.name for m in enums.attention_implementation] == ["AUTO", "COMPOSITE", "UNIFIED"]
    with pytest.raises(ValueError):
        enums.to_backend_map(enums.attention_implementation)


def test_enum_names_cover_pygraph():
    # The member names cudnn-frontend 1.23's python bindings register (python/properties.cpp).
    pygraph = {
        "heur_mode": {"A", "B", "FALLBACK", "OPENSOURCE"},
        "reduction_mode": {"ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS", "NOT_SET"},
        "norm_forward_phase": {"INFERENCE", "TRAINING", "NOT_SET"},
        "build_plan_policy": {"HEURISTICS_CHOICE", "ALL"},
        "numerical_note": {"TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
                           "NONDETERMINISTIC", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6",
                           "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP"},
        "behavior_note": {"RUNTIME_COMPILATION", "REQUIRES_FILTER_INT8x32_REORDER",
                          "REQUIRES_BIAS_INT8x32_REORDER", "SUPPORTS_CUDA_GRAPH_NATIVE_API",
                          "CUBLASLT_DEPENDENCY"},
        "knob_type": {"NOT_SET", "SWIZZLE", "TILE_SIZE", "EDGE", "MULTIPLY", "SPLIT_K_BUF", "TILEK", "STAGES",
                      "REDUCTION_MODE", "SPLIT_K_SLC", "IDX_MODE", "SPECFILT", "KERNEL_CFG", "WORKSPACE",
                      "TILE_CGA_M", "TILE_CGA_N", "BLOCK_SIZE", "OCCUPANCY", "ARRAY_SIZE_PER_THREAD",
                      "SPLIT_COLS", "TILE_ROWS", "TILE_COLS", "LOAD_SIZE", "CTA_COUNT", "STREAM_K",
                      "SPLIT_P_SLC", "TILE_M", "TILE_N", "WARP_SPEC_CFG"},
        "convolution_mode": {"CONVOLUTION", "CROSS_CORRELATION"},
        "diagonal_alignment": {"TOP_LEFT", "BOTTOM_RIGHT"},
        "attention_implementation": {"AUTO", "COMPOSITE", "UNIFIED"},
        "reshape_mode": {"VIEW_ONLY", "LOGICAL"},
        "tensor_reordering": {"NONE", "INT8x32", "F16x16", "F8_128x4"},
        "moe_grouped_matmul_mode": {"NONE", "GATHER", "SCATTER"},
    }
    for name, members in pygraph.items():
        assert members <= set(getattr(enums, name).__members__), name
