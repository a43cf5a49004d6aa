"""``python -m cudnn_graph check``: what it reports (engines with a status, the whole libcudnn failure with
its fix, only the failures that matter), what its self-tests compare with, ``--json`` and the exit status.

The loader is pointed at nowhere in child processes (as without libcudnn), so these run the same on a
CPU machine and on a GPU one."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from cudnn_graph import _check
from cudnn_graph._check import EngineStatus, StepResult

ENGINES = ("reference", "cudnn_backend", "cute_gemm", "cutile_linear_attention")
STATUSES = ("ready", "no GPU", "absent")
INSTALL_HINT = ("Install the cuDNN wheel (pip install 'cudnn_graph[cu12]' or '[cu13]') or set "
                "CUDNN_GRAPH_LIBCUDNN to the path of libcudnn.so.9.")

# Prepended to a child's code: no libcudnn anywhere, whatever the machine has.
NO_LIBCUDNN = """
from cudnn_graph import _loader
def no_pathfinder():
    raise RuntimeError("pathfinder disabled by the test")
_loader._find_with_pathfinder = no_pathfinder
_loader._SYSTEM_LIBRARY_NAMES = ("libcudnn_graph_test_absent.so.9",)
"""


def child(args: list, code: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m cudnn_graph <args>`` (or ``code``) in a fresh process, from outside the checkout."""
    full_env = {k: v for k, v in os.environ.items() if k != "CUDNN_GRAPH_LIBCUDNN"}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full_env.update(env or {})
    command = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "cudnn_graph", *args]
    return subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=300, cwd="/")


def run_check_without_libcudnn(as_json: bool) -> subprocess.CompletedProcess:
    return child([], NO_LIBCUDNN + f"""
import sys
from cudnn_graph._check import run_check
sys.exit(run_check(as_json={as_json}))
""", env={"CUDNN_GRAPH_LIBCUDNN": "/nonexistent/libcudnn.so.9"})


def test_the_report_names_every_engine_with_a_status_and_passes():
    result = child(["check"])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("engines")
    for name in ENGINES:
        line = next(l for l in lines[start:] if l.split()[:1] == [name])
        assert any(line.split(None, 1)[1].startswith(status) for status in STATUSES), line
    assert lines[-1] == "check passed"


