"""``populate_cuda_graph`` / ``update_cuda_graph``: one execute of a graph's selected plan, recorded into
a CUDA graph the caller owns (cudnn-frontend 1.32's pygraph methods of those names).

``populate_cuda_graph(graph, handle, variant_pack, workspace, cuda_graph)`` adds one child-graph node
to the caller's empty ``cuda_graph`` (a cudaGraph_t / CUgraph handle as an int, e.g. what
``torch.cuda.CUDAGraph().raw_cuda_graph()`` or cuda-python's ``cuGraphCreate`` gives). The child graph
is recorded in one of two ways:

- ``populate``: cuDNN records the plan itself (cudnnBackendPopulateCudaGraph, cuDNN >= 9.5), for a
  cuDNN plan that needs no per-execute zero fill of its scratch;
- ``capture``: one execute of the plan is captured from a private stream (thread-local capture mode)
  — for a plan cuDNN refuses to populate (cuDNN 9.19 refuses most:
  CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API), and for Python-engine plans (CuTe, cuTile).

``update_cuda_graph`` points a graph ``populate_cuda_graph`` filled at new buffers: cuDNN updates its
child graph in place (populate), or the execute is captured again and replaces the child node
(capture). Either way the caller applies the change to an executable graph with cuGraphExecUpdate
(``cudnn_graph._driver.graph_exec_update``), or instantiates the graph again.

The checks, before anything is recorded (typed errors naming what arrived): ``cuda_graph`` is a
non-zero int handle (CudaGraphError); the graph has a built plan (NotBuiltError); the graph runs on a
GPU; no operand is a host (pass-by-value) buffer, whose value a recorded graph would freeze
(CudaGraphError naming the tensor); a plan needing workspace gets the caller's (a recorded graph must
not point at memory cudnn_graph may free); populate's graph is empty, update's was filled by populate
for this graph (one root node, a child graph).

The work is recorded on this thread's cuDNN handle for the graph's device, whatever ``handle`` is
(``handle`` is accepted for the frontend's signature): a caller's handle is never rebound to the
private capture stream.

Example (on a machine with a GPU):
    >>> from cudnn_graph import _driver
    >>> cg = _driver.graph_new()                                        # doctest: +SKIP
    >>> g.populate_cuda_graph(None, {a: A, b: B, c: C}, ws, cg)         # doctest: +SKIP
    >>> exe = _driver.graph_exec_new(cg); _driver.graph_exec_launch(exe) # doctest: +SKIP
"""
from __future__ import annotations

import logging
import weakref
from typing import Mapping

from .errors import CudaGraphError, GraphNotSupportedError, NotBuiltError

logger = logging.getLogger(__name__)

__all__ = ["populate_cuda_graph", "update_cuda_graph", "recorded_method"]

POPULATE = "populate"
CAPTURE = "capture"

# graph -> {cuda_graph handle: (how it was recorded, plan index)}: what update_cuda_graph must redo.
_recorded: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def recorded_method(graph, cuda_graph: int):
    """How ``populate_cuda_graph`` recorded ``graph`` into ``cuda_graph``: "populate", "capture" or None."""
    found = _recorded.get(graph, {}).get(int(cuda_graph))
    return None if found is None else found[0]


def _graph_handle(cuda_graph, action: str) -> int:
    """The caller's cudaGraph_t as an int; cuda-python's CUgraph / cudaGraph_t objects convert by int()."""
    if isinstance(cuda_graph, bool):
        raise CudaGraphError(f"{action}: cuda_graph must be a cudaGraph_t handle as an int; got a bool")
    if not isinstance(cuda_graph, int):
        kind = type(cuda_graph)
        if kind.__module__.startswith("cuda.") and hasattr(cuda_graph, "__int__"):
            cuda_graph = int(cuda_graph)
        else:
            raise CudaGraphError(f"{action}: cuda_graph must be a cudaGraph_t handle as an int (e.g. "
                                 f"torch.cuda.CUDAGraph().raw_cuda_graph()); got {kind.__name__}")
    if cuda_graph <= 0:
        raise CudaGraphError(f"{action}: cuda_graph must be a cudaGraph_t handle; got {cuda_graph:#x} (no graph)")
    return cuda_graph


