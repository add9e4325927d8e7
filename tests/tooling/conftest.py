"""Fixtures for the tooling tests: small throw-away git repositories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

# The real git, resolved before any test puts a test double first on PATH.
GIT = shutil.which("git")
# Configuration a test may point at the tool; the tests' own git calls ignore it.
_HOSTILE_ENV = ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",
                "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT")  # fmt: skip

IDENTITY = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}


def write_sdist(path: Path, top: str, files: dict[str, str], mode: int = 0o644) -> str:
    """Write a tar.gz sdist with ``files`` under ``top/``; returns its sha256.

    ``*.sh`` files are executable; every other file gets ``mode``.  Fixed
    mtimes keep the archive (and so its hash) reproducible.
    """
    import hashlib
    import io
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if rel.endswith(".sh") else mode
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Repo:
    """A throw-away repository with helpers to write files and commit."""

    def __init__(self, path: Path):
        self.path = path

    def git(self, *args: str, check: bool = True, input: str | None = None) -> str:
        # The test's own calls: no hooks, no optional index refresh (a
        # snapshot must not rewrite the index it records), no hostile config.
        env = {k: v for k, v in os.environ.items() if k not in _HOSTILE_ENV}
        env.update(IDENTITY, LC_ALL="C", GIT_OPTIONAL_LOCKS="0")
        quiet = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
        proc = subprocess.run(
            [GIT, "-C", str(self.path), *quiet, *args],
            capture_output=True, text=True, env=env, input=input,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout.rstrip("\n")

    def write(self, files: dict[str, str | None]) -> None:
        """Write (or, with None, delete) files relative to the work tree."""
        for rel, text in files.items():
            path = self.path / rel
            if text is None:
                path.unlink()
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)

    def commit(self, message: str, files: dict[str, str | None] | None = None) -> str:
        if files:
            self.write(files)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def make_repo(tmp_path):
    """Factory: ``make_repo(name, files)`` → Repo with one initial commit."""

    def factory(name: str = "repo", files: dict[str, str] | None = None) -> Repo:
        path = tmp_path / name
        path.mkdir()
        repo = Repo(path)
        repo.git("init", "-q", "-b", "main")
        repo.git("config", "user.name", "Test User")
        repo.git("config", "user.email", "user@example.com")
        repo.commit("base", files or {"README": "base\n"})
        return repo

    return factory


def snapshot(repo: Repo) -> dict[str, str]:
    """Everything a failed operation must leave as it was.

    HEAD and branch (or detached), every ref, the index (its entries and its
    raw bytes), the work tree (tracked changes, untracked and ignored files
    with their contents), the stash, the repository's config (raw bytes too)
    and what else the git folder holds (an am session, a journal, a lock).
    """
    files = {}
    for rel in repo.git("ls-files", "-z", "--others", "--cached").split("\0"):
        if rel and (repo.path / rel).is_file():
            files[rel] = (repo.path / rel).read_bytes().hex()
    gdir = Path(repo.git("rev-parse", "--absolute-git-dir"))
    raw = {}
    git_dir = sorted(p.name for p in gdir.iterdir() if p.name not in ("objects", "logs"))
    for name in ("HEAD", "ORIG_HEAD", "config", "index", "packed-refs"):
        path = gdir / name
        raw[name] = path.read_bytes().hex() if path.exists() else None
    return {
        "raw": repr(raw),
        # What the git folder holds besides objects and reflogs: no journal,
        # no am session, no lock left behind.
        "git_dir": repr(git_dir),
        "head": repo.git("rev-parse", "HEAD"),
        "branch": repo.git("symbolic-ref", "-q", "HEAD", check=False),
        "branches": repo.git("for-each-ref", "--format=%(refname) %(objectname)"),
        "index": repo.git("ls-files", "-s"),
        "status": repo.git("status", "--porcelain=v1", "--untracked-files=all", "--ignored"),
        "files": repr(sorted(files.items())),
        "stash": repo.git("stash", "list", "--format=%H %s"),
        "config": repo.git("config", "--local", "--list"),
    }


@pytest.fixture
def toy_series(make_repo, tmp_path):
    """A toy upstream repo and a two-patch series exported from it.

    Returns (repo, manifest, patch_dir): the repo is back on ``main`` at the
    base commit; the manifest pins that commit.
    """

    repo = make_repo("upstream", {
        "pkg/loader.py": "def load(x):\n    return x\n",
        "pkg/other.py": "VALUE = 1\n",
        "tests/test_loader.py": "from pkg.loader import load\n",
    })  # fmt: skip
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit("[Loader] first change\n\nBody of the first patch.", {
        "pkg/loader.py": "def load(x):\n    # first\n    return x\n",
        "tests/test_first.py": "def test_first():\n    assert True\n",
    })  # fmt: skip
    repo.commit("[Loader] second change", {
        "pkg/loader.py": "def load(x):\n    # first\n    return x + 0\n",
        "tests/test_second.py": "def test_second():\n    assert True\n",
    })  # fmt: skip
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    manifest = export_work_branch(repo, base, patch_dir)
    return repo, manifest, patch_dir


def export_work_branch(repo: Repo, base: str, patch_dir: Path,
                       sdist=("toy-1.0.tar.gz", "0" * 64)):  # fmt: skip
    """Export the commits of branch ``work`` since ``base`` as series 1 of toy
    1.0 into ``patch_dir`` (``series.json`` beside them), then go back to
    ``main`` and delete ``work``; returns the manifest."""
    from seriestool import export as export_mod
    from seriestool import manifest as manifest_mod

    manifest = manifest_mod.Manifest(
        name="toy", version="1", patches=[], regression_tests=manifest_mod.RegressionTests(),
        base=manifest_mod.Base("toy", "1.0", base[:9], manifest_mod.Sdist(*sdist), base, {}),
    )  # fmt: skip
    export_mod.export_series(
        repo.path, manifest, "work", base, patch_dir=patch_dir,
        manifest_path=patch_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip
    repo.git("checkout", "-q", "main")
    repo.git("branch", "-q", "-D", "work")
    return manifest


# A test double for git, first on PATH: it logs every call and, as the
# environment asks, pauses on call N until told to go (so a test can signal
# the tool at a known step), or dies there by SIGKILL (git killed mid-way).
FAKE_GIT = r"""#!/bin/sh
d=$FAKEGIT
while ! mkdir "$d/lock" 2>/dev/null; do sleep 0.01; done
n=$(( $(cat "$d/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/count"
rmdir "$d/lock"
printf '%s\t%s\n' "$n" "$*" >> "$d/log"
if [ "$n" = "${FAKEGIT_PAUSE_AT:-}" ]; then
    : > "$d/paused"
    while [ ! -e "$d/go" ]; do sleep 0.01; done
fi
if [ "$n" = "${FAKEGIT_DIE_AT:-}" ]; then
    kill -9 $$
fi
if [ -n "${FAKEGIT_HALF_AM:-}" ]; then
    # `git am` that writes its first patch's files, then dies.
    dir=.; sub=; prev=; first=
    for a in "$@"; do
        if [ "$prev" = "-C" ]; then dir=$a
        elif [ "$prev" = "-c" ]; then :
        elif [ -z "$sub" ] && [ "${a#-}" = "$a" ]; then sub=$a
        elif [ "$sub" = am ] && [ -z "$first" ] && [ "${a%.patch}" != "$a" ]; then first=$a
        fi
        prev=$a
    done
    if [ "$sub" = am ] && [ -n "$first" ]; then
        "$FAKEGIT_REAL" -C "$dir" apply "$first"
        kill -9 $$
    fi
fi
"$FAKEGIT_REAL" "$@"
rc=$?
: > "$d/done.$n"
exit $rc
"""


class FakeGit:
    """Controls the git test double: ``env(...)`` is the environment to run
    the tool with, ``calls()`` the git calls it made (one string each)."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.state = root / "state"
        self.bin.mkdir(parents=True)
        self.state.mkdir()
        git = self.bin / "git"
        git.write_text(FAKE_GIT)
        git.chmod(0o755)

    def reset(self) -> None:
        shutil.rmtree(self.state)
        self.state.mkdir()

    def env(self, **modes: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["FAKEGIT"] = str(self.state)
        env["FAKEGIT_REAL"] = GIT
        for key, value in modes.items():
            env[f"FAKEGIT_{key.upper()}"] = str(value)
        return env

    def calls(self) -> list[str]:
        log = self.state / "log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split("\t", 1)[1] for line in lines]

    def paused(self) -> bool:
        return (self.state / "paused").exists()

    def go(self) -> None:
        (self.state / "go").touch()

    def done(self, n: int) -> bool:
        """Whether call ``n`` has finished (also after the tool was killed)."""
        return (self.state / f"done.{n}").exists()


@pytest.fixture
def fake_git(tmp_path):
    return FakeGit(tmp_path / "fake-git")


@pytest.fixture
def make_work_dir(tmp_path):
    """A work folder for running make targets as a user would (`make rebase`
    first runs `make venv`, which materialises the pinned base): it borrows
    the materialised base and sdist cache of this checkout's work folder, and
    a placeholder for the default checkout, so nothing is fetched or cloned."""
    real = Path(os.environ.get("SERIES_WORK_DIR", ROOT / "work"))
    if not (real / "base").is_dir():
        pytest.skip(f"{real}/base is not materialised: run `make venv` first")
    work = tmp_path / "make-work"
    work.mkdir()
    for name in ("base", "sdist"):
        (work / name).symlink_to(real / name)
    (work / "vllm").mkdir()
    return work


# The user's identity, only in a global config file (tests of who commits).
USER = ("Global User", "global.user@example.com")


@pytest.fixture
def global_identity(tmp_path, monkeypatch):
    """The user's identity only in a global config file (and none in the repository)."""
    home = tmp_path / "home"
    home.mkdir()
    config = home / ".gitconfig"
    config.write_text(f"[user]\n\tname = {USER[0]}\n\temail = {USER[1]}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    for key in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL"):
        monkeypatch.delenv(key, raising=False)
    return config


def user_git(path, *args: str) -> str:
    """git as the user runs it: their global config, no test identity."""
    proc = subprocess.run([GIT, "-C", str(path), *args], capture_output=True, text=True,
                          env=dict(os.environ), check=True)  # fmt: skip
    return proc.stdout.strip()


def local_identity(path) -> str:
    proc = subprocess.run([GIT, "-C", str(path), "config", "--local", "--get-regexp", "^user\\."],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return proc.stdout
