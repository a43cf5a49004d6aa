"""Fault injection: every cuDNN and driver call of a small graph's build and execute paths fails once.

The stand-in libcudnn / libcuda of test_cuda_graph_replay is rebuilt with a check at the top of each
of its entry points: ``fake_fail(name, n, status)`` (called through ctypes by the child) makes the
n-th call of ``name`` return ``status``. The same build counts live objects (descriptors, handles,
device allocations, streams, graphs, graph executables), so a failed call that leaks shows up as a
count that does not come back. Release calls (destroy / free) are never failed: nothing can be done
about a failed release, and the library ignores their status at teardown.
"""
from __future__ import annotations

import re

import pytest

from test_cuda_graph_replay import fake_cuda_source, fake_cuda_builder, run_child

pytestmark = pytest.mark.usefixtures("prefer_cudnn")

FAULT_PRELUDE = r"""
#include <pthread.h>
/* ---- fault injection and live-object counts (test_fault_injection) ---- */
static char fail_name[64]; static long fail_at, fail_seen, fired, workspace_bytes; static int fail_status;
static long live[6];   /* descriptors, handles, allocations, streams, graphs, graph executables */
static char calls[8192]; static int tracing;
void fake_fail(const char *name, long n, int status) {
    snprintf(fail_name, sizeof fail_name, "%s", name ? name : ""); fail_at = n; fail_seen = 0; fail_status = status;
}
long fake_live(int kind) { return live[kind]; }
long fake_fired(void) { return fired; }
void fake_workspace(long n) { workspace_bytes = n; }
static void *dead_stream;   /* a stream the caller destroyed: calls naming it fail */
void fake_kill_stream(void *s) { dead_stream = s; }
void fake_trace(int on) { tracing = on; calls[0] = 0; }
const char *fake_calls(void) { return calls; }
static int fault(const char *name) {
    if (tracing && strlen(calls) + strlen(name) + 2 < sizeof calls) { strcat(calls, name); strcat(calls, " "); }
    if (fail_name[0] && !strcmp(name, fail_name) && ++fail_seen == fail_at) { fail_name[0] = 0; fired++; return fail_status; }
    return 0;
}
"""

# What a successful call does to the live counts (index into live[]).
COUNTED = {"cudnnBackendCreateDescriptor": (0, 1), "cudnnBackendDestroyDescriptor": (0, -1),
           "cudnnCreate": (1, 1), "cudnnDestroy": (1, -1), "cuMemAlloc_v2": (2, 1), "cuMemFree_v2": (2, -1),
           "cuStreamCreate": (3, 1), "cuStreamDestroy_v2": (3, -1), "cuGraphCreate": (4, 1),
           "cuStreamEndCapture": (4, 1), "cuGraphDestroy": (4, -1),
           "cuGraphInstantiateWithFlags": (5, 1), "cuGraphExecDestroy": (5, -1)}
# cuInit failing is final for the process (as with the real driver, whose init result sticks): the
# error is typed, and later calls keep saying that no driver is available.
STICKY = {"cuInit"}
RELEASES = {"cudnnBackendDestroyDescriptor", "cudnnDestroy", "cuMemFree_v2", "cuStreamDestroy_v2",
            "cuGraphDestroy", "cuGraphExecDestroy", "cuDevicePrimaryCtxRelease", "cudnnGetErrorString",
            "cudnnGetLastErrorString", "cuGetErrorName", "cuGetErrorString"}


def fault_injecting_source() -> str:
    """fake_cuda_source() with FAULT_PRELUDE and a fault check (and a live count) in every entry point."""
    source = fake_cuda_source()
    source = source.replace("#include <pthread.h>\n", FAULT_PRELUDE, 1)
    # The stand-in reports a workspace, so that the execute path allocates one.
    source = source.replace("if (e && r >= 1) memset(e, 0, elem_size(type));",
                            "if (e && r >= 1) memset(e, 0, elem_size(type));\n"
                            "    if (e && name == 402) *(int64_t *)e = workspace_bytes;")

    def check(match):
        name = match.group(2)
        counted = COUNTED.get(name)
        count = f" live[{counted[0]}] += {counted[1]};" if counted else ""
        guard = "" if name in RELEASES else f" {{ int f_ = fault(\"{name}\"); if (f_) return f_; }}"
        return f"{match.group(0)}{guard}{count}"

    # Calls that name a destroyed stream fail as the driver's do (CUDA_ERROR_INVALID_HANDLE, 400).
    for signature, status in (("int cuStreamIsCapturing(void *s, int *status) {", 400),
                              ("int cuGraphLaunch(void *e, void *s) {", 400),
                              ("int cuMemsetD8Async(unsigned long long d, unsigned char v, size_t n, void *s) {", 400),
                              ("int cudnnSetStream(void *h, void *s) {", 2000)):
        assert signature in source, signature
        source = source.replace(signature, f"{signature} if (s && s == dead_stream) return {status};")
    source = source.replace("int cudnnBackendExecute(void *h, void *p, void *v) {",
                            "int cudnnBackendExecute(void *h, void *p, void *v) { "
                            "if (bound_stream && bound_stream == dead_stream) return 5000;")
    source, n = re.subn(r"^(int) ((?:cu|cudnn)\w+)\([^)]*\) \{", check, source, flags=re.M)
    assert n > 30 and "fault(\"cudnnBackendExecute\")" in source
    return source


