"""Thin wrappers around git's own commands, run hermetically: no global or
system config, ``PINNED_CONFIG``, no hooks, a session of its own
(docs/checkout-safety.md: "Your git configuration...").
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import interrupts
from .errors import SeriesError
from .hints import no_checkout

# Pinned on every call, on the command-line scope.
PINNED_CONFIG = (
    # Nothing of the user's runs: hooks, file-system monitors, pagers, signing.
    ("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("core.pager", "cat"),
    ("commit.gpgSign", "false"), ("gc.auto", "0"), ("maintenance.auto", "false"),
    ("rerere.enabled", "false"), ("rerere.autoUpdate", "false"),
    ("submodule.recurse", "false"), ("fetch.recurseSubmodules", "false"),
    ("fetch.writeCommitGraph", "false"),
    # Output the tool reads or records.
    ("color.ui", "false"), ("core.quotePath", "false"), ("core.abbrev", "12"),
    ("diff.noprefix", "false"), ("diff.mnemonicPrefix", "false"), ("diff.srcPrefix", "a/"),
    ("diff.dstPrefix", "b/"), ("diff.relative", "false"), ("diff.renames", "true"),
    ("diff.algorithm", "myers"), ("diff.indentHeuristic", "true"),
    ("diff.suppressBlankEmpty", "false"), ("diff.context", "3"), ("diff.interHunkContext", "0"),
    ("diff.ignoreSubmodules", "none"), ("diff.submodule", "short"), ("format.noprefix", "false"),
    ("log.showSignature", "false"), ("log.mailmap", "false"), ("log.decorate", "false"),
    ("status.renames", "false"), ("i18n.commitEncoding", "UTF-8"),
    ("i18n.logOutputEncoding", "UTF-8"),
    # How patches apply and merge.
    ("am.keepcr", "false"), ("am.threeWay", "false"), ("am.messageId", "false"),
    ("mailinfo.scissors", "false"), ("apply.whitespace", "nowarn"),
    ("apply.ignoreWhitespace", "no"), ("merge.conflictStyle", "merge"),
    ("merge.renormalize", "false"), ("advice.detachedHead", "false"),
)  # fmt: skip

# Environment kept from the user's: who commits.
_IDENTITY_ENV = (
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE",
)  # fmt: skip


@functools.cache
def _safe_directories() -> tuple[str, ...]:
    """The user's ``safe.directory`` entries (system and global config)."""
    found: list[str] = []
    for scope in ("--system", "--global"):
        proc = subprocess.run(
            ["git", "config", scope, "--includes", "-z", "--get-all", "safe.directory"],
            capture_output=True, check=False, cwd="/",
        )  # fmt: skip
        found += [v for v in decode(proc.stdout).split("\0") if v]
    return tuple(found)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the tool's git calls."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in _IDENTITY_ENV}
    settings = list(PINNED_CONFIG) + [("safe.directory", d) for d in _safe_directories()]
    env.update(
        LC_ALL="C",
        LANGUAGE="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_REPLACE_OBJECTS="1",
        # Read-only commands (status) must not rewrite the user's index.
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_EDITOR="true",
        GIT_PAGER="cat",
        GIT_CONFIG_COUNT=str(len(settings)),
    )
    for n, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    env.update(extra or {})
    return env


def git(
    repo: Path | str,
    *args: str,
    input: str | bytes | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess:
    """Run ``git -C repo args...`` hermetically (see the module doc); a deferred
    signal raises ``interrupts.Interrupted`` instead, and with ``check`` a
    failure raises SeriesError with git's own stderr."""
    interrupts.check()
    cmd = [encode(a) for a in ("git", "-C", str(repo), *args)]
    proc = subprocess.run(
        cmd,
        input=encode(input) if isinstance(input, str) else input,
        capture_output=True,
        env=_env(env),
        start_new_session=True,
    )
    if text:
        proc.stdout, proc.stderr = decode(proc.stdout), decode(proc.stderr)
    if check and proc.returncode != 0:
        stderr = (proc.stderr if text else decode(proc.stderr)).strip()
        if proc.returncode < 0:  # a signal, e.g. the file-size limit, ended git silently
            stderr = f"{stderr} killed by {signal.Signals(-proc.returncode).name}".strip()
            if proc.returncode == -signal.SIGXFSZ:
                stderr += ": a file reached the file-size limit (`ulimit -f`); raise it"
        if found := re.search(r"(smudge|clean) filter (\S+) failed", stderr):
            stderr = (f"the {found[1]} filter {found[2]!r} that the checkout's .gitattributes"
                      f" name and its config requires (filter.{found[2]}.required) failed:"
                      f" {stderr.splitlines()[0]}; install the program its filter.{found[2]}."
                      f"{found[1]} runs (for lfs: git-lfs) and run again")  # fmt: skip
        raise SeriesError(f"git {' '.join(args[:3])} failed in {repo}: {stderr}")
    return proc


def encode(text: str) -> bytes:
    """Bytes for git of a string the tool holds: UTF-8, and the original bytes
    of what ``decode`` could not read (whatever the locale: git's paths and
    patch text are bytes, UTF-8 by convention)."""
    return text.encode("utf-8", "surrogateescape")


def decode(data: bytes) -> str:
    """git's output as Python names files (``os.fsdecode``): a path read from
    it opens as the same file, and ``encode`` gives its bytes back, also in
    the C locale."""
    return os.fsdecode(data)


def out(repo: Path | str, *args: str, **kwargs) -> str:
    """stdout of a git command, without the trailing newline."""
    return git(repo, *args, **kwargs).stdout.rstrip("\n")


def is_repo(path: Path) -> bool:
    proc = git(path, "rev-parse", "--is-inside-work-tree", check=False)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def toplevel(path: Path) -> Path:
    return Path(out(path, "rev-parse", "--show-toplevel"))


def checkout_top(path: Path) -> Path:
    """``path``, the top of a git checkout (``VLLM=``), resolved; a folder inside
    one (a vendored vLLM) is refused: commands would act on the whole repository."""
    path = Path(path)
    if not is_repo(path):
        raise SeriesError(f"{no_checkout(path)}: VLLM= must name the top of a vLLM git checkout")
    top = toplevel(path)
    if top != path.resolve():
        raise SeriesError(
            f"{path} is a folder inside the git repository {top}, not the top of a vLLM"
            " checkout: the tools switch branches and files of a whole repository, and would"
            f" act on all of {top}. Use a vLLM checkout of its own (e.g. `git clone {top}"
            " /tmp/vllm`, or a `git worktree`) as VLLM="
        )
    return top


def branch_config(repo: Path, branch: str | None, key: str) -> str | None:
    """``branch.<branch>.<key>`` (what apply records), None when unset."""
    return (branch and out(repo, "config", "--get", f"branch.{branch}.{key}", check=False)) or None


def git_dir(repo: Path) -> Path:
    return Path(out(repo, "rev-parse", "--absolute-git-dir"))


def common_dir(repo: Path) -> Path:
    """The folder of refs, objects and config (differs from ``git_dir`` in a worktree)."""
    return Path(out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))


