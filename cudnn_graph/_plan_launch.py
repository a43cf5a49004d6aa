"""The plan blob's DSL launch section (7): what a reader with no Python needs to launch a DSL engine's
compiled kernels (the C runtime's cg_execute of a CuTe plan).

docs/plan_format.md specifies the bytes; ``cudnn_graph._plan_blob`` places the section in the blob and
calls ``unpack_launch`` with the tensor table. An engine's ``CompiledPlan.export_launch`` makes the
records (``LaunchKernel``): one per kernel launch, in launch order, each naming its calling convention,
the host entry, where its code is, and what goes into each argument slot (an operand's pointer, a scalar
read from host memory or fixed, an integer).

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

from .errors import PlanBlobError

__all__ = ["CONVENTION_CUTE_PACKED", "CONVENTIONS", "LaunchKernel", "PointerSlot", "ScalarSlot", "pack_launch",
           "unpack_launch", "SCALAR_OPERAND", "SCALAR_FIXED", "MAX_LAUNCH_KERNELS"]

# Calling conventions: how a kernel's host entry takes its arguments.
# 1: ``int32_t entry(void **args, int32_t num_args)``, args the addresses of the pointer cells, the f32
#    scalar cells, the int32 cells, the stream cell and the int32 result cell, in that order (the CuTe
#    DSL's export_to_c entry; engines/cute/_shared_launch.py). The code is a shared object whose outside
#    references are the DSL runtime library's; ``_mlir_<prefix>_cuda_init`` / ``_cuda_load_to_device``
#    load its module once and per device.
CONVENTION_CUTE_PACKED = 1
# convention -> (pointer slots, scalar slots, int slots) the entry reads, fixed by the convention
CONVENTIONS = {CONVENTION_CUTE_PACKED: (6, 3, 4)}

SCALAR_OPERAND = 1           # read from the host memory bound to a pass-by-value uid (the caller's or section 6's)
SCALAR_FIXED = 2             # a value of the plan's own (an unused slot is fixed 0.0)
_READ_TYPES = {0: "<f", 1: "<d"}   # cudnnDataType_t FLOAT, DOUBLE

_FLAG_CODE_IN_KERNELS = 1    # the code is a byte range of section 5 (else it follows the record)
_FLAG_POINTER_BOUND = 1      # the pointer slot carries an operand (else the placeholder address)

_SECTION_HEAD = struct.Struct("<II")              # kernel count, reserved
# convention, flags, pointer / scalar / int slot counts, entry symbol / function prefix / runtime hint
# lengths, placeholder address, code offset, code size, reserved
_KERNEL_HEAD = struct.Struct("<HHHHHHHHQQQQ")
_POINTER = struct.Struct("<qIHH")                 # uid, alignment, flags, name length
_SCALAR = struct.Struct("<qHHid")                 # uid, kind, flags, read type, fixed value
_INT = struct.Struct("<q")
assert _KERNEL_HEAD.size == 48 and _POINTER.size == 16 and _SCALAR.size == 24

MAX_LAUNCH_KERNELS = 8
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
class LaunchKernel:
    """One kernel launch of a plan. The code is ``code`` (inline) or, when ``code`` is empty, bytes
    ``[code_offset, code_offset + code_size)`` of the blob's kernels section (5)."""
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
        out += _padded(symbol) + _padded(prefix) + _padded(hint) + _padded(inline)
    data = bytes(out)
    unpack_launch(data, None, None)            # a writer bug is caught here, not by a reader later
    return data


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


def unpack_launch(data: bytes, tensors: Optional[Sequence], kernels_section: Optional[bytes]) -> tuple:
    """The ``LaunchKernel`` records of section 7's ``data``, checked against the tensor table ``tensors``
    and the blob's kernels section (None: not checked); ``PlanBlobError`` (field ``DSL launch``) for a
    section a reader could not launch from. The C runtime refuses the same sections."""
    reader = _Reader(bytes(data))
    count, _ = reader.unpack(_SECTION_HEAD, "its head")
    if not 1 <= count <= MAX_LAUNCH_KERNELS:
        raise _fail(f"the DSL launch section says {count} kernels (1 to {MAX_LAUNCH_KERNELS}; corrupt)")
    rows = None if tensors is None else {t.uid: t for t in tensors}
    out = []
    for index in range(count):
        where = f"DSL launch kernel {index}"
        (convention, flags, n_pointers, n_scalars, n_ints, n_symbol, n_prefix, n_hint, placeholder, code_offset,
         code_size, _) = reader.unpack(_KERNEL_HEAD, where)
        want = CONVENTIONS.get(convention)
        if want is None:
            raise _fail(f"{where}: unknown calling convention {convention} (corrupt, or a newer writer)")
        if flags & ~_FLAG_CODE_IN_KERNELS:
            raise _fail(f"{where}: flags 0x{flags:x} (corrupt)")
        if (n_pointers, n_scalars, n_ints) != want:
            raise _fail(f"{where}: {n_pointers} pointer, {n_scalars} scalar and {n_ints} int slots; convention "
                        f"{convention} takes {want[0]}, {want[1]} and {want[2]} (corrupt)")
        if not (1 <= n_symbol <= _MAX_SYMBOL and 1 <= n_prefix <= _MAX_SYMBOL and n_hint <= _MAX_HINT):
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
        symbol = _text(reader.take(n_symbol, f"{where}'s entry symbol"), f"{where}: the entry symbol", True)
        prefix = _text(reader.take(n_prefix, f"{where}'s function prefix"), f"{where}: the function prefix", True)
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
                              0 if code else code_offset, 0 if code else code_size, placeholder)
        _check_kernel(kernel, index, rows)
        out.append(kernel)
    if reader.at != len(reader.data):
        raise _fail(f"the DSL launch section has {len(reader.data) - reader.at} bytes past its last kernel "
                    f"(corrupt)")
    return tuple(out)
