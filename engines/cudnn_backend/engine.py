"""CudnnBackendEngine: cuDNN's own engines, reached through the backend descriptor API.

Planning: ``propose_plans(graph)`` lowers the IR (``lowering.lower_program``), materializes and
finalizes the operation graph once per graph structure (cached by ``graph.key()`` and device), asks
cuDNN's heuristics for each requested mode (A, B, FALLBACK) and turns every engine config into a
``PlanConfig`` whose ``engine_id`` is cuDNN's global engine index and whose knobs are
``{knob_type: value}``. Building finalizes the execution plan (``cudnnBackendFinalize``) and wraps it
in a ``_plan_runner.PlanRunner``, whose ``execute`` is the nogil hot path.

The pygraph-style plan filters and the engine-level queries are module functions that take the
graph; ``CudnnBackendEngine.graph_methods`` lists them, and the engine manifest adds them to every
graph as methods (``cudnn_graph.graph.register_graph_method``): ``deselect_engines``, ``select_numeric_notes``,
``deselect_numeric_notes``, ``select_behavior_notes``, ``deselect_behavior_notes``,
``deselect_workspace_greater_than``, ``get_engine_count``, ``get_knobs_for_engine``,
``create_execution_plan``.
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from .. import ids
from ..base import BaseEngine, CompiledPlan, ExecutionContext, GraphView, PlanConfig
from ...data_type import DataType, numpy_dtype
from ...enums import behavior_note, heur_mode, knob_type, numerical_note
from ...errors import GraphNotSupportedError
from ... import _loader
from .lowering import BYTE_ALIGNMENT, Program, check_lowerable, dynamic_shape_wanted, lower_program, materialize

logger = logging.getLogger(__name__)

__all__ = ["CudnnBackendEngine", "CudnnBackendPlan", "Knob", "BackendGraphState", "BackendKernelCache",
           "deselect_engines", "select_numeric_notes", "deselect_numeric_notes", "select_behavior_notes",
           "deselect_behavior_notes", "deselect_workspace_greater_than", "get_engine_count",
           "get_knobs_for_engine", "create_execution_plan", "GRAPH_METHODS"]

DEFAULT_HEUR_MODES = (heur_mode.A, heur_mode.FALLBACK)
_WORKSPACE_QUERY_VERSION = 90200      # CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE
_LOWERING_CACHE_SIZE = 256            # operation graphs kept per engine (by graph structure)


@dataclass(frozen=True)
class Knob:
    """One tunable knob of an engine, as cuDNN describes it (``get_knobs_for_engine``); the field names
    are cudnn.pygraph's (``range(knob.min_value, knob.max_value + 1, knob.stride)`` walks its values)."""
    type: Any          # a knob_type member (an int for types this build does not name)
    min_value: int
    max_value: int
    stride: int


@dataclass
class _Filters:
    barred_names: tuple = ()
    numeric_keep: tuple = ()
    numeric_bar: tuple = ()
    behavior_keep: tuple = ()
    behavior_bar: tuple = ()
    max_workspace: Optional[int] = None


@dataclass
class BackendGraphState:
    """What the backend keeps on a graph (its ``GraphView.state`` slot): its lowering and filters."""
    lowered: Any = None
    filters: _Filters = field(default_factory=_Filters)


def _member(enum_cls, value):
    try:
        return enum_cls(value)
    except ValueError:
        return int(value)


def _mode_of(mode) -> heur_mode:
    """A heur_mode from ours, pygraph's (matched by name) or a name."""
    if isinstance(mode, heur_mode):
        return mode
    name = mode if isinstance(mode, str) else getattr(mode, "name", None)
    if isinstance(name, str):
        key = name.strip().upper().rsplit(".", 1)[-1]
        if key in heur_mode.__members__:
            return heur_mode[key]
    raise ValueError(f"unknown heuristics mode {mode!r}")


def _notes_of(values, enum_cls) -> tuple:
    return tuple(_member(enum_cls, v) for v in values)


def _note_key(note, enum_cls) -> int:
    if isinstance(note, str):
        return int(enum_cls[note.strip().upper().rsplit(".", 1)[-1]])
    name = getattr(note, "name", None)
    if name is not None and not isinstance(note, enum_cls) and name in enum_cls.__members__:
        return int(enum_cls[name])   # another binding's enum: matched by name
    return int(note)


# ---- the lowered graph (one per graph structure and device) ------------------------------------------

