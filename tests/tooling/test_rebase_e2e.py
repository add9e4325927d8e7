"""scripts/rebase_e2e.py: what it hands the `make` commands it runs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import rebase_e2e  # noqa: E402


def rebase_dry_run(env: dict[str, str]) -> str:
    """What `make rebase TO=0.32.0 KEEP=1` would run, in *env*."""
    return subprocess.run(
        ["make", "-n", "-s", "-o", "venv", "-C", str(ROOT), "rebase", "TO=0.32.0", "KEEP=1"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_make_variables_stay_with_the_outer_make(tmp_path):
    """`make test-rebase-e2e ARGS=--record VLLM=...` exports both to the
    script; its `make rebase` gets only what the script passes, so `--record`
    is not handed on to `seriestool rebase`."""
    outer = {
        **os.environ,
        "ARGS": "--record",
        "VLLM": "/elsewhere",
        "MAKEFLAGS": " -- ARGS=--record VLLM=/elsewhere",
    }
    env = rebase_e2e.make_env(outer, tmp_path)
    assert env["SERIES_WORK_DIR"] == str(tmp_path)
    recipe = rebase_dry_run(env)
    assert '--to "$TO"' in recipe and "--keep-conflict" in recipe
    assert "--record" not in recipe and "/elsewhere" not in recipe
    # The same command with the outer environment: what went wrong before.
    assert "--record" in rebase_dry_run({**outer, "SERIES_WORK_DIR": str(tmp_path)})
