"""Command line: ``python -m cudnn_graph check``."""
from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudnn_graph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="environment report and a self-test on the best engine")
    check.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING)
    if args.command == "check":
        from ._check import run_check
        return run_check()
    return 2


if __name__ == "__main__":
    sys.exit(main())
