"""Building C programs against the installed C runtime (header and libcudnn_graph_rt), for the tests."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def runtime_or_skip() -> None:
    from cudnn_graph import _c_runtime
    if not os.path.exists(_c_runtime.library_path()):
        pytest.skip(f"libcudnn_graph_rt is not installed at {_c_runtime.library_path()} (build the package)")


def build_program(source: str, output, extra=()) -> str:
    """Compile ``source`` (C99, warnings as errors) against the runtime with the flags
    ``python -m cudnn_graph --c-flags --libs`` prints; returns the program's path."""
    from _helpers import c_compiler_or_skip
    from cudnn_graph import _c_runtime
    cc = c_compiler_or_skip("a C runtime test program")
    runtime_or_skip()
    flags = shlex.split(_c_runtime.c_flags()) + shlex.split(_c_runtime.libs())
    command = [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-O0", str(source), "-o", str(output),
               *flags, "-lpthread", *extra]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return str(output)


def build_extension(source: str, folder, name: str) -> str:
    """Compile ``source`` as the CPython extension module ``name`` in ``folder`` (C99, warnings as errors)
    against Python's headers and the package's include folder; returns the folder to put on sys.path."""
    import sysconfig
    from _helpers import c_compiler_or_skip
    from cudnn_graph import _c_runtime
    cc = c_compiler_or_skip("a C extension test module")
    header = os.path.join(_c_runtime.include_dir(), "cudnn_graph", "cudnn_graph_capi.h")
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed (build the package)")
    output = os.path.join(str(folder), name + sysconfig.get_config_var("EXT_SUFFIX"))
    command = [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-O0", "-shared", "-fPIC",
               f"-I{sysconfig.get_paths()['include']}", *shlex.split(_c_runtime.c_flags()), str(source),
               "-o", output, "-lpthread"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return str(folder)


def run_case_program(argv: list, env: dict, log) -> tuple:
    """Run a case program (``argv``, with ``env`` as its whole environment, 300 s at most): its process, its
    lines "<case> <status> | <message>" as {case: (status, message)}, and the lines the stand-ins logged to
    ``log`` (none where it was not written)."""
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    lines = {}
    for line in result.stdout.splitlines():
        head, _, message = line.partition(" |")
        name, _, status = head.partition(" ")
        lines[name] = (status, message.strip())
    records = log.read_text().splitlines() if log.exists() else []
    return result, lines, records
