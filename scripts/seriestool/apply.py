"""``apply``: put the series onto the pinned base, or onto the user's checkout.

Order of checks, each a refusal that changes nothing:

0. the patch files are the manifest's, byte for byte (``check-manifest``): a
   patch edited by hand would otherwise be applied as if it were the series;
1. no interrupted apply or rebase left the checkout part-way (``journal``),
   no am/rebase/merge/cherry-pick is in progress, no staged or unstaged
   change to tracked files (untracked files are left alone);
2. the series is not already there: every file the series touches holds the
   series' result (blob ids compared; the history is not what counts) — if
   it is, say so and exit 0;
3. the base is the pinned one: every file the series touches has the blob id
   the manifest records (or the checkout holds a prefix of the series, or
   something else: both refused, naming the files);
4. nothing is in the way of a file the series creates: a file there, ignored
   or not, is the user's and is never overwritten.

Then the series is built away from the checkout: each patch is applied with
``git am --3way`` in a scratch repository that reads the checkout's objects
(``scratch.checkout``), the result is checked file by file against the
patches' recorded postimages (``placement``), and only then is the checkout
switched, in one journaled transaction (``journal``): a new branch named
after the series version and base, the commit the series starts from
recorded in the branch's git config (``branch.<name>.seriesBase``, read by
``export``), and the work tree and index moved to the series' tip with
``git read-tree -m -u`` (which, unlike ``git checkout``, never overwrites an
untracked or ignored file).  A failure, SIGINT or SIGTERM at any moment rolls
the checkout back byte for byte; after a SIGKILL a re-run names the one
command that does.  The commits carry each patch's author and message and,
as committer, the user's own git identity.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import base as base_mod
from . import check_manifest, hints, interrupts, journal, patchset, placement, scratch
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError
from .report import table

# Branch config key recording where an applied series starts (read by export).
SERIES_BASE_KEY = "seriesBase"


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
    """Refuse a leftover of an interrupted change, an operation in progress
    or changes to tracked files."""
    journal.refuse_leftover(repo)
    op = g.operation_in_progress(repo)
    if op:
        abort = {"git am": "am", "git rebase": "rebase", "git rebase (apply backend)": "rebase",
                 "git merge": "merge", "git cherry-pick": "cherry-pick",
                 "git revert": "revert", "git bisect": "bisect"}[op]  # fmt: skip
        verb = "reset" if abort == "bisect" else "--abort"
        raise SeriesError(
            f"{repo}: a {op} is in progress; finish it, or abort it with\n"
            f"    {hints.git(repo, abort, verb)}\nand run again"
        )
    changes = g.tracked_changes(repo)
    if changes:
        shown = "\n  ".join(changes[:10])
        raise SeriesError(
            f"{repo} has uncommitted changes to tracked files:\n  {shown}\n"
            f"commit or stash them (`{hints.git(repo, 'stash')}`) and run again"
        )


def _describe(blob: str | None) -> str:
    return "absent" if blob is None else f"blob {blob[:12]}"


def classify(
    head: dict[str, str | None], states: list[dict[str, str | None]]
) -> tuple[int | None, list[str]]:
    """How many patches the checkout's files hold: ``(k, [])`` when they are
    exactly the series after ``k`` patches, else ``(None, differences from the base)``."""
    for k in (len(states) - 1, 0, *range(1, len(states) - 1)):
        if head == states[k]:
            return k, []
    base, result = states[0], states[-1]
    differ = []
    for path in sorted(base):
        if head[path] != base[path]:
            also = ", the series' result" if head[path] == result[path] else ""
            differ.append(
                f"{path}: {_describe(head[path])}{also}; base has {_describe(base[path])}"
            )
    return None, differ


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
        interrupts.Interrupted: SIGINT, SIGTERM or SIGHUP; the checkout is unchanged.
    """
    with interrupts.deferred() as guard, journal.locked(Path(repo)):
        return _apply(Path(repo), manifest, Path(patch_dir), log, guard)


