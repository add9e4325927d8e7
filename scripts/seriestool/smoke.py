"""``smoke``: the series applied once (``work/smoke``), then, per patch, one test
of its own: the first collected test function the patch adds (else the first
from the test files it adds, else changes) that no earlier patch took; on
CPU, in about a minute.  Derived from the patches, it follows renames and
reordering; a patch with no test of its own says whose it shares."""

from __future__ import annotations

import re
import shutil

from . import base as base_mod
from . import interrupts, patchset, seriestest
from . import manifest as manifest_mod
from .report import table


def smoke(manifest: manifest_mod.Manifest) -> int:
    repo, _commit, _sha = base_mod.materialise_pinned(manifest)
    checkout = base_mod.WORK_DIR / "smoke"
    shutil.rmtree(checkout, ignore_errors=True)
    base_mod.clone(repo, checkout)
    patches = manifest.patch_paths()
    patchset.am(checkout, patches)
    files = []  # per patch: the test files it adds, then those it changes
    for image in patchset.images(patches):
        tests = [p for p in image if seriestest.is_test_file(p) and (checkout / p).exists()]
        files.append(sorted(tests, key=lambda p: image[p][0] is not None))
    collect, env = seriestest.pytest_command(checkout, "-q", "--collect-only",
                                             *sorted({f for fs in files for f in fs}))  # fmt: skip
    listing = interrupts.run(collect, cwd=checkout, env=env, capture_output=True, text=True)
    nodes: dict[str, list[str]] = {}
    for line in listing.stdout.splitlines():
        if "::" in line:
            nodes.setdefault(line.split("::", 1)[0], []).append(line.strip())
    chosen = pick(patches, files, nodes)
    rows = []
    for n, (patch, node) in enumerate(zip(patches, chosen, strict=True)):
        first = chosen.index(node)  # the first patch this test was chosen for
        shared = f" (shared with {patches[first].name[:4]}: the patch adds no test of its own)"
        why = shared if first < n else ""
        rows.append((patch.name[:48], (node or "no test collected") + why))
    print(table(("patch", "smoke test"), rows))
    if None in chosen:
        print(listing.stdout + listing.stderr)
        return 1
    return seriestest.run_pytest(checkout, sorted(set(chosen)), {})[0]


def pick(patches, files: list[list[str]], nodes: dict[str, list[str]]) -> list[str | None]:
    """Per patch, its smoke test among the ``nodes`` collected from its test
    ``files``: one it adds (``+def test_...``) before any other, one no
    earlier patch took before one that is shared."""
    chosen: list[str | None] = []
    for patch, fs in zip(patches, files, strict=True):
        added = set(re.findall(r"^\+\s*(?:async\s+)?def (test_\w+)",
                               patch.read_text(errors="replace"), re.M))  # fmt: skip
        pool = [n for f in fs for n in nodes.get(f, [])]
        fresh = [n for n in pool if n not in chosen]
        own = [n for n in fresh if n.rsplit("::", 1)[-1].split("[")[0] in added]
        chosen.append((own or fresh or pool or [None])[0])
    return chosen


def register(subparsers) -> None:
    p = subparsers.add_parser("smoke", help="one fast test per patch, on CPU")
    p.set_defaults(func=lambda _args: smoke(manifest_mod.load()))
