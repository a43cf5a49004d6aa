"""``GraphView``: what an engine (or a router) sees of a graph — read-only, plus one state slot per engine.

The graph's lifecycle hands engines a view, never the graph itself: ``propose_plans(view)``,
``check_support(view, plan)``, ``build_plan(view, plan, ctx)`` and ``CompiledPlan.execute(view, ...)``.
A view reads the graph's structure (nodes, tensors, their resolved data types, device, fingerprint)
and gives each engine a slot of its own on the graph (``state(engine, factory)``) for lowering or
planning state, so that the graph keeps no field for any one engine.

Example:
    >>> import cudnn_graph as cudnn
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, device="cpu")
    >>> x = g.tensor(name="x", dim=[2, 3], stride=[3, 1])
    >>> y = g.relu(x).set_output(True)
    >>> view = g.view
    >>> [n.op for n in view.nodes], view.data_type(y).name
    (['relu'], 'HALF')
    >>> view.state("mine", dict)["lowered"] = True      # an engine's own slot, made on first use
    >>> g.view.state("mine")
    {'lowered': True}
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .data_type import DataType

__all__ = ["GraphView"]


def _read(attribute: str, doc: str) -> property:
    """A read-only property passing the graph's own ``attribute`` through."""
    return property(lambda view: getattr(view._graph, attribute), doc=doc)


class GraphView:
    """A read-only view of one graph for engines: structure, resolved data types and engine state.

    Made by the graph (``graph.view``); cheap to make, and every view of one graph shares that
    graph's engine state slots. Tensors and nodes are the graph's own objects (read them; their
    setters raise once the graph is frozen, which it is whenever an engine plans it).
    """

    __slots__ = ("_graph", "_engine_states")

    def __init__(self, graph, engine_states: dict):
        self._graph = graph
        self._engine_states = engine_states

    @staticmethod
    def of(graph) -> "GraphView":
        """``graph`` itself when it is a view, else its ``view``: engine helpers take either."""
        return graph if type(graph) is GraphView else graph.view

    # -- structure ---------------------------------------------------------------------------------

    nodes = _read("nodes", "The graph's nodes, in the order they were added (a topological order).")
    tensors = _read("tensors", "Every tensor of the graph (inputs, intermediates and outputs).")
    node_count = _read("node_count", "``len(nodes)``.")
    context = _read("context", "The graph's default data types and name (a ``GraphContext``).")
    device = _read("device", "('cpu', 0) or ('cuda', N).")
    device_code = _read("device_code", "The graph's DLPack (device type, ordinal).")
    frozen = _read("frozen", "Whether the graph is frozen (it is whenever an engine plans it).")

    def tensor_by_uid(self, uid: int):
        return self._graph.tensor_by_uid(uid)

    def data_type(self, tensor) -> DataType:
        """The data type ``tensor`` has in this graph: the user's, else the one inference resolved
        (the graph's io / intermediate / compute type where nothing else gave one)."""
        return tensor.data_type

    @property
    def name(self) -> str:
        return self._graph.context.name

    @property
    def is_override_shape_enabled(self) -> bool:
        """Whether execute may override tensor shapes and strides (fixed at construction)."""
        return bool(getattr(self._graph, "is_override_shape_enabled", False))

    @property
    def is_dynamic_shape_enabled(self) -> bool:
        """Whether engines compile the graph's kernels for a class of shapes (a kernel cache turns it on)."""
        return bool(getattr(self._graph, "is_dynamic_shape_enabled", False))

    @property
    def device_properties(self):
        """The ``DeviceProperties`` a deviceless build plans for (``pygraph(device_property=)``), or None: the
        graph is planned for its device. Only engines with ``plans_without_device`` see such a graph."""
        return getattr(self._graph, "device_properties", None)

    @property
    def kernel_cache(self):
        """The graph's ``KernelCache`` (``pygraph(kernel_cache=)``), or None: engines that can reuse
        compiled kernels keep them in its slot for their name."""
        return getattr(self._graph, "kernel_cache", None)

    def key(self) -> str:
        """A stable fingerprint of the graph's structure: equal graphs share lowerings and plans."""
        return self._graph.key()

    # -- per-engine state --------------------------------------------------------------------------

    def state(self, engine, factory: Optional[Callable[[], Any]] = None) -> Any:
        """The state ``engine`` keeps on this graph (keyed by its ``name``; a str is taken as the name).

        With ``factory``, the state is made by calling it on first use; without, None until then.
        The state lives as long as the graph.
        """
        key = engine if isinstance(engine, str) else engine.name
        found = self._engine_states.get(key)
        if found is None and factory is not None:
            found = self._engine_states.setdefault(key, factory())
        return found

    def __repr__(self) -> str:
        return f"GraphView({self._graph!r})"
