"""Whose name commits carry: the tools write no ``user.*`` into any checkout's
config; the commits they make carry the user's identity (global config
included), passed per command; the README's re-sign recipe signs as the user."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import GIT, ROOT, USER, local_identity, user_git
from seriestool import apply as apply_mod
from seriestool import base as base_mod


def _readme_resign_recipe() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Proposing a patch upstream", 1)[1]
    return re.search(r"```sh\n(git rebase --exec .*?)\n```", section, re.S).group(1).strip()


def test_applied_default_checkout_has_no_user_config_and_readme_resign_is_the_users(
    toy_series, tmp_path, global_identity
):
    repo, manifest, patch_dir = toy_series
    bare = tmp_path / "bare.git"
    subprocess.run([GIT, "clone", "-q", "--bare", str(repo.path), str(bare)], check=True)
    subprocess.run([GIT, "-C", str(bare), "branch", "-f", "base", repo.head()], check=True)
    checkout = base_mod.clone(bare, tmp_path / "vllm")
    assert local_identity(checkout) == ""

    assert apply_mod.apply_series(checkout, manifest, patch_dir, log=lambda *_: None) == 0
    assert local_identity(checkout) == ""
    committers = user_git(checkout, "log", "--format=%cn <%ce>", "base..HEAD").splitlines()
    assert committers == [f"{USER[0]} <{USER[1]}>"] * 2

    subprocess.run(_readme_resign_recipe(), shell=True, cwd=checkout, check=True,
                   capture_output=True, env=dict(os.environ))  # fmt: skip
    trailers = user_git(checkout, "log", "--format=%(trailers:key=Signed-off-by,valueonly)",
                         "base..HEAD")  # fmt: skip
    assert trailers.split() and set(trailers.split("\n\n")) == {f"{USER[0]} <{USER[1]}>"}
