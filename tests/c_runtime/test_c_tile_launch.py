"""The C runtime on cuTile plans (the blob's section 7, calling convention 2) on the CPU: a stand-in cubin
and the stand-in libcuda, whose cuLibraryLoadData / cuLibraryGetKernel / cuLaunchKernel log each load and
launch with the value of every parameter the kernel was passed (no libcudnn anywhere: a cuTile plan needs
none). A C program loads, queries and executes a two-kernel plan; the tests pin that each launch gets its
grid, block 1x1x1, no shared memory, the caller's stream, no ``extra``, the caller's operand pointers and
the workspace plus each region's offset at their parameters, and the extents and strides as the plan wrote
them, in launch order, from many threads at once; a kernel past 48 KB of dynamic shared memory is opted in to
it at load (cuKernelSetAttribute) and one past the device's limit refused. A misaligned operand or workspace, a missing workspace, a
failed launch or cubin load, a code that is no cubin, a cubin without the kernel, a driver without the
cuLibrary calls and every malformed record (tests/plans/_dsl_launch_blobs.py, refused by Python's reader
alike) are typed statuses; the program runs clean under valgrind."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from test_c_dsl_launch import run_cases
from test_c_runtime import SM90_DRIVER, assert_refused, fake_cuda_builder, fake_cuda_source  # noqa: F401

from _c_build import HERE, build_program  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "plans"))
from _dsl_launch_blobs import (STANDIN_TILE_DRIVER, TILE_KERNELS, malformed_tile_blobs, standin_cubin,  # noqa: E402
                               tile_blob, tile_kernel)

Q, K, CU, O, WORKSPACE, STREAM = 0x100000, 0x110000, 0x120000, 0x130000, 0x7000000, 0x5000


def expected_launch(index: int, addresses: dict) -> str:
    """The stand-in's log line of TILE_KERNELS[index] launched with ``addresses`` (uid or "workspace" ->
    address): each array's address, then its extents and strides as written at serialize time."""
    symbol, grid, arrays = TILE_KERNELS[index]
    values = []
    for source, shape, strides in arrays:
        base = addresses["workspace"] + source[1] if isinstance(source, tuple) else addresses[source]
        values += [hex(base), *map(str, shape), *map(str, strides)]
    return (f"tile_launch {symbol} grid {' '.join(map(str, grid))} block 1 1 1 shared 0 stream {hex(STREAM)} "
            f"extra (nil) params {' '.join(values)}")


CALL = {1: Q, 2: K, 3: CU, 4: O, "workspace": WORKSPACE}
WIDE_SHARED = 53 * 1024          # the split CuTe state pass's shared memory at K = 128
LAUNCHES = [expected_launch(0, CALL), expected_launch(1, CALL)]
MALFORMED = sorted(malformed_tile_blobs())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tile_standin")
    make = fake_cuda_builder(folder, fake_cuda_source() + SM90_DRIVER + STANDIN_TILE_DRIVER)
    only_cuda = {}
    for variant in ("", "NO_TILE"):               # libcuda alone: no libcudnn to be found
        driver = make(variant)
        only_cuda[variant] = folder / f"only_libcuda{variant}"
        only_cuda[variant].mkdir()
        os.symlink(os.path.join(driver["LD_LIBRARY_PATH"], "libcuda.so.1"), only_cuda[variant] / "libcuda.so.1")
    blobs = folder / "blobs"
    blobs.mkdir()
    made = {
        "good": tile_blob(),
        "not_a_cubin": tile_blob([tile_kernel(0, b"not a cubin at all"), tile_kernel(1)]),
        "missing_kernel": tile_blob([tile_kernel(0), tile_kernel(1, standin_cubin(TILE_KERNELS[:1]))]),
        # a CuTe DSL kernel among them past the 48 KB a launch gets without opting in, and one past the device
        "wide_shared": tile_blob([tile_kernel(0, block=(256, 1, 1), shared_bytes=WIDE_SHARED), tile_kernel(1)]),
        "too_wide_shared": tile_blob([tile_kernel(0, block=(256, 1, 1), shared_bytes=240 * 1024), tile_kernel(1)]),
    }
    made.update({name: data for name, (data, _) in malformed_tile_blobs().items()})
    for name, data in made.items():
        (blobs / f"{name}.blob").write_bytes(data)
    program = build_program(os.path.join(HERE, "tile_cases.c"), folder / "tile_cases")
    absent = str(folder / "absent" / "libcudnn.so.9")
    env = {"LD_LIBRARY_PATH": str(only_cuda[""]), "CUDNN_GRAPH_LIBCUDNN": absent}
    old_driver = {"LD_LIBRARY_PATH": str(only_cuda["NO_TILE"]), "CUDNN_GRAPH_LIBCUDNN": absent}
    return {"program": program, "blobs": blobs, "env": env, "old_driver": old_driver}


