"""``restore``: put back a checkout that an interrupted command left part-way.

``apply`` (and ``rebase`` in a checkout) journal a checkout before changing
it (``journal``).  When the tool is killed before it could undo its own work,
the next run refuses and prints ``make restore VLLM=<checkout>``: this
command.  It rolls the checkout back to the journaled state byte for byte:
HEAD, index, work tree, refs and config; untracked and ignored files were
never touched.  Runs with the system Python alone (no .venv needed).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import git as g
from . import hints, journal, rebase
from .apply import default_checkout
from .errors import SeriesError


def restore(repo: Path, log=print) -> int:
    """Roll back the journal left in ``repo``; 0 also when there is none.

    Raises:
        SeriesError: ``repo`` is no checkout, or the journal's process still runs.
    """
    if not g.is_repo(repo):
        raise SeriesError(f"{repo} is not a git checkout: VLLM= must name the checkout to restore")
    tx = journal.Transaction.load(repo)
    if tx is None:
        log(f"nothing to restore in {repo}: no interrupted change is recorded there")
        return 0
    if journal.pid_alive(tx.journal.pid):
        raise SeriesError(
            f"the {tx.journal.op} that is changing {tx.repo} still runs (pid {tx.journal.pid});"
            " wait for it, or stop it (it then restores the checkout itself)"
        )
    if tx.journal.op == "rebase" and rebase.state_path().exists():
        raise SeriesError(
            f"{tx.repo} is in a rebase session that keeps a conflict; end it with\n"
            f"    {hints.make('rebase', ABORT='1')}"
        )
    notes = tx.rollback()
    log(f"restored {tx.repo} exactly as it was before the interrupted {tx.journal.op}")
    for note in notes:
        log(f"  {note}")
    return 0


def run(args: argparse.Namespace) -> int:
    return restore(Path(args.vllm) if args.vllm else default_checkout())


def register(subparsers) -> None:
    p = subparsers.add_parser("restore", help="undo what an interrupted apply left in a checkout")
    p.add_argument("--vllm", help="the checkout (default: work/vllm, the one `make apply` makes)")
    p.set_defaults(func=run)
