"""The make targets as a user types them: a path with spaces arrives intact,
and the command a refusal suggests runs as printed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest
from conftest import ROOT, Repo, export_work_branch
from seriestool import manifest as manifest_mod
from seriestool.errors import SeriesError

LOADER = "".join(f"line_{n:02d} = {n}\n" for n in range(1, 31))


def _make(*args: str, work) -> subprocess.CompletedProcess:
    env = dict(os.environ, SERIES_WORK_DIR=str(work))
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], env=env, capture_output=True,
                          text=True)  # fmt: skip


def test_apply_through_make_takes_a_checkout_path_with_spaces(toy_series, tmp_path, make_work_dir):
    repo, manifest, patch_dir = toy_series
    spaced = Repo(tmp_path / "my checkouts" / "vllm copy")
    shutil.copytree(repo.path, spaced.path)
    done = _make("apply", f"VLLM={spaced.path}", f"PATCHES={patch_dir}", work=make_work_dir)
    assert done.returncode == 0, done.stderr
    assert spaced.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name


def test_not_at_the_base_hint_runs_as_printed(make_repo, tmp_path, make_work_dir):
    """apply refuses a checkout whose files moved on; the rebase it suggests,
    pasted as printed, carries the series there, and apply then succeeds."""
    repo = make_repo("my vllm", {"pkg/loader.py": LOADER, "tests/test_loader.py": "X = 1\n"})
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit("[Loader] change line 10", {
        "pkg/loader.py": LOADER.replace("line_10 = 10", 'line_10 = "ten"'),
        "tests/test_ten.py": "def test_ten():\n    assert True\n",
    })  # fmt: skip
    patch_dir = tmp_path / "my patches"
    patch_dir.mkdir()
    export_work_branch(repo, base, patch_dir)
    local = repo.commit("local change", {"pkg/loader.py": LOADER.replace("line_25 = 25", "")})

    refused = _make("apply", f"VLLM={repo.path}", f"PATCHES={patch_dir}", work=make_work_dir)
    assert refused.returncode != 0 and "is not at the pinned base" in refused.stderr
    [hint] = [line.strip() for line in refused.stderr.splitlines()
              if line.startswith("    make ") and " rebase " in line]  # fmt: skip
    assert shlex.split(hint)[:4] == ["make", "-C", str(ROOT), "rebase"]

    env = dict(os.environ, SERIES_WORK_DIR=str(make_work_dir))
    done = subprocess.run(["bash", "-c", hint], cwd=tmp_path, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert manifest_mod.load(patch_dir / "series.json").base.commit == local
    applied = _make("apply", f"VLLM={repo.path}", f"PATCHES={patch_dir}", work=make_work_dir)
    assert applied.returncode == 0, applied.stderr
    assert 'line_10 = "ten"' in (repo.path / "pkg/loader.py").read_text()


def test_readme_states_what_the_code_does(monkeypatch):
    """The README's claims that fresh users rely on, checked against the code."""
    from seriestool import git as g

    readme = " ".join((ROOT / "README.md").read_text().split())
    # With no identity of the user's, nothing commits as an invented one.
    for key in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "")  # git refuses an empty name
    with pytest.raises(SeriesError, match="git has no identity of yours"):
        g.user_identity(ROOT)
    # A restored checkout gets new file mtimes: not "byte for byte".
    assert "byte for byte" not in readme
    # `make rebase ABORT=1` skips `make venv` (the Makefile's rebase prerequisite).
    assert "rebase: $(if $(ABORT),,venv)" in (ROOT / "Makefile").read_text()
    assert "`make rebase ABORT=1` skips `make venv`" in readme


def test_help_names_the_base_the_manifest_pins():
    """After a rebase `make help` names the new base: read from the manifest."""
    version = manifest_mod.load().base.version
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert f"materialise vLLM v{version} (or use VLLM=)" in out
    assert f"v{version}" not in (ROOT / "Makefile").read_text()


def test_status_of_a_consolidated_branch_suggests_the_check_and_it_runs(toy_series, make_work_dir):
    repo, manifest, patch_dir = toy_series
    repo.git("checkout", "-q", "-b", "fork")
    repo.commit("the loader series, squashed", {
        "pkg/loader.py": "def load(x):\n    # first\n    return x + 0\n",
        "tests/test_first.py": "def test_first():\n    assert True\n",
        "tests/test_second.py": "def test_second():\n    assert True\n",
        "pkg/fork.py": "FORK = 1\n",
    })  # fmt: skip
    shown = _make("status", f"VLLM={repo.path}", f"PATCHES={patch_dir}", work=make_work_dir)
    assert "(HEAD is on no branch that `make apply` made)" in shown.stdout
    [hint] = [line.strip() for line in shown.stdout.splitlines() if line.startswith("    make ")]
    assert f" check CONSOLIDATED=fork VLLM={repo.path} PATCHES={patch_dir}" in hint
    env = dict(os.environ, SERIES_WORK_DIR=str(make_work_dir))
    done = subprocess.run(["bash", "-c", hint], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "combined" in done.stdout
