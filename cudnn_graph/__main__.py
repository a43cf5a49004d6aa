"""Command line: ``python -m cudnn_graph check [--json] [-v]``; ``python -m cudnn_graph --c-flags --libs``.

``check`` reports the environment (Python, packages, CUDA driver and GPUs, libcudnn) and every engine with
its status, then runs self-tests on the best engine available; the exit status is 0 when they pass.
``--c-flags`` / ``--libs`` print the compiler / linker flags of the C runtime (pkg-config style, docs/c_api.md)."""
from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudnn_graph", description=__doc__)
    parser.add_argument("--c-flags", action="store_true", help="print the C runtime's compiler flags (-I...)")
    parser.add_argument("--libs", action="store_true", help="print the C runtime's linker flags (-L... -l...)")
    sub = parser.add_subparsers(dest="command")
    check = sub.add_parser("check", help="environment report and a self-test on the best engine")
    check.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    check.add_argument("--json", action="store_true",
                       help="print the report as one JSON object (for bug reports) instead of text")
    args = parser.parse_args(argv)
    if args.c_flags or args.libs:
        return _print_c_runtime_flags(args.c_flags, args.libs)
    if args.command is None:
        parser.error("a command (check) or --c-flags / --libs is required")
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING)
    if args.command == "check":
        from ._check import run_check
        return run_check(as_json=args.json)
    return 2


def _print_c_runtime_flags(want_c_flags: bool, want_libs: bool) -> int:
    from . import _c_runtime
    words = ([_c_runtime.c_flags()] if want_c_flags else []) + ([_c_runtime.libs()] if want_libs else [])
    sys.stdout.write(" ".join(words) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
