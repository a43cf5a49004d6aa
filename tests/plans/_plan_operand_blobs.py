"""Blobs with a plan-operand section (docs/plan_format.md, section 6), one good and many malformed, shared
by the Python reader's tests (tests/plans/test_plan_operands.py) and the C runtime's
(tests/c_runtime/test_c_plan_operands.py): both readers must refuse the same sections, saying why."""
from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np

from cudnn_graph import _plan_blob as blob_format
from cudnn_graph._plan_blob import (OPERAND_ALIAS, OPERAND_DEVICE_CONSTANT, OPERAND_HOST_CONSTANT, OPERAND_SCRATCH,
                                    OPERAND_WITHHELD, SECTION_CUDNN_PLAN, SECTION_GRAPH, SECTION_PLAN,
                                    SECTION_PLAN_OPERANDS, PlanHeader, PlanOperand, TensorRecord, pack_blob)
from cudnn_graph.plan_serialization import library_version

FLOAT, HALF, INT32 = 0, 2, 4
# The stand-in libcudnn reports this workspace for a serialized plan that names one.
CUDNN_WORKSPACE = 1000
FAKE_PLAN = json.dumps({"fake": "serialized execution plan", "workspace": CUDNN_WORKSPACE},
                       separators=(",", ":")).encode()

# x (1) is read only through the view v (6) at byte offset 128, so it is withheld from cuDNN; s (5) is
# a scalar the graph fixed (0.125); 1001..1004 are operands the lowering made.
TENSORS = [
    TensorRecord(1, "x", HALF, (4, 8), (8, 1), False, False, 16),
    TensorRecord(2, "w", HALF, (8, 8), (8, 1), False, False, 16),
    TensorRecord(4, "y", HALF, (4, 8), (8, 1), False, False, 16),
    TensorRecord(5, "s", FLOAT, (1, 1), (1, 1), False, True, 0),
    TensorRecord(6, "v", HALF, (2, 8), (8, 1), True, False, 0),
]
SLOPES = np.array([0.5, 0.25], np.float32).tobytes()
OPERANDS = [
    PlanOperand(OPERAND_HOST_CONSTANT, 5, FLOAT, np.float32(0.125).tobytes(), graph_scalar=True),
    PlanOperand(OPERAND_HOST_CONSTANT, 1001, INT32, np.int32(-3).tobytes()),
    PlanOperand(OPERAND_DEVICE_CONSTANT, 1002, FLOAT, SLOPES, nbytes=24),
    PlanOperand(OPERAND_SCRATCH, 1003, nbytes=100),
    PlanOperand(OPERAND_SCRATCH, 1004, nbytes=64, zero_fill=True),
    PlanOperand(OPERAND_ALIAS, 6, source_uid=1, byte_offset=128),
    PlanOperand(OPERAND_WITHHELD, 1),
]
# Scratch past cuDNN's 1000 bytes, each region at a multiple of 256: 1003 at 1024, 1004 at 1280; 1536 in all.
SCRATCH_OFFSETS = {1003: 1024, 1004: 1280}
WORKSPACE_SIZE = 1536


def recipe(engine: str = "cudnn_backend", engine_id: int = 7) -> bytes:
    return json.dumps({"engine": engine, "engine_id": engine_id, "knobs": [], "name": "p", "source": "test"},
                      sort_keys=True, separators=(",", ":")).encode()


def operand_blob(operands=OPERANDS, *, raw_section: bytes | None = None, format_version=None,
                 tensors=TENSORS) -> bytes:
    """A cuDNN blob (stand-in plan) with ``operands`` as section 6, or ``raw_section`` as its bytes."""
    header = PlanHeader(library_version=library_version(), cudnn_version=91900, arch=90, engine_family=1,
                        engine_id=7, workspace_size=WORKSPACE_SIZE, format_version=format_version)
    sections = {SECTION_GRAPH: b"{}", SECTION_PLAN: recipe(), SECTION_CUDNN_PLAN: FAKE_PLAN}
    if raw_section is not None:
        sections[SECTION_PLAN_OPERANDS] = raw_section
        if format_version is None:
            header = dataclasses.replace(header, format_version=2)
        return pack_blob(header, tensors, sections)
    return pack_blob(header, tensors, sections, operands)


