"""tools/gpu_suite.py: shards as contiguous runs balanced by cost, an outcome record that outlives a time
limit, and a resumed run that runs only what the record lacks (CPU: a scratch project stands in for the tree)."""
import importlib
import os
import sys
import textwrap

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")


@pytest.fixture
def gpu_suite(monkeypatch):
    monkeypatch.syspath_prepend(TOOLS)
    return importlib.import_module("gpu_suite")


def test_shards_are_contiguous_runs_of_equal_count_without_durations(gpu_suite):
    ids = [f"t{i}" for i in range(10)]
    runs = gpu_suite.contiguous_shards(ids, 3)
    assert [i for run in runs for i in run] == ids
    assert [len(run) for run in runs] == [3, 4, 3]


def test_shards_balance_by_recorded_seconds_and_unknown_ids_cost_the_mean(gpu_suite):
    seconds = {"slow": 30.0, "a": 1.0, "b": 1.0}
    runs = gpu_suite.contiguous_shards(["slow", "a", "b", "new1", "new2"], 2, seconds)
    assert runs == [["slow"], ["a", "b", "new1", "new2"]]


def test_no_shard_is_empty_when_ids_are_fewer_than_shards(gpu_suite):
    assert gpu_suite.contiguous_shards(["a", "b"], 8) == [["a"], ["b"]]
    assert gpu_suite.contiguous_shards([], 8) == []
    with pytest.raises(ValueError, match="shards must be at least 1; got 0"):
        gpu_suite.contiguous_shards(["a"], 0)


def test_a_torn_record_line_is_skipped_and_the_last_line_of_an_id_wins(gpu_suite, tmp_path):
    record = tmp_path / "outcomes.jsonl"
    record.write_text('{"nodeid": "x", "outcome": "failed", "seconds": 1}\n'
                      '{"nodeid": "x", "outcome": "passed", "seconds": 2}\n{"nodeid": "y", "outc')
    assert gpu_suite.read_outcomes(str(record)) == {"x": {"outcome": "passed", "seconds": 2.0}}


@pytest.fixture
def scratch_project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.pytest.ini_options]
        markers = ["gpu: stands in for the GPU marker"]
    """))
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_fast.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.gpu
        def test_passes():
            pass

        @pytest.mark.gpu
        def test_fails():
            assert False

        @pytest.mark.gpu
        @pytest.mark.parametrize("case", ["with space", "plain"])
        def test_skips(case):
            pytest.skip("not here")

        def test_unmarked():
            pass
    """))
    (tests / "test_slow.py").write_text(textwrap.dedent("""
        import os
        import time

        import pytest

        @pytest.mark.gpu
        def test_slow_the_first_time():
            if os.environ.get("SCRATCH_SLOW"):
                time.sleep(300)
    """))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_run_stopped_at_its_limit_keeps_its_outcomes_and_a_resumed_run_finishes_the_rest(
        gpu_suite, scratch_project, tmp_path, monkeypatch, capsys):
    logs = str(tmp_path / "logs")
    slow = "tests/test_slow.py::test_slow_the_first_time"
    monkeypatch.setenv("SCRATCH_SLOW", "1")
    status = gpu_suite.main(["--shards", "2", "--logs", logs, "--time-limit", "6"])
    first = gpu_suite.read_outcomes(os.path.join(logs, gpu_suite.OUTCOMES))
    assert slow not in first            # interrupted: not recorded, so resumed
    assert status in (1, gpu_suite.EXIT_LEFT)
    assert "stopped at the time limit (6 s)" in capsys.readouterr().out

    monkeypatch.delenv("SCRATCH_SLOW")
    status = gpu_suite.main(["--shards", "2", "--logs", logs, "--resume"])
    out = capsys.readouterr().out
    record = gpu_suite.read_outcomes(os.path.join(logs, gpu_suite.OUTCOMES))
    fast = "tests/test_fast.py"
    assert {i: o["outcome"] for i, o in record.items()} == {
        f"{fast}::test_passes": "passed", f"{fast}::test_fails": "failed",
        f"{fast}::test_skips[with space]": "skipped", f"{fast}::test_skips[plain]": "skipped", slow: "passed"}
    assert status == 1                  # the failing test is counted from the first run's record
    assert "GPU SUITE TOTAL: 1 failed, 2 passed, 2 skipped; 0 of 5 not run" in out
    assert f"FAILED {fast}::test_fails" in out
    assert sorted(n for n in os.listdir(logs) if n.endswith(".log")) == [
        "run1-shard0.log", "run1-shard1.log", "run2-shard0.log"]     # the first run's logs are kept


def test_a_fresh_run_forgets_an_earlier_record(gpu_suite, scratch_project, tmp_path, capsys):
    logs = str(tmp_path / "logs")
    assert gpu_suite.main(["--logs", logs, "tests/test_slow.py"]) == 0
    assert gpu_suite.main(["--logs", logs, "tests/test_slow.py"]) == 0
    assert len(gpu_suite.read_outcomes(os.path.join(logs, gpu_suite.OUTCOMES))) == 1
    assert "collected 1 ids; 1 to run in 1 shards" in capsys.readouterr().out


def test_a_module_that_does_not_collect_fails_the_suite(gpu_suite, scratch_project, tmp_path, capsys):
    (scratch_project / "tests" / "test_broken.py").write_text("import a_module_that_is_not_there\n")
    status = gpu_suite.main(["--logs", str(tmp_path / "logs")])
    out = capsys.readouterr().out
    assert status == 1
    assert "collection failed" in out and "a_module_that_is_not_there" in out
    assert "GPU SUITE TOTAL: 1 failed, 2 passed, 2 skipped; 0 of 5 not run" in out    # the others still ran


def test_a_run_where_every_test_skipped_says_so(gpu_suite, scratch_project, tmp_path, capsys):
    assert gpu_suite.main(["--logs", str(tmp_path / "logs"), "tests/test_fast.py::test_skips"]) == 0
    assert "every test skipped: is a GPU visible" in capsys.readouterr().out
