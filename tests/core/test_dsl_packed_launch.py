"""cudnn_graph._dsl_launch.PackedLaunch: a DSL host entry called from C with its packed arguments.

A stand-in host entry (C, compiled here) records what it is handed: each packed argument is the address
of one value, so it reads the operand addresses, the f32 scalars, the int32 extents and the stream
through them, and writes a result code into the result cell. The tests pin what the CuTe engine relies
on: cells hold this call's values, the template's extra entries (kernel handles) pass through, host
scalars are read from their operands or fall back to the graph's value, alignment is checked before the
entry runs, and a non-zero result is a typed error.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from _helpers import build_shared_library, host_address
from cudnn_graph.errors import CudaDriverError, InvalidArgumentError
from cudnn_graph._dsl_launch import PackedLaunch
from cudnn_graph._variant_pack import PackLayout, TensorSpec

SOURCE = r"""
#include <stdint.h>
struct seen { void* ptrs[3]; float floats[3]; int32_t ints[4]; intptr_t stream; void* extra; int calls; };
struct seen seen;
int32_t fail_with = 0;
void entry(void** args) {
    for (int i = 0; i < 3; i++) seen.ptrs[i] = *(void**)args[i];
    for (int i = 0; i < 3; i++) seen.floats[i] = *(float*)args[3 + i];
    for (int i = 0; i < 4; i++) seen.ints[i] = *(int32_t*)args[6 + i];
    seen.stream = *(intptr_t*)args[10];
    *(int32_t*)args[11] = fail_with;
    seen.extra = args[12];
    seen.calls++;
}
"""


class Seen(ctypes.Structure):
    _fields_ = [("ptrs", ctypes.c_void_p * 3), ("floats", ctypes.c_float * 3), ("ints", ctypes.c_int32 * 4),
                ("stream", ctypes.c_ssize_t), ("extra", ctypes.c_void_p), ("calls", ctypes.c_int)]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    return ctypes.CDLL(str(build_shared_library(SOURCE, tmp_path_factory.mktemp("dsl_entry"), "libentry.so")))


def _layout():
    specs = [TensorSpec(1, (4, 8), "bfloat16", device="cuda", name="A"),
             TensorSpec(2, (8, 4), "bfloat16", device="cuda", name="B"),
             TensorSpec(3, (4, 4), "bfloat16", device="cuda", name="C", is_output=True),
             TensorSpec(4, (1,), "float32", device="cpu", name="alpha", required=False)]
    return PackLayout(specs)


def _launch(lib, default=None):
    entry = ctypes.cast(lib.entry, ctypes.c_void_p).value
    template = [0] * 12 + [0xABCD00]            # 10 base + stream + result cell, then a "kernel handle"
    return PackedLaunch.create(_layout(), entry, template, (1, 2, 3), (16, 16, 16), ("A", "B", "output"), 3,
                               (4,), (False,), (default,), (256, 128, 64, 2), 11, None)


def _seen(lib) -> Seen:
    return Seen.in_dll(lib, "seen")


def test_each_call_hands_the_entry_this_calls_values(stand_in):
    alpha = np.array([0.5], np.float32)
    launch = _launch(stand_in)
    launch.execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000, 4: host_address(alpha)}, None, 77)
    seen = _seen(stand_in)
    assert [seen.ptrs[i] for i in range(3)] == [0x10000, 0x20000, 0x30000]
    assert list(seen.floats) == [0.5, 0.0, 0.0]
    assert list(seen.ints) == [256, 128, 64, 2]
    assert seen.stream == 77 and seen.extra == 0xABCD00
    launch.execute_mapping({1: 0x40000, 2: 0x20000, 3: 0x30000, 4: host_address(alpha)}, None, None)
    assert seen.ptrs[0] == 0x40000 and seen.stream == 0


def test_a_scalar_left_out_takes_the_graphs_value(stand_in):
    launch = _launch(stand_in, default=2.25)
    launch.execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, None)
    assert _seen(stand_in).floats[0] == 2.25


def test_a_scalar_with_no_value_and_no_buffer_is_refused(stand_in):
    with pytest.raises(InvalidArgumentError, match="scalar uid 4"):
        _launch(stand_in).execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, None)


def test_a_misaligned_operand_is_refused_before_the_entry_runs(stand_in):
    before = _seen(stand_in).calls
    with pytest.raises(ValueError, match="B is at address 0x20008, not 16-byte aligned"):
        _launch(stand_in, default=1.0).execute_mapping({1: 0x10000, 2: 0x20008, 3: 0x30000}, None, None)
    assert _seen(stand_in).calls == before


def test_a_failed_launch_is_a_typed_error(stand_in):
    fail = ctypes.c_int32.in_dll(stand_in, "fail_with")
    fail.value = 719
    try:
        with pytest.raises(CudaDriverError, match="CUDA error 719"):
            _launch(stand_in, default=1.0).execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, None)
    finally:
        fail.value = 0


def test_direct_construction_and_a_short_template_are_refused(stand_in):
    with pytest.raises(TypeError, match="PackedLaunch.create"):
        PackedLaunch()
    entry = ctypes.cast(stand_in.entry, ctypes.c_void_p).value
    with pytest.raises(InvalidArgumentError, match="packed-argument array"):
        PackedLaunch.create(_layout(), entry, [0] * 4, (1, 2, 3), (16, 16, 16), ("A", "B", "C"), 3, (), (), (),
                            (1, 1, 1, 1), 11, None)


def test_the_c_floor_calls_the_entry_from_a_nogil_loop(stand_in):
    from cudnn_graph._bench_timing import dsl_entry_floor_ns
    before = _seen(stand_in).calls
    ns = dsl_entry_floor_ns(_launch(stand_in, default=1.0), {1: 0x10000, 2: 0x20000, 3: 0x30000}, 50)
    assert _seen(stand_in).calls == before + 50 and ns > 0


# The CuTe GEMM's entry takes six pointers whatever the plan's epilogue uses (a, b, c and three epilogue
# operands); the slots a plan leaves unused keep the cells the DSL packed for them.
SIX_SLOT_SOURCE = r"""
#include <stdint.h>
struct seen6 { void* ptrs[6]; float floats[3]; int32_t ints[4]; intptr_t stream; int calls; };
struct seen6 seen6;
void entry6(void** args) {
    for (int i = 0; i < 6; i++) seen6.ptrs[i] = *(void**)args[i];
    for (int i = 0; i < 3; i++) seen6.floats[i] = *(float*)args[6 + i];
    for (int i = 0; i < 4; i++) seen6.ints[i] = *(int32_t*)args[9 + i];
    seen6.stream = *(intptr_t*)args[13];
    *(int32_t*)args[14] = 0;
    seen6.calls++;
}
"""


class Seen6(ctypes.Structure):
    _fields_ = [("ptrs", ctypes.c_void_p * 6), ("floats", ctypes.c_float * 3), ("ints", ctypes.c_int32 * 4),
                ("stream", ctypes.c_ssize_t), ("calls", ctypes.c_int)]


def test_a_plan_binding_fewer_operands_than_the_entrys_pointer_slots_keeps_the_rest(tmp_path):
    lib = ctypes.CDLL(str(build_shared_library(SIX_SLOT_SOURCE, tmp_path, "libentry6.so")))
    placeholder = (ctypes.c_void_p * 3)(0x100, 0x100, 0x100)     # the DSL's cells for the unused slots
    template = [0] * 3 + [ctypes.addressof(placeholder) + 8 * i for i in range(3)] + [0] * 9
    entry = ctypes.cast(lib.entry6, ctypes.c_void_p).value
    launch = PackedLaunch.create(_layout(), entry, template, (1, 2, 3), (16, 16, 16), ("A", "B", "output"), 3,
                                 (4,), (False,), (1.5,), (64, 32, 16, 1), 14, placeholder, pointer_slots=6)
    launch.execute_mapping({1: 0x10000, 2: 0x20000, 3: 0x30000}, None, 99)
    seen = Seen6.in_dll(lib, "seen6")
    assert [seen.ptrs[i] for i in range(6)] == [0x10000, 0x20000, 0x30000, 0x100, 0x100, 0x100]
    assert list(seen.floats) == [1.5, 0.0, 0.0]
    assert list(seen.ints) == [64, 32, 16, 1]
    assert seen.stream == 99 and seen.calls == 1


def test_more_operands_than_pointer_slots_is_refused(stand_in):
    entry = ctypes.cast(stand_in.entry, ctypes.c_void_p).value
    with pytest.raises(InvalidArgumentError, match="pointer_slots"):
        PackedLaunch.create(_layout(), entry, [0] * 13, (1, 2, 3), (16, 16, 16), ("A", "B", "C"), 3, (), (), (),
                            (1, 1, 1, 1), 11, None, pointer_slots=2)


# ---- the raw path: dsl_fill over (uid, address) arrays, what the XLA FFI handler calls without the GIL ------

def test_a_raw_launch_hands_the_entry_the_addresses_by_uid(stand_in):
    launch = _launch(stand_in, default=0.75)
    launch.launch_unchecked([3, 1, 2], [0x30000, 0x10000, 0x20000], 55)       # any order: found by uid
    seen = _seen(stand_in)
    assert [seen.ptrs[i] for i in range(3)] == [0x10000, 0x20000, 0x30000]
    assert list(seen.floats) == [0.75, 0.0, 0.0] and seen.stream == 55 and seen.extra == 0xABCD00
    assert launch.pointer_uids == (1, 2, 3) and launch.scalars_have_values


def test_a_raw_launch_reads_a_host_scalar_through_its_address(stand_in):
    alpha = np.array([1.5], np.float32)
    _launch(stand_in).launch_unchecked([1, 2, 3, 4], [0x10000, 0x20000, 0x30000, alpha.ctypes.data])
    assert _seen(stand_in).floats[0] == 1.5


def test_a_raw_launch_refuses_misalignment_and_a_missing_scalar_as_execute_does(stand_in):
    before = _seen(stand_in).calls
    with pytest.raises(ValueError, match="output is at address 0x30004, not 16-byte aligned"):
        _launch(stand_in, default=1.0).launch_unchecked([1, 2, 3], [0x10000, 0x20000, 0x30004])
    launch = _launch(stand_in)
    assert not launch.scalars_have_values
    with pytest.raises(InvalidArgumentError, match="scalar uid 4"):
        launch.launch_unchecked([1, 2, 3], [0x10000, 0x20000, 0x30000])
    with pytest.raises(InvalidArgumentError, match="as many addresses as uids"):
        launch.launch_unchecked([1, 2], [0x10000])
    assert _seen(stand_in).calls == before
