"""Materialising a base from an sdist with pip: hash refusal leaves nothing
behind, the base commit id is reproducible, and the cache is reused."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest
from conftest import ROOT, write_sdist
from seriestool import base as base_mod
from seriestool import git as g
from seriestool.errors import SeriesError

VERSION_PY = "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'gabc123def'\n"


def _fake_sdist(folder, project="toyvllm", version="9.9.9", mode=0o644):
    """A minimal sdist pip can prepare metadata for (setuptools, no isolation)."""
    folder.mkdir(exist_ok=True)
    top = f"{project}-{version}"
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{project}"\nversion = "{version}"\n'
        ),
        "vllm/_version.py": VERSION_PY,
        "vllm/__init__.py": "",
        ".gitattributes": "*.py text eol=crlf\n",  # must not alter the import
        ".gitignore": "vllm/_version.py\n",  # must not drop files either
        "tools/run.sh": "#!/bin/sh\n",
    }
    path = folder / f"{project}-{version}.tar.gz"
    return path, write_sdist(path, top, files, mode)


@pytest.fixture
def work_dir(tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(base_mod, "WORK_DIR", work)
    return work


def _materialise(index, sha256, **kwargs):
    return base_mod.materialise(
        "toyvllm", "9.9.9", sha256,
        pip_args=["--no-index", "--find-links", str(index)], log=lambda *_: None,
        **kwargs,
    )  # fmt: skip


def test_wrong_hash_is_refused_and_leaves_nothing(tmp_path, work_dir):
    _sdist, _good = _fake_sdist(tmp_path / "index")
    with pytest.raises(SeriesError) as err:
        _materialise(tmp_path / "index", "0" * 64)
    message = str(err.value)
    assert "toyvllm-9.9.9.tar.gz" in message and "0" * 64 in message
    assert "refusing it" in message
    # No temporary folder, no half-built repository, no sdist kept.
    assert sorted(p.name for p in work_dir.iterdir()) == []


def test_base_commit_is_reproducible_and_records_everything(tmp_path, monkeypatch):
    _sdist, sha = _fake_sdist(tmp_path / "index")
    commits = []
    for name, umask in (("one", 0o022), ("two", 0o077)):
        monkeypatch.setattr(base_mod, "WORK_DIR", tmp_path / name)
        import os

        old = os.umask(umask)
        try:
            repo, commit, digest = _materialise(
                tmp_path / "index", sha, upstream_commit="abc123def"
            )
        finally:
            os.umask(old)
        assert digest == sha
        commits.append(commit)
    assert commits[0] == commits[1]
    listing = g.out(repo, "ls-tree", "-r", "base")
    assert "100755 blob" in next(ln for ln in listing.splitlines() if ln.endswith("tools/run.sh"))
    assert "vllm/_version.py" in listing  # .gitignore in the sdist did not drop it
    # .gitattributes did not convert line endings: blob equals the raw bytes.
    blob = g.out(repo, "show", "base:vllm/_version.py")
    assert blob + "\n" == VERSION_PY.rstrip("\n") + "\n" and "\r" not in blob
    assert g.out(repo, "log", "-1", "--format=%an|%ad|%cd", "--date=iso-strict", "base") == (
        "vLLM sdist import|2000-01-01T00:00:00+00:00|2000-01-01T00:00:00+00:00"
    )


def test_second_run_reuses_the_cache(tmp_path, work_dir, monkeypatch):
    _sdist, sha = _fake_sdist(tmp_path / "index")
    first = _materialise(tmp_path / "index", sha)

    def no_download(*args, **kwargs):
        raise AssertionError("the cached base must be reused")

    monkeypatch.setattr(base_mod, "fetch_sdist", no_download)
    assert _materialise(tmp_path / "index", sha) == first


def test_upstream_commit_mismatch_is_refused(tmp_path, work_dir):
    _sdist, sha = _fake_sdist(tmp_path / "index")
    with pytest.raises(SeriesError, match="records upstream commit 'abc123def'"):
        _materialise(tmp_path / "index", sha, upstream_commit="4ba787ec9")
    assert not base_mod.base_repo_path("toyvllm", "9.9.9").exists()


def test_unpack_refuses_paths_outside_the_tree(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SeriesError, match="cannot unpack bad.tar.gz safely"):
        base_mod.unpack(bad, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_a_relative_work_dir_is_made_absolute(tmp_path):
    """git runs in other folders (the checkout, scratch clones): a relative
    SERIES_WORK_DIR must not change meaning there."""
    code = "from seriestool import base; print(base.WORK_DIR)"
    env = dict(os.environ, SERIES_WORK_DIR="w", PYTHONPATH=str(ROOT / "scripts"))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    assert out == str(tmp_path / "w")


@pytest.mark.parametrize(
    "rev", ["v0.14.0", "f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.14.0"]
)
def test_ruff_pin_reads_a_version_or_a_frozen_rev(rev):
    from seriestool.basecmd import ruff_pin

    config = f"repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  rev: {rev}\n"
    assert ruff_pin(config) == "ruff==0.14.0"
