"""`make status`, `make remove`, and apply on a checkout carrying another series
version or cloned from upstream: on throw-away checkouts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import ROOT, Repo, snapshot
from seriestool import apply as apply_mod
from seriestool import manifest as manifest_mod
from seriestool import status as status_mod
from seriestool import versions
from seriestool.errors import SeriesError


def _apply(repo, manifest, patch_dir):
    return apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)


def _status(repo, patch_dir) -> str:
    lines = []
    status_mod.status(repo.path, patch_dir, log=lines.append)
    return "\n".join(lines)


def _tracked(repo) -> dict:
    """Everything but refs and config: what remove must bring back."""
    state = snapshot(repo)
    return {k: v for k, v in state.items() if k not in ("branches", "config", "raw")}


def test_status_names_version_base_and_commits_beyond(toy_series):
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    assert "series: none; HEAD has the files of the pinned base" in _status(repo, patch_dir)
    _apply(repo, manifest, patch_dir)
    shown = _status(repo, patch_dir)
    assert "series: v1 (working tree), all 2 patches applied" in shown
    assert f"base: {base} (recorded by apply); commits on {manifest.branch_name} that are" in shown


def _amend(repo) -> str:
    """``git commit --amend`` of the series' top commit, changing a file it patches."""
    repo.write({"pkg/loader.py": "def load(x):\n    # first\n    return x + 1\n"})
    repo.git("commit", "-q", "-a", "--amend", "--no-edit")
    return repo.head()


@pytest.mark.parametrize("change", ["amend", "commit"])
def test_status_names_each_commit_on_the_branch_that_is_not_the_series(toy_series, change):
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    mine = _amend(repo) if change == "amend" else repo.commit("my own work", {"pkg/other.py": "2"})
    subject = "[Loader] second change" if change == "amend" else "my own work"
    assert (
        f"commits on {manifest.branch_name} that are no series patch: 1\n  {mine[:12]} {subject}"
        in _status(repo, patch_dir)
    )


def test_apply_on_the_series_branch_with_an_amended_patch_prints_a_way_out_that_runs(toy_series):
    """Not `git checkout` of the branch HEAD is on: the printed command keeps the
    amended commit on a branch of its own and takes the series out; apply then runs."""
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    amended = _amend(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="is on the series branch") as e:
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before
    assert f"{amended[:12]} [Loader] second change" in str(e.value)
    [command] = [line[4:] for line in str(e.value).splitlines() if line.startswith("    ")]
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    _apply(repo, manifest, patch_dir)
    assert "all 2 patches applied" in _status(repo, patch_dir)
    assert repo.git("rev-parse", f"{manifest.branch_name}-mine") == amended


@pytest.mark.parametrize("detached", [False, True])
def test_remove_goes_back_to_where_apply_started_and_keeps_the_branch(toy_series, detached):
    repo, manifest, patch_dir = toy_series
    if detached:
        repo.git("checkout", "-q", "--detach")
    repo.write({"notes.txt": "untracked\n"})
    before = _tracked(repo)
    _apply(repo, manifest, patch_dir)
    tip = repo.head()
    status_mod.remove(repo.path, log=lambda *_: None)
    assert _tracked(repo) == before
    assert repo.git("rev-parse", f"refs/heads/{manifest.branch_name}") == tip
    assert "series: none" in _status(repo, patch_dir)
    # and apply again switches to the kept branch, which holds the series
    _apply(repo, manifest, patch_dir)
    assert repo.git("symbolic-ref", "HEAD") == f"refs/heads/{manifest.branch_name}"
    assert repo.head() == tip and "all 2 patches applied" in _status(repo, patch_dir)


def test_remove_with_delete_drops_branch_and_its_config(toy_series):
    repo, manifest, patch_dir = toy_series
    before = snapshot(repo)
    _apply(repo, manifest, patch_dir)
    status_mod.remove(repo.path, delete_branch=True, log=lambda *_: None, patch_dir=patch_dir)
    after = snapshot(repo)
    del before["raw"], after["raw"]  # the index's stat data is new
    assert after == before


