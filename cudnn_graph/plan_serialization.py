"""Serialized plans: ``graph.serialize()`` turns a built graph into a blob, ``pygraph().deserialize(blob)``
turns the blob back into a graph that executes without planning again.

A blob (the container is ``cudnn_graph._plan_blob``; docs/plan_format.md specifies it) holds the graph
itself (its IR: tensors, nodes, attributes, so a loaded graph can be inspected and planned afresh), the
tensor table, the selected plan's recipe (engine, engine id, knobs) and the engine's payload:

- a cuDNN plan: cuDNN's own serialized execution plan (``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``),
  loaded into a new execution-plan descriptor on this process's handle. Where cuDNN cannot serialize an
  engine's plan, the recipe alone is stored and the plan is finalized from it on load (no heuristics);
- a Python-engine plan (CuTe, cuTile): with ``include_kernels``, the compiled kernels its engine hands
  over (``CompiledPlan.export_kernels``), loaded by ``engine.load_plan``; an engine without them rebuilds
  the plan from (engine id, knobs);
- a reference-engine plan: nothing more (the graph is the plan).

A plan that binds operands of its own at execute (pass-by-value constants, views of a caller tensor,
scratch in the workspace: ``CompiledPlan.export_plan_operands``) lists them in the blob's plan-operand
section, which makes the blob format version 2; this library re-derives them from the graph on load.
A DSL engine's plan serialized with its kernels also says how to launch them with no Python
(``CompiledPlan.export_launch``: the DSL launch section, format version 3; 4 for a cuTile plan, whose
records carry its cubins), which the C runtime reads.

A blob made by another library version, format version, cuDNN version (major.minor) or GPU
architecture is refused with ``PlanVersionMismatchError`` (which field, the blob's value, this
process's); a truncated, corrupt or foreign blob with ``PlanBlobError``. A plan built without the GPU
(``pygraph(device_property=)``) records the device properties it was built for in its recipe, and the
header's architecture is theirs; loading it on a GPU whose properties differ raises
``DevicePropertiesMismatchError`` (a ``PlanVersionMismatchError``).

Example:
    >>> import numpy as np, cudnn_graph as cudnn
    >>> g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
    ...                   device="cpu")
    >>> x = g.tensor(name="x", dim=[2, 3], stride=[3, 1], uid=1)
    >>> y = g.relu(x).set_output(True).set_uid(2)
    >>> g.build()
    >>> blob = g.serialize(as_bytes=True)
    >>> h = cudnn.pygraph()
    >>> h.deserialize(blob)
    >>> out = np.empty((2, 3), np.float32)
    >>> h.execute({1: -np.ones((2, 3), np.float32), 2: out})
    >>> out.max()
    0.0
"""
from __future__ import annotations

import enum
import json
import logging
from typing import Any, Optional

from . import _plan_blob as blob_format
from ._plan_blob import (FLAG_KERNELS, SECTION_CUDNN_PLAN, SECTION_GRAPH, SECTION_KERNELS, SECTION_PLAN,
                         PlanHeader, TensorRecord)
from .errors import GraphStateError, PlanBlobError, PlanVersionMismatchError

logger = logging.getLogger(__name__)

__all__ = ["serialize", "deserialize", "load_into_built_graph", "library_version", "blob_header",
           "check_compatible", "device_arch"]

GRAPH_FORMAT = "cudnn_graph.plan_graph/1"


# ---- versions and the device -------------------------------------------------------------------

def library_version() -> int:
    """cudnn_graph's version as the header stores it (``_plan_blob.pack_version``)."""
    from . import __version__
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in __version__.split(".")[:3]]
    return blob_format.pack_version(*(parts + [0, 0, 0])[:3])


def _version_text(value: int) -> str:
    return "none" if value == 0 else f"{value // 10000}.{value // 100 % 100}.{value % 100}"


def _arch_text(value: int) -> str:
    return "host (no GPU)" if value == 0 else f"sm_{value}"


def device_arch(device: tuple) -> int:
    """The header's arch of a graph device ``('cuda', N)``: sm_XY as XY; 0 for the host (or no GPU)."""
    kind, ordinal = device
    if kind != "cuda":
        return 0
    from .engines._device import compute_capability
    try:
        major, minor = compute_capability(ordinal)
    except Exception:          # noqa: BLE001  (no driver, no such device: this process has no arch)
        return 0
    return int(major) * 10 + int(minor)


def _cudnn_version() -> int:
    from . import _loader
    try:
        return int(_loader.backend_version())
    except Exception:          # noqa: BLE001  (no libcudnn here)
        return 0