def driver_log(log) -> list:
    path = str(log) + ".driver"
    return open(path).read().splitlines() if os.path.exists(path) else []


@pytest.fixture(scope="module")
def cases(built, tmp_path_factory):
    log = tmp_path_factory.mktemp("tile_log") / "calls.log"
    result, lines, _ = run_cases(built, log, "main", *MALFORMED)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, lines, driver_log(log)


def test_a_cutile_plan_loads_with_libcuda_alone_and_lists_the_callers_operands(cases):
    result, lines, _ = cases
    assert lines["load_good"][0] == "CG_STATUS_SUCCESS", lines["load_good"]
    rows = [line.rstrip(" |") for line in result.stdout.splitlines() if line.startswith(("query", "tensor"))]
    # t (5) is virtual; o takes the 16 bytes its kernel was compiled to assume, cu_seqlens too
    assert rows == ["query count=5 workspace=4096 family=3 engine=20200",
                    "tensor 0 uid=1 name=q align=16 by_value=0", "tensor 1 uid=2 name=k align=16 by_value=0",
                    "tensor 2 uid=3 name=cu_seqlens align=16 by_value=0", "tensor 3 uid=4 name=o align=16 by_value=0",
                    "tensor 4 uid=6 name=s align=0 by_value=1"]


def test_each_cubin_loads_once_per_plan_and_unloads_with_it(cases):
    _, _, records = cases
    loads = [r for r in records if r.startswith("library_")]
    # good: two kernels' cubins loaded, unloaded at free; not_a_cubin: refused before any load; missing_kernel:
    # the first loads, the second loads and is unloaded at once, then the first at the failed load's cleanup
    assert loads[:4] == ["library_load kernels=2", "library_load kernels=2", "library_unload", "library_unload"]
    assert loads[4:] == ["library_load kernels=2", "library_load kernels=1", "library_unload", "library_unload"]


def test_each_execute_launches_every_kernel_in_order_with_the_call_s_addresses_patched(cases):
    _, lines, records = cases
    for case in ("execute_good", "execute_again", "execute_threads"):
        assert lines[case][0] == "CG_STATUS_SUCCESS", (case, lines[case])
    launches = [r for r in records if r.startswith("tile_launch")]
    # good, again, then 4 threads x 3 executes (interleaved by thread, each one's two kernels in order per
    # thread: every line is one of the two); no refused call launched anything
    assert launches[:4] == LAUNCHES * 2
    assert sorted(launches[4:]) == sorted(LAUNCHES * 12)


