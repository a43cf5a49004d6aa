"""The plan list's state and the arguments that steer planning: what ``pygraph`` plans into.

``_PlanState`` holds a graph's ranked plan list (with the proposals of engines asked later: deferred
proposals), the declines, the compiled plans and the selection; ``PlanEntryError`` is the error of a list
that built nothing; the ``heur_modes`` / ``build_plans(policy=)`` normalisers accept cudnn-frontend's own
enum members.

Example:
    >>> from cudnn_graph._plan_list import PlanEntryError
    >>> err = PlanEntryError("no engine supports this graph", [("reference", "host graphs only")])
    >>> str(err).splitlines()[0]
    'no engine supports this graph (reference: host graphs only)'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .enums import build_plan_policy, heur_mode
from .errors import AlreadyPlannedError, GraphNotSupportedError, InvalidArgumentTypeError


class PlanEntryError(GraphNotSupportedError):
    """No entry of the plan list could be built; ``declines`` says which engine declined and why.

    The first line carries each decline, shortened (callers and test runners often show only that line,
    e.g. a skip reason); the full reasons follow, one per line.
    """

    def __init__(self, message: str, declines: Sequence[tuple[str, str]]):
        self.declines = list(declines)
        lines = [message + _decline_summary(self.declines)] + [f"  - {who}: {why}" for who, why in self.declines]
        super().__init__("\n".join(lines))


_SUMMARY_REASON_CHARS = 160    # per decline, on the first line
_SUMMARY_DECLINES = 4          # declines named on the first line; the rest are counted


def _decline_summary(declines: Sequence[tuple[str, str]]) -> str:
    """`` (engine: reason; ...)``: each reason on one line, cut to its first ``_SUMMARY_REASON_CHARS``."""
    if not declines:
        return ""
    parts = []
    for who, why in declines[:_SUMMARY_DECLINES]:
        why = " ".join(str(why).split())
        if len(why) > _SUMMARY_REASON_CHARS:
            why = why[:_SUMMARY_REASON_CHARS - 3].rstrip() + "..."
        parts.append(f"{who}: {why}")
    if len(declines) > _SUMMARY_DECLINES:
        parts.append(f"{len(declines) - _SUMMARY_DECLINES} more below")
    return " (" + "; ".join(parts) + ")"


@dataclass
class _PlanState:
    planned: bool = False
    ranked: list = field(default_factory=list)          # the ranked PlanConfig list known so far
    # Proposals not asked for yet: (engine, thunk) of engines whose every plan ranks below every plan
    # already in ``ranked`` (see create_execution_plans). ``entries`` asks them on first read.
    deferred: list = field(default_factory=list)
    materialize: Optional[Callable] = None              # the graph's hook that asks the deferred engines
    declines: list = field(default_factory=list)       # (engine, reason) gathered while planning/building
    compiled: dict = field(default_factory=dict)        # index -> CompiledPlan
    selected: int = 0
    pinned: bool = False
    layouts: dict = field(default_factory=dict)         # engine binds strides? -> PackLayout
    scalar_defaults: dict = field(default_factory=dict)  # uid -> value of tensor_scalar tensors
    engine_states: dict = field(default_factory=dict)   # engine name -> its state (GraphView.state)
    failed_build: bool = False                          # build() planned, then built nothing
    started: Optional[float] = None                     # perf_counter() when build() / build_plans() began
    planning_ms: float = 0.0                            # create_execution_plans()' time
    counts_before: dict = field(default_factory=dict)   # engine name -> cache_counts() before planning
    plan_cache_key: Any = None                          # the plan-cache key of a miss: store what gets built
    support_checked: bool = False                       # check_support() ran: deferred entries get it too

    @property
    def entries(self) -> list:
        """The whole ranked plan list (graph.plans): deferred proposals are asked for here, once."""
        if self.deferred:
            self.materialize()
        return self.ranked

    @entries.setter
    def entries(self, value: list) -> None:
        self.ranked = value


def _adopt(entries: list, proposed, engine) -> None:
    """Append an engine's proposals to ``entries``, each entry naming the engine that builds it."""
    for p in proposed:
        if p.engine is None:
            object.__setattr__(p, "engine", engine)
        entries.append(p)


def _already_planned(action: str, st: _PlanState) -> AlreadyPlannedError:
    """The error for planning a graph again: planning is one-shot (as in cudnn.pygraph)."""
    if st.compiled:
        return AlreadyPlannedError(action, "already built",
                                   "execute(), or select_plan(i) then build_plans() to switch plans "
                                   "(build a new graph to plan again)",
                                   "create_execution_plans() was already called and a plan is built")
    return AlreadyPlannedError(action, "already planned",
                               "check_support() and build_plans() to build it, or select_plan(i) to switch "
                               "plans (build a new graph to plan again)",
                               "create_execution_plans() was already called")


_HEUR_MODES_EXPECTED = "a list of heur_mode members, e.g. [cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK]"


def _enum_member(enum_cls, value):
    """``value`` as a member of ``enum_cls``: a member, an int of one, or another module's enum member of
    the same name (cudnn-frontend's own ``cudnn.heur_mode.A``); None for anything else (strings too)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, (str, bytes, bool, float)):
        return None
    name = getattr(value, "name", None)
    if isinstance(name, str) and not isinstance(value, type):
        return enum_cls.__members__.get(name.rsplit(".", 1)[-1])
    if isinstance(value, int):
        try:
            return enum_cls(value)
        except ValueError:
            return None
    return None


def _heur_modes(heur_modes, call: str):
    """``heur_modes`` of build() / create_execution_plans() as a list of heur_mode (None stays None),
    refused where given when it is not a list of modes (a string would iterate as letters)."""
    if heur_modes is None:
        return None
    if isinstance(heur_modes, (str, bytes)) or not hasattr(heur_modes, "__iter__") or isinstance(heur_modes, dict):
        raise InvalidArgumentTypeError(f"{call}(heur_modes)", _HEUR_MODES_EXPECTED, heur_modes)
    modes = []
    for i, value in enumerate(heur_modes):
        mode = _enum_member(heur_mode, value)
        if mode is None:
            raise InvalidArgumentTypeError(f"{call}(heur_modes)[{i}]",
                                           f"a heur_mode member ({', '.join(m.name for m in heur_mode)})", value)
        modes.append(mode)
    return modes


def _build_policy(policy):
    """build_plans(policy=) as a build_plan_policy member (None: HEURISTICS_CHOICE)."""
    if policy is None:
        return build_plan_policy.HEURISTICS_CHOICE
    member = _enum_member(build_plan_policy, policy)
    if member is None:
        raise InvalidArgumentTypeError("build_plans(policy)", "a build_plan_policy member ("
                                       + ", ".join(m.name for m in build_plan_policy) + ")", policy)
    return member


def _one_of(heur_modes, heuristics):
    """``heur_modes`` or cudnn.pygraph's spelling ``heuristics`` (not both)."""
    if heuristics is None:
        return heur_modes
    if heur_modes is not None:
        raise TypeError("give heur_modes or heuristics (the same list), not both")
    return heuristics
