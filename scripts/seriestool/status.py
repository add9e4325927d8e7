"""``status`` and ``remove``: which series a checkout carries, and taking it out.

``status`` reads the checkout only.  Which series version HEAD carries is
judged as ``apply`` judges it: by the blob ids of the files each version
touches (``versions.held_in``), the series in ``patches/`` first, then its
earlier versions in this repository's history.  The base and the branch or
commit ``apply`` started from are what it recorded in the series branch's
config (``branch.<name>.seriesBase`` and ``.seriesFrom``).

``remove`` switches a checkout from a series branch back to where ``apply``
started it: that branch (wherever it is now), else the base commit, detached.
The switch is ``apply``'s own (``apply.switch``): journaled, never
overwriting an untracked or ignored file, undone by a failure or a signal.
The series branch is kept unless ``--delete-branch`` asks otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import apply, hints, journal, versions
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError


def _recorded(repo: Path, branch: str | None, key: str) -> str | None:
    if not branch:
        return None
    proc = g.git(repo, "config", "--get", f"branch.{branch}.{key}", check=False)
    return proc.stdout.strip() or None


def status(repo: Path, patch_dir: Path = manifest_mod.PATCH_DIR, log=print) -> int:
    """Print which series ``repo``'s HEAD carries, on which base, and what is beyond it."""
    if not g.is_repo(repo):
        raise SeriesError(f"{hints.no_checkout(repo)}: VLLM= must name a vLLM git checkout")
    repo = g.toplevel(repo)
    head = g.rev(repo, "HEAD")
    if head is None:
        raise SeriesError(f"{repo} has no commits")
    branch = g.out(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False) or None
    log(f"checkout {repo}: HEAD {'on branch ' + branch if branch else 'detached'} at {head[:12]}")
    held = versions.held_in(repo, head, patch_dir)
    current = manifest_mod.load(patch_dir / versions.MANIFEST)
    if held is None:
        paths = sorted(current.base.touched_files)
        at_base = g.blob_ids(repo, head, paths) == current.base.touched_files
        b = current.base
        log(f"series: none; HEAD has the pinned base's files ({b.project} {b.version}):"
            f" `make apply` applies v{current.version}" if at_base else
            "series: none; HEAD's files are not the pinned base's either")  # fmt: skip
    else:
        count = "all" if held.held == held.total else f"{held.held} of"
        newer = (
            ""
            if held.state.commit is None
            else f" (an earlier state; patches/ holds v{current.version})"
        )
        log(f"series: {held.state.label}, {count} {held.total} patches applied{newer}")
    base = _recorded(repo, branch, apply.SERIES_BASE_KEY)
    if base:
        log(f"base: {base[:12]} (recorded by apply in branch.{branch}.{apply.SERIES_BASE_KEY})")
        if held:
            on_top = g.out(repo, "rev-list", "--count", "--first-parent", f"{base}..HEAD")
            beyond = int(on_top) - held.held
            log(f"commits beyond the series on {branch}: {beyond}" if beyond >= 0 else
                f"{branch} has {on_top} commits on the base: patches combined")  # fmt: skip
    elif held:
        log("base: not recorded (HEAD is on no branch made by `make apply`)")
    others = g.git(repo, "config", "--get-regexp", r"^branch\..*\.seriesbase$", check=False)
    for line in others.stdout.splitlines():
        name = line.split(" ", 1)[0][len("branch.") : -len(".seriesbase")]
        if name != branch and g.rev(repo, f"refs/heads/{name}"):
            log(f"series branch: {name} (base {line.split(' ', 1)[1][:12]})")
    return 0


