"""In the C locale without Python's UTF-8 mode, patch files, subjects and
paths that are not ASCII work: read and written with explicit encodings."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, export_work_branch

C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _tool(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"), **C_LOCALE)
    return subprocess.run([sys.executable, "-m", "seriestool", *args], capture_output=True,
                          env=env, check=False)  # fmt: skip


def test_check_manifest_of_the_project_in_the_c_locale():
    proc = _tool("check-manifest")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr


def test_apply_a_series_with_non_ascii_paths_and_text_in_the_c_locale(make_repo, tmp_path):
    name = "pkg/donn\u00e9es.py"
    repo = make_repo("upstream", {name: "X = 'caf\u00e9'\n", "README": "r\n"})
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit("[Loader] caf\u00e9 \u2014 na\u00efve", {name: "X = 'caf\u00e9 cr\u00e8me'\n"})
    patch_dir = tmp_path / "patches"
    export_work_branch(repo, base, patch_dir, sdist=("", ""))

    proc = _tool("apply", "--vllm", str(repo.path), "--patches-dir", str(patch_dir))

    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert (repo.path / name).read_text(encoding="utf-8") == "X = 'caf\u00e9 cr\u00e8me'\n"
