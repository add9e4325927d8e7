"""``restore``: roll back the journal an interrupted command left, and nothing
else (docs/checkout-safety.md).  Runs with the system Python alone.
"""

from __future__ import annotations

from pathlib import Path

from . import git as g
from . import hints, journal, rebase
from .apply import default_checkout
from .errors import SeriesError


def restore(repo: Path, force: bool = False, log=print) -> int:
    """Roll back the journal left in ``repo``; 0 also when there is none."""
    if not g.is_repo(repo):
        raise SeriesError(f"{hints.no_checkout(repo)}: VLLM= must name the checkout to restore")
    with journal.locked(repo):  # the command that is changing it, if any, restores it itself
        tx = journal.Transaction.load(repo)
        if tx is None:
            log(f"nothing to restore in {repo}: no interrupted change is recorded there")
            return 0
        if tx.journal.op == "rebase" and rebase.state_path().exists():
            raise SeriesError(
                f"{tx.repo} is in a rebase session that keeps a conflict; end it with\n"
                f"    {hints.make('rebase', ABORT='1')}"
            )
        op = tx.journal.op
        undone = tx.foreign_changes(None if force else journal.restore_command(tx.repo, True))
        notes = tx.rollback()
    log(f"restored {tx.repo} as it was before the interrupted {op}")
    if undone:
        log(f"  also undone, as FORCE asked (changes the {op} did not make):")
        log("\n".join(f"    {line}" for line in undone))
    for note in notes:
        log(f"  {note}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("restore", help="undo what an interrupted apply left in a checkout")
    p.add_argument(
        "--vllm",
        type=hints.user_path,
        help="the checkout (default: work/vllm, the one `make apply` makes)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="roll back also when the checkout changed since in ways the interrupted"
        " command could not have made, undoing those changes (FORCE=1)",
    )
    p.set_defaults(func=lambda a: restore(Path(a.vllm) if a.vllm else default_checkout(), a.force))
