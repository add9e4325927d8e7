"""``check-manifest``: the patch files, ``patches/series.json`` and SERIES.md
agree.  Runs with the system Python alone.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from . import base as base_mod
from . import git as g
from . import hints, patchset, seriesdoc
from . import manifest as manifest_mod
from .errors import SeriesError

# The constant of the patched loader that names the series in its log line.
SERIES_CONSTANT = "INSTANTTENSOR_LOADER_SERIES"


def problems(
    manifest: manifest_mod.Manifest, patch_dir: Path = manifest_mod.PATCH_DIR
) -> list[str]:
    """Every disagreement between ``patch_dir`` and ``manifest`` (empty: consistent)."""
    found = manifest_mod.previous_problems(manifest)
    listed = [p.file for p in manifest.patches]
    on_disk = sorted(p.name for p in patch_dir.glob("*.patch"))
    for name in sorted(set(on_disk) - set(listed)):
        found.append(f"{name}: patch file is not listed in the manifest")
    for name in listed:
        if name not in on_disk:
            found.append(f"{name}: listed in the manifest but the file is missing")
    if sorted(listed) != listed:
        found.append("manifest lists patches out of file-name order: " + ", ".join(listed))
    touched: set[str] = set()
    for entry in manifest.patches:
        path = patch_dir / entry.file
        if not path.exists():
            continue
        actual = patchset.patch_id_of_file(path)
        sha256 = patchset.sha256_of_file(path)
        if actual != entry.patch_id:
            found.append(
                f"{entry.file}: stable patch ID {actual} but the manifest records"
                f" {entry.patch_id}; the patch changed: re-export it (`{hints.make('export')}`)"
            )
        elif not entry.sha256:
            found.append(
                f"{entry.file}: the manifest records no sha256 of its bytes (it was written"
                f" before patch files were pinned): re-export the series (`{hints.make('export')}`)"
            )
        elif sha256 != entry.sha256:
            found.append(
                f"{entry.file}: sha256 {sha256} but the manifest records"
                f" {entry.sha256}; its bytes changed (its author, message or hunk"
                " line numbers: what the stable patch ID ignores): restore the file, or"
                f" re-export the series (`{hints.make('export')}`) if the change is intended"
            )
        subject = patchset.subject_of_file(path)
        if subject != entry.subject:
            found.append(f"{entry.file}: subject {subject!r}, manifest {entry.subject!r}")
        touched.update(patchset.files_touched(patch_dir, path))
    # The loader's log line names the series: the constant a patch adds must
    # be the manifest's name and version, so a server log and the wheel say which.
    label = f'{SERIES_CONSTANT} = "{manifest.name} v{manifest.version}"'
    for entry in manifest.patches:
        path = patch_dir / entry.file
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        for line in lines:
            if line.startswith(f"+{SERIES_CONSTANT} = ") and line[1:] != label:
                found.append(f"{entry.file} sets {line[1:]}, the manifest says {label}: make"
                             " them agree (the patch, or series.version)")  # fmt: skip
    # The base must be what `make base` rebuilds: the project's series pins an
    # sdist, whose recorded upstream commit (where `make base` cached it) is its own.
    b = manifest.base
    if patch_dir.resolve() == manifest_mod.PATCH_DIR.resolve() and not (
        b.sdist.filename and b.sdist.sha256
    ):
        found.append(
            "the base pins no sdist (file name and sha256), so `make base` cannot rebuild it;"
            f" rebase onto a release (`{hints.make('rebase', TO='<version>')}`)"
        )
    recorded = base_mod.cached_upstream_commit(b.project, b.version, b.sdist.sha256)
    if recorded is not None and recorded != b.upstream_commit:
        found.append(
            f"base.upstream_commit is {b.upstream_commit!r}, but the sdist {b.sdist.filename}"
            f" records {recorded!r}: the base `make base` rebuilds is another commit"
        )
    if touched != set(b.touched_files):
        extra = ", ".join(sorted(touched - set(b.touched_files))) or "-"
        stale = ", ".join(sorted(set(b.touched_files) - touched)) or "-"
        found.append(
            f"touched files disagree with the manifest: unrecorded {extra}; recorded but"
            f" untouched {stale}; re-export (`{hints.make('export')}`)"
        )
    return found


def refuse(manifest: manifest_mod.Manifest, patch_dir: Path, head: str, tail: str) -> None:
    """Raise ``head``, each of ``problems`` on a line, then ``tail``, if there are any."""
    if found := problems(manifest, patch_dir):
        raise SeriesError(f"{head}:\n  " + "\n  ".join(found) + tail)


def fix_series(patch_dir: Path) -> str:
    """What to do about patch files that disagree with their manifest, for
    ``patch_dir`` itself: its own commands (never the project's ``patches/``
    for another folder); the edits are stashed, not discarded, and only where
    git tracks them."""
    patches = hints.patches_var(patch_dir)
    where = f"`{hints.make('check-manifest', PATCHES=patches)}` shows the differences; "
    if g.is_repo(Path(patch_dir)) and g.out(Path(patch_dir), "ls-files", "--", "series.json"):
        where += (f"set the edits aside (`{hints.git(patch_dir, 'stash', 'push', '--', '.')}` keeps"
                  " them in the stash), or, ")  # fmt: skip
    return (
        where + "if the change is intended, export the branch it comes from again"
        f" (`{hints.make('export', PATCHES=patches)}`)"
    )


# The reviewer's document's tables the manifest must agree with: section
# title -> (what the second column holds, the manifest field it must equal).
_DOC_TABLES = {
    "Stable patch IDs": ("stable patch ID", "patch_id"),
    "Order and why": ("subject", "subject"),
}


def doc_problems(manifest: manifest_mod.Manifest, doc: Path) -> list[str]:
    """Where ``doc`` (SERIES.md) disagrees with ``manifest``: its stable patch
    IDs and the subjects of its order table, per patch number."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    patches = {entry.file[:4]: entry for entry in manifest.patches}
    found = []
    for title, (what, field) in _DOC_TABLES.items():
        span = seriesdoc.section(lines, title)
        if span is None:
            found.append(f"{doc.name}: no section '## {title}'")
            continue
        rows = {m[1]: m[2] for line in lines[span[0] : span[1]] if (m := seriesdoc.ROW.match(line))}
        for number, entry in patches.items():
            recorded = getattr(entry, field)
            if number not in rows:
                found.append(
                    f"{doc.name}: '{title}' has no row for {entry.file}"
                    f" (manifest {what} {recorded!r})"
                )
            elif rows[number] != recorded:
                found.append(
                    f"{doc.name}: '{title}' gives {entry.file} the {what} {rows[number]!r},"
                    f" the manifest {recorded!r}"
                )
        for number in sorted(set(rows) - set(patches)):
            found.append(f"{doc.name}: '{title}' lists patch {number}, which the manifest has not")
    return found


