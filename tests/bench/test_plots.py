"""bench/plots.py draws every figure of docs/performance.md from the committed bench/results JSON (when
matplotlib is importable; it is no dependency of the package or its test extras)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from _helpers import REPO_ROOT

PLOTS = REPO_ROOT / "bench" / "plots.py"


def _figures() -> dict[str, str]:
    """{png name: source JSON} as the script lists them (``--list`` runs without matplotlib)."""
    listed = subprocess.run([sys.executable, str(PLOTS), "--list"], capture_output=True, text=True, check=True,
                            timeout=60).stdout
    return dict(line.split(" <- ") for line in listed.splitlines())


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", header[16:24])


def test_every_figure_names_a_committed_json_file():
    figures = _figures()
    assert set(figures) == {"host_overhead.png", "build_time.png", "gemm.png", "sdpa.png", "linear_attention.png"}
    for source in figures.values():
        assert (REPO_ROOT / source).is_file(), source


def test_every_figure_is_referenced_from_performance_md_with_its_json():
    text = (REPO_ROOT / "docs" / "performance.md").read_text()
    for png, source in _figures().items():
        assert f"img/{png}" in text and source in text, (png, source)


def test_plots_script_writes_every_png_at_the_documented_size(tmp_path):
    pytest.importorskip("matplotlib")
    env = {**os.environ, "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(tmp_path / "mplconfig")}
    subprocess.run([sys.executable, str(PLOTS), "--out", str(tmp_path)], check=True, env=env, timeout=300)
    for png in _figures():
        assert (tmp_path / png).is_file(), png
        assert _png_size(tmp_path / png) == (900, 500), png


def test_committed_pngs_are_the_scripts_figures():
    for png in _figures():
        path = REPO_ROOT / "docs" / "img" / png
        assert path.is_file(), f"docs/img/{png} is not committed: run python bench/plots.py"
        assert _png_size(path) == (900, 500), png