class _Lowered:
    """An operation graph finalized in cuDNN, with its heuristics results and built plans."""

    def __init__(self, program: Program, device: int, props=None):
        from ... import _cudnn_handle
        self.program = program
        self.device = device
        # A deviceless build (``props``, a DeviceProperties) has no handle: cuDNN plans for the described GPU.
        self.props = props
        self.handle = None if props is not None else _cudnn_handle.thread_handle(device)
        try:
            self.descriptors = materialize(program, self.handle)
        except Exception as exc:   # cuDNN refused the lowered graph: decline with its words
            from ..._cudnn_errors import CudnnStatusError
            if isinstance(exc, CudnnStatusError):
                raise GraphNotSupportedError(f"cuDNN refused the operation graph: {exc}") from exc
            raise
        self.op_graph = self.descriptors[program.op_graph]
        # The plan's own operands hold device memory: a deviceless build makes them where the plan runs.
        self.constants, self.fixed, self.scratch = (None, None, None) if props is not None else \
            _plan_operands(program, device)
        self.lock = threading.Lock()
        self.heuristics: dict = {}      # heur_mode -> (configs, reason)
        self.runners: dict = {}         # (engine_id, knobs) -> PlanRunner

    def engine_count(self) -> int:
        return self.op_graph.get_int64("CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT")

    def query(self, mode: heur_mode):
        """[(engine config Descriptor, description dict)] for one heuristics mode, and why none."""
        with self.lock:
            found = self.heuristics.get(mode)
            if found is not None:
                return found
            from ... import _cudnn_descriptor
            from ..._cudnn_errors import CudnnStatusError
            try:
                heur = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR")
                heur.set("CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH", "CUDNN_TYPE_BACKEND_DESCRIPTOR", self.op_graph)
                heur.set("CUDNN_ATTR_ENGINEHEUR_MODE", "CUDNN_TYPE_HEUR_MODE", int(mode))
                self._describe_device(heur, "CUDNN_ATTR_ENGINEHEUR_DEVICEPROP")
                heur.finalize()
                count = heur.count("CUDNN_ATTR_ENGINEHEUR_RESULTS", "CUDNN_TYPE_BACKEND_DESCRIPTOR")
                configs = heur.get_descriptors("CUDNN_ATTR_ENGINEHEUR_RESULTS",
                                               "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR", count) if count else []
                # cuDNN says why each engine refused only in its last-error text (reading clears it).
                why = "" if configs else ("no engine config; cuDNN: " + " | ".join(
                    line.strip() for line in _loader.get_last_error_string().splitlines()
                    if "Reason:" in line or "engineId" in line)[:1500])
                result = ([(cfg, describe_config(cfg)) for cfg in configs], why)
            except CudnnStatusError as exc:
                # A failed call is not cached: the next build of this structure asks cuDNN again.
                return [], str(exc)
            self.heuristics[mode] = result
            return result

    def engine_config(self, engine_id: int, knobs: Mapping) -> Any:
        """An engine config for (engine_id, knobs), made without heuristics."""
        from ... import _cudnn_descriptor
        count = self.engine_count()
        if not 0 <= engine_id < count:
            raise GraphNotSupportedError(f"engine {engine_id} does not exist for this graph "
                                         f"(cuDNN has {count} engines for it)")
        engine = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_ENGINE_DESCRIPTOR")
        engine.set("CUDNN_ATTR_ENGINE_OPERATION_GRAPH", "CUDNN_TYPE_BACKEND_DESCRIPTOR", self.op_graph)
        engine.set("CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "CUDNN_TYPE_INT64", int(engine_id))
        self._describe_device(engine, "CUDNN_ATTR_ENGINE_DEVICEPROP")
        engine.finalize()
        choices = []
        for kind, value in (knobs or {}).items():
            choice = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR")
            choice.set("CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE", "CUDNN_TYPE_KNOB_TYPE", _note_key(kind, knob_type))
            choice.set("CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE", "CUDNN_TYPE_INT64", int(value))
            choices.append(choice.finalize())
        cfg = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_ENGINECFG_DESCRIPTOR")
        cfg.set("CUDNN_ATTR_ENGINECFG_ENGINE", "CUDNN_TYPE_BACKEND_DESCRIPTOR", engine)
        if choices:
            cfg.set("CUDNN_ATTR_ENGINECFG_KNOB_CHOICES", "CUDNN_TYPE_BACKEND_DESCRIPTOR", choices)
        return cfg.finalize()

    def _describe_device(self, descriptor, attribute: str) -> None:
        """Give a heuristics query or an engine the described GPU (deviceless builds only)."""
        if self.props is not None:
            descriptor.set(attribute, "CUDNN_TYPE_BACKEND_DESCRIPTOR", self.props.descriptor)

    def knobs(self, engine_id: int) -> list:
        from ... import _cudnn_descriptor
        engine = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_ENGINE_DESCRIPTOR")
        engine.set("CUDNN_ATTR_ENGINE_OPERATION_GRAPH", "CUDNN_TYPE_BACKEND_DESCRIPTOR", self.op_graph)
        engine.set("CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "CUDNN_TYPE_INT64", int(engine_id))
        self._describe_device(engine, "CUDNN_ATTR_ENGINE_DEVICEPROP")
        engine.finalize()
        count = _count(engine, "CUDNN_ATTR_ENGINE_KNOB_INFO")
        infos = engine.get_descriptors("CUDNN_ATTR_ENGINE_KNOB_INFO", "CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR",
                                       count) if count else []
        out = []
        for info in infos:
            kind = info.get_enums("CUDNN_ATTR_KNOB_INFO_TYPE", "CUDNN_TYPE_KNOB_TYPE", 1)[0]
            out.append(Knob(_member(knob_type, kind), info.get_int64("CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE"),
                            info.get_int64("CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE"),
                            info.get_int64("CUDNN_ATTR_KNOB_INFO_STRIDE")))
        return out

    def build(self, plan: PlanConfig, kernel_cache=None):
        """The PlanRunner of ``plan`` (finalized once per (engine, knobs), shared by equal graphs).

        With ``kernel_cache`` (a ``cudnn_graph.KernelCache``), the execution plan is finalized with
        that cache's cuDNN kernel cache attached, so cuDNN binds a kernel an earlier graph compiled.
        """
        cache = None if kernel_cache is None else kernel_cache_descriptor(kernel_cache, self)
        # A plan finalized with one kernel cache (or none) is not reused for a graph built with another:
        # that cache must receive the plan's kernels (its serialize() carries them), as it would in a
        # process that never built this graph. The key holds the cache descriptor itself, not its id().
        key = (plan.engine_id, tuple(sorted((int(k), int(v)) for k, v in plan.knobs.items())), cache)
        with self.lock:
            runner = self.runners.get(key)
        if runner is not None:
            return runner
        from ... import _cudnn_handle, _cudnn_descriptor, _plan_runner
        from ..._cudnn_errors import CudnnStatusError
        cfg = plan.payload if plan.payload is not None else self.engine_config(plan.engine_id, plan.knobs)
        # With a kernel cache cuDNN refuses to finalize, the plan is built without one (slower, same result).
        for attached in ((None,) if cache is None else (cache, None)):
            try:
                descriptor = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
                # This thread's handle: a handle must not be used by two threads at once.
                descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "CUDNN_TYPE_HANDLE",
                               _cudnn_handle.thread_handle(self.device))
                descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", "CUDNN_TYPE_BACKEND_DESCRIPTOR", cfg)
                if attached is not None:
                    descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE", "CUDNN_TYPE_BACKEND_DESCRIPTOR",
                                   attached)
                descriptor.finalize()
                workspace = descriptor.get_int64("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE")
                break
            except CudnnStatusError as exc:
                if attached is None:
                    raise GraphNotSupportedError(f"cuDNN could not build {plan.label}: {exc}") from exc
                kernel_cache.decline(CudnnBackendEngine.name, f"cuDNN refused the kernel cache for {plan.label} "
                                                              f"({exc}); that plan is built without it")
        runner = _plan_runner.PlanRunner(descriptor, workspace, self.device, plan.label, self.constants, self,
                                     aliases=self.program.aliases, fixed=self.fixed, scratch=self.scratch,
                                     omit=self.program.unused_uids)
        with self.lock:
            return self.runners.setdefault(key, runner)


