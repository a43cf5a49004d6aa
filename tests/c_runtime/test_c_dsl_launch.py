"""The C runtime on CuTe plans (the blob's DSL launch section, 7) on the CPU: a stand-in kernel shared
object with the CuTe DSL export's convention, a stand-in DSL runtime library and the stand-in libcuda (no
libcudnn anywhere: a CuTe plan needs none). A C program loads, queries and executes the plans; the kernel
logs what it is given, so the tests pin that the module initialises once and loads on the plan's device,
and that each launch hands the entry the caller's pointers, the scalars (the caller's and the graph's
fixed one), the extents and the stream at the convention's positions. Bad pointers, a failed launch or
init, a missing runtime library, a shared object that is no ELF file or does not load, and every
malformed section (tests/plans/_dsl_launch_blobs.py, refused by Python's reader alike) are typed
statuses; the program runs clean under valgrind."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from test_c_runtime import SM90_DRIVER, assert_refused, fake_cuda_builder, fake_cuda_source  # noqa: F401

from _c_build import HERE, build_program, run_case_program  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "plans"))
from _dsl_launch_blobs import (STANDIN_KERNEL, STANDIN_KERNEL_NO_ENTRY, STANDIN_RUNTIME, kernel,  # noqa: E402
                               launch_blob, malformed_blobs)
from _helpers import build_shared_library  # noqa: E402

ENV_RUNTIME = "CUDNN_GRAPH_CUTE_RUNTIME"
ENTRY_LINE = ("entry n=15 ptrs 0x100000 0x110000 0x120000 0x130002 0x100 0x100 floats 1.5 0.25 0 "
              "ints 64 32 16 1 stream 0x5000")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsl_standin")
    kernel_so = build_shared_library(STANDIN_KERNEL, folder, "kernel.so").read_bytes()
    no_entry_so = build_shared_library(STANDIN_KERNEL_NO_ENTRY, folder, "no_entry.so").read_bytes()
    runtime = build_shared_library(STANDIN_RUNTIME, folder, "libcute_dsl_runtime.so")
    driver = fake_cuda_builder(folder, fake_cuda_source() + SM90_DRIVER)()
    only_cuda = folder / "only_libcuda"                 # libcuda alone: no libcudnn to be found
    only_cuda.mkdir()
    os.symlink(os.path.join(driver["LD_LIBRARY_PATH"], "libcuda.so.1"), only_cuda / "libcuda.so.1")
    blobs = folder / "blobs"
    blobs.mkdir()
    made = {
        "good": launch_blob(kernel_so),
        "inline": launch_blob(kernel_so, [kernel(kernel_so, inline=True)], with_kernels_section=False),
        "hint": launch_blob(kernel_so, [kernel(kernel_so, hint=str(runtime))]),
        "not_elf": launch_blob(b"not a shared object"),
        "broken_elf": launch_blob(b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 100),
        "no_entry": launch_blob(no_entry_so),
    }
    made.update({name: data for name, (data, _) in malformed_blobs(kernel_so).items()})
    for name, data in made.items():
        (blobs / f"{name}.blob").write_bytes(data)
    program = build_program(os.path.join(HERE, "dsl_cases.c"), folder / "dsl_cases")
    env = {"LD_LIBRARY_PATH": str(only_cuda), "CUDNN_GRAPH_LIBCUDNN": str(folder / "absent" / "libcudnn.so.9"),
           ENV_RUNTIME: str(runtime)}
    return {"program": program, "blobs": blobs, "env": env, "runtime": runtime, "kernel_so": kernel_so}


def run_cases(built, log, *args, prefix=(), env=None):
    full = {k: v for k, v in os.environ.items()
            if k not in ("CUDNN_GRAPH_LIBCUDNN", "LD_LIBRARY_PATH", ENV_RUNTIME, "FAKE_DSL_FAIL", "FAKE_DSL_INIT_FAIL")}
    full.update(built["env"] if env is None else env)
    full["FAKE_DSL_LOG"] = str(log)
    full["FAKE_CUDNN_LOG"] = str(log) + ".driver"
    return run_case_program([*prefix, built["program"], str(built["blobs"]), *args], full, log)


MALFORMED = sorted(malformed_blobs(b"\x7fELF"))


@pytest.fixture(scope="module")
def cases(built, tmp_path_factory):
    result, lines, records = run_cases(built, tmp_path_factory.mktemp("dsl_log") / "calls.log", "main", *MALFORMED)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, lines, records


def test_a_cute_plan_loads_with_libcuda_alone_and_lists_the_callers_operands(cases):
    result, lines, _ = cases
    assert lines["load_good"][0] == "CG_STATUS_SUCCESS", lines["load_good"]
    rows = [line.rstrip(" |") for line in result.stdout.splitlines() if line.startswith(("query", "tensor"))]
    # beta (6) is a scalar the graph fixed and t (7) virtual: neither is passed; bias takes its slot's alignment
    assert rows == ["query count=5 workspace=0 family=3 engine=20100",
                    "tensor 0 uid=1 name=a type=9 rank=3 align=16 by_value=0 dims=1,64,16 strides=1024,16,1",
                    "tensor 1 uid=2 name=b type=9 rank=3 align=16 by_value=0 dims=1,16,32 strides=512,32,1",
                    "tensor 2 uid=3 name=c type=9 rank=3 align=16 by_value=0 dims=1,64,32 strides=2048,32,1",
                    "tensor 3 uid=4 name=bias type=9 rank=3 align=2 by_value=0 dims=1,1,32 strides=32,32,1",
                    "tensor 4 uid=5 name=alpha type=0 rank=3 align=0 by_value=1 dims=1,1,1 strides=1,1,1"]
    assert lines["index_of_beta"][0] == "CG_STATUS_UNKNOWN_UID"


def test_the_module_initialises_once_and_loads_on_the_plans_device(cases):
    _, _, records = cases
    # good, inline and the init failure's load each initialise their own copy; the failed init loads nothing
    assert [r for r in records if not r.startswith("entry")] == [
        "init", "load_to_device 0 module=0x1234", "init", "load_to_device 0 module=0x1234", "init"]
    assert records[:2] == ["init", "load_to_device 0 module=0x1234"]


def test_each_launch_hands_the_entry_its_arguments_at_the_conventions_positions(cases):
    _, lines, records = cases
    for case in ("execute_good", "execute_again", "execute_threads", "execute_inline"):
        assert lines[case][0] == "CG_STATUS_SUCCESS", (case, lines[case])
    entries = [r for r in records if r.startswith("entry")]
    # good, again, 4 threads x 3, the failed launch, inline; no refused call reached the entry
    assert entries == [ENTRY_LINE] * 16


@pytest.mark.parametrize("case, status, words", [
    ("execute_null_a", "CG_STATUS_NULL_POINTER", ["'a'", "uid 1"]),
    ("execute_misaligned_a", "CG_STATUS_MISALIGNED", ["'a'", "0x100004", "16-byte"]),
    ("execute_misaligned_bias", "CG_STATUS_MISALIGNED", ["'bias'", "0x130001", "2-byte"]),
    ("execute_passing_beta", "CG_STATUS_UNKNOWN_UID", ["uids[5] = 6", "'beta'", "fixed in the graph"]),
    ("execute_missing_alpha", "CG_STATUS_MISSING_TENSOR", ["'alpha'", "uid 5"]),
    ("execute_launch_failure", "CG_STATUS_CUDA_ERROR", ["CUDA error 700", "cudaErrorIllegalAddress", "kernel 0"]),
    ("load_not_elf", "CG_STATUS_BAD_BLOB", ["not a shared object", "DSL launch"]),
    ("load_broken_elf", "CG_STATUS_LIBRARY_NOT_FOUND", ["shared object did not load"]),
    ("load_no_entry", "CG_STATUS_LIBRARY_NOT_FOUND", ["lacks its entry", "_mlir_cgtest__mlir_ciface_gemm"]),
    ("load_init_failure", "CG_STATUS_CUDA_ERROR", ["did not initialise", "CUDA error 3"]),
])
def test_bad_pointers_failed_launches_and_broken_kernels_are_typed_statuses(cases, case, status, words):
    _, lines, _ = cases
    assert_refused(lines, case, status, words)
    assert f"{case}_out_not_null" not in lines


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_dsl_launch_section_is_refused_at_load_as_python_refuses_it(cases, built, case):
    _, lines, _ = cases
    words = malformed_blobs(built["kernel_so"])[case][1]
    assert_refused(lines, f"load_{case}", "CG_STATUS_BAD_BLOB", words + ["DSL launch"])
    assert f"load_{case}_out_not_null" not in lines


def test_without_the_runtime_library_load_says_how_to_point_at_it(built, tmp_path):
    env = {k: v for k, v in built["env"].items() if k != ENV_RUNTIME}
    result, lines, _ = run_cases(built, tmp_path / "log", "single", "good", env=env)
    assert result.returncode == 0, result.stderr
    assert_refused(lines, "load_single", "CG_STATUS_LIBRARY_NOT_FOUND",
                   ["libcute_dsl_runtime.so", "nvidia_cutlass_dsl", f"${ENV_RUNTIME}: not set", "records no path"])
    env[ENV_RUNTIME] = str(tmp_path / "nowhere")
    result, lines, _ = run_cases(built, tmp_path / "log", "single", "good", env=env)
    assert_refused(lines, "load_single", "CG_STATUS_LIBRARY_NOT_FOUND", [f"${ENV_RUNTIME}={tmp_path / 'nowhere'}"])


def test_the_runtime_library_recorded_at_serialize_time_is_used_when_the_variable_is_unset(built, tmp_path):
    env = {k: v for k, v in built["env"].items() if k != ENV_RUNTIME}
    result, lines, records = run_cases(built, tmp_path / "log", "single", "hint", env=env)
    assert result.returncode == 0, result.stderr
    assert lines["load_single"][0] == "CG_STATUS_SUCCESS" and lines["execute_single"][0] == "CG_STATUS_SUCCESS"
    assert records[-1] == ENTRY_LINE


def test_a_runtime_variable_naming_the_folder_finds_the_library_in_it(built, tmp_path):
    env = dict(built["env"], **{ENV_RUNTIME: str(built["runtime"].parent)})
    _, lines, _ = run_cases(built, tmp_path / "log", "single", "good", env=env)
    assert lines["execute_single"][0] == "CG_STATUS_SUCCESS", lines


def test_dsl_plans_leak_nothing_under_valgrind(built, tmp_path):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    result, lines, _ = run_cases(built, tmp_path / "log", "main", *MALFORMED,
                                 prefix=(valgrind, "-q", "--error-exitcode=99", "--leak-check=full",
                                         "--errors-for-leak-kinds=definite,indirect,possible"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert lines["execute_good"][0] == "CG_STATUS_SUCCESS" and lines["execute_launch_failure"][0] == \
        "CG_STATUS_CUDA_ERROR"
