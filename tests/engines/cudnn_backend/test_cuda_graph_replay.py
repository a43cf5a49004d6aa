"""CUDA graph replay of repeated executes (cuDNN's cudnnBackendPopulateCudaGraph + cuGraphLaunch).

CPU tests drive the execute path against one stand-in library that is both libcudnn (the recording
one of test_cudnn_backend, plus a populate entry point) and libcuda (contexts, pointer queries and
graphs that remember the operands they were populated with): the log shows which calls executed,
which populated a graph and which launched one, with the pointers each used. GPU tests (marked
``gpu``) compare replayed results with cudnnBackendExecute's on real graphs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

# Replay is cuDNN's: pin its plans (the CuTe GEMM engine, where installed, claims these matmul graphs too).
pytestmark = pytest.mark.usefixtures("prefer_cudnn")

from test_cudnn_backend import RECORDING_LIBCUDNN

FAKE_DRIVER = r"""
/* ---- libcuda stand-in: one device, per-thread current context, graphs that replay a recorded line ---- */
typedef struct { char text[1900]; } fake_graph_t;
static __thread void *current_ctx;
static int the_context;
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = &the_context; return 0; }
int cuCtxGetCurrent(void **c) { *c = current_ctx; return 0; }
int cuCtxSetCurrent(void *c) { current_ctx = c; return 0; }
int cuCtxPushCurrent_v2(void *c) { current_ctx = c; return 0; }
int cuCtxPopCurrent_v2(void **c) { *c = current_ctx; current_ctx = 0; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuStreamGetCtx(void *s, void **c) { *c = &the_context; return 0; }
int cuGetErrorName(int e, const char **name) { *name = "CUDA_ERROR_FAKE"; return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { static unsigned long long next = 0x40000000ULL;
    pthread_mutex_lock(&lock); *p = next; next += (n + 0xffff) & ~0xffffULL; pthread_mutex_unlock(&lock); return 0; }
int cuMemFree_v2(unsigned long long p) { return 0; }
int cuMemsetD8Async(unsigned long long d, unsigned char v, size_t n, void *s) {
    char b[128]; snprintf(b, 128, "memset %lu %p 0x%llx %zu", (unsigned long)pthread_self(), s, d, n); emit(b); return 0; }
/* Device memory is [0x100000, 0x80000000); anything else is memory the driver does not know. */
int cuPointerGetAttribute(void *data, int attribute, unsigned long long p) {
    if (p < 0x100000ULL || p >= 0x80000000ULL) return 1;
    *(int *)data = attribute == 2 ? 2 : 0; return 0;
}
int cuStreamIsCapturing(void *s, int *status) { *status = s == (void *)0xCA970000 ? 1 : 0; return 0; }
int cuGraphCreate(void **g, unsigned flags) { *g = calloc(1, sizeof(fake_graph_t)); return 0; }
int cuGraphDestroy(void *g) { free(g); return 0; }
int cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags) {
    fake_graph_t *x = malloc(sizeof *x); memcpy(x, g, sizeof *x); *e = x;
    char b[64]; snprintf(b, 64, "instantiate %p", (void *)x); emit(b); return 0;
}
int cuGraphExecDestroy(void *e) { char b[64]; snprintf(b, 64, "exec_destroy %p", e); emit(b); free(e); return 0; }
int cuGraphLaunch(void *e, void *s) {
    const char *fail = getenv("FAKE_LAUNCH_STATUS");
    char b[2048]; snprintf(b, 2048, "launch %lu %p %s", (unsigned long)pthread_self(), s, ((fake_graph_t *)e)->text);
    emit(b); return fail ? atoi(fail) : 0;
}
#ifndef NO_POPULATE
int cudnnBackendPopulateCudaGraph(void *h, void *plan, void *v, void *g) {
    const char *fail = getenv("FAKE_POPULATE_STATUS");
    desc_t *x = v; fake_graph_t *graph = g;
    char b[2048]; int k = snprintf(b, 2048, "populate %lu %p", (unsigned long)pthread_self(), plan);
    if (fail && atoi(fail)) { emit(b); return atoi(fail); }
    int t = snprintf(graph->text, sizeof graph->text, "%p %p", plan, x->ws);
    for (int i = 0; i < x->n; i++) t += snprintf(graph->text + t, sizeof graph->text - t, " %lld=%p",
                                                 (long long)x->uids[i], x->ptrs[i]);
    snprintf(b + k, 2048 - k, " %s", graph->text); emit(b); return 0;
}
#endif
#ifndef NO_CAPTURE
/* Stream capture: an execute issued on a handle bound to the capturing stream is recorded, not run. */
static __thread void *capturing;
static __thread fake_graph_t *captured;
int cuStreamCreate(void **s, unsigned flags) {
    static unsigned long next = 0xC0000;
    pthread_mutex_lock(&lock); next += 0x100; *s = (void *)next; pthread_mutex_unlock(&lock);
    char b[64]; snprintf(b, 64, "stream_create %p %u", *s, flags); emit(b); return 0;
}
int cuStreamDestroy_v2(void *s) { char b[64]; snprintf(b, 64, "stream_destroy %p", s); emit(b); return 0; }
int cuStreamBeginCapture_v2(void *s, int mode) {
    capturing = s; captured = calloc(1, sizeof *captured);
    char b[64]; snprintf(b, 64, "begin_capture %p %d", s, mode); emit(b); return 0;
}
int cuStreamEndCapture(void *s, void **g) {
    if (s != capturing) return 901;
    const char *fail = getenv("FAKE_END_CAPTURE_STATUS");
    *g = captured; capturing = 0; captured = 0;
    emit("end_capture");
    if (fail && atoi(fail)) { free(*g); *g = 0; return atoi(fail); }
    return 0;
}
int cuGraphGetNodes(void *g, void **nodes, size_t *n) { *n = ((fake_graph_t *)g)->text[0] ? 1 : 0; return 0; }
static int captured_execute(const char *line) {
    if (!capturing || bound_stream != capturing || getenv("FAKE_CAPTURE_ELSEWHERE")) return 0;
    const char *rest = strchr(strchr(line, ' ') + 1, ' ') + 1;      /* after "execute <thread> " */
    snprintf(captured->text, sizeof captured->text, "%s", rest);
    char b[2048]; snprintf(b, 2048, "capture %lu %s", (unsigned long)pthread_self(), rest); emit(b);
    return 1;
}
#else
static int captured_execute(const char *line) { return 0; }
#endif
"""


def fake_cuda_source() -> str:
    """The stand-in's C source: RECORDING_LIBCUDNN (appending to its log, its version a macro, its
    execute captured on a capturing stream) followed by FAKE_DRIVER."""
    # One file serves as both libraries (one log, one state); append so that no opener truncates.
    source = RECORDING_LIBCUDNN.replace('fopen(getenv("FAKE_CUDNN_LOG"), "w")', 'fopen(getenv("FAKE_CUDNN_LOG"), "a")')
    source = source.replace("size_t cudnnGetVersion(void) { return 91900; }",
                            "size_t cudnnGetVersion(void) { return FAKE_VERSION; }")
    # The handle's bound stream decides whether an execute is captured (FAKE_DRIVER's capture calls).
    source = source.replace("int cudnnSetStream(void *h, void *s) { char b[64];",
                            "static __thread void *bound_stream; static int captured_execute(const char *line);\n"
                            "int cudnnSetStream(void *h, void *s) { bound_stream = s; char b[64];")
    source = source.replace("(long long)x->uids[i], x->ptrs[i]);\n    emit(b); return 0;",
                            "(long long)x->uids[i], x->ptrs[i]);\n"
                            "    const char *fail = getenv(\"FAKE_CAPTURED_EXECUTE_STATUS\");\n"
                            "    if (captured_execute(b)) return fail ? atoi(fail) : 0;\n    emit(b); return 0;")
    assert "FAKE_VERSION" in source and '"a")' in source
    assert "bound_stream = s" in source and "captured_execute(b)" in source
    return source + FAKE_DRIVER


def fake_cuda_builder(root, source: str | None = None):
    """make(variant, version) -> env for a child process using a stand-in built from ``source``
    (fake_cuda_source() unless given) under ``root``; each variant is compiled once."""
    from _helpers import c_compiler_or_skip
    cc = c_compiler_or_skip("a stand-in libcudnn / libcuda")
    source = fake_cuda_source() if source is None else source
    built = {}

    def make(variant="", version=91900):
        key = (variant, version)
        if key not in built:
            folder = root / f"v{len(built)}"
            folder.mkdir()
            (folder / "fake.c").write_text(source)
            lib = folder / "libcuda.so.1"
            flags = [f"-DFAKE_VERSION={version}"] + [f"-D{v}" for v in variant.split()]
            subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, str(folder / "fake.c"), "-o", str(lib),
                            "-lpthread"], check=True)
            os.symlink(lib, folder / "libcudnn.so.9")
            built[key] = folder
        folder = built[key]
        return {"CUDNN_GRAPH_LIBCUDNN": str(folder / "libcudnn.so.9"), "LD_LIBRARY_PATH": str(folder)}

    return make


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    """Build the stand-in; returns make(variant) -> env for a child process using it."""
    return fake_cuda_builder(tmp_path_factory.mktemp("fake_cuda"))


def run_child(code: str, env: dict, log) -> tuple[dict, list]:
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("CUDNN_GRAPH_LIBCUDNN", "CUDNN_GRAPH_CUDA_GRAPHS", "LD_LIBRARY_PATH")}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full_env["FAKE_CUDNN_LOG"] = str(log)
    full_env.update(env)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=full_env, timeout=300)
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
    records = []
    if os.path.exists(log):
        with open(log) as f:
            records = [line.split() for line in f.read().splitlines()]
    return json.loads(result.stdout.strip().splitlines()[-1]), records


PROLOGUE = """
import json, sys, threading
import numpy as np
from cudnn_graph import _bench_timing, _cudnn_descriptor, _cudnn_handle, _plan_runner, _driver, TensorSpec, PackLayout
assert _driver.driver_available(), "the stand-in libcuda did not load"
plan = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR").finalize()
runner = _plan_runner.PlanRunner(plan, 0, 0, "fake")
layout = PackLayout([TensorSpec(3, (4, 8), "float16", name="x"),
                     TensorSpec(5, (4, 8), "float16", name="y", is_output=True),
                     TensorSpec(7, (1,), "float32", device="cpu", name="s", required=False)])
