"""The plan blob's DSL launch section (7): what a reader with no Python needs to launch a DSL engine's
compiled kernels (the C runtime's cg_execute of a CuTe or a cuTile plan).

docs/plan_format.md specifies the bytes; ``cudnn_graph._plan_blob`` places the section in the blob and
calls ``unpack_launch`` with the tensor table. An engine's ``CompiledPlan.export_launch`` makes the
records (``LaunchKernel``): one per kernel launch, in launch order, each naming its calling convention,
the host entry, where its code is, and what goes into each argument slot (an operand's pointer, a scalar
read from host memory or fixed, an integer); a cuTile kernel (``CONVENTION_CUTILE_PARAMS``) has no slots
but a ``TileParams``: its grid, its prebuilt parameter image and the addresses each call writes into it.

Example:
    >>> from cudnn_graph._plan_launch import (CONVENTION_CUTE_PACKED, LaunchKernel, PointerSlot, ScalarSlot,
    ...                                       pack_launch, unpack_launch)
    >>> from cudnn_graph._plan_blob import TensorRecord
    >>> table = [TensorRecord(1, "a", 9, (8, 8), (8, 1), False, False, 16)]
    >>> kernel = LaunchKernel(CONVENTION_CUTE_PACKED, (PointerSlot(1, 16, "A"),) + (PointerSlot(),) * 5,
    ...                       (ScalarSlot(),) * 3, (8, 8, 8, 1), "_mlir_p__mlir_ciface_k", "p", "",
    ...                       code=b"\\x7fELF...")
    >>> unpack_launch(pack_launch([kernel]), table, None)[0].pointers[0]
    PointerSlot(uid=1, alignment=16, name='A')
"""
from __future__ import annotations

import dataclasses
import math
import re
import struct
from typing import Optional, Sequence

from ._plan_blob import DSL_LAUNCH_FORMAT_VERSION, TILE_LAUNCH_FORMAT_VERSION
from .errors import PlanBlobError

__all__ = ["CONVENTION_CUTE_PACKED", "CONVENTION_CUTILE_PARAMS", "CONVENTIONS", "CONVENTION_FORMAT_VERSIONS",
           "LaunchKernel", "PointerSlot", "ScalarSlot", "TileParams", "TileAddress", "pack_launch", "unpack_launch",
           "SCALAR_OPERAND", "SCALAR_FIXED", "MAX_LAUNCH_KERNELS", "MAX_LAUNCH_KERNELS_V3", "MAX_TILE_IMAGE",
           "MAX_TILE_PARAMETERS"]

# Calling conventions: how a kernel's host entry takes its arguments.
# 1: ``int32_t entry(void **args, int32_t num_args)``, args the addresses of the pointer cells, the f32
#    scalar cells, the int32 cells, the stream cell and the int32 result cell, in that order (the CuTe
#    DSL's export_to_c entry; engines/cute/_shared_launch.py). The code is a shared object whose outside
#    references are the DSL runtime library's; ``_mlir_<prefix>_cuda_init`` / ``_cuda_load_to_device``
#    load its module once and per device.
CONVENTION_CUTE_PACKED = 1
# 2: a cubin's kernel launched with cuLaunchKernel's ``kernelParams`` (one pointer per parameter into a
#    parameter image whose extents and strides the plan wrote; each call writes the operand and workspace
#    addresses into a copy of it), block and shared memory as recorded: a cuTile plan's kernels
#    (engines/cutile/_c_launch.py). The code is the cubin, loaded once per plan on its device.
CONVENTION_CUTILE_PARAMS = 2
# convention -> (pointer slots, scalar slots, int slots) the entry reads, fixed by the convention (a cuTile
# kernel's arguments are its TileParams, which follow the head instead)
CONVENTIONS = {CONVENTION_CUTE_PACKED: (6, 3, 4), CONVENTION_CUTILE_PARAMS: (0, 0, 0)}
# convention -> the first blob format version that may hold it (_plan_blob writes the lowest that holds all)
CONVENTION_FORMAT_VERSIONS = {CONVENTION_CUTE_PACKED: DSL_LAUNCH_FORMAT_VERSION,
                              CONVENTION_CUTILE_PARAMS: TILE_LAUNCH_FORMAT_VERSION}