def check_compatible(header: PlanHeader, device: tuple) -> None:
    """Refuse a blob this process cannot run on ``device``: PlanVersionMismatchError naming the field."""
    mine = library_version()
    if header.library_version != mine:
        raise PlanVersionMismatchError("cudnn_graph version", _version_text(header.library_version),
                                       _version_text(mine))
    if header.cudnn_version:
        have = _cudnn_version()
        if header.cudnn_version // 100 != have // 100:
            raise PlanVersionMismatchError("cuDNN version", _version_text(header.cudnn_version),
                                           _version_text(have), "cuDNN plans load only on the cuDNN "
                                           "major.minor that built them: build the graph again here")
    if header.arch:
        have = device_arch(device)
        if header.arch != have:
            raise PlanVersionMismatchError("GPU architecture", _arch_text(header.arch), _arch_text(have),
                                           "a plan runs on the architecture it was built for: build the "
                                           "graph again on this GPU")


# ---- the graph IR as JSON ------------------------------------------------------------------------

def _encode_value(value: Any, where: str) -> Any:
    """A node attribute as JSON data that decodes to an equal value of the same type."""
    from ._ir import Tensor
    from . import enums
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        if getattr(enums, type(value).__name__, None) is not type(value):
            raise PlanBlobError(f"{where}: the enum {type(value).__qualname__} is not one of cudnn_graph.enums; "
                                f"the graph cannot be serialized", "graph")
        return {"enum": type(value).__name__, "name": value.name}
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, Tensor):
        return {"tensor": value.uid}
    if isinstance(value, tuple):
        return {"tuple": [_encode_value(v, where) for v in value]}
    if isinstance(value, list):
        return [_encode_value(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode_value(v, where) for k, v in value.items()}}
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        return _encode_value(value.item(), where)       # a NumPy scalar
    raise PlanBlobError(f"{where}: a {type(value).__name__} cannot be serialized (a callback such as sdpa's "
                        f"score_mod, or a framework object); build this graph where it runs", "graph")


