"""Blobs with a DSL launch section (docs/plan_format.md, section 7), one good CuTe-like plan and many
malformed sections, shared by the Python reader's tests (tests/plans/test_plan_launch.py) and the C
runtime's (tests/c_runtime/test_c_dsl_launch.py): both readers refuse the same sections, saying why.

The kernel is a stand-in (STANDIN_KERNEL): a shared object with the CuTe DSL export's init /
load-to-device / entry convention that logs what it is given to $FAKE_DSL_LOG, and whose only outside
reference is a symbol of the stand-in runtime library (STANDIN_RUNTIME), as a real kernel's are the DSL
runtime's CUDA shims."""
from __future__ import annotations

import dataclasses
import json
import struct

from cudnn_graph import _plan_launch
from cudnn_graph._plan_blob import (OPERAND_HOST_CONSTANT, SECTION_DSL_LAUNCH, SECTION_GRAPH, SECTION_KERNELS,
                                    SECTION_PLAN, PlanHeader, PlanOperand, TensorRecord, pack_blob)
from cudnn_graph._plan_launch import CONVENTION_CUTE_PACKED, LaunchKernel, PointerSlot, ScalarSlot
from cudnn_graph.plan_serialization import library_version

FLOAT, DOUBLE, BF16 = 0, 1, 9
CUTE_ID = 20100
PREFIX = "cgtest"
ENTRY = "_mlir_cgtest__mlir_ciface_gemm"
PLACEHOLDER = 256
EXTENTS = (64, 32, 16, 1)
BETA = 0.25          # the graph's fixed value of 'beta' (uid 6)

