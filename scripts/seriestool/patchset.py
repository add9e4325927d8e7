"""Patch files and commits as git sees them: stable patch IDs, subjects, paths.

Stable patch IDs are computed by ``git patch-id --verbatim``: unlike the
default, whitespace changes count, because indentation is meaning in Python
(an indentation-only change must not look identical).
"""

from __future__ import annotations

import email.header
import email.parser
import hashlib
from collections.abc import Sequence
from pathlib import Path

from . import git as g
from .errors import SeriesError


def patch_id_of_text(diff_text: str, cwd: Path) -> str | None:
    """Stable patch ID of one patch (format-patch file or diff text)."""
    output = g.out(cwd, "patch-id", "--verbatim", input=diff_text)
    return output.split()[0] if output else None


def patch_id_of_file(path: Path) -> str:
    """Stable patch ID of a format-patch file.

    Raises:
        SeriesError: the file holds no diff git can read.
    """
    pid = patch_id_of_text(path.read_text(), path.parent)
    if pid is None:
        raise SeriesError(f"{path} contains no diff: is it a git format-patch file?")
    return pid


def sha256_of_file(path: Path) -> str:
    """Hex sha256 of a patch file's bytes: every byte counts (author, message,
    line numbers), unlike the stable patch ID."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def subject_of_file(path: Path) -> str:
    """The patch's subject without the ``[PATCH n/m]`` prefix."""
    with path.open() as f:
        headers = email.parser.Parser().parse(f, headersonly=True)
    raw = headers.get("Subject")
    if raw is None:
        raise SeriesError(f"{path} has no Subject header: not a git format-patch file")
    subject = str(email.header.make_header(email.header.decode_header(raw)))
    subject = " ".join(subject.split())
    if subject.startswith("[PATCH"):
        subject = subject.split("]", 1)[1].strip()
    return subject


def commit_patch_ids(
    repo: Path, rev_range: str, paths: Sequence[str] = (), max_count: int | None = None
) -> list[tuple[str, str]]:
    """(commit, stable patch ID) for each non-merge commit of ``rev_range``.

    One ``git log -p | git patch-id`` pipeline for the whole range, so
    thousands of commits cost two processes.  With ``paths``, each commit's
    diff is limited to them (commits touching none of them are skipped).
    Commits are listed oldest first; ``max_count`` keeps only the newest ones.
    """
    args = ["log", "-p", "--reverse", "--no-merges", "--no-color", "--no-ext-diff", "--no-textconv",
            "--format=commit %H"]  # fmt: skip
    if max_count is not None:
        args.append(f"--max-count={max_count}")
    args.append(rev_range)
    if paths:
        args += ["--", *paths]
    return patch_ids_of_log(repo, g.git(repo, *args, text=False).stdout)


def patch_ids_of_log(repo: Path, log: bytes) -> list[tuple[str, str]]:
    """(commit, stable patch ID) for each commit of ``git log -p`` output."""
    ids = g.git(repo, "patch-id", "--verbatim", input=log, text=False).stdout.decode()
    return [(commit, pid) for pid, commit in (line.split() for line in ids.splitlines())]


def files_touched(repo: Path, patch: Path) -> list[str]:
    """Paths a patch file changes, both sides of renames, as git parses them.

    ``git apply --numstat`` names each file's post-image path; applied in
    reverse (``-R``) it names the pre-image path, so a rename contributes both.
    It runs at the top of ``repo``'s work tree: from a subdirectory, git apply
    would ignore every path outside it.
    """
    cwd = g.toplevel(repo) if g.is_repo(repo) else repo
    paths: set[str] = set()
    for reverse in ([], ["-R"]):
        numstat = g.out(cwd, "apply", *reverse, "--numstat", "-z", str(patch.resolve()))
        for entry in numstat.split("\0"):
            if entry:
                paths.add(entry.split("\t", 2)[2])
    return sorted(paths)


def am(
    repo: Path,
    patches: Sequence[Path],
    three_way: bool = True,
    env: dict[str, str] | None = None,
    hooks: Path | None = None,
) -> None:
    """``git am [--3way]`` the patches onto HEAD of ``repo``.

    Every option that a setting could change is given explicitly; hooks are
    off (``git.git``), unless ``hooks`` names a folder the tool made itself.

    Raises:
        SeriesError: a patch did not apply; the am session is left in
            progress for the caller to report and abort.
    """
    # --keep-non-patch: strip only "[PATCH]", keep "[Model Loader]"-style tags.
    args = ["am", "--quiet", "--no-keep-cr", "--keep-non-patch", "--no-scissors",
            "--no-message-id", "--no-gpg-sign", "--no-signoff", "--whitespace=nowarn"]  # fmt: skip
    if three_way:
        args.append("--3way")
    if hooks is not None:
        args = ["-c", f"core.hooksPath={hooks}", *args]
    g.git(repo, *args, *[str(p) for p in patches], env=env)


# `git status --porcelain` codes of unmerged paths.  In `git am --3way`, "us"
# is HEAD (``ours``: where the patches are applied) and "them" the patch.
_UNMERGED_KINDS = {
    "DU": "modify/delete (deleted in {ours}, modified by the patch)",
    "UD": "modify/delete (modified in {ours}, deleted by the patch)",
    "AU": "added in {ours}, unmerged",
    "UA": "added by the patch, unmerged",
    "DD": "deleted on both sides, unmerged",
}


def unmerged_paths(checkout: Path) -> list[tuple[str, str]]:
    """``(code, path)`` of every unmerged path, ``code`` as ``git status`` shows it.

    ``UU`` both modified, ``AA`` both added, ``DU``/``UD`` modify/delete,
    ``AU``/``UA``/``DD`` the leftovers of rename conflicts.
    """
    raw = g.out(checkout, "status", "--porcelain=v1", "-z", "--untracked-files=no")
    tokens = iter(raw.split("\0"))
    found = []
    for token in tokens:
        if len(token) < 4:
            continue
        code, path = token[:2], token[3:]
        if code[0] in "RC":
            next(tokens, None)  # the rename's source path
        if code in ("DD", "AU", "UD", "UA", "DU", "AA", "UU"):
            found.append((code, path))
    return found


def describe_conflict(code: str, path: str, marker_lines: Sequence[int], ours: str) -> str:
    """One report line for an unmerged ``path`` with ``git status`` code ``code``.

    ``marker_lines``: line numbers of the ``<<<<<<<`` markers in the work-tree
    file; they are what a both-modified (``UU``) or both-added (``AA``) file
    reports.  Any other code is a conflict about the file's existence, which
    markers cannot show: it is named as such.  ``ours`` names HEAD's side
    (e.g. "the new base").
    """
    if code in ("UU", "AA"):
        where = f" at line {', '.join(map(str, marker_lines))}" if marker_lines else ""
        both = " (added on both sides)" if code == "AA" else ""
        return f"conflict: {path}: {len(marker_lines)} conflicting hunk(s){where}{both}"
    kind = _UNMERGED_KINDS.get(code, f"unmerged ({code})").format(ours=ours)
    return f"conflict: {path}: {kind}"


def conflict_lines(checkout: Path, ours: str) -> list[str]:
    """A ``describe_conflict`` line for each unmerged path of a stopped ``git am``."""
    lines = []
    for code, path in unmerged_paths(checkout):
        full = checkout / path
        starts: list[int] = []
        if code in ("UU", "AA") and full.is_file():
            text = full.read_text(errors="replace").splitlines()
            starts = [n for n, line in enumerate(text, 1) if line.startswith("<<<<<<< ")]
        lines.append(describe_conflict(code, path, starts, ours))
    return lines
