#!/usr/bin/env python3
"""Create or update the dev environment ``.venv`` idempotently (``make venv``).

Stage 1 installs the ``dev`` dependency group of pyproject.toml: enough to fetch
the vLLM sdist (torch, setuptools-rust, setuptools-scm) and run the tooling
tests.  Stage 2 installs what the vLLM-side tests need, read from the
materialised base: its ``requirements/common.txt`` and ruff at the version its
``.pre-commit-config.yaml`` pins.  Each stage's stamp in the venv records a hash
of its inputs, then the inputs; a stage whose inputs did not change is skipped
and writes nothing, and stage 2 says when the base moved since it last ran.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SERIES_VENV", ROOT / ".venv"))
PY = VENV / "bin" / "python"


def recorded(stamp_name: str) -> str:
    """The stage's stamp: the hash of its inputs, then the inputs ("" before it ran)."""
    stamp = VENV / stamp_name
    return stamp.read_text() if stamp.exists() else ""


def pip_install(args: list[str], stamp_name: str, inputs: str, what: str) -> None:
    digest = hashlib.sha256((sys.version + inputs).encode()).hexdigest()
    if recorded(stamp_name).partition("\n")[0] == digest:
        print(f"venv {stamp_name}: up to date", file=sys.stderr)
        return
    # Progress goes to stderr: targets such as `make check JSON=1` keep a
    # clean stdout.  pip names each package as it goes (minutes the first time).
    print(f"venv {stamp_name}: {what} (pip's progress follows)", file=sys.stderr)
    _run([str(PY), "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check",
          "--no-color", *args])  # fmt: skip
    (VENV / stamp_name).write_text(f"{digest}\n{inputs}")


def stage2_what(requirements: str, before: str) -> str:
    """What stage 2 installs, and why: the base's version heads its requirements
    (``# vllm 0.34.0: ...``), now and at the last install (``before``, its stamp)."""
    now, was = (re.search(r"^# \S+ (\S+):", text, re.M) for text in (requirements, before))
    what = f"installing its test requirements (requirements/common.txt, {requirements.split()[-1]})"
    if was and was[1] != now[1]:
        return f"base moved from {was[1]} to {now[1]}: {what}"
    return f"base {now[1]}: {what}"


def _run(cmd: list[str], **kwargs) -> None:
    """Run a step; a failure ends the bootstrap with one line (its own output above)."""
    if subprocess.run(cmd, stdout=sys.stderr, check=False, **kwargs).returncode:
        sys.exit(f"error: `{' '.join(cmd[:4])} ...` failed (its messages are above); fix that"
                 " and run `make venv` again")  # fmt: skip


def main() -> int:
    if os.path.lexists(PY) and not PY.exists():
        sys.exit(f"error: {PY} points at {os.readlink(PY)}, which no longer exists (the Python"
                 f" {VENV} was made with has moved or gone): remove it (`rm -rf {VENV}`) and"
                 " run `make venv` again")  # fmt: skip
    if not PY.exists():
        print(f"creating {VENV}", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    what = f"installing the tooling's {len(dev)} packages"
    pip_install(dev, "series-stage1", "\n".join(dev), what)

    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    with tempfile.TemporaryDirectory(prefix="series-venv-") as tmp:  # nothing written in the venv
        req = Path(tmp) / "requirements.txt"
        _run([str(PY), "-m", "seriestool", "base", "--requirements", str(req)], env=env)
        text = req.read_text()
        pip_install(["-r", str(req)], "series-stage2", text,
                    stage2_what(text, recorded("series-stage2")))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