SCALAR_OPERAND = 1           # read from the host memory bound to a pass-by-value uid (the caller's or section 6's)
SCALAR_FIXED = 2             # a value of the plan's own (an unused slot is fixed 0.0)
_READ_TYPES = {0: "<f", 1: "<d"}   # cudnnDataType_t FLOAT, DOUBLE

_FLAG_CODE_IN_KERNELS = 1    # the code is a byte range of section 5 (else it follows the record)
_FLAG_POINTER_BOUND = 1      # the pointer slot carries an operand (else the placeholder address)
_ADDRESS_OPERAND = 1         # a cuTile address: an operand's pointer
_ADDRESS_WORKSPACE = 2       # a cuTile address: the workspace plus ``add`` bytes

_SECTION_HEAD = struct.Struct("<II")              # kernel count, reserved
# convention, flags, pointer / scalar / int slot counts, entry symbol / function prefix / runtime hint
# lengths, placeholder address, code offset, code size, reserved
_KERNEL_HEAD = struct.Struct("<HHHHHHHHQQQQ")
_POINTER = struct.Struct("<qIHH")                 # uid, alignment, flags, name length
_SCALAR = struct.Struct("<qHHid")                 # uid, kind, flags, read type, fixed value
_INT = struct.Struct("<q")
# convention 2: grid x, y, z, block x, y, z, shared bytes, image size, parameter count, address count,
# reserved, workspace bytes
_TILE_HEAD = struct.Struct("<IIIIIIIIHHIQ")
_TILE_PARAMETER = struct.Struct("<II")             # offset in the image, size
# uid, add, offset in the image, alignment, source, name length, reserved
_TILE_ADDRESS = struct.Struct("<qqIIHHI")
assert _KERNEL_HEAD.size == 48 and _POINTER.size == 16 and _SCALAR.size == 24
assert _TILE_HEAD.size == 48 and _TILE_PARAMETER.size == 8 and _TILE_ADDRESS.size == 32

MAX_LAUNCH_KERNELS = 32      # a cuTile backward plan launches up to 11 kernels, a segmented forward 2 + 3 x 8
MAX_LAUNCH_KERNELS_V3 = 8    # a format-3 blob's bound (more is format version 4)
MAX_TILE_IMAGE = 4096        # bytes of one kernel's parameters (the classic CUDA limit; the C runtime's stack copy)
MAX_TILE_PARAMETERS = 256
_MAX_TILE_ADDRESSES = 64
_MAX_GRID_X = 2 ** 31 - 1
_MAX_GRID_YZ = 65535
_MAX_BLOCK_THREADS = 1024
_MAX_SHARED_BYTES = 1 << 20
_MAX_WORKSPACE = 1 << 40
_MAX_SLOTS = 64
_MAX_SYMBOL = 1024
_MAX_HINT = 4096
_MAX_NAME = 256
_SYMBOL = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class PointerSlot:
    """An entry's pointer argument: operand ``uid`` (None: unused, the placeholder is passed), the address
    alignment the kernel needs in bytes (0: none), and the slot's name for messages ("A", "output")."""
    uid: Optional[int] = None
    alignment: int = 0
    name: str = ""


@dataclasses.dataclass(frozen=True)
class ScalarSlot:
    """An entry's scalar argument: read from the host memory of the pass-by-value ``uid`` as ``read_type``
    (cudnnDataType_t FLOAT 0 or DOUBLE 1), or ``value`` when ``uid`` is None."""
    uid: Optional[int] = None
    read_type: int = 0
    value: float = 0.0


@dataclasses.dataclass(frozen=True)
class TileAddress:
    """An address a cuTile kernel's call writes into its parameter image: 8 bytes at image ``offset`` (a
    parameter's), the pointer of operand ``uid`` or, for ``uid`` None, the workspace plus ``add`` bytes (a
    scratch region); ``alignment``: what the kernel was compiled to assume of it (0: nothing)."""
    offset: int
    uid: Optional[int] = None
    add: int = 0
    alignment: int = 0
    name: str = ""


