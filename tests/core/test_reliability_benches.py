"""bench/soak.py and bench/fuzz_execute.py run (briefly, on the CPU, reference engine): the benches the
H200 runs stay runnable, and the fuzzer's child batches report no crash and no capsule leak."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from _helpers import REPO_ROOT


def _bench(name, *args, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / f"{name}.py"), *args, "--json", str(out)],
                            capture_output=True, text=True, env=env, timeout=300)
    return result, json.loads(out.read_text())


def test_soak_runs_on_the_cpu(tmp_path):
    result, summary = _bench("soak", "--cpu", "--count", "2000", "--thread-count", "100", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [r["ok"] for r in summary["rows"]] == [True, True]
    assert summary["rows"][0]["counters_grown"] == {}


def test_fuzz_execute_runs_on_the_cpu_without_crash_leak_or_wrong_answer(tmp_path):
    result, summary = _bench("fuzz_execute", "--cpu", "--cases", "2000", "--batch", "500", tmp_path=tmp_path)
    assert summary["cases"] == 2000, result.stderr
    assert summary["crash"] == 0 and summary["leak"] == 0 and summary["wrong"] == 0, summary["failures"][:5]
    assert summary["ok"] > 0 and summary["typed"] > 0
