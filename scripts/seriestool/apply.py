"""``apply``: put the series onto the pinned base, or onto the user's checkout
(docs/checkout-safety.md): built in a scratch repository, each patch checked
by ``placement``, then switched in one journaled ``git read-tree -m -u``.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from . import base as base_mod
from . import check_manifest, hints, interrupts, journal, patchset, scratch, versions
from . import git as g
from . import manifest as manifest_mod
from .errors import SeriesError
from .report import table

# Branch config keys recording the commit an applied series starts from (read
# by export) and the branch (or commit) HEAD was on before (read by remove).
SERIES_BASE_KEY = "seriesBase"
SERIES_FROM_KEY = "seriesFrom"


def default_checkout() -> Path:
    """The checkout ``make apply`` uses without ``VLLM=``: a clone of the base."""
    return base_mod.WORK_DIR / "vllm"


def ensure_default_checkout(manifest: manifest_mod.Manifest) -> Path:
    """Materialise the pinned base (cached) and clone it to ``work/vllm`` once."""
    repo = base_mod.materialise_pinned(manifest)[0]
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
        abort = op.split()[1]  # "git rebase (apply backend)": rebase
        verb = "reset" if abort == "bisect" else "--abort"
        raise SeriesError(
            f"{repo}: a {op} is in progress; finish it, or abort it with\n"
            f"    {hints.git(repo, abort, verb)}\nand run again"
        )
    changes = g.out(repo, "status", "--porcelain=v1", "--untracked-files=no").splitlines()
    if changes:
        shown = "\n  ".join(changes[:10])
        raise SeriesError(
            f"{repo} has uncommitted changes to tracked files:\n  {shown}\n"
            f"commit or stash them (`{hints.git(repo, 'stash')}`) and run again"
        )


def apply_series(repo: Path, manifest: manifest_mod.Manifest,
                 patch_dir: Path = manifest_mod.PATCH_DIR, log=print) -> int:  # fmt: skip
    """Apply the series onto ``repo``'s HEAD on a new branch (see the module doc);
    0 when applied or already there.  A refusal, failure or signal changes nothing."""
    with interrupts.deferred() as guard, journal.locked(Path(repo)):
        return _apply(Path(repo), manifest, Path(patch_dir), log, guard)


def _apply(
    repo: Path, manifest: manifest_mod.Manifest, patch_dir: Path, log, guard: interrupts.Guard
) -> int:
    repo = g.checkout_top(repo)  # a folder inside a bigger repository is refused
    check_manifest.refuse(
        manifest, patch_dir, "the patch files disagree with the manifest; not applying them",
        f"\n{check_manifest.fix_series(patch_dir)}.  A patch is changed as a commit of the"
        ' series branch of an applied checkout, then exported (README: "Changing a patch")',
    )  # fmt: skip
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
    holds, differ = versions.classify(g.blob_ids(repo, head, paths), states)
    if holds == len(patches):
        log(f"series already applied in {repo}: its files hold the series' result; nothing changed")
        return 0
    if holds:
        raise SeriesError(
            f"{repo} holds only part of the series: its files are the series' state after"
            f" {patches[holds - 1].name}; check out the base revision and apply the whole series"
        )
    branch = manifest.branch_name
    ref, result = f"refs/heads/{branch}", states[-1]
    kept = g.rev(repo, ref)
    start_from = g.out(repo, "symbolic-ref", "-q", "HEAD", check=False) or head
    recorded = g.branch_config(repo, branch, SERIES_BASE_KEY)
    # A branch of the series there (e.g. the one a rebase kept): switching to it is the fix.
    if differ and kept:
        # HEAD on it: `git checkout` of it, as _in_the_way says, would not help
        if start_from == ref and recorded:
            raise SeriesError(_changed_on_branch(repo, branch, recorded, head, patch_dir))
        raise SeriesError(_in_the_way(repo, branch, "HEAD does not carry the series"))
    if differ:
        held = versions.held_in(repo, head, patch_dir)
        if held:
            raise SeriesError(_upgrade(repo, head, held, manifest, patch_dir))
        raise SeriesError(_not_at_base(repo, head, manifest, patch_dir, differ))

    # What the series creates, with the blob it writes there.
    created = {p: {states[-1][p]} for p in paths if states[0][p] is None and states[-1][p]}
    config = {} if kept else {f"branch.{branch}.{SERIES_BASE_KEY}": head}
    config[f"branch.{branch}.{SERIES_FROM_KEY}"] = start_from
    # The series' objects wait aside until the checkout is switched to them.
    with contextlib.nullcontext() if kept else scratch.quarantine(repo) as objects:
        if kept:  # `make remove` keeps the branch: switch to it if it is this series on HEAD
            mine = versions.foreign_commits(repo, head, kept, patch_dir)
            if g.rev(repo, recorded or "-") != head or mine or g.blob_ids(
                repo, kept, paths) != result:  # fmt: skip
                what = (f"{len(mine)} commit(s) of no series version this repository knows"
                        if mine else "not this series on HEAD's commit")  # fmt: skip
                raise SeriesError(_in_the_way(repo, branch, f"it holds {what}"))
            tip, before = kept, []
        else:
            tip, commits = _build(repo, head, patches, images, result, paths, objects)
            before = [("update-ref", "-m", "seriestool apply", ref, tip, "0" * 40)]
        before += [("config", key, value) for key, value in config.items()]
        scope = journal.Scope(
            paths={p: [result[p]] if result[p] else [] for p in paths},
            refs={ref: [tip]},
            config=config,
        )
        switch(repo, "apply", head, tip, ref, scope, created, log, before, objects=objects)
    guard.completed()
    if kept:
        log(f"switched {repo} to branch {branch}, which holds the series on this commit already")
        return 0
    log(f"applied {len(commits)} patches on new branch {branch} in {repo}")
    rows = [
        (p.file, p.subject, commit[:12], p.patch_id[:12], "applied")
        for p, commit in zip(manifest.patches, commits, strict=True)
    ]
    log(table(("patch", "subject", "commit", "stable patch ID", "status"), rows))
    return 0


def _in_the_way(repo: Path, branch: str, why: str) -> str:
    return (
        f"branch {branch} already exists in {repo} but {why}; nothing was changed.  Check"
        f" it out (`{hints.git(repo, 'checkout', branch)}`), or move it aside, keeping its"
        f" commits (`{hints.git(repo, 'branch', '-m', branch, branch + '-old')}`), and run"
        " again (`git branch -D` would delete its commits)"
    )


def _changed_on_branch(repo: Path, branch: str, base: str, head: str, patch_dir: Path) -> str:
    """The refusal on the series branch whose commits changed the series' files
    (an amended patch): the way to keep them, then apply the series again."""
    mine = versions.listing(repo, versions.foreign_commits(repo, base, head, patch_dir))
    patches = hints.patches_var(patch_dir)
    return (
        f"HEAD of {repo} is on the series branch {branch}, whose files are not the series'"
        f" result: it holds {len(mine)} commit(s) that are no patch of a series version this"
        " repository knows (an amended patch, a commit of yours); nothing was changed:\n  "
        + "\n  ".join(mine) + "\nTo apply the series as it is, keep them on a branch of"
        " their own and take the series out, then run apply again:\n    "
        + hints.git(repo, "branch", "-m", branch, f"{branch}-mine") + " && "
        + hints.make("remove", VLLM=str(repo), PATCHES=patches) + "\nor, to make them"
        f' patches of the series, `{hints.make("export", VLLM=str(repo), PATCHES=patches)}`'
        ' (README: "Changing a patch")'
    )  # fmt: skip


def switch(repo: Path, op: str, start: str, tip: str, head_to: str, scope: journal.Scope,
           created: dict[str, set[str]], log, before=(), after=(), hint: str = "",
           objects: dict[str, str] | None = None, keep: bool = False) -> None:  # fmt: skip
    """Work tree and index from ``start`` to ``tip``, HEAD to ``head_to`` (a ref or
    a commit), git commands ``before`` and ``after``, in one journaled transaction
    (``created``: paths ``tip`` adds, refused, changing nothing, where a file of the
    user's is in the way, ``hint``: another way out; ``objects``: a quarantine
    holding ``tip``, kept only on success; ``keep``: keep the journal)."""
    in_the_way = journal.occupied(repo, created)
    if in_the_way:
        raise SeriesError(
            f"the {op} puts files where {repo} has files of its own, which it never"
            " overwrites:\n  " + "\n  ".join(in_the_way) + f"\nmove them out of the way{hint}"
            " and run again"
        )
    tx = journal.Transaction.begin(repo, op, created, scope)
    moved = []
    try:
        moved = scratch.settle(objects) if objects else []
        for args in before:
            g.git(repo, *args)
        # read-tree, not checkout: it refuses to overwrite untracked and
        # ignored files rather than deleting them.  It trusts the index's
        # file stats, which a copied checkout no longer matches: refresh them.
        g.git(repo, "update-index", "-q", "--refresh", check=False)
        _try_filters(repo, [start, tip], list(scope.paths))
        g.git(repo, "read-tree", "-m", "-u", start, tip)
        if head_to.startswith("refs/"):
            g.git(repo, "symbolic-ref", "-m", f"seriestool {op}", "HEAD", head_to)
        else:
            g.git(repo, "update-ref", "--no-deref", "-m", f"seriestool {op}", "HEAD", head_to)
        for args in after:
            g.git(repo, *args)
        interrupts.check()  # the last moment a signal undoes the change
    except BaseException:
        for note in tx.rollback():
            log(note)
        scratch.unsettle(moved)
        raise
    if not keep:
        tx.commit()


def _try_filters(repo: Path, commits: list[str], paths: list[str]) -> None:
    """Run the smudge filters the checkout's attributes name for ``paths`` on
    their blobs in ``commits`` first: one that fails (a required filter whose
    program is missing) would stop the switch half-way, and its undo too."""
    attrs = g.out(repo, "check-attr", "-z", "filter", "--", *paths).split("\0") if paths else []
    named = [attrs[i] for i in range(0, len(attrs) - 2, 3)
             if attrs[i + 2] not in ("unspecified", "unset", "set")]  # fmt: skip
    for commit in commits if named else []:
        entries = g.tree_entries(repo, commit, named)
        batch = "".join(f"{oid} {path}\n" for path, (_mode, oid) in entries.items())
        g.git(repo, "cat-file", "--batch", "--filters", input=batch, text=False)


def _not_at_base(repo, head, manifest, patch_dir, differ) -> str:
    """The refusal of a checkout not at the pinned base, with the way there: the
    upstream tag in an upstream clone (it has the tag or a remote of upstream
    vLLM), where the tag has the base's files; else the materialised base."""
    b = manifest.base
    checkout = hints.git(repo, "checkout", "--detach", f"v{b.version}")
    tagged = g.rev(repo, f"refs/tags/v{b.version}")
    urls = g.git(repo, "config", "--get-regexp", r"^remote\..*\.url$", check=False).stdout
    remote = next((key[7:-4] for key, _, url in (u.partition(" ") for u in urls.splitlines())
                   if "github.com/vllm-project/vllm" in url.lower()), None)  # fmt: skip
    if tagged and g.blob_ids(repo, tagged, sorted(b.touched_files)) == b.touched_files:
        way = f"Its tag v{b.version} has the base's files (blob ids compared):\n    {checkout}"
    elif remote and not tagged:
        way = (f"It clones upstream vLLM (remote {remote}), whose tag v{b.version} has the base's"
               " files (README: Troubleshooting); fetch the tag and check it out with\n    "
               + hints.git(repo, "fetch", "--no-tags", remote, "tag", f"v{b.version}")
               + f" && {checkout}")  # fmt: skip
    else:
        way = (
            f"The series applies to the base commit {b.commit} (`base.commit` in"
            f" {Path(hints.patches_var(patch_dir) or 'patches') / 'series.json'}),"
            f" materialised from the sdist {b.sdist.filename} by `make base` (cached, under"
            " work/; `make apply` without VLLM= uses a clone of it).  Check it out here"
            " with\n    " + hints.make("base") + " && "
            + hints.git(repo, "fetch", str(base_mod.base_repo_path(b.project, b.version)), b.commit)
            + " && " + hints.git(repo, "checkout", b.commit)
        )  # fmt: skip
    # A commit has no sdist to pin: the project's patches/ stays as it is and
    # the rebased series goes into a copy (rebase refuses otherwise).
    to = {"TO": head[:12], "VLLM": str(repo)}
    copy = hints.patches_var(patch_dir)
    rebase = hints.make("rebase", **to, PATCHES=copy) if copy else hints.rebase_into_copy(
        patch_dir, **to)  # fmt: skip
    return (
        f"{repo} is not at the pinned base {b.project} {b.version} (upstream"
        f" {b.upstream_commit}):\n  " + "\n  ".join(differ) + f"\n{way}\nor carry the series"
        " to this checkout's HEAD, in a copy of the series folder, with\n    " + rebase
    )


