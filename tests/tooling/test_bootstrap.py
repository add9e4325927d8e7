"""``make venv`` (scripts/bootstrap_venv.py) on a stand-in venv: it says what
each stage installs before pip runs, and a venv whose Python is gone is one
line with the fix, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

# A stand-in for the venv's python: logs its arguments; `seriestool base
# --requirements FILE` writes an empty FILE.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >&2
if [ "$3" = base ]; then : > "$5"; fi
"""


def _bootstrap(venv) -> subprocess.CompletedProcess:
    env = dict(os.environ, SERIES_VENV=str(venv))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bootstrap_venv.py")],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip


def test_each_stage_says_what_it_installs_before_pip_runs(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    proc = _bootstrap(tmp_path / "venv")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    first = next(n for n, line in enumerate(lines) if "pip install" in line)
    assert "venv series-stage1: installing the tooling's" in lines[first - 1]
    assert "--quiet" not in lines[first]
    assert any("installing what vLLM's tests need" in line for line in lines[first:])


def test_a_venv_whose_python_is_gone_is_one_line_with_the_fix(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(tmp_path / "gone" / "python3")
    proc = _bootstrap(tmp_path / "venv")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {python} points at {tmp_path / 'gone' / 'python3'}, which no longer exists"
        f" (the Python {tmp_path / 'venv'} was made with has moved or gone): remove it"
        f" (`rm -rf {tmp_path / 'venv'}`) and run `make venv` again"
    ]