# ---- kernel caches (cudnn_graph.KernelCache's cuDNN side) ---------------------------------------------

_KERNEL_CACHE_VERSION = 90400         # CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR, EXECUTION_PLAN_KERNEL_CACHE
_KERNEL_CACHE_GRAPH_VERSION = 90500   # CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH


_KERNEL_CACHE_JSON_VERSION = 91000   # CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION


class BackendKernelCache:
    """What a ``KernelCache`` holds for this engine: one finalized cuDNN kernel cache per device, and
    the JSON a deserialized cache gave for devices not made yet."""

    def __init__(self, loaded: Optional[str] = None) -> None:
        self.lock = threading.Lock()
        self.descriptors: dict = {}     # device ordinal -> finalized KERNEL_CACHE descriptor
        self.pending: dict = {}         # device ordinal -> cuDNN's JSON, set when that device's is made
        if loaded is not None:
            _require_json_version("KernelCache.deserialize()")
            self.pending = {int(device): text for device, text in json.loads(loaded).items()}

    def serialize(self) -> str:
        """Every device's cache as cuDNN's JSON (CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION)."""
        _require_json_version("KernelCache.serialize()")
        with self.lock:
            made = dict(self.descriptors)
            texts = dict(self.pending)
        for device, descriptor in made.items():
            size = descriptor.count("CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR")
            texts[device] = descriptor.get_text("CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION", max(int(size), 1))
        return json.dumps({str(device): text for device, text in sorted(texts.items())})


def _require_json_version(what: str) -> None:
    from ..._cudnn_errors import CudnnVersionError
    version = _loader.backend_version()
    if version < _KERNEL_CACHE_JSON_VERSION:
        raise CudnnVersionError(what, _KERNEL_CACHE_JSON_VERSION, version)


def _as_chars(text: str) -> list:
    """``text``'s UTF-8 bytes as C chars (signed) for a CUDNN_TYPE_CHAR attribute."""
    return [b - 256 if b > 127 else b for b in text.encode("utf-8")]


