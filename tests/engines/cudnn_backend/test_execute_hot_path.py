"""PlanRunner's per-call path: the checks and caches it keeps while it skips Python-level work.

CPU tests against the stand-in libcudnn + libcuda of test_cuda_graph_replay (its log shows each
execute's workspace and operand pointers); replay is off so that every call is an execute line.
"""
from __future__ import annotations

import pytest

from test_cuda_graph_replay import PROLOGUE, fake_cuda, pointers, run_child  # noqa: F401 (fixture)

OFF = {"CUDNN_GRAPH_CUDA_GRAPHS": "0"}


def executes(records):
    return [r for r in records if r[0] == "execute"]


def test_sixteen_byte_alignment_is_checked_on_device_operands_whether_or_not_optional_ones_are_given(
        fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
errors = []
packs = [{3: 0x100000, 5: 0x200008},                     # the optional host scalar left out
         {3: 0x100000, 5: 0x200008, 7: S7},        # every operand given
         {3: 0x100008, 5: 0x200000, 7: S7}]
for mapping in packs:
    try:
        run(*(mapping[3], mapping[5])) if len(mapping) == 2 else runner.run(layout.pack(mapping), stream=0)
    except Exception as e:
        errors.append([type(e).__name__, str(e)])
# A host operand is not held to the device operands' 16 bytes (its own 4-byte alignment is checked).
runner.run(layout.pack({3: 0x100000, 5: 0x200000, 7: S7}), stream=0)
runner.run(layout.pack({3: 0x100000, 5: 0x200000}), stream=0)
print(json.dumps({"errors": errors}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    assert [e[0] for e in out["errors"]] == ["AlignmentError"] * 3
    assert "tensor 'y' (uid 5)" in out["errors"][0][1] and "0x200008" in out["errors"][0][1]
    assert "tensor 'y' (uid 5)" in out["errors"][1][1]
    assert "tensor 'x' (uid 3)" in out["errors"][2][1]
    # nothing misaligned reached cuDNN; the two aligned packs did
    assert [pointers(r) for r in executes(records)] == [{3: 0x100000, 5: 0x200000, 7: 0x300004},
                                                          {3: 0x100000, 5: 0x200000}]


def test_the_plan_keeps_one_workspace_per_stream_and_a_stream_it_let_go_gets_a_fresh_one(fake_cuda, tmp_path):
    _, records = run_child(PROLOGUE + """
ws_runner = _plan_runner.PlanRunner(plan, 4096, 0, "ws")
streams = [0x5000, 0x6000, 0x5000, 0x5000, 0x6000]           # alternating: each keeps its own
streams += [0x7000 + 0x100 * i for i in range(7)]            # 9 streams in all: the plan keeps 8
streams += [0x5000, 0x6000, 0x6000]                          # the oldest go first: each gets a new one
for s in streams:
    ws_runner.run(layout.pack({3: 0x100000, 5: 0x200000}), stream=s)
print(json.dumps({}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    workspaces = [r[2] for r in executes(records)]
    assert len(workspaces) == 15
    first, second = workspaces[0], workspaces[1]
    assert first != second and "(nil)" not in (first, second)
    assert workspaces[:5] == [first, second, first, first, second]
    assert len(set(workspaces[5:12]) | {first, second}) == 9                 # one each
    assert workspaces[12] not in set(workspaces[:12])                        # 0x5000's was let go ...
    assert workspaces[13] not in set(workspaces[:13])                        # ... then 0x6000's
    assert workspaces[14] == workspaces[13]


def test_each_thread_has_its_own_state_and_handle_and_keeps_them_across_calls(fake_cuda, tmp_path):
    out, _ = run_child(PROLOGUE + """
seen = {}
def work(i):
    first = _cudnn_handle.current_thread_state()
    run(0x100000 + 0x1000 * i, 0x200000)
    seen[i] = [id(first), first is _cudnn_handle.current_thread_state(), first.cached_variant_packs,
               int(first.handle(0)) == int(_cudnn_handle.thread_handle(0))]
threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
main = _cudnn_handle.current_thread_state()
print(json.dumps({"seen": seen, "main_packs": main.cached_variant_packs,
                  "main_same": main is _cudnn_handle.current_thread_state()}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    seen = out["seen"]
    assert all(same and packs == 1 and handle for _, same, packs, handle in seen.values())
    assert out["main_packs"] == 0 and out["main_same"]          # the threads' packs stayed theirs


def test_a_calls_stream_does_not_stick_to_the_thread_handle_and_a_callers_handle_keeps_its_own(
        fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
pack = layout.pack({3: 0x100000, 5: 0x200000})
runner.run(pack, stream=0x5000)
runner.run(pack)                                   # no stream: the default one, not 0x5000
runner.run(pack)
mine = _cudnn_handle.create_handle()
_cudnn_handle.set_stream(handle=mine, stream=0x6000)
runner.run(pack, handle=mine)                      # keeps 0x6000: no cudnnSetStream
runner.run(pack, handle=mine)
kept = mine.stream
runner.run(pack, handle=mine, stream=0x7000)       # a stream given with the handle is set on it
print(json.dumps({"kept": kept, "after": mine.stream,
                  "thread": _cudnn_handle.thread_handle(0).stream}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    assert [r[1] for r in records if r[0] == "stream"] == ["0x5000", "(nil)", "0x6000", "0x7000"]
    assert out == {"kept": 0x6000, "after": 0x7000, "thread": 0}
    assert len(executes(records)) == 6


def test_pygraph_execute_repeats_through_the_plans_one_call_executor_and_other_calls_take_the_general_path(
        fake_cuda, tmp_path):
    out, records = run_child("""
import json
import cudnn_graph as cudnn
F = cudnn.data_type
from cudnn_graph.router import PreferFamily
# The stand-in serves cuDNN's API only: the CuTe engine (where installed) would launch on it.
g = cudnn.pygraph(io_data_type=F.HALF, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, name="mm",
                  router=PreferFamily("cudnn"))
a = g.tensor(name="A", dim=(1, 128, 128), stride=(128 * 128, 128, 1))
b = g.tensor(name="B", dim=(1, 128, 128), stride=(128 * 128, 128, 1))
c = g.matmul(a, b, name="mm"); c.set_output(True).set_data_type(F.HALF)
g.build([cudnn.heur_mode.A])
before = g.fast_executor
g.execute({a: 0x100000, b: 0x200000, c: 0x300000})          # finds the executor, runs the general way
hot = g.fast_executor
g.execute({a: 0x100000, b: 0x200000, c: 0x300000})          # the executor
g.execute({"A": 0x110000, "B": 0x200000, c.uid: 0x300000})    # names and uids as keys
g.execute({a: 0x100000, b: 0x200000, c: 0x300000}, workspace=0x900000)   # a workspace: the general way
errors = []
try:
    g.execute({a: 0x100008, b: 0x200000, c: 0x300000})
except Exception as e:
    errors.append(type(e).__name__)
print(json.dumps({"before": repr(before), "hot": getattr(hot, "__name__", repr(hot)), "errors": errors}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    assert out == {"before": "None", "hot": "execute_mapping", "errors": ["AlignmentError"]}
    runs = executes(records)
    assert [list(pointers(r).values()) for r in runs] == [[0x100000, 0x200000, 0x300000],
                                                          [0x100000, 0x200000, 0x300000],
                                                          [0x110000, 0x200000, 0x300000],
                                                          [0x100000, 0x200000, 0x300000]]
    assert runs[3][2] == "0x900000"


def test_execute_mapping_packs_on_the_stack_with_every_check_of_a_variant_pack(fake_cuda, tmp_path):
    # execute_mapping fills C arrays itself (no VariantPack): each bad mapping must raise what
    # layout.pack raises, naming the same tensor, with nothing reaching cuDNN.
    out, records = run_child(PROLOGUE + """
from cudnn_graph._testing import exchange_producer as ep
runner.bind_layout(layout)
bad = [{3: 0x100000},                                   # y missing
       {3: 0x100000, 5: 0x200000, 9: 0x300000},         # unknown uid
       {"x": 0x100000, "nope": 0x200000},               # unknown name
       {3: 0x100000, "x": 0x100000, 5: 0x200000},       # x twice (uid and name)
       {3: 0, 5: 0x200000},                              # NULL
       {3: -16, 5: 0x200000},                            # negative
       {3: 1 << 70, 5: 0x200000},                        # beyond a pointer
       {3: 0x100001, 5: 0x200000},                       # not even half-aligned
       {3: 0x100000, 5: 0x200008},                       # not 16-byte aligned for the plan
       {3: 0x100000, 5: 0x200000, 7: Slot.from_address(0x300002, (1,), dtype="float32", device="cpu")},
                                                         # host scalar below its 4 bytes
       {3: 0x100000, 5: 0x200000, 7: 0x300004},          # a bare int for host memory: refused
       {3.0: 0x100000, 5: 0x200000},                     # a key that names nothing
       {3: 0x100000, 5: np.zeros((4, 8), np.float16)},   # host memory for a device tensor
       {3: 0x100000, 5: "buffer"},                       # not a buffer
       [(3, 0x100000)]]                                  # not a mapping
errors = []
for mapping in bad:
    got = []
    for call in (lambda: runner.execute_mapping(mapping, None, None),
                 lambda: runner.run(layout.pack(mapping), stream=None)):
        try:
            call()
            got.append(None)
        except Exception as e:
            got.append([type(e).__name__, str(e)])
    errors.append(got)
runner.execute_mapping({"y": 0x200000, 3: 0x100000}, None, None)               # any key order, names
runner.execute_mapping({5: 0x200000, 3: 0x100000, "s": S7}, None, None)
print(json.dumps({"errors": errors}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    names = []
    for mapped, packed in out["errors"]:
        assert mapped == packed        # same type, same message
        names.append(mapped[0])
    assert names == ["MissingTensorError", "UnknownTensorError", "UnknownTensorError", "DuplicateTensorError",
                     "ValueError", "ValueError", "ValueError", "AlignmentError", "AlignmentError",
                     "AlignmentError", "HostAddressError", "TypeError", "DeviceMismatchError", "BufferImportError", "TypeError"]
    assert "tensor 'y' (uid 5)" in out["errors"][0][0][1]
    assert [pointers(r) for r in executes(records)] == [{3: 0x100000, 5: 0x200000},
                                                          {3: 0x100000, 5: 0x200000, 7: 0x300004}]


def test_execute_mapping_keeps_imported_tensors_for_the_call_and_releases_each_once(fake_cuda, tmp_path):
    # Host-memory specs with strides: exchange-API producers lend borrowed views, DLPack producers are
    # imported into Slots that must live until the launch and be released after it.
    out, records = run_child(PROLOGUE + """
from cudnn_graph._testing import exchange_producer as ep
hlayout = PackLayout([TensorSpec(3, (4, 8), "float16", strides=(8, 1), device="cpu", name="x"),
                      TensorSpec(5, (4, 8), "float16", strides=(8, 1), device="cpu", name="y", is_output=True)])
hrunner = _plan_runner.PlanRunner(plan, 0, 0, "host")
hrunner.bind_layout(hlayout)
x, y = np.zeros((4, 8), np.float16), np.zeros((4, 8), np.float16)
want = {3: x.ctypes.data, 5: y.ctypes.data}
ep.reset_counts()
hrunner.execute_mapping({3: ep.ExchangeProducer(x), 5: ep.ExchangeProducer(y)}, None, None)   # views
views = ep.counts()
hrunner.execute_mapping({3: ep.ManagedOnlyProducer(x), 5: ep.ManagedOnlyProducer(y)}, None, None)
hrunner.execute_mapping({3: x, 5: y}, None, None)                                              # __dlpack__
print(json.dumps({"views": views, "managed": ep.counts(), "want": want}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    assert out["views"] == [0, 0]                 # borrowed: nothing exported, nothing to release
    assert out["managed"] == [2, 2]               # two imports, each released once
    want = {int(k): v for k, v in out["want"].items()}
    assert [pointers(r) for r in executes(records)] == [want] * 3


def test_execute_mapping_falls_back_to_a_variant_pack_for_a_layout_larger_than_its_stack_arrays(
        fake_cuda, tmp_path):
    out, records = run_child(PROLOGUE + """
big = PackLayout([TensorSpec(10 + i, (4,), "float32", name=f"t{i}") for i in range(20)])
runner.bind_layout(big)
runner.execute_mapping({10 + i: 0x100000 * (i + 1) for i in range(20)}, None, None)
try:
    runner.execute_mapping({10 + i: 0x100000 * (i + 1) for i in range(19)}, None, None)
    error = None
except Exception as e:
    error = [type(e).__name__, str(e)]
print(json.dumps({"error": error}))
""", {**fake_cuda(), **OFF}, tmp_path / "log")
    assert out["error"][0] == "MissingTensorError" and "tensor 't19' (uid 29)" in out["error"][1]
    assert [pointers(r) for r in executes(records)] == [{10 + i: 0x100000 * (i + 1) for i in range(20)}]