def _built_plan(graph, action: str):
    compiled = graph.compiled_plan()
    if compiled is None:
        raise NotBuiltError(action, "not built" if graph.get_execution_plan_count() else "not planned",
                            "build() (or build_plans()) first", "no plan is built to record")
    if graph.device[0] != "cuda":
        raise CudaGraphError(f"{action}: a CUDA graph records GPU work; this graph runs on {graph.device[0]}")
    return compiled


def _refuse_host_operands(compiled, action: str) -> None:
    """A pass-by-value operand the caller supplies is read from host memory when an execute is issued;
    a recorded graph would replay the value it had when it was recorded."""
    for spec in compiled.layout.specs:
        if spec.device[0] == "cpu" and spec.required:
            raise CudaGraphError(f"{action}: tensor '{spec.name}' (uid {spec.uid}) is a host (pass-by-value) "
                                 "operand; a CUDA graph would freeze its value. Give it a fixed value in the "
                                 "graph (tensor_scalar) or pass it as a device tensor")


def _workspace(compiled, workspace, action: str):
    if compiled.workspace_size > 0 and (workspace is None or (type(workspace) is int and workspace == 0)):
        raise CudaGraphError(f"{action}: plan {compiled.plan.label} needs {compiled.workspace_size} bytes of "
                             "workspace; pass one (a recorded graph must not point at memory cudnn_graph "
                             "may free)")
    return workspace


def _uses_populate(compiled) -> bool:
    """A cuDNN plan that cuDNN can record itself: it has the calls and no scratch zeroed per execute (a
    populated graph would miss that fill; a capture records it)."""
    runner = getattr(compiled, "runner", None)
    if runner is None:
        return False
    from . import _cuda_graph_populate
    return _cuda_graph_populate.can_record() and not runner.zeroes_scratch


def _pack(graph, compiled, variant_pack, workspace):
    """(the pack as an execute makes it, the workspace address) for cuDNN's populate / update."""
    defaults = graph._plans.scalar_defaults
    if defaults:
        variant_pack = graph._with_scalars(variant_pack, defaults, compiled.layout)
    pack = compiled.layout.pack(variant_pack)
    ws = 0
    if workspace is not None:
        ws = graph._workspace_slot(workspace, compiled, None).data_ptr
    return pack, ws


def _populated_child(graph, compiled, variant_pack, workspace, child: int, update: bool) -> None:
    from . import _cuda_graph_populate
    pack, ws = _pack(graph, compiled, variant_pack, workspace)
    _cuda_graph_populate.record_plan_graph(compiled.runner, pack, ws, child, update)


def imported_operands(graph, index: int, variant_pack) -> dict:
    """The caller's buffers imported once, outside any capture, as ``{uid: Slot}``. An execute that is
    captured must not import them itself: a DLPack export given the consumer's stream records an event on
    the producer's stream for that stream to wait on (CuPy does), which joins uncaptured work to the
    capture (cudaErrorStreamCaptureIsolation). Slots are taken as they are, with no handshake."""
    graph.build_plan_at_index(index)
    pack = graph._plans.compiled[index].layout.pack(variant_pack)
    return dict(zip(pack.uids, pack.slots))


def _captured_child(graph, variant_pack, workspace, index: int) -> int:
    """One execute of plan ``index`` captured from a private stream: the recorded graph (to free)."""
    from . import _driver
    variant_pack = imported_operands(graph, index, variant_pack)
    if workspace is not None and type(workspace) is not int:
        workspace = graph._workspace_slot(workspace, graph._plans.compiled[index], None)
    return captured_graph(lambda stream: graph.execute_plan_at_index(variant_pack, workspace, index=index,
                                                                     stream=stream))


def captured_graph(record) -> int:
    """The CUDA graph ``record(stream)`` issues on a private capturing stream (the caller frees it); a
    failure ends the capture, frees what was recorded and raises the record's error."""
    from . import _driver
    stream = _driver.capture_start()
    try:
        record(stream)
    except BaseException:
        try:
            _driver.graph_free(_driver.capture_finish(stream))
        except Exception:      # noqa: BLE001  (the record's error is the one to report)
            pass
        raise
    return _driver.capture_finish(stream)


