"""Commands the tool prints for the user to run, quoted to paste into a shell.

Every printed command names the tooling folder (``make -C``) or the
repository (``git -C``), so it works from wherever it is pasted, and quotes
each value (a path with spaces stays one word).
"""

from __future__ import annotations

import os
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


def user_path(value: str) -> Path:
    """A path the user gave (``VLLM=``), a leading ``~`` expanded: make passes
    the value quoted, so no shell expanded it."""
    return Path(os.path.expanduser(value))


def no_checkout(path: Path) -> str:
    """Says that ``path`` is no git checkout, naming a relative path with its
    absolute one too (make runs in the tooling folder: a relative ``VLLM=``
    is taken from there, not from where make was started with ``-C``)."""
    path = Path(path)
    shown = str(path) if path.is_absolute() else f"{path} (that is {path.resolve()})"
    return (
        f"{shown} does not exist" if not os.path.lexists(path) else f"{shown} is not a git checkout"
    )