# A host operand takes an explicit host Slot: a bare int there would be dereferenced by this process.
from cudnn_graph import Slot
S7 = Slot.from_address(0x300004, (1,), dtype="float32", device="cpu")
state = _cudnn_handle.current_thread_state()
def run(x, y, **kw):
    kw.setdefault("stream", 0)
    runner.run(layout.pack({3: x, 5: y}), **kw)
"""


def test_a_driver_missing_device_queries_raises_instead_of_crashing(fake_cuda, tmp_path):
    """The stand-in libcuda has no cuDeviceGetName / cuDeviceGetAttribute: querying a device is a typed
    error (engines that ask for the architecture then decline), never a call through a NULL pointer."""
    out, _ = run_child("""
import json
from cudnn_graph import _driver
try:
    _driver.device_info(0)
    print(json.dumps({"error": None}))
except RuntimeError as exc:
    print(json.dumps({"error": str(exc)}))
""", fake_cuda(), tmp_path / "log")
    assert out["error"] is not None and "cuDeviceGetName" in out["error"]


def kinds(records):
    """The execute-path calls in order: execute / populate / launch / exec_destroy."""
    return [r[0] for r in records if r[0] in ("execute", "populate", "capture", "launch", "exec_destroy", "memset")]


def pointers(record):
    """{uid: pointer} of an execute, populate or launch line."""
    return dict(tuple(int(x, 16) if i else int(x) for i, x in enumerate(f.split("="))) for f in record if "=" in f)


def test_a_repeated_pack_is_populated_once_then_launched(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
for _ in range(5):
    run(0x100000, 0x200000)
print(json.dumps({"graphs": state.cached_graphs, "support": runner.cuda_graph_support}))
""", fake_cuda(), tmp_path / "log")
    # the first call builds the variant pack and executes; the repeat populates, then every call launches
    assert kinds(records) == ["execute", "populate", "launch", "launch", "launch", "launch"]
    assert out == {"graphs": 1, "support": True}
    for r in records:
        if r[0] in ("execute", "populate", "launch"):
            assert pointers(r) == {3: 0x100000, 5: 0x200000}
    launches = [r for r in records if r[0] == "launch"]
    assert {r[2] for r in launches} == {"(nil)"}            # the caller's stream: the default one