def _decode_value(value: Any, tensors: dict) -> Any:
    from . import enums
    if isinstance(value, list):
        return [_decode_value(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return tensors[value["tensor"]]
    if "tuple" in value:
        return tuple(_decode_value(v, tensors) for v in value["tuple"])
    if "float" in value:
        return float.fromhex(value["float"])
    if "dict" in value:
        return {k: _decode_value(v, tensors) for k, v in value["dict"].items()}
    if "enum" in value:
        cls = getattr(enums, value["enum"], None)
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or value["name"] not in cls.__members__:
            raise PlanBlobError(f"the blob names the enum member {value['enum']}.{value['name']}, which this "
                                f"library does not have", "graph")
        return cls[value["name"]]
    raise PlanBlobError(f"unknown value encoding {sorted(value)} in the blob's graph", "graph")


def _encode_graph(graph) -> dict:
    raw = {t["uid"]: t for t in graph.to_dict()["tensors"]}      # virtual_user is only said there
    tensors = []
    for t in graph.tensors:
        r = raw[t.uid]
        port = None if t.producer is None else next(p for p, v in t.producer.outputs.items() if v is t)
        value = t.value
        if value is not None and not isinstance(value, (bool, int, float)):
            raise PlanBlobError(f"tensor '{t.name}': its scalar value is a {type(value).__name__}", "graph")
        tensors.append({
            "uid": t.uid, "name": t.name, "uid_user": bool(t.uid_assigned_by_user),
            "dim": list(t.dim) if t.dim_set_by_user else None,
            "stride": list(t.stride) if t.stride_set_by_user else None,
            "data_type": t.get_data_type().name if t.data_type_set_by_user else None,
            "is_virtual": t.is_virtual, "virtual_user": r["virtual_user"],
            "is_pass_by_value": t.is_pass_by_value,
            "value": None if value is None else _encode_value(value, f"tensor '{t.name}'"),
            "ragged_offset": None if t.ragged_offset is None else t.ragged_offset.uid,
            "reordering_type": int(t.reordering_type),
            "producer": None if t.producer is None else t.producer.index, "port": port,
        })
    nodes = []
    for node in graph.nodes:
        where = f"node '{node.name}' ({node.op})"
        inputs = {}
        for port, value in node.inputs.items():
            if value is None:
                inputs[port] = None
            elif isinstance(value, tuple):
                inputs[port] = [t.uid for t in value]
            else:
                inputs[port] = value.uid
        nodes.append({"op": node.op, "name": node.name, "inputs": inputs,
                      "params": {k: _encode_value(v, f"{where}: attribute {k}") for k, v in node.params.items()},
                      "outputs": {port: t.uid for port, t in node.outputs.items()},
                      "compute_data_type": int(node.compute_data_type)})
    ctx = graph.context
    return {"format": GRAPH_FORMAT, "name": ctx.name,
            "context": [ctx.io_data_type.name, ctx.intermediate_data_type.name, ctx.compute_data_type.name],
            "device": list(graph.device), "override_shapes": bool(graph.is_override_shape_enabled),
            "tensors": tensors, "nodes": nodes}


def _make_input(graph, r: dict):
    from .enums import DataType
    dtype = None if r["data_type"] is None else DataType[r["data_type"]]
    uid = r["uid"] if r["uid_user"] else None
    if r["value"] is not None:
        t = graph.tensor_scalar(_decode_value(r["value"], {}), data_type=dtype, name=r["name"])
        t.set_dim(r["dim"]).set_stride(r["stride"] if r["stride"] is not None else [1] * len(r["dim"]))
        return t.set_uid(uid) if uid is not None else t
    return graph.tensor(name=r["name"], dim=r["dim"], stride=r["stride"], data_type=dtype,
                        is_virtual=r["is_virtual"], is_pass_by_value=r["is_pass_by_value"],
                        reordering_type=r["reordering_type"] or None, uid=uid)


def _make_node(graph, node: dict, made: dict, by_uid: dict) -> None:
    from .enums import DataType
    from .ops import SCHEMAS
    schema = SCHEMAS.get(node["op"])
    if schema is None:
        raise PlanBlobError(f"the blob's graph has an op {node['op']!r} this library does not know", "graph")
    for v in node["inputs"].values():
        for uid in (v if isinstance(v, list) else [v]):
            if uid is not None and uid not in made:       # an input made after the node (an adopted output)
                made[uid] = _make_input(graph, by_uid[uid])
    inputs = {port: None if v is None else (tuple(made[u] for u in v) if isinstance(v, list) else made[v])
              for port, v in node["inputs"].items()}
    params = {k: _decode_value(v, made) for k, v in node["params"].items()}
    compute_type = node["compute_data_type"]
    position = {uid: i for i, uid in enumerate(by_uid)}       # creation order of the original
    names = sorted(node["outputs"], key=lambda port: position[node["outputs"][port]])
    outs = graph._add_node(node["op"], schema, node["name"], inputs, params, names,
                           None if compute_type == DataType.NOT_SET else DataType(compute_type))
    for port, t in zip(names, outs):
        r = by_uid[node["outputs"][port]]
        t.set_name(r["name"])
        if r["uid_user"]:
            t.set_uid(r["uid"])
        if r["dim"] is not None:
            t.set_dim(r["dim"])
        if r["stride"] is not None:
            t.set_stride(r["stride"])
        if r["data_type"] is not None:
            t.set_data_type(DataType[r["data_type"]])
        if r["virtual_user"]:
            t.set_is_virtual(r["is_virtual"])
        if r["is_pass_by_value"]:
            t.set_is_pass_by_value(True)
        if r["reordering_type"]:
            t.set_reordering_type(r["reordering_type"])
        made[r["uid"]] = t


def _fill_graph(graph, data: dict, device: tuple) -> None:
    """Rebuild the IR ``data`` describes into the empty ``graph``: tensors and nodes made in the order the
    original made them, so auto-assigned uids come out as they were (the graph's key is the original's);
    a uid that still differs (the original renumbered it) is set explicitly."""
    from ._ir import Graph as GraphCore
    from .enums import DataType
    if data.get("format") != GRAPH_FORMAT:
        raise PlanBlobError(f"the blob's graph is in format {data.get('format')!r}; this library reads "
                            f"{GRAPH_FORMAT!r}", "graph")
    io, intermediate, compute = (None if n == "NOT_SET" else DataType[n] for n in data["context"])
    GraphCore.__init__(graph, io, intermediate, compute, name=data["name"],
                       device="cpu" if device[0] == "cpu" else f"cuda:{device[1]}", handle=graph.handle,
                       router=graph.router)
    graph._override_shape_enabled = bool(data["override_shapes"])
    records = data["tensors"]
    by_uid = {r["uid"]: r for r in records}
    made: dict = {}
    for r in records:
        if r["uid"] in made:
            continue
        if r["producer"] is None:
            made[r["uid"]] = _make_input(graph, r)
        else:
            _make_node(graph, data["nodes"][r["producer"]], made, by_uid)
    for _ in range(len(records) + 1):      # each pass pins one more uid; a pinned uid never moves again
        wrong = [(uid, t) for uid, t in made.items() if t.uid != uid]
        if not wrong:
            break
        wrong[0][1].set_uid(wrong[0][0])
    for r in records:
        if r["ragged_offset"] is not None:
            made[r["uid"]].set_ragged_offset(made[r["ragged_offset"]])


# ---- the tensor table ----------------------------------------------------------------------------

def _tensor_records(graph, compiled) -> list:
    alignment = {}
    if compiled is not None and compiled.layout is not None:
        alignment = {s.uid: int(getattr(s, "alignment", 0) or 0) for s in compiled.layout.specs}
    return [TensorRecord(t.uid, t.name, int(t.data_type), tuple(t.dim), tuple(t.stride), t.is_virtual,
                         t.is_pass_by_value, alignment.get(t.uid, 0)) for t in graph.tensors]


def _check_tensors(graph, tensors) -> None:
    """The rebuilt graph's geometry must be the stored one (else the blob's graph and table disagree)."""
    for record in tensors:
        try:
            t = graph.tensor_by_uid(record.uid)
        except KeyError:
            raise PlanBlobError(f"the tensor table names uid {record.uid}, which the blob's graph lacks",
                                "tensors") from None
        got = (tuple(t.dim), tuple(t.stride), int(t.data_type))
        want = (tuple(record.dims), tuple(record.strides), int(record.data_type))
        if got != want:
            raise PlanBlobError(f"tensor '{record.name}' (uid {record.uid}): the blob's graph gives dims, strides, "
                                f"type {got}, its tensor table {want} (corrupt)", "tensors")


# ---- serialize / deserialize ---------------------------------------------------------------------

def _family_code(engine_id: int) -> int:
    from .engines.ids import family_of
    return blob_format.ENGINE_FAMILY_CODES[family_of(engine_id)]


def serialize(graph, *, include_kernels: bool = True, index: Optional[int] = None) -> bytes:
    """The blob of ``graph``'s built plan ``index`` (None: the selected one); ``pygraph.serialize`` is this."""
    compiled = graph.compiled_plan(index)
    if compiled is None:
        raise GraphStateError("serialize()", "not built", "build() (or build_plans()) first",
                              "a blob holds a built plan, and that one is not built")
    entry = graph.selected_plan if index is None else graph.plans[index]
    engine = entry.engine
    family = _family_code(entry.engine_id)
    is_cudnn = family == blob_format.ENGINE_FAMILY_CODES["cudnn"]
    sections = {SECTION_GRAPH: json.dumps(_encode_graph(graph), separators=(",", ":")).encode()}
    flags = 0
    payload = compiled.export_kernels() if (is_cudnn or include_kernels) else None
    if payload is not None:
        sections[SECTION_CUDNN_PLAN if is_cudnn else SECTION_KERNELS] = bytes(payload)
        flags |= 0 if is_cudnn else FLAG_KERNELS
    knobs = [[int(k) if isinstance(k, int) else str(k), _encode_value(v, f"knob {k}")]
             for k, v in entry.knobs.items()]
    recipe = {"engine": getattr(engine, "name", ""), "engine_id": int(entry.engine_id), "knobs": knobs,
              "name": entry.name, "source": entry.source}
    props = getattr(graph, "device_properties", None)
    if props is not None:       # a deviceless build: the GPU it was planned for (checked where it loads)
        recipe["device_properties"] = props.cudnn_json
    sections[SECTION_PLAN] = json.dumps(recipe, sort_keys=True, separators=(",", ":")).encode()
    uses_gpu = graph.device[0] == "cuda"
    header = PlanHeader(library_version=library_version(), cudnn_version=_cudnn_version() if is_cudnn else 0,
                        arch=(props.arch if props is not None else device_arch(graph.device)) if uses_gpu else 0,
                        engine_family=family,
                        engine_id=int(entry.engine_id), workspace_size=int(compiled.workspace_size), flags=flags)
    # What the plan binds itself (constants, views, scratch) and how its DSL kernels launch: a reader
    # without the engine (the C runtime) needs them.
    # (A CuTe plan's launch points into its kernels; a cuTile plan's carries its cubins, with no section 5.)
    launch = tuple(compiled.export_launch(payload)) if (include_kernels and not is_cudnn) else ()
    return blob_format.pack_blob(header, _tensor_records(graph, compiled), sections,
                                 tuple(compiled.export_plan_operands()), launch)


def _engine_named(name: str, engine_id: int):
    from .engines import manifest
    owner = manifest.engine_owning(engine_id)       # imports that one engine, not every in-tree one
    if owner is not None and owner.name == name:
        return owner
    for engine in manifest.engines():
        if engine.name == name:
            return engine
    raise PlanBlobError(f"the blob's plan is engine {name!r} (id {engine_id}), which this process does not "
                        f"have (engines.manifest)", "engine")


def _plan_entry(graph, engine, recipe: dict):
    """The plan-list entry the recipe names (engine id, knobs), made without asking the engine to plan."""
    from .engines.base import PlanConfig
    from .enums import knob_type
    knobs = {}
    for k, v in recipe["knobs"]:
        key = k
        if isinstance(k, int) and engine.name == "cudnn_backend":
            try:
                key = knob_type(k)
            except ValueError:
                pass
        knobs[key] = _decode_value(v, {})
    return PlanConfig(recipe["engine_id"], knobs, name=recipe["name"], engine=engine, source="deserialized")


def _read(data):
    """(unpacked blob, the stored graph as JSON data, the plan recipe) of ``data``."""
    if isinstance(data, str):
        raise PlanBlobError("deserialize() takes the bytes serialize() returned (or their list of values); got a "
                            "str", "data")
    if isinstance(data, (list, tuple)):
        try:
            data = bytes(data)
        except (TypeError, ValueError) as exc:
            raise PlanBlobError(f"a list given to deserialize() holds byte values 0..255 ({exc})", "data") from None
    unpacked = blob_format.unpack_blob(data)
    try:
        stored = json.loads(unpacked.sections[SECTION_GRAPH].decode("utf-8"))
        recipe = json.loads(unpacked.sections[SECTION_PLAN].decode("utf-8"))
    except KeyError as exc:
        raise PlanBlobError(f"the plan blob lacks section {exc}", "sections") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PlanBlobError(f"the plan blob's graph or plan section is unreadable ({exc})", "graph") from None
    return unpacked, stored, recipe


def _install(graph, unpacked, recipe) -> None:
    """Install the blob's plan as ``graph``'s (whose IR is the blob's graph, frozen), built."""
    _check_tensors(graph, unpacked.tensors)
    engine = _engine_named(recipe["engine"], recipe["engine_id"])
    built_for = recipe.get("device_properties")
    if built_for is not None and graph.device[0] == "cuda":    # planned without the GPU: for this kind of GPU?
        from .device_properties import check_device_matches
        try:
            wanted = json.loads(built_for)
        except ValueError as exc:
            raise PlanBlobError(f"the blob's device properties are unreadable ({exc})", "plan") from None
        check_device_matches(wanted, graph.device[1])
    entry = _plan_entry(graph, engine, recipe)
    engine.check_support(graph.view, entry)      # the graph's plan filters still apply (a decline raises)
    payload = unpacked.sections.get(SECTION_CUDNN_PLAN, unpacked.sections.get(SECTION_KERNELS))
    graph._install_loaded_plan(entry, lambda view, ctx: engine.load_plan(view, entry, ctx, payload))


def deserialize(graph, data, handle=None) -> None:
    """Fill the empty ``graph`` from the blob ``data`` (bytes, or a list of byte values) and install its
    plan, built: the graph executes at once. ``handle`` (optional) is the handle it runs with."""
    if graph.nodes or graph.tensors or graph._plans.planned:
        raise GraphStateError("deserialize()", "not empty", "deserialize() on a new pygraph()",
                              "a blob fills an empty graph")
    unpacked, stored, recipe = _read(data)
    kind, ordinal = stored["device"]
    if handle is not None:
        graph.handle = handle
    handle_device = getattr(graph.handle, "device", None)     # a cuDNN Handle's is its CUDA ordinal
    if kind == "cuda" and isinstance(handle_device, int) and not isinstance(handle_device, bool):
        ordinal = handle_device
    device = (kind, int(ordinal))
    check_compatible(unpacked.header, device)
    try:
        _fill_graph(graph, stored, device)
        graph.build_operation_graph()
    except PlanBlobError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise PlanBlobError(f"the blob's graph does not rebuild ({type(exc).__name__}: {exc})", "graph") from exc
    _install(graph, unpacked, recipe)


def load_into_built_graph(graph, data) -> None:
    """Install the plan of ``data`` (a blob of a graph with ``graph``'s structure) into ``graph``, which is
    frozen and not planned yet: what a plan-cache hit does. Raises as ``deserialize`` does."""
    unpacked, _, recipe = _read(data)
    check_compatible(unpacked.header, graph.device)
    _install(graph, unpacked, recipe)


def blob_header(data) -> PlanHeader:
    """The header of the blob ``data`` (checked whole and intact, not checked for compatibility)."""
    return blob_format.unpack_blob(data).header
