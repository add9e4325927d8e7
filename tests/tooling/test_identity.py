"""Whose name commits carry: the tools write no ``user.*`` into any checkout's
config; the commits they make carry the user's identity (global config
included), passed per command; the README's re-sign recipe signs as the user."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import GIT, ROOT, Repo
from seriestool import apply as apply_mod
from seriestool import base as base_mod
from seriestool import rebase as rebase_mod
from seriestool.errors import SeriesError
from test_rebase import LOADER, _conflict_base, _edit, _rebase, series, work_dir  # noqa: F401

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


def _user_git(path, *args: str) -> str:
    """git as the user runs it: their global config, no test identity."""
    proc = subprocess.run([GIT, "-C", str(path), *args], capture_output=True, text=True,
                          env=dict(os.environ), check=True)  # fmt: skip
    return proc.stdout.strip()


def _local_identity(path) -> str:
    proc = subprocess.run([GIT, "-C", str(path), "config", "--local", "--get-regexp", "^user\\."],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return proc.stdout


def _readme_resign_recipe() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Proposing a patch upstream", 1)[1]
    return re.search(r"```sh\n(.*?)\n```", section, re.S).group(1).strip()


def test_applied_default_checkout_has_no_user_config_and_readme_resign_is_the_users(
    toy_series, tmp_path, global_identity
):
    repo, manifest, patch_dir = toy_series
    bare = tmp_path / "bare.git"
    subprocess.run([GIT, "clone", "-q", "--bare", str(repo.path), str(bare)], check=True)
    subprocess.run([GIT, "-C", str(bare), "branch", "-f", "base", repo.head()], check=True)
    checkout = base_mod.clone(bare, tmp_path / "vllm")
    assert _local_identity(checkout) == ""

    assert apply_mod.apply_series(checkout, manifest, patch_dir, log=lambda *_: None) == 0
    assert _local_identity(checkout) == ""
    committers = _user_git(checkout, "log", "--format=%cn <%ce>", "base..HEAD").splitlines()
    assert committers == [f"{USER[0]} <{USER[1]}>"] * 2

    subprocess.run(_readme_resign_recipe(), shell=True, cwd=checkout, check=True,
                   capture_output=True, env=dict(os.environ))  # fmt: skip
    trailers = _user_git(checkout, "log", "--format=%(trailers:key=Signed-off-by,valueonly)",
                         "base..HEAD")  # fmt: skip
    assert trailers.split() and set(trailers.split("\n\n")) == {f"{USER[0]} <{USER[1]}>"}


def test_keep_conflict_works_with_the_identity_only_in_global_config(
    series, work_dir, global_identity
):
    repo, patch_dir = series
    repo.git("config", "--unset", "user.name")
    repo.git("config", "--unset", "user.email")
    _conflict_base(repo)

    with pytest.raises(SeriesError, match="left in progress"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    resolved = _edit(_edit(LOADER, 10, "line_10 = 'X'"), 11, "line_11 = 11  # resolved")
    repo.write({"pkg/loader.py": resolved})
    repo.git("add", "pkg/loader.py")
    assert rebase_mod.resume(log=lambda *_: None) == 0

    branch = "toy/v1-rebase-onto-conflict"
    assert _user_git(repo.path, "log", "-3", "--format=%cn", branch).split("\n") == [USER[0]] * 3
    assert _local_identity(repo.path) == ""
