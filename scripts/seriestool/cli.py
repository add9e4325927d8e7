"""Command line: ``python -m seriestool <command>``; each command's module has
``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .errors import SeriesError

COMMAND_MODULES = (
    "basecmd",
    "apply",
    "export",
    "check_manifest",
    "audit",
    "rebase",
    "compare",
    "restore",
    "status",
    "seriestest",
    "smoke",
    "pr",
    "device",
    "wheel",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="seriestool",
        description="Tooling for the vLLM weight-loader patch series.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"seriestool.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            return args.func(args)
        finally:
            sys.stdout.flush()  # a broken pipe shows here, not at interpreter exit
    except SeriesError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as SIGPIPE would; stdout
        # to /dev/null first, else Python's exit flush reports it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE  # a shell's status for a program SIGPIPE ended
    except OSError as e:  # after BrokenPipeError, which is one too
        # A full disk, an unwritable folder, a size limit: say so, no traceback.
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}; free space, or fix the permission or"
              " limit, and run again (a checkout an interrupted command left part-way is"
              f" named by the next run, with the one command that restores it)",
              file=sys.stderr)  # fmt: skip
        return 1
