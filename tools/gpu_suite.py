"""Run the GPU-marked tests of an installed cudnn_graph in parallel shards, within a time limit, resumably.

On a GPU machine, from the project root, after ``pip install .``::

    python3 tools/gpu_suite.py                        # every gpu test, 8 shards, no limit
    python3 tools/gpu_suite.py --time-limit 540       # stop at 540 s; what finished is recorded
    python3 tools/gpu_suite.py --time-limit 540 --resume   # the same call again: only the tests not yet run
    python3 tools/gpu_suite.py tests/engines/cutile   # a selection (paths or ids, as pytest takes them)

Why not pytest's own sharding by every n-th id: most of the suite's time is kernel compiles (CuTe DSL and
cuTile), once per process and kernel. Every n-th id sends each shard through every test module at the same
time, so all shards compile the same kernels side by side; contiguous runs of the collection order give each
shard its own modules and so its own kernels. The runs are balanced by each id's seconds in an earlier run's
record (``--durations-from``), else by count.

Each shard's pytest loads ``_gpu_suite_record`` (beside this file), which appends one JSON line per finished
test to ``LOGDIR/outcomes.jsonl``: a shard stopped at the time limit (SIGINT, then SIGKILL) keeps every
outcome it reached, and ``--resume`` runs only the ids without one. The summary counts this run and the whole
record; the exit status is 0 when every selected id passed or skipped, 1 when any failed or a module did not
collect, 3 when ids are left.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from _gpu_suite_record import RECORD_ENV         # beside this file: the shards' pytest plugin

RECORD_PLUGIN = "_gpu_suite_record"
OUTCOMES = "outcomes.jsonl"
FAILING = ("failed", "error")
EXIT_LEFT = 3
GRACE_S = 30            # after SIGINT, how long a shard may take to stop before SIGKILL


def read_outcomes(path: str) -> dict:
    """{nodeid: {"outcome", "seconds"}} from a record (the last line of an id wins; a torn last line, from a
    shard killed mid-write, is skipped)."""
    found = {}
    if not os.path.exists(path):
        return found
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
                found[entry["nodeid"]] = {"outcome": entry["outcome"], "seconds": float(entry["seconds"])}
            except (ValueError, KeyError, TypeError):
                continue
    return found


def contiguous_shards(ids: list, shards: int, seconds: dict | None = None) -> list:
    """``ids`` cut, in order, into at most ``shards`` contiguous runs of about equal cost (an id's cost: its
    ``seconds`` where known, else the mean of those known, else 1); no run is empty.

    >>> contiguous_shards(["a", "b", "c", "d"], 2)
    [['a', 'b'], ['c', 'd']]
    >>> contiguous_shards(["a", "b", "c", "d"], 2, {"a": 9.0, "b": 1.0, "c": 1.0, "d": 1.0})
    [['a'], ['b', 'c', 'd']]
    """
    if shards < 1:
        raise ValueError(f"shards must be at least 1; got {shards}")
    if not ids:
        return []
    known = [seconds[i] for i in ids if seconds and i in seconds]
    default = sum(known) / len(known) if known else 1.0
    costs = [seconds.get(i, default) if seconds else 1.0 for i in ids]
    total = sum(costs) or float(len(ids))
    runs, current, spent = [], [], 0.0
    for position, (nodeid, cost) in enumerate(zip(ids, costs)):
        left_ids = len(ids) - position
        left_runs = shards - len(runs)
        # cut before this id where the run has its share, or where each later run needs an id of its own
        if current and left_runs > 1 and (spent + cost / 2 > total * (len(runs) + 1) / shards
                                          or left_ids < left_runs):
            runs.append(current)
            current = []
        current.append(nodeid)
        spent += cost
    runs.append(current)
    return runs


def collect(root: str, selection: list, marker: str) -> tuple:
    """(ids, errors): the ids pytest collects under ``selection`` with ``marker`` (pytest's own, relative to
    the tree's root, so that a record from another checkout still matches), and pytest's report where
    collection failed ("" when it did not): a module that fails to import on the GPU machine must fail the
    suite, not leave it. Collection runs from outside the tree, as the shards do, so that the installed
    package is imported, not the source folder."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker,
               *selection]
    done = subprocess.run(command, cwd="/tmp", capture_output=True, text=True)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    errors = "" if done.returncode in (0, 5) else \
        f"collection failed (pytest exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return ids, errors


