"""Patch files and commits as git sees them: stable patch IDs (``git patch-id
--verbatim``: indentation is meaning in Python), subjects, paths.
"""

from __future__ import annotations

import email.header
import email.parser
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import git as g
from .base import sha256_of as sha256_of_file  # every byte counts, unlike in a patch ID
from .errors import SeriesError

# A file as a tree holds it: (mode, blob id); a patch's view of one file:
# (preimage, postimage), None where the file is absent.
Entry = tuple[str, str]
Image = dict[str, tuple[Entry | None, Entry | None]]


# What git reads from a patch file depends only on its bytes: asked once per
# process (check-manifest, then the command itself, read the same files).
_patch_ids: dict[str, str] = {}
_numstats: dict[str, list[str]] = {}


def patch_id_of_file(path: Path) -> str:
    """Stable patch ID of a format-patch file."""
    key = sha256_of_file(path)
    if key not in _patch_ids:
        output = g.out(path.parent, "patch-id", "--verbatim", input=path.read_bytes())
        if not output:
            raise SeriesError(f"{path} contains no diff: is it a git format-patch file?")
        _patch_ids[key] = output.split()[0]
    return _patch_ids[key]


def subject_of_file(path: Path) -> str:
    """The patch's subject without the ``[PATCH n/m]`` prefix."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    raw = email.parser.Parser().parsestr(text, headersonly=True)["Subject"]
    if raw is None:
        raise SeriesError(f"{path} has no Subject header: not a git format-patch file")
    subject = str(email.header.make_header(email.header.decode_header(raw)))
    subject = " ".join(subject.split())
    if subject.startswith("[PATCH"):
        subject = subject.split("]", 1)[1].strip()
    return subject


def commit_patch_ids(
    repo: Path, rev_range: str, paths: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """(commit, stable patch ID) for each non-merge commit of ``rev_range``, oldest
    first, by one ``git log -p | git patch-id`` pipeline; with ``paths``, diffs
    on them only."""
    args = ["log", "-p", "--reverse", "--no-merges", "--no-color", "--no-ext-diff", "--no-textconv",
            "--format=commit %H", rev_range]  # fmt: skip
    if paths:
        args += ["--", *paths]
    return patch_ids_of_log(repo, g.git(repo, *args, text=False).stdout)


def patch_ids_of_log(repo: Path, log: bytes) -> list[tuple[str, str]]:
    """(commit, stable patch ID) for each commit of ``git log -p`` output."""
    ids = g.git(repo, "patch-id", "--verbatim", input=log, text=False).stdout.decode()
    return [(commit, pid) for pid, commit in (line.split() for line in ids.splitlines())]


def patch_ids_of_commits(
    repo: Path, commits: Sequence[str], pathspecs: Sequence[str] = (), unified: int | None = None
) -> dict[str, str]:
    """Stable verbatim patch ID of each commit with a diff (on ``pathspecs``), in one
    pipeline comparable with ``commit_patch_ids`` (``unified=0``: context left out)."""
    context = [] if unified is None else [f"--unified={unified}"]
    log = g.git(
        repo, "log", "-p", *context, "--no-walk=unsorted", "--stdin", "--no-merges", "--no-color",
        "--no-ext-diff", "--no-textconv", "--format=commit %H", "--", *pathspecs,
        input="".join(f"{c}\n" for c in commits), text=False,
    ).stdout  # fmt: skip
    return dict(patch_ids_of_log(repo, log))


def files_touched(repo: Path, patch: Path) -> list[str]:
    """Paths a patch file changes, both sides of renames (``git apply --numstat``,
    forward and ``-R``), run at the top of ``repo``: git apply ignores paths
    outside the folder it runs in."""
    key = sha256_of_file(patch)
    if key not in _numstats:
        cwd = g.toplevel(repo) if g.is_repo(repo) else repo
        paths: set[str] = set()
        for reverse in ([], ["-R"]):
            numstat = g.out(cwd, "apply", *reverse, "--numstat", "-z", str(patch.resolve()))
            paths.update(entry.split("\t", 2)[2] for entry in numstat.split("\0") if entry)
        _numstats[key] = sorted(paths)
    return _numstats[key]


def am(
    repo: Path,
    patches: Sequence[Path],
    env: dict[str, str] | None = None,
    hooks: Path | None = None,
) -> None:
    """``git am --3way`` the patches onto HEAD of ``repo``, every option a setting
    could change given; hooks off but ``hooks`` (the tool's own); committer:
    ``env``'s, else ``git.SCRATCH_COMMITTER`` (a checkout of the user's gets
    ``git.user_identity``).  A failure leaves the am session to the caller."""
    # --keep-non-patch: strip only "[PATCH]", keep "[Model Loader]"-style tags.
    args = ["am", "--quiet", "--no-keep-cr", "--keep-non-patch", "--no-scissors", "--3way",
            "--no-message-id", "--no-gpg-sign", "--no-signoff", "--whitespace=nowarn"]  # fmt: skip
    if hooks is not None:
        args = ["-c", f"core.hooksPath={hooks}", *args]
    if not (env and "GIT_COMMITTER_NAME" in env):
        env = {**g.SCRATCH_COMMITTER, **(env or {})}
    g.git(repo, *args, *[str(p) for p in patches], env=env)


# What each patch does to each file, from its `index` lines.


def images(patches: Sequence[Path]) -> list[Image]:
    """For each patch: ``{path: (preimage, postimage)}`` as its ``index`` lines record
    them (``git apply --build-fake-ancestor``, forward and reversed, in an empty
    repository); None: absent on that side.  A mode change alone is left out."""
    return images_and_paths(patches)[0]


def images_and_paths(patches: Sequence[Path]) -> tuple[list[Image], list[list[str]]]:
    """``images(patches)``, and every path each patch touches (``files_touched``)."""
    result, touched = [], []
    with tempfile.TemporaryDirectory(prefix="seriestool-images-") as tmp:
        gdir = Path(tmp) / "empty.git"
        g.git(tmp, "init", "-q", "--bare", "--template=", str(gdir))
        for patch in patches:
            paths = files_touched(gdir, patch)
            touched.append(paths)
            sides = [_fake_ancestor(gdir, patch, reverse, Path(tmp)) for reverse in (False, True)]
            if sides[0] is None or sides[1] is None:  # a section without blob ids
                sides = [{}, {}]
                for path in paths:
                    for side, reverse in zip(sides, (False, True), strict=True):
                        side.update(_fake_ancestor(gdir, patch, reverse, Path(tmp), path) or {})
                recorded = set(sides[0]) | set(sides[1])
                paths = [p for p in paths if p in recorded]
            pre, post = sides
            result.append({path: (pre.get(path), post.get(path)) for path in paths})
    return result, touched


def _fake_ancestor(
    gdir: Path, patch: Path, reverse: bool, tmp: Path, only: str | None = None
) -> dict[str, Entry] | None:
    """Entries of the index ``git apply --build-fake-ancestor`` builds; None on failure."""
    index = tmp / "fake-index"
    index.unlink(missing_ok=True)
    args = ["--git-dir", str(gdir), "apply", f"--build-fake-ancestor={index}"]
    args += ["-R"] if reverse else []
    args += [f"--include={only}"] if only else []
    if g.git(gdir, *args, str(patch.resolve()), check=False).returncode != 0:
        return None
    if not index.exists():
        return {}
    # One entry per path, at stage 0: (mode, blob id).
    return {path: stages[0][:2] for path, stages in g.index_entries(gdir, index).items()}


def states(
    base: dict[str, str | None], patch_images: Sequence[Image]
) -> list[dict[str, str | None]]:
    """Blob id of every file after each prefix of the series, ``[base, after 1, ...]``
    (``base``: as the manifest records it, None for an absent file)."""
    current = dict(base)
    result = [dict(current)]
    for image in patch_images:
        for path, (_pre, post) in image.items():
            current[path] = post[1] if post else None
        result.append(dict(current))
    return result


# `git status --porcelain` codes of unmerged paths.  In `git am --3way`, "us"
# is HEAD (``ours``: where the patches are applied) and "them" the patch.
_UNMERGED_KINDS = {
    "DU": "modify/delete (deleted in {ours}, modified by the patch)",
    "UD": "modify/delete (modified in {ours}, deleted by the patch)",
    "AU": "added in {ours}, unmerged",
    "UA": "added by the patch, unmerged",
    "DD": "deleted on both sides, unmerged",
}
# The code of an unmerged path by the stages the index holds (1: base, 2: ours, 3: theirs).
_STAGES = {"1": "DD", "2": "AU", "12": "UD", "3": "UA", "13": "DU", "23": "AA", "123": "UU"}


def describe_conflict(code: str, path: str, marker_lines: Sequence[int], ours: str) -> str:
    """One report line for an unmerged ``path`` with ``git status`` code ``code``: the
    ``<<<<<<<`` ``marker_lines`` of a both-modified or both-added file, else the
    kind of conflict about its existence (``ours``: HEAD's side, in words)."""
    if code in ("UU", "AA"):
        where = f" at line {', '.join(map(str, marker_lines))}" if marker_lines else ""
        both = " (added on both sides)" if code == "AA" else ""
        return f"conflict: {path}: {len(marker_lines)} conflicting hunk(s){where}{both}"
    kind = _UNMERGED_KINDS.get(code, f"unmerged ({code})").format(ours=ours)
    return f"conflict: {path}: {kind}"


# git's lines naming a file a hunk of the patch did not apply to.
_PATCH_FAILED = re.compile(r"error: (?:patch failed: (.+):\d+|(.+): patch does not apply)$")


def failure_lines(checkout: Path, git_output: str, ours: str) -> list[str]:
    """Why a ``git am --3way`` stopped: each unmerged file with the kind of its
    conflict, and git's own error lines of ``git_output`` (its stderr)."""
    entries = g.index_entries(checkout).items()
    unmerged = [
        (_STAGES["".join(e[2] for e in es)], path) for path, es in entries if es[0][2] != "0"
    ]
    lines = []
    for code, path in unmerged:
        full = checkout / path
        starts: list[int] = []
        if code in ("UU", "AA") and full.is_file():
            text = full.read_text(errors="replace").splitlines()
            starts = [n for n, line in enumerate(text, 1) if line.startswith("<<<<<<< ")]
        lines.append(describe_conflict(code, path, starts, ours))
    conflicted = {path for _code, path in unmerged}
    lines = lines or [
        "no file was merged with conflict markers: the patch could not be"
        " applied even with a 3-way merge"
    ]
    said = re.findall(r"(?:error|CONFLICT|warning)[: (].*", git_output)
    for line in dict.fromkeys(line.strip() for line in said):  # each once, in order
        # git's "patch failed: FILE" of a file the 3-way merge then merged
        # cleanly is no conflict: only files left unmerged are named.
        named = _PATCH_FAILED.match(line)
        if not (named and conflicted and (named[1] or named[2]) not in conflicted):
            lines.append(f"git: {line}")
    return lines