@pytest.fixture(scope="module")
def faulty_cuda(tmp_path_factory):
    return fake_cuda_builder(tmp_path_factory.mktemp("faulty_cuda"), fault_injecting_source())()


CHILD = """
import ctypes, gc, json, os, sys
import cudnn_graph as cudnn
from cudnn_graph import CudnnGraphError
F = cudnn.data_type
fake = ctypes.CDLL(os.environ["CUDNN_GRAPH_LIBCUDNN"])
fake.fake_calls.restype = ctypes.c_char_p
fake.fake_live.restype = ctypes.c_long
fake.fake_fired.restype = ctypes.c_long

def make(case):
    # Each case its own shape, pointers and workspace size: no cache of an earlier case answers for it.
    fake.fake_workspace(4096 * (case + 1))
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
    x = g.tensor(name="x", dim=[4, 8 + 8 * case], stride=[8 + 8 * case, 1])
    y = g.relu(x).set_output(True)
    return g, x, y, {x: 0x100000 + 0x10000 * case, y: 0x4000000 + 0x10000 * case}

def live():
    # Live counts with the bounded caches emptied (the lowering cache, this thread's variant packs):
    # what remains is what nothing owns.
    from cudnn_graph.engines import manifest
    from cudnn_graph import _cudnn_handle
    for engine in manifest.engines():
        if hasattr(engine, "_lowerings"):
            engine._lowerings.clear()
    _cudnn_handle.current_thread_state().clear_variant_packs()
    gc.collect()
    return [fake.fake_live(k) for k in range(6)]

def trace(step):
    fake.fake_trace(1)
    step()
    names = fake.fake_calls().decode().split()
    fake.fake_trace(0)
    return names

def calls_in_order(names):
    seen = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        if name not in RELEASES:
            yield name, seen[name]

def run_case(case, phase, name, n, status):
    g, x, y, pack = make(case)
    if phase == "execute":
        g.build([cudnn.heur_mode.A])
    out = {"phase": phase, "call": name, "n": n}
    fired = fake.fake_fired()
    fake.fake_fail(name.encode(), n, status)
    built = phase == "execute"
    try:
        if phase == "build":
            g.build([cudnn.heur_mode.A])
        built = True
        for _ in range(3):
            g.execute(pack)
        out["error"] = None
    except CudnnGraphError as e:
        out["error"] = type(e).__name__
    except BaseException as e:
        out["error"] = "UNTYPED " + type(e).__name__ + ": " + str(e)
    fake.fake_fail(None, 0, 0)
    out["fired"] = fake.fake_fired() > fired
    try:
        if not built:
            g.build([cudnn.heur_mode.A])
        g.execute(pack); g.execute(pack)
        out["recovered"] = True
    except BaseException as e:
        out["recovered"] = type(e).__name__ + ": " + str(e)
    del g, x, y, pack
    return out
"""

WALK = CHILD + """
RELEASES = %(releases)r
g, x, y, pack = make(0)
build_calls = trace(lambda: g.build([cudnn.heur_mode.A]))
execute_calls = trace(lambda: [g.execute(pack) for _ in range(3)])
del g, x, y, pack
baseline = live()
cases = []
for phase, names in (("build", build_calls), ("execute", execute_calls)):
    for name, n in calls_in_order(names):
        case = run_case(len(cases) + 1, phase, name, n, %(status)d)
        case["live"] = live()
        cases.append(case)
print(json.dumps({"baseline": baseline, "cases": cases}))
"""

