"""The engine contract.

An engine proposes plans for a graph, builds a plan once (the expensive step: JIT, descriptor
finalisation) and returns a ``CompiledPlan`` whose ``execute`` receives only the VariantPack's
slots. An engine declines ONLY by raising ``NotImplementedError`` or ``GraphNotSupportedError``
(with the reason); anything else is a bug and propagates.

What an engine sees of a graph is a ``GraphView`` (``cudnn_graph.view``): ``nodes``, ``tensors``,
``data_type(tensor)`` (the resolved type), ``device`` / ``device_code`` / ``device_properties``,
``context``, ``key()``, ``is_override_shape_enabled`` and ``state(engine, factory)``, a slot of the
engine's own on the graph for lowering or planning state. The lifecycle passes a view to ``propose_plans``, ``check_support``,
``build_plan`` and ``CompiledPlan.execute``; an engine's helpers that may also be handed a graph
(tests call ``engine.propose_plans(graph)``) take ``GraphView.of(graph)``. Nothing else of the
graph is an engine's to read. An engine that gives graphs methods of its own lists them in
``graph_methods`` (``{name: function(graph, ...)}``); the engine manifest adds them to every graph
through ``cudnn_graph.graph.register_graph_method``.

Example (a toy engine that runs nothing but declines politely):

    >>> from cudnn_graph.engines.base import BaseEngine
    >>> class Nope(BaseEngine):
    ...     name, engine_id = "nope", 30_000
    ...     def propose_plans(self, graph):
    ...         raise NotImplementedError("nope runs no graph")
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

from ..view import GraphView

__all__ = ["PlanConfig", "ExecutionContext", "CompiledPlan", "BaseEngine", "GraphView"]


@dataclass(frozen=True)
class PlanConfig:
    """One entry of the plan list: which engine, with which knobs."""
    engine_id: int
    knobs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    engine: Any = field(default=None, compare=False, repr=False)
    priority: float = 0.0                 # higher ranks first under the default router
    source: str = "python"                # python | heuristics_A | heuristics_B | fallback | pinned
    numerical_notes: Sequence[Any] = ()
    behavior_notes: Sequence[Any] = ()
    workspace_size: Optional[int] = None  # known before building, when the engine can tell
    payload: Any = field(default=None, compare=False, repr=False)   # engine-private (e.g. an engine config)

    @property
    def label(self) -> str:
        return self.name or f"engine{self.engine_id}"


@dataclass
class ExecutionContext:
    """What a plan executes with: handle, stream (a raw handle; None keeps the handle's current
    stream) and workspace (a Slot, or None for the engine's cached one)."""
    handle: Any = None
    stream: Optional[int] = None
    workspace: Any = None
    device: tuple = ("cpu", 0)


class CompiledPlan:
    """A built plan. Subclasses implement ``execute``; ``layout`` is the graph's operand list.

    ``compile_seconds`` and ``kernel_reused`` are what an engine that compiles kernels says of the build
    (the graph's build log line reports them): the seconds its compile took (None: nothing compiled), and
    whether the kernel came from a cache (None: not an engine that compiles).
    """

    compile_seconds: Optional[float] = None
    kernel_reused: Optional[bool] = None

    def __init__(self, plan: PlanConfig, workspace_size: int = 0):
        self.plan = plan
        self.workspace_size = int(workspace_size)
        self.layout = None   # set by the graph: the PackLayout its execute() packs against

    def execute(self, graph: GraphView, variant_pack, ctx: ExecutionContext) -> None:
        raise NotImplementedError

    def fast_executor(self, layout):
        """Optional: a callable ``(mapping, handle, stream)`` that packs against ``layout`` and runs,
        used by execute() when no workspace or overrides are given. None: use ``execute``."""
        return None

    def export_kernels(self) -> Optional[bytes]:
        """Optional: what ``serialize()`` stores of this built plan so that its engine's ``load_plan`` makes
        it again without compiling (a DSL plan's compiled kernels, cuDNN's serialized execution plan).
        None (the default): nothing; a load rebuilds the plan from its (engine id, knobs)."""
        return None

    def export_plan_operands(self) -> tuple:
        """Optional: the operands this plan binds itself at every execute, which the caller never passes
        (``cudnn_graph._plan_blob.PlanOperand`` records: constants, views of a caller operand, scratch in
        the workspace, caller operands withheld from the kernel). ``serialize()`` stores them so that a
        reader without this engine (the C runtime) binds them too. () (the default): none."""
        return ()

    def export_launch(self, kernels: Optional[bytes]) -> tuple:
        """Optional: how a reader with no Python launches this plan's kernels (``cudnn_graph._plan_launch
        .LaunchKernel`` records: convention, entry, code, argument slots), given ``kernels``, the bytes
        ``export_kernels`` returned (the records may point into them). ``serialize()`` stores them in the
        blob's DSL launch section. () (the default): the plan runs only through its engine."""
        return ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.plan.label}, workspace={self.workspace_size})"


