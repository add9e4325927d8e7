"""The command line entry point (``python -m seriestool``)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def test_a_closed_pipe_ends_the_command_quietly(toy_series):
    """`make -s compare FROM=1 | head`: the reader goes before the output ends."""
    _repo, _manifest, patch_dir = toy_series
    read, write = os.pipe()
    os.close(read)  # a reader that is gone: every write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "seriestool", "check-manifest", "--manifest",
             str(patch_dir / "series.json")],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == 141
