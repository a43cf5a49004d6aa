"""The blob's DSL launch section (7, format version 3; 4 with cuTile kernels) in Python's reader and writer:
records round-trip, the writer picks version 3 only when the section is there and 4 only for a cuTile
kernel (or more than 8), every malformed section is refused naming what is wrong
(tests/c_runtime/test_c_dsl_launch.py and test_c_tile_launch.py run the same blobs through the C runtime),
and a CuTe plan made by hand exports the records the C runtime launches it from."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from cudnn_graph import _plan_blob as blob_format
from cudnn_graph._plan_blob import PlanHeader, TensorRecord, pack_blob, unpack_blob
from cudnn_graph.errors import PlanBlobError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dsl_launch_blobs import (ENTRY, EXTENTS, OPERANDS, POINTERS, PREFIX, SCALARS, kernel,  # noqa: E402
                               kernels_payload, launch_blob, malformed_blobs, malformed_tile_blobs, tile_blob,
                               tile_kernel)

SHARED_OBJECT = b"\x7fELF" + bytes(range(256)) * 4     # the reader does not look inside


def test_dsl_launch_records_round_trip_as_format_version_3():
    read = unpack_blob(launch_blob(SHARED_OBJECT))
    assert read.header.format_version == blob_format.DSL_LAUNCH_FORMAT_VERSION == 3
    assert read.dsl_launch == (kernel(SHARED_OBJECT),)
    assert read.plan_operands == tuple(OPERANDS)
    assert blob_format.SECTION_DSL_LAUNCH not in read.sections          # parsed out, as section 6 is
    payload, offset = kernels_payload(SHARED_OBJECT)
    k = read.dsl_launch[0]
    assert read.sections[blob_format.SECTION_KERNELS][k.code_offset:k.code_offset + k.code_size] == SHARED_OBJECT


def test_inline_code_round_trips_too():
    inline = kernel(SHARED_OBJECT, inline=True, hint="/opt/dsl/libcute_dsl_runtime.so")
    read = unpack_blob(launch_blob(SHARED_OBJECT, [inline], with_kernels_section=False))
    assert read.dsl_launch == (inline,) and read.dsl_launch[0].code == SHARED_OBJECT


def test_a_blob_without_the_section_keeps_the_lower_version():
    header = PlanHeader(library_version=1, cudnn_version=0, arch=0, engine_family=3, engine_id=20000,
                        workspace_size=0)
    data = pack_blob(header, [TensorRecord(1, "x", 0, (2,), (1,), False, False, 0)], {})
    assert int.from_bytes(data[8:10], "little") == 1 and unpack_blob(data).dsl_launch == ()


@pytest.mark.parametrize("case", sorted(malformed_blobs(SHARED_OBJECT)))
def test_a_malformed_dsl_launch_section_is_refused_naming_what_is_wrong(case):
    data, words = malformed_blobs(SHARED_OBJECT)[case]
    with pytest.raises(PlanBlobError) as err:
        unpack_blob(data)
    assert err.value.field == "DSL launch"
    for word in words:
        assert word in str(err.value), (case, str(err.value))


def test_cutile_launch_records_round_trip_as_format_version_4():
    read = unpack_blob(tile_blob())
    assert read.header.format_version == blob_format.TILE_LAUNCH_FORMAT_VERSION == 4
    assert read.dsl_launch == (tile_kernel(0), tile_kernel(1))
    first = read.dsl_launch[0]
    assert first.tile.image == tile_kernel(0).tile.image and first.tile.block == (1, 1, 1)
    assert [(a.offset, a.uid, a.add) for a in first.tile.addresses] == [(0, 1, 0), (32, None, 256), (56, 3, 0)]
    assert blob_format.SECTION_KERNELS not in read.sections      # the cubins are inline


def test_a_cute_blob_stays_format_version_3_and_more_than_8_kernels_need_4():
    assert unpack_blob(launch_blob(SHARED_OBJECT)).header.format_version == 3
    nine = [kernel(SHARED_OBJECT, inline=True)] * 9
    read = unpack_blob(launch_blob(SHARED_OBJECT, nine, with_kernels_section=False))
    assert read.header.format_version == 4 and len(read.dsl_launch) == 9


@pytest.mark.parametrize("case", sorted(malformed_tile_blobs()))
def test_a_malformed_cutile_launch_record_is_refused_naming_what_is_wrong(case):
    data, words = malformed_tile_blobs()[case]
    with pytest.raises(PlanBlobError) as err:
        unpack_blob(data)
    assert err.value.field == "DSL launch"
    for word in words:
        assert word in str(err.value), (case, str(err.value))


def test_the_writer_refuses_a_cutile_record_without_its_launch_and_a_cute_one_with_one():
    import dataclasses
    header = PlanHeader(1, 0, 90, 3, 20200, 0)
    with pytest.raises(PlanBlobError, match="without its TileParams"):
        pack_blob(header, [], {}, (), [dataclasses.replace(tile_kernel(0), tile=None)])
    with pytest.raises(PlanBlobError, match="convention-1 launch record with TileParams"):
        pack_blob(header, [], {}, (), [kernel(SHARED_OBJECT, inline=True, tile=tile_kernel(0).tile)])


def test_the_writer_refuses_records_a_reader_would():
    with pytest.raises(PlanBlobError, match="C identifier"):
        pack_blob(PlanHeader(1, 0, 90, 3, 20100, 0), [], {}, (), [kernel(SHARED_OBJECT, entry_symbol="a b",
                                                                      inline=True)])


# ---- the CuTe engine's hooks (the engine package imports only with the DSL installed) ----------------

def _hand_made_plan():
    pytest.importorskip("cudnn_graph.engines.cute", reason="nvidia-cutlass-dsl is not installed",
                        exc_type=ImportError)
    from cudnn_graph.engines.base import PlanConfig
    from cudnn_graph.engines.cute._spec import EpilogueTensor
    from cudnn_graph.engines.cute.engine import CuteGemmPlan
    problem = SimpleNamespace(a_uid=1, b_uid=2, c_uid=3, epi_uids=(4,),
                              epi_tensors=(EpilogueTensor("bfloat16", (0, 1, 0)),), scalar_uids=(5, 6),
                              scalar_types=("float32", "float64"))
    launcher = SimpleNamespace(extents=EXTENTS, ordinal=0)
    plan = CuteGemmPlan(PlanConfig(20100, {}), problem, None, launcher)
    plan.scalar_defaults = (None, 0.25)           # beta's value is fixed in the graph, alpha's is not
    return plan


def test_a_cute_plan_exports_its_slots_entry_and_shared_object_for_the_c_runtime():
    # Without the DSL the CuTe engine package raises ImportError (CI's toolchain stage runs this).
    _disk = pytest.importorskip("cudnn_graph.engines.cute._disk", reason="nvidia-cutlass-dsl is not installed",
                                exc_type=ImportError)
    plan = _hand_made_plan()
    record = {"format": _disk.PLAN_RECORD_FORMAT, "key": {}, "entry_symbol": ENTRY, "function_prefix": PREFIX,
              "object_size": 5, "shared_object_size": len(SHARED_OBJECT), "runtime": "/x/libcute_dsl_runtime.so"}
    import json
    line = json.dumps(record, sort_keys=True).encode()
    payload = line + b"\n" + b"OBJCT" + SHARED_OBJECT
    (exported,) = plan.export_launch(payload)
    assert exported.pointers == POINTERS and exported.scalars == SCALARS and exported.ints == EXTENTS
    assert (exported.entry_symbol, exported.function_prefix) == (ENTRY, PREFIX)
    assert exported.runtime_hint == "/x/libcute_dsl_runtime.so" and exported.placeholder == 256
    assert payload[exported.code_offset:exported.code_offset + exported.code_size] == SHARED_OBJECT
    assert plan.export_plan_operands() == tuple(OPERANDS)


def test_a_cute_plan_without_a_linked_shared_object_exports_no_launch():
    import json
    plan = _hand_made_plan()
    line = json.dumps({"format": 2, "entry_symbol": ENTRY, "object_size": 3, "shared_object_size": 0}).encode()
    assert plan.export_launch(line + b"\nobj") == () and plan.export_launch(None) == ()
    assert plan.export_launch(b"not a record") == ()