def kernel_cache_descriptor(kernel_cache, lowered: "_Lowered"):
    """The cuDNN kernel cache of ``kernel_cache`` for ``lowered``'s device (made and finalized on first
    use, loaded from a deserialized cache's JSON where it has one, bound to the first operation graph
    that uses it), or None where cuDNN cannot keep one."""
    from ... import _cudnn_descriptor
    from ..._cudnn_errors import CudnnStatusError
    version = _loader.backend_version()
    name = CudnnBackendEngine.name
    if version < _KERNEL_CACHE_VERSION:
        kernel_cache.decline(name, f"cuDNN {version} has no kernel cache (it needs cuDNN 9.4); plans are "
                                   "built without one")
        return None
    from ..._cudnn_errors import CudnnVersionError
    loaded = kernel_cache.serialized_state(name)     # read first: the factory runs under the cache's lock
    try:
        state = kernel_cache.state(name, lambda: BackendKernelCache(loaded))
    except CudnnVersionError as exc:     # a deserialized cache this cuDNN cannot load: build without it
        kernel_cache.decline(name, f"the deserialized cache cannot be loaded ({exc}); plans are built without it")
        return None
    with state.lock:
        found = state.descriptors.get(lowered.device)
        if found is not None:
            return found
        try:
            made = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR")
            loaded = state.pending.get(lowered.device)
            if loaded is not None:
                made.set("CUDNN_ATTR_KERNEL_CACHE_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR", _as_chars(loaded))
            if version >= _KERNEL_CACHE_GRAPH_VERSION:
                made.set("CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH", "CUDNN_TYPE_BACKEND_DESCRIPTOR",
                         lowered.op_graph)
            made.finalize()
        except CudnnStatusError as exc:
            kernel_cache.decline(name, f"cuDNN could not make a kernel cache ({exc}); plans are built without one")
            return None
        state.pending.pop(lowered.device, None)
        state.descriptors[lowered.device] = made
        return made


_KNOB_CAPACITY = 64   # more than the knob types any cuDNN 9 has (46 in 9.28)


def _count(descriptor, attribute) -> int:
    """How many descriptors an array attribute holds; the capacity bound when cuDNN will not say."""
    from ..._cudnn_errors import CudnnStatusError
    try:
        return min(int(descriptor.count(attribute, "CUDNN_TYPE_BACKEND_DESCRIPTOR")), _KNOB_CAPACITY)
    except CudnnStatusError:
        return _KNOB_CAPACITY


def describe_config(cfg) -> dict:
    """engine_id, knobs, notes and workspace of an engine config Descriptor."""
    engine = cfg.get_descriptors("CUDNN_ATTR_ENGINECFG_ENGINE", "CUDNN_BACKEND_ENGINE_DESCRIPTOR", 1)[0]
    engine_id = engine.get_int64("CUDNN_ATTR_ENGINE_GLOBAL_INDEX")
    numeric = engine.get_enums("CUDNN_ATTR_ENGINE_NUMERICAL_NOTE", "CUDNN_TYPE_NUMERICAL_NOTE")
    behavior = engine.get_enums("CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE", "CUDNN_TYPE_BEHAVIOR_NOTE")
    count = _count(cfg, "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES")
    choices = cfg.get_descriptors("CUDNN_ATTR_ENGINECFG_KNOB_CHOICES", "CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR",
                                  count) if count else []
    knobs = {}
    for choice in choices:
        kind = choice.get_enums("CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE", "CUDNN_TYPE_KNOB_TYPE", 1)[0]
        knobs[_member(knob_type, kind)] = choice.get_int64("CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE")
    workspace = None
    if _loader.backend_version() >= _WORKSPACE_QUERY_VERSION:
        try:
            workspace = cfg.get_int64("CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE")
        except Exception:   # an engine that cannot tell before the plan is built
            workspace = None
    return {"engine_id": int(engine_id), "knobs": knobs,
            "numerical_notes": _notes_of(numeric, numerical_note),
            "behavior_notes": _notes_of(behavior, behavior_note), "workspace_size": workspace}


def plan_name(engine_id: int, knobs: Mapping) -> str:
    """cudnn-frontend's tag: ``eng{id}`` then ``_k{type}={value}`` per knob, by knob type."""
    parts = "".join(f"_k{int(k)}={int(v)}" for k, v in sorted(knobs.items(), key=lambda kv: int(kv[0])))
    return f"eng{engine_id}{parts}"


# The data types a pass-by-value scalar may have (cuDNN takes no FP8 / complex / packed scalars).
_SCALAR_TYPES = frozenset({DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.INT8, DataType.UINT8,
                           DataType.INT32, DataType.INT64, DataType.UINT32, DataType.BOOLEAN, DataType.BFLOAT16})


def _numpy_dtype(dtype: DataType):
    if dtype not in _SCALAR_TYPES:
        raise GraphNotSupportedError(f"a pass-by-value scalar of type {DataType(dtype).name} is not supported")
    return numpy_dtype(dtype)


def _plan_operands(program: Program, device: int) -> tuple:
    """(constants, fixed, scratch) of a PlanRunner for ``program``: the operands every plan of it supplies."""
    constants = _constant_arrays(program.constants)
    fixed = [(uid, array.ctypes.data, array) for uid, array in _constant_arrays(program.plan_constants)]
    fixed += _filled_scratch(program.scratch, device)
    scratch = [(uid, nbytes, fill == 0) for uid, nbytes, fill in program.scratch if fill is None or fill == 0]
    return constants, fixed, scratch


