"""``pygraph``: the graph users build — op builders generated from the op tables, and its lifecycle:
validate, freeze (``build_operation_graph``), plan, build and execute, in that order in this file.

Inference is ``cudnn_graph._inference``'s; engines see the graph through ``graph.view`` (a
``GraphView``); engine-specific graph methods attach through ``register_graph_method``.

``cudnn_graph.pygraph`` takes ``cudnn.pygraph``'s constructor and methods, so graph code written for
cudnn-frontend ports by changing the import; buffers come from any framework.

Example:
    >>> import numpy as np
    >>> import cudnn_graph as cudnn
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
    ...                   device="cpu")
    >>> a = g.tensor(name="a", dim=[1, 2, 3], stride=[6, 3, 1])
    >>> b = g.tensor(name="b", dim=[1, 3, 2], stride=[6, 2, 1])
    >>> c = g.relu(g.matmul(a, b)).set_output(True)
    >>> g.build([cudnn.heur_mode.A])
    >>> A, B = np.ones((1, 2, 3), np.float32), np.ones((1, 3, 2), np.float32)
    >>> C = np.empty((1, 2, 2), np.float32)
    >>> g.execute({a: A, b: B, c: C})
    >>> C[0].tolist()
    [[3.0, 3.0], [3.0, 3.0]]
"""
from __future__ import annotations

import inspect
import logging
import operator
import time
from typing import Callable, Mapping, Optional

from ._ir import Graph as _GraphCore, Tensor, Node, OpBinding
from ._execute import execute as _execute_entry
from ._inference import infer_graph
from .view import GraphView
from ._slot import Slot
from ._variant_pack import PackLayout, TensorSpec
from ._stream import as_stream_handle
from .data_type import DataType, data_type_of, numpy_dtype as _numpy_dtype
from .errors import (ArgumentTypeError, WorkspaceError, DeviceMismatchError, GraphFrozenError, GraphNotSupportedError,
                     GraphValidationError, UnknownTensorError)
from .errors import AmbiguousTensorNameError, NotBuiltError, NotPlannedError
from .enums import build_plan_policy
from .ops import SCHEMAS
from .ops.schema import REQUIRED, InferContext, TensorInfo
from .ops._score_mod import ScoreModGraph
from .router import Router, get_default_router
from ._plan_list import (PlanEntryError, _PlanState, _adopt, _already_planned, _build_policy, _heur_modes,
                         _one_of)
from .engines.base import ExecutionContext
from . import _frontend_surface as _surface, device_properties as _deviceless
from . import _progress

logger = logging.getLogger(__name__)

__all__ = ["pygraph", "PlanEntryError", "register_graph_method"]

_GENERIC = ("compute_data_type", "name")


def _no_workspace_overrides(override_uids, override_shapes, override_strides) -> None:
    if override_uids is not None or override_shapes is not None or override_strides is not None:
        raise NotImplementedError("the workspace size for override shapes is not implemented: a plan's "
                                  "workspace is fixed when it is built (get_workspace_size() covers every "
                                  "override shape the plan accepts)")


def _apply_out_dims(schema, result, out_dims):
    """cudnn.pygraph's ``out_dims=``: dims for the op's (first) output, or ``{port: dims}``."""
    outputs = result if isinstance(result, list) else [result]
    names = [o.name for o in schema.outputs]
    wanted = out_dims if isinstance(out_dims, Mapping) else {names[0]: out_dims}
    for port, dims in wanted.items():
        if port not in names:
            raise GraphValidationError(schema.name, schema.name, "out_dims",
                                       f"names no output port {port!r} (the op has {', '.join(names)})")
        i = names.index(port)
        if i < len(outputs) and outputs[i] is not None:
            outputs[i].set_dim(list(dims))
    return result


# ---- builders generated from the op tables -------------------------------------------------------

def _make_builder(schema):
    # The per-op tables are computed here, once; a call binds against them in Cython (Graph._build).
    binding = OpBinding(schema, REQUIRED, _GENERIC)
    order = binding.order

    declined = dict(schema.declined_keywords)
    declined.update(_surface.declined_keywords(schema.name))

    def builder(self, *args, **kwargs):
        if "out_dims" in kwargs:
            out_dims = kwargs.pop("out_dims")
            result = self._build(binding, args, kwargs)
            return result if out_dims is None else _apply_out_dims(schema, result, out_dims)
        return self._build(binding, args, kwargs)

    if declined:
        # Keywords the op's pygraph counterpart lacks because cuDNN cannot do what they ask: a decline
        # that says why, not an unknown-keyword TypeError.
        def builder(self, *args, **kwargs):
            for key in kwargs:
                if key in declined:
                    raise GraphNotSupportedError(f"{schema.name}(): {key}: {declined[key]}")
            out_dims = kwargs.pop("out_dims", None)
            result = self._build(binding, args, kwargs)
            return result if out_dims is None else _apply_out_dims(schema, result, out_dims)
    if schema.prepare_call is not None:
        builder = _with_prepare(builder, schema, order)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    seen = set()
    for name in order:
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
        seen.add(name)
    for name in (list(schema.port_names()) + [a.name for a in schema.attrs] + list(_GENERIC)
                 + list(schema.keyword_expanders) + ["out_dims"]):
        if name not in seen:
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
            seen.add(name)
    builder.__signature__ = inspect.Signature(params)
    builder.__name__ = builder.__qualname__ = schema.name
    outs = ", ".join(o.name for o in schema.outputs)
    builder.__doc__ = (f"{schema.doc or schema.name} ({schema.family}).\n\n"
                       f"Inputs: {', '.join(schema.port_names())}. Outputs: {outs}.\n"
                       f"Returns {'a list of tensors' if schema.returns == 'list' else 'the output tensor'}.")
    return builder


