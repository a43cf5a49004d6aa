"""The cuDNN ABI has one source, include/cudnn_graph/cudnn_backend.h; everything else is made from it.

tools/gen_cudnn_abi.py reads the header; these tests check, in full and without a GPU or cuDNN, that
what it reads is what a C compiler reads (every enum value, every entry-point type), that the committed
Cython view (src/cudnn_graph/_cudnn_abi.pxd) is exactly what it makes, and that the installed name
tables (cudnn_graph._cudnn_names, generated at build time) hold every name with its value.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import REPO_ROOT

REPO = REPO_ROOT
HEADER = REPO / "include" / "cudnn_graph" / "cudnn_backend.h"
ABI_PXD = REPO / "src" / "cudnn_graph" / "_cudnn_abi.pxd"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_cudnn_abi", REPO / "tools" / "gen_cudnn_abi.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
ABI = gen.parse_header(HEADER.read_text())


def _all_members():
    return [(enum.type_name, m) for enum in ABI.enums for m in enum.members]


def _compile_c(tmp_path: Path, source: str) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    path = tmp_path / "check.c"
    path.write_text(source)
    subprocess.run([cc, "-std=c11", "-fsyntax-only", "-Wall", "-Werror", "-I", str(REPO / "include"), str(path)],
                   check=True, capture_output=True, text=True)


def test_the_header_parses_into_every_enum_the_loader_and_lowering_use():
    names = {enum.type_name for enum in ABI.enums}
    assert {"cudnnStatus_t", "cudnnDataType_t", "cudnnBackendDescriptorType_t", "cudnnBackendAttributeName_t",
            "cudnnBackendAttributeType_t"} <= names
    assert len(ABI.enum("cudnnBackendAttributeName_t").members) == 383
    assert len(ABI.enum("cudnnBackendDescriptorType_t").members) == 51
    assert len(ABI.enum("cudnnBackendAttributeType_t").members) == 34
    every = [m.name for _, m in _all_members()]
    assert len(every) == len(set(every))
    # the same name / value pairs a plain regex over the header finds (what the older tests read)
    plain = {n: int(v) for n, v in re.findall(r"^\s+(CUDNN_\w+)\s+=\s+(-?\d+),", HEADER.read_text(), re.M)}
    assert {m.name: m.value for _, m in _all_members()} == plain


def test_every_enum_value_read_is_the_value_the_c_compiler_sees(tmp_path):
    checks = "\n".join(f'_Static_assert({m.name} == {m.value}, "{m.name}");' for _, m in _all_members())
    defines = "\n".join(f'_Static_assert({name} == {value}, "{name}");' for name, value in ABI.defines)
    _compile_c(tmp_path, f"#include <cudnn_graph/cudnn_backend.h>\n{checks}\n{defines}\n")


def test_every_entry_point_type_read_is_the_type_the_c_compiler_sees(tmp_path):
    # Assigning a pointer of the signature as read to the header's typedef fails to compile (-Werror)
    # when a return or parameter type was misread.
    lines = ["#include <cudnn_graph/cudnn_backend.h>"]
    for i, fn in enumerate(ABI.functions):
        params = ", ".join(t for t, _ in fn.parameters) or "void"
        lines.append(f"static {fn.return_type} (*read_{i})({params}) = 0;")
        lines.append(f"{fn.name} check_{i}(void) {{ return read_{i}; }}")
    _compile_c(tmp_path, "\n".join(lines) + "\n")
    assert {fn.name for fn in ABI.functions} >= {"cg_cudnnBackendExecute_t", "cg_cudnnBackendSetAttribute_t",
                                                 "cg_cudnnBackendPopulateCudaGraph_t"}


def test_the_committed_pxd_is_exactly_what_the_generator_makes():
    made = gen.render_pxd(ABI)
    assert ABI_PXD.read_text() == made, ("src/cudnn_graph/_cudnn_abi.pxd differs from the header: run "
                                         "python tools/gen_cudnn_abi.py --pxd src/cudnn_graph/_cudnn_abi.pxd")


def test_the_pxd_declares_every_member_under_its_enum_type_and_every_entry_point():
    # Read back independently of render_pxd: "ctypedef int32_t T" / "enum:  # T" blocks and ctypedef'd
    # function pointers.
    text = ABI_PXD.read_text()
    blocks = dict(re.findall(r"^    enum:  # (\w+)\n((?:        \w+\n)+)", text, re.M))
    assert {t: b.split() for t, b in blocks.items()} == {e.type_name: [m.name for m in e.members] for e in ABI.enums}
    for enum in ABI.enums:
        assert f"    ctypedef int32_t {enum.type_name}\n" in text
    declared = re.findall(r"^    ctypedef ([^\n(]+?) \(\*(\w+)\)\((.*?)\) noexcept nogil", text, re.S | re.M)
    read = {name: (ret, [" ".join(p.split()) for p in params.split(",") if p.strip()]) for ret, name, params in declared}
    assert read == {fn.name: (fn.return_type, [f"{t} {n}" for t, n in fn.parameters]) for fn in ABI.functions}


def test_the_installed_name_tables_hold_every_header_name_with_its_value():
    from cudnn_graph import _cudnn_names
    for table, type_name in gen.NAME_TABLES.items():
        assert getattr(_cudnn_names, table) == {m.name: m.value for m in ABI.enum(type_name).members}, table
    assert _cudnn_names.STATUS_NAMES == gen.status_names(ABI)
    assert _cudnn_names.DECLARED_VERSION == dict(ABI.defines)["CG_CUDNN_DECLARED_VERSION"]


def test_status_names_keep_the_current_name_of_a_shared_code():
    from cudnn_graph._cudnn_errors import STATUS_NAMES
    assert STATUS_NAMES[4003] == "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"   # not ALLOC_FAILED
    assert STATUS_NAMES[3007] == "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"            # not ARCH_MISMATCH
    assert STATUS_NAMES[2001] == "CUDNN_STATUS_INVALID_VALUE"    # deprecated, but the only name of 2001
    assert list(STATUS_NAMES) == sorted(STATUS_NAMES)


def test_the_generator_refuses_a_line_it_cannot_read():
    text = HEADER.read_text().replace("    CUDNN_DATA_FLOAT              = 0,",
                                      "    CUDNN_DATA_FLOAT              = 1 << 0,")
    with pytest.raises(ValueError, match="cudnnDataType_t"):
        gen.parse_header(text)


def test_the_generator_writes_what_meson_installs(tmp_path):
    out = tmp_path / "_cudnn_names.py"
    subprocess.run([sys.executable, str(REPO / "tools" / "gen_cudnn_abi.py"), "--names", str(out), str(HEADER)],
                   check=True)
    namespace: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    assert namespace["ATTRIBUTES"]["CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"] == 1001
    assert namespace["STATUS_NAMES"][0] == "CUDNN_STATUS_SUCCESS"


def test_the_runtime_import_path_leaves_the_timing_helpers_out():
    code = ("import json, sys\nimport cudnn_graph, cudnn_graph.graph, cudnn_graph.engines.cudnn_backend\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('cudnn_graph._'))))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "cudnn_graph._bench_timing" not in loaded
