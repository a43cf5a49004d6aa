"""The cuDNN backend engine: the IR lowered to backend descriptors, cuDNN's heuristics as plans.

Importing needs no libcudnn: ``CudnnBackendEngine().available`` is False when it cannot be loaded,
and the engine then contributes no plan: it declines every graph with the reason
(``unavailable_reason()``: libcudnn not found, and how to install it).
"""
from .engine import (CudnnBackendEngine, CudnnBackendPlan, Knob, GRAPH_METHODS, create_execution_plan,
                     deselect_behavior_notes, deselect_engines, deselect_numeric_notes,
                     deselect_workspace_greater_than, get_engine_count, get_knobs_for_engine,
                     select_behavior_notes, select_numeric_notes)
from .lowering import HANDLE, Program, Ref, Step, check_lowerable, lower_program
from ...errors import WorkspaceError

__all__ = ["CudnnBackendEngine", "CudnnBackendPlan", "Knob", "GRAPH_METHODS", "WorkspaceError",
           "create_execution_plan", "deselect_behavior_notes", "deselect_engines", "deselect_numeric_notes",
           "deselect_workspace_greater_than", "get_engine_count", "get_knobs_for_engine",
           "select_behavior_notes", "select_numeric_notes", "lower_program", "check_lowerable", "Program",
           "Step", "Ref", "HANDLE"]
