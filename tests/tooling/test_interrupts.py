"""apply and rebase interrupted at known steps, not by timing luck.

The git test double (conftest.FakeGit) pauses the tool on its N-th git call;
the test then signals the tool as a terminal would (SIGINT or SIGTERM to the
whole process group) and lets git go on.  Afterwards the user's checkout must
be byte for byte as it was: branch or detached HEAD, index, work tree with
its untracked and ignored files, stash, refs and config.  After SIGKILL (the
tool cannot clean up) a re-run must name one command, and running that
command as printed must restore the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, Repo, snapshot

DRIVER = """
import sys
from pathlib import Path

sys.path.insert(0, {scripts!r})
from seriestool import apply, manifest, rebase, status
from seriestool.errors import SeriesError

what, repo, patch_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
try:
    if what == "apply":
        rc = apply.apply_series(repo, manifest.load(patch_dir / "series.json"), patch_dir)
    elif what == "remove":
        rc = status.remove(repo, delete_branch=True)
    else:
        rc = rebase.start(sys.argv[4], repo, keep_conflict=what == "rebase-keep",
                          skip_tests=True, patch_dir=patch_dir)
except SeriesError as e:
    print(f"error: {{e}}", file=sys.stderr)
    rc = e.exit_code
sys.exit(rc)
""".format(scripts=str(ROOT / "scripts"))

TIMEOUT = 120


def _wait(condition, proc=None) -> bool:
    """Wait until ``condition()``; False when ``proc`` exits first."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if proc is not None and proc.poll() is not None:
            return condition()
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)
    return True


