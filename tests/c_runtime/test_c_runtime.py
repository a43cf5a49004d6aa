"""The C runtime (libcudnn_graph_rt, include/cudnn_graph/cudnn_graph.h) on the CPU: a C program built
against the installed header and library loads blobs written by Python against the stand-in libcudnn /
libcuda, queries and executes them, and is refused with the right status and message on every bad
blob and every bad pointer; the same program runs clean under valgrind (no leak on any path)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from cudnn_graph import _plan_blob as blob_format
from cudnn_graph._plan_blob import (SECTION_CUDNN_PLAN, SECTION_GRAPH, SECTION_PLAN, PlanHeader, TensorRecord,
                                    pack_blob)
from cudnn_graph.plan_serialization import library_version

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ports"))
from _standin import fake_cuda_builder, fake_cuda_source  # noqa: E402

from _c_build import HERE, build_program, run_case_program  # noqa: E402

# The stand-in driver, reporting compute capability 9.0 for its one device.
SM90_DRIVER = r"""
int cuDeviceGetAttribute(int *v, int attribute, int device) {
    *v = attribute == 75 ? 9 : attribute == 97 ? 232448 : 0;     /* sm_9x; 227 KB of opt-in shared memory */
    return 0;
}
"""
FAKE_PLAN = b'{"fake":"serialized execution plan"}'
FLOAT, HALF = 0, 2


def recipe(engine: str, engine_id: int) -> bytes:
    return json.dumps({"engine": engine, "engine_id": engine_id, "knobs": [], "name": "p", "source": "test"},
                      sort_keys=True, separators=(",", ":")).encode()


TENSORS = [
    TensorRecord(1, "x", HALF, (4, 8), (8, 1), False, False, 16),
    TensorRecord(2, "w", HALF, (8, 8), (8, 1), False, False, 16),
    TensorRecord(3, "t", FLOAT, (4, 8), (8, 1), True, False, 0),
    TensorRecord(4, "y", HALF, (4, 8), (8, 1), False, False, 16),
    TensorRecord(5, "s", FLOAT, (1, 1), (1, 1), False, True, 0),
]


def cudnn_blob(*, tensors=TENSORS, engine_id=7, family=1, cudnn_version=91900, arch=90, library=None,
               format_version=1, sections=None, engine="cudnn_backend") -> bytes:
    header = PlanHeader(library_version=library_version() if library is None else library,
                        cudnn_version=cudnn_version, arch=arch, engine_family=family, engine_id=engine_id,
                        workspace_size=0, format_version=format_version)
    if sections is None:
        sections = {SECTION_GRAPH: b"{}", SECTION_PLAN: recipe(engine, engine_id), SECTION_CUDNN_PLAN: FAKE_PLAN}
    return pack_blob(header, tensors, sections)


def with_bytes(blob: bytes, at: int, data: bytes, fix_crc: bool = True) -> bytes:
    out = bytearray(blob)
    out[at:at + len(data)] = data
    if fix_crc:
        out[56:60] = b"\0\0\0\0"
        import zlib
        out[56:60] = zlib.crc32(out).to_bytes(4, "little")
    return bytes(out)


def write_blobs(folder) -> None:
    good = cudnn_blob()
    flipped = bytearray(good)
    flipped[200] ^= 0x40
    tensor_table_at = blob_format.SECTION_ENTRY.unpack_from(good, blob_format.HEADER.size)[2]
    blobs = {
        "good": good,
        "bad_magic": b"NOTAPLAN" + good[8:],
        "truncated": good[:-5],
        "flipped_crc": bytes(flipped),
        "format_v5": cudnn_blob(format_version=5),
        "library_version": cudnn_blob(library=library_version() + 1),
        "cudnn_version": cudnn_blob(cudnn_version=90100),
        "arch": cudnn_blob(arch=80),
        "cute": cudnn_blob(family=3, engine_id=20100, engine="cute_gemm", sections={SECTION_GRAPH: b"{}",
                           SECTION_PLAN: recipe("cute_gemm", 20100)}),
        "cutile": cudnn_blob(family=3, engine_id=20200, engine="cutile_linear_attention",
                             sections={SECTION_PLAN: recipe("cutile_linear_attention", 20200)}),
        "reference": cudnn_blob(family=3, engine_id=20000, engine="reference",
                                sections={SECTION_PLAN: recipe("reference", 20000)}),
        "no_cudnn_plan": cudnn_blob(sections={SECTION_GRAPH: b"{}", SECTION_PLAN: recipe("cudnn_backend", 7)}),
        # the tensor table's size (its directory entry's third field) made far larger than the blob
        "section_past_end": with_bytes(good, blob_format.HEADER.size + 16, (1 << 40).to_bytes(8, "little")),
        # the tensor count made larger than the table holds
        "tensor_table_short": with_bytes(good, tensor_table_at, (50).to_bytes(4, "little")),
        "empty": b"",
        "empty_tensor": cudnn_blob(tensors=[TensorRecord(1, "e", HALF, (0, 8), (8, 1), False, False, 16),
                                            TensorRecord(2, "y", HALF, (4, 8), (8, 1), False, False, 16)]),
    }
    for name, data in blobs.items():
        (folder / f"{name}.blob").write_bytes(data)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return fake_cuda_builder(tmp_path_factory.mktemp("c_runtime_standin"), fake_cuda_source() + SM90_DRIVER)()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("c_runtime_cases")
    return build_program(os.path.join(HERE, "runtime_cases.c"), folder / "runtime_cases")


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("c_runtime_blobs")
    write_blobs(folder)
    return folder


def run_cases(program, blobs, standin, log, prefix=()):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_GRAPH_LIBCUDNN", "LD_LIBRARY_PATH")}
    env.update(standin)
    env["FAKE_CUDNN_LOG"] = str(log)
    return run_case_program([*prefix, program, str(blobs)], env, log)


@pytest.fixture(scope="module")
def cases(program, blobs, standin, tmp_path_factory):
    log = tmp_path_factory.mktemp("c_runtime_log") / "calls.log"
    result, lines, records = run_cases(program, blobs, standin, log)
    assert result.returncode == 0, result.stdout + result.stderr
    return lines, records


def assert_refused(lines: dict, case: str, status: str, words) -> None:
    """The case ``case`` ended with ``status`` and a message holding each of ``words``."""
    got, message = lines[case]
    assert got == status, message
    for word in words:
        assert word in message, (case, message)


def test_the_header_reports_its_api_version(cases):
    lines, _ = cases
    assert lines["api_version"][0] == "101"


@pytest.mark.parametrize("case, status, words", [
    ("bad_magic", "CG_STATUS_BAD_BLOB", ["magic"]),
    ("empty", "CG_STATUS_BAD_BLOB", ["magic", "0 bytes"]),
    ("truncated", "CG_STATUS_BAD_BLOB", ["total_size"]),
    ("flipped_crc", "CG_STATUS_BAD_BLOB", ["checksum"]),
    ("format_v5", "CG_STATUS_VERSION_MISMATCH", ["format version 5", "versions 1 to 4"]),
    ("library_version", "CG_STATUS_VERSION_MISMATCH", ["cudnn_graph version"]),
    ("cudnn_version", "CG_STATUS_VERSION_MISMATCH", ["cuDNN 9.1", "9.19", "cuDNN version"]),
    ("arch", "CG_STATUS_VERSION_MISMATCH", ["sm_80", "sm_90", "GPU architecture"]),
    ("cute", "CG_STATUS_NOT_SUPPORTED", ["'cute_gemm'", "20100", "CuTe"]),
    ("cutile", "CG_STATUS_NOT_SUPPORTED", ["'cutile_linear_attention'", "20200", "cuTile"]),
    ("reference", "CG_STATUS_NOT_SUPPORTED", ["'reference'", "only in Python"]),
    ("no_cudnn_plan", "CG_STATUS_NOT_SUPPORTED", ["section 4"]),
    ("section_past_end", "CG_STATUS_BAD_BLOB", ["section 1", "past the end"]),
    ("tensor_table_short", "CG_STATUS_BAD_BLOB", ["tensor table"]),
    ("device_1", "CG_STATUS_INVALID_DEVICE", ["device 1", "1 CUDA device"]),
    ("device_negative", "CG_STATUS_INVALID_DEVICE", ["device -1"]),
    ("out_null", "CG_STATUS_INVALID_ARGUMENT", ["out is NULL"]),
])
def test_a_bad_blob_or_device_is_refused_at_load_with_a_status_and_message(cases, case, status, words):
    lines, _ = cases
    assert_refused(lines, f"load_{case}", status, words)
    assert f"load_{case}_out_not_null" not in lines      # *out is NULL after a failed load


def test_a_loaded_plan_reports_its_operands_from_the_tensor_table(cases):
    lines, _ = cases
    assert lines["load_good"][0] == "CG_STATUS_SUCCESS"
    assert lines["query"][0].startswith("count=4 ")    # the virtual tensor (uid 3) is no operand


def test_queries_give_each_operand_its_geometry(program, blobs, standin, tmp_path):
    result, _, _ = run_cases(program, blobs, standin, tmp_path / "log")
    rows = [line.rstrip(" |") for line in result.stdout.splitlines() if line.startswith("tensor ")]
    assert rows == [
        "tensor 0 uid=1 name=x type=2 rank=2 align=16 by_value=0 dims=4,8 strides=8,1",
        "tensor 1 uid=2 name=w type=2 rank=2 align=16 by_value=0 dims=8,8 strides=8,1",
        "tensor 2 uid=4 name=y type=2 rank=2 align=16 by_value=0 dims=4,8 strides=8,1",
        "tensor 3 uid=5 name=s type=0 rank=2 align=0 by_value=1 dims=1,1 strides=1,1",
    ]
    query = next(line for line in result.stdout.splitlines() if line.startswith("query "))
    assert query.rstrip(" |") == "query count=4 workspace=0 family=1 engine=7 device=0"


def test_a_query_out_of_range_or_on_null_is_an_invalid_argument(cases):
    lines, _ = cases
    assert lines["query_index_out_of_range"] == ("CG_STATUS_INVALID_ARGUMENT",
                                                 "cg_plan_tensor: index 4, the plan has 4 operands")
    assert lines["query_index_of_uid_4"][0] == "CG_STATUS_SUCCESS" and lines["index_of_uid_4"][0] == "2"
    assert lines["query_index_of_uid_3_virtual"][0] == "CG_STATUS_UNKNOWN_UID"
    assert lines["query_null_plan"][0] == "CG_STATUS_INVALID_ARGUMENT"
    assert lines["query_null_out"][0] == "CG_STATUS_INVALID_ARGUMENT"


def test_load_sets_the_blobs_serialized_plan_on_an_execution_plan_and_finalizes_it(cases):
    _, records = cases
    # create EXECUTION_PLAN (5), set its handle (400, CUDNN_TYPE_HANDLE) and JSON (405, CUDNN_TYPE_CHAR), finalize
    sets = [r.split() for r in records if r.startswith("set 5 ")]
    json_sets = [s for s in sets if s[2] == "405"]
    assert json_sets and all(s[3] == "24" and int(s[4]) == len(FAKE_PLAN) for s in json_sets)
    assert bytes.fromhex(json_sets[0][5]) == FAKE_PLAN
    assert any(s[2] == "400" and s[3] == "0" for s in sets)
    assert "finalize 5" in records
    # the refused blobs reach no cuDNN call: only good.blob (three loads: device 1, -1 refused first) did
    assert len(json_sets) == 2       # good (device 0) and empty_tensor


def test_execute_binds_the_callers_uids_and_pointers_and_reuses_its_variant_pack(cases):
    lines, records = cases
    for case in ("execute_good", "execute_again", "execute_reordered", "execute_threads", "execute_empty_tensor_null"):
        assert lines[case][0] == "CG_STATUS_SUCCESS", (case, lines[case])
    executes = [r.split() for r in records if r.startswith("execute ")]
    first = executes[0]
    assert first[3:6] == ["1=0x200000", "2=0x210000", "4=0x220000"] and first[6].startswith("5=0x")
    assert "stream 0x5000" in records
    main_thread = first[1]
    main_packs = [r for r in records if r == "create 16"]
    # good + again share one variant pack; reordered makes a second; each of 4 threads one; empty one
    assert len(main_packs) == 2 + 4 + 1
    assert len({e[1] for e in executes}) == 5 and main_thread in {e[1] for e in executes}
    assert len(executes) == 3 + 4 * 3 + 1


@pytest.mark.parametrize("case, status, words", [
    ("null_pointer", "CG_STATUS_NULL_POINTER", ["'x'", "uid 1"]),
    ("null_scalar", "CG_STATUS_NULL_POINTER", ["'s'", "uid 5"]),
    ("misaligned", "CG_STATUS_MISALIGNED", ["'x'", "0x200004", "16-byte"]),
    ("unknown_uid", "CG_STATUS_UNKNOWN_UID", ["uids[3] = 99"]),
    ("virtual_uid", "CG_STATUS_UNKNOWN_UID", ["uids[3] = 3"]),
    ("missing_tensor", "CG_STATUS_MISSING_TENSOR", ["'s'", "uid 5", "3 of the plan's 4"]),
    ("duplicate_uid", "CG_STATUS_DUPLICATE_UID", ["uid 2", "'w'"]),
    ("negative_count", "CG_STATUS_INVALID_ARGUMENT", ["count is -1"]),
    ("null_arrays", "CG_STATUS_INVALID_ARGUMENT", ["NULL"]),
    ("null_plan", "CG_STATUS_INVALID_ARGUMENT", ["plan is NULL"]),
])
def test_a_bad_pointer_or_uid_is_refused_per_call_with_a_status_and_message(cases, case, status, words):
    lines, _ = cases
    assert_refused(lines, f"execute_{case}", status, words)


def test_no_cudnn_call_is_made_for_a_refused_execute(cases):
    _, records = cases
    executes = [r for r in records if r.startswith("execute ")]
    assert not any("0x200004" in r or "99=" in r for r in executes)


def test_without_libcudnn_load_names_every_place_tried(program, blobs, tmp_path):
    env = {"CUDNN_GRAPH_LIBCUDNN": str(tmp_path / "absent.so"), "LD_LIBRARY_PATH": str(tmp_path)}
    result, lines, _ = run_cases(program, blobs, env, tmp_path / "log")
    status, message = lines["load_good"]
    assert status == "CG_STATUS_LIBRARY_NOT_FOUND"
    assert "$CUDNN_GRAPH_LIBCUDNN=" in message and "absent.so" in message and "libcudnn.so.9" in message
    # refusals that need no library come first and still work
    assert lines["load_cute"][0] == "CG_STATUS_NOT_SUPPORTED"


def test_the_runtime_leaks_nothing_on_any_path_under_valgrind(program, blobs, standin, tmp_path):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    result, lines, _ = run_cases(program, blobs, standin, tmp_path / "log",
                                 prefix=(valgrind, "-q", "--error-exitcode=99", "--leak-check=full",
                                         "--errors-for-leak-kinds=definite,indirect,possible"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert lines["execute_good"][0] == "CG_STATUS_SUCCESS"


def test_a_blob_from_pythons_serialize_is_read_by_the_c_runtime(standin, tmp_path):
    """graph.serialize() of a cuDNN plan built on the stand-in: the C reader agrees with Python's on the
    whole blob; without cuDNN's serialized plan (the stand-in gives none) it is refused for that reason,
    and with one added its operands are the graph's."""
    from _standin import CHILD_PROLOGUE, run_child
    probe = build_program(os.path.join(HERE, "load_probe.c"), tmp_path / "load_probe")
    path = tmp_path / "relu.blob"
    run_child(CHILD_PROLOGUE + f"""
g = make(8)
open({str(path)!r}, "wb").write(g.serialize(as_bytes=True))
print(json.dumps({{}}))
""", standin, tmp_path / "child.log")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_GRAPH_LIBCUDNN", "LD_LIBRARY_PATH")}
    env.update(standin, FAKE_CUDNN_LOG=str(tmp_path / "probe.log"))
    out = subprocess.run([probe, str(path)], capture_output=True, text=True, env=env, check=True).stdout
    assert out.startswith("CG_STATUS_NOT_SUPPORTED") and "section 4" in out
    unpacked = blob_format.unpack_blob(path.read_bytes())
    sections = {**unpacked.sections, SECTION_CUDNN_PLAN: FAKE_PLAN}
    path.write_bytes(pack_blob(unpacked.header, unpacked.tensors, sections))
    out = subprocess.run([probe, str(path)], capture_output=True, text=True, env=env, check=True).stdout
    lines = out.splitlines()
    assert lines[0].strip() == "CG_STATUS_SUCCESS"
    want = [f"{t.uid} {t.name} {','.join(str(d) for d in t.dims)}" for t in unpacked.tensors if not t.is_virtual]
    assert lines[1:] == want and len(want) == 2