def test_a_failed_libcudnn_load_is_shown_whole_with_its_fix():
    result = run_check_without_libcudnn(as_json=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "cuDNN          not found. libcudnn (cuDNN 9) could not be loaded; tried, in order:" in out
    assert "- $CUDNN_GRAPH_LIBCUDNN='/nonexistent/libcudnn.so.9': /nonexistent/libcudnn.so.9: cannot open" in out
    assert "- cuda.pathfinder.load_nvidia_dynamic_lib('cudnn'): RuntimeError: pathfinder disabled by the test" in out
    assert "- system loader dlopen('libcudnn_graph_test_absent.so.9'): " in out
    assert any(line.strip() == INSTALL_HINT for line in out.splitlines())     # whole, on its own line
    assert "cudnn_backend            absent  libcudnn not found (see cuDNN above)" in out


def test_json_report_parses_and_has_the_bug_report_fields():
    result = run_check_without_libcudnn(as_json=True)
    assert result.returncode == 0, result.stderr
    rep = json.loads(result.stdout)
    assert {"cudnn_graph", "python", "platform", "packages", "frameworks", "environment_variables", "cuda",
            "cudnn", "loaded_libraries", "engines", "self_tests", "passed"} <= set(rep)
    assert rep["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert rep["packages"]["numpy"] and rep["packages"]["cudnn_graph"] == rep["cudnn_graph"]
    assert set(rep["frameworks"]) >= {"torch", "jax", "cupy", "numba"}
    assert {"driver_loaded", "driver_cuda_version", "gpus"} <= set(rep["cuda"])
    cudnn = rep["cudnn"]
    assert cudnn["loaded"] is False and cudnn["install_hint"] == INSTALL_HINT and cudnn["error"].endswith(INSTALL_HINT)
    assert [a["place"] for a in cudnn["attempts"]][0] == "$CUDNN_GRAPH_LIBCUDNN='/nonexistent/libcudnn.so.9'"
    assert rep["environment_variables"]["CUDNN_GRAPH_LIBCUDNN"] == "/nonexistent/libcudnn.so.9"
    engines = {e["name"]: e for e in rep["engines"]}
    assert set(ENGINES) <= set(engines) and all(e["status"] in STATUSES for e in engines.values())
    assert engines["cudnn_backend"]["status"] == "absent"
    assert set(engines["cute_gemm"]["versions"]) == {"nvidia-cutlass-dsl"}
    assert {"cuda-tile", "tileiras"} <= set(engines["cutile_linear_attention"]["versions"])
    assert rep["passed"] is True and all(t["ok"] for t in rep["self_tests"])


def test_pathfinders_dependency_failure_is_shown_only_when_a_cudnn_is_installed(monkeypatch):
    pathfinder = "cuda.pathfinder.load_nvidia_dynamic_lib('cudnn')"
    attempts = [("$CUDNN_GRAPH_LIBCUDNN", "not set"),
                (pathfinder, 'DynamicLibNotFoundError: Failure finding "libcublasLt.so.13 or libcublasLt.so.12"')]
    monkeypatch.setattr(_check, "_cudnn_is_installed_somewhere", lambda: False)
    shown = dict(_check.explain_attempts(attempts))
    assert shown["$CUDNN_GRAPH_LIBCUDNN"] == "not set"
    assert "libcublasLt" not in shown[pathfinder] and shown[pathfinder].startswith("no cuDNN wheel")
    monkeypatch.setattr(_check, "_cudnn_is_installed_somewhere", lambda: True)
    shown = dict(_check.explain_attempts(attempts))
    assert shown[pathfinder] == ("a cuDNN is installed, but a library it needs did not load: "
                                 'DynamicLibNotFoundError: Failure finding "libcublasLt.so.13 or libcublasLt.so.12"')
    # A reason about libcudnn itself is shown as it is.
    own = [(pathfinder, 'DynamicLibNotFoundError: Failure finding "libcudnn.so.9"')]
    assert _check.explain_attempts(own) == own


def test_the_cpu_self_test_says_it_compares_with_an_independent_formula(monkeypatch):
    monkeypatch.setattr(_check, "_best_device", lambda: "cpu")
    for step in (_check._step_matmul, _check._step_sdpa):
        result = step()
        assert result.ok, result.detail
        assert "vs an independent NumPy float64 formula" in result.detail
        assert "reference engine" not in result.detail
        assert result.data["engine"] == "reference" and result.data["device"] == "cpu"


def test_without_libcudnn_a_cuda_self_test_names_cudnn_among_the_declines():
    # SDPA: no GPU engine but cuDNN's runs it, so on any machine the CUDA graph is declined by all.
    result = child([], NO_LIBCUDNN + """
import json
from cudnn_graph import _check
_check._best_device = lambda: "cuda:0"
r = _check._step_sdpa()
print(json.dumps({"ok": r.ok, "name": r.name, "detail": r.detail, "declines": r.data.get("declines")}))
""")
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout.splitlines()[-1])
    assert r["ok"] and r["name"] == "sdpa (causal) on cpu (no engine for it on cuda:0)"
    declines = dict(r["declines"])
    assert declines["cudnn_backend"].startswith("libcudnn not found: " + INSTALL_HINT.rstrip("."))
    assert "cudnn_backend: libcudnn not found: Install the cuDNN wheel" in r["detail"]


def test_exit_status_is_nonzero_when_a_self_test_fails(monkeypatch):
    def broken():
        raise RuntimeError("the engine produced garbage")

    monkeypatch.setattr(_check, "STEPS", [lambda: StepResult("fine", True), broken])
    out = io.StringIO()
    assert _check.run_check(out=out, as_json=True) == 1
    rep = json.loads(out.getvalue())
    assert rep["passed"] is False
    failed = rep["self_tests"][1]
    assert failed["ok"] is False and failed["detail"] == "RuntimeError: the engine produced garbage"
    assert "Traceback" in failed["data"]["traceback"]
    out = io.StringIO()
    monkeypatch.setattr(_check, "STEPS", [broken])
    assert _check.run_check(out=out) == 1
    assert "  [FAIL] broken: RuntimeError: the engine produced garbage" in out.getvalue()
    assert out.getvalue().endswith("check FAILED (1 step(s))\n")


def test_a_dsl_engine_reports_its_toolchains_reason_or_the_missing_gpu(monkeypatch):
    cudnn = {"loaded": False, "error": "x", "install_hint": INSTALL_HINT}
    monkeypatch.setattr(_check, "_toolchain_missing",
                        lambda package: None if package == "cute" else "cuda.tile is not importable (test)")
    statuses = {e.name: e for e in _check.engine_statuses({"gpus": []}, cudnn)}
    assert statuses["cute_gemm"].status == "no GPU"
    assert statuses["cutile_linear_attention"] == EngineStatus(
        "cutile_linear_attention", "absent", "cuda.tile is not importable (test)",
        statuses["cutile_linear_attention"].versions)
    assert statuses["reference"].status == "ready"


@pytest.mark.gpu
def test_on_a_gpu_with_cudnn_the_self_tests_run_on_cuda_and_cudnn_is_ready():
    result = child(["check", "--json"])
    assert result.returncode == 0, result.stdout + result.stderr
    rep = json.loads(result.stdout)
    assert rep["cuda"]["driver_loaded"] and rep["cuda"]["gpus"]
    assert rep["cudnn"]["loaded"] and rep["cudnn"]["version"].startswith("9.")
    engines = {e["name"]: e for e in rep["engines"]}
    assert engines["cudnn_backend"]["status"] == "ready"
    assert engines["cudnn_backend"]["versions"]["cuDNN"] == rep["cudnn"]["version"]
    assert any(path.endswith(os.path.basename(rep["cudnn"]["path"])) for path in rep["loaded_libraries"])
    for test in rep["self_tests"][1:]:
        assert test["data"]["device"] == "cuda:0" and test["data"]["engine"] != "reference", test
        assert test["data"]["compared_with"] == "the reference engine on the host"
