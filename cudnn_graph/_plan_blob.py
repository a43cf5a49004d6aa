"""The plan blob container: a versioned, little-endian binary layout that a C reader can parse.

This module only packs and checks bytes (docs/plan_format.md is the specification); what goes into
the sections (the graph, the engine's payload) is ``cudnn_graph.plan_serialization``'s business.

Layout: a fixed 64-byte header, a section directory (one 24-byte entry per section), then the
sections, each starting at an 8-byte aligned offset. The header's CRC-32 covers the whole blob (with
the checksum field read as zero), so a truncated or altered blob is refused before anything in it
is trusted. Format version 2 is version 1 plus the plan-operand section (6: the operands a plan binds
itself, which a reader must understand to execute it); format version 3 is version 2 plus the DSL launch
section (7: what a reader with no Python needs to launch a DSL engine's kernels; ``_plan_launch``); format
version 4 is version 3 whose section 7 may hold cuTile kernels (calling convention 2) and up to 16 kernels. A
blob is written as the lowest version that holds its sections, so older readers keep reading the rest.

Example:
    >>> from cudnn_graph._plan_blob import PlanHeader, TensorRecord, pack_blob, unpack_blob, SECTION_GRAPH
    >>> header = PlanHeader(library_version=100, cudnn_version=0, arch=0, engine_family=3,
    ...                     engine_id=20000, workspace_size=0)
    >>> blob = pack_blob(header, [TensorRecord(1, "x", 0, (2, 3), (3, 1), False, False, 0)],
    ...                  {SECTION_GRAPH: b"{}"})
    >>> read = unpack_blob(blob)
    >>> read.header.engine_id, read.tensors[0].name, read.sections[SECTION_GRAPH]
    (20000, 'x', b'{}')
"""
from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Mapping, Optional, Sequence

from .errors import PlanBlobError, PlanVersionMismatchError

__all__ = ["MAGIC", "FORMAT_VERSION", "HEADER", "SECTION_ENTRY", "PlanHeader", "TensorRecord", "UnpackedBlob",
           "pack_blob", "unpack_blob", "is_plan_blob", "pack_version", "ENGINE_FAMILY_CODES",
           "SECTION_TENSORS", "SECTION_GRAPH", "SECTION_PLAN", "SECTION_CUDNN_PLAN", "SECTION_KERNELS",
           "FLAG_KERNELS", "SECTION_PLAN_OPERANDS", "PlanOperand", "READABLE_FORMAT_VERSIONS",
           "PLAN_OPERANDS_FORMAT_VERSION", "OPERAND_HOST_CONSTANT", "OPERAND_DEVICE_CONSTANT", "OPERAND_ALIAS",
           "OPERAND_SCRATCH", "OPERAND_WITHHELD", "BASE_FORMAT_VERSION", "SCRATCH_ALIGNMENT", "SECTION_DSL_LAUNCH",
           "DSL_LAUNCH_FORMAT_VERSION", "TILE_LAUNCH_FORMAT_VERSION"]

MAGIC = b"CDNGPLAN"
FORMAT_VERSION = 4                   # the newest format this library reads and writes
BASE_FORMAT_VERSION = 1              # a blob without a plan-operand section
PLAN_OPERANDS_FORMAT_VERSION = 2     # the first version with section 6
DSL_LAUNCH_FORMAT_VERSION = 3        # the first version with section 7
TILE_LAUNCH_FORMAT_VERSION = 4       # the first whose section 7 holds cuTile kernels or more than 8 kernels
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)

# magic, format version, header size, flags, library version, cuDNN version, arch, engine family,
# reserved, engine id, workspace size, total size, checksum, section count
HEADER = struct.Struct("<8sHHIIIIHHqQQII")
SECTION_ENTRY = struct.Struct("<IIQQ")           # kind, reserved, offset, size
_TABLE_HEAD = struct.Struct("<II")               # tensor count, reserved
_TENSOR_HEAD = struct.Struct("<qiBBHII")         # uid, data type, is_virtual, pass-by-value, name length, alignment, rank
_OPERAND_HEAD = struct.Struct("<HHiqqqQ")        # kind, flags, data type, uid, a, b, data length
_CHECKSUM_AT = 56                                # byte offset of the checksum field in the header
assert HEADER.size == 64 and SECTION_ENTRY.size == 24 and _TENSOR_HEAD.size == 24 and _OPERAND_HEAD.size == 40