def remove(repo: Path, delete_branch: bool = False, log=print) -> int:
    """Switch ``repo`` from its series branch back to where apply started it.

    Raises:
        SeriesError: a refusal (HEAD on no series branch, a change in
            progress, a file in the way); the checkout is unchanged.
        interrupts.Interrupted: SIGINT, SIGTERM or SIGHUP; the checkout is unchanged.
    """
    with apply.interrupts.deferred() as guard:
        if not g.is_repo(repo):
            raise SeriesError(f"{hints.no_checkout(repo)}: VLLM= must name a vLLM git checkout")
        repo = g.toplevel(repo)
        apply.refuse_unsafe_state(repo)
        branch = g.out(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False) or None
        base = _recorded(repo, branch, apply.SERIES_BASE_KEY)
        if not base:
            raise SeriesError(
                f"HEAD of {repo} is on no branch that `make apply` made (none records"
                f" branch.<name>.{apply.SERIES_BASE_KEY}); `{hints.make('status', VLLM=str(repo))}`"
                " lists the series branches: check one out, or check out your own branch"
            )
        start = _recorded(repo, branch, apply.SERIES_FROM_KEY) or base
        if start.startswith("refs/") and not g.rev(repo, start):
            start = base  # the branch apply started from is gone
        target = g.rev(repo, start)
        head = g.out(repo, "rev-parse", "HEAD")
        changed = g.out(repo, "diff-tree", "-r", "-z", "--name-only", "--no-renames", head,
                        target).split("\0")  # fmt: skip
        paths = sorted(p for p in changed if p)
        now, then = g.blob_ids(repo, head, paths), g.blob_ids(repo, target, paths)
        created = {p: {then[p]} for p in paths if now[p] is None and then[p] is not None}
        in_the_way = journal.occupied(repo, created)
        if in_the_way:
            raise SeriesError(
                f"{start} has files where {repo} has untracked or ignored ones; remove never"
                " overwrites them:\n  " + "\n  ".join(in_the_way) + "\nmove them away and run again"
            )
        ref = f"refs/heads/{branch}"
        keys = [f"branch.{branch}.{key}" for key in (apply.SERIES_BASE_KEY, apply.SERIES_FROM_KEY)
                if _recorded(repo, branch, key)] if delete_branch else []  # fmt: skip
        scope = journal.Scope(
            paths={p: [then[p]] if then[p] else [] for p in paths},
            refs={start if start.startswith("refs/") else "HEAD": [target],
                  **({ref: []} if delete_branch else {})},
            config=dict.fromkeys(keys),
        )  # fmt: skip
        after = [("update-ref", "-d", ref, head)] if delete_branch else []
        after += [("config", "--unset", key) for key in keys]
        apply.switch(repo, "remove", head, target, start, scope, created, log, after=after)
        guard.completed()
    where = f"branch {start.removeprefix('refs/heads/')}" if start.startswith("refs/") else None
    log(f"removed the series from {repo}: HEAD is on {where or f'{target[:12]}, detached'}")
    if delete_branch:
        log(f"deleted branch {branch} (was {head[:12]}; `{hints.git(repo, 'branch', branch, head)}`"
            " brings it back)")  # fmt: skip
    else:
        log(f"branch {branch} is kept (`{hints.make('remove', VLLM=str(repo), DELETE='1')}`"
            " would delete it)")  # fmt: skip
    return 0


def _checkout(args: argparse.Namespace) -> Path:
    return Path(args.vllm) if args.vllm else apply.default_checkout()


def register(subparsers) -> None:
    help_vllm = "the vLLM checkout (default: work/vllm, the one `make apply` makes)"
    p = subparsers.add_parser("status", help="which series version a checkout carries")
    p.add_argument("--vllm", type=hints.user_path, help=help_vllm)
    p.add_argument("--patches-dir", metavar="DIR", help="series folder (default: patches/)")
    p.set_defaults(
        func=lambda a: status(_checkout(a), Path(a.patches_dir or manifest_mod.PATCH_DIR))
    )
    p = subparsers.add_parser("remove", help="take the series out of a checkout")
    p.add_argument("--vllm", type=hints.user_path, help=help_vllm)
    p.add_argument("--delete-branch", action="store_true", help="also delete the series branch")
    p.set_defaults(func=lambda a: remove(_checkout(a), a.delete_branch))