@dataclasses.dataclass(frozen=True)
class TileParams:
    """A cuTile kernel's launch (convention 2): ``grid``, ``block``, ``shared_bytes``; ``image``, the
    parameter buffer with everything but the addresses written; ``parameters``, ``(offset, size)`` of each
    parameter in it (cuLaunchKernel gets a pointer to each); ``addresses``, the TileAddress records;
    ``workspace_size``, the bytes of workspace the kernel's workspace addresses index into."""
    grid: tuple
    image: bytes
    parameters: tuple
    addresses: tuple = ()
    workspace_size: int = 0
    block: tuple = (1, 1, 1)
    shared_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class LaunchKernel:
    """One kernel launch of a plan. The code is ``code`` (inline) or, when ``code`` is empty, bytes
    ``[code_offset, code_offset + code_size)`` of the blob's kernels section (5). ``tile``: a convention-2
    kernel's launch (None for the others); ``entry_symbol`` is then the cubin's kernel and there is no
    function prefix, runtime hint or placeholder."""
    convention: int
    pointers: tuple
    scalars: tuple
    ints: tuple
    entry_symbol: str
    function_prefix: str
    runtime_hint: str = ""              # the DSL runtime library's path where the plan was serialized
    code: bytes = b""
    code_offset: int = 0
    code_size: int = 0
    placeholder: int = 0                # the address an unused pointer slot passes
    tile: Optional[TileParams] = None


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (_pad8(len(data)) - len(data))


def _fail(message: str) -> PlanBlobError:
    return PlanBlobError(message, "DSL launch")


def pack_launch(kernels: Sequence[LaunchKernel]) -> bytes:
    """Section 7's bytes for ``kernels`` (checked as a reader checks them, but against no tensor table)."""
    out = bytearray(_SECTION_HEAD.pack(len(kernels), 0))
    for k in kernels:
        symbol, prefix, hint = (s.encode("utf-8") for s in (k.entry_symbol, k.function_prefix, k.runtime_hint))
        inline = bytes(k.code)
        flags = 0 if inline else _FLAG_CODE_IN_KERNELS
        size = len(inline) if inline else int(k.code_size)
        out += _KERNEL_HEAD.pack(k.convention, flags, len(k.pointers), len(k.scalars), len(k.ints), len(symbol),
                                 len(prefix), len(hint), int(k.placeholder), 0 if inline else int(k.code_offset),
                                 size, 0)
        for p in k.pointers:
            name = p.name.encode("utf-8")
            out += _POINTER.pack(0 if p.uid is None else int(p.uid), int(p.alignment),
                                 0 if p.uid is None else _FLAG_POINTER_BOUND, len(name)) + _padded(name)
        for s in k.scalars:
            kind = SCALAR_FIXED if s.uid is None else SCALAR_OPERAND
            out += _SCALAR.pack(0 if s.uid is None else int(s.uid), kind, 0, int(s.read_type), float(s.value))
        for value in k.ints:
            out += _INT.pack(int(value))
        if k.convention == CONVENTION_CUTILE_PARAMS:
            if k.tile is None:
                raise _fail("a cuTile launch record (convention 2) without its TileParams")
            out += _pack_tile(k.tile)
        elif k.tile is not None:
            raise _fail(f"a convention-{k.convention} launch record with TileParams")
        out += _padded(symbol) + _padded(prefix) + _padded(hint) + _padded(inline)
    data = bytes(out)
    unpack_launch(data, None, None)            # a writer bug is caught here, not by a reader later
    return data


def _pack_tile(t: TileParams) -> bytes:
    image = bytes(t.image)
    out = bytearray(_TILE_HEAD.pack(*(int(g) for g in t.grid), *(int(b) for b in t.block), int(t.shared_bytes),
                                    len(image), len(t.parameters), len(t.addresses), 0, int(t.workspace_size)))
    for offset, size in t.parameters:
        out += _TILE_PARAMETER.pack(int(offset), int(size))
    for a in t.addresses:
        name = a.name.encode("utf-8")
        source = _ADDRESS_WORKSPACE if a.uid is None else _ADDRESS_OPERAND
        out += _TILE_ADDRESS.pack(0 if a.uid is None else int(a.uid), int(a.add), int(a.offset), int(a.alignment),
                                  source, len(name), 0) + _padded(name)
    return bytes(out + _padded(image))


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int, what: str) -> bytes:
        if _pad8(n) > len(self.data) - self.at:
            raise _fail(f"the DSL launch section is cut short at {what} (corrupt)")
        chunk = self.data[self.at:self.at + n]
        self.at += _pad8(n)
        return chunk

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        return layout.unpack(self.take(layout.size, what))


