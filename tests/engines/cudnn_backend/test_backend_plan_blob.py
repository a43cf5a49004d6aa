"""The cuDNN backend's side of serialized plans, on the CPU: a built plan hands over cuDNN's serialized
execution plan (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, read as chars) or None where cuDNN refuses,
and the attributes the load sets are ones the ABI header declares. The GPU round trips are in
tests/plans/test_plan_round_trips_gpu.py."""
from __future__ import annotations

import pytest

from cudnn_graph import _cudnn_names
from cudnn_graph._cudnn_errors import CudnnStatusError
from cudnn_graph.engines.base import PlanConfig
from cudnn_graph.engines.cudnn_backend.engine import CudnnBackendPlan
from cudnn_graph.engines.cudnn_backend.lowering import Program
from cudnn_graph import _plan_blob as blob
from cudnn_graph.enums import DataType

JSON_ATTRIBUTE = "CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION"


class _FakePlanDescriptor:
    def __init__(self, text=None, refuse=False):
        self.text, self.refuse, self.asked = text, refuse, []

    def count(self, attribute, attribute_type):
        self.asked.append(("count", attribute, attribute_type))
        if self.refuse:
            raise CudnnStatusError(3000, "cudnnBackendGetAttribute")    # CUDNN_STATUS_NOT_SUPPORTED
        return len(self.text) + 1

    def get_text(self, attribute, capacity):
        self.asked.append(("text", attribute, capacity))
        return self.text


class _FakeRunner:
    workspace_size = 0

    def __init__(self, plan):
        self.plan = plan


def _program(constants=(), **operands) -> Program:
    return Program(steps=[], tensor_steps={}, geometry={}, operations=[], constants=list(constants), **operands)


def _plan(descriptor):
    return CudnnBackendPlan(PlanConfig(7, {}, name="eng7"), _FakeRunner(descriptor), _program())


def test_a_built_plan_exports_cudnns_serialized_plan_as_bytes():
    descriptor = _FakePlanDescriptor('{"engine": 7}')
    assert _plan(descriptor).export_kernels() == b'{"engine": 7}'
    assert descriptor.asked == [("count", JSON_ATTRIBUTE, "CUDNN_TYPE_CHAR"), ("text", JSON_ATTRIBUTE, 14)]


def test_an_engine_cudnn_cannot_serialize_exports_nothing(caplog):
    with caplog.at_level("INFO"):
        assert _plan(_FakePlanDescriptor(refuse=True)).export_kernels() is None
    assert any("cannot serialize eng7" in r.getMessage() for r in caplog.records)
    assert _plan(_FakePlanDescriptor("")).export_kernels() is None


@pytest.mark.parametrize("name", [JSON_ATTRIBUTE, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE",
                                  "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE"])
def test_the_attributes_a_load_uses_are_declared(name):
    assert name in _cudnn_names.ATTRIBUTES
    assert "CUDNN_TYPE_CHAR" in _cudnn_names.ATTRIBUTE_TYPES


def test_a_built_plan_exports_the_operands_it_binds_itself_in_binding_order():
    import numpy as np
    program = _program(constants=[(5, DataType.FLOAT, 0.125)], plan_constants=[(101, DataType.INT32, -3)],
                       scratch=[(102, 64, None), (103, 24, (0.5, 0.25)), (104, 32, 0)],
                       aliases=[(6, 1, 128)], unused_uids=[1])
    plan = CudnnBackendPlan(PlanConfig(7, {}, name="eng7"), _FakeRunner(None), program)
    assert plan.export_plan_operands() == (
        blob.PlanOperand(blob.OPERAND_HOST_CONSTANT, 5, int(DataType.FLOAT), np.float32(0.125).tobytes(),
                         graph_scalar=True),
        blob.PlanOperand(blob.OPERAND_HOST_CONSTANT, 101, int(DataType.INT32), np.int32(-3).tobytes()),
        blob.PlanOperand(blob.OPERAND_SCRATCH, 102, nbytes=64),
        blob.PlanOperand(blob.OPERAND_DEVICE_CONSTANT, 103, int(DataType.FLOAT),
                         np.array([0.5, 0.25], np.float32).tobytes(), nbytes=24),
        blob.PlanOperand(blob.OPERAND_SCRATCH, 104, nbytes=32, zero_fill=True),
        blob.PlanOperand(blob.OPERAND_ALIAS, 6, source_uid=1, byte_offset=128),
        blob.PlanOperand(blob.OPERAND_WITHHELD, 1),
    )