def test_remove_delete_refuses_a_branch_holding_a_commit_of_the_users(toy_series):
    """DELETE=1 never deletes the user's commit: refused, nothing changed; without
    DELETE=1 the branch is kept, and the printed command brings a deleted series
    branch back with its config, so status and remove know it again."""
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    mine = repo.commit("my own work", {"pkg/other.py": "VALUE = 2\n"})
    before = snapshot(repo)
    with pytest.raises(SeriesError) as e:
        status_mod.remove(repo.path, delete_branch=True, log=lambda *_: None, patch_dir=patch_dir)
    assert "holds 1 commit(s) of no series version" in str(e.value)
    assert f"{mine[:12]} my own work" in str(e.value)
    assert snapshot(repo) == before
    repo.git("reset", "-q", "--hard", "HEAD~1")
    tip = repo.head()
    lines = []
    status_mod.remove(repo.path, delete_branch=True, log=lines.append, patch_dir=patch_dir)
    back = lines[-1].split("(`", 1)[1].rsplit("`", 1)[0]
    subprocess.run(back, shell=True, check=True, capture_output=True)
    repo.git("checkout", "-q", manifest.branch_name)
    assert repo.head() == tip
    assert "recorded by apply" in _status(repo, patch_dir)
    status_mod.remove(repo.path, log=lambda *_: None, patch_dir=patch_dir)


def test_remove_delete_after_keeping_the_users_commit_as_printed(toy_series):
    """The refusal's command keeps the user's commit on a branch of its own;
    pasted, DELETE=1 then drops the series branch and the commit stays."""
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    mine = repo.commit("my own work", {"pkg/other.py": "VALUE = 2\n"})
    with pytest.raises(SeriesError) as e:
        status_mod.remove(repo.path, delete_branch=True, log=lambda *_: None, patch_dir=patch_dir)
    keep = str(e.value).split("a branch of their own (`", 1)[1].split("`", 1)[0]
    subprocess.run(keep, shell=True, check=True, capture_output=True)
    status_mod.remove(repo.path, delete_branch=True, log=lambda *_: None, patch_dir=patch_dir)
    assert repo.git("rev-parse", "my-work").strip() == mine
    assert manifest.branch_name not in repo.git("branch", "--list")


@pytest.mark.parametrize("mine", [None, "refused", "on another branch"])
def test_remove_delete_after_a_plain_remove_deletes_the_kept_branch(toy_series, mine):
    """DELETE=1 on the branch a plain remove went back to deletes the series branch
    it kept, refusing as on the branch itself a commit no other branch holds."""
    repo, manifest, patch_dir = toy_series
    before = snapshot(repo)
    _apply(repo, manifest, patch_dir)
    if mine:
        commit = repo.commit("my own work", {"pkg/other.py": "VALUE = 2\n"})
        if mine == "on another branch":
            repo.git("branch", "my-work")
    status_mod.remove(repo.path, log=lambda *_: None, patch_dir=patch_dir)
    if mine == "refused":
        kept = snapshot(repo)
        with pytest.raises(SeriesError, match="holds 1 commit\\(s\\) of no series") as e:
            status_mod.remove(repo.path, delete_branch=True, patch_dir=patch_dir)
        assert f"{commit[:12]} my own work" in str(e.value) and snapshot(repo) == kept
        assert "without DELETE=1" not in str(e.value)  # that remove was run already
        keep = str(e.value).split("a branch of their own (`", 1)[1].split("`", 1)[0]
        subprocess.run(keep, shell=True, check=True, capture_output=True)
    status_mod.remove(repo.path, delete_branch=True, log=lambda *_: None, patch_dir=patch_dir)
    assert manifest.branch_name not in repo.git("branch", "--list")
    assert manifest.branch_name not in repo.git("config", "--local", "--list")
    if mine:
        assert repo.git("rev-parse", "my-work") == commit
    else:
        after = snapshot(repo)
        del before["raw"], after["raw"]
        assert after == before


