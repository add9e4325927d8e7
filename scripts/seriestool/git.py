"""Thin wrappers around git's own commands, and the repository-state guard.

Everything here shells out to git; nothing parses diffs by hand.  The state
guard (`RepoState`) is what lets apply and rebase promise that a failure
leaves the user's checkout exactly as it was: branch or detached HEAD, index
and work tree, with stash and untracked files never touched.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import SeriesError

# Settings that would make git's output depend on the user's configuration.
# They are pinned on every call so exports and patch IDs are reproducible.
_PINNED_CONFIG = (
    "core.quotepath=false",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.renames=true",
    "diff.algorithm=myers",
    "diff.indentHeuristic=true",
    "diff.suppressBlankEmpty=false",
    "diff.context=3",
    "core.abbrev=12",
    "format.signature=",
    "format.numbered=auto",
    "format.coverLetter=false",
    "format.headers=",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "commit.gpgSign=false",
    "am.keepcr=false",
    "am.threeWay=false",
    "i18n.commitEncoding=UTF-8",
    "i18n.logOutputEncoding=UTF-8",
)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Stable, untranslated messages: callers quote git's errors to users.
    env["LC_ALL"] = "C"
    env["LANGUAGE"] = "C"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


def git(
    repo: Path | str,
    *args: str,
    input: str | bytes | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``git -C repo args...`` with pinned output settings.

    Raises:
        SeriesError: git exited non-zero and ``check`` is true; the message
            carries the command and git's own stderr.
    """
    cmd = ["git", "-C", str(repo)]
    for setting in _PINNED_CONFIG:
        cmd += ["-c", setting]
    cmd += list(args)
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        env=_env(env),
        text=text,
        check=False,
    )
    if check and proc.returncode != 0:
        stderr = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise SeriesError(f"git {' '.join(args[:3])} failed in {repo}: {stderr.strip()}")
    return proc


def out(repo: Path | str, *args: str, **kwargs) -> str:
    """stdout of a git command, without the trailing newline."""
    return git(repo, *args, **kwargs).stdout.rstrip("\n")


def is_repo(path: Path) -> bool:
    proc = git(path, "rev-parse", "--is-inside-work-tree", check=False)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def toplevel(path: Path) -> Path:
    return Path(out(path, "rev-parse", "--show-toplevel"))


def git_dir(repo: Path) -> Path:
    return Path(out(repo, "rev-parse", "--absolute-git-dir"))


def rev(repo: Path, ref: str) -> str | None:
    """Full commit id of ``ref``, or None when it does not name a commit."""
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return proc.stdout.strip() or None


def tree_entries(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``(mode, blob id)`` of each of ``paths`` that is a file in ``commit``.

    Paths are matched literally; a path the tree lacks is left out.
    """
    if not paths:
        return {}
    wanted = set(paths)
    listing = out(repo, "--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", commit,
                  "--", *paths)  # fmt: skip
    entries = {}
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, oid = meta.split()
        if kind == "blob" and path in wanted:
            entries[path] = (mode, oid)
    return entries


def blob_ids(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, str | None]:
    """Blob id of each path in ``commit``; None for a path the tree lacks."""
    entries = tree_entries(repo, commit, paths)
    return {path: entries[path][1] if path in entries else None for path in paths}


def operation_in_progress(repo: Path) -> str | None:
    """Name of an am/rebase/merge/cherry-pick/revert/bisect in progress, if any."""
    gdir = git_dir(repo)
    markers = {
        "rebase-apply/applying": "git am",
        "rebase-apply": "git rebase (apply backend)",
        "rebase-merge": "git rebase",
        "MERGE_HEAD": "git merge",
        "CHERRY_PICK_HEAD": "git cherry-pick",
        "REVERT_HEAD": "git revert",
        "BISECT_LOG": "git bisect",
    }
    for marker, name in markers.items():
        if (gdir / marker).exists():
            return name
    return None


def tracked_changes(repo: Path) -> list[str]:
    """Staged or unstaged changes to tracked files (untracked files ignored)."""
    status = out(repo, "status", "--porcelain=v1", "--untracked-files=no")
    return [line for line in status.splitlines() if line.strip()]


@dataclasses.dataclass(frozen=True)
class RepoState:
    """Where a checkout stands: enough to put it back exactly.

    Only taken on a clean work tree (callers refuse dirty trees first), so the
    index and work tree are fully described by HEAD.
    """

    repo: Path
    head: str
    branch: str | None  # None: detached HEAD
    branch_tips: dict[str, str]
    stash: str | None

    @classmethod
    def capture(cls, repo: Path) -> RepoState:
        head = rev(repo, "HEAD")
        if head is None:
            raise SeriesError(f"{repo} has no commits; check out a vLLM revision first")
        proc = git(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        branch = proc.stdout.strip() or None
        tips = {}
        listing = out(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads")
        for line in listing.splitlines():
            name, oid = line.rsplit(" ", 1)
            tips[name] = oid
        return cls(repo, head, branch, tips, rev(repo, "refs/stash"))

    def restore(self) -> None:
        """Put HEAD, branch, index and work tree back; drop branches made since.

        Never touches untracked files or the stash.
        """
        if self.branch is not None:
            git(self.repo, "checkout", "-q", "--force", self.branch)
        else:
            git(self.repo, "checkout", "-q", "--force", "--detach", self.head)
        git(self.repo, "reset", "-q", "--hard", self.head)
        now = RepoState.capture(self.repo)
        for name, oid in now.branch_tips.items():
            if name not in self.branch_tips:
                git(self.repo, "branch", "-q", "-D", name)
            elif oid != self.branch_tips[name]:
                git(self.repo, "update-ref", f"refs/heads/{name}", self.branch_tips[name])
