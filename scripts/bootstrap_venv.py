#!/usr/bin/env python3
"""Create or update the dev environment ``.venv`` idempotently (``make venv``).

Stage 1 installs the ``dev`` dependency group of pyproject.toml: enough to fetch
the vLLM sdist (torch, setuptools-rust, setuptools-scm) and run the tooling
tests.  Stage 2 installs what the vLLM-side tests need, read from the
materialised base: its ``requirements/common.txt`` and ruff at the version its
``.pre-commit-config.yaml`` pins.  Each stage records a hash of its inputs in
the venv and is skipped when nothing changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SERIES_VENV", ROOT / ".venv"))
PY = VENV / "bin" / "python"


def pip_install(args: list[str], stamp_name: str, inputs: str, what: str) -> None:
    stamp = VENV / stamp_name
    digest = hashlib.sha256((sys.version + inputs).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        print(f"venv {stamp_name}: up to date", file=sys.stderr)
        return
    # Progress goes to stderr: targets such as `make check JSON=1` keep a
    # clean stdout.  pip names each package as it goes (minutes the first time).
    print(f"venv {stamp_name}: installing {what} (pip's progress follows)", file=sys.stderr)
    _run([str(PY), "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check",
          "--no-color", *args])  # fmt: skip
    stamp.write_text(digest)


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
    pip_install(dev, "series-stage1", "\n".join(dev), f"the tooling's {len(dev)} packages")

    req = VENV / "series-stage2-requirements.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    print("venv: materialising the pinned vLLM base for its test requirements", file=sys.stderr)
    _run([str(PY), "-m", "seriestool", "base", "--requirements", str(req)], env=env)
    pip_install(["-r", str(req)], "series-stage2", req.read_text(), "what vLLM's tests need")
    return 0


if __name__ == "__main__":
    sys.exit(main())