def test_remove_delete_refuses_a_kept_branch_checked_out_in_another_worktree(toy_series, tmp_path):
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    status_mod.remove(repo.path, log=lambda *_: None, patch_dir=patch_dir)
    repo.git("worktree", "add", "-q", str(tmp_path / "other"), manifest.branch_name)
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="is checked out in another worktree"):
        status_mod.remove(repo.path, delete_branch=True, patch_dir=patch_dir)
    assert snapshot(repo) == before
    assert Repo(tmp_path / "other").git("status", "--porcelain") == ""  # still on its branch


def test_apply_refuses_a_kept_branch_holding_more_than_the_series(toy_series):
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    repo.commit("my own work", {"pkg/other.py": "VALUE = 2\n"})
    status_mod.remove(repo.path, log=lambda *_: None, patch_dir=patch_dir)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as e:
        _apply(repo, manifest, patch_dir)
    assert "holds 1 commit(s) of no series version" in str(e.value)
    move = str(e.value).split("keeping its commits (`", 1)[1].split("`", 1)[0]
    assert "branch -m" in move and "branch -D" not in move
    assert snapshot(repo) == before
    subprocess.run(move, shell=True, check=True, capture_output=True)
    _apply(repo, manifest, patch_dir)
    assert "all 2 patches applied" in _status(repo, patch_dir)


def test_remove_refuses_a_branch_apply_did_not_make_unchanged(toy_series):
    repo, _manifest, _patch_dir = toy_series
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="on no branch that `make apply` made"):
        status_mod.remove(repo.path)
    assert snapshot(repo) == before


def test_remove_refuses_to_overwrite_an_untracked_file(toy_series):
    repo, manifest, patch_dir = toy_series
    repo.commit("pkg/extra.py on main", {"pkg/extra.py": "X = 1\n"})
    _apply(repo, manifest, patch_dir)
    # the series branch has no pkg/extra.py? it does: apply started on that commit
    repo.git("rm", "-q", "pkg/extra.py")
    repo.git("commit", "-q", "-m", "drop extra")
    repo.write({"pkg/extra.py": "mine\n"})
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="pkg/extra.py \\(untracked\\)"):
        status_mod.remove(repo.path)
    assert snapshot(repo) == before


def _versions_repo(tmp_path, toy_series):
    """A tooling repository whose history holds v1 (one patch of its own) and
    then v2 (the toy series); returns its patches/ (v2), v1's folder and v1."""
    from seriestool import export as export_mod

    repo, manifest, patch_dir = toy_series
    repo.git("checkout", "-q", "-b", "v1work")
    repo.commit("[Loader] v1 change", {"pkg/loader.py": "def load(x):\n    return x  # v1\n"})
    v1_dir = tmp_path / "v1-patches"
    v1 = manifest_mod.load(patch_dir / "series.json")
    v1.patches, v1.base.touched_files = [], {}
    export_mod.export_series(repo.path, v1, "v1work", manifest.base.commit, patch_dir=v1_dir,
                             manifest_path=v1_dir / "series.json", log=lambda *_: None)  # fmt: skip
    repo.git("checkout", "-q", "main")
    repo.git("branch", "-q", "-D", "v1work")
    tooling = Repo(tmp_path / "tooling")
    tooling.path.mkdir()
    tooling.git("init", "-q", "-b", "main")
    shutil.copytree(v1_dir, tooling.path / "patches")
    tooling.commit("series v1")
    shutil.rmtree(tooling.path / "patches")
    shutil.copytree(patch_dir, tooling.path / "patches")
    v2 = manifest_mod.load(tooling.path / "patches/series.json")
    v2.version = "2"
    v2.save(tooling.path / "patches/series.json")
    tooling.commit("series v2")
    return tooling.path / "patches", v1_dir, manifest_mod.load(v1_dir / "series.json")


