#!/usr/bin/env python3
"""The cuDNN ABI from one source: include/cudnn_graph/cudnn_backend.h.

The header is written by hand (values read from the official cuDNN headers); everything else that
spells the ABI out is made from it here, so no name or value is written twice:

  --names OUT   the Python name tables the runtime looks names up in (DESCRIPTOR_TYPES,
                ATTRIBUTE_TYPES, ATTRIBUTES: name -> value; STATUS_NAMES: value -> name). meson runs
                this at build time; the module is installed as cudnn_graph._cudnn_names.
  --pxd OUT     the Cython view of the header (src/cudnn_graph/_cudnn_abi.pxd). Cython resolves
                cimports from the source tree, so this file is committed; tests/test_cudnn_abi.py
                checks that it is exactly what this tool makes from the header.

Usage: python tools/gen_cudnn_abi.py [--names OUT] [--pxd OUT] [HEADER]
Standard library only (runs at build time with the build's Python, >= 3.10).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HEADER = Path(__file__).resolve().parents[1] / "include" / "cudnn_graph" / "cudnn_backend.h"

# The enum types whose members the runtime looks up by name, and the table each becomes.
NAME_TABLES = {
    "DESCRIPTOR_TYPES": "cudnnBackendDescriptorType_t",
    "ATTRIBUTE_TYPES": "cudnnBackendAttributeType_t",
    "ATTRIBUTES": "cudnnBackendAttributeName_t",
}
STATUS_TYPE = "cudnnStatus_t"


@dataclass
class Member:
    name: str
    value: int
    note: str          # the header's trailing comment ("since 9.5.0", "deprecated") or ""


@dataclass
class Enum:
    type_name: str
    members: list[Member]


@dataclass
class FunctionPointer:
    return_type: str
    name: str
    parameters: list[tuple[str, str]]    # (type, name); empty for (void)


@dataclass
class Abi:
    defines: list[tuple[str, int]] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)                            # typedef void *X;
    structs: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)   # (name, fields)
    enums: list[Enum] = field(default_factory=list)
    functions: list[FunctionPointer] = field(default_factory=list)

    def enum(self, type_name: str) -> Enum:
        for found in self.enums:
            if found.type_name == type_name:
                return found
        raise KeyError(f"the header declares no enum type {type_name}")


_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_MEMBER = re.compile(r"^\s*(CUDNN_\w+)\s*=\s*(-?\d+)\s*,?\s*(?:/\*\s*(.*?)\s*\*/)?\s*$")


def _c_type(text: str) -> str:
    """A C type spelled the Cython way: ``const char *`` -> ``const char*``."""
    text = " ".join(text.split())
    return re.sub(r"\s*\*", "*", text)


def _split_declarator(text: str) -> tuple[str, str]:
    """``cudnnHandle_t *handle`` -> (``cudnnHandle_t*``, ``handle``)."""
    match = re.fullmatch(r"(.*?[\s*])(\w+)", " ".join(text.split()))
    if match is None:
        raise ValueError(f"cannot read the declaration {text!r}")
    return _c_type(match.group(1)), match.group(2)


def parse_header(text: str) -> Abi:
    """Everything the header declares, in header order. Raises ValueError on a line it cannot read,
    so a header edit this tool does not understand stops the build instead of being skipped."""
    abi = Abi()
    for name, value in re.findall(r"^#define\s+(CG_\w+)\s+(\d+)", text, re.M):
        abi.defines.append((name, int(value)))
    code = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    abi.opaque = re.findall(r"^typedef\s+void\s*\*\s*(\w+)\s*;", code, re.M)
    for body, name in re.findall(r"^typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", code, re.M | re.S):
        fields = [_split_declarator(decl) for decl in body.split(";") if decl.strip()]
        abi.structs.append((name, fields))
    # Enums: "typedef int32_t T;" then "enum { ... };" (members read with their comments).
    for match in re.finditer(r"^typedef\s+int32_t\s+(\w+)\s*;\s*\nenum\s*\{\n(.*?)^\};", text, re.M | re.S):
        members = []
        for line in match.group(2).splitlines():
            if not line.strip():
                continue
            member = _MEMBER.match(line)
            if member is None:
                raise ValueError(f"{match.group(1)}: cannot read the enum line {line.strip()!r}")
            members.append(Member(member.group(1), int(member.group(2)), member.group(3) or ""))
        abi.enums.append(Enum(match.group(1), members))
    enum_blocks = len(re.findall(r"^enum\s*\{", code, re.M))
    if enum_blocks != len(abi.enums):
        raise ValueError(f"the header has {enum_blocks} enum blocks; {len(abi.enums)} follow a typedef int32_t")
    for ret, name, params in re.findall(r"^typedef\s+([\w\s*]+?)\s*\(\s*\*\s*(\w+)\s*\)\s*\((.*?)\)\s*;",
                                        code, re.M | re.S):
        params = " ".join(params.split())
        parameters = [] if params in ("", "void") else [_split_declarator(p) for p in params.split(",")]
        abi.functions.append(FunctionPointer(_c_type(ret), name, parameters))
    if not abi.enums or not abi.functions:
        raise ValueError("the header declares no enums or no entry points: is this cudnn_backend.h?")
    return abi


def status_names(abi: Abi) -> dict[int, str]:
    """value -> name of every status code. A deprecated alias sharing a code with its replacement loses
    to it; a deprecated name that is the only one for its code (CUDNN_STATUS_INVALID_VALUE) stays."""
    members = abi.enum(STATUS_TYPE).members
    names: dict[int, str] = {}
    for member in sorted(members, key=lambda m: "deprecated" in m.note):   # stable: current names first
        names.setdefault(member.value, member.name)
    return dict(sorted(names.items()))


def render_names(abi: Abi, header_label: str = "include/cudnn_graph/cudnn_backend.h") -> str:
    """The Python module cudnn_graph._cudnn_names."""
    out = [
        f'"""The cuDNN ABI names, generated from {header_label}',
        "by tools/gen_cudnn_abi.py at build time (do not edit; change the header).",
        "",
        "The lowering speaks names; the C calls take the header's values. ``DESCRIPTOR_TYPES``,",
        "``ATTRIBUTE_TYPES`` and ``ATTRIBUTES`` map every name of their enum to its value; ``STATUS_NAMES``",
        "maps every status code to its name (a deprecated alias loses to the name that replaced it).",
        '"""',
        "",
        '__all__ = ["DECLARED_VERSION", "ABI_MAJOR", "STATUS_NAMES", ' + ", ".join(f'"{t}"' for t in NAME_TABLES)
        + "]",
        "",
    ]
    defines = dict(abi.defines)
    out.append(f"DECLARED_VERSION = {defines['CG_CUDNN_DECLARED_VERSION']}   # the cuDNN release the header "
               "was checked against")
    out.append(f"ABI_MAJOR = {defines['CG_CUDNN_ABI_MAJOR']}")
    out.append("")
    for table, type_name in NAME_TABLES.items():
        out.append(f"# {type_name}")
        out.append(f"{table}: dict[str, int] = {{")
        out.extend(f'    "{m.name}": {m.value},' for m in abi.enum(type_name).members)
        out.append("}")
        out.append("")
    out.append(f"# {STATUS_TYPE}")
    out.append("STATUS_NAMES: dict[int, str] = {")
    out.extend(f'    {value}: "{name}",' for value, name in status_names(abi).items())
    out.append("}")
    return "\n".join(out) + "\n"


