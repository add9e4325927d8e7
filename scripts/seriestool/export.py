"""``export``: write a branch of a vLLM checkout back into ``patches/``.

Reproducible: exporting an unchanged branch gives byte-identical files.
``git format-patch`` is run with ``--zero-commit`` (the ``From`` line carries
no commit id, which changes with every rebase), ``--no-signature`` (no git
version footer), ``--full-index`` (full blob ids on ``index`` lines, so
``git am -3`` can always fall back to a 3-way merge), ``--no-numbered``
(adding a patch does not rewrite every other file) and pinned diff settings
(see ``git._PINNED_CONFIG``).  Export also refreshes the manifest: the patch
list, subjects, stable patch IDs and the base blob id of every touched file.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from . import git as g
from . import manifest as manifest_mod
from . import patchset
from .apply import default_checkout
from .errors import SeriesError


def format_patches(repo: Path, base: str, tip: str, out_dir: Path) -> list[Path]:
    """``git format-patch`` ``base..tip`` into ``out_dir``; returns the files in order.

    Raises:
        SeriesError: the range holds a merge commit (a series is linear).
    """
    merges = g.out(repo, "rev-list", "--merges", f"{base}..{tip}")
    if merges:
        raise SeriesError(
            f"{base}..{tip} contains merge commits ({merges.split()[0][:12]}...);"
            " a series must be linear: rebase the branch onto the base first"
        )
    listing = g.out(
        repo, "format-patch", "--zero-commit", "--no-signature", "--full-index",
        "--no-numbered", "--no-cover-letter", "--no-thread", "--encode-email-headers",
        "-o", str(out_dir), f"{base}..{tip}",
    )  # fmt: skip
    return [Path(line) for line in listing.splitlines() if line]


def refresh_manifest(
    manifest: manifest_mod.Manifest, repo: Path, base: str, patch_files: list[Path]
) -> manifest_mod.Manifest:
    """Manifest with patch list, subjects, patch IDs and touched-file blobs of ``base``."""
    manifest.patches = [
        manifest_mod.PatchEntry(
            file=p.name,
            subject=patchset.subject_of_file(p),
            patch_id=patchset.patch_id_of_file(p),
        )
        for p in patch_files
    ]
    touched = sorted({path for p in patch_files for path in patchset.files_touched(repo, p)})
    manifest.base.touched_files = g.blob_ids(repo, base, touched)
    return manifest


def resolve_base(repo: Path, manifest: manifest_mod.Manifest, base: str | None) -> str:
    """The base commit in ``repo``: given, the materialised one, or upstream's."""
    candidates = [base] if base else [manifest.base.commit, manifest.base.upstream_commit]
    for ref in candidates:
        if ref and (commit := g.rev(repo, ref)):
            return commit
    raise SeriesError(
        f"cannot find the base in {repo} (tried {', '.join(c for c in candidates if c)});"
        " pass BASE=<commit the series is based on>"
    )


def export_series(
    repo: Path,
    manifest: manifest_mod.Manifest,
    branch: str,
    base: str | None = None,
    patch_dir: Path = manifest_mod.PATCH_DIR,
    manifest_path: Path = manifest_mod.MANIFEST_PATH,
    log=print,
) -> list[Path]:
    """Export ``base..branch`` of ``repo`` into ``patch_dir`` and refresh the manifest.

    Files are formatted into a temporary folder first; ``patch_dir`` is only
    changed once everything succeeded.

    Raises:
        SeriesError: unknown branch or base, or a merge in the range.
    """
    if not g.rev(repo, branch):
        raise SeriesError(f"{repo} has no branch or commit {branch!r}; pass BRANCH=<name>")
    base_commit = resolve_base(repo, manifest, base)
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        files = format_patches(repo, base_commit, branch, Path(tmp))
        refresh_manifest(manifest, repo, base_commit, files)
        patch_dir.mkdir(parents=True, exist_ok=True)
        for old in patch_dir.glob("*.patch"):
            old.unlink()
        for f in files:
            shutil.copyfile(f, patch_dir / f.name)
    manifest.save(manifest_path)
    log(f"exported {len(files)} patches from {branch} ({base_commit[:12]}..) to {patch_dir}")
    return [patch_dir / f.name for f in files]


def run(args: argparse.Namespace) -> int:
    manifest = manifest_mod.load()
    repo = g.toplevel(Path(args.vllm)) if args.vllm else default_checkout()
    if not repo.exists():
        raise SeriesError(f"{repo} does not exist; run `make apply` first or pass VLLM=")
    export_series(repo, manifest, args.branch or manifest.branch_name, args.base)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a branch back into patches/")
    p.add_argument("--vllm", help="vLLM checkout (default: work/vllm from make apply)")
    p.add_argument("--branch", help="branch to export (default: the series branch)")
    p.add_argument("--base", help="commit the branch is based on (default: pinned base)")
    p.set_defaults(func=run)
