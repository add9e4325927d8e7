"""Throw-away repositories that read a user's objects (``alternates``) and
nothing else of theirs: ``view``, ``checkout`` (sparse), ``quarantine``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import git as g
from . import hints, patchset, placement
from .errors import SeriesError

# Files of paths git reads as bytes: written as ``git.encode`` writes them.
_PATHS = {"encoding": "utf-8", "errors": "surrogateescape"}


def _add_lines(path: Path, lines: Sequence[str]) -> None:
    known = path.read_text(**_PATHS).splitlines() if path.exists() else []
    path.write_text("".join(f"{line}\n" for line in dict.fromkeys([*known, *lines])), **_PATHS)


def add_alternate(scratch: Path, repo: Path) -> None:
    """Let the scratch repository ``scratch`` read ``repo``'s objects too (nothing is
    copied; alternates it had are kept)."""
    gdir, source = g.git_dir(scratch), g.common_dir(repo)
    info = gdir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    _add_lines(info / "alternates", [str(source / "objects")])
    shallow = source / "shallow"
    if shallow.exists():  # a shallow clone's history ends there; so must ours
        _add_lines(gdir / "shallow", shallow.read_text(encoding="ascii").split())


@contextlib.contextmanager
def view(repo: Path) -> Iterator[Path]:
    """A bare scratch repository reading ``repo``'s objects; removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="seriestool-view-") as tmp:
        path = Path(tmp) / "view.git"
        g.git(tmp, "init", "-q", "--bare", "--template=", str(path))
        add_alternate(path, repo)
        yield path


def make_checkout(repo: Path, dest: Path, start: str, paths: Sequence[str]) -> Path:
    """A scratch checkout at ``dest`` of ``start`` (detached), only ``paths`` in its work tree."""
    g.git(dest.parent, "init", "-q", "--template=", str(dest))
    gdir = dest / ".git"
    add_alternate(dest, repo)
    g.git(dest, "config", "core.sparseCheckout", "true")
    g.git(dest, "config", "core.sparseCheckoutCone", "false")
    (gdir / "info").mkdir(exist_ok=True)
    (gdir / "info" / "sparse-checkout").write_text(
        "".join(f"{sparse_pattern(p)}\n" for p in paths) or "!/*\n", **_PATHS
    )
    g.git(dest, "checkout", "-q", "--detach", start)
    return dest


@contextlib.contextmanager
def checkout(repo: Path, start: str, paths: Sequence[str]) -> Iterator[Path]:
    """``make_checkout`` in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="seriestool-scratch-") as tmp:
        yield make_checkout(repo, Path(tmp) / "scratch", start, paths)


@contextlib.contextmanager
def quarantine(repo: Path) -> Iterator[dict[str, str]]:
    """The environment for git calls whose new objects ``repo`` gains only on
    ``settle``: until then they wait in a folder of their own, which git reads
    besides ``repo``'s objects and which is removed when the block ends."""
    objects = g.common_dir(repo) / "objects"
    with tempfile.TemporaryDirectory(prefix="tmp_objdir-seriestool-", dir=objects) as tmp:
        yield {"GIT_OBJECT_DIRECTORY": tmp, "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects)}


def settle(env: dict[str, str]) -> list[Path]:
    """Move the objects ``quarantine``'s ``env`` kept aside into the repository
    (pack indexes last: git counts a pack once its index is there); returns
    them, for ``unsettle``."""
    src, dst = Path(env["GIT_OBJECT_DIRECTORY"]), Path(env["GIT_ALTERNATE_OBJECT_DIRECTORIES"])
    moved = []
    for path in sorted(src.rglob("*"), key=lambda p: (p.suffix == ".idx", p)):
        target = dst / path.relative_to(src)
        if path.is_file() and not target.exists():
            target.parent.mkdir(exist_ok=True)
            os.replace(path, target)
            moved.append(target)
    return moved


def unsettle(moved: list[Path]) -> None:
    """Remove what ``settle`` moved (no ref may point at it any more): indexes first."""
    for path in sorted(moved, key=lambda p: p.suffix != ".idx"):
        path.unlink(missing_ok=True)


def sparse_pattern(path: str) -> str:
    """A gitignore-style pattern matching exactly ``path`` (anchored, escaped)."""
    return "/" + re.sub(r"([\\*?\[]| \Z)", r"\\\1", path)  # a trailing space, too


def apply_patches(
    checkout: Path,
    patch_files: Sequence[Path],
    images: Sequence[patchset.Image],
    ours: str,
    env: dict[str, str] | None = None,
) -> list[str]:
    """``git am --3way`` each patch onto HEAD of scratch ``checkout``, each commit
    checked against the patch's recorded images (``placement``); returns the
    commits.  ``ours`` names HEAD in the refusals; ``env``: the committer."""
    commits: list[str] = []
    before = g.out(checkout, "rev-parse", "HEAD")
    for number, (path, image) in enumerate(zip(patch_files, images, strict=True), 1):
        try:
            patchset.am(checkout, [path], env=env)
        except SeriesError as e:
            raise SeriesError(
                f"patch {path.name} does not apply on {ours}: it is number {number} of the series"
                + "".join(f"\n  {line}" for line in patchset.failure_lines(checkout, str(e), ours))
            ) from None
        after = g.out(checkout, "rev-parse", "HEAD")
        if after == before:
            raise SeriesError(
                f"patch {path.name} made no commit on {ours}: an empty patch?"
                f" run `{hints.make('check-manifest')}`"
            )
        disagree = placement.check(checkout, before, after, image, ours=ours)
        if disagree:
            raise SeriesError(
                f"patch {path.name} does not give its recorded result on {ours}:\n  "
                + "\n  ".join(disagree)
            )
        commits.append(after)
        before = after
    return commits
