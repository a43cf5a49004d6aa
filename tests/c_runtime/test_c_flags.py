"""``python -m cudnn_graph --c-flags --libs``: pkg-config style flags that point at the installed header
and libcudnn_graph_rt (with an rpath), and ``check`` still being the default command's shape."""
from __future__ import annotations

import os
import subprocess
import sys

from cudnn_graph import _c_runtime
from cudnn_graph.__main__ import main


def test_c_flags_and_libs_name_the_installed_header_and_library(capsys):
    assert main(["--c-flags", "--libs"]) == 0
    words = capsys.readouterr().out.split()
    include = next(w[2:] for w in words if w.startswith("-I"))
    libdir = next(w[2:] for w in words if w.startswith("-L"))
    assert os.path.exists(os.path.join(include, "cudnn_graph", "cudnn_graph.h"))
    assert f"-Wl,-rpath,{libdir}" in words and "-lcudnn_graph_rt" in words
    assert os.path.exists(_c_runtime.library_path())


def test_each_flag_alone_prints_only_its_part(capsys):
    main(["--c-flags"])
    assert capsys.readouterr().out.split() == [_c_runtime.c_flags()]
    main(["--libs"])
    assert capsys.readouterr().out.strip() == _c_runtime.libs()


def test_no_command_and_no_flag_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "cudnn_graph"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert result.returncode == 2 and "--c-flags" in result.stderr