SECTION_TENSORS = 1      # the tensor table (binary, below)
SECTION_GRAPH = 2        # the graph IR, UTF-8 JSON
SECTION_PLAN = 3         # the selected plan's recipe (engine name, id, knobs), UTF-8 JSON
SECTION_CUDNN_PLAN = 4   # cuDNN's serialized execution plan (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION)
SECTION_KERNELS = 5      # a Python engine's compiled kernels (the engine's own bytes)
SECTION_PLAN_OPERANDS = 6   # the operands the plan binds itself (binary, PlanOperand; format version 2)
SECTION_DSL_LAUNCH = 7      # how to launch a DSL engine's kernels without Python (_plan_launch; format version 3)

# PlanOperand.kind: what the plan passes for a uid the caller never does
OPERAND_HOST_CONSTANT = 1    # a pass-by-value scalar: the plan's bytes, passed as a host pointer
OPERAND_DEVICE_CONSTANT = 2  # constant device data: the plan's bytes, copied to the device once at load
OPERAND_ALIAS = 3            # a view: the source operand's pointer plus a byte offset
OPERAND_SCRATCH = 4          # plan-owned device memory carved from the caller's workspace
OPERAND_WITHHELD = 5         # a caller operand no cuDNN operation reads: kept out of the variant pack
_OPERAND_KINDS = {OPERAND_HOST_CONSTANT: "host constant", OPERAND_DEVICE_CONSTANT: "device constant",
                  OPERAND_ALIAS: "alias", OPERAND_SCRATCH: "scratch", OPERAND_WITHHELD: "withheld"}
_FLAG_GRAPH_SCALAR = 1       # host constant: a graph tensor whose value the graph fixed (not a caller operand)
_FLAG_ZERO_FILL = 2          # scratch: zero-filled on the stream before each execute
_MAX_PLAN_OPERANDS = 256
_MAX_HOST_CONSTANT_BYTES = 16
_MAX_DEVICE_BYTES = 1 << 40
SCRATCH_ALIGNMENT = 256      # scratch regions start at multiples of this past cuDNN's workspace

FLAG_KERNELS = 1         # the blob carries compiled kernels (SECTION_KERNELS)

# ids.family_of(engine_id) -> the header's engine-family code
ENGINE_FAMILY_CODES = {"cudnn": 1, "native": 2, "python": 3, "external": 4}

_MAX_SECTIONS = 64
_MAX_RANK = 64


def pack_version(major: int, minor: int, patch: int) -> int:
    """A version as the header stores it: ``major * 10000 + minor * 100 + patch`` (cuDNN's own scheme).

    >>> pack_version(9, 21, 0)
    92100
    """
    return int(major) * 10000 + int(minor) * 100 + int(patch)


@dataclasses.dataclass(frozen=True)
class PlanHeader:
    """The fixed header's fields (magic, header size, total size, checksum and section count are the
    container's and filled in by ``pack_blob``)."""
    library_version: int          # cudnn_graph's version, pack_version()
    cudnn_version: int            # cuDNN's version the plan was built with (0: the plan uses no cuDNN)
    arch: int                     # the GPU's sm_XY as XY (90 for sm_90); 0 for a host plan
    engine_family: int            # ENGINE_FAMILY_CODES
    engine_id: int                # the selected plan's engine id (engines/ids.py)
    workspace_size: int           # bytes of workspace the plan needs
    flags: int = 0
    format_version: Optional[int] = None   # None: the lowest that holds the sections (pack_blob picks)


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    """One row of the tensor table: a non-virtual or virtual tensor of the graph as the plan binds it."""
    uid: int
    name: str
    data_type: int                # cuDNN's cudnnDataType_t code (cudnn_graph.DataType)
    dims: tuple
    strides: tuple
    is_virtual: bool
    is_pass_by_value: bool
    alignment: int                # bytes the plan requires of the buffer's address (0: none)