def _with_prepare(builder, schema, order):
    """``builder`` behind ``schema.prepare_call``, which sees every argument by its keyword."""
    prepare = schema.prepare_call

    def prepared(self, *args, **kwargs):
        if len(args) > len(order):
            raise TypeError(f"{schema.name}() takes at most {len(order)} positional arguments "
                            f"({', '.join(order)}); got {len(args)}")
        for name, value in zip(order, args):
            if name in kwargs:
                raise TypeError(f"{schema.name}() got multiple values for argument '{name}'")
            kwargs[name] = value
        return builder(self, **prepare(self, schema, kwargs))
    return prepared


class pygraph(_GraphCore):
    """A graph of tensors and ops, with cudnn.pygraph's constructor and methods.

    The positional order is cudnn.pygraph's (``name``, ``io_data_type``, ``intermediate_data_type``,
    ``compute_data_type``, ``handle``, ...). ``device`` ('cpu', 'cuda', 'cuda:N') is optional: a
    handle or ``tensor_like`` templates give it, and otherwise it is CUDA device 0 where a GPU is
    visible, the host elsewhere. ``router`` ranks the plan list (default: the process default
    router). ``is_override_shape_enabled`` builds a graph whose tensors may take other shapes and
    strides at execute (``override_uids`` / ``override_shapes`` / ``override_strides``); the cuDNN
    backend needs cuDNN >= 9.21 for it. ``kernel_cache`` (from ``create_kernel_cache()``) shares
    compiled kernels between graphs (``cudnn_graph.kernel_cache``) and, as in cudnn.pygraph, makes the
    graph a dynamic-shape one; ``is_dynamic_shape_enabled`` asks for that alone (cuDNN >= 9.4 compiles
    kernels for a class of shapes). ``is_cuda_graph_replay_expected``
    is a hint that changes nothing here. ``device_property`` plans for the GPU it describes without it
    (``cudnn_graph.device_properties``). ``sm_count``, ``sm_version`` and ``cuda_graph_retention`` are
    cudnn.pygraph's; not implemented, they raise NotImplementedError (``_frontend_surface`` says why).
    """

    def __init__(self, name: str = "", io_data_type=None, intermediate_data_type=None, compute_data_type=None,
                 handle=None, sm_count=None, sm_version=None, kernel_cache=None, device_property=None,
                 is_dynamic_shape_enabled: bool = False, is_override_shape_enabled: bool = False,
                 cuda_graph_retention=None, *, is_cuda_graph_replay_expected: bool = False, device=None,
                 router: Optional[Router] = None):
        # Never accepted and ignored: a caller relying on one must learn that it does nothing here.
        _surface.refuse_unimplemented_keywords("pygraph", sm_count=sm_count, sm_version=sm_version,
                                               cuda_graph_retention=cuda_graph_retention)
        self._device_properties, device = _deviceless.graph_device(device_property, device, handle)
        if kernel_cache is not None:
            from .kernel_cache import KernelCache
            if not isinstance(kernel_cache, KernelCache):
                raise ArgumentTypeError(f"pygraph(kernel_cache=) takes a KernelCache from create_kernel_cache(); "
                                        f"got {type(kernel_cache).__name__}")
        super().__init__(io_data_type, intermediate_data_type, compute_data_type, name=name,
                         device=device, handle=handle, router=router)
        self._plans = _PlanState()
        self._unused_inputs = ()        # inputs no node reads (validate() finds them; the layout skips them)
        self._override_shape_enabled = bool(is_override_shape_enabled)
        self._kernel_cache = kernel_cache
        # A kernel cache makes a dynamic-shape graph, as cudnn.pygraph does: kernels for a shape class.
        self._dynamic_shape_enabled = bool(is_dynamic_shape_enabled) or kernel_cache is not None
        self.is_cuda_graph_replay_expected = bool(is_cuda_graph_replay_expected)

    @property
    def kernel_cache(self):
        """The ``KernelCache`` this graph's plans compile into and reuse from (None: none)."""
        return self._kernel_cache

    device_properties = property(lambda self: self._device_properties, doc="What a deviceless build plans for.")

    @property
    def is_dynamic_shape_enabled(self) -> bool:
        """Whether engines compile this graph's kernels for a class of shapes (cuDNN >= 9.4's dynamic-shape
        operation graphs), fixed at construction; a ``kernel_cache`` turns it on."""
        return self._dynamic_shape_enabled

    @property
    def is_override_shape_enabled(self) -> bool:
        """Whether execute may override tensor shapes and strides (fixed at construction)."""
        return self._override_shape_enabled

    @property
    def view(self) -> GraphView:
        """The read-only view engines and routers get of this graph (``cudnn_graph.view.GraphView``)."""
        return GraphView(self, self._plans.engine_states)

    # -- node construction ------------------------------------------------------------------------
    # Builders (one per op schema, generated below) call Graph._build with the op's OpBinding.

    # -- lifecycle: validate ----------------------------------------------------------------------

    def _is_validated(self) -> bool:
        # Any change after validate() resets _inferred (the IR's mutation hook).
        return self._validated and self._inferred

    def validate(self) -> None:
        """Infer every output's dims and data type and check the graph; raises naming node and port."""
        infer_graph(self)
        unused = []
        consumed = set()
        for node in self.nodes:
            for value in node.inputs.values():
                for t in (value if isinstance(value, tuple) else (value,)):
                    if t is not None:
                        consumed.add(t.uid)
            for key in node.schema.tensor_list_attrs:
                for t in node.params.get(key) or ():
                    consumed.add(t.uid)
        for t in self.tensors:
            if t.dim_set_by_user and t.stride_set_by_user and len(t.stride) != len(t.dim):
                # set_dim / set_stride may change the rank one after the other; the pair must agree by now.
                port = "input" if t.producer is None else next(o for o, v in t.producer.outputs.items() if v is t)
                raise GraphValidationError("<graph>" if t.producer is None else t.producer.name,
                                           "input" if t.producer is None else t.producer.op, t.name if t.producer is None else port,
                                           f"{len(t.stride)} strides for {len(t.dim)} dims")
            if t.producer is None:
                if t.uid not in consumed and not self._is_side_tensor(t):
                    # cudnn.pygraph ignores a tensor that no node reads (its tests make some and bind
                    # buffers to them): so does this graph; the layout skips keys that name it.
                    unused.append(t)
                    continue
                if t.data_type == DataType.NOT_SET:
                    raise GraphValidationError("<graph>", "input", t.name,
                                               "has no data type (set it, or give the graph an io_data_type)")
            else:
                node = t.producer
                port = next(o for o, v in node.outputs.items() if v is t)
                if t.is_virtual and t.uid not in consumed:
                    raise GraphValidationError(node.name, node.op, port,
                                               "output is neither used by another node nor marked set_output(True)")
                if t.data_type == DataType.NOT_SET:
                    raise GraphValidationError(node.name, node.op, port,
                                               "has no data type (set it, or give the graph an "
                                               + ("intermediate_data_type" if t.is_virtual else "io_data_type") + ")")
        if unused:
            logger.info("graph '%s': no node reads %s; ignored (buffers keyed by them are skipped)",
                      self.context.name, ", ".join(repr(t.name) for t in unused))
        self._unused_inputs = tuple(unused)
        self._validated = True

    def _is_side_tensor(self, t) -> bool:
        # Ragged offsets are read through the tensors that name them.
        return any(o.ragged_offset is t for o in self.tensors if o is not t)

    # -- lifecycle: freeze, plan, build -----------------------------------------------------------

    def build_operation_graph(self) -> None:
        """Validate (when a change since the last validate() needs it) and freeze the graph: every
        mutation raises afterwards. Nothing is lowered here: each engine lowers the frozen graph when
        create_execution_plans() asks it for plans."""
        if not self._is_validated():
            self.validate()
        self._freeze()
        for node in self.nodes:
            for value in node.params.values():
                if isinstance(value, ScoreModGraph):
                    value.freeze()     # the whole surface freezes, the callbacks' subgraphs included

    def create_execution_plans(self, heur_modes=None, *, heuristics=None) -> None:
        """Rank every engine's plans for this graph into one list (``graph.plans``). One-shot: a second
        call raises ``AlreadyPlannedError``. ``heur_modes`` (or cudnn.pygraph's spelling ``heuristics``)
        is a list of ``heur_mode`` members (None: each engine's default); anything else raises
        ``InvalidArgumentTypeError`` here."""
        heur_modes = _one_of(heur_modes, heuristics)
        st = self._plans
        modes = _heur_modes(heur_modes, "create_execution_plans")
        if st.planned:
            raise _already_planned("create_execution_plans()", st)
        started = time.perf_counter()
        if not self.frozen:
            self.build_operation_graph()
        if self._load_from_plan_cache(started):
            return      # the plan cache held this graph's plan: no heuristics, no compile
        from .engines import manifest
        entries, declines = [], []
        view = self.view
        all_engines = manifest.engines()
        if self._device_properties is not None:     # a deviceless build: only engines that plan without the GPU
            all_engines = _deviceless.planning_engines(all_engines, declines, self._report_decline)
        if _progress.wanted():
            st.counts_before = {engine.name: engine.cache_counts() for engine in all_engines}
        router = self.router if self.router is not None else get_default_router()
        # Under the default ranking (priorities alone), an engine that can defer its proposals
        # (``deferred_proposals``: cuDNN's heuristics queries, most of a new shape's build time) and whose
        # plans all rank below every plan already proposed is asked only when the list is read past them:
        # build() of a graph whose first plan builds never pays for the queries.
        deferrable = type(router) is Router
        pending = []
        for engine in all_engines:
            try:
                if deferrable and hasattr(engine, "deferred_proposals"):
                    pending.append((engine, engine.deferred_proposals(view, modes)))
                    continue
                proposed = engine.propose_plans(view) if modes is None or not hasattr(engine, "propose_plans_for_modes") \
                    else engine.propose_plans_for_modes(view, modes)
            except (NotImplementedError, GraphNotSupportedError) as exc:
                declines.append((engine.name, str(exc) or type(exc).__name__))
                self._report_decline(*declines[-1])
                continue
            _adopt(entries, proposed, engine)
        floor = min((e.priority for e in entries), default=None)
        for engine, thunk in pending:
            if floor is not None and engine.max_priority < floor:
                st.deferred.append((engine, thunk))
                continue
            try:
                _adopt(entries, thunk(), engine)
            except (NotImplementedError, GraphNotSupportedError) as exc:
                declines.append((engine.name, str(exc) or type(exc).__name__))
                self._report_decline(*declines[-1])
        st.entries = router.rank(view, entries)
        st.materialize = self._ask_deferred_engines
        st.declines = declines
        st.planned = True
        st.planning_ms = (time.perf_counter() - started) * 1e3
        logger.debug("%s: %d plan entries, %d engines declined", self._log_name(), len(entries), len(declines))

    def check_support(self) -> None:
        """Raise ``GraphNotSupportedError`` (saying which engines declined and why) when no plan exists."""
        st = self._require_planned("check_support()")
        st.support_checked = True
        st.ranked = self._supported(st.ranked)
        if not st.ranked and st.deferred:
            st.materialize()
        if not st.ranked:
            raise PlanEntryError("no engine supports this graph", st.declines)

    def _supported(self, entries: list) -> list:
        """``entries`` without those their engine's check_support declines (each decline recorded)."""
        st = self._plans
        kept = []
        view = self.view
        for entry in entries:
            try:
                entry.engine.check_support(view, entry)
            except (NotImplementedError, GraphNotSupportedError) as exc:
                st.declines.append((entry.label, str(exc)))
                self._report_decline(*st.declines[-1])
                continue
            kept.append(entry)
        return kept

    def _ask_deferred_engines(self) -> None:
        """Append the deferred engines' proposals to the plan list (ranked among themselves: they all
        rank below every entry already listed, so no index changes)."""
        st = self._plans
        pending, st.deferred = st.deferred, []
        new = []
        for engine, thunk in pending:
            try:
                _adopt(new, thunk(), engine)
            except (NotImplementedError, GraphNotSupportedError) as exc:
                st.declines.append((engine.name, str(exc) or type(exc).__name__))
                self._report_decline(*st.declines[-1])
        router = self.router if self.router is not None else get_default_router()
        new = router.rank(self.view, new)
        if st.support_checked:
            new = self._supported(new)
        st.ranked.extend(new)
        logger.debug("%s: %d deferred plan entries asked for", self._log_name(), len(new))

    def build_plans(self, policy=None, *, ctx=None) -> None:
        """Build from the selected entry on; a decline advances (a pinned one raises). ``policy`` is a
        ``build_plan_policy`` member: ``ALL`` builds all, None or ``HEURISTICS_CHOICE`` the first that builds."""
        _surface.refuse_unimplemented_keywords("build_plans", ctx=ctx)
        build_all = _build_policy(policy) is build_plan_policy.ALL
        st = self._require_planned("build_plans()")
        if st.started is None:
            st.started = time.perf_counter()
        if not st.ranked and st.deferred:
            st.materialize()
        if not st.ranked:
            raise PlanEntryError("no engine supports this graph", st.declines)
        if build_all:
            for i in range(len(st.entries)):
                if i not in st.compiled:
                    try:
                        self._build_index(i)
                    except (NotImplementedError, GraphNotSupportedError) as exc:
                        st.declines.append((st.entries[i].label, str(exc)))
                        self._report_decline(*st.declines[-1])
            if not st.compiled:
                raise PlanEntryError("no plan of the list could be built", st.declines)
            if st.selected not in st.compiled:
                st.selected = min(st.compiled)
                self._hot = None
            self._report_built()
            return
        i = st.selected - 1
        while True:
            i += 1
            if i >= len(st.ranked):
                if not st.deferred:
                    break
                st.materialize()            # every listed plan declined: ask the deferred engines
                i -= 1
                continue
            if i in st.compiled:
                st.selected = i
                self._hot = None
                return
            try:
                self._build_index(i)
            except (NotImplementedError, GraphNotSupportedError) as exc:
                if st.pinned:
                    raise GraphNotSupportedError(
                        f"the pinned plan {i} ({st.entries[i].label}) declined: {exc}") from exc
                st.declines.append((st.entries[i].label, str(exc)))
                self._report_decline(*st.declines[-1])
                continue
            st.selected = i
            self._hot = None
            self._report_built()
            return
        raise PlanEntryError("no plan of the list could be built", st.declines)

    def build(self, heur_modes=None, *, heuristics=None, ctx=None) -> None:
        """validate + build_operation_graph + create_execution_plans + check_support + build_plans.

        ``heur_modes`` (or cudnn.pygraph's spelling ``heuristics``) is a list of ``heur_mode`` members
        (None: each engine's default).

        Example:
            >>> g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])   # doctest: +SKIP
        """
        _surface.refuse_unimplemented_keywords("build", ctx=ctx)
        heur_modes = _one_of(heur_modes, heuristics)
        _heur_modes(heur_modes, "build")
        started = time.perf_counter()
        if not self._is_validated():
            self.validate()
        if not self.frozen:
            self.build_operation_graph()
        if self._plans.failed_build and not self._plans.compiled:
            self._plans = _PlanState()      # the last build() built nothing: plan afresh
        if self._plans.planned:
            raise _already_planned("build()", self._plans)
        self._plans.started = started          # build()'s time includes validate and freeze
        self.create_execution_plans(heur_modes)
        try:
            self.check_support()
            self.build_plans()
        except BaseException:
            # Nothing built (say a cuDNN or driver call failed): the plan list stays readable, and
            # the next build() plans afresh instead of refusing a second planning.
            self._plans.failed_build = not self._plans.compiled
            raise

    def _require_planned(self, action: str) -> _PlanState:
        if not self._plans.planned:
            raise NotPlannedError(action, "not planned", "build() or create_execution_plans() first",
                                  "create_execution_plans() has not been called")
        return self._plans

    # -- what a build reports (logging and the progress callback; cudnn_graph._progress) -----------------

    def _log_name(self) -> str:
        return f"graph {self.context.name!r}" if self.context.name else "graph"

    def _report_decline(self, who: str, why: str) -> None:
        logger.debug("%s: %s declined: %s", self._log_name(), who, why)
        _progress.emit("decline", {"graph": self.context.name, "engine": who, "reason": why})

    def _report_built(self) -> None:
        """One INFO line (and a ``"build"`` progress event) for the plan just built: the graph's key, the
        plan and its engine, the build's time and its parts, what the engine compiled or reused."""
        st = self._plans
        self._store_in_plan_cache()
        started, st.started = st.started, None      # a later build_plans() (another plan) times itself
        if not _progress.wanted():
            return
        now = time.perf_counter()
        entry, compiled = st.ranked[st.selected], st.compiled[st.selected]
        engine = getattr(entry.engine, "name", type(entry.engine).__name__)
        compile_s = getattr(compiled, "compile_seconds", None)
        detail = {"graph": self.context.name, "key": self.key()[:8], "plan": entry.label, "engine": engine,
                  "index": st.selected, "plans": len(st.ranked), "deferred_engines": len(st.deferred),
                  "build_ms": round((now - (started or now)) * 1e3, 3), "planning_ms": round(st.planning_ms, 3),
                  "compile_ms": None if compile_s is None else round(compile_s * 1e3, 3),
                  "kernel_reused": getattr(compiled, "kernel_reused", None), "declined": len(st.declines),
                  "caches": _cache_changes(st.counts_before.get(engine), entry.engine)}
        notes = [f"planning {detail['planning_ms']:.1f} ms", f"{detail['declined']} declined"]
        if compile_s is not None:
            notes.append(f"compile {detail['compile_ms']:.1f} ms")
        if detail["kernel_reused"]:
            notes.append("kernel reused")
        if detail["caches"]:
            notes.append("caches " + ", ".join(f"{k} {a}->{b}" for k, (a, b) in detail["caches"].items()))
        if st.deferred:
            notes.append(f"{len(st.deferred)} engine(s) not asked yet")
        logger.info("%s (key %s): built plan %d/%d '%s' (engine %s) in %.1f ms (%s)", self._log_name(),
                    detail["key"], st.selected, len(st.ranked), entry.label, engine, detail["build_ms"],
                    "; ".join(notes))
        _progress.emit("build", detail)

    def _build_index(self, i):
        st = self._plans
        entry = st.ranked[i]
        ctx = ExecutionContext(handle=self.handle, device=self.device)
        if self._kernel_cache is not None and not getattr(entry.engine, "reuses_kernel_cache", False):
            self._kernel_cache.decline(getattr(entry.engine, "name", type(entry.engine).__name__),
                                       f"plan {entry.label} is built without the kernel cache: the engine keeps "
                                       "no kernels in one")
        compiled = entry.engine.build_plan(self.view, entry, ctx)
        compiled.layout = self._layout_for(entry.engine)
        st.compiled[i] = compiled
        return compiled

    def _layout_for(self, engine) -> PackLayout:
        """The operands a plan of ``engine`` packs: every non-virtual tensor, checked as declared."""
        key = (bool(engine.binds_provisional_strides), bool(engine.host_scalars))
        layout = self._plans.layouts.get(key)
        if layout is not None:
            return layout
        device = self.device_code
        dev = "cpu" if device[0] == 1 else (device[0], device[1])
        specs = []
        unused = {t.uid for t in self._unused_inputs}
        for t in self.tensors:
            if t.is_virtual or t.uid in unused:
                continue
            dtype = t.data_type
            try:
                from .data_type import dlpack_code_of
                code = dlpack_code_of(dtype)
            except ValueError:
                continue
            binds = t.stride_set_by_user or engine.binds_provisional_strides
            scalar = t.is_pass_by_value
            if scalar and t.value is not None:
                self._plans.scalar_defaults[t.uid] = t.value
            specs.append(TensorSpec(
                t.uid, t.dim, code + (1,), strides=t.stride if binds else None,
                device="cpu" if (scalar and engine.host_scalars) else dev, name=t.name,
                is_output=t.producer is not None, required=not (scalar and t.value is not None)))
        ignored = [t.uid for t in self._unused_inputs] + [t.name for t in self._unused_inputs if t.name]
        layout = PackLayout(specs, graph=self, ignored=ignored)
        self._plans.layouts[key] = layout
        return layout

    # -- the plan list -----------------------------------------------------------------------------

    @property
    def plans(self) -> list:
        """The ranked plan list (PlanConfig entries)."""
        return list(self._require_planned("graph.plans").entries)

    @property
    def declines(self) -> list:
        """(engine, reason) for every engine or entry that declined."""
        return list(self._plans.declines)

    def select_plan(self, index: int) -> None:
        """Pin entry ``index``: build_plans() builds it or raises."""
        st = self._require_planned("select_plan()")
        index = self._plan_index(index)
        st.selected = index
        st.pinned = True
        self._hot = None

    @property
    def selected_plan(self):
        st = self._require_planned("graph.selected_plan")
        return st.ranked[st.selected] if st.ranked else None

    def get_execution_plan_count(self) -> int:
        """How many entries the plan list has; 0 before create_execution_plans() (as cudnn.pygraph)."""
        st = self._plans
        return len(st.entries) if st.planned else 0

    def _plan_index(self, index, action: str = "a plan index") -> int:
        """``index`` checked against the plan list (no Python negative indexing: ids are positions)."""
        st = self._require_planned(action)
        if isinstance(index, bool):
            raise TypeError("a plan index is an int; got a bool")
        i = operator.index(index)
        if not 0 <= i < len(st.entries):
            raise IndexError(f"plan index {i} is outside [0, {len(st.entries)})")
        return i

    def get_plan_name_at_index(self, index: int) -> str:
        return self._plans.entries[self._plan_index(index, "get_plan_name_at_index()")].label

    def build_plan_at_index(self, index: int) -> None:
        index = self._plan_index(index, "build_plan_at_index()")
        if index not in self._plans.compiled:
            self._build_index(index)

    def append_plan(self, entry) -> int:
        """Append ``entry`` (a PlanConfig with its ``engine`` set) to the plan list; returns its index.

        Before create_execution_plans() the list starts with just this entry (planning then counts as
        done). How an engine's own hand-made entries (e.g. cuDNN's ``create_execution_plan``) join it.
        """
        if getattr(entry, "engine", None) is None:
            raise ValueError("a plan list entry names the engine that builds it (PlanConfig.engine)")
        st = self._plans
        if not st.planned:
            st.entries, st.declines, st.planned = [], [], True
        st.entries.append(entry)
        return len(st.entries) - 1

    def compiled_plan(self, index: Optional[int] = None):
        """The built plan (a ``CompiledPlan``) of plan-list entry ``index`` (None: the selected one),
        or None where that entry is not built yet (or, for the selected one, nothing is planned).

        For introspection and benchmarks: a plan's engine-specific parts (cuDNN's ``runner``, a DSL
        plan's kernels and launch hooks) hang off it.
        """
        st = self._plans
        if index is None:
            return st.compiled.get(st.selected) if st.planned else None
        return st.compiled.get(self._plan_index(index, "compiled_plan()"))

    def get_compiled_plan_at_index(self, index: int):
        """``compiled_plan(index)``, in the at-index family's spelling."""
        return self.compiled_plan(self._plan_index(index, "get_compiled_plan_at_index()"))

    def get_workspace_size(self, handle=None, override_uids=None, override_shapes=None,
                           override_strides=None) -> int:
        """Workspace bytes of the selected plan (``handle`` is accepted: the size does not depend on it)."""
        _no_workspace_overrides(override_uids, override_shapes, override_strides)
        st = self._require_planned("get_workspace_size()")
        compiled = st.compiled.get(st.selected)
        if compiled is None:
            raise NotBuiltError("get_workspace_size()", "not built", "build_plans() first", "no plan is built yet")
        return compiled.workspace_size

    def get_workspace_size_plan_at_index(self, index: int, handle=None, override_uids=None, override_shapes=None,
                                         override_strides=None) -> int:
        _no_workspace_overrides(override_uids, override_shapes, override_strides)
        st = self._require_planned("get_workspace_size_plan_at_index()")
        index = self._plan_index(index)
        if index not in st.compiled:
            self._build_index(index)
        return st.compiled[index].workspace_size

    # -- cudnn.pygraph's lookups and plan-list queries --------------------------------------------

    def find_tensor(self, name_or_uid):
        """The tensor named (a str) or numbered (an int uid) so, or None."""
        if isinstance(name_or_uid, str):
            return next((t for t in self.tensors if t.name == name_or_uid), None)
        return self.tensor_by_uid(operator.index(name_or_uid))

    def get_node(self, name: str):
        """The node named ``name``, or None."""
        return next((n for n in self.nodes if n.name == name), None)

    def get_inputs(self) -> list:
        """The tensors no node produces (graph inputs), in creation order."""
        return [t for t in self.tensors if t.producer is None and not t.is_virtual]

    def get_outputs(self) -> list:
        """The produced tensors that are not virtual (graph outputs), in creation order."""
        return [t for t in self.tensors if t.producer is not None and not t.is_virtual]

    def inspect(self) -> dict:
        """The graph as a dict (``to_dict()``: context, tensors, nodes)."""
        return self.to_dict()

    def backend_plan_entries(self) -> list:
        """The plan-list entries cuDNN's backend serves."""
        return [e for e in self._require_planned("backend_plan_entries()").entries if getattr(e.engine, "name", "") == "cudnn_backend"]

    @property
    def selected_engine(self):
        """The Python engine serving the selected plan; None when cuDNN's backend serves it (or nothing
        is planned)."""
        st = self._plans
        if not st.planned or not st.ranked:
            return None
        engine = st.ranked[st.selected].engine
        return None if getattr(engine, "name", "") == "cudnn_backend" else engine

    def get_engine_and_knobs_at_index(self, index: int) -> tuple:
        """(engine_id, knobs) of plan-list entry ``index``: what create_execution_plan replays."""
        entry = self._plans.entries[self._plan_index(index)]
        return entry.engine_id, dict(entry.knobs)

    # -- plan notes --------------------------------------------------------------------------------

    def get_behavior_notes_for_plan_at_index(self, index: int) -> list:
        """The behavior notes (``behavior_note`` members) of plan-list entry ``index``, as its engine
        reports them (cuDNN: the engine config's CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE).

        >>> g.get_behavior_notes_for_plan_at_index(0)       # doctest: +SKIP
        [<behavior_note.RUNTIME_COMPILATION: 0>]
        """
        entry = self._plans.entries[self._plan_index(index)]
        return entry.engine.plan_notes(entry)[0]

    def get_behavior_notes(self) -> list:
        """The behavior notes of the selected plan (after build_plans(), the one that runs)."""
        st = self._require_planned("get_behavior_notes()")
        if not st.entries:
            raise PlanEntryError("no engine supports this graph", st.declines)
        entry = st.entries[st.selected]
        return entry.engine.plan_notes(entry)[0]

    # -- execute -----------------------------------------------------------------------------------

    # execute() is cudnn_graph._execute.execute (Cython): the repeated call runs the selected plan's
    # one-call executor (self._hot, reset to None when the selection moves) without a Python frame,
    # and hands everything else here.
    execute = _execute_entry

    @property
    def fast_executor(self):
        """The selected plan's one-call executor that a repeated execute() runs: None until an
        execute() looked it up for the current selection, False when the plan has none."""
        return self._hot

    def _execute(self, variant_pack: Mapping, workspace, handle, stream, override_uids, override_shapes,
                 override_strides) -> None:
        hot = self._hot
        st = self._plans
        compiled = st.compiled.get(st.selected) if st.planned else None
        if compiled is None:
            raise NotBuiltError("execute()", "not built" if st.planned else "not planned",
                                "build() (or build_plans()) before execute()", "no plan is built")
        if hot is None:
            # The selected plan's one-call path (pack + launch in C), found once per selection.
            self._hot = compiled.fast_executor(compiled.layout) or False
        self._run(compiled, variant_pack, workspace, handle, stream, override_uids, override_shapes,
                  override_strides)

    def execute_plan_at_index(self, variant_pack: Mapping, workspace=None, index: int = 0, handle=None,
                              stream=None, *, override_uids=None, override_shapes=None,
                              override_strides=None) -> None:
        st = self._require_planned("execute_plan_at_index()")
        index = self._plan_index(index)
        if index not in st.compiled:
            self._build_index(index)
        self._run(st.compiled[index], variant_pack, workspace, handle, stream, override_uids,
                  override_shapes, override_strides)

    def _run(self, compiled, variant_pack, workspace, handle, stream, override_uids, override_shapes,
             override_strides):
        overrides = None
        if override_uids is not None or override_shapes is not None or override_strides is not None:
            overrides = self._shape_overrides(compiled, override_uids, override_shapes, override_strides)
        defaults = self._plans.scalar_defaults
        if defaults:
            variant_pack = self._with_scalars(variant_pack, defaults, compiled.layout)
        layout = compiled.layout if overrides is None else overrides[1]
        pack = layout.pack(variant_pack, stream=stream)
        if workspace is not None:
            workspace = self._workspace_slot(workspace, compiled, stream)
        ctx = ExecutionContext(handle=handle if handle is not None else self.handle,
                               stream=None if stream is None else as_stream_handle(stream),
                               workspace=workspace, device=self.device)
        if overrides is None:
            compiled.execute(self.view, pack, ctx)
        else:
            compiled.execute_with_overrides(self.view, pack, ctx, overrides[0])

    def _shape_overrides(self, compiled, uids, shapes, strides):
        """(ShapeOverrides, layout checking the buffers against the overridden geometry)."""
        from ._plan_runner import ShapeOverrides
        if not self._override_shape_enabled:
            # Never drop overrides silently: say what is missing instead.
            raise GraphNotSupportedError(
                "override shapes/strides need a graph built with pygraph(is_override_shape_enabled=True)")
        if uids is None or shapes is None or strides is None:
            raise ValueError("override_uids, override_shapes and override_strides go together; "
                             f"got uids={uids is not None}, shapes={shapes is not None}, strides={strides is not None}")
        if not hasattr(compiled, "execute_with_overrides"):
            raise GraphNotSupportedError(f"{compiled.plan.label} does not take override shapes/strides")
        uids = [u.uid if isinstance(u, Tensor) else u for u in uids]
        overrides = ShapeOverrides(uids, shapes, strides)
        specs = {s.uid: s for s in compiled.layout.specs}
        for uid, shape, stride in zip(overrides.uids, overrides.shapes, overrides.strides):
            spec = specs.get(uid)
            if spec is None:
                raise UnknownTensorError(f"override uid {uid} is not a tensor the plan reads or writes")
            if len(shape) != len(spec.shape):
                raise ValueError(f"tensor '{spec.name}' (uid {uid}): override shape {shape} has rank "
                                 f"{len(shape)}; the tensor has rank {len(spec.shape)}")
            # Buffers are checked against the geometry they will have at this execute.
            specs[uid] = TensorSpec(uid, shape, spec.dtype, strides=stride, device=spec.device, name=spec.name,
                                    alignment=spec.alignment, is_output=spec.is_output, required=spec.required)
        return overrides, PackLayout(list(specs.values()), graph=self)

    def _workspace_slot(self, workspace, compiled, stream):
        """The caller's workspace as a Slot (engines see slots only), checked to hold the plan's bytes."""
        if type(workspace) is Slot:
            ws = workspace
        elif type(workspace) is int:
            ws = Slot.from_address(workspace, (compiled.workspace_size,), dtype="uint8", device=self.device_code)
        else:
            ws = Slot.from_object(workspace, stream=stream)
        want = self.device
        if want[0] == "cuda" and ws.device != want:
            raise DeviceMismatchError("workspace", None, "device", f"{want[0]}:{want[1]}",
                                      f"{ws.device[0]}:{ws.device[1]}")
        if ws.nbytes < compiled.workspace_size:
            raise WorkspaceError(f"the workspace holds {ws.nbytes} bytes but {compiled.plan.label} needs "
                             f"{compiled.workspace_size} (get_workspace_size() is in bytes)",
                                 compiled.workspace_size, ws.nbytes)
        return ws

    def _with_scalars(self, variant_pack, defaults, layout):
        layout_specs = {s.uid: s for s in layout.specs}
        by_name = {s.name: s.uid for s in layout.specs if s.name}
        given = set()
        for key in variant_pack:
            if isinstance(key, str):
                given.add(by_name.get(key, key))
            else:
                given.add(key if isinstance(key, int) else getattr(key, "uid", key))
        missing = {uid: value for uid, value in defaults.items() if uid not in given}
        if not missing:
            return variant_pack
        import numpy as np
        merged = dict(variant_pack)
        for uid, value in missing.items():
            spec = layout_specs.get(uid)
            merged[uid] = np.full(spec.shape if spec is not None else (1,), value,
                                  dtype=_numpy_dtype(spec.dtype) if spec is not None else np.float32)
        return merged

    # -- plans that last: autotune and caller-owned CUDA graphs (cudnn_graph._autotune, ._cuda_graphs) --

    def autotune(self, variant_pack: Mapping, workspace=None, *, iterations: int = 100, stream=None):
        """Build every plan of the list, time each on ``variant_pack`` with CUDA events after a warm-up,
        select the fastest (pinned, built) and record the choice; returns an ``AutotuneResult``
        (``cudnn_graph._autotune``). ``workspace`` must hold the largest plan's bytes (None: one is allocated).

        Example:
            >>> g.build([cudnn.heur_mode.A, cudnn.heur_mode.B])         # doctest: +SKIP
            >>> g.autotune({a: A, b: B, c: C}, iterations=20).best_index   # doctest: +SKIP
            2
        """
        from ._autotune import autotune
        return autotune(self, variant_pack, workspace, iterations=iterations, stream=stream)

    def populate_cuda_graph(self, handle, variant_pack: Mapping, workspace, cuda_graph) -> None:
        """Record one execute of the selected plan into the caller's empty CUDA graph ``cuda_graph`` (a
        cudaGraph_t / CUgraph as an int), as one child-graph node (``cudnn_graph._cuda_graphs``).

        Example:
            >>> g.populate_cuda_graph(handle, {a: A, b: B, c: C}, ws, graph_ptr)   # doctest: +SKIP
        """
        from ._cuda_graphs import populate_cuda_graph
        populate_cuda_graph(self, handle, variant_pack, workspace, cuda_graph)

    def update_cuda_graph(self, handle, variant_pack: Mapping, workspace, cuda_graph) -> None:
        """Point a graph ``populate_cuda_graph`` filled at new buffers (``cudnn_graph._cuda_graphs``).

        Example:
            >>> g.update_cuda_graph(handle, {a: A2, b: B2, c: C2}, ws, graph_ptr)  # doctest: +SKIP
        """
        from ._cuda_graphs import update_cuda_graph
        update_cuda_graph(self, handle, variant_pack, workspace, cuda_graph)

    # -- serialized plans and the plan cache (cudnn_graph.plan_serialization, cudnn_graph.plan_cache) ----

    def serialize(self, *, as_bytes: bool = False, include_kernels: bool = True):
        """The selected, built plan as a blob (docs/plan_format.md): a list of byte values, or ``bytes``
        with ``as_bytes=True`` (cudnn.pygraph's two forms); ``include_kernels`` adds a Python engine's
        compiled kernels. ``pygraph().deserialize(blob)`` loads it, in this process or another.

        >>> blob = g.serialize(as_bytes=True)                 # doctest: +SKIP
        """
        from . import plan_serialization
        blob = plan_serialization.serialize(self, include_kernels=include_kernels)
        return blob if as_bytes else list(blob)

    def deserialize(self, *args, handle_=None, pyobj=None, enforce_precompiled: bool = False) -> None:
        """Fill this empty graph from ``serialize()``'s blob and install its plan, built: ``deserialize(data)``
        or cudnn.pygraph's ``deserialize(handle, data)`` (keywords ``handle_`` / ``pyobj``). The loaded graph
        executes without planning; key its buffers by uid or name (or ``find_tensor``). Raises
        PlanVersionMismatchError for a blob of another library, cuDNN version or GPU, PlanBlobError for a
        truncated or corrupt one. ``enforce_precompiled`` is accepted: a blob without kernels rebuilds them.

        >>> h = cudnn.pygraph(); h.deserialize(handle, blob)   # doctest: +SKIP
        """
        from . import plan_serialization
        if len(args) > 2 or (len(args) == 2 and pyobj is not None):
            raise TypeError("deserialize() takes (data) or (handle, data)")
        handle, data = (args if len(args) == 2 else (handle_, args[0] if args else pyobj))
        if data is None:
            raise TypeError("deserialize() needs the blob serialize() returned")
        plan_serialization.deserialize(self, data, handle=handle)

    def use_plan_cache(self, cache=True) -> "pygraph":
        """Opt this graph in to (or out of) the persistent plan cache (``cudnn_graph.plan_cache``): True
        uses the process's cache (``set_plan_cache`` / ``$CUDNN_GRAPH_PLAN_CACHE``, else the default
        folder), a path or a ``KernelDiskCache`` names one, False keeps this graph out of any. Returns the graph.

        >>> g.use_plan_cache("/var/cache/my_app/plans")        # doctest: +SKIP
        """
        from . import plan_cache
        self._plan_cache_choice = plan_cache.resolve_choice(cache)
        return self

    def _load_from_plan_cache(self, started: float) -> bool:
        from . import plan_cache
        if not plan_cache.load_into(self):
            return False
        self._plans.planning_ms = (time.perf_counter() - started) * 1e3
        return True

    def _store_in_plan_cache(self) -> None:
        from . import plan_cache
        plan_cache.store_built(self)

    def _install_loaded_plan(self, entry, load) -> None:
        """Make ``entry`` (built by ``load(view, ctx)``) the whole plan list, selected and built."""
        st = self._plans
        compiled = load(self.view, ExecutionContext(handle=self.handle, device=self.device))
        compiled.layout = self._layout_for(entry.engine)
        st.entries, st.declines, st.compiled, st.selected, st.planned = [entry], [], {0: compiled}, 0, True
        self._hot = None

    # -- as a context manager ----------------------------------------------------------------------
    # cudnn-frontend's pygraph is no context manager; ``with pygraph(...) as g:`` here scopes the
    # building the way ``cudnn_graph.graph(handle)`` does: the end builds nothing, errors propagate.

    def __enter__(self) -> "pygraph":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False

    def __repr__(self):
        return (f"pygraph(name={self.context.name!r}, device={self.device}, nodes={len(self.nodes)}, "
                f"tensors={len(self.tensors)}{', frozen' if self.frozen else ''})")