def _text(raw: bytes, what: str, symbol: bool) -> str:
    """A string of the section: a symbol must be a C identifier; a name or path is only shown or opened,
    so its bytes are taken as they are (as the C runtime takes them)."""
    if symbol and not _SYMBOL.match(raw):
        raise _fail(f"{what} {raw[:80]!r} is not a C identifier (corrupt)")
    return raw.decode("utf-8", errors="replace")


def _check_kernel(k: LaunchKernel, index: int, rows: Optional[dict]) -> None:
    where = f"DSL launch kernel {index}"
    for i, p in enumerate(k.pointers):
        if p.alignment & (p.alignment - 1):
            raise _fail(f"{where}: pointer slot {i} ('{p.name}') requires {p.alignment}-byte alignment, not a "
                        f"power of two (corrupt)")
        if rows is not None and p.uid is not None:
            row = rows.get(p.uid)
            if row is None or row.is_virtual or row.is_pass_by_value:
                raise _fail(f"{where}: pointer slot {i} ('{p.name}') is uid {p.uid}, no device operand of the "
                            f"tensor table (corrupt)")
    for i, s in enumerate(k.scalars):
        if s.uid is None:
            if not math.isfinite(s.value):
                raise _fail(f"{where}: scalar slot {i} is fixed at {s.value} (corrupt)")
            continue
        if s.read_type not in _READ_TYPES:
            raise _fail(f"{where}: scalar slot {i} reads data type {s.read_type}; FLOAT (0) or DOUBLE (1) "
                        f"(corrupt)")
        if rows is not None:
            row = rows.get(s.uid)
            if row is None or row.is_virtual or not row.is_pass_by_value:
                raise _fail(f"{where}: scalar slot {i} is uid {s.uid}, no pass-by-value operand of the tensor "
                            f"table (corrupt)")
    if k.convention == CONVENTION_CUTE_PACKED:
        for i, v in enumerate(k.ints):
            if not -2 ** 31 <= v < 2 ** 31:
                raise _fail(f"{where}: int slot {i} = {v} does not fit the entry's int32 (corrupt)")
    if k.convention == CONVENTION_CUTILE_PARAMS:
        _check_tile(k.tile, where, rows)


def _check_tile(t: TileParams, where: str, rows: Optional[dict]) -> None:
    """A cuTile launch a reader could launch safely: the grid and block in CUDA's ranges, each parameter
    inside the image, each address on an 8-byte parameter, bound to a device operand or inside the
    workspace (the C runtime checks the same, in the same words)."""
    gx, gy, gz = t.grid
    if not (1 <= gx <= _MAX_GRID_X and 1 <= gy <= _MAX_GRID_YZ and 1 <= gz <= _MAX_GRID_YZ):
        raise _fail(f"{where}: grid ({gx}, {gy}, {gz}) (x 1 to {_MAX_GRID_X}, y and z 1 to {_MAX_GRID_YZ}; corrupt)")
    bx, by, bz = t.block
    if min(bx, by, bz) < 1 or bx * by * bz > _MAX_BLOCK_THREADS or t.shared_bytes > _MAX_SHARED_BYTES:
        raise _fail(f"{where}: block ({bx}, {by}, {bz}) with {t.shared_bytes} bytes of shared memory (at most "
                    f"{_MAX_BLOCK_THREADS} threads and {_MAX_SHARED_BYTES} bytes; corrupt)")
    size = len(t.image)                        # its bounds and the counts were checked as it was read
    end, pointers = 0, set()
    for i, (offset, length) in enumerate(t.parameters):
        if length < 1 or offset < end or offset + length > size:
            raise _fail(f"{where}: parameter {i} is bytes {offset}..{offset + length} of the {size}-byte image "
                        f"(parameters lie inside it, in order, apart; corrupt)")
        end = offset + length
        if length == 8:
            pointers.add(offset)
    written = set()
    for i, a in enumerate(t.addresses):
        what = f"{where}: address {i} ('{a.name}')"
        if a.offset not in pointers:
            raise _fail(f"{what} goes at image offset {a.offset}, which is no 8-byte parameter (corrupt)")
        if a.offset in written:
            raise _fail(f"{what} writes image offset {a.offset} again (corrupt)")
        written.add(a.offset)
        if a.alignment & (a.alignment - 1):
            raise _fail(f"{what} requires {a.alignment}-byte alignment, not a power of two (corrupt)")
        if a.uid is None:
            if not 0 <= a.add < t.workspace_size:
                raise _fail(f"{what} is workspace + {a.add}, outside the kernel's {t.workspace_size}-byte workspace "
                            f"(corrupt)")
            continue
        if a.add:
            raise _fail(f"{what} adds {a.add} bytes to operand uid {a.uid}'s pointer, which is passed as it is "
                        f"(corrupt)")
        if rows is not None:
            row = rows.get(a.uid)
            if row is None or row.is_virtual or row.is_pass_by_value:
                raise _fail(f"{what} is uid {a.uid}, no device operand of the tensor table (corrupt)")


