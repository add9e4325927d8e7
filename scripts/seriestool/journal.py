"""Changes to a user's checkout that are undone exactly, even after a crash.

A ``Transaction`` writes a journal into the checkout's git folder
(``<git dir>/seriestool-journal/``) before its first change: the raw bytes of
HEAD, ORIG_HEAD, the index and the config, every ref, and the paths the
change may create.  ``rollback()`` puts all of it back:

- the work tree: every tracked file that differs from the saved index is
  checked out again from it (with the repository's own conversions, as git
  first wrote it); a path the transaction created is removed when git wrote
  it (it is in the index, or holds a blob the change writes there), and the
  folders made for it when empty.  Untracked and ignored files are never
  touched: the caller refused to start when one was in the way;
- the index, HEAD, ORIG_HEAD and config: their saved bytes;
- refs: those made since are deleted, those moved are put back;
- an am session and lock files that git left there are removed.

``commit()`` removes the journal: the change stands.  A journal found later
(the tool was killed) is a leftover: ``refuse_leftover`` names the one
command that rolls it back (``seriestool restore``).  Objects written into
the repository are not removed: unreferenced, they change nothing and git
prunes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path

from . import git as g
from . import hints, interrupts
from .errors import SeriesError

JOURNAL = "seriestool-journal"
# git state files an interrupted command may leave in the git folder.
_GIT_LEFTOVERS = ("rebase-apply", "AUTO_MERGE", "MERGE_MSG", "index.lock", "HEAD.lock",
                  "ORIG_HEAD.lock", "config.lock", "packed-refs.lock")  # fmt: skip


def restore_command(repo: Path) -> str:
    """The command that rolls back an interrupted change of ``repo``."""
    return hints.make("restore", VLLM=str(repo))


@dataclasses.dataclass
class Journal:
    op: str  # what made the change: "apply" or "rebase"
    pid: int
    repo: str
    head: str  # the commit HEAD was at
    head_raw: str  # the file HEAD: "ref: refs/heads/x" or a commit id
    orig_head_raw: str | None
    refs: dict[str, str]
    git_dir_names: list[str]
    created: dict[str, list[str]]  # path -> blob ids the change may write there
    created_dirs: list[str]
    had_index: bool


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def occupied(repo: Path, paths) -> list[str]:
    """Paths (of ``paths``, which HEAD lacks) that something in the work tree
    is in the way of: a file, link or folder there, or a file or link where a
    parent folder must go.  Each is named with what git says of it."""
    found = []
    for path in sorted(paths):
        parts = path.split("/")
        for n in range(1, len(parts) + 1):
            here = repo.joinpath(*parts[:n])
            is_last = n == len(parts)
            if here.is_symlink() or (here.exists() and (is_last or not here.is_dir())):
                found.append("/".join(parts[:n]))
                break
            if not here.exists():
                break
    if not found:
        return []
    ignored = g.git(repo, "check-ignore", "--no-index", "-z", "--stdin",
                    input="\0".join(found) + "\0", check=False).stdout  # fmt: skip
    ignored_paths = {p for p in ignored.split("\0") if p}
    return [f"{p} ({'ignored' if p in ignored_paths else 'untracked'})" for p in found]


def _missing_dirs(repo: Path, paths) -> list[str]:
    dirs = set()
    for path in paths:
        parent = Path(path).parent
        while str(parent) != "." and not (repo / parent).exists():
            dirs.add(parent.as_posix())
            parent = parent.parent
    return sorted(dirs, key=lambda d: (-d.count("/"), d))


def _refs(repo: Path) -> dict[str, str]:
    listing = g.out(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(line.rsplit(" ", 1) for line in listing.splitlines() if line)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".seriestool-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Transaction:
    """See the module doc.  ``begin()`` then ``commit()`` or ``rollback()``."""

    def __init__(self, repo: Path, journal: Journal, git_dir: Path, common_dir: Path):
        self.repo = repo
        self.journal = journal
        self.git_dir = git_dir
        self.common_dir = common_dir
        self.dir = git_dir / JOURNAL

    @classmethod
    def begin(cls, repo: Path, op: str, created: dict[str, set[str]]) -> Transaction:
        """Journal ``repo``'s state before ``op`` changes it.

        ``created``: paths HEAD lacks that the change may write, each with the
        blob ids it may write there; the caller checked they are free.
        """
        repo = g.toplevel(repo)
        gdir, cdir = g.git_dir(repo), g.common_dir(repo)
        index, orig_head = gdir / "index", gdir / "ORIG_HEAD"
        journal = Journal(
            op=op,
            pid=os.getpid(),
            repo=str(repo),
            head=g.out(repo, "rev-parse", "--verify", "HEAD"),
            head_raw=(gdir / "HEAD").read_text(),
            orig_head_raw=orig_head.read_text() if orig_head.exists() else None,
            refs=_refs(repo),
            git_dir_names=sorted(p.name for p in gdir.iterdir()),
            created={path: sorted(blobs) for path, blobs in created.items()},
            created_dirs=_missing_dirs(repo, created),
            had_index=index.exists(),
        )
        # No git call from here on: nothing can interrupt the journal half-written.
        folder = gdir / JOURNAL
        folder.mkdir()  # fails if another journal is there: refuse_leftover ran first
        try:
            if journal.had_index:
                shutil.copy2(index, folder / "index")
            shutil.copy2(cdir / "config", folder / "config")
            # The journal counts once this file is complete.
            data = json.dumps(dataclasses.asdict(journal)).encode()
            _write_atomic(folder / "journal.json", data)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(repo, journal, gdir, cdir)

    @classmethod
    def load(cls, repo: Path) -> Transaction | None:
        """The journal left in ``repo``, if any (one never completed is removed:
        nothing was changed before it was)."""
        gdir = g.git_dir(repo)
        folder = gdir / JOURNAL
        if not folder.exists():
            return None
        data = folder / "journal.json"
        if not data.exists():
            shutil.rmtree(folder)
            return None
        return cls(g.toplevel(repo), Journal(**json.loads(data.read_text())), gdir,
                   g.common_dir(repo))  # fmt: skip

    def add_created(self, created: dict[str, set[str]]) -> None:
        """More paths the change may create (checked free by the caller)."""
        for path, blobs in created.items():
            known = set(self.journal.created.get(path, [])) | set(blobs)
            self.journal.created[path] = sorted(known)
        dirs = set(self.journal.created_dirs) | set(_missing_dirs(self.repo, created))
        self.journal.created_dirs = sorted(dirs, key=lambda d: (-d.count("/"), d))
        _write_atomic(self.dir / "journal.json",
                      json.dumps(dataclasses.asdict(self.journal)).encode())  # fmt: skip

    def commit(self) -> None:
        """The change stands: drop the journal."""
        shutil.rmtree(self.dir)

    def rollback(self, keep_refs=()) -> list[str]:
        """Put the checkout back as journaled; returns notes on anything left.

        ``keep_refs``: refs the change made that stay (e.g. a branch holding a
        finished rebase).
        """
        with interrupts.shielded():
            return self._rollback(set(keep_refs))

    def _rollback(self, keep_refs: set[str]) -> list[str]:
        j, repo, gdir = self.journal, self.repo, self.git_dir
        for name in _GIT_LEFTOVERS:
            path = gdir / name
            if name not in j.git_dir_names and (path.exists() or path.is_symlink()):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        for lock in (self.common_dir / "refs").rglob("*.lock"):
            lock.unlink()
        notes = self._restore_work_tree()
        if j.had_index:
            _write_atomic(gdir / "index", (self.dir / "index").read_bytes())
        else:
            (gdir / "index").unlink(missing_ok=True)
        _write_atomic(gdir / "HEAD", j.head_raw.encode())
        if j.orig_head_raw is None:
            (gdir / "ORIG_HEAD").unlink(missing_ok=True)
        else:
            _write_atomic(gdir / "ORIG_HEAD", j.orig_head_raw.encode())
        now = _refs(repo)
        for ref, oid in now.items():
            if ref not in j.refs and ref not in keep_refs:
                g.git(repo, "update-ref", "-d", ref, oid)
        for ref, oid in j.refs.items():
            if now.get(ref) != oid:
                g.git(repo, "update-ref", ref, oid)
        config = self.common_dir / "config"
        saved = (self.dir / "config").read_bytes()
        if config.read_bytes() != saved:
            _write_atomic(config, saved)
        shutil.rmtree(self.dir)
        return notes

    def _restore_work_tree(self) -> list[str]:
        """Tracked files back as the saved index has them; created paths removed."""
        j, repo = self.journal, self.repo
        notes = []
        if j.had_index:
            # A copy: diff-files and checkout-index must not rewrite the saved one.
            work_index = self.dir / "index.work"
            shutil.copy2(self.dir / "index", work_index)
            env = {"GIT_INDEX_FILE": str(work_index)}
            changed = g.out(repo, "diff-files", "--name-only", "-z", env=env)
            if changed:
                g.git(repo, "checkout-index", "-f", "-q", "-z", "--stdin", input=changed, env=env)
        existing = [p for p in j.created if os.path.lexists(repo / p)]
        if existing:
            indexed = set(g.out(repo, "ls-files", "-z", "--", *[f":(literal){p}" for p in existing])
                          .split("\0"))  # fmt: skip
            for path in existing:
                full = repo / path
                if full.is_dir() and not full.is_symlink():
                    notes.append(f"left {path}: a folder the tool did not make")
                    continue
                written = path in indexed
                if not written and not full.is_symlink():
                    blob = g.out(repo, "hash-object", f"--path={path}", "--", str(full))
                    written = blob in j.created[path]
                if written:
                    full.unlink()
                else:
                    notes.append(f"left {path}: its content is not what the tool wrote")
        for folder in j.created_dirs:
            with contextlib.suppress(OSError):  # not empty: something else is in it
                (repo / folder).rmdir()
        return notes


def refuse_leftover(repo: Path) -> None:
    """Refuse to work on a checkout an interrupted change left part-way.

    Raises:
        SeriesError: a journal is there; the message names the one command
            that restores the checkout (or, if its process still runs, says so).
    """
    tx = Transaction.load(repo)
    if tx is None:
        return
    j = tx.journal
    if pid_alive(j.pid):
        raise SeriesError(
            f"another seriestool {j.op} (pid {j.pid}) is changing {tx.repo}; wait for it"
        )
    if j.op == "rebase":  # a session keeping a conflict there: only the rebase ends it
        raise SeriesError(
            f"a rebase keeping a conflict works in {tx.repo}; finish it with\n"
            f"    {hints.make('rebase', CONTINUE='1')}\nor undo it with\n"
            f"    {hints.make('rebase', ABORT='1')}"
        )
    raise SeriesError(
        f"an interrupted {j.op} left {tx.repo} part-way (journal {tx.dir}). Restore it"
        f" exactly as it was before that {j.op}, losing nothing, with:\n"
        f"    {restore_command(tx.repo)}"
    )