# The documents that may cite GPU runs, and what a citation of one looks like:
# ``qualification/<run>/...`` or ``<run>/...`` for a folder of qualification/.
CITING_DOCS = ("README.md", seriesdoc.DOC_NAME)
_CITED = re.compile(r"(?<![\w.\-/])(?:qualification/)?(\w[\w.\-]*)/([\w.\-/]*)")


def cited_run_problems(manifest: manifest_mod.Manifest, root: Path) -> list[str]:
    """GPU runs that ``root``'s README.md or SERIES.md cite (a folder of
    ``qualification/`` whose ``qualification.json`` records the bundle's patch
    IDs) measured on patch IDs other than the manifest's."""
    qual = root / "qualification"
    want = {entry.file[:4]: entry.patch_id for entry in manifest.patches}
    found = []
    for name in CITING_DOCS:
        doc = root / name
        if not doc.is_file():
            continue
        cited = set()
        for top, rest in _CITED.findall(doc.read_text(encoding="utf-8")):
            if not (qual / top).is_dir() or top in cited:
                continue
            where = qual / top / rest
            while not where.exists():
                where = where.parent
            folder = where if where.is_dir() else where.parent
            for path in sorted(folder.rglob("qualification.json")):
                patches = json.loads(path.read_text(encoding="utf-8"))["bundle"]["patches"]
                if patches and [p["patch_id"] for p in patches] != list(want.values()):
                    cited.add(top)
                    rel = path.parent.relative_to(root)
                    got = {p["file"][:4]: p["patch_id"] for p in patches}
                    differ = sorted(n for n in {*got, *want} if got.get(n) != want.get(n))
                    found.append(
                        f"{name} cites {rel}/, a GPU run of other patch IDs than"
                        f" patches/series.json (differ: {', '.join(differ) or 'the order'}):"
                        " cite a run of the shipped patches"
                    )
                    break
    return found


def run(args: argparse.Namespace) -> int:
    manifest_path = Path(args.manifest) if args.manifest else manifest_mod.MANIFEST_PATH
    patch_dir = Path(args.patches_dir) if args.patches_dir else manifest_path.parent
    manifest = manifest_mod.load(manifest_path)
    found = problems(manifest, patch_dir) + manifest_mod.group_problems(manifest)
    doc = patch_dir.resolve().parent / seriesdoc.DOC_NAME
    if doc.is_file():
        found += doc_problems(manifest, doc)
        found += cited_run_problems(manifest, doc.parent)
    for line in found:
        print(f"error: {line}")
    b = manifest.base
    if base_mod.cached_upstream_commit(b.project, b.version, b.sdist.sha256) is None:
        print(f"note: base.upstream_commit not checked against {b.sdist.filename or 'an sdist'}:"
              f" its base is not cached (`{hints.make('base')}` makes it)")  # fmt: skip
    if not found:
        agree = f"IDs and files agree{' with ' + doc.name if doc.is_file() else ''}"
        print(f"manifest ok: {len(manifest.patches)} patches, {agree}")
    return 1 if found else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("check-manifest", help="patch files and manifest agree")
    p.add_argument("--manifest", help="manifest file (default: patches/series.json)")
    p.add_argument("--patches-dir", help="patch folder (default: the manifest's folder)")
    p.set_defaults(func=run)
