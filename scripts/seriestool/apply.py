"""``apply``: put the series onto the pinned base, or onto the user's checkout.

Order of checks, each a refusal that changes nothing:

0. the patch files agree with the manifest (``check-manifest``): a patch edited
   by hand would otherwise be applied as if it were the series;
1. the checkout has no am/rebase/merge/cherry-pick in progress and no staged or
   unstaged changes to tracked files (untracked files are left alone);
2. the series is not already there (detected by stable patch ID, not by branch
   name) — if it is, say so and exit 0;
3. the base is the pinned one: HEAD is the pinned commit, or every file the
   series touches has the blob id the manifest records.

Then a new branch named after the series version and base is created and the
patches are applied with ``git am --3way``, one commit per patch with its own
message and author.  The commit the series starts from is recorded in the
branch's git config (``branch.<name>.seriesBase``), so ``export`` knows where
the series begins even on a checkout with local commits below it.  If a patch
fails, the am session is aborted and the original branch (or detached HEAD),
index and work tree are restored exactly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import base as base_mod
from . import check_manifest, patchset
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError
from .report import table

# Branch config key recording where an applied series starts (read by export).
SERIES_BASE_KEY = "seriesBase"

# How far back HEAD's history is searched for the series' patch IDs.  Only
# commits touching series files count, so this reaches past any realistic
# number of local commits on top of the series.
APPLIED_SEARCH_DEPTH = 500


def default_checkout() -> Path:
    """The checkout ``make apply`` uses without ``VLLM=``: a clone of the base."""
    return base_mod.WORK_DIR / "vllm"


def ensure_default_checkout(manifest: manifest_mod.Manifest, log=print) -> Path:
    """Materialise the pinned base (cached) and clone it to ``work/vllm`` once."""
    repo, _commit, _sha = base_mod.materialise_pinned(manifest, log=log)
    checkout = default_checkout()
    if not checkout.exists():
        base_mod.clone(repo, checkout)
    return checkout


def refuse_unsafe_state(repo: Path) -> None:
    """Refuse an operation in progress or changes to tracked files."""
    op = g.operation_in_progress(repo)
    if op:
        raise SeriesError(
            f"{repo}: a {op} is in progress; finish it or abort it "
            f"(e.g. `git am --abort`, `git rebase --abort`) and run again"
        )
    changes = g.tracked_changes(repo)
    if changes:
        shown = "\n  ".join(changes[:10])
        raise SeriesError(
            f"{repo} has uncommitted changes to tracked files:\n  {shown}\n"
            "commit or stash them (`git stash`) and run again"
        )


def find_applied(repo: Path, manifest: manifest_mod.Manifest, ref: str = "HEAD") -> dict[str, str]:
    """Map patch file → commit in ``ref``'s history carrying its patch ID."""
    paths = sorted(manifest.base.touched_files)
    if not paths:
        return {}
    found = {
        pid: commit
        for commit, pid in patchset.commit_patch_ids(
            repo, ref, paths, max_count=APPLIED_SEARCH_DEPTH
        )
    }
    return {p.file: found[p.patch_id] for p in manifest.patches if p.patch_id in found}


def base_mismatches(repo: Path, manifest: manifest_mod.Manifest) -> list[str]:
    """Touched files whose blob at HEAD differs from the manifest (empty: base ok)."""
    head = g.rev(repo, "HEAD")
    if head == manifest.base.commit or (head or "").startswith(manifest.base.upstream_commit):
        return []
    actual = g.blob_ids(repo, "HEAD", sorted(manifest.base.touched_files))
    differ = []
    for path, expected in sorted(manifest.base.touched_files.items()):
        if actual[path] != expected:
            state = "missing" if actual[path] is None else f"blob {actual[path][:12]}"
            want = "absent" if expected is None else f"blob {expected[:12]}"
            differ.append(f"{path}: {state}, base has {want}")
    return differ


def _failure_detail(repo: Path, am_error: str, patches: list[Path]) -> str:
    """Which patch failed and where: git's am state, conflicts and own messages."""
    gdir = g.git_dir(repo)
    lines = []
    msgnum = gdir / "rebase-apply" / "next"
    if msgnum.exists():
        number = int(msgnum.read_text())
        name = patches[number - 1].name if 0 < number <= len(patches) else "?"
        lines.append(f"failing patch: number {number} of the series ({name})")
    lines += patchset.conflict_lines(repo, ours="the checkout")
    # git's own explanation (patch failed: FILE:LINE, untracked files in the
    # way, ...), without the hints about `git am --continue` that do not apply.
    message = am_error.split(": ", 1)[1] if am_error.startswith("git ") else am_error
    for line in message.splitlines():
        line = line.strip()
        if line and not line.startswith(("hint:", "When you have resolved", "If you prefer",
                                         "To restore the original", "Use 'git am")):  # fmt: skip
            lines.append(line)
    return "\n  ".join(lines)