@pytest.mark.parametrize("case, status, words", [
    ("execute_misaligned_q", "CG_STATUS_MISALIGNED", ["'q'", "0x100008", "16-byte"]),
    ("execute_misaligned_workspace", "CG_STATUS_MISALIGNED", ["workspace", "0x7000008", "16-byte", "kernel 0"]),
    ("execute_null_workspace", "CG_STATUS_NULL_POINTER", ["4096 bytes of workspace"]),
    ("execute_passing_t", "CG_STATUS_UNKNOWN_UID", ["uids[5] = 5"]),
    ("execute_launch_failure", "CG_STATUS_CUDA_ERROR", ["CUDA error 719", "kernel 0", "chunk_prepare_k"]),
    ("load_not_a_cubin", "CG_STATUS_BAD_BLOB", ["kernel 0", "not a cubin", "DSL launch"]),
    ("load_missing_kernel", "CG_STATUS_BAD_BLOB", ["kernel 1", "no kernel chunk_output_k", "CUDA error 500"]),
    ("load_library_failure", "CG_STATUS_CUDA_ERROR", ["cubin did not load", "CUDA error 209"]),
])
def test_bad_pointers_failed_launches_and_broken_cubins_are_typed_statuses(cases, case, status, words):
    _, lines, _ = cases
    assert_refused(lines, case, status, words)
    assert f"{case}_out_not_null" not in lines


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_cutile_launch_record_is_refused_at_load_as_python_refuses_it(cases, case):
    _, lines, _ = cases
    words = malformed_tile_blobs()[case][1]
    assert_refused(lines, f"load_{case}", "CG_STATUS_BAD_BLOB", words + ["DSL launch"])
    assert f"load_{case}_out_not_null" not in lines


def test_a_driver_without_the_library_calls_is_refused_at_load_naming_them(built, tmp_path):
    result, lines, _ = run_cases(built, tmp_path / "log", "single", "good", env=built["old_driver"])
    assert result.returncode == 0, result.stderr
    assert_refused(lines, "load_single", "CG_STATUS_LIBRARY_NOT_FOUND", ["cuLibraryLoadData", "CUDA 12.0", "cuTile"])


def test_cutile_plans_leak_nothing_under_valgrind(built, tmp_path):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    result, lines, _ = run_cases(built, tmp_path / "log", "main", *MALFORMED,
                                 prefix=(valgrind, "-q", "--error-exitcode=99", "--leak-check=full",
                                         "--errors-for-leak-kinds=definite,indirect,possible"))
    assert result.returncode == 0, result.stderr[-6000:]
    assert lines["execute_good"][0] == "CG_STATUS_SUCCESS" and lines["load_missing_kernel"][0] == "CG_STATUS_BAD_BLOB"


def test_a_kernel_past_48_kb_of_shared_memory_is_opted_in_at_load_and_launched_with_it(built, tmp_path):
    result, lines, _ = run_cases(built, tmp_path / "log", "single", "wide_shared")
    assert lines["execute_single"][0] == "CG_STATUS_SUCCESS", (lines, result.stderr)
    records = driver_log(tmp_path / "log")
    wide, plain = TILE_KERNELS[0][0], TILE_KERNELS[1][0]
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8), once, before any launch; not for the plain kernel
    assert [r for r in records if r.startswith("kernel_attribute")] == [f"kernel_attribute {wide} 8={WIDE_SHARED}"]
    launches = [r for r in records if r.startswith("tile_launch")]
    assert records.index(f"kernel_attribute {wide} 8={WIDE_SHARED}") < records.index(launches[0])
    assert f" block 256 1 1 shared {WIDE_SHARED} " in next(r for r in launches if r.startswith(f"tile_launch {wide} "))
    assert " block 1 1 1 shared 0 " in next(r for r in launches if r.startswith(f"tile_launch {plain} "))


def test_a_kernel_past_the_devices_shared_memory_is_refused_at_load_naming_both(built, tmp_path):
    result, lines, _ = run_cases(built, tmp_path / "log", "single", "too_wide_shared")
    assert_refused(lines, "load_single", "CG_STATUS_NOT_SUPPORTED", [str(240 * 1024), "232448", "device 0"])
    assert not [r for r in driver_log(tmp_path / "log") if r.startswith(("kernel_attribute", "tile_launch"))]