for _schema in SCHEMAS.values():
    for _method in (_schema.name,) + tuple(_schema.aliases):
        if hasattr(_GraphCore, _method):
            raise RuntimeError(f"op {_method!r} would shadow a Graph method")
        setattr(pygraph, _method, _make_builder(_schema))

_surface.install_graph_stubs(pygraph)


def _cache_changes(before: Optional[dict], engine) -> dict:
    """``{cache: (count before planning, count now)}`` of ``engine.cache_counts()``: an unchanged count
    where an entry was needed is a hit (an engine that caches nothing gives {})."""
    if before is None:               # not asked before planning: nothing to compare
        return {}
    counts = engine.cache_counts() if hasattr(engine, "cache_counts") else {}
    return {name: (before.get(name, 0), count) for name, count in counts.items()}


def register_graph_method(name: str, function: Callable) -> None:
    """Add ``function`` to every graph as the method ``name`` (the extension point for engines).

    How an engine gives graphs methods of its own (cuDNN's plan filters and engine queries, e.g.
    ``deselect_engines``, ``get_knobs_for_engine``) without the core knowing that engine: an engine
    lists them in ``BaseEngine.graph_methods`` and the engine manifest registers them here.
    ``function`` takes the graph first (it is a method); it reaches the engine's own state on the
    graph through ``graph.view.state(engine)``. A name that a graph method or an op already has is
    refused; registering the same function again is a no-op.
    """
    if getattr(pygraph, name, None) is function:
        return
    if hasattr(pygraph, name) or name in SCHEMAS:
        raise RuntimeError(f"{name!r} would shadow a Graph method or an op")
    setattr(pygraph, name, function)


def _install_engine_methods() -> None:
    from .engines import manifest
    manifest.install_graph_methods(register_graph_method)


_install_engine_methods()