class BaseEngine:
    """Base of every engine. Subclasses set ``name`` and ``engine_id`` and implement the two methods."""

    name: str = "engine"
    engine_id: int = -1
    # Whether strides the IR inferred (not set by the user) must match the caller's buffers.
    binds_provisional_strides: bool = True
    # Whether a pass-by-value tensor's buffer must be on the host (cuDNN) or may be anywhere.
    host_scalars: bool = True
    # Whether this engine keeps compiled kernels in a graph's KernelCache (pygraph(kernel_cache=)).
    reuses_kernel_cache: bool = False
    # Whether this engine plans a graph built without its GPU (pygraph(device_property=)): the others need
    # the device (its toolchain, its compute capability) and are declined for such graphs.
    plans_without_device: bool = False
    # Methods this engine adds to every graph: {name: function(graph, ...)} (register_graph_method).
    graph_methods: ClassVar[Mapping[str, Callable]] = {}
    # Optional: an engine that defines ``deferred_proposals(graph, heur_modes) -> thunk`` (cheap declines
    # raised at once, the thunk returning its PlanConfigs later) and ``max_priority`` (no proposal of it
    # ranks higher) is asked only when the plan list is read past every entry above that priority
    # (the cuDNN backend: its heuristics queries). See create_execution_plans.

    def propose_plans(self, graph: GraphView) -> list[PlanConfig]:
        raise NotImplementedError(f"{self.name} proposes no plans")

    def build_plan(self, graph: GraphView, plan: PlanConfig, ctx: ExecutionContext) -> CompiledPlan:
        raise NotImplementedError(f"{self.name} builds no plans")

    def load_plan(self, graph: GraphView, plan: PlanConfig, ctx: ExecutionContext,
                  kernels: Optional[bytes]) -> CompiledPlan:
        """The plan of a deserialized blob: ``kernels`` is what ``CompiledPlan.export_kernels`` gave when it
        was serialized (None where the blob holds none). Default: ``build_plan`` (rebuilt from the plan's
        engine id and knobs); an engine that can reload its kernels overrides this."""
        return self.build_plan(graph, plan, ctx)

    def cache_counts(self) -> dict:
        """How many entries each of this engine's bounded caches holds (``{name: count}``), for leak
        checks (``cudnn_graph.debug.debug_counters``). Default: the engine caches nothing."""
        return {}

    def check_support(self, graph: GraphView, plan: PlanConfig) -> None:
        """Cheap support check before building; decline by raising. Default: supported."""

    def plan_notes(self, plan: PlanConfig) -> tuple[list, list]:
        """(behavior notes, numerical notes) of ``plan``, as ``cudnn_graph.behavior_note`` /
        ``numerical_note`` members: what ``get_behavior_notes_for_plan_at_index`` answers.

        Default: the notes the engine put on the plan's ``PlanConfig`` (none unless it set them). An
        engine whose plans share a trait says so here, e.g. a JIT engine's RUNTIME_COMPILATION.
        """
        return list(plan.behavior_notes), list(plan.numerical_notes)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} id={self.engine_id}>"