_PXD_PREAMBLE = """\
# Cython view of include/cudnn_graph/cudnn_backend.h: the cuDNN 9 backend ABI subset, declared by this
# project so that building needs neither the CUDA toolkit nor cuDNN headers.
#
# GENERATED by tools/gen_cudnn_abi.py --pxd from the header (do not edit; change the header and run
# it again; tests/test_cudnn_abi.py fails while this file and the header differ). Only the names are
# declared here: Cython takes each value from the C compiler.
#
# The enum types are int32_t typedefs (the ABI passes every cuDNN enum as a 32-bit int); entry points
# are function-pointer types, filled by cudnn_graph._loader from the dlopen'ed library.
from libc.stdint cimport int32_t, int64_t

cdef extern from "cudnn_graph/cudnn_backend.h" nogil:
"""


def _pxd_function(fn: FunctionPointer) -> list[str]:
    """One entry-point ctypedef; a long parameter list continues on lines of at most 110 columns."""
    params = [f"{t} {n}" for t, n in fn.parameters]
    head = f"    ctypedef {fn.return_type} (*{fn.name})("
    tail = ") noexcept nogil"
    if len(head) + len(", ".join(params)) + len(tail) <= 110:
        return [head + ", ".join(params) + tail]
    lines, current = [head], "       "
    for i, param in enumerate(params):
        piece = f" {param}" + ("," if i < len(params) - 1 else tail)
        if len(current) + len(piece) > 110:
            lines.append(current)
            current = "       "
        current += piece
    lines.append(current)
    return lines


def render_pxd(abi: Abi) -> str:
    """src/cudnn_graph/_cudnn_abi.pxd."""
    out = [_PXD_PREAMBLE.rstrip("\n"), "    enum:"]
    out.extend(f"        {name}" for name, _ in abi.defines)
    out.append("")
    out.extend(f"    ctypedef void* {name}" for name in abi.opaque)
    for name, fields in abi.structs:
        out.append("")
        out.append(f"    ctypedef struct {name}:")
        out.extend(f"        {t} {n}" for t, n in fields)
    for enum in abi.enums:
        out.append("")
        out.append(f"    ctypedef int32_t {enum.type_name}")
        out.append(f"    enum:  # {enum.type_name}")
        out.extend(f"        {m.name}" for m in enum.members)
    out.append("")
    out.append("    # Entry points (see the header for which are optional and since when).")
    for fn in abi.functions:
        out.extend(_pxd_function(fn))
    return "\n".join(out) + "\n"


def _write_if_changed(path: Path, text: str) -> None:
    # Rewriting an unchanged file would make ninja rebuild everything that depends on it.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("header", nargs="?", type=Path, default=DEFAULT_HEADER)
    parser.add_argument("--names", type=Path, help="write the Python name tables here")
    parser.add_argument("--pxd", type=Path, help="write the Cython declarations here")
    args = parser.parse_args(argv)
    if args.names is None and args.pxd is None:
        parser.error("nothing to write: give --names and/or --pxd")
    abi = parse_header(args.header.read_text())
    if args.names is not None:
        _write_if_changed(args.names, render_names(abi))
    if args.pxd is not None:
        _write_if_changed(args.pxd, render_pxd(abi))
    return 0


if __name__ == "__main__":
    sys.exit(main())
