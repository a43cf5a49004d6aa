"""The C runtime on plans that bind operands of their own (section 6 of the blob): against the stand-in
libcudnn / libcuda, a loaded plan lists only the caller's operands, reports cuDNN's workspace plus its
scratch, copies its constant device tensor once at load, and each execute hands cuDNN the caller's
pointers (less the withheld source of a view) plus the graph's fixed scalar and the lowering's constant
as host pointers to their values, the constant device tensor, the view at its source's pointer plus
the byte offset and the scratch regions at their workspace offsets, zeroing the one that asks first.
Every malformed section is refused as Python's reader refuses it (tests/plans/_plan_operand_blobs.py);
the program runs clean under valgrind."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from test_c_runtime import SM90_DRIVER, assert_refused, fake_cuda_builder, fake_cuda_source  # noqa: F401

from _c_build import HERE, build_program, run_case_program  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "plans"))
from _plan_operand_blobs import (CUDNN_WORKSPACE, SCRATCH_OFFSETS, WORKSPACE_SIZE, malformed_blobs,  # noqa: E402
                                 operand_blob)

# The stand-in, taught three things: a serialized plan's "workspace" is the size it reports, host-to-device
# copies are logged with their bytes, and an execute logs the 4 bytes behind each uid of $FAKE_HOST_UIDS.
HOST_TO_DEVICE = r"""
int cuMemcpyHtoD_v2(unsigned long long d, const void *h, size_t n) {
    char b[512]; int k = snprintf(b, sizeof b, "htod 0x%llx ", d);
    for (size_t i = 0; i < n && k < 500; i++)
        k += snprintf(b + k, sizeof b - k, "%02x", ((const unsigned char *)h)[i]);
    emit(b); return 0;
}
"""
HELPERS = r"""
static long long fake_workspace(const void *chars, long long n) {
    static const char key[] = "\"workspace\":";
    const char *s = chars;
    for (long long i = 0; i + (long long)sizeof key - 1 < n; i++)
        if (memcmp(s + i, key, sizeof key - 1) == 0) return atoll(s + i + sizeof key - 1);
    return 0;
}
static int fake_is_host(long long uid) {
    const char *list = getenv("FAKE_HOST_UIDS");
    while (list && *list) {
        char *end; long long v = strtoll(list, &end, 10);
        if (end == list) break;
        if (v == uid) return 1;
        list = *end ? end + 1 : end;
    }
    return 0;
}
"""
EDITS = [
    ("typedef struct { int type; int64_t n; int64_t uids[64]; void *ptrs[64]; void *ws; } desc_t;\n",
     "typedef struct { int type; int64_t n; int64_t uids[64]; void *ptrs[64]; void *ws; } desc_t;\n" + HELPERS),
    ("if (name == 1003) x->ws = *(void *const *)e;",
     "if (name == 1003) x->ws = *(void *const *)e;\n    if (name == 405) x->ws = (void *)(intptr_t)fake_workspace(e, n);"),
    ("if (e && r >= 1) memset(e, 0, elem_size(type));",
     "if (e && r >= 1) memset(e, 0, elem_size(type));\n"
     "    if (e && r >= 1 && name == 402) *(int64_t *)e = (int64_t)(intptr_t)((desc_t *)d)->ws;"),
    ('for (int i = 0; i < x->n; i++) k += sprintf(b + k, " %lld=%p", (long long)x->uids[i], x->ptrs[i]);',
     'for (int i = 0; i < x->n; i++) { k += sprintf(b + k, " %lld=%p", (long long)x->uids[i], x->ptrs[i]);\n'
     '        if (fake_is_host(x->uids[i])) {\n'
     '            unsigned v; memcpy(&v, x->ptrs[i], 4); k += sprintf(b + k, ":%08x", v); } }'),
]
HOST_UIDS = "5,1001"


def standin_source() -> str:
    source = fake_cuda_source() + SM90_DRIVER
    for old, new in EDITS:
        assert old in source, old
        source = source.replace(old, new)
    return source + HOST_TO_DEVICE


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return fake_cuda_builder(tmp_path_factory.mktemp("plan_operand_standin"), standin_source())()


@pytest.fixture(scope="module")
def plain_standin(tmp_path_factory):
    """The stand-in of test_c_runtime.py: a libcuda without cuMemcpyHtoD_v2."""
    return fake_cuda_builder(tmp_path_factory.mktemp("plan_operand_plain"), fake_cuda_source() + SM90_DRIVER)()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return build_program(os.path.join(HERE, "plan_operand_cases.c"),
                         tmp_path_factory.mktemp("plan_operand_cases") / "plan_operand_cases")


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan_operand_blobs")
    (folder / "operands.blob").write_bytes(operand_blob())
    for name, (data, _) in malformed_blobs().items():
        (folder / f"{name}.blob").write_bytes(data)
    return folder


def run_cases(program, blobs, standin, log, prefix=()):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_GRAPH_LIBCUDNN", "LD_LIBRARY_PATH")}
    env.update(standin, FAKE_CUDNN_LOG=str(log), FAKE_HOST_UIDS=HOST_UIDS)
    return run_case_program([*prefix, program, str(blobs), *sorted(malformed_blobs())], env, log)


@pytest.fixture(scope="module")
def cases(program, blobs, standin, tmp_path_factory):
    result, lines, records = run_cases(program, blobs, standin,
                                       tmp_path_factory.mktemp("plan_operand_log") / "calls.log")
    assert result.returncode == 0, result.stdout + result.stderr
    return result, lines, records


def test_a_plan_lists_only_the_operands_its_caller_passes(cases):
    result, lines, _ = cases
    assert lines["load_operands"][0] == "CG_STATUS_SUCCESS", lines["load_operands"]
    rows = [line.rstrip(" |") for line in result.stdout.splitlines() if line.startswith(("query", "tensor"))]
    # s (uid 5) is a scalar the graph fixed, v (6) a view: the plan binds both; x (1) is still passed
    assert rows == [f"query count=3 workspace={WORKSPACE_SIZE}",
                    "tensor 0 uid=1 name=x by_value=0", "tensor 1 uid=2 name=w by_value=0",
                    "tensor 2 uid=4 name=y by_value=0"]
    assert lines["index_of_graph_scalar"][0] == "CG_STATUS_UNKNOWN_UID"
    assert lines["index_of_view"][0] == "CG_STATUS_UNKNOWN_UID"


def test_the_constant_device_tensor_is_copied_to_the_device_once_at_load(cases):
    _, _, records = cases
    copies = [r for r in records if r.startswith("htod ")]
    # 0.5f, 0.25f little-endian into the stand-in's first allocation
    assert copies == ["htod 0x40000000 0000003f0000803e"]


def test_execute_binds_the_plans_own_operands_beside_the_callers(cases):
    _, lines, records = cases
    for case in ("execute_good", "execute_again", "execute_other_workspace"):
        assert lines[case][0] == "CG_STATUS_SUCCESS", (case, lines[case])
    executes = [r.split() for r in records if r.startswith("execute ")]
    assert len(executes) == 3
    for line, ws in zip(executes, (0x300000, 0x300000, 0x400000)):
        assert line[2] == hex(ws)
        operands = dict(item.split("=", 1) for item in line[3:])
        assert "1" not in operands                       # x: withheld, cuDNN reads it through the view
        assert operands["2"] == "0x210000" and operands["4"] == "0x220000"
        assert operands["5"].endswith(":3e000000")      # 0.125f, the graph's fixed scalar, on the host
        assert operands["1001"].endswith(":fffffffd")   # -3, the lowering's int32 constant
        assert operands["1002"] == "0x40000000"         # the constant device tensor
        assert operands["6"] == hex(0x200000 + 128)      # the view: x's pointer plus 128 bytes
        for uid, offset in SCRATCH_OFFSETS.items():
            assert operands[str(uid)] == hex(ws + offset)
        # the caller's order, then the plan's
        assert list(operands) == ["4", "2", "5", "1001", "1002", "1003", "1004", "6"]
    packs = [r for r in records if r == "create 16"]
    assert len(packs) == 2                               # the repeat reuses its variant pack


def test_scratch_that_asks_is_zeroed_on_the_stream_before_every_execute(cases):
    _, _, records = cases
    order = [r.split() for r in records if r.startswith(("memset ", "execute "))]
    memsets = [r for r in order if r[0] == "memset"]
    assert [(r[2], r[3], r[4]) for r in memsets] == [
        ("0x5000", hex(0x300000 + SCRATCH_OFFSETS[1004]), "64"),
        ("0x5000", hex(0x300000 + SCRATCH_OFFSETS[1004]), "64"),
        ("0x5000", hex(0x400000 + SCRATCH_OFFSETS[1004]), "64")]
    assert [r[0] for r in order] == ["memset", "execute"] * 3
    assert CUDNN_WORKSPACE < SCRATCH_OFFSETS[1003]


@pytest.mark.parametrize("case, status, words", [
    ("execute_passing_the_graph_scalar", "CG_STATUS_UNKNOWN_UID", ["uids[3] = 5", "'s'", "fixed in the graph"]),
    ("execute_passing_scratch", "CG_STATUS_UNKNOWN_UID", ["uids[3] = 1003", "scratch", "leave it out"]),
    ("execute_passing_the_view", "CG_STATUS_UNKNOWN_UID", ["uids[3] = 6", "'v'", "a view"]),
    ("execute_without_the_withheld_source", "CG_STATUS_MISSING_TENSOR", ["'x'", "uid 1"]),
    ("execute_null_workspace", "CG_STATUS_NULL_POINTER", [f"{WORKSPACE_SIZE} bytes of workspace"]),
    ("execute_null_source", "CG_STATUS_NULL_POINTER", ["'x'", "uid 1"]),
])
def test_passing_what_the_plan_binds_itself_is_refused_per_call(cases, case, status, words):
    _, lines, _ = cases
    assert_refused(lines, case, status, words)


@pytest.mark.parametrize("case", sorted(malformed_blobs()))
def test_a_malformed_plan_operand_section_is_refused_at_load_as_python_refuses_it(cases, case):
    _, lines, _ = cases
    assert_refused(lines, f"load_{case}", "CG_STATUS_BAD_BLOB", malformed_blobs()[case][1] + ["plan operands"])
    assert f"load_{case}_out_not_null" not in lines


def test_a_driver_without_host_to_device_copies_refuses_a_plan_with_device_constants(program, blobs,
                                                                                      plain_standin, tmp_path):
    result, lines, _ = run_cases(program, blobs, plain_standin, tmp_path / "log")
    assert result.returncode == 0, result.stderr
    assert_refused(lines, "load_operands", "CG_STATUS_LIBRARY_NOT_FOUND", ["cuMemcpyHtoD_v2", "uid 1002"])


def test_plan_operands_leak_nothing_under_valgrind(program, blobs, standin, tmp_path):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    result, lines, _ = run_cases(program, blobs, standin, tmp_path / "log",
                                 prefix=(valgrind, "-q", "--error-exitcode=99", "--leak-check=full",
                                         "--errors-for-leak-kinds=definite,indirect,possible"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert lines["execute_good"][0] == "CG_STATUS_SUCCESS"