@dataclasses.dataclass(frozen=True)
class PlanOperand:
    """One operand the plan binds itself at every execute (the caller never passes it): ``kind`` is an
    ``OPERAND_*`` code. Host and device constants carry ``data`` (the value's bytes, little-endian);
    ``nbytes`` is a device constant's or scratch region's size; an alias is ``source_uid``'s pointer
    plus ``byte_offset``; ``zero_fill`` clears scratch before each execute; ``graph_scalar`` marks a
    host constant that is a graph tensor with a fixed value (so it is no caller operand)."""
    kind: int
    uid: int
    data_type: int = 0
    data: bytes = b""
    nbytes: int = 0
    source_uid: int = 0
    byte_offset: int = 0
    zero_fill: bool = False
    graph_scalar: bool = False


@dataclasses.dataclass(frozen=True)
class UnpackedBlob:
    header: PlanHeader
    tensors: tuple
    sections: dict                # kind -> bytes (the tensor table and plan operands parsed out)
    plan_operands: tuple = ()     # PlanOperand records of section 6
    dsl_launch: tuple = ()        # _plan_launch.LaunchKernel records of section 7


def is_plan_blob(data) -> bool:
    """Whether ``data`` (bytes-like) starts with this format's magic."""
    try:
        return bytes(data[:len(MAGIC)]) == MAGIC
    except (TypeError, ValueError):
        return False


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _pack_tensors(tensors: Sequence[TensorRecord]) -> bytes:
    out = bytearray(_TABLE_HEAD.pack(len(tensors), 0))
    for t in tensors:
        name = t.name.encode("utf-8")
        if len(t.dims) != len(t.strides):
            raise PlanBlobError(f"tensor '{t.name}' (uid {t.uid}): {len(t.strides)} strides for "
                                f"{len(t.dims)} dims", "tensors")
        out += _TENSOR_HEAD.pack(int(t.uid), int(t.data_type), bool(t.is_virtual), bool(t.is_pass_by_value),
                                 len(name), int(t.alignment), len(t.dims))
        out += struct.pack(f"<{len(t.dims)}q", *t.dims) + struct.pack(f"<{len(t.strides)}q", *t.strides)
        out += name + b"\0" * (_pad8(len(name)) - len(name))
    return bytes(out)


def _unpack_tensors(data: bytes) -> tuple:
    def need(end):
        if end > len(data):
            raise PlanBlobError("the tensor table is cut short", "tensors")

    need(_TABLE_HEAD.size)
    count, _ = _TABLE_HEAD.unpack_from(data, 0)
    at = _TABLE_HEAD.size
    out = []
    for _ in range(count):
        need(at + _TENSOR_HEAD.size)
        uid, dtype, virtual, by_value, name_len, alignment, rank = _TENSOR_HEAD.unpack_from(data, at)
        if rank > _MAX_RANK:
            raise PlanBlobError(f"a tensor of rank {rank} in the tensor table (corrupt)", "tensors")
        at += _TENSOR_HEAD.size
        need(at + 16 * rank + _pad8(name_len))
        dims = struct.unpack_from(f"<{rank}q", data, at)
        strides = struct.unpack_from(f"<{rank}q", data, at + 8 * rank)
        at += 16 * rank
        try:
            name = data[at:at + name_len].decode("utf-8")
        except UnicodeDecodeError:
            raise PlanBlobError(f"tensor uid {uid}: its name is not UTF-8 (corrupt)", "tensors") from None
        at += _pad8(name_len)
        out.append(TensorRecord(uid, name, dtype, dims, strides, bool(virtual), bool(by_value), alignment))
    return tuple(out)


