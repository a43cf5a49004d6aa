"""A pytest plugin for tools/gpu_suite.py: one JSON line per finished test, appended to the file
``$CUDNN_GRAPH_GPU_SUITE_RECORD`` names ({"nodeid", "outcome", "seconds"}), written and flushed as each
test ends, so that a shard stopped at its time limit keeps every outcome it reached.

The outcome is pytest's: "passed", "failed" or "skipped" from the test's call, "error" where its setup or
teardown failed, "skipped" where its setup skipped it. The node id is pytest's, relative to the rootdir.
"""
from __future__ import annotations

import json
import os

RECORD_ENV = "CUDNN_GRAPH_GPU_SUITE_RECORD"       # the file to append to (tools/gpu_suite.py sets it)
_seen = {}          # nodeid -> [outcome, seconds] of the phases reported so far


def pytest_runtest_logreport(report):
    found = _seen.setdefault(report.nodeid, ["passed", 0.0])
    found[1] += report.duration
    if report.when == "call":
        if found[0] == "passed":
            found[0] = report.outcome
    elif report.failed:
        found[0] = "error"
    elif report.skipped and report.when == "setup":
        found[0] = "skipped"


def pytest_runtest_logfinish(nodeid, location):
    path = os.environ.get(RECORD_ENV)
    found = _seen.pop(nodeid, None)
    if not path or found is None:
        return
    line = json.dumps({"nodeid": nodeid, "outcome": found[0], "seconds": round(found[1], 3)})
    # one write of a whole line with O_APPEND: the shards share the file
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
