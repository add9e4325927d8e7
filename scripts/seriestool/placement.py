"""Did ``git am`` put a patch where its recorded preimage says it belongs?
Its result is compared with ``git merge-file`` of target, preimage, postimage.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from pathlib import Path

from . import git as g
from .git import describe_blob as _oid
from .patchset import Image

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$", re.MULTILINE)


def check(repo: Path, before: str, after: str, image: Image, ours: str) -> list[str]:
    """One line per file where ``after`` (``git am``'s result on ``before``, named
    ``ours`` in the messages) is not what ``image`` gives; empty: agreed."""
    paths = sorted(image)
    target = g.tree_entries(repo, before, paths)
    result = g.tree_entries(repo, after, paths)
    found = []
    for path in paths:
        pre, post = (e[1] if e else None for e in image[path])
        t, r = (tree[path][1] if path in tree else None for tree in (target, result))
        if t == pre:
            if r != post:
                found.append(
                    f"placement: {path}: git am's result {_oid(r)} is not the patch's"
                    f" postimage {_oid(post)}, although {ours} holds its preimage"
                )
            continue
        if pre is None or post is None or t is None:
            found.append(
                f"placement: {path}: {ours} has {_oid(t)}, the patch expects {_oid(pre)}"
                f" and makes it {_oid(post)}; git am's {_oid(r)} cannot be checked by a 3-way merge"
            )
            continue
        if not g.has_object(repo, pre):
            found.append(
                f"placement: {path}: the patch's preimage blob {pre[:12]} is not in the"
                " repository, so where git am put its hunks cannot be checked"
            )
            continue
        merged, conflicts = merge_file(repo, t, pre, post)
        applied = g.blob(repo, r, check=True) if r else b""
        if conflicts:
            found.append(
                f"placement: {path}: git am applied the patch to {ours}, but the 3-way merge"
                f" from its recorded preimage {pre[:12]} has {conflicts} conflict(s)"
            )
        elif merged != applied:
            found.append(f"placement: {path}: " + _where(repo, t, r, merged, pre, post, ours))
    return found


def merge_file(repo: Path, ours: str, base: str, theirs: str) -> tuple[bytes, int]:
    """``git merge-file -p`` of three blobs: (merged bytes, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="seriestool-merge-") as tmp:
        files = [Path(tmp) / name for name in ("ours", "base", "theirs")]
        for path, oid in zip(files, (ours, base, theirs), strict=True):
            path.write_bytes(g.blob(repo, oid, check=True))
        proc = g.git(repo, "merge-file", "-p", "-q", *map(str, files), check=False, text=False)
    if proc.returncode < 0 or proc.returncode > 127:
        raise RuntimeError(f"git merge-file failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout, proc.returncode


def _changes(repo: Path, a: str, b: str) -> list[tuple[int, int, int, int]]:
    """(old start, old count, new start, new count) of each change from blob ``a`` to ``b``."""
    text = g.out(repo, "diff", "--no-color", "--no-ext-diff", "--no-textconv", "-U0", a, b)
    return [(int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)) for m in _HUNK.finditer(text)]


def _where(
    repo: Path, target: str, applied: str | None, merged: bytes, pre: str, post: str, ours: str
) -> str:
    """Which hunk landed elsewhere: the patch's hunk header, and the line of
    ``ours`` that git am changed and the line the 3-way merge changes."""
    merged_oid = g.out(repo, "hash-object", "-w", "--stdin", input=merged)
    by_am = _changes(repo, target, applied) if applied else []
    by_merge = _changes(repo, target, merged_oid)
    own = _changes(repo, pre, post)
    first = next(
        (i for i, (a, m) in enumerate(itertools.zip_longest(by_am, by_merge)) if a != m), 0
    )
    header = "?"
    if first < len(own):
        start = own[first][0]
        hunks = g.out(repo, "diff", "--no-color", "--no-ext-diff", "--no-textconv", pre, post)
        for m in _HUNK.finditer(hunks):
            if int(m[1]) <= start < int(m[1]) + int(m[2] or 1) or int(m[1]) == start:
                header = m[0].split(" @@")[0] + " @@"
                break
    am_line = by_am[first][0] if first < len(by_am) else None
    merge_line = by_merge[first][0] if first < len(by_merge) else None
    return (
        f"git am applied hunk `{header}` at line {am_line} of {ours}; the 3-way merge from"
        f" the recorded preimage {pre[:12]} puts it at line {merge_line}. They disagree, so"
        " the patch does not apply cleanly"
    )