def _record(graph, compiled, variant_pack, workspace, index: int, prefer_populate: bool):
    """(method, child graph to free) of one execute of plan ``index``."""
    from . import _driver
    from ._cudnn_errors import CudnnStatusError
    if prefer_populate and _uses_populate(compiled):
        child = _driver.graph_new()
        try:
            _populated_child(graph, compiled, variant_pack, workspace, child, update=False)
            return POPULATE, child
        except CudnnStatusError as exc:
            _driver.graph_free(child)
            logger.debug("cuDNN cannot populate %s (%s): its execute is captured instead", compiled.plan.label, exc)
    try:
        return CAPTURE, _captured_child(graph, variant_pack, workspace, index)
    except GraphNotSupportedError:
        raise
    except Exception as exc:
        from .errors import CudaDriverError
        if isinstance(exc, CudaDriverError):
            raise CudaGraphError(f"capturing an execute of {compiled.plan.label} failed: {exc} (a plan whose "
                                 "execute allocates or synchronizes cannot be captured)") from exc
        raise


def populate_cuda_graph(graph, handle, variant_pack: Mapping, workspace, cuda_graph) -> None:
    """Record one execute of ``graph``'s selected plan on ``variant_pack`` into the empty CUDA graph
    ``cuda_graph`` (an int handle), as one child-graph node; see the module docstring."""
    from . import _driver
    action = "populate_cuda_graph()"
    handle_value = _graph_handle(cuda_graph, action)
    compiled = _built_plan(graph, action)
    _refuse_host_operands(compiled, action)
    workspace = _workspace(compiled, workspace, action)
    nodes = _driver.graph_node_count(handle_value)
    if nodes:
        raise CudaGraphError(f"{action}: the CUDA graph {handle_value:#x} holds {nodes} nodes; it must be empty "
                             "(update_cuda_graph then finds the one node populate adds)")
    index = graph._plans.selected
    method, child = _record(graph, compiled, variant_pack, workspace, index, prefer_populate=True)
    try:
        _driver.graph_add_child(handle_value, child)
    finally:
        _driver.graph_free(child)        # the node holds its own copy
    _recorded.setdefault(graph, {})[handle_value] = (method, index)
    logger.debug("populate_cuda_graph: plan %s recorded into graph %#x by %s", compiled.plan.label,
                 handle_value, method)


def update_cuda_graph(graph, handle, variant_pack: Mapping, workspace, cuda_graph) -> None:
    """Point the CUDA graph ``populate_cuda_graph`` filled at the buffers of ``variant_pack`` (and
    ``workspace``); see the module docstring."""
    from . import _driver
    action = "update_cuda_graph()"
    handle_value = _graph_handle(cuda_graph, action)
    compiled = _built_plan(graph, action)
    _refuse_host_operands(compiled, action)
    workspace = _workspace(compiled, workspace, action)
    found = _recorded.get(graph, {}).get(handle_value)
    if found is None:
        raise CudaGraphError(f"{action}: the CUDA graph {handle_value:#x} was not filled by this graph's "
                             "populate_cuda_graph()")
    method, index = found
    if index != graph._plans.selected:
        raise CudaGraphError(f"{action}: the CUDA graph {handle_value:#x} holds plan {index}; the selected plan "
                             f"is {graph._plans.selected} (populate a new graph for it)")
    roots = _driver.graph_root_nodes(handle_value)
    if len(roots) != 1 or not _driver.graph_node_is_child_graph(roots[0]):
        raise CudaGraphError(f"{action}: the CUDA graph {handle_value:#x} must hold the one child-graph node "
                             f"populate_cuda_graph() added; it has {len(roots)} root nodes")
    if method == POPULATE:
        _populated_child(graph, compiled, variant_pack, workspace, _driver.graph_child_of(roots[0]), update=True)
        return
    child = _captured_child(graph, variant_pack, workspace, index)
    try:
        _driver.graph_remove_node(roots[0])
        _driver.graph_add_child(handle_value, child)
    finally:
        _driver.graph_free(child)