def _raw(*rows) -> bytes:
    """A section of (kind, flags, data type, uid, a, b, data) rows packed as the format says."""
    out = bytearray(struct.pack("<II", len(rows), 0))
    for kind, flags, dtype, uid, a, b, data in rows:
        out += struct.pack("<HHiqqqQ", kind, flags, dtype, uid, a, b, len(data))
        out += data + b"\0" * (-len(data) % 8)
    return bytes(out)


def malformed_blobs() -> dict:
    """{case: (blob, words its refusal names)}: every way a plan-operand section can be wrong."""
    good = blob_format._pack_plan_operands(OPERANDS)
    scalar = np.float32(1).tobytes()
    return {
        "unknown_kind": (operand_blob(raw_section=_raw((9, 0, 0, 1003, 0, 0, b""))), ["unknown kind 9"]),
        "cut_short": (operand_blob(raw_section=good[:-20]), ["cut short"]),
        "head_short": (operand_blob(raw_section=good[:4]), ["cut short"]),
        "too_many": (operand_blob(raw_section=struct.pack("<II", 1000, 0) + good[8:]), ["1000 operands", "256"]),
        "bad_flags": (operand_blob(raw_section=_raw((OPERAND_SCRATCH, 1, 0, 1003, 64, 0, b""))),
                      ["uid 1003", "flags 0x1"]),
        "big_scalar": (operand_blob(raw_section=_raw((OPERAND_HOST_CONSTANT, 0, 0, 1001, 0, 0, b"\1" * 20))),
                       ["uid 1001", "a scalar of 20 bytes"]),
        "empty_scalar": (operand_blob(raw_section=_raw((OPERAND_HOST_CONSTANT, 0, 0, 1001, 0, 0, b""))),
                         ["a scalar of 0 bytes"]),
        "device_data_past_size": (operand_blob(raw_section=_raw((OPERAND_DEVICE_CONSTANT, 0, 0, 1002, 4, 0, SLOPES))),
                                  ["uid 1002", "8 bytes of data for 4 bytes"]),
        "alias_of_a_virtual": (operand_blob(raw_section=_raw((OPERAND_ALIAS, 0, 0, 7, 6, 0, b""))),
                               ["uid 7", "view of uid 6", "no device operand"]),
        "alias_of_a_scalar": (operand_blob(raw_section=_raw((OPERAND_ALIAS, 0, 0, 7, 5, 0, b""))),
                              ["view of uid 5"]),
        "alias_negative_offset": (operand_blob(raw_section=_raw((OPERAND_ALIAS, 0, 0, 7, 1, -16, b""))),
                                  ["byte offset -16"]),
        "withheld_unknown": (operand_blob(raw_section=_raw((OPERAND_WITHHELD, 0, 0, 77, 0, 0, b""))),
                             ["uid 77", "not an operand"]),
        "scratch_on_a_caller_uid": (operand_blob(raw_section=_raw((OPERAND_SCRATCH, 0, 0, 2, 64, 0, b""))),
                                    ["uid 2", "caller operand 'w'"]),
        "graph_scalar_not_a_scalar": (operand_blob(raw_section=_raw((OPERAND_HOST_CONSTANT, 1, 0, 2, 0, 0, scalar))),
                                      ["uid 2", "graph scalar"]),
        "duplicate_uid": (operand_blob(raw_section=_raw((OPERAND_SCRATCH, 0, 0, 1003, 64, 0, b""),
                                                        (OPERAND_SCRATCH, 0, 0, 1003, 64, 0, b""))),
                          ["uid 1003 appears twice"]),
        "in_a_format_1_blob": (operand_blob(raw_section=good, format_version=1), ["format-1 blob", "section 6"]),
    }