def test_changing_pointers_build_a_graph_per_repeated_pack_and_launch_the_matching_one(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
for x, y in [(0x100000, 0x200000)] * 2 + [(0x300000, 0x200000)] * 2 + [(0x100000, 0x200000), (0x300000, 0x200000)]:
    run(x, y)
print(json.dumps({"graphs": state.cached_graphs}))
""", fake_cuda(), tmp_path / "log")
    calls = [(r[0], pointers(r)[3]) for r in records if r[0] in ("execute", "populate", "launch")]
    assert calls == [("execute", 0x100000), ("populate", 0x100000), ("launch", 0x100000),
                     ("execute", 0x300000), ("populate", 0x300000), ("launch", 0x300000),
                     ("launch", 0x100000), ("launch", 0x300000)]
    assert out["graphs"] == 2


def test_graphs_launch_on_the_stream_each_call_names(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
run(0x100000, 0x200000, stream=0x5000)
run(0x100000, 0x200000, stream=0x5000)
run(0x100000, 0x200000, stream=0x6000)
run(0x100000, 0x200000)                              # no stream: the legacy default stream
h = _cudnn_handle.create_handle()
_cudnn_handle.set_stream(handle=h, stream=0x7000)
runner.run(layout.pack({3: 0x100000, 5: 0x200000}), handle=h)     # a handle keeps its bound stream
runner.run(layout.pack({3: 0x100000, 5: 0x200000}), handle=0x1000, stream=0x8000)   # a foreign handle
runner.run(layout.pack({3: 0x100000, 5: 0x200000}), handle=0x1000)  # its stream is unknown: no graph
print(json.dumps({}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute", "populate"] + ["launch"] * 5 + ["execute"]
    assert [r[2] for r in records if r[0] == "launch"] == ["0x5000", "0x6000", "(nil)", "0x7000", "0x8000"]


def test_eviction_destroys_the_graph_and_releases_the_plan(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
before = sys.getrefcount(plan)
for i in range(6):                                   # six repeated packs through a four-entry cache
    run(0x100000 * (i + 1), 0x7000000)
    run(0x100000 * (i + 1), 0x7000000)
held = sys.getrefcount(plan)
graphs = state.cached_graphs
run(0x100000, 0x7000000)                             # evicted long ago: a fresh pack (evicting pack 3's graph)
after_run = sys.getrefcount(plan)
state.clear_variant_packs()
print(json.dumps({"before": before, "held": held, "after_run": after_run, "after": sys.getrefcount(plan),
                  "graphs": graphs, "cleared": state.cached_graphs}))
""", fake_cuda(), tmp_path / "log")
    k = kinds(records)
    assert k.count("populate") == 6
    assert out["graphs"] == 4 and out["cleared"] == 0
    # each graph alive in the cache holds one reference to the plan it replays; none is left after
    assert out["held"] == out["before"] + 4 and out["after_run"] == out["before"] + 3
    assert out["after"] == out["before"]
    instantiated = [r[1] for r in records if r[0] == "instantiate"]
    destroyed = [r[1] for r in records if r[0] == "exec_destroy"]
    # packs 5 and 6 took the slots of packs 1 and 2, the last call took pack 3's, the clear did the rest
    assert destroyed == instantiated[:3] + sorted(instantiated[3:], key=destroyed.index)
    assert sorted(destroyed) == sorted(instantiated)             # every graph destroyed exactly once
    assert k[-5:] == ["exec_destroy", "execute", "exec_destroy", "exec_destroy", "exec_destroy"]


def test_a_plan_that_cannot_be_populated_is_marked_once_and_executes(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
import logging
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
for i in range(6):
    run(0x100000 * (1 + i % 2), 0x800000)
other = _plan_runner.PlanRunner(plan, 0, 0, "other")
other.run(layout.pack({3: 0x100000, 5: 0x800000}), stream=0)
other.run(layout.pack({3: 0x100000, 5: 0x800000}), stream=0)
print(json.dumps({"support": runner.cuda_graph_support, "other": other.cuda_graph_support,
                  "graphs": state.cached_graphs}))
""", {**fake_cuda("NO_CAPTURE"), "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log")
    k = kinds(records)
    # one failed populate for the runner (on its first repeat), one for the other runner; all execute
    assert k.count("populate") == 2 and "launch" not in k and k.count("execute") == 8
    assert out == {"support": False, "other": False, "graphs": 0}


def test_a_failed_launch_drops_the_graph_and_executes(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
for _ in range(4):
    run(0x100000, 0x200000)
print(json.dumps({"graphs": state.cached_graphs, "support": runner.cuda_graph_support}))
""", {**fake_cuda(), "FAKE_LAUNCH_STATUS": "700"}, tmp_path / "log")
    assert kinds(records) == ["execute", "populate", "launch", "exec_destroy", "execute", "execute", "execute"]
    assert out == {"graphs": 0, "support": True}