def _constant_arrays(constants) -> list:
    import numpy as np
    return [(uid, np.array([value], dtype=_numpy_dtype(dtype))) for uid, dtype, value in constants]


def _fill_values(fill):
    """The device bytes of a scratch tensor the lowering filled (its values, float32)."""
    import numpy as np
    return np.asarray(fill, np.float32)


def _filled_scratch(scratch, device) -> list:
    """Device copies of the scratch tensors whose values the lowering fixed: (uid, address, allocation)."""
    from ..._driver import DeviceAllocation, copy_to_device
    made = []
    for uid, nbytes, fill in scratch:
        if fill is None or fill == 0:
            continue
        values = _fill_values(fill)
        allocation = DeviceAllocation(max(nbytes, values.nbytes), device)
        copy_to_device(allocation, values)
        made.append((uid, allocation.ptr, allocation))
    return made


# ---- compiled plans ---------------------------------------------------------------------------------

class CudnnBackendPlan(CompiledPlan):
    """A built cuDNN plan; ``execute`` runs its PlanRunner (the repeated call skips both: it is the
    runner's ``execute_mapping``, through ``fast_executor``)."""

    def __init__(self, plan: PlanConfig, runner, program: Program):
        super().__init__(plan, runner.workspace_size)
        self.runner = runner
        self.program = program      # the lowering the runner binds its own operands from

    @property
    def plan_descriptor(self):
        """The finalized execution-plan Descriptor."""
        return self.runner.plan

    def execute(self, graph, variant_pack, ctx: ExecutionContext) -> None:
        self.runner.execute(graph, variant_pack, ctx)

    def execute_with_overrides(self, graph, variant_pack, ctx: ExecutionContext, overrides) -> None:
        """execute with execute-time shapes / strides (a ``_plan_runner.ShapeOverrides``)."""
        self.runner.run_with_overrides(variant_pack, overrides, handle=ctx.handle, stream=ctx.stream,
                                       workspace=ctx.workspace)

    def fast_executor(self, layout):
        """(mapping, handle, stream) -> None: pack and run in Cython; the plan supplies fixed scalars."""
        self.runner.bind_layout(layout)
        return self.runner.execute_mapping

    def export_kernels(self) -> Optional[bytes]:
        """cuDNN's serialized execution plan (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION), or None where
        cuDNN cannot serialize this engine's plans (a load then finalizes it from (engine id, knobs))."""
        from ..._cudnn_errors import CudnnStatusError
        plan = self.plan_descriptor
        try:
            size = int(plan.count("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR"))
            text = plan.get_text("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION", max(size, 1))
        except CudnnStatusError as exc:
            logger.info("cuDNN cannot serialize %s (%s): the blob keeps its engine id and knobs", self.plan.label, exc)
            return None
        return text.encode("utf-8") if text else None

    def export_plan_operands(self) -> tuple:
        """What the runner binds itself, in the order it binds it (scratch offsets follow that order):
        the graph's fixed scalars, the lowering's constants, its scratch (filled once, zeroed per
        execute, or written by cuDNN first), its views and the caller operands no operation reads."""
        from ..._plan_blob import (OPERAND_ALIAS, OPERAND_DEVICE_CONSTANT, OPERAND_HOST_CONSTANT, OPERAND_SCRATCH,
                                   OPERAND_WITHHELD, PlanOperand)
        p = self.program
        out = [PlanOperand(OPERAND_HOST_CONSTANT, uid, int(dtype), array.tobytes(), graph_scalar=True)
               for (uid, dtype, _), (_, array) in zip(p.constants, _constant_arrays(p.constants))]
        out += [PlanOperand(OPERAND_HOST_CONSTANT, uid, int(dtype), array.tobytes())
                for (uid, dtype, _), (_, array) in zip(p.plan_constants, _constant_arrays(p.plan_constants))]
        for uid, nbytes, fill in p.scratch:
            if fill is None or fill == 0:
                out.append(PlanOperand(OPERAND_SCRATCH, uid, nbytes=int(nbytes), zero_fill=fill == 0))
            else:
                values = _fill_values(fill).tobytes()
                out.append(PlanOperand(OPERAND_DEVICE_CONSTANT, uid, int(DataType.FLOAT), values,
                                       nbytes=max(int(nbytes), len(values))))
        out += [PlanOperand(OPERAND_ALIAS, view, source_uid=source, byte_offset=offset)
                for view, source, offset in p.aliases]
        out += [PlanOperand(OPERAND_WITHHELD, uid) for uid in p.unused_uids]
        return tuple(out)


class _LoadedProgram:
    """What a plan loaded from cuDNN's serialized form keeps alive: the lowering's program and operands
    (no operation graph: cuDNN's execution plan carries its own)."""

    def __init__(self, program: Program, device: int):
        self.program = program
        self.device = device
        self.constants, self.fixed, self.scratch = _plan_operands(program, device)


# ---- the engine -------------------------------------------------------------------------------------

