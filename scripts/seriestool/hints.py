"""Commands the tool prints, quoted to paste into a shell from any folder
(``make -C``, ``git -C``).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .manifest import PATCH_DIR, ROOT


def make(target: str, **variables: str | None) -> str:
    """``make -C <tooling> target VAR=value ...``; variables without a value are left out."""
    words = [f"{key}={shlex.quote(str(value))}" for key, value in variables.items() if value]
    return " ".join(["make", "-C", shlex.quote(str(ROOT)), target, *words])


# How to end a rebase session that keeps a conflict.
REBASE_OPEN = (f"finish it with\n    {make('rebase', CONTINUE='1')}\nor undo it with\n"
               f"    {make('rebase', ABORT='1')}")  # fmt: skip


def patches_var(patch_dir: Path | str) -> str | None:
    """``PATCHES=`` for a printed make command: only for another folder than ``patches/``."""
    return None if Path(patch_dir).resolve() == PATCH_DIR.resolve() else str(patch_dir)


def rebase_into_copy(patch_dir: Path, **variables: str) -> str:
    """``make rebase`` writing into a fresh copy of ``patch_dir`` (a new folder
    each time: copying into an older copy would merge the two)."""
    return (f'copy=$(mktemp -d) && cp -r {shlex.quote(f"{patch_dir}/.")} "$copy" && '
            f'{make("rebase", **variables)} PATCHES="$copy"')  # fmt: skip


def git(repo: Path | str, *args: str) -> str:
    """``git -C <repo> args...``."""
    return " ".join(["git", "-C", shlex.quote(str(repo)), *(shlex.quote(a) for a in args)])


def user_path(value: str) -> Path:
    """A path the user gave (``VLLM=``), a leading ``~`` expanded: make passes
    the value quoted, so no shell expanded it."""
    return Path(os.path.expanduser(value))


def no_checkout(path: Path, what: str = "a git checkout") -> str:
    """Says that ``path`` is not ``what``, naming a relative path with its
    absolute one too (make runs in the tooling folder: a relative ``VLLM=``
    is taken from there, not from where make was started with ``-C``)."""
    path = Path(path)
    shown = str(path) if path.is_absolute() else f"{path} (that is {path.resolve()})"
    return f"{shown} does not exist" if not os.path.lexists(path) else f"{shown} is not {what}"