def apply_series(
    repo: Path,
    manifest: manifest_mod.Manifest,
    patch_dir: Path = manifest_mod.PATCH_DIR,
    log=print,
) -> int:
    """Apply the series onto ``repo``'s HEAD on a new branch; see module doc.

    Returns:
        0 when applied or already applied.

    Raises:
        SeriesError: a refusal or a failed patch; the checkout is unchanged.
    """
    if not g.is_repo(repo):
        raise SeriesError(
            f"{repo} is not a git checkout: VLLM= must name the top of a vLLM git checkout"
        )
    problems = check_manifest.problems(manifest, patch_dir)
    if problems:
        raise SeriesError(
            "the patch files disagree with the manifest; not applying them:\n  "
            + "\n  ".join(problems)
            + "\nRestore the patches (`git checkout -- patches/`) or, if the change is"
            " intended, re-export the series (`make export`)"
        )
    repo = g.toplevel(repo)
    refuse_unsafe_state(repo)

    if not manifest.patches:
        log("the series is empty; nothing to apply")
        return 0
    applied = find_applied(repo, manifest)
    if len(applied) == len(manifest.patches):
        log(f"series already applied in {repo}; nothing changed")
        log(_summary(repo, manifest, applied, "already applied"))
        return 0
    if applied:
        raise SeriesError(
            f"{repo} holds only part of the series ({', '.join(sorted(applied))});"
            " check out the base revision and apply the whole series"
        )

    differ = base_mismatches(repo, manifest)
    if differ:
        raise SeriesError(
            f"{repo} is not at the pinned base {manifest.base.project} "
            f"{manifest.base.version} (upstream {manifest.base.upstream_commit}):\n  "
            + "\n  ".join(differ)
            + "\nCheck out that revision, or carry the series to yours with"
            f" `make rebase TO=<version or commit> VLLM={repo}`"
        )

    branch = manifest.branch_name
    if g.rev(repo, f"refs/heads/{branch}"):
        raise SeriesError(
            f"branch {branch} already exists in {repo} but HEAD does not carry the"
            f" series; check it out (`git checkout {branch}`) or delete it"
            f" (`git branch -D {branch}`) and run again"
        )

    state = g.RepoState.capture(repo)
    start = state.head
    try:
        g.git(repo, "checkout", "-q", "-b", branch)
        g.git(repo, "config", f"branch.{branch}.{SERIES_BASE_KEY}", start)
        patchset.am(repo, manifest.patch_paths(patch_dir))
    except SeriesError as e:
        detail = _failure_detail(repo, str(e), manifest.patch_paths(patch_dir))
        if g.operation_in_progress(repo):
            g.git(repo, "am", "--abort", check=False)
        state.restore()
        raise SeriesError(
            f"the series does not apply to {repo}; nothing was changed\n  {detail}"
        ) from None

    commits = [c for c, _ in patchset.commit_patch_ids(repo, f"{start}..HEAD")]
    log(f"applied {len(commits)} patches on new branch {branch} in {repo}")
    by_file = dict(zip([p.file for p in manifest.patches], commits, strict=True))
    log(_summary(repo, manifest, by_file, "applied"))
    return 0


def _summary(
    repo: Path, manifest: manifest_mod.Manifest, commits: dict[str, str], status: str
) -> str:
    actual = {}
    if commits:
        for commit, pid in patchset.commit_patch_ids(
            repo, "HEAD", sorted(manifest.base.touched_files), max_count=APPLIED_SEARCH_DEPTH
        ):
            actual[commit] = pid
    rows = []
    for p in manifest.patches:
        commit = commits.get(p.file, "")
        row_status = status
        if commit and actual.get(commit) != p.patch_id:
            row_status = f"{status}, patch ID differs: {actual.get(commit, '?')[:12]}"
        rows.append((p.file, p.subject, commit[:12], p.patch_id[:12], row_status))
    return table(("patch", "subject", "commit", "stable patch ID", "status"), rows)


def run(args: argparse.Namespace) -> int:
    manifest = manifest_mod.load()
    repo = Path(args.vllm) if args.vllm else ensure_default_checkout(manifest)
    return apply_series(repo, manifest)


def register(subparsers) -> None:
    p = subparsers.add_parser("apply", help="apply the series onto the pinned base or VLLM")
    p.add_argument("--vllm", help="vLLM checkout (default: materialise the pinned base)")
    p.set_defaults(func=run)
