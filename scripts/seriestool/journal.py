"""Changes to a user's checkout that are undone exactly, even after a crash
(docs/checkout-safety.md): a ``Transaction`` journals HEAD, index, config,
refs and its ``Scope`` in the git folder before its first change.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import git as g
from . import hints, interrupts
from .errors import SeriesError
from .manifest import write_atomic

JOURNAL = "seriestool-journal"
# git state files an interrupted command may leave in the git folder.
_GIT_LEFTOVERS = ("rebase-apply", "AUTO_MERGE", "MERGE_MSG", "index.lock", "HEAD.lock",
                  "ORIG_HEAD.lock", "config.lock", "packed-refs.lock")  # fmt: skip

# git's own small files (HEAD), read byte for byte whatever the locale.
_RAW = {"encoding": "utf-8", "errors": "surrogateescape"}


def restore_command(repo: Path, force: bool = False) -> str:
    """The command that rolls back an interrupted change of ``repo`` (``force``:
    also when the checkout changed since in ways the change could not have made)."""
    return hints.make("restore", VLLM=str(repo), FORCE="1" if force else None)


@dataclasses.dataclass
class Scope:
    """What a change may do to a checkout: what a rollback undoes without asking."""

    # Tracked paths it may write, each with the blob ids it may write there
    # (None: any content, e.g. a `git am` merge the user then resolves).
    paths: dict[str, list[str] | None] = dataclasses.field(default_factory=dict)
    # Refs it may create or move (HEAD may then point at one), each with the
    # commits it may leave there (None: any); "HEAD": commits it may detach at.
    refs: dict[str, list[str] | None] = dataclasses.field(default_factory=dict)
    # Config keys it may set, each with its value (None: it may unset the key).
    config: dict[str, str | None] = dataclasses.field(default_factory=dict)
    am: bool = False  # it runs `git am` in the checkout


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
    # A journal written before scopes were recorded has the empty scope: every
    # change it finds is then foreign, and restoring it needs FORCE=1.
    scope: Scope = dataclasses.field(default_factory=Scope)
    # Permission bits of the scope's work-tree files: put back as they were
    # also where git does not track them (core.fileMode=false).
    modes: dict[str, int] = dataclasses.field(default_factory=dict)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (not this one) still runs: a zombie, which
    ``kill(pid, 0)`` still finds, can no longer change anything (Linux
    ``/proc/<pid>/stat`` says; where unreadable, it runs)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    # "pid (comm) state ...": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 1 :].split()
    return not fields or fields[0] != "Z"


@contextlib.contextmanager
def locked(repo: Path) -> Iterator[None]:
    """Hold ``repo``'s lock while a command changes it: one at a time per checkout,
    a second refused naming the first.  ``flock`` on the checkout's git folder:
    no file is written, and the kernel releases it however its holder ends."""
    if not g.is_repo(repo):  # nothing to lock: the command itself refuses it
        yield
        return
    fd = os.open(g.common_dir(repo), os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SeriesError(
                f"another seriestool command{_holder(g.common_dir(repo))} is changing {repo}"
                " right now; nothing was changed: wait for it to end and run again"
            ) from None
        yield
    finally:
        os.close(fd)


def _holder(folder: Path) -> str:
    """`` (pid N: its command line)`` of a process that has ``folder`` open, or ""."""
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(fd.parts[2])
            if pid != os.getpid() and os.readlink(fd) == str(folder):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                return f" (pid {pid}: {g.decode(b' '.join(argv).strip())})"
    return ""


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


class Transaction:
    """See the module doc.  ``begin()`` then ``commit()`` or ``rollback()``."""

    def __init__(self, repo: Path, journal: Journal, git_dir: Path, common_dir: Path):
        self.repo = repo
        self.journal = journal
        self.git_dir = git_dir
        self.common_dir = common_dir
        self.dir = git_dir / JOURNAL

    @classmethod
    def begin(cls, repo: Path, op: str, created: dict[str, set[str]], scope: Scope) -> Transaction:
        """Journal ``repo``'s state before ``op`` changes it (``created``: paths HEAD
        lacks, checked free, with the blob ids the change may write there)."""
        repo = g.toplevel(repo)
        gdir, cdir = g.git_dir(repo), g.common_dir(repo)
        index, orig_head = gdir / "index", gdir / "ORIG_HEAD"
        journal = Journal(
            op=op,
            pid=os.getpid(),
            repo=str(repo),
            head=g.out(repo, "rev-parse", "--verify", "HEAD"),
            head_raw=(gdir / "HEAD").read_text(**_RAW),
            orig_head_raw=orig_head.read_text(**_RAW) if orig_head.exists() else None,
            refs=_refs(repo),
            git_dir_names=sorted(p.name for p in gdir.iterdir()),
            created={path: sorted(blobs) for path, blobs in created.items()},
            created_dirs=_missing_dirs(repo, created),
            had_index=index.exists(),
            scope=scope,
            modes={p: os.lstat(repo / p).st_mode & 0o7777 for p in scope.paths
                   if (repo / p).is_file() and not (repo / p).is_symlink()},
        )  # fmt: skip
        # No git call from here on: nothing can interrupt the journal half-written.
        folder = gdir / JOURNAL
        folder.mkdir()  # fails if another journal is there: refuse_leftover ran first
        try:
            if journal.had_index:
                shutil.copy2(index, folder / "index")
            shutil.copy2(cdir / "config", folder / "config")
            # The journal counts once this file is complete.
            data = json.dumps(dataclasses.asdict(journal)).encode()
            write_atomic(folder / "journal.json", data)
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
        fields = json.loads(data.read_bytes())
        fields["scope"] = Scope(**fields.get("scope", {}))
        return cls(g.toplevel(repo), Journal(**fields), gdir, g.common_dir(repo))

    def commit(self) -> None:
        """The change stands: drop the journal."""
        shutil.rmtree(self.dir)

    def foreign_changes(self, force_command: str | None = None) -> list[str]:
        """What changed since the journal that its change could not have made
        (empty: a rollback undoes the change's own work and nothing else); with
        ``force_command``, any is refused, naming that command."""
        with tempfile.TemporaryDirectory(prefix="seriestool-journal-") as tmp:
            found = (
                self._foreign_head_and_refs()
                + self._foreign_config(Path(tmp))
                + self._foreign_index()
                + self._foreign_files(self._changed_files(Path(tmp)))
            )
        if found and force_command:
            op = self.journal.op
            raise SeriesError(
                f"{self.repo} changed since the interrupted {op} in ways that {op} could not"
                " have made:\n  " + "\n  ".join(found) + "\nRestoring would undo these too,"
                f" so nothing was changed (the journal {self.dir} is kept).  Undo them"
                " yourself and run the command again, or restore anyway, losing them, with:"
                f"\n    {force_command}"
            )
        return found

    def _foreign_head_and_refs(self) -> list[str]:
        j, scope, op = self.journal, self.journal.scope, self.journal.op
        found = []
        head = (self.git_dir / "HEAD").read_text(**_RAW).strip()
        may_point_at = [*scope.refs, *(scope.refs.get("HEAD") or [])]  # "HEAD": detached at
        if head != j.head_raw.strip() and head.removeprefix("ref: ") not in may_point_at:
            found.append(
                f"HEAD: on {head[5:]}, a branch the {op} does not use"
                if head.startswith("ref: ")
                else f"HEAD: detached at {head[:12]}"
            )
        now = _refs(self.repo)
        for ref in sorted(set(now) | set(j.refs)):
            was, is_ = j.refs.get(ref), now.get(ref)
            allowed = scope.refs.get(ref, [])
            if was == is_ or (ref in scope.refs and (allowed is None or is_ in [None, *allowed])):
                continue
            if was is None:
                found.append(f"{ref}: created (at {is_[:12]})")
            elif is_ is None:
                found.append(f"{ref}: deleted (was at {was[:12]})")
            else:
                found.append(f"{ref}: moved from {was[:12]} to {is_[:12]}")
        running = g.operation_in_progress(self.repo)
        if running and not (scope.am and running in ("git am", "git rebase (apply backend)")):
            found.append(f"a {running} is in progress")
        return found

    def _foreign_config(self, tmp: Path) -> list[str]:
        """The config is the saved one, or the saved one with the scope's keys set."""
        config, saved = self.common_dir / "config", self.dir / "config"
        now = config.read_bytes()
        if now == saved.read_bytes():
            return []
        expected = tmp / "config"
        shutil.copyfile(saved, expected)
        scope = self.journal.scope.config
        entries = _config_entries(self.repo, config)
        for key, value in scope.items():
            now_values = [v for k, v in entries if k == _canonical(key)]
            if value is None and not now_values:  # a key it may unset
                g.git(self.repo, "config", "--file", str(expected), "--unset-all", key, check=False)
            elif value is not None and now_values == [value]:
                g.git(self.repo, "config", "--file", str(expected), key, value)
        if expected.read_bytes() == now:
            return []
        before = collections.Counter(_config_entries(self.repo, saved))
        after = collections.Counter(_config_entries(self.repo, config))
        keys = {key for key, _ in (before - after) + (after - before)}
        keys -= {_canonical(key) for key in scope}
        was, is_ = {k for k, _ in before}, {k for k, _ in after}
        return [
            f"config: {key} " + ("added" if key not in was else "removed" if key not in is_
                                 else "changed")
            for key in sorted(keys)
        ] or ["config: edited (comments or layout)"]  # fmt: skip

    def _foreign_index(self) -> list[str]:
        scope = self.journal.scope
        now = g.index_entries(self.repo)
        before = g.index_entries(self.repo, self.dir / "index") if self.journal.had_index else {}
        found = []
        for path in sorted(set(now) | set(before)):
            if now.get(path) == before.get(path):
                continue
            allowed = scope.paths.get(path, [])
            if path in scope.paths and (
                allowed is None or all(stage == "0" and oid in allowed
                                       for _mode, oid, stage in now.get(path, ()))
            ):  # fmt: skip
                continue
            what = "added" if path not in before else "removed" if path not in now else "changed"
            found.append(f"{path}: {what} in the index")
        return found

    def _foreign_files(self, changed: list[str]) -> list[str]:
        """Of the tracked files whose content differs from the saved index, those
        the change does not write, or holding content it does not write."""
        scope, op = self.journal.scope, self.journal.op
        found = []
        for path in changed:
            full = self.repo / path
            if path not in scope.paths:
                what = "modified" if os.path.lexists(full) else "deleted"
                found.append(f"{path}: {what} (the {op} does not write this file)")
                continue
            allowed = scope.paths[path]
            if allowed is None or not os.path.lexists(full):
                continue
            if full.is_dir() and not full.is_symlink():
                found.append(f"{path}: a folder now")
            elif _blob_of(self.repo, path) not in allowed:
                found.append(f"{path}: modified (content the {op} does not write)")
        return found

    def _changed_files(self, tmp: Path) -> list[str]:
        """Tracked files whose content differs from the saved index (read with a
        refreshed copy of it, left in ``tmp/index``: file stats alone do not count)."""
        if not self.journal.had_index:
            return []
        # copy2: the index keeps its mtime, by which git tells a file changed
        # in the same second as its entry ("racily clean") from an unchanged one.
        shutil.copy2(self.dir / "index", tmp / "index")
        env = {"GIT_INDEX_FILE": str(tmp / "index")}
        g.git(self.repo, "update-index", "-q", "--refresh", env=env, check=False)
        changed = g.out(self.repo, "diff-files", "--name-only", "-z", env=env)
        return [p for p in changed.split("\0") if p]

    @interrupts.shielded()
    def rollback(self, keep_refs=()) -> list[str]:
        """Put the checkout back as journaled, whatever changed since (see
        ``foreign_changes``); returns notes on anything left.  ``keep_refs``:
        refs the change made that stay (a branch holding a finished rebase)."""
        j, repo, gdir = self.journal, self.repo, self.git_dir
        for name in _GIT_LEFTOVERS:
            path = gdir / name
            if name not in j.git_dir_names and (path.exists() or path.is_symlink()):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        for lock in (self.common_dir / "refs").rglob("*.lock"):
            lock.unlink()
        with tempfile.TemporaryDirectory(prefix="seriestool-journal-") as tmp:
            notes = self._restore_work_tree(Path(tmp))
        if j.had_index:
            write_atomic(gdir / "index", (self.dir / "index").read_bytes())
        else:
            (gdir / "index").unlink(missing_ok=True)
        write_atomic(gdir / "HEAD", g.encode(j.head_raw))
        if j.orig_head_raw is None:
            (gdir / "ORIG_HEAD").unlink(missing_ok=True)
        else:
            write_atomic(gdir / "ORIG_HEAD", g.encode(j.orig_head_raw))
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
            write_atomic(config, saved)
        shutil.rmtree(self.dir)
        return notes

    def _restore_work_tree(self, tmp: Path) -> list[str]:
        """Tracked files back as the saved index has them; created paths removed."""
        j, repo = self.journal, self.repo
        notes = []
        changed = self._changed_files(tmp)
        if changed:
            env = {"GIT_INDEX_FILE": str(tmp / "index")}
            g.git(repo, "checkout-index", "-f", "-q", "-z", "--stdin",
                  input="\0".join(changed) + "\0", env=env)  # fmt: skip
        for path, mode in j.modes.items():
            full = repo / path
            if full.is_file() and not full.is_symlink() and full.stat().st_mode & 0o7777 != mode:
                full.chmod(mode)
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
                    written = _blob_of(repo, path) in j.created[path]
                if written:
                    full.unlink()
                else:
                    notes.append(f"left {path}: its content is not what the tool wrote")
        for folder in j.created_dirs:
            with contextlib.suppress(OSError):  # not empty: something else is in it
                (repo / folder).rmdir()
        return notes


def _blob_of(repo: Path, path: str) -> str:
    """The blob id git would record for the work-tree file (or link) at ``path``."""
    full = repo / path
    if full.is_symlink():
        return g.out(repo, "hash-object", "--stdin", input=os.readlink(full))
    return g.out(repo, "hash-object", f"--path={path}", "--", str(full))


def _canonical(key: str) -> str:
    """A config key as git lists it: section and name in lower case."""
    section, _, rest = key.partition(".")
    middle, _, name = rest.rpartition(".")
    return ".".join(part for part in (section.lower(), middle, name.lower()) if part)


def _config_entries(repo: Path, config: Path) -> list[tuple[str, str]]:
    """``(key, value)`` of every setting in the config file ``config``, in order."""
    listing = g.out(repo, "config", "--file", str(config), "--list", "-z")
    return [tuple(item.split("\n", 1)) if "\n" in item else (item, "")
            for item in listing.split("\0") if item]  # fmt: skip


def refuse_leftover(repo: Path) -> None:
    """Refuse a checkout an interrupted change left part-way, naming the one
    command that restores it."""
    tx = Transaction.load(repo)
    if tx is None:
        return
    j = tx.journal
    if pid_alive(j.pid):
        raise SeriesError(
            f"another seriestool {j.op} (pid {j.pid}) is changing {tx.repo}; wait for it"
        )
    if j.op == "rebase":  # a session keeping a conflict there: only the rebase ends it
        raise SeriesError(f"a rebase keeping a conflict works in {tx.repo}; {hints.REBASE_OPEN}")
    raise SeriesError(
        f"an interrupted {j.op} left {tx.repo} part-way (journal {tx.dir}). Undo what that"
        f" {j.op} did, and nothing else, with:\n    {restore_command(tx.repo)}\n(it refuses,"
        f" changing nothing, if the checkout has changed since in ways the {j.op} could"
        " not have made)"
    )