def _apply(
    repo: Path, manifest: manifest_mod.Manifest, patch_dir: Path, log, guard: interrupts.Guard
) -> int:
    if not g.is_repo(repo):
        raise SeriesError(
            f"{hints.no_checkout(repo)}: VLLM= must name the top of a vLLM git checkout"
        )
    problems = check_manifest.problems(manifest, patch_dir)
    if problems:
        raise SeriesError(
            "the patch files disagree with the manifest; not applying them:\n  "
            + "\n  ".join(problems)
            + f"\nRestore the patches (`{hints.git(patch_dir, 'checkout', '--', '.')}`) or,"
            f" if the change is intended, re-export the series (`{hints.make('export')}`)"
        )
    repo = g.checkout_top(repo)  # a folder inside a bigger repository is refused
    refuse_unsafe_state(repo)
    if not manifest.patches:
        log("the series is empty; nothing to apply")
        return 0

    patches = manifest.patch_paths(patch_dir)
    images = patchset.images(patches)
    states = patchset.states(manifest.base.touched_files, images)
    head = g.rev(repo, "HEAD")
    if head is None:
        raise SeriesError(f"{repo} has no commits; check out a vLLM revision first")
    paths = sorted(manifest.base.touched_files)
    holds, differ = classify(g.blob_ids(repo, head, paths), states)
    if holds == len(patches):
        log(f"series already applied in {repo}: its files hold the series' result; nothing changed")
        return 0
    if holds:
        raise SeriesError(
            f"{repo} holds only part of the series: its files are the series' state after"
            f" {patches[holds - 1].name}; check out the base revision and apply the whole series"
        )
    # A branch of the series there (e.g. the one a rebase kept): switching to it is the fix.
    branch = manifest.branch_name
    if g.rev(repo, f"refs/heads/{branch}"):
        raise SeriesError(
            f"branch {branch} already exists in {repo} but HEAD does not carry the"
            f" series; check it out (`{hints.git(repo, 'checkout', branch)}`) or delete it"
            f" (`{hints.git(repo, 'branch', '-D', branch)}`) and run again"
        )
    if differ:
        b = manifest.base
        materialised = base_mod.base_repo_path(b.project, b.version)
        raise SeriesError(
            f"{repo} is not at the pinned base {b.project} {b.version} (upstream"
            f" {b.upstream_commit}):\n  "
            + "\n  ".join(differ)
            + f"\nThe series applies to the base commit {b.commit} (`base.commit` in"
            f" {_manifest_name(patch_dir)}), materialised from the sdist {b.sdist.filename}"
            " by `make base` (cached, under work/; `make apply` without VLLM= uses a clone"
            " of it).  Check it out here with\n    "
            + hints.git(repo, "fetch", str(materialised), b.commit)
            + " && "
            + hints.git(repo, "checkout", b.commit)
            + "\n(after `make base`), or carry the series to this checkout's HEAD with\n    "
            + hints.make("rebase", TO=head[:12], VLLM=str(repo), PATCHES=_patches_arg(patch_dir))
        )

    created = {p for p in paths if states[0][p] is None and states[-1][p] is not None}
    in_the_way = journal.occupied(repo, created)
    if in_the_way:
        raise SeriesError(
            f"the series creates files that already exist in {repo}; apply never"
            " overwrites them:\n  "
            + "\n  ".join(in_the_way)
            + "\nmove them out of the way and run again"
        )

    tip, commits = _build(repo, head, patches, images, states[-1], paths)
    summary = _summary(manifest, commits, "applied")
    scope = journal.Scope(
        paths={p: [states[-1][p]] if states[-1][p] else [] for p in paths},
        refs={f"refs/heads/{branch}": [tip]},
        config={f"branch.{branch}.{SERIES_BASE_KEY}": head},
    )
    tx = journal.Transaction.begin(repo, "apply", {p: {states[-1][p]} for p in created}, scope)
    try:
        g.git(repo, "update-ref", "-m", "seriestool apply", f"refs/heads/{branch}", tip, "0" * 40)
        g.git(repo, "config", f"branch.{branch}.{SERIES_BASE_KEY}", head)
        # read-tree, not checkout: it refuses to overwrite untracked and
        # ignored files rather than deleting them.  It trusts the index's
        # file stats, which a copied checkout no longer matches: refresh them.
        g.git(repo, "update-index", "-q", "--refresh", check=False)
        g.git(repo, "read-tree", "-m", "-u", head, tip)
        g.git(repo, "symbolic-ref", "-m", "seriestool apply", "HEAD", f"refs/heads/{branch}")
        interrupts.check()  # the last moment a signal undoes the apply
    except BaseException:
        for note in tx.rollback():
            log(note)
        raise
    tx.commit()
    guard.completed()
    log(f"applied {len(commits)} patches on new branch {branch} in {repo}")
    log(summary)
    return 0


