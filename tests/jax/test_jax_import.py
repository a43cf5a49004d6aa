"""``import cudnn_graph`` never imports jax: cudnn_graph.jax is the one module that does, imported by the user."""
from __future__ import annotations

import subprocess
import sys


def test_import_cudnn_graph_imports_no_jax():
    code = ("import sys, cudnn_graph, cudnn_graph._xla_ffi\n"
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr


def test_the_handler_capsule_needs_no_jax():
    from cudnn_graph import _xla_ffi
    assert type(_xla_ffi.handler_capsule()).__name__ == "PyCapsule"
    assert type(_xla_ffi.handler_capsule(True)).__name__ == "PyCapsule"
    assert _xla_ffi.header_api_version() == (0, 3)