def test_packs_with_host_operands_are_never_replayed(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
# a by-value scalar the caller may change in place; the stand-in driver calls [0x100000, 0x80000000) device
# memory, where a small array of a non-PIE Python's heap can land: the scalar lives in an mmap'ed block
scale = np.zeros(1 << 16, np.float32)[:1]
assert not 0x100000 <= scale.ctypes.data < 0x80000000, hex(scale.ctypes.data)
for value in (2.0, 3.0, 4.0):
    scale[0] = value
    runner.run(layout.pack({3: 0x100000, 5: 0x200000, 7: scale}), stream=0)
print(json.dumps({"graphs": state.cached_graphs}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute"] * 3 and out["graphs"] == 0


def test_a_capturing_stream_gets_the_ordinary_execute(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
run(0x100000, 0x200000)
run(0x100000, 0x200000)
run(0x100000, 0x200000, stream=0xCA970000)       # being captured: record the execute, not a graph launch
run(0x100000, 0x200000)
run(0x300000, 0x200000, stream=0xCA970000)
run(0x300000, 0x200000, stream=0xCA970000)       # a repeat while captured: no graph is built yet
run(0x300000, 0x200000)                          # the next repeat outside the capture builds it
print(json.dumps({"graphs": state.cached_graphs}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute", "populate", "launch", "execute", "launch",
                              "execute", "execute", "populate", "launch"]
    assert out["graphs"] == 2


def test_the_switch_turns_replay_off_and_on(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
was = _cudnn_handle.set_cuda_graph_replay(False)
for _ in range(3):
    run(0x100000, 0x200000)
off_graphs = state.cached_graphs
again = _cudnn_handle.set_cuda_graph_replay(True)
for _ in range(2):
    run(0x100000, 0x200000)
print(json.dumps({"was": was, "again": again, "off_graphs": off_graphs, "on": _cudnn_handle.cuda_graph_replay_enabled()}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute"] * 3 + ["populate", "launch", "launch"]
    assert out == {"was": True, "again": False, "off_graphs": 0, "on": True}


@pytest.mark.parametrize("value, expected", [("0", False), ("1", True), ("off", False), (" TRUE ", True),
                                             ("", True), (None, True)])
def test_the_environment_variable_sets_the_default(fake_cuda, tmp_path, value, expected):
    env = fake_cuda() if value is None else {**fake_cuda(), "CUDNN_GRAPH_CUDA_GRAPHS": value}
    out, records = run_child(PROLOGUE + """
run(0x100000, 0x200000)
run(0x100000, 0x200000)
print(json.dumps({"on": _cudnn_handle.cuda_graph_replay_enabled()}))
""", env, tmp_path / "log")
    assert out["on"] is expected
    assert ("populate" in kinds(records)) is expected


def test_an_unreadable_environment_value_warns_and_keeps_the_default():
    from cudnn_graph import _cudnn_handle
    with pytest.warns(RuntimeWarning, match=r"CUDNN_GRAPH_CUDA_GRAPHS='maybe' is not 0 or 1"):
        assert _cudnn_handle._switch_from_env("maybe", True) is True
    with pytest.warns(RuntimeWarning, match="stays off"):
        assert _cudnn_handle._switch_from_env("2", False) is False
    assert _cudnn_handle._switch_from_env("no", True) is False and _cudnn_handle._switch_from_env("yes", False) is True


def test_switch_works_without_cudnn_or_a_gpu():
    from cudnn_graph import _cudnn_handle
    previous = _cudnn_handle.set_cuda_graph_replay(False)
    try:
        assert _cudnn_handle.cuda_graph_replay_enabled() is False
        assert _cudnn_handle.set_cuda_graph_replay(True) is False
        assert _cudnn_handle.cuda_graph_replay_enabled() is True
    finally:
        _cudnn_handle.set_cuda_graph_replay(previous)


@pytest.mark.parametrize("variant, version", [("NO_POPULATE NO_CAPTURE", 91900), ("NO_CAPTURE", 90400)])
def test_a_cudnn_without_the_populate_entry_point_nor_capture_just_executes(fake_cuda, tmp_path, variant,
                                                                            version):
    out, records = run_child(PROLOGUE + """
from cudnn_graph import _loader
for _ in range(4):
    run(0x100000, 0x200000)
print(json.dumps({"graphs": state.cached_graphs, "support": runner.cuda_graph_support,
                  "symbol": _loader.library_info()["optional_entry_points"]["cudnnBackendPopulateCudaGraph"]}))
""", fake_cuda(variant, version), tmp_path / "log")
    assert kinds(records) == ["execute"] * 4
    assert out == {"graphs": 0, "support": None, "symbol": False}


def test_without_a_driver_replay_stays_out_of_the_way(fake_cuda, tmp_path):
    env = fake_cuda()
    env["LD_LIBRARY_PATH"] = str(tmp_path)     # libcudnn stand-in only: no libcuda.so.1 to be found here
    code = PROLOGUE.replace('assert _driver.driver_available(), "the stand-in libcuda did not load"',
                            'has_driver = _driver.driver_available()')
    out, records = run_child(code + """
for _ in range(4):
    run(0x100000, 0x200000)
print(json.dumps({"graphs": state.cached_graphs, "driver": has_driver}))
""", env, tmp_path / "log")
    if out["driver"]:
        pytest.skip("a real libcuda is on the default search path")
    assert kinds(records) == ["execute"] * 4 and out["graphs"] == 0


def test_zero_filled_scratch_is_cleared_on_the_stream_before_each_launch(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
zeroed = _plan_runner.PlanRunner(plan, 256, 0, "zeroed", scratch=[(21, 64, True)])
for _ in range(3):
    zeroed.run(layout.pack({3: 0x100000, 5: 0x200000}), stream=0x5000, workspace=0x800000)
print(json.dumps({}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["memset", "execute", "memset", "populate", "launch", "memset", "launch"]
    for r in records:
        if r[0] == "memset":
            assert r[2:4] == ["0x5000", "0x800100"]
        if r[0] == "launch":
            assert pointers(r)[21] == 0x800100


def test_two_plans_on_the_same_pointers_take_the_graph_in_turn(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
plan_b = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR").finalize()
b = _plan_runner.PlanRunner(plan_b, 0, 0, "b")
pack = layout.pack({3: 0x100000, 5: 0x200000})
order = [runner, runner, runner, b, runner, b, b, b, runner, runner]
for r in order:
    r.run(pack, stream=0)
print(json.dumps({"a": plan.ptr, "b": plan_b.ptr}))
""", fake_cuda(), tmp_path / "log")
    a, b = f"{out['a']:#x}", f"{out['b']:#x}"
    seen = [(r[0], r[3] if r[0] == "launch" else r[2]) for r in records if r[0] in ("populate", "launch")]
    # a repeats: a graph for a, launched whenever a runs; b alternating with a executes; b repeating
    # takes the graph over (a's is destroyed); then a repeating takes it back
    assert seen == [("populate", a), ("launch", a), ("launch", a), ("launch", a), ("populate", b),
                    ("launch", b), ("launch", b), ("populate", a), ("launch", a)]
    assert kinds(records).count("exec_destroy") == 2


def test_views_and_omitted_operands_replay_like_the_execute(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
replaced = _plan_runner.PlanRunner(plan, 0, 0, "viewed", [], aliases=[(9, 3, 64)], omit=[3])
for _ in range(3):
    replaced.run(layout.pack({3: 0x100000, 5: 0x200000}), stream=0)
print(json.dumps({}))
""", fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute", "populate", "launch", "launch"]
    for r in records:
        if r[0] in ("execute", "populate", "launch"):
            assert pointers(r) == {5: 0x200000, 9: 0x100040}


def test_threads_build_and_launch_their_own_graphs(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
barrier = threading.Barrier(8)
counts = {}
def work(i):
    barrier.wait()
    for j in range(40):
        run(0x1000000 * (i + 1), 0x1000000 * (i + 1) + 0x1000 * (j % 3))
    counts[i] = _cudnn_handle.current_thread_state().cached_graphs
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"counts": sorted(counts.values())}))
""", fake_cuda(), tmp_path / "log")
    work = [r for r in records if r[0] in ("execute", "populate", "launch")]
    assert sum(r[0] in ("execute", "launch") for r in work) == 8 * 40
    assert sum(r[0] == "populate" for r in work) == 8 * 3         # each thread: one graph per pack
    assert out["counts"] == [3] * 8
    by_thread = {}
    for r in work:
        p = pointers(r)
        assert p[5] - p[3] in (0, 0x1000, 0x2000), r              # x and y from the same call
        by_thread.setdefault(r[1], set()).add(p[3])
    assert len(by_thread) == 8 and all(len(xs) == 1 for xs in by_thread.values())


def test_graph_floor_measures_launches_and_names_a_failed_populate(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
ns = _bench_timing.execute_graph_floor_ns(runner, layout.pack({3: 0x100000, 5: 0x200000}), 10)
print(json.dumps({"ns": ns}))
""", fake_cuda(), tmp_path / "log")
    assert out["ns"] > 0
    assert kinds(records) == ["populate"] + ["launch"] * 11 + ["exec_destroy"]
    out, _ = run_child(PROLOGUE + """
try:
    _bench_timing.execute_graph_floor_ns(runner, layout.pack({3: 0x100000, 5: 0x200000}), 10)
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "text": str(e)}))
""", {**fake_cuda("NO_CAPTURE"), "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log2")
    assert "cudnnBackendPopulateCudaGraph" in out["text"]


# ---- capture: plans cuDNN refuses to populate get their execute recorded ---------------------------------

def stream_binds(records):
    return [r[1] for r in records if r[0] == "stream"]


def test_a_plan_cudnn_cannot_populate_is_captured_once_then_launched(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
for _ in range(4):
    run(0x100000, 0x200000)
method = runner.cuda_graph_method
for _ in range(3):
    run(0x300000, 0x200000)                      # a new pack: the plan is known to need a capture
print(json.dumps({"graphs": state.cached_graphs, "support": runner.cuda_graph_support, "method": method}))
""", {**fake_cuda(), "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log")
    # the captured execute records the work without running it: the launch right after runs it
    assert kinds(records) == ["execute", "populate", "capture", "launch", "launch", "launch",
                              "execute", "capture", "launch", "launch"]
    assert out == {"graphs": 2, "support": True, "method": "capture"}
    for r in records:
        if r[0] in ("capture", "launch"):
            assert pointers(r)[5] == 0x200000
    launches = [pointers(r)[3] for r in records if r[0] == "launch"]
    assert launches == [0x100000] * 3 + [0x300000] * 2


def test_capture_runs_on_a_private_stream_and_rebinds_the_callers(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
for _ in range(3):
    run(0x100000, 0x200000, stream=0x5000)
print(json.dumps({}))
""", {**fake_cuda(), "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log")
    created = [r for r in records if r[0] == "stream_create"]
    assert len(created) == 1 and created[0][2] == "1"                    # non-blocking
    private = created[0][1]
    assert [r[1:] for r in records if r[0] == "begin_capture"] == [[private, "1"]]   # thread-local mode
    assert stream_binds(records) == ["0x5000", private, "0x5000"]
    assert [r[1] for r in records if r[0] == "stream_destroy"] == [private]
    assert [r[2] for r in records if r[0] == "launch"] == ["0x5000", "0x5000"]


@pytest.mark.parametrize("failure", [{"FAKE_CAPTURED_EXECUTE_STATUS": "3000"}, {"FAKE_CAPTURE_ELSEWHERE": "1"},
                                     {"FAKE_END_CAPTURE_STATUS": "900"}],
                         ids=["execute-fails", "nothing-recorded", "capture-invalidated"])
def test_a_failed_capture_marks_the_plan_and_it_executes(fake_cuda, tmp_path, failure):
    out, records = run_child(PROLOGUE + """
for _ in range(5):
    run(0x100000, 0x200000, stream=0x5000)
print(json.dumps({"graphs": state.cached_graphs, "support": runner.cuda_graph_support,
                  "method": runner.cuda_graph_method}))
""", {**fake_cuda(), "FAKE_POPULATE_STATUS": "3000", **failure}, tmp_path / "log")
    k = kinds(records)
    assert "launch" not in k and k.count("populate") == 1
    # work that escaped the capture (ran on some other stream) ran then; the call still executes on its own
    escaped = ["execute"] if "FAKE_CAPTURE_ELSEWHERE" in failure else []
    assert [x for x in k if x != "capture"] == ["execute", "populate"] + escaped + ["execute"] * 4
    assert out == {"graphs": 0, "support": False, "method": None}
    assert stream_binds(records)[-1] == "0x5000"                         # rebound after the attempt
    assert len([r for r in records if r[0] == "stream_destroy"]) == 1


# Three executes of one pack, then how the runner got its graph.
THREE_RUNS_THEN_METHOD = PROLOGUE + """
for _ in range(3):
    run(0x100000, 0x200000)
print(json.dumps({"method": runner.cuda_graph_method}))
"""


def test_capture_without_a_populate_entry_point(fake_cuda, tmp_path):
    out, records = run_child(THREE_RUNS_THEN_METHOD, fake_cuda("NO_POPULATE"), tmp_path / "log")
    assert kinds(records) == ["execute", "capture", "launch", "launch"]
    assert out == {"method": "capture"}


def test_populated_plans_are_not_captured(fake_cuda, tmp_path):
    out, records = run_child(THREE_RUNS_THEN_METHOD, fake_cuda(), tmp_path / "log")
    assert kinds(records) == ["execute", "populate", "launch", "launch"]
    assert out == {"method": "populate"} and not any(r[0] == "begin_capture" for r in records)


@pytest.mark.parametrize("how", ["switch", "environment"])
def test_capture_can_be_turned_off(fake_cuda, tmp_path, how):
    env = {**fake_cuda(), "FAKE_POPULATE_STATUS": "3000"}
    if how == "environment":
        env["CUDNN_GRAPH_CUDA_GRAPH_CAPTURE"] = "0"
    out, records = run_child(PROLOGUE + f"""
if {how == "switch"!r}:
    assert _cudnn_handle.set_cuda_graph_capture(False) is True
for _ in range(3):
    run(0x100000, 0x200000)
print(json.dumps({{"on": _cudnn_handle.cuda_graph_capture_enabled(), "support": runner.cuda_graph_support}}))
""", env, tmp_path / "log")
    assert kinds(records) == ["execute", "populate", "execute", "execute"]
    assert out == {"on": False, "support": False}


def test_an_unreadable_capture_setting_warns_naming_its_variable():
    from cudnn_graph import _cudnn_handle
    with pytest.warns(RuntimeWarning, match=r"CUDNN_GRAPH_CUDA_GRAPH_CAPTURE='x' is not 0 or 1; CUDA graph capture"):
        _cudnn_handle._switch_from_env("x", True, _cudnn_handle.CUDA_GRAPH_CAPTURE_ENV_VAR, "CUDA graph capture")


def test_graph_floor_uses_a_capture_when_populate_is_refused(fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
ns = _bench_timing.execute_graph_floor_ns(runner, layout.pack({3: 0x100000, 5: 0x200000}), 10)
print(json.dumps({"ns": ns}))
""", {**fake_cuda(), "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log")
    assert out["ns"] > 0
    assert kinds(records) == ["populate", "capture"] + ["launch"] * 11 + ["exec_destroy"]


# ---- GPU: replayed results equal cudnnBackendExecute's -------------------------------------------------

def _matmul_epilogue_graph(torch, m=64, k=32, n=48, batch=2):
    import cudnn_graph as cudnn
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      device="cuda:0", name="mm_bias_relu")
    a = g.tensor(name="A", dim=[batch, m, k], stride=[m * k, k, 1])
    b = g.tensor(name="B", dim=[batch, k, n], stride=[k * n, n, 1])
    bias = g.tensor(name="bias", dim=[1, 1, n], stride=[n, n, 1])
    y = g.relu(g.bias(g.matmul(a, b), bias)).set_output(True).set_data_type(F.HALF)
    g.build([cudnn.heur_mode.A])
    shapes = {"A": (batch, m, k), "B": (batch, k, n), "bias": (1, 1, n), "Y": (batch, m, n)}
    return g, {"A": a, "B": b, "bias": bias, "Y": y}, shapes


def _fresh(torch, shapes, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t = {name: torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)
         for name, shape in shapes.items() if name != "Y"}
    t["Y"] = torch.empty(shapes["Y"], device="cuda", dtype=torch.float16)
    return t


def _want(torch, t):
    return torch.relu(t["A"].float() @ t["B"].float() + t["bias"].float())


def _close(torch, got, want):
    err = float((got.float() - want).abs().max())
    assert err <= 3e-2 * max(1.0, float(want.abs().max())), err


def _torch_matmul_epilogue_graph():
    """torch (or a skip without it), then ``_matmul_epilogue_graph(torch)``'s graph, tensors and shapes."""
    torch = pytest.importorskip("torch")
    return (torch, *_matmul_epilogue_graph(torch))


def _fresh_pack(torch, shapes, tensors, seed):
    """``_fresh`` tensors for ``seed`` and the pack that binds them to the graph's ``tensors``."""
    t = _fresh(torch, shapes, seed)
    return t, {tensors[name]: t[name] for name in t}


def _execute_and_check(torch, g, pack, t):
    """Execute ``g`` on ``pack`` on the default stream, synchronize, and check Y against the wanted result."""
    g.execute(pack)
    torch.cuda.synchronize()
    _close(torch, t["Y"], _want(torch, t))


@pytest.fixture
def graph_replay_on():
    from cudnn_graph import _cudnn_handle
    previous = _cudnn_handle.set_cuda_graph_replay(True)
    _cudnn_handle.current_thread_state().clear_variant_packs()
    yield _cudnn_handle
    _cudnn_handle.current_thread_state().clear_variant_packs()
    _cudnn_handle.set_cuda_graph_replay(previous)


@pytest.mark.gpu
def test_gpu_replay_matches_execute_with_changing_and_repeating_pointers(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    _cudnn_handle = graph_replay_on
    sets = [_fresh(torch, shapes, seed) for seed in range(3)]
    runner = g.compiled_plan().runner
    # repeat each pointer set, interleaved, many times: executes, populates, launches
    for step in range(30):
        t = sets[[0, 0, 1, 0, 2, 2, 1][step % 7]]
        t["Y"].zero_()
        g.execute({tensors[name]: t[name] for name in t})
        torch.cuda.synchronize()
        _close(torch, t["Y"], _want(torch, t))
    support = runner.cuda_graph_support
    print(f"plan {g.selected_plan.label}: cuda_graph_support={support}, "
          f"graphs={_cudnn_handle.current_thread_state().cached_graphs}")
    if support:
        assert _cudnn_handle.current_thread_state().cached_graphs >= 1
    # the same calls with replay off: the same kernels, so the same outputs (a tolerance only for an
    # engine whose reduction order is not fixed)
    replayed = [t["Y"].clone() for t in sets]
    _cudnn_handle.set_cuda_graph_replay(False)
    identical = []
    for t, want in zip(sets, replayed):
        t["Y"].zero_()
        g.execute({tensors[name]: t[name] for name in t})
        torch.cuda.synchronize()
        identical.append(torch.equal(t["Y"], want))
        torch.testing.assert_close(t["Y"], want, rtol=2e-3, atol=2e-3)
    print(f"bit-identical to the execute path: {identical}")


@pytest.mark.gpu
def test_gpu_a_replayed_graph_reads_the_memory_at_launch(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    t, pack = _fresh_pack(torch, shapes, tensors, 0)
    outputs = []
    for i in range(6):
        # same pointers every call; new contents in place between calls
        t["A"].copy_(torch.randn(shapes["A"], device="cuda", dtype=torch.float16))
        t["bias"].fill_(float(i))
        t["Y"].fill_(float("nan"))
        _execute_and_check(torch, g, pack, t)
        outputs.append(t["Y"].clone())
    assert all(not torch.equal(outputs[i], outputs[i + 1]) for i in range(5))
    runner = g.compiled_plan().runner
    if runner.cuda_graph_support:
        assert graph_replay_on.current_thread_state().cached_graphs == 1


@pytest.mark.gpu
def test_gpu_replay_on_cupy_and_torch_streams(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    cp = pytest.importorskip("cupy")
    t, pack = _fresh_pack(torch, shapes, tensors, 1)
    torch.cuda.synchronize()
    ts = torch.cuda.Stream()
    cs = cp.cuda.Stream(non_blocking=True)
    for i in range(8):
        with torch.cuda.stream(ts):
            t["bias"].fill_(float(i))          # on the stream the execute runs on: ordered before it
            g.execute(pack, stream=ts.cuda_stream)
            y_torch = t["Y"].clone()
        ts.synchronize()
        _close(torch, y_torch, _want(torch, t))
        t["bias"].fill_(float(-i))
        torch.cuda.synchronize()
        g.execute(pack, stream=cs.ptr)
        cs.synchronize()
        _close(torch, t["Y"], _want(torch, t))
        _execute_and_check(torch, g, pack, t)   # the default stream


@pytest.mark.gpu
def test_gpu_eviction_after_more_pointer_sets_than_cache_entries(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    _cudnn_handle = graph_replay_on
    sets = [_fresh(torch, shapes, seed) for seed in range(7)]          # > 4 cache entries per thread
    for rounds in range(3):
        for t in sets:
            for _ in range(2):
                t["Y"].zero_()
                g.execute({tensors[name]: t[name] for name in t})
                torch.cuda.synchronize()
                _close(torch, t["Y"], _want(torch, t))
        assert _cudnn_handle.current_thread_state().cached_graphs <= 4


@pytest.mark.gpu
def test_gpu_every_plan_matches_whether_or_not_cudnn_populates_it(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    _cudnn_handle = graph_replay_on
    t, pack = _fresh_pack(torch, shapes, tensors, 3)
    want = _want(torch, t)
    support = {}
    for index in range(min(8, g.get_execution_plan_count())):
        try:
            g.build_plan_at_index(index)
        except Exception as exc:           # a candidate cuDNN refuses to finalize is not this test's concern
            support[index] = f"not built: {type(exc).__name__}"
            continue
        for _ in range(3):
            t["Y"].zero_()
            g.execute_plan_at_index(pack, None, index)
            torch.cuda.synchronize()
            _close(torch, t["Y"], want)
        runner = getattr(g.compiled_plan(index), "runner", None)
        support[index] = None if runner is None else runner.cuda_graph_support
        # a cuDNN plan is either populated or marked (and then keeps executing, checked above)
        assert runner is None or support[index] in (True, False), (index, support[index])
    print(f"cuda_graph_support per plan: {support}")


@pytest.mark.gpu
def test_gpu_eight_threads_replay_their_own_graphs(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    sets = [_fresh(torch, shapes, 10 + i) for i in range(8)]
    torch.cuda.synchronize()
    errors = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            stream = torch.cuda.Stream()
            t = sets[i]
            pack = {tensors[name]: t[name] for name in t}
            barrier.wait()
            for j in range(25):
                with torch.cuda.stream(stream):
                    t["Y"].zero_()
                    g.execute(pack, stream=stream.cuda_stream)
                stream.synchronize()
                _close(torch, t["Y"], _want(torch, t))
        except BaseException as exc:      # reported on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert not errors, errors


@pytest.mark.gpu
def test_gpu_a_destroyed_stream_does_not_break_later_calls(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    cp = pytest.importorskip("cupy")
    t, pack = _fresh_pack(torch, shapes, tensors, 4)
    for i in range(3):
        s = cp.cuda.Stream(non_blocking=True)
        for _ in range(3):
            g.execute(pack, stream=s.ptr)      # replayed on a stream that is destroyed right after
        s.synchronize()
        del s
        import gc
        gc.collect()
        t["bias"].fill_(float(i + 1))
        torch.cuda.synchronize()
        for _ in range(2):
            t["Y"].zero_()
            _execute_and_check(torch, g, pack, t)


@pytest.mark.gpu
def test_gpu_a_torch_capture_records_the_execute_not_our_graph(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    t, pack = _fresh_pack(torch, shapes, tensors, 6)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(3):                      # warm up on the capture stream: our graph exists now
            g.execute(pack, stream=side.cuda_stream)
    side.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured, stream=side):
        g.execute(pack, stream=side.cuda_stream)
    for i in range(3):
        t["bias"].fill_(float(i + 1))
        t["Y"].zero_()
        torch.cuda.synchronize()
        captured.replay()
        torch.cuda.synchronize()
        _close(torch, t["Y"], _want(torch, t))
    t["bias"].fill_(-1.0)
    _execute_and_check(torch, g, pack, t)   # after the capture, replay goes on as before


@pytest.mark.gpu
def test_gpu_graph_floor_is_below_the_execute_floor_when_populated(graph_replay_on):
    torch, g, tensors, shapes = _torch_matmul_epilogue_graph()
    from cudnn_graph import _bench_timing
    t = _fresh(torch, shapes, 5)
    compiled = g.compiled_plan()
    pack = compiled.layout.pack({tensors[name]: t[name].data_ptr() for name in t})
    execute_ns = min(_bench_timing.execute_floor_ns(compiled.runner, pack, 50) for _ in range(5))
    try:
        graph_ns = min(_bench_timing.execute_graph_floor_ns(compiled.runner, pack, 50) for _ in range(5))
    except Exception as exc:
        pytest.skip(f"this plan is not populated: {exc}")
    torch.cuda.synchronize()
    print(f"execute floor {execute_ns / 1e3:.2f} us, graph launch floor {graph_ns / 1e3:.2f} us")
    assert graph_ns > 0


def _replay_cases():
    """(id, builder) for graphs of every backend family: each returns a validated pygraph."""
    import cudnn_graph as cudnn
    from cudnn_graph import reduction_mode
    from test_backend_conv import spec as conv_spec
    from test_backend_norm import layer_graph, layer_backward_graph, batchnorm_graph
    from test_backend_sdpa import fwd_graph, bwd_graph
    from test_cudnn_backend import reduction_graph
    import fuzz_conv

    def conv():
        g, _ = fuzz_conv.build("cuda", conv_spec())
        return g

    return [
        ("matmul", lambda: _matmul_epilogue_graph(None)[0]),
        ("conv_fprop", conv),
        ("conv_dgrad", lambda: fuzz_conv.build("cuda", conv_spec(op="dgrad"))[0]),
        ("layernorm", lambda: layer_graph("cuda")[0]),
        ("layernorm_backward", lambda: layer_backward_graph("cuda")[0]),
        ("batchnorm", lambda: batchnorm_graph("cuda")[0]),
        ("reduction", lambda: reduction_graph("cuda", reduction_mode.ADD)[0]),
        ("sdpa", lambda: fwd_graph("cuda", use_causal_mask=True)[0]),
        ("sdpa_backward", lambda: bwd_graph("cuda", use_causal_mask=True)[0]),
    ]


def _random_operands(torch, layout, seed):
    """A tensor for every operand of ``layout``, laid out as it asks: inputs random, outputs NaN."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
              "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
              "int8": torch.int8, "bool": torch.bool}
    out = {}
    for spec in layout.specs:
        if not spec.required or spec.dtype not in dtypes or spec.device[0] == "cpu":
            continue
        dtype = dtypes[spec.dtype]
        strides = spec.strides or torch.empty(spec.shape).stride()
        x = torch.empty_strided(spec.shape, strides, device="cuda", dtype=dtype)
        if spec.is_output:
            x.fill_(float("nan") if dtype.is_floating_point else 0)
        elif dtype.is_floating_point:
            x.copy_(torch.rand(spec.shape, device="cuda", generator=gen) * 0.5 + 0.25)
        else:
            x.fill_(1)
        out[spec.uid] = x
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(9), ids=["matmul", "conv_fprop", "conv_dgrad", "layernorm",
                                                "layernorm_backward", "batchnorm", "reduction", "sdpa",
                                                "sdpa_backward"])
def test_gpu_captured_or_populated_graphs_compute_what_the_execute_does(graph_replay_on, case):
    """Each family's plan, replayed (populated by cuDNN, or its execute captured where cuDNN refuses),
    gives what cudnnBackendExecute gives, call after call, with new input contents in the same buffers."""
    torch = pytest.importorskip("torch")
    _cudnn_handle = graph_replay_on
    name, build = _replay_cases()[case]
    g = build()
    if g.compiled_plan() is None:
        g.build([__import__("cudnn_graph").heur_mode.A])
    compiled = g.compiled_plan()
    runner = getattr(compiled, "runner", None)
    if runner is None:
        pytest.skip(f"{name}: the selected plan ({g.selected_plan.label}) is not a cuDNN plan")
    buffers = _random_operands(torch, compiled.layout, 0)
    outputs = [s.uid for s in compiled.layout.specs if s.is_output and s.uid in buffers]
    inputs = [s.uid for s in compiled.layout.specs if not s.is_output and s.uid in buffers
              and buffers[s.uid].dtype.is_floating_point]
    for step in range(4):
        for uid in inputs:                                   # new contents, same pointers
            buffers[uid].mul_(0.9).add_(0.01 * (step + 1))
        _cudnn_handle.set_cuda_graph_replay(False)
        for uid in outputs:
            buffers[uid].fill_(float("nan") if buffers[uid].dtype.is_floating_point else 0)
        g.execute(buffers)
        torch.cuda.synchronize()
        want = {uid: buffers[uid].clone() for uid in outputs}
        _cudnn_handle.set_cuda_graph_replay(True)
        for _ in range(2):                                   # a repeat: from the second on, a graph
            for uid in outputs:
                buffers[uid].fill_(float("nan") if buffers[uid].dtype.is_floating_point else 0)
            g.execute(buffers)
            torch.cuda.synchronize()
            for uid in outputs:
                torch.testing.assert_close(buffers[uid], want[uid], rtol=2e-3, atol=2e-3, equal_nan=True,
                                           msg=lambda m: f"{name} step {step} uid {uid}: {m}")
    print(f"{name}: plan {g.selected_plan.label}, graphs by {runner.cuda_graph_method} "
          f"(support {runner.cuda_graph_support})")
    assert runner.cuda_graph_support is not None