# A call made once per process (cuInit, cudnnCreate, ...) fails in a fresh child of its own.
COLD = CHILD + """
RELEASES = %(releases)r
case = run_case(0, %(phase)r, %(call)r, %(n)d, %(status)d)
case["live"] = live()
print(json.dumps(case))
"""


@pytest.mark.parametrize("path", ["populate", "capture"])
@pytest.mark.parametrize("status", [4000, 2])
def test_every_call_fails_once_in_turn(faulty_cuda, tmp_path, status, path):
    """cuDNN status 4000 (CUDNN_STATUS_INTERNAL_ERROR) / driver status 2 (CUDA_ERROR_OUT_OF_MEMORY) from
    each call in turn: a typed error or a transparent fallback, nothing leaked, the graph usable."""
    # "capture": cuDNN cannot populate a graph for the plan, so the replay captures one on a private stream.
    env = {**faulty_cuda, "FAKE_POPULATE_STATUS": "3000"} if path == "capture" else faulty_cuda
    out, _ = run_child(WALK % {"releases": RELEASES, "status": status}, env, tmp_path / "log")
    cases = out["cases"]
    for case in [c for c in cases if not c["fired"]]:
        cold, _ = run_child(COLD % {"releases": RELEASES, "status": status, "phase": case["phase"],
                                    "call": case["call"], "n": case["n"]}, env, tmp_path / "cold")
        case.update(cold)
    walked = {c["call"] for c in cases}
    assert {"cudnnBackendFinalize", "cudnnBackendExecute", "cuMemAlloc_v2", "cuGraphLaunch",
            "cudnnBackendPopulateCudaGraph", "cuGraphInstantiateWithFlags"} <= walked
    if path == "capture":
        assert {"cuStreamCreate", "cuStreamBeginCapture_v2", "cuStreamEndCapture"} <= walked
    bad = [c for c in cases if not c["fired"] or (c["error"] or "").startswith("UNTYPED")
           or (c["recovered"] is not True and c["call"] not in STICKY) or c["live"] != out["baseline"]]
    assert not bad, "\n".join(map(str, bad)) + f"\nbaseline {out['baseline']}"


def test_a_stream_destroyed_while_cached(faulty_cuda, tmp_path):
    """A stream whose replay graph and handle binding are cached is destroyed: executes naming it get a
    typed error, nothing leaks, and the graph runs on another stream (and the default one) after."""
    out, _ = run_child(CHILD + """
RELEASES = ()
g, x, y, pack = make(1)
g.build([cudnn.heur_mode.A])
dead, alive = 0xDEAD00, 0xA11E00
for _ in range(3):
    g.execute(pack, stream=dead)
fake.fake_kill_stream(ctypes.c_void_p(dead))
errors = []
for _ in range(3):
    try:
        g.execute(pack, stream=dead)
        errors.append(None)
    except CudnnGraphError as e:
        errors.append(type(e).__name__)
    except BaseException as e:
        errors.append("UNTYPED " + type(e).__name__ + ": " + str(e))
for _ in range(3):
    g.execute(pack, stream=alive)
    g.execute(pack)
del g, x, y, pack
print(json.dumps({"errors": errors, "live": live()}))
""", faulty_cuda, tmp_path / "log")
    assert out["errors"] and all(e is not None and not e.startswith("UNTYPED") for e in out["errors"]), out
    assert out["live"] == [0, 1, 0, 0, 0, 0]


def test_interpreter_shutdown_with_live_graphs_plans_handles_and_captured_graphs(faulty_cuda, tmp_path):
    """The interpreter exits with graphs, their plans, per-thread handles, cached variant packs and
    CUDA graphs (populated and captured) alive, some on other threads: no crash, exit status 0."""
    out, _ = run_child(CHILD + """
import threading
keep = []
for case in range(4):
    g, x, y, pack = make(case)
    g.build([cudnn.heur_mode.A])
    for _ in range(3):
        g.execute(pack, stream=0xC00000 + case * 0x100)
    keep.append((g, x, y, pack))
def work(i):
    g, x, y, pack = keep[i]
    for _ in range(3):
        g.execute(pack)
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
plans = [g.plans for g, *_ in keep]
print(json.dumps({"live": [fake.fake_live(k) for k in range(6)]}))
# and the objects stay alive into interpreter teardown (module globals)
""", {**faulty_cuda, "FAKE_POPULATE_STATUS": "3000"}, tmp_path / "log")
    assert out["live"][5] >= 1      # captured graphs were alive at exit