class CudnnBackendEngine(BaseEngine):
    """cuDNN's backend engines; ``available`` is False when libcudnn cannot be loaded."""

    name = "cudnn_backend"
    engine_id = ids.CUDNN_BACKEND.start
    binds_provisional_strides = True   # the descriptors bake every stride in
    host_scalars = True                # cuDNN reads pass-by-value scalars from host memory
    operand_alignment = BYTE_ALIGNMENT  # what every tensor descriptor promises (checked at execute)
    reuses_kernel_cache = True         # cuDNN's kernel cache (cuDNN >= 9.4)
    plans_without_device = True        # with device properties (cuDNN >= 9.8): engines/cudnn_backend/_deviceless.py

    def __init__(self):
        self._available = None           # probed at first read: see ``available``
        self._lock = threading.Lock()
        self._lowerings: OrderedDict = OrderedDict()

    @property
    def available(self) -> bool:
        """Whether libcudnn loads here. Probed at the first read, not when the engine is made: making the
        engine list must not load libcudnn (and import cuda-pathfinder, ~40 ms) for a process whose plans
        are all a Python engine's, such as a CuTe plan loaded from the plan cache."""
        if self._available is None:
            self._available = bool(_loader.is_available())
        return self._available

    def cache_counts(self) -> dict:
        lowered = list(self._lowerings.values())
        return {"lowered_graphs": len(lowered),
                "built_plans": sum(len(getattr(item, "runners", ())) for item in lowered)}

    # -- planning --------------------------------------------------------------------------------

    # Every entry this engine proposes has the default priority: under the default ranking a Python
    # engine's plan (priority > 0) ranks first, and the heuristics queries can wait (deferred_proposals).
    max_priority = 0.0

    def propose_plans(self, graph) -> list:
        return self.propose_plans_for_modes(graph, DEFAULT_HEUR_MODES)

    def deferred_proposals(self, graph, modes):
        """The cheap checks now (device, libcudnn, ops the loaded cuDNN lowers: a decline here is
        immediate), the lowering and the heuristics queries when the plan list is read past the entries
        ranked above this engine's. Returns the thunk that proposes."""
        self._precheck(graph)
        modes = DEFAULT_HEUR_MODES if modes is None else modes
        return lambda: self._propose_checked(graph, modes)

    def _precheck(self, graph) -> None:
        _check_device(graph)
        if not self.available:
            raise GraphNotSupportedError(unavailable_reason())
        # Ops newer than the loaded cuDNN are declined before cuDNN sees them (it would refuse them
        # with an unhelpful status, e.g. FLOOR_MOD on 9.19 fails finalize with NOT_INITIALIZED).
        check_lowerable(graph, _loader.backend_version())

    def propose_plans_for_modes(self, graph, modes) -> list:
        self._precheck(graph)
        return self._propose_checked(graph, modes)

    def _propose_checked(self, graph, modes) -> list:
        lowered = self.lowered(graph, checked=True)
        wanted = [_mode_of(mode) for mode in modes]
        entries, seen, reasons = [], set(), []
        for mode in wanted:
            if mode.value < 0:
                continue   # OPENSOURCE: cudnn-frontend's own engines, not the backend's
            configs, reason = lowered.query(mode)
            if reason:
                reasons.append(f"heuristics {mode.name}: {reason}")
            barred = lowered.program.barred_engines
            for cfg, info in configs:
                key = (info["engine_id"], tuple(sorted((int(k), v) for k, v in info["knobs"].items())))
                if key in seen:
                    continue
                if info["engine_id"] in barred:
                    seen.add(key)
                    reasons.append(f"engine {info['engine_id']}: {barred[info['engine_id']]}")
                    continue
                seen.add(key)
                entries.append(PlanConfig(
                    engine_id=info["engine_id"], knobs=dict(info["knobs"]),
                    name=plan_name(info["engine_id"], info["knobs"]), engine=self,
                    source="fallback" if mode == heur_mode.FALLBACK else f"heuristics_{mode.name}",
                    numerical_notes=info["numerical_notes"], behavior_notes=info["behavior_notes"],
                    workspace_size=info["workspace_size"], payload=cfg))
        if not entries:
            raise GraphNotSupportedError("cuDNN's heuristics offered no engine for this graph"
                                         + (f" ({'; '.join(reasons)})" if reasons else ""))
        return entries

    def lowered(self, graph, checked: bool = False) -> _Lowered:
        """The graph's finalized operation graph (made once per structure and device); ``checked``
        says check_lowerable already passed for this graph and the loaded cuDNN."""
        state = graph_state(graph)
        if state.lowered is not None:
            return state.lowered
        _check_device(graph)
        if not self.available:
            raise GraphNotSupportedError(unavailable_reason())
        device = graph.device[1]
        props = GraphView.of(graph).device_properties
        key = (graph.key(), device, getattr(graph, "is_override_shape_enabled", False),
               getattr(graph, "is_dynamic_shape_enabled", False), None if props is None else props.fingerprint)
        with self._lock:
            lowered = self._lowerings.get(key)
            if lowered is not None:
                self._lowerings.move_to_end(key)
        if lowered is None:
            _note_static_shape(graph)
            lowered = _Lowered(lower_program(graph, _loader.backend_version(), checked=checked), device, props)
            with self._lock:
                lowered = self._lowerings.setdefault(key, lowered)
                while len(self._lowerings) > _LOWERING_CACHE_SIZE:
                    self._lowerings.popitem(last=False)
        state.lowered = lowered
        return lowered

    def load_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext, kernels: Optional[bytes]) -> CompiledPlan:
        """A deserialized plan: cuDNN's serialized execution plan ``kernels`` set on a new execution-plan
        descriptor with this thread's handle and finalized (no operation graph, no heuristics, no
        compile); without one, or where cuDNN refuses it, the plan is finalized from (engine id, knobs)."""
        from ... import _cudnn_handle, _cudnn_descriptor, _plan_runner
        from ..._cudnn_errors import CudnnStatusError
        _check_device(graph)
        if not self.available:
            raise GraphNotSupportedError(unavailable_reason())
        if kernels:
            device = graph.device[1]
            loaded = _LoadedProgram(lower_program(graph, _loader.backend_version()), device)
            try:
                descriptor = _cudnn_descriptor.Descriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
                descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "CUDNN_TYPE_HANDLE",
                               _cudnn_handle.thread_handle(device))
                descriptor.set("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR",
                               _as_chars(bytes(kernels).decode("utf-8")))
                descriptor.finalize()
                workspace = descriptor.get_int64("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE")
            except CudnnStatusError as exc:
                logger.warning("cuDNN did not load the serialized plan %s (%s); finalizing it from its engine "
                               "id and knobs", plan.label, exc)
            else:
                program = loaded.program
                runner = _plan_runner.PlanRunner(descriptor, workspace, device, plan.label, loaded.constants, loaded,
                                                 aliases=program.aliases, fixed=loaded.fixed, scratch=loaded.scratch,
                                                 omit=program.unused_uids)
                return CudnnBackendPlan(plan, runner, program)
        return self.build_plan(graph, plan, ctx)

    def check_support(self, graph, plan: PlanConfig) -> None:
        reason = _filtered_out(graph_state(graph).filters, plan)
        if reason:
            raise GraphNotSupportedError(reason)

    def build_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext) -> CompiledPlan:
        self.check_support(graph, plan)
        lowered = self.lowered(graph)
        if lowered.props is not None:
            from ._deviceless import build_deviceless
            return build_deviceless(lowered, plan, GraphView.of(graph).kernel_cache)
        runner = lowered.build(plan, GraphView.of(graph).kernel_cache)
        return CudnnBackendPlan(plan, runner, lowered.program)


