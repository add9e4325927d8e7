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


# Runs `python -m seriestool`, with a Ctrl-C arriving while a command module
# is imported (the keyboard's SIGINT, sent by the process to itself).
_CTRL_C_ON_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "seriestool.rebase":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["seriestool", "--help"]
runpy.run_module("seriestool", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_importing_ends_with_one_line_and_130():
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_ON_IMPORT],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == "error: interrupted by SIGINT\n"
    assert proc.returncode == 130


def test_a_missing_variable_is_named_as_the_user_types_it(make_repo, capsys):
    """`make pr` without GROUP=, `make compare` without FROM=: the variable and
    what it takes (the groups, the versions), never an option of the tool."""
    from seriestool.cli import main

    repo = make_repo("vllm")
    assert main(["pr", "--vllm", str(repo.path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: GROUP= names the group to propose; the groups:\n  ")
    assert "''" not in err and "--group" not in err
    assert main(["compare"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: FROM= names the older side, e.g. `make -C ")
    assert "versions in its history, newest first: " in err and "--from" not in err