def _pack_plan_operands(operands: Sequence[PlanOperand]) -> bytes:
    out = bytearray(_TABLE_HEAD.pack(len(operands), 0))
    for op in operands:
        if op.kind not in _OPERAND_KINDS:
            raise PlanBlobError(f"plan operand uid {op.uid}: unknown kind {op.kind}", "plan operands")
        flags = (_FLAG_GRAPH_SCALAR if op.graph_scalar else 0) | (_FLAG_ZERO_FILL if op.zero_fill else 0)
        a = op.source_uid if op.kind == OPERAND_ALIAS else op.nbytes
        b = op.byte_offset if op.kind == OPERAND_ALIAS else 0
        data = bytes(op.data)
        out += _OPERAND_HEAD.pack(op.kind, flags, int(op.data_type), int(op.uid), int(a), int(b), len(data))
        out += data + b"\0" * (_pad8(len(data)) - len(data))
    return bytes(out)


def _check_plan_operand(op: PlanOperand, rows: dict, flags: int) -> None:
    """Refuse a plan operand a reader could not bind (the C runtime checks the same, in the same words)."""
    where = f"plan operand uid {op.uid} ({_OPERAND_KINDS[op.kind]})"
    row = rows.get(op.uid)
    is_operand = row is not None and not row.is_virtual
    known = _FLAG_GRAPH_SCALAR if op.kind == OPERAND_HOST_CONSTANT else (
        _FLAG_ZERO_FILL if op.kind == OPERAND_SCRATCH else 0)
    if flags & ~known:
        raise PlanBlobError(f"{where}: flags 0x{flags:x} (corrupt)", "plan operands")
    if op.kind == OPERAND_HOST_CONSTANT:
        if not 1 <= len(op.data) <= _MAX_HOST_CONSTANT_BYTES:
            raise PlanBlobError(f"{where}: a scalar of {len(op.data)} bytes (1 to {_MAX_HOST_CONSTANT_BYTES}; "
                                f"corrupt)", "plan operands")
        if op.graph_scalar and not (is_operand and row.is_pass_by_value):
            raise PlanBlobError(f"{where}: a graph scalar whose uid is no pass-by-value tensor of the table "
                                f"(corrupt)", "plan operands")
    elif op.kind == OPERAND_DEVICE_CONSTANT:
        if not 1 <= len(op.data) <= op.nbytes <= _MAX_DEVICE_BYTES:
            raise PlanBlobError(f"{where}: {len(op.data)} bytes of data for {op.nbytes} bytes of device memory "
                                f"(corrupt)", "plan operands")
    elif op.kind == OPERAND_SCRATCH:
        if not 0 <= op.nbytes <= _MAX_DEVICE_BYTES or op.data:
            raise PlanBlobError(f"{where}: {op.nbytes} bytes (corrupt)", "plan operands")
    elif op.kind == OPERAND_ALIAS:
        source = rows.get(op.source_uid)
        if source is None or source.is_virtual or source.is_pass_by_value or op.byte_offset < 0 or op.data:
            raise PlanBlobError(f"{where}: a view of uid {op.source_uid} at byte offset {op.byte_offset}, which "
                                f"is no device operand of the tensor table (corrupt)", "plan operands")
    if op.kind == OPERAND_WITHHELD:
        if not is_operand or op.data:
            raise PlanBlobError(f"{where}: not an operand of the tensor table (corrupt)", "plan operands")
    elif is_operand and not op.graph_scalar:
        raise PlanBlobError(f"{where}: the uid of the caller operand '{row.name}' (corrupt)", "plan operands")


