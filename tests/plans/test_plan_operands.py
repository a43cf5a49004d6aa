"""The plan-operand section of serialized plans (section 6, format version 2): the operands a plan binds
itself at execute (constants, views of a caller tensor, scratch in the workspace, caller operands no
kernel reads) round-trip through pack_blob / unpack_blob, serialize() writes what the cuDNN plan's
runner binds, a blob without them stays format version 1, and every malformed section is refused with
PlanBlobError naming field "plan operands" (the C runtime refuses the same blobs:
tests/c_runtime/test_c_plan_operands.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import _plan_blob as blob_format
from cudnn_graph._plan_blob import (OPERAND_ALIAS, OPERAND_HOST_CONSTANT, OPERAND_WITHHELD, PlanHeader,
                                    TensorRecord, pack_blob, unpack_blob)
from cudnn_graph.errors import PlanBlobError, PlanVersionMismatchError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _plan_operand_blobs import OPERANDS, TENSORS, malformed_blobs, operand_blob  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ports"))
from _standin import CHILD_PROLOGUE, fake_cuda_builder, run_child  # noqa: E402

F = cudnn.data_type


def test_plan_operands_round_trip_through_the_container_as_format_version_2():
    read = unpack_blob(operand_blob())
    assert read.plan_operands == tuple(OPERANDS)
    assert read.header.format_version == blob_format.PLAN_OPERANDS_FORMAT_VERSION == 2
    assert blob_format.SECTION_PLAN_OPERANDS not in read.sections      # parsed out, as the tensor table is


def test_a_blob_without_plan_operands_is_written_as_format_version_1_for_older_readers():
    header = PlanHeader(library_version=1, cudnn_version=0, arch=0, engine_family=3, engine_id=20000,
                        workspace_size=0)
    data = pack_blob(header, [TensorRecord(1, "x", 0, (2,), (1,), False, False, 0)], {})
    assert int.from_bytes(data[8:10], "little") == 1
    assert unpack_blob(data).plan_operands == ()


def test_a_format_version_past_this_librarys_is_refused_saying_which():
    with pytest.raises(PlanVersionMismatchError) as err:
        unpack_blob(operand_blob(format_version=blob_format.FORMAT_VERSION + 1))
    assert err.value.field == "format version" and err.value.blob_value == blob_format.FORMAT_VERSION + 1
    assert err.value.process_value == blob_format.FORMAT_VERSION == 4


@pytest.mark.parametrize("case", sorted(malformed_blobs()))
def test_a_malformed_plan_operand_section_is_refused_naming_the_operand(case):
    data, words = malformed_blobs()[case]
    with pytest.raises(PlanBlobError) as err:
        unpack_blob(data)
    assert err.value.field == "plan operands", str(err.value)
    for word in words:
        assert word in str(err.value), (case, str(err.value))


def test_the_writer_refuses_an_unknown_kind():
    with pytest.raises(PlanBlobError, match="unknown kind 9"):
        pack_blob(PlanHeader(1, 0, 0, 1, 7, 0), TENSORS, {}, [blob_format.PlanOperand(9, 1003)])


# ---- serialize() of cuDNN plans built on the stand-in libcudnn -----------------------------------------

@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return fake_cuda_builder(tmp_path_factory.mktemp("plan_operands_standin"))()


SERIALIZE_CHILD = CHILD_PROLOGUE + """
import numpy as np
from cudnn_graph import _plan_blob as blob_format

def operands_of(g):
    data = g.serialize(as_bytes=True)
    read = blob_format.unpack_blob(data)
    h = cudnn.pygraph()
    h.deserialize(data)                  # Python reads a version-2 blob and re-derives the same operands
    again = h.compiled_plan().export_plan_operands()
    return {"version": read.header.format_version, "workspace": read.header.workspace_size,
            "operands": [[o.kind, o.uid, o.data_type, o.data.hex(), o.nbytes, o.source_uid, o.byte_offset,
                          o.zero_fill, o.graph_scalar] for o in read.plan_operands],
            "same_after_load": list(again) == list(read.plan_operands)}

out = {}
g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cuda")
x = g.tensor(name="x", dim=[2, 4, 8], stride=[32, 8, 1])
s = g.tensor_scalar(0.5, data_type=F.FLOAT, name="half").set_dim([1, 1, 1]).set_stride([1, 1, 1])
g.mul(x, s).set_output(True)
g.build([cudnn.heur_mode.A])
out["scalar"] = dict(operands_of(g), uid=s.uid)

g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device="cuda")
a = g.tensor(name="A", dim=(2, 16, 32), stride=(512, 32, 1))
b = g.tensor(name="B", dim=(2, 16, 8), stride=(128, 8, 1))
cut = g.slice(a, slices=[slice(None), slice(4, 12), slice(0, 16)])
g.matmul(cut, b).set_output(True)
g.build([cudnn.heur_mode.A])
out["slice"] = dict(operands_of(g), a=a.uid, view=cut.uid)

out["plain"] = operands_of(make(8))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def serialized(standin, tmp_path_factory):
    out, _ = run_child(SERIALIZE_CHILD, standin, tmp_path_factory.mktemp("plan_operands_log") / "calls.log")
    return out


def test_serialize_stores_a_graph_fixed_scalar_as_a_host_constant(serialized):
    got = serialized["scalar"]
    assert got["version"] == 2 and got["same_after_load"]
    assert [OPERAND_HOST_CONSTANT, got["uid"], int(F.FLOAT), np.float32(0.5).tobytes().hex(), 0, 0, 0, False,
            True] in got["operands"]


def test_serialize_stores_a_slice_of_a_graph_input_as_a_view_and_withholds_its_source(serialized):
    got = serialized["slice"]
    assert got["version"] == 2 and got["same_after_load"]
    # A[:, 4:12, :16] of a [2, 16, 32] half tensor starts 4 rows of 32 halves in: 256 bytes
    assert got["operands"] == [[OPERAND_ALIAS, got["view"], 0, "", 0, got["a"], 256, False, False],
                               [OPERAND_WITHHELD, got["a"], 0, "", 0, 0, 0, False, False]]


def test_serialize_of_a_plan_that_binds_nothing_itself_stays_format_version_1(serialized):
    assert serialized["plain"]["version"] == 1 and serialized["plain"]["operands"] == []