def _manifest_name(patch_dir: Path) -> str:
    """The manifest as a user would name it: ``patches/series.json`` for the default folder."""
    default = patch_dir.resolve() == manifest_mod.PATCH_DIR.resolve()
    return "patches/series.json" if default else str(patch_dir / "series.json")


def _patches_arg(patch_dir: Path) -> str | None:
    """``PATCHES=`` for a printed make command: only when not the default folder."""
    return None if patch_dir.resolve() == manifest_mod.PATCH_DIR.resolve() else str(patch_dir)


def _build(
    repo: Path,
    start: str,
    patches: list[Path],
    images: list,
    result: dict[str, str | None],
    paths: list[str],
) -> tuple[str, list[str]]:
    """The series' commits on ``start``, made in a scratch repository; their
    objects are then fetched into ``repo`` (no ref, no file of it changes).

    Raises:
        SeriesError: a patch does not apply (naming it and git's reason), or
            the result is not the series' (naming the file).
    """
    identity = g.user_identity(repo)
    with scratch.checkout(repo, start, paths) as work:
        commits = []
        before = start
        for number, (patch, image) in enumerate(zip(patches, images, strict=True), 1):
            try:
                patchset.am(work, [patch], env=identity)
            except SeriesError as e:
                raise SeriesError(
                    f"the series does not apply to {repo}; nothing was changed\n  "
                    + _failure_detail(work, str(e), number, patch)
                ) from None
            after = g.out(work, "rev-parse", "HEAD")
            disagree = placement.check(work, before, after, image, ours="the checkout")
            if disagree or after == before:
                raise SeriesError(
                    f"{patch.name} does not give its recorded result on {repo}; nothing was"
                    " changed\n  " + "\n  ".join(disagree or ["it made no change"])
                )
            commits.append(after)
            before = after
        actual = g.blob_ids(work, before, paths)
        wrong = [p for p in paths if actual[p] != result[p]]
        if wrong:
            raise SeriesError(
                f"the applied series is not the series' recorded result in {', '.join(wrong)};"
                " nothing was changed"
            )
        g.git(work, "config", "uploadpack.allowAnySHA1InWant", "true")
        g.git(repo, "fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
              str(work), before)  # fmt: skip
    return before, commits


def _failure_detail(work: Path, am_error: str, number: int, patch: Path) -> str:
    """Which patch failed and where: conflicts and git's own messages."""
    lines = [f"failing patch: number {number} of the series ({patch.name})"]
    lines += patchset.conflict_lines(work, ours="the checkout")
    # git's own explanation (patch failed: FILE:LINE, ...), without the hints
    # about `git am --continue`: the am ran in a scratch repository.
    message = am_error.split(": ", 1)[1] if am_error.startswith("git ") else am_error
    for line in message.splitlines():
        line = line.strip()
        if line and not line.startswith(("hint:", "When you have resolved", "If you prefer",
                                         "To restore the original", "Use 'git am")):  # fmt: skip
            lines.append(line)
    return "\n  ".join(lines)


def _summary(manifest: manifest_mod.Manifest, commits: list[str], status: str) -> str:
    rows = [
        (p.file, p.subject, commit[:12], p.patch_id[:12], status)
        for p, commit in zip(manifest.patches, commits, strict=True)
    ]
    return table(("patch", "subject", "commit", "stable patch ID", "status"), rows)


def run(args: argparse.Namespace) -> int:
    manifest_path = Path(args.manifest) if args.manifest else None
    patch_dir = Path(args.patches_dir) if args.patches_dir else None
    if manifest_path is None:
        manifest_path = (patch_dir or manifest_mod.PATCH_DIR) / "series.json"
    manifest = manifest_mod.load(manifest_path)
    repo = Path(args.vllm) if args.vllm else ensure_default_checkout(manifest)
    return apply_series(repo, manifest, patch_dir or manifest_path.parent)


def register(subparsers) -> None:
    p = subparsers.add_parser("apply", help="apply the series onto the pinned base or VLLM")
    p.add_argument(
        "--vllm", type=hints.user_path, help="vLLM checkout (default: materialise the pinned base)"
    )
    p.add_argument("--patches-dir", metavar="DIR", help="series folder (default: patches/)")
    p.add_argument("--manifest", help="its manifest (default: <patches-dir>/series.json)")
    p.set_defaults(func=run)
