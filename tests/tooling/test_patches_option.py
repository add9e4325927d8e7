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
