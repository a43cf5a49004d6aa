"""Where the installed C runtime (libcudnn_graph_rt and include/cudnn_graph/cudnn_graph.h) lives, as
compiler flags: what ``python -m cudnn_graph --c-flags --libs`` prints (docs/c_api.md).

Example:
    >>> from cudnn_graph import _c_runtime
    >>> _c_runtime.c_flags().startswith("-I")
    True
    >>> "-lcudnn_graph_rt" in _c_runtime.libs()
    True
"""
from __future__ import annotations

import os
import shlex

__all__ = ["LIBRARY_NAME", "include_dir", "library_dir", "library_path", "c_flags", "libs"]

LIBRARY_NAME = "cudnn_graph_rt"


def include_dir() -> str:
    """The folder to put on the include path (``#include <cudnn_graph/cudnn_graph.h>``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def library_dir() -> str:
    """The folder holding ``libcudnn_graph_rt.so`` (the package's own folder)."""
    return os.path.dirname(os.path.abspath(__file__))


def library_path() -> str:
    """The shared library's path (it may be absent in a source checkout that was not built)."""
    return os.path.join(library_dir(), f"lib{LIBRARY_NAME}.so")


def c_flags() -> str:
    """Compiler flags, pkg-config style: ``-I<include dir>``."""
    return f"-I{shlex.quote(include_dir())}"


def libs() -> str:
    """Linker flags, pkg-config style: ``-L<dir> -Wl,-rpath,<dir> -lcudnn_graph_rt`` (the rpath lets the
    program find the library where the package is installed without LD_LIBRARY_PATH)."""
    folder = shlex.quote(library_dir())
    return f"-L{folder} -Wl,-rpath,{folder} -l{LIBRARY_NAME}"