def _note_static_shape(graph) -> None:
    """Say so where a graph asked for dynamic shapes that the loaded cuDNN cannot give (before 9.4):
    its operation graph is then built for its one shape (same results; no kernel reuse across shapes)."""
    version = _loader.backend_version()
    if getattr(graph, "is_dynamic_shape_enabled", False) and not dynamic_shape_wanted(graph, version):
        logger.info("cuDNN %d has no dynamic-shape operation graphs (they need 9.4): this graph is built for "
                    "its one shape", version)


def unavailable_reason() -> str:
    """Why this process has no cuDNN backend, on one line: the loader's failure, with the fix first
    (a CUDA graph's decline, and ``python -m cudnn_graph check``, say it)."""
    from ..._cudnn_errors import CudnnNotFoundError
    try:
        _loader.load()
    except CudnnNotFoundError as exc:
        tried = "; ".join(f"{place}: {why}" for place, why in exc.attempts)
        return f"libcudnn not found: {exc.install_hint.rstrip('.')} ({exc.summary}; tried {tried})"
    except Exception as exc:     # noqa: BLE001  (a broken library raises what it likes)
        return f"libcudnn could not be loaded: {type(exc).__name__}: {exc}"
    return "libcudnn could not be loaded when the engine was made (it loads now: restart the process)"


def _check_device(graph) -> None:
    kind, _ = graph.device
    if kind != "cuda":
        raise GraphNotSupportedError(f"the cuDNN backend runs CUDA graphs; this graph is on {kind}")


def graph_state(graph) -> BackendGraphState:
    """The backend's state on ``graph`` (a graph or its view; made on first use)."""
    return GraphView.of(graph).state(CudnnBackendEngine.name, BackendGraphState)


# (filter field, note enum, keep (True) or bar, the note's kind, the function that sets it), in check order.
_NOTE_FILTERS = (
    ("numeric_keep", numerical_note, True, "numerical", "select_numeric_notes"),
    ("numeric_bar", numerical_note, False, "numerical", "deselect_numeric_notes"),
    ("behavior_keep", behavior_note, True, "behavior", "select_behavior_notes"),
    ("behavior_bar", behavior_note, False, "behavior", "deselect_behavior_notes"),
)


