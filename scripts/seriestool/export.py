"""``export``: write a branch of a vLLM checkout back into ``patches/``,
reproducibly (``FORMAT_PATCH``, in a ``scratch.view``), refreshing the
manifest (docs/checkout-safety.md: "What make export refuses").
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import git as g
from . import hints, interrupts, patchset, scratch, seriesdoc
from . import manifest as manifest_mod
from .apply import SERIES_BASE_KEY, default_checkout
from .errors import SeriesError

# format-patch's options, each pinning what a format.* setting would change.
FORMAT_PATCH = (
    "format-patch", "--zero-commit", "--no-signature", "--full-index", "--no-renames",
    "--no-numbered", "--no-cover-letter", "--no-thread", "--encode-email-headers",
    "--subject-prefix=PATCH", "--filename-max-length=64", "--suffix=.patch", "--no-from",
    "--no-to", "--no-cc", "--no-attach", "--no-signoff", "--no-base", "--no-notes",
    "-O/dev/null", "--no-color", "--no-ext-diff", "--no-textconv",
    # The series was first exported with an empty extra header line after the
    # subject; kept, so every exported patch stays byte-identical to it.
    "--no-add-header", "--add-header=",
)  # fmt: skip


def format_patches(repo: Path, base: str, tip: str, out_dir: Path) -> list[Path]:
    """``git format-patch`` ``base..tip`` (linear) into ``out_dir``; returns the files."""
    base, tip = (g.out(repo, "rev-parse", "--verify", f"{ref}^{{commit}}") for ref in (base, tip))
    with scratch.view(repo) as view:
        merges = g.out(view, "rev-list", "--merges", f"{base}..{tip}")
        if merges:
            raise SeriesError(
                f"{base[:12]}..{tip[:12]} contains merge commits ({merges.split()[0][:12]}...);"
                " a series must be linear: rebase the branch onto the base first"
            )
        listing = g.out(view, *FORMAT_PATCH, "-o", str(out_dir), f"{base}..{tip}")
        files = [Path(line) for line in listing.splitlines() if line]
        commits = g.out(view, "rev-list", "--reverse", f"{base}..{tip}").split()
        for commit, patch in zip(commits, files, strict=True):
            _check_message_survives_am(view, commit, patch)
    return files


def _check_message_survives_am(repo: Path, commit: str, patch: Path) -> None:
    """Refuse an empty commit (git am stops at it), or one whose subject or body
    ``git mailinfo`` (what ``git am`` reads a patch with) would not give back."""
    what = f"commit {commit[:12]} ({patch.name})"
    trees = g.out(repo, "rev-parse", f"{commit}^{{tree}}", f"{commit}^^{{tree}}").split()
    if trees[0] == trees[1]:
        raise SeriesError(
            f"{what} is empty: it changes no file, and git am stops at an empty patch;"
            " drop it from the branch (e.g. with `git rebase -i`) and export again"
        )
    raw, body = g.out(repo, "log", "-1", "--no-notes", "--format=%B%x00%b", commit).split("\0")
    subject = " ".join(raw.rstrip("\n").split("\n\n", 1)[0].split("\n"))
    with tempfile.TemporaryDirectory(prefix="mailinfo-") as tmp:
        msg, rest = Path(tmp) / "msg", Path(tmp) / "patch"
        info = g.out(repo, "mailinfo", "-b", "--no-scissors", str(msg),
                     str(rest), input=patch.read_bytes())  # fmt: skip
        parsed = g.decode(msg.read_bytes()).strip()
    found = re.search(r"(?m)^Subject: (.*)$", info)
    parsed_subject = found[1] if found else ""
    if parsed_subject != subject:
        raise SeriesError(
            f"the subject of {what} would be rewritten by git am: {subject!r} becomes"
            f" {parsed_subject!r} (git am drops a leading `Re:` and `[PATCH ...]` tags, and"
            " whitespace around the subject); reword the commit (e.g. `git commit --amend`,"
            " or `reword` in `git rebase -i`) to a subject git am keeps, and export again"
        )
    if parsed != (body := body.strip()):
        cut = body[len(parsed) :].strip().splitlines()[:1] if body.startswith(parsed) else []
        where = f" at the line {cut[0]!r}" if cut else ""
        start = next((k for k in ("diff -", "Index: ", "---") if cut and cut[0].startswith(k)), "")
        ends = "the end of" if start == "---" else "the start of the patch and ends"
        why = (f"git am takes a line starting `{start}` as {ends} the message there; reword or"
               " indent that line" if start else "git am would not reproduce the message;"
               " reword it")  # fmt: skip
        raise SeriesError(
            f"the message of {what} would be cut by git am{where}: {why} and export again"
        )


def refresh_manifest(
    manifest: manifest_mod.Manifest,
    repo: Path,
    base: str,
    patch_files: list[Path],
    log: Callable[[str], object] = print,
) -> manifest_mod.Manifest:
    """Manifest with patch list, subjects, patch IDs and touched-file blobs of ``base``
    (``previous`` and the groups kept, following a reworded patch by its patch
    ID, but for subjects no patch has any more and groups left empty)."""
    old = {p.patch_id: p.subject for p in manifest.patches}
    manifest.patches = [
        manifest_mod.PatchEntry(
            file=p.name,
            subject=patchset.subject_of_file(p),
            patch_id=patchset.patch_id_of_file(p),
            sha256=patchset.sha256_of_file(p),
        )
        for p in patch_files
    ]
    touched = sorted({path for p in patch_files for path in patchset.files_touched(repo, p)})
    manifest.base.touched_files = g.blob_ids(repo, base, touched)
    renamed = {old[p.patch_id]: p.subject for p in manifest.patches
               if old.get(p.patch_id, p.subject) != p.subject}  # fmt: skip
    for note in manifest.prune_departed(renamed):
        log(f"note: {note}")
    return manifest


def resolve_base(
    repo: Path, manifest: manifest_mod.Manifest, base: str | None, branch: str | None = None
) -> str:
    """The base commit in ``repo``: given; where ``apply`` started ``branch``
    (``branch.<name>.seriesBase``); the materialised base; or upstream's."""
    recorded = g.branch_config(repo, branch, SERIES_BASE_KEY)
    candidates = [base] if base else [recorded, manifest.base.commit, manifest.base.upstream_commit]
    for ref in candidates:
        if ref and (commit := g.rev(repo, ref)):
            return commit
    raise SeriesError(
        f"cannot find the base in {repo} (tried {', '.join(c for c in candidates if c)});"
        " pass BASE=<commit the series is based on>"
    )