def unpack_launch(data: bytes, tensors: Optional[Sequence], kernels_section: Optional[bytes],
                  format_version: Optional[int] = None) -> tuple:
    """The ``LaunchKernel`` records of section 7's ``data``, checked against the tensor table ``tensors``,
    the blob's kernels section and its ``format_version`` (None: not checked); ``PlanBlobError`` (field
    ``DSL launch``) for a section a reader could not launch from. The C runtime refuses the same sections."""
    reader = _Reader(bytes(data))
    count, _ = reader.unpack(_SECTION_HEAD, "its head")
    if not 1 <= count <= MAX_LAUNCH_KERNELS:
        raise _fail(f"the DSL launch section says {count} kernels (1 to {MAX_LAUNCH_KERNELS}; corrupt)")
    if format_version is not None and format_version < TILE_LAUNCH_FORMAT_VERSION and count > MAX_LAUNCH_KERNELS_V3:
        raise _fail(f"the DSL launch section says {count} kernels in a format-{format_version} blob (1 to "
                    f"{MAX_LAUNCH_KERNELS_V3} before format version {TILE_LAUNCH_FORMAT_VERSION}; corrupt)")
    rows = None if tensors is None else {t.uid: t for t in tensors}
    out = []
    for index in range(count):
        where = f"DSL launch kernel {index}"
        (convention, flags, n_pointers, n_scalars, n_ints, n_symbol, n_prefix, n_hint, placeholder, code_offset,
         code_size, _) = reader.unpack(_KERNEL_HEAD, where)
        want = CONVENTIONS.get(convention)
        if want is None:
            raise _fail(f"{where}: unknown calling convention {convention} (corrupt, or a newer writer)")
        first = CONVENTION_FORMAT_VERSIONS[convention]
        if format_version is not None and format_version < first:
            raise _fail(f"{where}: calling convention {convention} in a format-{format_version} blob (it needs "
                        f"format version {first}; corrupt)")
        if flags & ~_FLAG_CODE_IN_KERNELS:
            raise _fail(f"{where}: flags 0x{flags:x} (corrupt)")
        if (n_pointers, n_scalars, n_ints) != want:
            raise _fail(f"{where}: {n_pointers} pointer, {n_scalars} scalar and {n_ints} int slots; convention "
                        f"{convention} takes {want[0]}, {want[1]} and {want[2]} (corrupt)")
        tile_kernel = convention == CONVENTION_CUTILE_PARAMS
        if tile_kernel and (n_prefix or n_hint or placeholder):
            raise _fail(f"{where}: a {n_prefix}-byte function prefix, {n_hint}-byte runtime hint and placeholder "
                        f"0x{placeholder:x}; convention {convention} has none (corrupt)")
        if not (1 <= n_symbol <= _MAX_SYMBOL and (tile_kernel or 1 <= n_prefix <= _MAX_SYMBOL) and n_hint <= _MAX_HINT):
            raise _fail(f"{where}: a {n_symbol}-byte entry symbol, {n_prefix}-byte function prefix or "
                        f"{n_hint}-byte runtime hint (corrupt)")
        pointers = []
        for i in range(n_pointers):
            uid, alignment, pflags, n_name = reader.unpack(_POINTER, f"{where}, pointer slot {i}")
            if pflags & ~_FLAG_POINTER_BOUND or n_name > _MAX_NAME:
                raise _fail(f"{where}: pointer slot {i} has flags 0x{pflags:x} and a {n_name}-byte name (corrupt)")
            name = _text(reader.take(n_name, f"{where}, pointer slot {i}"), f"{where}: pointer slot {i}'s name",
                         False)
            pointers.append(PointerSlot(uid if pflags & _FLAG_POINTER_BOUND else None, alignment, name))
        scalars = []
        for i in range(n_scalars):
            uid, kind, sflags, read_type, value = reader.unpack(_SCALAR, f"{where}, scalar slot {i}")
            if kind not in (SCALAR_OPERAND, SCALAR_FIXED) or sflags:
                raise _fail(f"{where}: scalar slot {i} has kind {kind} and flags 0x{sflags:x} (corrupt)")
            scalars.append(ScalarSlot(uid, read_type) if kind == SCALAR_OPERAND else ScalarSlot(value=value))
        ints = tuple(reader.unpack(_INT, f"{where}, int slot {i}")[0] for i in range(n_ints))
        tile = _unpack_tile(reader, where) if tile_kernel else None
        symbol = _text(reader.take(n_symbol, f"{where}'s entry symbol"), f"{where}: the entry symbol", True)
        prefix = _text(reader.take(n_prefix, f"{where}'s function prefix"), f"{where}: the function prefix",
                       not tile_kernel)
        hint = _text(reader.take(n_hint, f"{where}'s runtime hint"), f"{where}: the runtime hint", False)
        if code_size == 0:
            raise _fail(f"{where}: no code (corrupt)")
        code = b""
        if flags & _FLAG_CODE_IN_KERNELS:
            if kernels_section is not None and (code_offset > len(kernels_section) or
                                                code_size > len(kernels_section) - code_offset):
                raise _fail(f"{where}: its code is bytes {code_offset}..{code_offset + code_size} of the kernels "
                            f"section, which has {len(kernels_section)} bytes (corrupt)")
        else:
            if code_offset:
                raise _fail(f"{where}: inline code at offset {code_offset} (corrupt)")
            code = reader.take(code_size, f"{where}'s code")
        kernel = LaunchKernel(convention, tuple(pointers), tuple(scalars), ints, symbol, prefix, hint, code,
                              0 if code else code_offset, 0 if code else code_size, placeholder, tile)
        _check_kernel(kernel, index, rows)
        out.append(kernel)
    if reader.at != len(reader.data):
        raise _fail(f"the DSL launch section has {len(reader.data) - reader.at} bytes past its last kernel "
                    f"(corrupt)")
    return tuple(out)


