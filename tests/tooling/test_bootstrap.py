"""``make venv`` (scripts/bootstrap_venv.py) on a stand-in venv: it says what
each stage installs before pip runs, and why (the base moved); run again with
nothing changed, it writes nothing in the venv; a venv whose Python is gone is
one line with the fix, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

# A stand-in for the venv's python: logs its arguments; `seriestool base
# --requirements FILE` writes the requirements of base $FAKE_BASE into FILE.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >&2
if [ "$3" = base ]; then printf '# vllm %s: requirements\\nruff==0.17.2\\n' "$FAKE_BASE" > "$5"; fi
"""


@pytest.fixture
def fake_venv(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path / "venv"


def _bootstrap(venv, base="0.33.0") -> subprocess.CompletedProcess:
    env = dict(os.environ, SERIES_VENV=str(venv), FAKE_BASE=base)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bootstrap_venv.py")],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip


def _snapshot(venv) -> dict:
    """Every file in the venv: its modification time and content."""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in venv.rglob("*") if p.is_file()}


def test_each_stage_says_what_it_installs_before_pip_runs(fake_venv):
    proc = _bootstrap(fake_venv)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    first = next(n for n, line in enumerate(lines) if "pip install" in line)
    assert "venv series-stage1: installing the tooling's" in lines[first - 1]
    assert "--quiet" not in lines[first]
    assert (
        "venv series-stage2: base 0.33.0: installing its test requirements"
        " (requirements/common.txt, ruff==0.17.2) (pip's progress follows)" in lines[first:]
    )


def test_a_second_run_with_nothing_changed_writes_nothing_in_the_venv(fake_venv):
    assert _bootstrap(fake_venv).returncode == 0
    files = _snapshot(fake_venv)
    again = _bootstrap(fake_venv)
    assert again.returncode == 0, again.stderr
    assert _snapshot(fake_venv) == files
    assert "venv series-stage2: up to date" in again.stderr
    assert "pip install" not in again.stderr
    assert "materialising" not in again.stderr  # nothing is materialised


def test_a_moved_base_says_what_it_installs_and_why(fake_venv):
    assert _bootstrap(fake_venv, base="0.33.0").returncode == 0
    moved = _bootstrap(fake_venv, base="0.34.0")
    lines = moved.stderr.splitlines()
    said = lines.index("venv series-stage2: base moved from 0.33.0 to 0.34.0: installing its test"
                       " requirements (requirements/common.txt, ruff==0.17.2) (pip's progress"
                       " follows)")  # fmt: skip
    assert "pip install" in lines[said + 1]
    assert "venv series-stage2: up to date" in _bootstrap(fake_venv, base="0.34.0").stderr


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