def _unpack_plan_operands(data: bytes, tensors: Sequence[TensorRecord]) -> tuple:
    def need(end):
        if end > len(data):
            raise PlanBlobError("the plan-operand section is cut short", "plan operands")

    need(_TABLE_HEAD.size)
    count, _ = _TABLE_HEAD.unpack_from(data, 0)
    if count > _MAX_PLAN_OPERANDS:
        raise PlanBlobError(f"the plan-operand section says {count} operands (at most {_MAX_PLAN_OPERANDS}; "
                            f"corrupt)", "plan operands")
    rows = {t.uid: t for t in tensors}
    at, out, supplied, withheld = _TABLE_HEAD.size, [], set(), set()
    for _ in range(count):
        need(at + _OPERAND_HEAD.size)
        kind, flags, dtype, uid, a, b, length = _OPERAND_HEAD.unpack_from(data, at)
        at += _OPERAND_HEAD.size
        if kind not in _OPERAND_KINDS:
            raise PlanBlobError(f"plan operand uid {uid}: unknown kind {kind} (corrupt)", "plan operands")
        need(at + _pad8(length))
        payload = data[at:at + length]
        at += _pad8(length)
        op = PlanOperand(kind, uid, dtype, payload, nbytes=0 if kind == OPERAND_ALIAS else a,
                         source_uid=a if kind == OPERAND_ALIAS else 0, byte_offset=b if kind == OPERAND_ALIAS else 0,
                         zero_fill=bool(flags & _FLAG_ZERO_FILL), graph_scalar=bool(flags & _FLAG_GRAPH_SCALAR))
        _check_plan_operand(op, rows, flags)
        seen = withheld if kind == OPERAND_WITHHELD else supplied
        if uid in seen:
            raise PlanBlobError(f"plan operand uid {uid} appears twice (corrupt)", "plan operands")
        seen.add(uid)
        out.append(op)
    return tuple(out)


def pack_blob(header: PlanHeader, tensors: Sequence[TensorRecord], sections: Mapping[int, bytes],
              plan_operands: Sequence[PlanOperand] = (), dsl_launch: Sequence = ()) -> bytes:
    """The blob of ``header``, the tensor table ``tensors``, ``sections`` ({kind: bytes}), the
    operands the plan binds itself (``plan_operands``: section 6, which makes the blob format version 2)
    and the DSL launch records (``dsl_launch``, ``_plan_launch.LaunchKernel``: section 7, version 3; 4 with a
    cuTile kernel).
    ``header.format_version`` None writes the lowest version that holds what is given."""
    sections = dict(sections)
    if plan_operands:
        sections[SECTION_PLAN_OPERANDS] = _pack_plan_operands(plan_operands)
    launch_version = BASE_FORMAT_VERSION
    if dsl_launch:
        from ._plan_launch import CONVENTION_FORMAT_VERSIONS, MAX_LAUNCH_KERNELS_V3, pack_launch
        sections[SECTION_DSL_LAUNCH] = pack_launch(dsl_launch)
        launch_version = max([CONVENTION_FORMAT_VERSIONS[k.convention] for k in dsl_launch] +
                             [TILE_LAUNCH_FORMAT_VERSION if len(dsl_launch) > MAX_LAUNCH_KERNELS_V3 else 0])
    elif SECTION_DSL_LAUNCH in sections:
        launch_version = DSL_LAUNCH_FORMAT_VERSION
    version = header.format_version
    if version is None:
        version = max(launch_version, PLAN_OPERANDS_FORMAT_VERSION if SECTION_PLAN_OPERANDS in sections else
                      BASE_FORMAT_VERSION)
    parts = [(SECTION_TENSORS, _pack_tensors(tensors))]
    parts += [(kind, bytes(body)) for kind, body in sorted(sections.items()) if kind != SECTION_TENSORS]
    offset = HEADER.size + SECTION_ENTRY.size * len(parts)
    directory, bodies = bytearray(), bytearray()
    for kind, body in parts:
        at = _pad8(offset)
        bodies += b"\0" * (at - offset) + body
        directory += SECTION_ENTRY.pack(kind, 0, at, len(body))
        offset = at + len(body)
    total = HEADER.size + len(directory) + len(bodies)
    head = HEADER.pack(MAGIC, version, HEADER.size, header.flags, header.library_version,
                       header.cudnn_version, header.arch, header.engine_family, 0, header.engine_id,
                       header.workspace_size, total, 0, len(parts))
    blob = bytearray(head + directory + bodies)
    struct.pack_into("<I", blob, _CHECKSUM_AT, zlib.crc32(blob))
    return bytes(blob)


