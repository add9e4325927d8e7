"""Throw-away repositories that read a user's objects and nothing else of theirs.

A scratch repository lives in a temporary folder and borrows the user's
objects through git's ``objects/info/alternates`` (nothing is copied;
``add_alternate`` lends it another repository's, e.g. a materialised base).  It
has none of the user's configuration, hooks, ``info/attributes``, replace
refs or notes: what git produces there (patches, patch IDs, commits) does not
depend on how the user set up their repository.  The user's repository is
only read.

- ``view``: a bare repository, for reading history (``format-patch``,
  ``log -p``).
- ``checkout``: a repository with a sparse work tree holding only the given
  paths at a commit, for ``git am`` (a vLLM tree has thousands of files; the
  series touches a few).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import git as g

# Identity of commits made in scratch repositories (apply passes the user's).
IDENTITY = {"user.name": "vLLM loader series", "user.email": "series@localhost"}


def _borrow_objects(scratch_git_dir: Path, repo: Path) -> None:
    """Add ``repo``'s objects to the scratch repository's alternates (kept: earlier ones)."""
    source = g.common_dir(repo)
    info = scratch_git_dir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    _add_lines(info / "alternates", [str(source / "objects")])
    shallow = source / "shallow"
    if shallow.exists():  # a shallow clone's history ends there; so must ours
        _add_lines(scratch_git_dir / "shallow", shallow.read_text().split())


def _add_lines(path: Path, lines: Sequence[str]) -> None:
    known = path.read_text().splitlines() if path.exists() else []
    new = [line for line in lines if line not in known]
    if new:
        path.write_text("".join(f"{line}\n" for line in [*known, *new]))


def add_alternate(scratch: Path, repo: Path) -> None:
    """Let the scratch repository ``scratch`` read ``repo``'s objects too (nothing is copied)."""
    _borrow_objects(g.git_dir(scratch), repo)


@contextlib.contextmanager
def view(repo: Path) -> Iterator[Path]:
    """A bare scratch repository reading ``repo``'s objects; removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="seriestool-view-") as tmp:
        path = Path(tmp) / "view.git"
        g.git(tmp, "init", "-q", "--bare", "--template=", str(path))
        _borrow_objects(path, repo)
        yield path


def make_checkout(repo: Path, dest: Path, start: str, paths: Sequence[str]) -> Path:
    """A scratch checkout at ``dest`` of ``start`` (detached), only ``paths`` in its work tree."""
    g.git(dest.parent, "init", "-q", "--template=", str(dest))
    gdir = dest / ".git"
    _borrow_objects(gdir, repo)
    for key, value in IDENTITY.items():
        g.git(dest, "config", key, value)
    g.git(dest, "config", "core.sparseCheckout", "true")
    g.git(dest, "config", "core.sparseCheckoutCone", "false")
    (gdir / "info").mkdir(exist_ok=True)
    (gdir / "info" / "sparse-checkout").write_text(
        "".join(f"{sparse_pattern(p)}\n" for p in paths) or "!/*\n"
    )
    g.git(dest, "checkout", "-q", "--detach", start)
    return dest


@contextlib.contextmanager
def checkout(repo: Path, start: str, paths: Sequence[str]) -> Iterator[Path]:
    """``make_checkout`` in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="seriestool-scratch-") as tmp:
        yield make_checkout(repo, Path(tmp) / "scratch", start, paths)


def sparse_pattern(path: str) -> str:
    """A gitignore-style pattern matching exactly ``path`` (anchored, escaped)."""
    escaped = re.sub(r"([\\*?\[])", r"\\\1", path)
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return "/" + escaped
