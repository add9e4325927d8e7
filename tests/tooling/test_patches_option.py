"""``PATCHES=`` names a series folder with its manifest beside it: every verb
reads both from there (or refuses the variable by name), and no hint it
prints would overwrite the project's ``patches/``."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import ROOT
from seriestool.cli import main


def _make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip


def test_check_reads_the_manifest_beside_patches_and_hints_for_that_folder(
    toy_series, tmp_path, capsys
):
    repo, manifest, patch_dir = toy_series
    copy = tmp_path / "my-series"
    shutil.copytree(patch_dir, copy)
    first = sorted(copy.glob("*.patch"))[0]
    first.write_text(first.read_text().replace("Body of the first patch.", "Edited body."))

    rc = main(["check", "--vllm", str(repo.path), "--base", manifest.base.commit,
               "--consolidated", "main", "--patches-dir", str(copy)])  # fmt: skip

    err = capsys.readouterr().err
    assert rc == 2
    assert f"disagrees with {copy / 'series.json'}" in err
    assert f"export PATCHES={copy}" in err
    assert "checkout -- ." not in err  # the folder is no repository


def test_make_check_manifest_honours_patches_and_compare_refuses_it(toy_series, tmp_path):
    _repo, _manifest, patch_dir = toy_series
    proc = _make("check-manifest", f"PATCHES={patch_dir}")
    assert proc.returncode == 0 and "manifest ok: 2 patches" in proc.stdout, proc.stderr
    # (base, test-series and device-bundle refuse it the same way, after `make venv`.)
    for target in ("compare", "restore"):
        proc = _make(target, "FROM=1", f"PATCHES={patch_dir}")
        assert proc.returncode != 0, target
        assert f"PATCHES= does not apply to `make {target}`" in proc.stderr, proc.stderr


def _printed(message: str, marker: str) -> str:
    """The command between backquotes in ``message`` that contains ``marker``."""
    return next(c for c in message.split("`")[1::2] if marker in c)


def test_apply_of_an_edited_series_hints_for_that_folder_and_each_hint_works(toy_series, tmp_path):
    """An edited copy (no repository): its own export, no git command on it; an
    edited tracked folder: the stash command, which works as printed and keeps
    the edits; a refusal changes nothing."""
    from conftest import Repo, snapshot
    from seriestool import apply as apply_mod
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    project = Repo(tmp_path / "project")
    shutil.copytree(patch_dir, project.path / "patches")
    project.git("init", "-q")
    project.commit("series")
    for folder in (tmp_path / "my-series", project.path / "patches"):
        if not folder.exists():
            shutil.copytree(patch_dir, folder)
        first = sorted(folder.glob("*.patch"))[0]
        first.write_text(first.read_text().replace("Body of the first patch.", "Edited body."))
        before = snapshot(repo)
        try:
            apply_mod.apply_series(repo.path, manifest, folder, log=lambda *_: None)
        except SeriesError as e:
            message = str(e)
        assert snapshot(repo) == before
        assert f"export PATCHES={folder}" in message
        assert "checkout -- ." not in message
        if folder == tmp_path / "my-series":
            assert f"git -C {folder}" not in message
            continue
        stash = _printed(message, "stash push")
        subprocess.run(stash, shell=True, check=True, capture_output=True)
        assert "Edited body." in project.git("stash", "show", "-p")
        apply_mod.apply_series(repo.path, manifest, folder, log=lambda *_: None)
