"""Commands the tool prints for the user to run, quoted to paste into a shell.

Every printed command names the tooling folder (``make -C``) or the
repository (``git -C``), so it works from wherever it is pasted, and quotes
each value (a path with spaces stays one word).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .manifest import ROOT


def make(target: str, **variables: str | None) -> str:
    """``make -C <tooling> target VAR=value ...``; variables without a value are left out."""
    words = [f"{key}={shlex.quote(str(value))}" for key, value in variables.items() if value]
    return " ".join(["make", "-C", shlex.quote(str(ROOT)), target, *words])


def git(repo: Path | str, *args: str) -> str:
    """``git -C <repo> args...``."""
    return " ".join(["git", "-C", shlex.quote(str(repo)), *(shlex.quote(a) for a in args)])