def _filtered_out(filters: _Filters, plan: PlanConfig) -> str:
    label = plan.label
    for name in filters.barred_names:
        if name and name in label:
            return f"{label} is deselected (deselect_engines: {name!r})"
    notes = {numerical_note: {int(n) for n in plan.numerical_notes},
             behavior_note: {int(n) for n in plan.behavior_notes}}
    for field, enum_cls, keep, kind, setter in _NOTE_FILTERS:
        for note in getattr(filters, field):
            if (note in notes[enum_cls]) != keep:
                return (f"{label} {'lacks' if keep else 'has'} the {kind} note {_member(enum_cls, note)!s} "
                        f"({setter})")
    if filters.max_workspace is not None and plan.workspace_size is not None \
            and plan.workspace_size > filters.max_workspace:
        return (f"{label} needs {plan.workspace_size} bytes of workspace, more than "
                f"{filters.max_workspace} (deselect_workspace_greater_than)")
    return ""


# ---- graph-level functions (attached to pygraph as methods) ----------------------------------------

def _engine() -> CudnnBackendEngine:
    from .. import manifest
    for engine in manifest.engines():
        if isinstance(engine, CudnnBackendEngine):
            return engine
    raise GraphNotSupportedError("the cuDNN backend is not available in this process (libcudnn could not "
                                 "be loaded)")


def _lowered_for(graph) -> _Lowered:
    if not graph.frozen:
        graph.build_operation_graph()
    return _engine().lowered(graph)


def deselect_engines(graph, engine_names: Iterable[str]):
    """Skip cuDNN plans whose name contains any of ``engine_names`` (e.g. ``["eng0", "eng4_k2=1"]``)."""
    if isinstance(engine_names, str):
        engine_names = [engine_names]
    graph_state(graph).filters.barred_names = tuple(str(n) for n in engine_names)
    return graph


def _note_filter(graph, field: str, notes, enum_cls):
    """Set the graph's note filter ``field`` to ``notes`` (members of ``enum_cls`` or their names)."""
    setattr(graph_state(graph).filters, field, tuple(_note_key(n, enum_cls) for n in notes))
    return graph


def select_numeric_notes(graph, notes):
    """Keep only cuDNN plans that have every one of ``notes`` (numerical_note members or names)."""
    return _note_filter(graph, "numeric_keep", notes, numerical_note)


def deselect_numeric_notes(graph, notes):
    """Skip cuDNN plans that have any of ``notes``."""
    return _note_filter(graph, "numeric_bar", notes, numerical_note)


def select_behavior_notes(graph, notes):
    """Keep only cuDNN plans that have every one of ``notes`` (behavior_note members or names)."""
    return _note_filter(graph, "behavior_keep", notes, behavior_note)


def deselect_behavior_notes(graph, notes):
    """Skip cuDNN plans that have any of ``notes``."""
    return _note_filter(graph, "behavior_bar", notes, behavior_note)


def deselect_workspace_greater_than(graph, workspace_limit: int):
    """Skip cuDNN plans that need more than ``workspace_limit`` bytes of workspace."""
    graph_state(graph).filters.max_workspace = int(workspace_limit)
    return graph


def get_engine_count(graph) -> int:
    """How many engines cuDNN has for this graph (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)."""
    return _lowered_for(graph).engine_count()


def get_knobs_for_engine(graph, engine_id: int) -> list:
    """The knobs of engine ``engine_id`` for this graph: ``[Knob(type, min_value, max_value, stride)]``."""
    return _lowered_for(graph).knobs(int(engine_id))


def create_execution_plan(graph, engine_id: int, knobs: Optional[Mapping] = None) -> PlanConfig:
    """A plan list entry for cuDNN engine ``engine_id`` with ``knobs`` ({knob_type: value}).

    It is appended to the graph's plan list (made with just this entry when planning has not run),
    with source "pinned"; build it with build_plans() / build_plan_at_index().
    """
    engine = _engine()
    lowered = _lowered_for(graph)
    cfg = lowered.engine_config(int(engine_id), dict(knobs or {}))
    info = describe_config(cfg)
    entry = PlanConfig(engine_id=info["engine_id"], knobs=dict(info["knobs"]),
                       name=plan_name(info["engine_id"], info["knobs"]), engine=engine, source="pinned",
                       numerical_notes=info["numerical_notes"], behavior_notes=info["behavior_notes"],
                       workspace_size=info["workspace_size"], payload=cfg)
    graph.append_plan(entry)
    return entry


# name -> function: the methods this engine adds to every graph (CudnnBackendEngine.graph_methods)
GRAPH_METHODS = {
    "deselect_engines": deselect_engines,
    "select_numeric_notes": select_numeric_notes,
    "deselect_numeric_notes": deselect_numeric_notes,
    "select_behavior_notes": select_behavior_notes,
    "deselect_behavior_notes": deselect_behavior_notes,
    "deselect_workspace_greater_than": deselect_workspace_greater_than,
    "get_engine_count": get_engine_count,
    "get_knobs_for_engine": get_knobs_for_engine,
    "create_execution_plan": create_execution_plan,
}

CudnnBackendEngine.graph_methods = GRAPH_METHODS