def rev(repo: Path, ref: str) -> str | None:
    """Full commit id of ``ref``, or None when it does not name a commit."""
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return proc.stdout.strip() or None


def has_object(repo: Path, oid: str) -> bool:
    return git(repo, "cat-file", "-e", oid, check=False).returncode == 0


def blob(repo: Path, obj: str, check: bool = False) -> bytes | None:
    """The bytes of blob ``obj`` (an id or ``rev:path``); None when there is none."""
    proc = git(repo, "cat-file", "blob", obj, check=check, text=False)
    return proc.stdout if proc.returncode == 0 else None


def describe_blob(oid: str | None) -> str:
    return "absent" if oid is None else f"blob {oid[:12]}"


def tree_entries(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``(mode, blob id)`` of each of ``paths`` (literal) that is a file in ``commit``."""
    if not paths:
        return {}
    wanted = set(paths)
    listing = out(repo, "--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", commit,
                  "--", *paths)  # fmt: skip
    entries = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, kind, oid = meta.split()
        if kind == "blob" and path in wanted:
            entries[path] = (mode, oid)
    return entries


def index_entries(repo: Path, index: Path | None = None) -> dict[str, list[tuple[str, ...]]]:
    """``path -> [(mode, blob id, stage), ...]`` of the index (or of ``index``)."""
    env = {"GIT_INDEX_FILE": str(index)} if index else None
    entries: dict[str, list[tuple[str, ...]]] = {}
    for entry in filter(None, out(repo, "ls-files", "-s", "-z", env=env).split("\0")):
        meta, path = entry.split("\t", 1)
        entries.setdefault(path, []).append(tuple(meta.split()))
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
    return next((name for marker, name in markers.items() if (gdir / marker).exists()), None)


# The committer of commits made only in the tool's own throw-away
# repositories (never fetched into a user's): fixed, so their ids depend
# only on the patches and the base.
SCRATCH_COMMITTER = {
    "GIT_COMMITTER_NAME": "seriestool scratch",
    "GIT_COMMITTER_EMAIL": "scratch@seriestool.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def user_identity(repo: Path) -> dict[str, str]:
    """``GIT_COMMITTER_NAME``/``EMAIL`` as the user's own git would commit in ``repo``
    (``git var`` with all their config), passed per command: the tool never
    writes ``user.*`` into any config, nor invents one.  Where git would refuse
    to commit (no identity, ``user.useConfigOnly``), SeriesError, changing nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    proc = subprocess.run(
        ["git", "-C", str(repo), "var", "GIT_COMMITTER_IDENT"],
        capture_output=True, env=env, check=False, start_new_session=True,
    )  # fmt: skip
    name, sep, rest = decode(proc.stdout).partition(" <")
    if proc.returncode != 0 or not sep or not name.strip():
        said = decode(proc.stderr).strip().splitlines()
        raise SeriesError(
            f"git has no identity of yours to commit with in {repo}"
            f" ({said[-1] if said else 'git var GIT_COMMITTER_IDENT failed'}); nothing was"
            ' changed.  Set yours, e.g.\n    git config --global user.name "Your Name"\n'
            "    git config --global user.email you@example.com\nand run again"
        )
    return {"GIT_COMMITTER_NAME": name.strip(), "GIT_COMMITTER_EMAIL": rest.partition(">")[0]}