def unpack_blob(data) -> UnpackedBlob:
    """The header, tensor table and sections of ``data``; ``PlanBlobError`` for bytes that are not a
    whole, intact blob of this format (``PlanVersionMismatchError`` for another format version)."""
    try:
        data = bytes(data)
    except (TypeError, ValueError) as exc:
        raise PlanBlobError(f"a plan blob is bytes (or a list of byte values); got {type(data).__name__} "
                            f"({exc})") from None
    if len(data) < len(MAGIC) or not data.startswith(MAGIC):
        raise PlanBlobError(f"not a cudnn_graph plan blob: it starts with {data[:len(MAGIC)]!r}, a blob with "
                            f"{MAGIC!r}", "magic")
    if len(data) < HEADER.size:
        raise PlanBlobError(f"the plan blob is truncated: {len(data)} bytes, shorter than its "
                            f"{HEADER.size}-byte header", "total_size")
    (_, version, header_size, flags, library, cudnn, arch, family, _, engine_id, workspace, total, checksum,
     count) = HEADER.unpack_from(data, 0)
    if version not in READABLE_FORMAT_VERSIONS:
        readable = ", ".join(map(str, READABLE_FORMAT_VERSIONS))
        raise PlanVersionMismatchError("format version", version, FORMAT_VERSION,
                                       f"this library reads format versions {readable}: serialize the plan again")
    if total != len(data):
        raise PlanBlobError(f"the plan blob is {len(data)} bytes, its header says {total} (truncated or "
                            f"padded)", "total_size")
    check = bytearray(data)
    struct.pack_into("<I", check, _CHECKSUM_AT, 0)
    if zlib.crc32(check) != checksum:
        raise PlanBlobError("the plan blob's checksum does not match its contents (corrupt)", "checksum")
    if header_size != HEADER.size or count > _MAX_SECTIONS or header_size + SECTION_ENTRY.size * count > total:
        raise PlanBlobError(f"the plan blob's header is malformed ({header_size}-byte header, {count} sections)",
                            "header_size")
    sections = {}
    for i in range(count):
        kind, _, offset, size = SECTION_ENTRY.unpack_from(data, header_size + SECTION_ENTRY.size * i)
        if offset + size > total:
            raise PlanBlobError(f"section {kind} runs past the end of the blob", "sections")
        sections[kind] = data[offset:offset + size]
    if SECTION_TENSORS not in sections:
        raise PlanBlobError("the plan blob has no tensor table", "tensors")
    header = PlanHeader(library, cudnn, arch, family, engine_id, workspace, flags, version)
    tensors = _unpack_tensors(sections.pop(SECTION_TENSORS))
    operands = sections.pop(SECTION_PLAN_OPERANDS, None)
    if operands is not None and version < PLAN_OPERANDS_FORMAT_VERSION:
        raise PlanBlobError(f"a format-{version} blob with a plan-operand section (section "
                            f"{SECTION_PLAN_OPERANDS} needs format version {PLAN_OPERANDS_FORMAT_VERSION}; corrupt)",
                            "plan operands")
    launch = sections.pop(SECTION_DSL_LAUNCH, None)
    if launch is not None and version < DSL_LAUNCH_FORMAT_VERSION:
        raise PlanBlobError(f"a format-{version} blob with a DSL launch section (section {SECTION_DSL_LAUNCH} "
                            f"needs format version {DSL_LAUNCH_FORMAT_VERSION}; corrupt)", "DSL launch")
    kernels = ()
    if launch is not None:
        from ._plan_launch import unpack_launch
        kernels = unpack_launch(launch, tensors, sections.get(SECTION_KERNELS, b""), version)
    return UnpackedBlob(header, tensors, sections,
                        () if operands is None else _unpack_plan_operands(operands, tensors), kernels)