STANDIN_KERNEL = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int _cudaLaunchKernelEx(void);          /* the stand-in runtime's: resolves only if it is loaded RTLD_GLOBAL */
static void emit(const char *line) {
    const char *path = getenv("FAKE_DSL_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fputs(line, f); fputc('\n', f); fclose(f); }
}
void _mlir_cgtest_cuda_init(void **args) {
    const char *fail = getenv("FAKE_DSL_INIT_FAIL");
    **(void ***)args[0] = (void *)0x1234;
    *(int32_t *)args[1] = fail ? atoi(fail) : 0;
    emit("init");
}
void _mlir_cgtest_cuda_load_to_device(void **args) {
    char b[96];
    snprintf(b, sizeof b, "load_to_device %d module=%p", *(int32_t *)args[1], **(void ***)args[0]);
    *(int32_t *)args[2] = 0;
    emit(b);
}
int32_t _mlir_cgtest__mlir_ciface_gemm(void **args, int32_t n) {
    char b[600];
    int k = snprintf(b, sizeof b, "entry n=%d ptrs", n);
    for (int i = 0; i < 6; i++) k += snprintf(b + k, sizeof b - k, " %p", *(void **)args[i]);
    k += snprintf(b + k, sizeof b - k, " floats");
    for (int i = 0; i < 3; i++) k += snprintf(b + k, sizeof b - k, " %.9g", *(float *)args[6 + i]);
    k += snprintf(b + k, sizeof b - k, " ints");
    for (int i = 0; i < 4; i++) k += snprintf(b + k, sizeof b - k, " %d", *(int32_t *)args[9 + i]);
    snprintf(b + k, sizeof b - k, " stream %p", *(void **)args[13]);
    const char *fail = getenv("FAKE_DSL_FAIL");
    *(int32_t *)args[14] = fail ? atoi(fail) : _cudaLaunchKernelEx();
    emit(b);
    return 0;
}
"""
# A kernel without the entry the blob names.
STANDIN_KERNEL_NO_ENTRY = STANDIN_KERNEL.replace("int32_t _mlir_cgtest__mlir_ciface_gemm(", "int32_t other_entry(")
STANDIN_RUNTIME = r"""
#include <stdint.h>
int _cudaLaunchKernelEx(void) { return 0; }
const char *cuda_dialect_get_error_name(int32_t code) { return code == 700 ? "cudaErrorIllegalAddress" : 0; }
"""

# a, b, c: the GEMM's operands; bias an epilogue tensor (the table asks no alignment: the slot's 2 bytes
# must reach the caller's queries and checks); alpha a scalar the caller passes; beta one the graph fixed.
TENSORS = [
    TensorRecord(1, "a", BF16, (1, 64, 16), (1024, 16, 1), False, False, 16),
    TensorRecord(2, "b", BF16, (1, 16, 32), (512, 32, 1), False, False, 16),
    TensorRecord(3, "c", BF16, (1, 64, 32), (2048, 32, 1), False, False, 16),
    TensorRecord(4, "bias", BF16, (1, 1, 32), (32, 32, 1), False, False, 0),
    TensorRecord(5, "alpha", FLOAT, (1, 1, 1), (1, 1, 1), False, True, 0),
    TensorRecord(6, "beta", DOUBLE, (1, 1, 1), (1, 1, 1), False, True, 0),
    TensorRecord(7, "t", BF16, (1, 64, 32), (2048, 32, 1), True, False, 0),
]
OPERANDS = [PlanOperand(OPERAND_HOST_CONSTANT, 6, DOUBLE, struct.pack("<d", BETA), graph_scalar=True)]
POINTERS = (PointerSlot(1, 16, "A"), PointerSlot(2, 16, "B"), PointerSlot(3, 16, "output"),
            PointerSlot(4, 2, "epilogue operand 0"), PointerSlot(), PointerSlot())
SCALARS = (ScalarSlot(5, FLOAT), ScalarSlot(6, DOUBLE), ScalarSlot())


def kernels_payload(shared_object: bytes) -> tuple:
    """(section 5's bytes, the shared object's offset in them): a record line, then the shared object, as
    engines/cute/_disk.plan_kernels lays it out (with no exported object)."""
    line = json.dumps({"format": 2, "object_size": 0, "shared_object_size": len(shared_object)}).encode()
    return line + b"\n" + shared_object, len(line) + 1


def kernel(shared_object: bytes, *, inline=False, hint="", **changes) -> LaunchKernel:
    payload, offset = kernels_payload(shared_object)
    fields = dict(convention=CONVENTION_CUTE_PACKED, pointers=POINTERS, scalars=SCALARS, ints=EXTENTS,
                  entry_symbol=ENTRY, function_prefix=PREFIX, runtime_hint=hint, placeholder=PLACEHOLDER)
    fields.update(code=shared_object) if inline else fields.update(code_offset=offset, code_size=len(shared_object))
    fields.update(changes)
    return LaunchKernel(**fields)


def recipe(engine="cute_gemm", engine_id=CUTE_ID) -> bytes:
    return json.dumps({"engine": engine, "engine_id": engine_id, "knobs": [], "name": "p", "source": "test"},
                      sort_keys=True, separators=(",", ":")).encode()


def launch_blob(shared_object: bytes, kernels=None, *, raw_section: bytes | None = None, format_version=None,
                tensors=TENSORS, operands=OPERANDS, with_kernels_section=True) -> bytes:
    """A CuTe plan's blob whose section 7 is ``kernels`` (default: one kernel over the stand-in), or
    ``raw_section`` as its bytes."""
    payload, _ = kernels_payload(shared_object)
    header = PlanHeader(library_version=library_version(), cudnn_version=0, arch=90, engine_family=3,
                        engine_id=CUTE_ID, workspace_size=0, flags=1, format_version=format_version)
    sections = {SECTION_GRAPH: b"{}", SECTION_PLAN: recipe()}
    if with_kernels_section:
        sections[SECTION_KERNELS] = payload
    if raw_section is not None:
        sections[SECTION_DSL_LAUNCH] = raw_section
        header = dataclasses.replace(header, format_version=format_version or 3)
        return pack_blob(header, tensors, sections, operands)
    return pack_blob(header, tensors, sections, operands, kernels if kernels is not None else [kernel(shared_object)])


def _section(*kernels) -> bytes:
    """Section 7's bytes for ``kernels``, packed without the writer's own check (the malformed cases)."""
    check, _plan_launch.unpack_launch = _plan_launch.unpack_launch, lambda *a: ()
    try:
        return _plan_launch.pack_launch(list(kernels))
    finally:
        _plan_launch.unpack_launch = check


def malformed_blobs(shared_object: bytes) -> dict:
    """{case: (blob, words its refusal names)}: the ways a DSL launch section can be wrong."""
    good = kernel(shared_object)
    section = _section(good)
    head = 8
    symbol_at = head + 48 + 6 * 16 + sum(-(-len(p.name) // 8) * 8 for p in POINTERS) + 3 * 24 + 4 * 8

    def edited(at: int, data: bytes) -> bytes:
        return section[:at] + data + section[at + len(data):]

    def raw(data: bytes, **kw) -> bytes:
        return launch_blob(shared_object, raw_section=data, **kw)

    def one(**changes) -> bytes:
        return raw(_section(dataclasses.replace(good, **changes)))
    return {
        "no_kernels": (raw(struct.pack("<II", 0, 0)), ["0 kernels"]),
        "too_many_kernels": (raw(struct.pack("<II", 9, 0) + section[8:]), ["9 kernels"]),
        "head_short": (raw(section[:4]), ["cut short"]),
        "kernel_cut_short": (raw(section[:head + 40]), ["cut short"]),
        "slots_cut_short": (raw(section[:symbol_at - 8]), ["cut short"]),
        "unknown_convention": (raw(edited(head, struct.pack("<H", 9))), ["convention 9"]),
        "bad_flags": (raw(edited(head + 2, struct.pack("<H", 6))), ["flags 0x6"]),
        "wrong_slot_count": (one(ints=EXTENTS[:3]), ["3 int slots", "takes 6, 3 and 4"]),
        "symbol_not_an_identifier": (one(entry_symbol="gemm(void)"), ["entry symbol", "C identifier"]),
        "empty_prefix": (one(function_prefix=""), ["0-byte function prefix"]),
        "pointer_of_a_virtual": (one(pointers=(PointerSlot(7, 16, "A"),) + POINTERS[1:]),
                                 ["pointer slot 0", "uid 7", "no device operand"]),
        "pointer_of_a_scalar": (one(pointers=(PointerSlot(5, 16, "A"),) + POINTERS[1:]), ["uid 5"]),
        "pointer_alignment": (one(pointers=(PointerSlot(1, 12, "A"),) + POINTERS[1:]), ["12-byte", "power of two"]),
        "pointer_flags": (raw(edited(head + 48 + 12, struct.pack("<H", 2))), ["pointer slot 0", "flags 0x2"]),
        "scalar_of_a_tensor": (one(scalars=(ScalarSlot(1, FLOAT),) + SCALARS[1:]),
                               ["scalar slot 0", "uid 1", "no pass-by-value operand"]),
        "scalar_read_type": (one(scalars=(ScalarSlot(5, 2),) + SCALARS[1:]), ["data type 2"]),
        "scalar_not_finite": (one(scalars=SCALARS[:2] + (ScalarSlot(value=float("inf")),)), ["scalar slot 2"]),
        "int_past_int32": (one(ints=(2 ** 31,) + EXTENTS[1:]), ["int slot 0", "int32"]),
        "no_code": (one(code_size=0), ["no code"]),
        "code_past_the_kernels": (one(code_offset=len(shared_object)), ["kernels section"]),
        "code_without_a_kernels_section": (raw(section, with_kernels_section=False), ["kernels section", "0 bytes"]),
        "trailing_bytes": (raw(section + b"\0" * 8), ["8 bytes past"]),
        "in_a_format_2_blob": (raw(section, format_version=2), ["format-2 blob", "section 7"]),
    }