def _stop(processes: list) -> None:
    """SIGINT to every shard still running (pytest stops after the test in hand), SIGKILL after GRACE_S."""
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    deadline = time.monotonic() + GRACE_S
    for p in processes:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_shards(root: str, runs: list, logs: str, marker: str, time_limit: float | None) -> bool:
    """Each run in a pytest process of its own (ids under ``root`` through an @argsfile: they hold spaces; logs as
    ``LOGDIR/run<n>-shard<k>.log``, n counting this folder's runs); whether the time limit stopped any."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env[RECORD_ENV] = os.path.join(logs, OUTCOMES)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    # JAX shares these processes with CuPy and torch: it must not take most of the GPU's memory at its start
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    processes = []
    earlier = {name.split("-")[0] for name in os.listdir(logs) if name.startswith("run")}
    prefix = os.path.join(logs, f"run{len(earlier) + 1}")
    for number, run in enumerate(runs):
        ids_file = f"{prefix}-shard{number}.ids"
        with open(ids_file, "w") as f:
            f.write("".join(os.path.join(root, nodeid) + "\n" for nodeid in run))
        log = open(f"{prefix}-shard{number}.log", "w")
        command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "--tb=short", "-p", "no:cacheprovider",
                   "-p", RECORD_PLUGIN, "-m", marker, f"@{ids_file}"]
        processes.append(subprocess.Popen(command, cwd="/tmp", env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        log.close()
    deadline = None if time_limit is None else time.monotonic() + max(0.0, time_limit)
    while any(p.poll() is None for p in processes):
        if deadline is not None and time.monotonic() >= deadline:
            _stop(processes)
            return True
        time.sleep(0.2)
    return False


def summary(selected: list, before: dict, after: dict) -> tuple:
    """(lines to print, exit status) for the ids ``selected``: counts this run and overall, the failing ids."""
    def counts(record: dict) -> dict:
        found = {}
        for nodeid in selected:
            if nodeid in record:
                outcome = record[nodeid]["outcome"]
                found[outcome] = found.get(outcome, 0) + 1
        return found

    fresh = {i: o for i, o in after.items() if before.get(i) != o}
    overall = counts(after)
    left = sum(1 for i in selected if i not in after)
    failing = [i for i in selected if i in after and after[i]["outcome"] in FAILING]
    lines = ["this run: " + (", ".join(f"{n} {k}" for k, n in sorted(counts(fresh).items())) or "nothing finished"),
             "GPU SUITE TOTAL: " + ", ".join(f"{n} {k}" for k, n in sorted(overall.items()))
             + f"; {left} of {len(selected)} not run" + (" (again with --resume)" if left else "")]
    lines += [f"{after[i]['outcome'].upper()} {i}" for i in failing]
    if selected and set(overall) == {"skipped"}:
        lines.append("every test skipped: is a GPU visible to this process (and the package installed)?")
    return lines, (1 if failing else EXIT_LEFT if left else 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("selection", nargs="*", help="pytest paths or ids (default: tests/)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--logs", default="/tmp/gpu-suite", help="shard logs and the outcome record")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop the shards this long after the start, collection included (the outcomes so "
                        "far are kept)")
    parser.add_argument("--resume", action="store_true", help="run only the ids the record in --logs lacks")
    parser.add_argument("--durations-from", default="", metavar="PATH",
                        help="an earlier outcomes.jsonl whose seconds balance the shards")
    parser.add_argument("--marker", default="gpu", help="the pytest -m expression (default: gpu)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    root = os.getcwd()
    selection = [os.path.join(root, s) for s in args.selection] or [os.path.join(root, "tests")]
    os.makedirs(args.logs, exist_ok=True)
    record = os.path.join(args.logs, OUTCOMES)
    if not args.resume:
        for name in os.listdir(args.logs):
            if name == OUTCOMES or name.startswith("run"):
                os.remove(os.path.join(args.logs, name))
    before = read_outcomes(record)
    selected, collect_errors = collect(root, selection, args.marker)
    todo = [i for i in selected if i not in before]
    seconds = {i: o["seconds"] for i, o in read_outcomes(args.durations_from).items()}
    runs = contiguous_shards(todo, args.shards, seconds)
    print(f"collected {len(selected)} ids; {len(todo)} to run in {len(runs)} shards", flush=True)
    left_s = None if args.time_limit is None else args.time_limit - (time.monotonic() - started)
    stopped = run_shards(root, runs, args.logs, args.marker, left_s)
    after = read_outcomes(record)
    lines, status = summary(selected, before, after)
    if collect_errors:
        lines.append(collect_errors)
        status = 1
    if stopped:
        lines.insert(0, f"stopped at the time limit ({args.time_limit:.0f} s)")
    lines.insert(0, f"{time.monotonic() - started:.0f} s, {len(runs)} shards (logs: {args.logs})")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
