"""The kernel-parameter ABI of a cuTile kernel, as execute()'s C launch path relies on it.

cuTile (``cuda.tile`` 1.7, calling convention ``cutile_python_v1``) flattens a kernel's arguments in
order: a ``ct.Constant`` argument is folded into the code and takes no parameter; an array argument
becomes ``1 + 2 * ndim`` parameters: its base address (8 bytes), then its extents, then its strides in
elements (``index_dtype``: int32 here, 4 bytes each). The parameters sit in that order in the kernel's
parameter buffer at C alignment (each at a multiple of its own size). Tile kernels launch with one
thread per block (the driver sizes the block from the cubin) and no dynamic shared memory.

Nothing of that is a documented contract, so the C path checks it: ``cubin_parameters`` reads the cubin's
own parameter table (the ``.nv.info.<symbol>`` section's EIATTR_KPARAM_INFO records: ordinal, offset,
size) and ``ParamLayout.check_against`` compares it with the layout computed here, and a plan whose
kernels disagree stays on the Python path (tests/engines/cutile/test_cutile_abi.py pins it in CI).
docs/engines_cutile.md ("Launching from C") writes the same down.
"""
from __future__ import annotations

import dataclasses
import struct

POINTER_BYTES = 8
INDEX_BYTES = 4            # int32 extents and strides (the engine's arrays use index_dtype=int32)

# .nv.info record formats and the attributes read here (the CUDA ELF "EIATTR" numbering).
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
EIATTR_KPARAM_INFO = 0x17
EIATTR_KPARAM_INFO_V2 = 0x45          # what tileiras 13.4 writes: the size in the flags' low 16 bits
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_REQNTID = 0x10


class AbiMismatchError(ValueError):
    """A cubin's parameter table is not the layout the C launch path would write."""


@dataclasses.dataclass(frozen=True)
class Field:
    """One kernel parameter: which argument it comes from and what it holds."""
    arg: int              # position among the kernel's Python arguments
    role: str             # "address" | "extent" | "stride"
    dim: int              # the axis of an extent / stride (0 for an address)
    offset: int
    size: int


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each parameter of one kernel sits in its parameter buffer."""
    fields: tuple
    size: int

    @staticmethod
    def of(arg_kinds) -> "ParamLayout":
        """``arg_kinds``: per kernel argument, its array rank, or None for a constant (no parameter).

        >>> ParamLayout.of([2, None, 1]).size          # ptr, 2 + 2 int32, ptr, 1 + 1 int32
        40
        """
        fields, offset = [], 0

        def put(arg, role, dim, size):
            nonlocal offset
            offset = -(-offset // size) * size
            fields.append(Field(arg, role, dim, offset, size))
            offset += size

        for arg, ndim in enumerate(arg_kinds):
            if ndim is None:
                continue
            put(arg, "address", 0, POINTER_BYTES)
            for role in ("extent", "stride"):
                for d in range(ndim):
                    put(arg, role, d, INDEX_BYTES)
        return ParamLayout(tuple(fields), offset)

    @property
    def offsets(self) -> tuple:
        return tuple(f.offset for f in self.fields)

    def check_against(self, table) -> None:
        """Raise AbiMismatchError unless ``table`` (``cubin_parameters``' records) is this layout."""
        ours = [(i, f.offset, f.size) for i, f in enumerate(self.fields)]
        theirs = sorted((p.ordinal, p.offset, p.size) for p in table.params)
        if ours != theirs:
            raise AbiMismatchError(f"kernel {table.symbol}: the cubin's parameters (ordinal, offset, size) are "
                                   f"{theirs}; the C launch path would write {ours}")
        # The constant bank may be larger than the parameters (e.g. 752 bytes for chunk_prepare's 304):
        # the tail is the driver's, filled by the tile kernel's own host-side hooks at each launch from
        # the parameters passed (one pointer per parameter, as cuda.tile launches: never one buffer).
        if table.size is not None and table.size < self.size:
            raise AbiMismatchError(f"kernel {table.symbol}: the cubin's parameter bank is {table.size} bytes; "
                                   f"the C launch path would write {self.size}")


@dataclasses.dataclass(frozen=True)
class CubinParam:
    ordinal: int
    offset: int
    size: int


@dataclasses.dataclass(frozen=True)
class CubinKernel:
    """What a cubin says of one kernel entry: its parameters, their total size and its block size."""
    symbol: str
    params: tuple
    size: int | None
    block: tuple | None


def _sections(elf: bytes) -> dict:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise AbiMismatchError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    out = {}
    for name, _type, _flags, _addr, offset, size in headers:
        start = names_at + name
        out[elf[start:elf.index(b"\0", start)].decode()] = elf[offset:offset + size]
    return out


def _records(info: bytes):
    i = 0
    while i + 2 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == _EIFMT_NVAL:
            value, i = None, i + 4          # records stay 4-byte aligned: two bytes of padding
        elif fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
            value, i = struct.unpack_from("<H", info, i + 2)[0], i + 4
        elif fmt == _EIFMT_SVAL:
            n, = struct.unpack_from("<H", info, i + 2)
            value, i = info[i + 4:i + 4 + n], i + 4 + n
        else:
            raise AbiMismatchError(f"unknown .nv.info record format {fmt}")
        yield attr, value


def kernel_symbols(cubin: bytes) -> list:
    """The kernel entries a cubin holds (from its per-kernel .nv.info sections)."""
    return [name[len(".nv.info."):] for name in _sections(cubin) if name.startswith(".nv.info.")]


def cubin_parameters(cubin: bytes, symbol: str) -> CubinKernel:
    """The parameter table the cubin records for kernel ``symbol``: per parameter an EIATTR_KPARAM_INFO
    record (u32 index, u16 ordinal, u16 offset, u32 flags whose bits 18-31 are its size in bytes) or an
    EIATTR_KPARAM_INFO_V2 one (the same fields, the size in the flags' bits 0-15)."""
    info = _sections(cubin).get(f".nv.info.{symbol}")
    if info is None:
        raise AbiMismatchError(f"the cubin has no kernel {symbol} (it has {kernel_symbols(cubin)})")
    params, size, block = [], None, None
    for attr, value in _records(info):
        if attr == EIATTR_KPARAM_INFO:
            _index, ordinal, offset, flags = struct.unpack("<IHHI", value[:12])
            params.append(CubinParam(ordinal, offset, (flags >> 18) & 0x3FFF))
        elif attr == EIATTR_KPARAM_INFO_V2:
            _index, ordinal, offset, flags = struct.unpack("<IHHI", value[:12])
            params.append(CubinParam(ordinal, offset, flags & 0xFFFF))
        elif attr == EIATTR_CBANK_PARAM_SIZE:
            size = value
        elif attr == EIATTR_REQNTID:
            block = struct.unpack("<III", value[:12])
    return CubinKernel(symbol, tuple(sorted(params, key=lambda p: p.ordinal)), size, block)