class Target:
    """Fresh copies of a user's checkout and a patch folder, one per run."""

    def __init__(self, repo: Repo, patch_dir: Path, root: Path, command: list[str], work: Path):
        self.template_repo, self.template_patches = repo, patch_dir
        self.root, self.command, self.work = root, command, work
        self.runs = 0

    def fresh(self) -> tuple[Repo, Path]:
        self.runs += 1
        here = self.root / f"run-{self.runs}"
        repo = Repo(here / self.template_repo.path.name)
        shutil.copytree(self.template_repo.path, repo.path, symlinks=True)
        patches = here / "patches"
        shutil.copytree(self.template_patches, patches)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.repo, self.patches = repo, patches
        return repo, patches

    def argv(self) -> list[str]:
        what, *rest = self.command
        return [sys.executable, "-c", DRIVER, what, str(self.repo.path), str(self.patches), *rest]

    def env(self, fake_git, **modes) -> dict[str, str]:
        env = fake_git.env(**modes) if fake_git else dict(os.environ)
        env["SERIES_WORK_DIR"] = str(self.work)
        return env

    def run(self, fake_git=None, **modes) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(), env=self.env(fake_git, **modes), capture_output=True,
                              text=True, timeout=TIMEOUT)  # fmt: skip

    def start(self, fake_git, **modes) -> subprocess.Popen:
        # Its own process group, as a command started from a terminal.
        return subprocess.Popen(self.argv(), env=self.env(fake_git, **modes), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip


def _user_state(repo: Repo) -> None:
    """What a user's checkout holds besides commits: all of it must survive."""
    repo.write({"pkg/other.py": "VALUE = 'stashed'\n"})
    repo.git("stash", "push", "-q", "-m", "user stash")
    repo.write({"notes.txt": "untracked notes\n", "build/cache.bin": "ignored build output\n"})
    (repo.path / ".git" / "info").mkdir(exist_ok=True)
    (repo.path / ".git" / "info" / "exclude").write_text("build/\n")
    repo.git("config", "user.signature", "kept")


def _on_user(calls: list[str], repo: Path) -> list[int]:
    """Numbers of the calls that run in the user's checkout."""
    return [n for n, call in enumerate(calls, 1) if f"-C {repo} " in call + " "]


def _points(calls: list[str], repo: Path, every: int) -> list[int]:
    """Call numbers to interrupt at: every call on the user's checkout, and
    every ``every``-th other call (scratch clones, the patch files)."""
    on_user = _on_user(calls, repo)
    others = [n for n in range(1, len(calls) + 1) if n not in on_user][::every]
    return sorted(set(on_user + others + [len(calls)]))


def _calibrate(target: Target, fake_git) -> list[str]:
    target.fresh()
    fake_git.reset()
    target.run(fake_git)
    calls = fake_git.calls()
    assert calls
    return calls


def _interrupt(target: Target, fake_git, point: int, sig: int):
    """Run the tool, deliver ``sig`` while its call ``point`` runs, let git go on."""
    fake_git.reset()
    proc = target.start(fake_git, pause_at=point)
    paused = _wait(fake_git.paused, proc)
    if paused:
        if sig == signal.SIGKILL:
            os.kill(proc.pid, sig)  # the tool alone; git finishes on its own
        else:
            os.killpg(proc.pid, sig)  # Ctrl-C at a terminal: the whole group
        fake_git.go()
        # git finishes its step, unless the signal reached it too.
        _wait(lambda: fake_git.done(point) or (sig != signal.SIGKILL and proc.poll() is not None))
    out, err = proc.communicate(timeout=TIMEOUT)
    return paused, proc.returncode, out + err


def _the_one_command(output: str) -> str:
    """The command a refusal prints on its own line, indented by four spaces."""
    commands = [line[4:] for line in output.splitlines() if re.match(r"^    \S", line)]
    assert len(commands) == 1, output
    return commands[0]


def _signal_every_step(target: Target, fake_git, every: int, check_more=None) -> int:
    """SIGINT or SIGTERM at each chosen step; both where the step writes to
    the user's checkout."""
    calls = _calibrate(target, fake_git)
    writes = set(_mutating(calls, target.repo.path))
    checked = 0
    for i, point in enumerate(_points(calls, target.repo.path, every)):
        both = (signal.SIGINT, signal.SIGTERM)
        for sig in both if point in writes else both[i % 2 :][:1]:
            repo, patches = target.fresh()
            _user_state(repo)
            before, patches_before = snapshot(repo), _contents(patches)
            paused, rc, output = _interrupt(target, fake_git, point, sig)
            assert paused, f"call {point} was not reached"
            where = f"{sig.name} at git call {point}: {calls[point - 1]}\n{output}"
            assert rc == 128 + sig, where
            assert "interrupted" in output, where
            assert snapshot(repo) == before, where
            assert _contents(patches) == patches_before, where
            if check_more:
                check_more(target, where)
            checked += 1
    return checked


def _kill_every_step(target: Target, fake_git, points_of, restore_env=None) -> int:
    calls = _calibrate(target, fake_git)
    checked = 0
    for point in points_of(calls, target.repo.path):
        repo, patches = target.fresh()
        _user_state(repo)
        before, patches_before = snapshot(repo), _contents(patches)
        paused, _rc, _output = _interrupt(target, fake_git, point, signal.SIGKILL)
        assert paused
        where = f"SIGKILL at git call {point}: {calls[point - 1]}"
        if snapshot(repo) != before:
            rerun = target.run()
            assert rerun.returncode != 0, where
            command = _the_one_command(rerun.stderr)
            env = dict(os.environ, SERIES_WORK_DIR=str(target.work), **(restore_env or {}))
            done = subprocess.run(["bash", "-c", command], cwd=target.root, env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
            assert done.returncode == 0, f"{where}\n{command}\n{done.stdout}{done.stderr}"
            assert snapshot(repo) == before, f"{where}\n{command}\n{done.stdout}"
        assert _contents(patches) == patches_before, where
        checked += 1
    return checked


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --------------------------------------------------------------------------
# apply


@pytest.fixture
def apply_target(toy_series, tmp_path):
    repo, _manifest, patch_dir = toy_series
    return Target(repo, patch_dir, tmp_path / "runs", ["apply"], tmp_path / "work")


def test_apply_interrupted_at_every_step_changes_nothing(apply_target, fake_git):
    checked = _signal_every_step(apply_target, fake_git, every=4)
    assert checked >= 10


def _mutating(calls: list[str], repo: Path) -> list[int]:
    """Calls that write to the user's checkout, and the call after each."""
    writes = ("update-ref", "config", "read-tree", "symbolic-ref", "fetch", "checkout", "am",
              "reset", "branch")  # fmt: skip
    found = set()
    for n, call in enumerate(calls, 1):
        words = call.split()
        if f"-C {repo} " in call + " " and any(w in words for w in writes):
            found.update({n, min(n + 1, len(calls))})
    return sorted(found)


def test_apply_killed_at_every_write_is_restored_by_one_command(apply_target, fake_git):
    checked = _kill_every_step(apply_target, fake_git, _mutating)
    assert checked >= 3


@pytest.fixture
def remove_target(toy_series, tmp_path):
    from seriestool import apply as apply_mod

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    return Target(repo, patch_dir, tmp_path / "runs", ["remove"], tmp_path / "work")


def test_remove_interrupted_at_every_step_changes_nothing(remove_target, fake_git):
    checked = _signal_every_step(remove_target, fake_git, every=1)
    assert checked >= 8


def test_remove_killed_at_every_write_is_restored_by_one_command(remove_target, fake_git):
    checked = _kill_every_step(remove_target, fake_git, _mutating)
    assert checked >= 3


# --------------------------------------------------------------------------
# rebase


@pytest.fixture
def rebase_target(make_repo, tmp_path):
    """A series on ``main`` and an upstream branch that conflicts with patch 1."""
    from seriestool import manifest as manifest_mod
    from test_rebase import LOADER, _edit, _series_on

    repo = make_repo("upstream", {
        "pkg/loader.py": LOADER,
        "pkg/other.py": "VALUE = 1\n\n\n\n\nOTHER = 1\n",
    })  # fmt: skip
    base = repo.head()
    patch_dir = tmp_path / "patches"
    _series_on(repo, base, patch_dir, manifest_mod.Base(
        project="toy", version="1.0", upstream_commit=base[:9],
        sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64), commit=base, touched_files={},
    ))  # fmt: skip
    repo.git("checkout", "-q", "-b", "drift", "main")
    repo.commit("upstream drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    repo.git("checkout", "-q", "-b", "conflict", "main")
    repo.commit("upstream conflict", {"pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'")})
    repo.git("checkout", "-q", "main")
    return repo, patch_dir


def _no_session(target: Target, where: str) -> None:
    assert not (target.work / "rebase" / "state.json").exists(), where


def test_rebase_interrupted_at_every_step_changes_nothing(rebase_target, tmp_path, fake_git):
    repo, patch_dir = rebase_target
    target = Target(repo, patch_dir, tmp_path / "runs", ["rebase", "drift"], tmp_path / "work")
    checked = _signal_every_step(target, fake_git, every=15, check_more=_no_session)
    assert checked >= 8


def test_rebase_keeping_a_conflict_interrupted_at_every_step_changes_nothing(
    rebase_target, tmp_path, fake_git
):
    repo, patch_dir = rebase_target
    target = Target(repo, patch_dir, tmp_path / "runs", ["rebase-keep", "conflict"],
                    tmp_path / "work")  # fmt: skip
    # The scratch clone's steps are those of the test above: here, the checkout's.
    checked = _signal_every_step(target, fake_git, every=50, check_more=_no_session)
    assert checked >= 8


def test_rebase_keeping_a_conflict_killed_at_every_write_is_restored_by_one_command(
    rebase_target, tmp_path, fake_git
):
    repo, patch_dir = rebase_target
    target = Target(repo, patch_dir, tmp_path / "runs", ["rebase-keep", "conflict"],
                    tmp_path / "work")  # fmt: skip
    checked = _kill_every_step(target, fake_git, _mutating)
    assert checked >= 3


# --------------------------------------------------------------------------
# Read-only commands: check and compare stop with the usual line and leave no
# scratch folder behind.


def _read_only_signalled(argv: list[str], fake_git, tmp_path: Path) -> int:
    """Run ``argv`` (a seriestool command) with SIGTERM at every git call; each
    run must end with exit 143 and one line, and leave its temporary folder empty."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = dict(PYTHONPATH=str(ROOT / "scripts"), TMPDIR=str(tmp))
    cmd = [sys.executable, "-m", "seriestool", *argv]
    fake_git.reset()
    done = subprocess.run(cmd, env={**fake_git.env(), **env}, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    calls = len(fake_git.calls())
    for point in range(1, calls + 1, max(1, calls // 8)):
        fake_git.reset()
        proc = subprocess.Popen(cmd, env={**fake_git.env(pause_at=point), **env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip
        assert _wait(fake_git.paused, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        fake_git.go()
        _out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 128 + signal.SIGTERM, (point, err)
        assert err.strip() == "error: interrupted by SIGTERM", (point, err)
        assert list(tmp.iterdir()) == [], point
    return calls


def test_check_interrupted_prints_one_line_and_leaves_no_scratch(toy_series, tmp_path, fake_git):
    repo, manifest, patch_dir = toy_series
    repo.git("checkout", "-q", "-b", "cons", manifest.base.commit)
    repo.git("am", "-q", "--keep-non-patch", *sorted(str(p) for p in patch_dir.glob("*.patch")))
    repo.commit("fork: a change of its own", {"pkg/loader.py": "def load(x):\n    return 2\n"})
    argv = ["check", "--vllm", str(repo.path), "--consolidated", "cons", "--base",
            manifest.base.commit, "--patches-dir", str(patch_dir)]  # fmt: skip
    assert _read_only_signalled(argv, fake_git, tmp_path) > 5


def test_compare_interrupted_prints_one_line_and_leaves_no_scratch(
    make_repo, tmp_path, fake_git, monkeypatch
):
    from test_compare import BASE_FILES, V1, Project

    project = Project(make_repo("vllm", BASE_FILES), make_repo("project", {"README.md": "s\n"}))
    project.commit(V1, "1", "Series v1")
    project.write(V1[:2], "2")
    argv = ["compare", "--repo", str(project.project.path), "--vllm", str(project.upstream.path),
            "--from", "1"]  # fmt: skip
    assert _read_only_signalled(argv, fake_git, tmp_path) > 5
