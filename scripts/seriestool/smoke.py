"""``smoke``: the series applied once (``work/smoke``), then, per patch, the first
test collected from the test files it adds (else changes): on CPU, in about a
minute.  Derived from the patches, it follows renames and reordering."""

from __future__ import annotations

import os
import shutil
import sys

from . import base as base_mod
from . import interrupts, patchset, seriestest
from . import manifest as manifest_mod
from .report import table


def smoke(manifest: manifest_mod.Manifest, patch_dir=manifest_mod.PATCH_DIR) -> int:
    repo, _commit, _sha = base_mod.materialise_pinned(manifest)
    checkout = base_mod.WORK_DIR / "smoke"
    shutil.rmtree(checkout, ignore_errors=True)
    base_mod.clone(repo, checkout)
    patches = manifest.patch_paths(patch_dir)
    patchset.am(checkout, patches)
    files = []  # per patch: the test files it adds, then those it changes
    for image in patchset.images(patches):
        tests = [p for p in image if seriestest.is_test_file(p) and (checkout / p).exists()]
        files.append(sorted(tests, key=lambda p: image[p][0] is not None))
    collect = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
               *sorted({f for fs in files for f in fs})]  # fmt: skip
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=str(checkout))
    listing = interrupts.run(collect, cwd=checkout, env=env, capture_output=True, text=True)
    first: dict[str, str] = {}
    for line in listing.stdout.splitlines():
        first.setdefault(line.split("::", 1)[0], line.strip())
    chosen = [next((first[f] for f in fs if f in first), None) for fs in files]
    rows = [
        (p.name[:48], node or "no test collected") for p, node in zip(patches, chosen, strict=True)
    ]
    print(table(("patch", "smoke test"), rows))
    if None in chosen:
        print(listing.stdout + listing.stderr)
        return 1
    rc, summary, _failed = seriestest.run_pytest(checkout, sorted(set(chosen)), {})
    return rc


def register(subparsers) -> None:
    p = subparsers.add_parser("smoke", help="one fast test per patch, on CPU")
    p.set_defaults(func=lambda _args: smoke(manifest_mod.load()))
