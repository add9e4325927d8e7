"""Environment failures (a file-size limit, a disk that fills) end a command
with one line naming what failed and what to do, never a traceback; the
checkout is as it was, and nothing of the journal is left behind."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

import pytest
from conftest import ROOT, snapshot
from seriestool import journal
from seriestool.cli import main


def test_a_file_size_limit_names_the_limit(toy_series):
    repo, _manifest, patch_dir = toy_series
    before = snapshot(repo)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))

    proc = subprocess.run(
        [sys.executable, "-m", "seriestool", "apply", "--vllm", str(repo.path),
         "--patches-dir", str(patch_dir)],
        capture_output=True, text=True, preexec_fn=limit, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "scripts")},
    )  # fmt: skip

    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "killed by SIGXFSZ: a file reached the file-size limit" in proc.stderr
    assert snapshot(repo) == before


@pytest.mark.parametrize("where", ["index", "config"])
def test_a_full_disk_while_the_journal_is_written_is_one_line(
    toy_series, monkeypatch, capsys, where
):
    repo, _manifest, patch_dir = toy_series
    before = snapshot(repo)
    copy = journal.shutil.copy2

    def full(src, dst, *args, **kwargs):
        if os.path.basename(src) == where:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(journal.shutil, "copy2", full)
    rc = main(["apply", "--vllm", str(repo.path), "--patches-dir", str(patch_dir)])

    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: No space left on device: ") and "free space" in err
    assert snapshot(repo) == before