@pytest.mark.parametrize("recorded", [True, False])
def test_apply_names_an_earlier_version_and_its_upgrade_runs_as_printed(
    toy_series, tmp_path, make_work_dir, recorded
):
    repo = toy_series[0]
    v2_dir, v1_dir, v1 = _versions_repo(tmp_path, toy_series)
    _apply(repo, v1, v1_dir)
    if not recorded:  # applied by hand: no branch config
        repo.git("config", "--remove-section", f"branch.{v1.branch_name}")
    v1_tip = repo.head()
    v2 = manifest_mod.load(v2_dir / "series.json")
    assert "series: v1 (commit" in _status(repo, v2_dir)
    before = snapshot(repo)
    with pytest.raises(
        SeriesError, match=r"carries series v1 \(commit \w+\) \(1 of 1 patches\)"
    ) as e:
        _apply(repo, v2, v2_dir)
    assert snapshot(repo) == before
    [command] = [line[4:] for line in str(e.value).splitlines() if line.startswith("    ")]
    env = dict(os.environ, SERIES_WORK_DIR=str(make_work_dir))
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert repo.git("symbolic-ref", "--short", "HEAD") == v2.branch_name
    assert repo.git("rev-parse", v1.branch_name) == v1_tip  # the old branch is kept
    assert "series: v2 (working tree), all 2 patches" in _status(repo, v2_dir)


def test_apply_names_an_earlier_series_of_this_repository(tmp_path):
    """The real case: the oldest series of this repository's history on the
    pinned base applied to the materialised base; apply of the current series
    names that version and commit."""
    from seriestool import base as base_mod

    current = manifest_mod.load()
    base_repo = base_mod.base_repo_path(current.base.project, current.base.version)
    if not base_repo.is_dir():
        pytest.skip(f"{base_repo} is not materialised: run `make venv` first")
    checkout = base_mod.clone(base_repo, tmp_path / "vllm")
    on_base = [
        commit for commit, version in versions.history(ROOT)
        if version != current.version
        and json.loads(Repo(ROOT).git("show", f"{commit}:patches/series.json"))["base"]["version"]
        == current.base.version
    ]  # fmt: skip
    if not on_base:
        pytest.skip(f"no earlier series version of this repository is on {current.base.version}")
    earlier = versions.resolve(ROOT, on_base[-1])
    earlier_dir = tmp_path / "earlier"
    manifest = versions.write_patches(ROOT, earlier, earlier_dir)
    apply_mod.apply_series(checkout, manifest, earlier_dir, log=lambda *_: None)
    n = len(manifest.patches)
    with pytest.raises(SeriesError, match=rf"carries series v{earlier.version} \(commit "
                       rf"{on_base[-1][:7]}\w*\) \({n} of {n} patches\)"):  # fmt: skip
        apply_mod.apply_series(checkout, current, log=lambda *_: None)


@pytest.mark.parametrize("clone", ["tag", "remote"])
def test_not_at_base_points_an_upstream_clone_at_the_tag(toy_series, clone):
    repo, manifest, patch_dir = toy_series
    if clone == "tag":
        repo.git("tag", f"v{manifest.base.version}")
    else:
        repo.git("remote", "add", "upstream", "https://github.com/vllm-project/vllm.git")
    repo.commit("moved on", {"pkg/loader.py": "def load(x):\n    return -x\n"})
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="is not at the pinned base") as e:
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before
    tag = f"v{manifest.base.version}"
    expected = f"checkout --detach {tag}"
    if clone == "remote":
        expected = f"fetch --no-tags upstream tag {tag} && git -C {repo.path} {expected}"
    assert expected in str(e.value)
    assert "the base commit" not in str(e.value)
