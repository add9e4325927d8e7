"""``status`` and ``remove``: which series a checkout carries; taking it out."""

from __future__ import annotations

from pathlib import Path

from . import apply, hints, journal, versions
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError


def _open(repo: Path) -> tuple[Path, str | None, str | None]:
    """The checkout's top folder, its branch and HEAD's commit."""
    repo = g.checkout_top(repo)
    branch = g.out(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False) or None
    return repo, branch, g.rev(repo, "HEAD")


def status(repo: Path, patch_dir: Path = manifest_mod.PATCH_DIR, log=print) -> int:
    """Print which series ``repo``'s HEAD carries, on which base, and what is beyond it."""
    repo, branch, head = _open(repo)
    log(f"checkout {repo}: HEAD {'on branch ' + branch if branch else 'detached'} at {head}")
    held, at_base = versions.held_in(repo, head, patch_dir), False
    b = manifest_mod.load(patch_dir / versions.MANIFEST).base
    if held:
        count = "all" if held.held == held.total else f"{held.held} of"
        log(f"series: {held.state.label}, {count} {held.total} patches applied")
    elif at_base := g.blob_ids(repo, head, sorted(b.touched_files)) == b.touched_files:
        log(f"series: none; HEAD has the files of the pinned base, {b.project} {b.version}")
    else:
        log("series: none; HEAD's files are not the pinned base's either")
    base = g.branch_config(repo, branch, apply.SERIES_BASE_KEY)
    if base:  # the commits remove DELETE=1 and apply refuse over, named
        mine = versions.listing(repo, versions.foreign_commits(repo, base, head, patch_dir))
        log(f"base: {base} (recorded by apply); commits on {branch} that are no series patch:"
            f" {len(mine)}" + "".join(f"\n  {line}" for line in mine))  # fmt: skip
    elif held:
        log("base: not recorded (HEAD is on no branch that `make apply` made)")
    if not base and not at_base:
        check = hints.make("check", CONSOLIDATED=branch or head, VLLM=str(repo),
                           PATCHES=hints.patches_var(patch_dir))  # fmt: skip
        log("If HEAD carries the series consolidated (squashed, merged, reworded, with commits"
            f" of yours), audit it against the series with\n    {check}")  # fmt: skip
    return 0


def remove(repo: Path, delete_branch: bool = False, log=print,
           patch_dir: Path = manifest_mod.PATCH_DIR) -> int:  # fmt: skip
    """Switch ``repo`` back to where apply started it (with ``delete_branch``, on no
    series branch: delete the one a plain remove kept); a refusal or a signal changes nothing."""
    with apply.interrupts.deferred() as guard, journal.locked(Path(repo)):
        repo, branch, head = _open(repo)
        apply.refuse_unsafe_state(repo)
        series, base = branch, g.branch_config(repo, branch, apply.SERIES_BASE_KEY)
        if not base and delete_branch:  # the series branch a plain remove kept
            series = manifest_mod.load(patch_dir / versions.MANIFEST).branch_name
            base = g.branch_config(repo, series, apply.SERIES_BASE_KEY)
        tip = head if series == branch else g.rev(repo, f"refs/heads/{series}")
        if not base or not tip:
            raise SeriesError(
                f"HEAD of {repo} is on no branch that `make apply` made (none records"
                f" branch.<name>.{apply.SERIES_BASE_KEY}); check out the series branch first"
            )
        trees = g.out(repo, "worktree", "list", "--porcelain") if series != branch else ""
        if f"branch refs/heads/{series}" in trees.splitlines():  # HEAD of another worktree
            listed = hints.git(repo, "worktree", "list")
            raise SeriesError(f"branch {series} is checked out in another worktree (`{listed}`):"
                              " check out another branch there; nothing was changed")  # fmt: skip
        mine = versions.foreign_commits(repo, base, tip, patch_dir) if delete_branch else []
        here = g.out(repo, "rev-list", tip, "--not", f"--exclude=refs/heads/{series}",
                     "--glob=refs/heads", *(["HEAD"] if series != branch else []))  # fmt: skip
        if mine := [c for c in mine if c in here.split()]:  # another branch's are not lost
            keep = (f"`{hints.make('remove', VLLM=str(repo))}` (without DELETE=1) keeps the"
                    " branch; " if series == branch else "")  # fmt: skip
            raise SeriesError(
                f"branch {series} holds {len(mine)} commit(s) of no series version this"
                f" repository knows, which DELETE=1 would delete; nothing was changed:\n  "
                + "\n  ".join(versions.listing(repo, mine))
                + f"\n{keep}to delete it all the same, first keep"
                f" them on a branch of their own (`{hints.git(repo, 'branch', 'my-work', tip)}`)"
            )
        if series != branch:  # HEAD stays where it is
            start = f"refs/heads/{branch}" if branch else head
        else:  # where apply started it, or the base where that branch is gone
            start = g.branch_config(repo, branch, apply.SERIES_FROM_KEY) or base
            start = start if g.rev(repo, start) else base
        target = g.rev(repo, start)
        changed = g.out(repo, "diff-tree", "-r", "-z", "--name-only", head, target).split("\0")
        paths = sorted(p for p in changed if p)
        now, then = g.blob_ids(repo, head, paths), g.blob_ids(repo, target, paths)
        created = {p: {then[p]} for p in paths if now[p] is None and then[p] is not None}
        ref = f"refs/heads/{series}"
        recorded = {f"branch.{series}.{key}": g.branch_config(repo, series, key)
                    for key in (apply.SERIES_BASE_KEY, apply.SERIES_FROM_KEY)}  # fmt: skip
        keys = [key for key, value in recorded.items() if delete_branch and value]
        scope = journal.Scope(
            paths={p: [then[p]] if then[p] else [] for p in paths},
            refs={start if start.startswith("refs/") else "HEAD": [target],
                  **({ref: []} if delete_branch else {})},
            config=dict.fromkeys(keys),  # unset
        )  # fmt: skip
        after = [("update-ref", "-d", ref, tip)] if delete_branch else []
        after += [("config", "--unset", key) for key in keys]
        apply.switch(repo, "remove", head, target, start, scope, created, log, after=after)
        guard.completed()
    if series == branch:
        log(f"removed the series from {repo}: HEAD is on {start.removeprefix('refs/heads/')}")
    back = " && ".join([hints.git(repo, "branch", series, tip)] + [
        hints.git(repo, "config", k, v) for k, v in recorded.items() if v])  # fmt: skip
    log(f"deleted branch {series} (`{back}` brings it back)" if delete_branch
        else f"branch {series} is kept (DELETE=1 deletes it)")  # fmt: skip
    return 0


def register(subparsers) -> None:
    for name, help_ in (("status", "which series version a checkout carries"),
                        ("remove", "take the series out of a checkout")):  # fmt: skip
        p = subparsers.add_parser(name, help=help_)
        p.add_argument("--vllm", type=hints.user_path, help="checkout (default: work/vllm)")
        p.add_argument("--patches-dir", metavar="DIR", help="series folder (default: patches/)")
        p.set_defaults(vllm=apply.default_checkout(), patches_dir=manifest_mod.PATCH_DIR)
    p.add_argument("--delete-branch", action="store_true", help="also delete the series branch")
    p.set_defaults(func=lambda a: remove(a.vllm, a.delete_branch, patch_dir=Path(a.patches_dir)))
    subparsers.choices["status"].set_defaults(func=lambda a: status(a.vllm, Path(a.patches_dir)))