@interrupts.deferring
def export_series(repo: Path, manifest: manifest_mod.Manifest, branch: str,
                  base: str | None = None, patch_dir: Path = manifest_mod.PATCH_DIR,
                  manifest_path: Path = manifest_mod.MANIFEST_PATH, log=print, *,
                  guard: interrupts.Guard) -> list[Path]:  # fmt: skip
    """Export ``base..branch`` of ``repo`` into ``patch_dir`` and refresh the manifest;
    ``patch_dir`` changes only once everything succeeded."""
    if not g.rev(repo, branch):
        raise SeriesError(
            f"{repo} has no branch or commit {branch!r} (BRANCH=): name the series branch there"
        )
    base_commit = resolve_base(repo, manifest, base, branch)
    if not g.out(repo, "rev-list", "--max-count=1", f"{base_commit}..{branch}"):
        raise SeriesError(
            f"{branch} has no commits on top of the base {base_commit[:12]}: exporting it"
            " would delete the series; pass BRANCH=<the series branch> (and BASE=)"
        )
    if patch_dir.exists() and g.is_repo(patch_dir):  # never overwrite uncommitted changes
        status = g.out(patch_dir, "status", "--porcelain=v1", "--untracked-files=all", "--", ".")
        if status:
            stash = hints.git(patch_dir, "stash", "push", "--", ".")
            raise SeriesError(
                f"{patch_dir} has uncommitted changes that export would overwrite:\n  "
                + "\n  ".join(status.splitlines()[:10])
                + f"\ncommit them, or set them aside (`{stash}` keeps them in the stash),"
                " and run again"
            )
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        files = format_patches(repo, base_commit, branch, Path(tmp))
        refresh_manifest(manifest, repo, base_commit, files, log)
        interrupts.check()  # from here on, the write runs to its end
        patch_dir.mkdir(parents=True, exist_ok=True)
        for old in patch_dir.glob("*.patch"):
            old.unlink()
        for f in files:
            shutil.copyfile(f, patch_dir / f.name)
    manifest.save(manifest_path)
    seriesdoc.sync(manifest, patch_dir, log)
    log(f"exported {len(files)} patches from {branch} ({base_commit[:12]}..) to {patch_dir}")
    return [patch_dir / f.name for f in files]


def run(args: argparse.Namespace) -> int:
    patch_dir = Path(args.patches_dir) if args.patches_dir else manifest_mod.PATCH_DIR
    manifest_path = patch_dir / manifest_mod.MANIFEST_PATH.name
    manifest = manifest_mod.load(manifest_path)
    repo = g.checkout_top(args.vllm) if args.vllm else default_checkout()
    if not repo.exists():
        raise SeriesError(
            f"{repo} does not exist; run `{hints.make('apply')}` first, or name the checkout"
            " with VLLM="
        )
    export_series(repo, manifest, args.branch or manifest.branch_name, args.base, patch_dir,
                  manifest_path)  # fmt: skip
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a branch back into patches/")
    p.add_argument(
        "--vllm", type=hints.user_path, help="vLLM checkout (default: work/vllm from make apply)"
    )
    p.add_argument("--branch", help="branch to export (default: the series branch)")
    p.add_argument("--base", help="commit the branch is based on (default: pinned base)")
    p.add_argument(
        "--patches-dir", metavar="DIR", help="series folder to write, with its manifest"
        " (default: patches/)"
    )  # fmt: skip
    p.set_defaults(func=run)