def _unpack_tile(reader: _Reader, where: str) -> TileParams:
    """A convention-2 kernel's TileParams (checked by _check_tile once the whole record is read)."""
    (gx, gy, gz, bx, by, bz, shared, size, n_parameters, n_addresses, reserved,
     workspace) = reader.unpack(_TILE_HEAD, f"{where}'s launch")
    if reserved or not (1 <= size <= MAX_TILE_IMAGE and 1 <= n_parameters <= MAX_TILE_PARAMETERS and
                        n_addresses <= _MAX_TILE_ADDRESSES and workspace <= _MAX_WORKSPACE):
        raise _fail(f"{where}: a {size}-byte parameter image with {n_parameters} parameters, {n_addresses} "
                    f"addresses and {workspace} bytes of workspace (1 to {MAX_TILE_IMAGE} bytes, 1 to "
                    f"{MAX_TILE_PARAMETERS} parameters, at most {_MAX_TILE_ADDRESSES} addresses; corrupt)")
    parameters = tuple(reader.unpack(_TILE_PARAMETER, f"{where}, parameter {i}") for i in range(n_parameters))
    addresses = []
    for i in range(n_addresses):
        uid, add, offset, alignment, source, n_name, areserved = reader.unpack(_TILE_ADDRESS, f"{where}, address {i}")
        if source not in (_ADDRESS_OPERAND, _ADDRESS_WORKSPACE) or areserved or n_name > _MAX_NAME or \
                (source == _ADDRESS_WORKSPACE and uid):
            raise _fail(f"{where}: address {i} has source {source}, uid {uid} and a {n_name}-byte name (corrupt)")
        name = _text(reader.take(n_name, f"{where}, address {i}"), f"{where}: address {i}'s name", False)
        addresses.append(TileAddress(offset, uid if source == _ADDRESS_OPERAND else None, add, alignment, name))
    image = reader.take(size, f"{where}'s parameter image")
    return TileParams((gx, gy, gz), image, parameters, tuple(addresses), workspace, (bx, by, bz), shared)
