"""One tool run per checkout at a time: a second ``apply`` (or ``rebase
--continue``, ``--abort``) started while the first is working refuses before
touching anything and names the first; the first finishes as if alone.  Real
parallel processes, at several offsets."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, snapshot
from seriestool import manifest as manifest_mod
from test_interrupts import TIMEOUT, _wait
from test_rebase import LOADER, _conflict_base, _edit, _series_on

BRANCH = "toy/v1-on-toy-1.0"


def _apply_cmd(repo, patch_dir) -> list[str]:
    return [sys.executable, "-m", "seriestool", "apply", "--vllm", str(repo.path),
            "--patches-dir", str(patch_dir)]  # fmt: skip


def _unapply(repo) -> None:
    repo.git("checkout", "-q", "main")
    repo.git("branch", "-q", "-D", BRANCH)  # its config section goes with it


def _start(cmd, env) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**extra, "PYTHONPATH": str(ROOT / "scripts")}


def test_second_apply_while_the_first_works_refuses_and_names_it(toy_series, fake_git):
    repo, _manifest, patch_dir = toy_series
    # The first run is paused at several of its git calls (the lock is taken
    # after its first few git calls: is it a checkout, where is its git folder).
    fake_git.reset()
    done = subprocess.run(_apply_cmd(repo, patch_dir), env=_env(fake_git.env()),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = len(fake_git.calls())
    _unapply(repo)
    before = snapshot(repo)
    assert calls > 10
    for point in (calls // 4, calls // 2, calls - 3):
        fake_git.reset()
        first = _start(_apply_cmd(repo, patch_dir), _env(fake_git.env(pause_at=point)))
        assert _wait(fake_git.paused, first), point
        second = subprocess.run(_apply_cmd(repo, patch_dir), env=_env(dict(os.environ)),
                                capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
        assert second.returncode == 1, (point, second.stderr)
        assert "another seriestool command (pid" in second.stderr, second.stderr
        assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        fake_git.go()
        _out, err = first.communicate(timeout=TIMEOUT)
        assert first.returncode == 0, (point, err)
        assert repo.git("symbolic-ref", "--short", "HEAD") == BRANCH
        _unapply(repo)
        assert snapshot(repo)["files"] == before["files"]


@pytest.mark.parametrize("offset", [0.0, 0.05, 0.2, 0.5])
def test_two_applies_at_once_leave_one_applied_series(toy_series, offset):
    repo, _manifest, patch_dir = toy_series
    for _trial in range(2):
        first = _start(_apply_cmd(repo, patch_dir), _env(dict(os.environ)))
        time.sleep(offset)
        second = subprocess.run(_apply_cmd(repo, patch_dir), env=_env(dict(os.environ)),
                                capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
        _out, err = first.communicate(timeout=TIMEOUT)
        results = [(first.returncode, err), (second.returncode, second.stderr)]
        assert all("Traceback" not in e for _rc, e in results), results
        assert sum(rc == 0 for rc, _e in results) >= 1, results
        for rc, e in results:
            assert rc == 0 or "another seriestool command" in e, results
        assert repo.git("symbolic-ref", "--short", "HEAD") == BRANCH
        assert repo.git("status", "--porcelain") == ""
        assert not (repo.path / ".git" / "seriestool-journal").exists()
        _unapply(repo)


def test_rebase_continue_holds_the_lock_against_abort_continue_and_apply(
    make_repo, tmp_path, fake_git
):
    """While `rebase --continue` works in the checkout that keeps its conflict,
    `--abort`, a second `--continue` and `apply` there refuse, name it and
    change nothing; the first finishes as if alone."""
    repo = make_repo("upstream", {"pkg/loader.py": LOADER, "pkg/other.py": "VALUE = 1\n"})
    base = repo.head()
    patch_dir, work = tmp_path / "patches", tmp_path / "work"
    _series_on(repo, base, patch_dir, manifest_mod.Base(
        "toy", "1.0", base[:9], manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64), base, {},
    ))  # fmt: skip
    _conflict_base(repo)
    series = {p.name: p.read_bytes() for p in patch_dir.iterdir()}
    ours = _env({"SERIES_WORK_DIR": str(work)})
    env = {**os.environ, **ours}
    rebase = [sys.executable, "-m", "seriestool", "rebase"]
    state = work / "rebase" / "state.json"

    def keep_and_resolve_the_conflict() -> dict[str, str]:
        for name, data in series.items():  # the series on the old base again
            (patch_dir / name).write_bytes(data)
        before = snapshot(repo)
        kept = subprocess.run([*rebase, "--to", "conflict", "--vllm", str(repo.path),
                               "--patches-dir", str(patch_dir), "--keep-conflict", "--skip-tests"],
                              env=env, capture_output=True, text=True)  # fmt: skip
        assert kept.returncode == 1 and "left in progress" in kept.stderr, kept.stderr
        repo.write({"pkg/loader.py": _edit(_edit(LOADER, 10, "line_10 = 'X'"), 11, "line_11 = 11")})
        repo.git("add", "pkg/loader.py")
        return before

    def finished(before: dict[str, str]) -> None:
        after = snapshot(repo)
        assert {k: v for k, v in after.items() if k != "branches"} == {
            k: v for k, v in before.items() if k != "branches"
        }
        assert not state.exists()
        for branch in repo.git("for-each-ref", "--format=%(refname)", "refs/heads/toy").split():
            repo.git("update-ref", "-d", branch)

    before = keep_and_resolve_the_conflict()
    fake_git.reset()
    done = subprocess.run([*rebase, "--continue"], env={**fake_git.env(), **ours},
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = len(fake_git.calls())
    finished(before)
    assert calls > 10
    # From its fifth git call on, the first holds the lock (the first four read
    # the user's safe.directory entries and find the checkout's git folder).
    for point in (5, calls // 2, calls - 3):
        before = keep_and_resolve_the_conflict()
        fake_git.reset()
        first = _start([*rebase, "--continue"], {**fake_git.env(pause_at=point), **ours})
        assert _wait(fake_git.paused, first), point
        running, session = snapshot(repo), state.read_bytes()
        for second in ([*rebase, "--abort"], [*rebase, "--continue"], _apply_cmd(repo, patch_dir)):
            proc = subprocess.run(second, env=env, capture_output=True, text=True, timeout=TIMEOUT)
            assert proc.returncode == 1, (point, second, proc.stderr)
            assert f"another seriestool command (pid {first.pid}: " in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
            assert snapshot(repo) == running and state.read_bytes() == session
        fake_git.go()
        _out, err = first.communicate(timeout=TIMEOUT)
        assert first.returncode == 0, (point, err)
        finished(before)
