"""Every ```python block in README.md and docs/*.md runs as written.

Each block runs alone, in a fresh interpreter (a subprocess, so that a block that registers an engine or
sets a process switch leaves the other tests alone), with the repository's docs/ folder as the working
directory (from the root, `import cudnn_graph` would find the source folder, which holds no compiled
modules, instead of the installed package); a failure names the file and the line of the block's opening fence, and shows the traceback.

A block runs on the CPU unless the line just before its opening fence (blank lines between are allowed)
is one of these HTML comments, which Markdown renders as nothing:

    <!-- snippet: gpu -->                 the block needs a CUDA GPU (and the framework it imports):
                                          collected as a `gpu`-marked test, skipped where none is visible
    <!-- snippet: skip (why) -->          the block is not a program (a fragment, a side-by-side listing):
                                          reported as skipped with the reason in the parentheses
    <!-- snippet: needs (module) -->      a CPU block that imports an optional module (e.g. jax): skipped
                                          where that module is not installed, run where it is

Other fences (```bash, ```text, ```) are not run.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _helpers import REPO_ROOT

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 120
_MARKER = re.compile(r"^<!--\s*snippet:\s*(gpu|skip|needs)\s*(?:\((.*)\))?\s*-->$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int           # 1-based line of the opening fence
    code: str
    kind: str           # "cpu", "gpu", "skip" or "needs"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def _marker_before(lines: list[str], fence: int) -> tuple[str, str]:
    """The (kind, reason) of the marker comment on the last non-blank line before ``lines[fence]``."""
    for previous in reversed(lines[:fence]):
        if previous.strip():
            found = _MARKER.match(previous.strip())
            if found is None:
                return "cpu", ""
            return found.group(1), (found.group(2) or "").strip()
    return "cpu", ""


def extract_snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of one Markdown file, in order, with their markers.

    >>> [s.kind for s in extract_snippets(REPO_ROOT / "docs" / "quickstart.md")][:1]
    ['cpu']
    """
    lines = path.read_text().splitlines()
    snippets, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise AssertionError(f"{path.relative_to(REPO_ROOT)}:{start + 1}: ```python block never closes")
            kind, reason = _marker_before(lines, start)
            snippets.append(Snippet(path, start + 1, "\n".join(body) + "\n", kind, reason))
        i += 1
    return snippets


SNIPPETS = [s for doc in DOCUMENTS for s in extract_snippets(doc)]


def _param(snippet: Snippet):
    marks = []
    if snippet.kind == "gpu":
        marks.append(pytest.mark.gpu)
    elif snippet.kind == "skip":
        marks.append(pytest.mark.skip(reason=f"{snippet.where}: {snippet.reason or 'marked skip'}"))
    elif snippet.kind == "needs" and importlib.util.find_spec(snippet.reason) is None:
        marks.append(pytest.mark.skip(reason=f"{snippet.where}: needs {snippet.reason}, not installed"))
    return pytest.param(snippet, id=snippet.where, marks=marks)


def test_every_document_is_found():
    names = {p.name for p in DOCUMENTS}
    assert {"README.md", "quickstart.md", "dynamic_shapes.md"} <= names, names


def test_a_skip_marker_gives_its_reason():
    unexplained = [s.where for s in SNIPPETS if s.kind == "skip" and not s.reason]
    assert not unexplained, f"snippets marked skip without a reason in parentheses: {unexplained}"


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet_runs_as_written(snippet: Snippet):
    try:
        done = subprocess.run([sys.executable, "-c", snippet.code], cwd=REPO_ROOT / "docs", capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.where}: the snippet ran past {TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(f"{snippet.where}: the snippet exits with status {done.returncode}\n"
                    f"--- stderr\n{done.stderr[-4000:]}\n--- stdout\n{done.stdout[-2000:]}", pytrace=False)
