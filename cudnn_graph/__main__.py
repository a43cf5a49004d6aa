"""Command line: ``python -m cudnn_graph check [--json] [-v]``.

``check`` reports the environment (Python, packages, CUDA driver and GPUs, libcudnn) and every engine with
its status, then runs self-tests on the best engine available; the exit status is 0 when they pass."""
from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudnn_graph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="environment report and a self-test on the best engine")
    check.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    check.add_argument("--json", action="store_true",
                       help="print the report as one JSON object (for bug reports) instead of text")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING)
    if args.command == "check":
        from ._check import run_check
        return run_check(as_json=args.json)
    return 2


if __name__ == "__main__":
    sys.exit(main())
