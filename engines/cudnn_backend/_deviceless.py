"""cuDNN plans built without the GPU: a graph with ``device_property`` (``cudnn_graph.device_properties``).

The lowering materializes the operation graph with no handle; the heuristics query and every engine get
the device-property descriptor (``CUDNN_ATTR_ENGINEHEUR_DEVICEPROP``, ``CUDNN_ATTR_ENGINE_DEVICEPROP``), and
the execution plan is finalized from its engine config alone, as cudnn-frontend does (no
``CUDNN_ATTR_EXECUTION_PLAN_HANDLE``). That plan serializes (``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``)
like any other; ``DevicelessPlan`` makes the runner it executes with only when it first runs, on a GPU whose
properties match the ones it was built for (its own operands hold device memory).
"""
from __future__ import annotations

import logging

from ..base import CompiledPlan, PlanConfig
from ...errors import GraphNotSupportedError, GraphStateError
from .engine import CudnnBackendEngine, CudnnBackendPlan, _plan_operands

logger = logging.getLogger(__name__)

__all__ = ["DevicelessPlan", "build_deviceless"]


def build_deviceless(lowered, plan: PlanConfig, kernel_cache=None) -> "DevicelessPlan":
    """Finalize ``plan`` of the handle-less ``lowered`` graph (a ``_Lowered`` with ``props``) without a device."""
    from ... import _cudnn_descriptor
    from ..._cudnn_errors import CudnnStatusError
    if kernel_cache is not None:
        kernel_cache.decline(CudnnBackendEngine.name, "a deviceless build (device_property=) attaches no kernel "
                                                      "cache; its plans are built without one")
    cfg = plan.payload if plan.payload is not None else lowered.engine_config(plan.engine_id, plan.knobs)
    try:
        descriptor = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
        descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", "CUDNN_TYPE_BACKEND_DESCRIPTOR", cfg)
        descriptor.finalize()
        workspace = descriptor.get_int64("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE")
    except CudnnStatusError as exc:
        raise GraphNotSupportedError(f"cuDNN could not build {plan.label} without a device: {exc}") from exc
    logger.debug("built %s without a device for %r", plan.label, lowered.props)
    return DevicelessPlan(plan, descriptor, workspace, lowered)


class DevicelessPlan(CudnnBackendPlan):
    """A cuDNN plan finalized for described properties; it serializes at once and runs on a matching GPU
    (executing and serializing as CudnnBackendPlan, through ``runner`` and ``plan_descriptor``)."""

    def __init__(self, plan: PlanConfig, descriptor, workspace: int, lowered):
        CompiledPlan.__init__(self, plan, workspace)     # no runner yet: it needs the device
        self.descriptor = descriptor
        self.program = lowered.program
        self.device_properties = lowered.props
        self._lowered = lowered
        self._runner = None

    @property
    def plan_descriptor(self):
        return self.descriptor

    @property
    def runner(self):
        """The PlanRunner, made on first use: on a GPU whose properties match (else a typed error)."""
        if self._runner is None:
            self._runner = self._make_runner()
        return self._runner

    def _make_runner(self):
        from ... import _driver, _plan_runner
        from ...device_properties import check_device_matches
        device = self._lowered.device
        if _driver.device_count() <= device:
            raise GraphStateError("execute()", "built without a device (device_property=) and cuda:"
                                  f"{device} is not visible here", "serialize() here and deserialize() in a "
                                  "process with that GPU", "a plan runs on the GPU it was built for")
        check_device_matches(self.device_properties, device)
        constants, fixed, scratch = _plan_operands(self.program, device)
        return _plan_runner.PlanRunner(self.descriptor, self.workspace_size, device, self.plan.label, constants,
                                       self._lowered, aliases=self.program.aliases, fixed=fixed, scratch=scratch,
                                       omit=self.program.unused_uids)