def _upgrade(repo: Path, head: str, held: versions.Held, manifest, patch_dir: Path) -> str:
    """The refusal of a checkout carrying another version of the series, with
    the upgrade: a branch of this version from the commit that one started from."""
    apply_again = hints.make("apply", VLLM=str(repo), PATCHES=hints.patches_var(patch_dir))
    branch = g.out(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    start = g.branch_config(repo, branch, SERIES_BASE_KEY) or g.rev(repo, f"{head}~{held.held}")
    paths = sorted(held.manifest.base.touched_files)
    found = f"{repo} carries series {held.state.label} ({held.held} of {held.total} patches)"
    if not start or g.blob_ids(repo, start, paths) != held.manifest.base.touched_files:
        return f"{found}; check out the commit it was applied to and run `{apply_again}` there"
    return (
        f"{found}: its files hold that version's state, not v{manifest.version}'s.  To upgrade,"
        f" apply v{manifest.version} on its own branch {manifest.branch_name} from the commit"
        f" that series started from (the {'branch ' + branch if branch else 'commit'} stays):"
        f"\n    {hints.git(repo, 'checkout', '--detach', start)} && {apply_again}"
    )


def _build(repo: Path, start: str, patches: list[Path], images: list,
           result: dict[str, str | None], paths: list[str],
           objects: dict[str, str]) -> tuple[str, list[str]]:  # fmt: skip
    """The series' commits on ``start``, made in a scratch repository, then fetched
    into ``repo``'s quarantine ``objects`` (no ref, no file of it changes)."""
    identity = g.user_identity(repo)
    with scratch.checkout(repo, start, paths) as work:
        try:
            commits = scratch.apply_patches(work, patches, images, "the checkout", env=identity)
        except SeriesError as e:
            raise SeriesError(
                f"the series does not apply to {repo}; nothing was changed\n  {e}"
            ) from None
        tip = commits[-1]
        wrong = [p for p, blob in g.blob_ids(work, tip, paths).items() if blob != result[p]]
        if wrong:
            raise SeriesError(
                f"the applied series is not the series' recorded result in {', '.join(wrong)};"
                " nothing was changed"
            )
        g.git(work, "config", "uploadpack.allowAnySHA1InWant", "true")
        g.git(repo, "fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
              str(work), tip, env=objects)  # fmt: skip
    return tip, commits


def run(args: argparse.Namespace) -> int:
    patch_dir = Path(args.patches_dir or manifest_mod.PATCH_DIR)
    manifest = manifest_mod.load(patch_dir / "series.json")
    repo = Path(args.vllm) if args.vllm else ensure_default_checkout(manifest)
    return apply_series(repo, manifest, patch_dir)


def register(subparsers) -> None:
    p = subparsers.add_parser("apply", help="apply the series onto the pinned base or VLLM")
    p.add_argument(
        "--vllm", type=hints.user_path, help="vLLM checkout (default: materialise the pinned base)"
    )
    p.add_argument("--patches-dir", metavar="DIR", help="series folder (default: patches/)")
    p.set_defaults(func=run)
