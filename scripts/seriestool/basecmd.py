"""``base``: materialise the pinned vLLM base (cached) and print where it is;
``--requirements FILE`` writes what the vLLM-side tests need from it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import git as g
from . import manifest as manifest_mod
from .apply import ensure_default_checkout
from .base import BASE_BRANCH, materialise_pinned
from .errors import SeriesError


def ruff_pin(pre_commit_config: str) -> str:
    """``ruff==X`` from the ruff-pre-commit hook's ``rev: vX`` line, or from the
    ``# frozen: vX`` comment of a rev frozen to a commit (else SeriesError)."""
    match = re.search(
        r"ruff-pre-commit\s*\n\s*rev:\s*(?:[0-9a-f]{40}\s*#\s*frozen:\s*)?v?([0-9][^\s]*)",
        pre_commit_config,
    )
    if not match:
        raise SeriesError("the base's .pre-commit-config.yaml pins no ruff version")
    return f"ruff=={match.group(1)}"


def run(args: argparse.Namespace) -> int:
    manifest = manifest_mod.load()
    b = manifest.base
    if args.requirements:  # `make venv`, for every target: the base alone, no work/vllm
        repo, _commit, _sha = materialise_pinned(manifest)
        print(f"pinned base {b.project} {b.version}: commit {b.commit}")
        common = g.out(repo, "show", f"{BASE_BRANCH}:requirements/common.txt")
        pre_commit = g.out(repo, "show", f"{BASE_BRANCH}:.pre-commit-config.yaml")
        # Headed by the base (``# vllm 0.33.0: ...``): `make venv` reports when it changes.
        header = f"# {b.project} {b.version}: requirements/common.txt and its ruff pin"
        Path(args.requirements).write_text(f"{header}\n{common}\n{ruff_pin(pre_commit)}\n")
        return 0
    checkout = ensure_default_checkout(manifest)
    print(f"pinned base {b.project} {b.version}: commit {b.commit}; checkout {checkout}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("base", help="materialise the pinned base from its sdist")
    p.add_argument("--requirements", help="also write the vLLM test requirements here")
    p.set_defaults(func=run)
