"""``rebase``: carry the series to another upstream revision (docs/rebase.md)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from . import base as base_mod
from . import (
    check_manifest,
    hints,
    interrupts,
    journal,
    patchset,
    placement,
    rangediff,
    seriesdoc,
    seriestest,
)
from . import export as export_mod
from . import git as g
from . import manifest as manifest_mod
from . import scratch as scratch_mod
from .apply import SERIES_BASE_KEY, default_checkout, refuse_unsafe_state, switch
from .errors import SeriesError
from .report import table

Log = Callable[[str], object]

VERSION_RE = re.compile(r"^v?(\d+(?:\.\d+)+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)$")
_NULL_OID = "0" * 40

APPLIED = "applied"
# Dropped patches are not in the new series; the status says who decided it.
DROPPED_ABSORBED = "dropped (absorbed)"  # upstream has it: the tool found so
DROPPED_RESOLVED = "dropped (resolved to no change)"  # a hand resolution left nothing
DROPPED_SKIPPED = "dropped (skipped by hand)"  # `git am --skip`: the change is given up
DROPPED = (DROPPED_ABSORBED, DROPPED_RESOLVED, DROPPED_SKIPPED)
CONFLICT = "conflict"
TESTS_FAILED = "tests failed"  # --keep-conflict: applied, its own tests fail: stopped there
PENDING = "pending"
RESOLVED = "resolved by hand"

OLD_BRANCH = "series-old"  # the old series on the old base, in the scratch clone
NEW_REF = "refs/heads/series-new"  # the new series, fetched into the scratch clone
MANIFEST = manifest_mod.MANIFEST_PATH.name  # beside the patches: replaced with them
_CONTINUE, _ABORT = hints.make("rebase", CONTINUE="1"), hints.make("rebase", ABORT="1")


@dataclasses.dataclass
class PatchStatus:
    """One patch of the old series and what became of it."""

    file: str
    subject: str
    patch_id: str
    status: str = PENDING  # PENDING, APPLIED, CONFLICT or one of DROPPED
    how: str = ""  # "clean", "3-way merge", "resolved by hand", or why dropped
    new_file: str = ""
    tests: str = ""  # its tests on the new base: "passed", "FAILED: ...", "none"; "": not run


@dataclasses.dataclass
class Session:
    """A rebase from start to finish, saved after every step; ``phase``: ``running``,
    ``conflict`` (the ``git am`` session left for resolution), ``applied`` (a
    step after the patches failed: ``--continue`` retries), ``swapping``."""

    to: str
    slug: str
    kind: str  # "version" | "commit"
    keep: bool
    skip_tests: bool
    phase: str
    pid: int
    work: str  # work/rebase/<slug>
    scratch: str  # the scratch clone
    checkout: str  # where the new series is applied: scratch or the user's checkout
    branch: str  # the new series' branch in ``checkout``
    patch_dir: str
    command: str
    old_base: str = ""
    old_tip: str = ""
    new_tip: str = ""
    new_base: str = ""
    target: dict = dataclasses.field(default_factory=dict)
    history_range: str | None = None
    patches: list[PatchStatus] = dataclasses.field(default_factory=list)
    next: int = 0
    pre_head: str = ""
    user_checkout: str = ""  # the --vllm checkout the session changes (journaled)
    vllm: str = ""  # --vllm as given (resolved): carried into printed commands
    pip_args: list[str] = dataclasses.field(default_factory=list)
    conflict: str = ""
    # A ``git am`` session was verified in progress in ``checkout`` when the
    # rebase stopped (``--keep-conflict``): only then can its absence on
    # ``--continue`` mean the user ended it by hand.
    am_kept: bool = False
    tests: str = ""
    tests_failed: str = ""  # a failed test step: reported whatever runs after it
    # "patch N uses X from dropped patch M": what a later patch still needs.
    uses_dropped: list[str] = dataclasses.field(default_factory=list)
    kept_branch: str = ""  # where the rebased series' branch stays: "<checkout>\t<branch>"

    @property
    def work_dir(self) -> Path:
        return Path(self.work)

    @property
    def old_patch_dir(self) -> Path:
        return self.work_dir / "old-patches"

    @property
    def staging(self) -> Path:
        return self.work_dir / "staging"

    @property
    def report_path(self) -> Path:
        return self.work_dir / "report.md"

    @property
    def failed_tests_path(self) -> Path:
        return self.work_dir / "tests-failed.md"

    @property
    def resumable(self) -> bool:
        """A ``--keep-conflict`` session that stopped for the user at a conflict:
        whatever stopped it since (a kill included), ``--continue`` goes on
        from what was resolved, and only ``--abort`` drops it."""
        hand = (CONFLICT, TESTS_FAILED, DROPPED_RESOLVED, DROPPED_SKIPPED)
        return self.keep and any(p.status in hand or p.how == RESOLVED for p in self.patches)

    def save(self) -> None:
        data = dataclasses.asdict(self)
        state_path().parent.mkdir(parents=True, exist_ok=True)
        manifest_mod.write_atomic(state_path(), json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls) -> Session | None:
        path = state_path()
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_bytes())
            data["patches"] = [PatchStatus(**p) for p in data["patches"]]
            return cls(**data)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SeriesError(
                f"rebase state {path} is unreadable ({e}); if no rebase is in progress,"
                " delete it and run again"
            ) from None

    def make(self, **variables: str | None) -> str:
        """A ``make rebase`` command carrying this session's checkout and options."""
        args = " ".join(shlex.quote(f"--pip-arg={a}") for a in self.pip_args)
        session = {
            "VLLM": self.vllm or None,
            "NOTEST": "1" if self.skip_tests else None,
            "PATCHES": hints.patches_var(self.patch_dir),
            "ARGS": args or None,
        }
        # The caller's variables first, as typed; the session's fill in the rest.
        return hints.make("rebase", **variables, **{k: v for k, v in session.items()
                                                     if k not in variables})  # fmt: skip


def state_path() -> Path:
    """``work/rebase/state.json`` (read at call time: tests move WORK_DIR)."""
    return base_mod.WORK_DIR / "rebase" / "state.json"


def _siblings(patch_dir: Path) -> tuple[Path, ...]:
    """The swap's (partial, new, old) folders next to ``patch_dir``."""
    suffixes = (".rebase-new.partial", ".rebase-new", ".rebase-old")
    return tuple(patch_dir.with_name(patch_dir.name + suffix) for suffix in suffixes)


def recover_swap(patch_dir: Path, log: Log = print) -> None:
    """Finish or undo a swap of ``patch_dir`` that a killed rebase left:
    ``<patches>.rebase-new`` exists only once complete (renamed from
    ``.partial``, which is discarded), so a swap that has it is finished."""
    partial, new, old = _siblings(patch_dir)
    if partial.exists():
        shutil.rmtree(partial)
        log(f"discarded {partial.name}: an unfinished copy from an interrupted rebase;"
            f" {patch_dir.name}/ was not touched")  # fmt: skip
    here, has_new, has_old = patch_dir.exists(), new.exists(), old.exists()
    if not has_new and not has_old:
        return
    if here and has_new and has_old:
        raise SeriesError(
            f"{patch_dir}, {new.name} and {old.name} all exist: no rebase leaves that;"
            f" keep the series you want as {patch_dir.name}/, delete the other two"
            " folders and run again"
        )
    if has_new:
        if here:  # interrupted before the first rename: the series is still the old one
            patch_dir.rename(old)
        new.rename(patch_dir)
        log(f"finished replacing {patch_dir} with the rebased series that an interrupted"
            f" rebase had completed and verified ({new.name})")  # fmt: skip
    elif not here:  # old only: put it back (no complete new series exists)
        old.rename(patch_dir)
        log(f"restored {patch_dir} from {old.name} after an interrupted rebase")
        return
    if old.exists():
        shutil.rmtree(old)


def swap_in(staging: Path, patch_dir: Path) -> None:
    """Replace ``patch_dir``'s patches and manifest with ``staging``'s (its
    other files are carried over)."""
    partial, new, old = _siblings(patch_dir)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(patch_dir, partial, symlinks=True)
    for item in [*partial.glob("*.patch"), partial / MANIFEST]:
        item.unlink(missing_ok=True)
    shutil.copytree(staging, partial, dirs_exist_ok=True)
    for item in partial.iterdir():
        if item.is_file():
            with item.open("rb") as f:
                os.fsync(f.fileno())
    partial.rename(new)
    patch_dir.rename(old)
    new.rename(patch_dir)
    shutil.rmtree(old)


@interrupts.deferring
def start(
    to: str,
    vllm: Path | None = None,
    keep_conflict: bool = False,
    skip_tests: bool = False,
    patch_dir: Path = manifest_mod.PATCH_DIR,
    pip_args: Sequence[str] = (),
    log: Log = print,
    *,
    guard: interrupts.Guard,
) -> int:
    """Rebase the series in ``patch_dir`` onto ``to`` (see the module doc): 0 once
    ``patch_dir`` is replaced; else a refusal, with ``patch_dir`` unchanged."""
    patch_dir = Path(patch_dir).resolve()
    recover_swap(patch_dir, log)  # finish an interrupted swap first
    if not patch_dir.is_dir():
        raise SeriesError(f"patch folder {patch_dir} does not exist")
    _clear_stale_session(log)
    manifest = manifest_mod.load(patch_dir / MANIFEST)
    check_manifest.refuse(
        manifest, patch_dir, f"the series in {patch_dir} disagrees with {MANIFEST}",
        f"\nfix it (`{hints.make('check-manifest')}`, `{hints.make('export')}`) before rebasing",
    )  # fmt: skip

    version = match.group(1) if (match := VERSION_RE.match(to)) else None  # 0.32.0 or v0.32.0
    # A version is always its release's sdist, whatever VLLM= holds (a tag of
    # that name included): only the sdist gives a base `make base` rebuilds.
    user = g.checkout_top(Path(vllm)) if vllm is not None else None
    new_commit: str | None = None
    if version is not None:
        kind, slug = "version", version
    elif user is not None:
        new_commit = g.rev(user, to)
        if new_commit is None:
            raise SeriesError(
                f"{user} has no commit or tag {to!r}; fetch it into that checkout and run again"
            )
        kind = "commit"
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", to).strip("._") or "target"
        if patch_dir == manifest_mod.PATCH_DIR.resolve():
            raise SeriesError(
                f"{to!r} is a commit, which has no PyPI sdist: rebased onto it,"
                f" {patch_dir} would pin a base that `make venv`, `make base` and"
                " `make apply` cannot rebuild, so nothing was changed. Rebase onto a"
                f" release instead (`{hints.make('rebase', TO='<version>')}`, e.g. the"
                " release the commit is on), or write the rebased series into a copy:\n"
                f"    {hints.rebase_into_copy(patch_dir, TO=to, VLLM=str(user))}"
            )
    else:
        raise SeriesError(
            f"TO={to!r} is not a version such as 0.32.0; a commit or tag needs VLLM="
            " naming a checkout that contains it"
        )
    if (new_commit or version) in (manifest.base.commit, manifest.base.version):
        raise SeriesError(
            f"the series is already based on {manifest.base.project} {to}; pass another"
            " version or commit as TO="
        )
    g.user_identity(user or patch_dir)  # the rebased commits are the user's: refuse first

    work = base_mod.WORK_DIR / "rebase" / slug
    keep_in_user = keep_conflict and user is not None
    branch = f"{manifest.name}/v{manifest.version}-rebase-onto-{slug}"
    if keep_in_user:
        guard.enter_context(journal.locked(user))
        refuse_unsafe_state(user)
        branch = _free_branch(user, branch)

    scratch = work / "vllm"
    sess = Session(
        to=to, slug=slug, kind=kind, keep=keep_conflict, skip_tests=skip_tests,
        phase="running", pid=os.getpid(), work=str(work), scratch=str(scratch),
        checkout=str(user if keep_in_user else scratch), branch=branch,
        patch_dir=str(patch_dir), command="",
        user_checkout=str(user) if keep_in_user else "", vllm=str(user) if user else "",
        pip_args=list(pip_args),
        patches=[PatchStatus(p.file, p.subject, p.patch_id) for p in manifest.patches],
    )  # fmt: skip
    sess.command = sess.make(TO=to, KEEP="1" if keep_conflict else None)
    if sess.failed_tests_path.is_file():  # a failure stays in the record of the next run
        sess.tests_failed = sess.failed_tests_path.read_text(encoding="utf-8")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    sess.save()
    log(f"on success this replaces the patches and manifest in {patch_dir} and updates"
        f" {seriesdoc.DOC_NAME} beside it; until then nothing there changes")  # fmt: skip
    try:
        # The rebase's input, frozen: later steps never read patch_dir again.
        sess.old_patch_dir.mkdir(parents=True)
        for item in [*sorted(patch_dir.glob("*.patch")), patch_dir / MANIFEST]:
            shutil.copyfile(item, sess.old_patch_dir / item.name)
        _prepare(sess, manifest, user, new_commit, log)
        _apply_remaining(sess, log)
        return _finish(sess, log, guard)
    except BaseException:
        # Undone, unless it stopped for manual resolution (--continue / --abort).
        current = Session.load()
        kept = current is not None and current.keep and current.phase in ("conflict", "applied")
        if not kept or interrupts.pending() is not None:
            _discard(sess, log)
        raise


def _free_branch(repo: Path, branch: str) -> str:
    """``branch``, or ``branch-2``, ``-3``...: the first name ``repo`` has no branch of."""
    name, n = branch, 1
    while g.rev(repo, f"refs/heads/{name}"):
        n += 1
        name = f"{branch}-{n}"
    return name


def _old_manifest(sess: Session) -> manifest_mod.Manifest:
    return manifest_mod.load(sess.old_patch_dir / MANIFEST)


def _prepare(
    sess: Session,
    manifest: manifest_mod.Manifest,
    user: Path | None,
    new_commit: str | None,
    log: Log,
) -> None:
    """Scratch clone with both bases, the old series rebuilt, the new branch made."""
    scratch = Path(sess.scratch)
    mb = manifest.base
    if sess.kind == "version":
        version = sess.slug
        new_repo, new_commit, sha256 = base_mod.materialise(
            mb.project, version, None, pip_args=sess.pip_args, log=log
        )
        base_mod.clone(new_repo, scratch)
        sess.target = {
            "version": version,
            "upstream_commit": base_mod.cached_upstream_commit(mb.project, version, sha256) or "",
            "sdist_filename": base_mod.sdist_filename(mb.project, version),
            "sha256": sha256,
        }
    else:
        assert user is not None and new_commit is not None
        g.git(user.parent, "clone", "-q", "--shared", "--no-checkout", str(user), str(scratch))
        g.git(scratch, "checkout", "-q", "--detach", new_commit)
        # check_prefixes-style consumers clone the ``base`` branch.
        g.git(scratch, "branch", "-f", base_mod.BASE_BRANCH, new_commit)
        described = g.out(user, "describe", "--tags", "--always", new_commit)
        sess.target = {
            "version": described[1:] if re.match(r"v\d", described) else described,
            "upstream_commit": g.out(user, "rev-parse", "--short=9", new_commit),
            "sdist_filename": "",
            "sha256": "",
        }
    sess.new_base = new_commit
    # The old base commit, made readable in the scratch clone.
    sess.old_base = (g.rev(scratch, mb.commit) if mb.commit else None) or ""
    if not sess.old_base:
        if not mb.sdist.sha256:
            raise SeriesError(
                f"the series' base commit {mb.commit} is not in the checkout and the manifest"
                " names no sdist to rebuild it from; pass VLLM= a checkout that contains it"
            )
        repo, sess.old_base, _sha = base_mod.materialise_pinned(
            manifest, pip_args=sess.pip_args, log=log
        )
        scratch_mod.add_alternate(scratch, repo)
        g.git(scratch, "update-ref", "refs/series/old-base", sess.old_base)
    # ``old..new`` of upstream history, when both bases share it (else None:
    # bases imported from sdists are unrelated root commits).
    for old in [g.rev(scratch, ref) for ref in (mb.upstream_commit, sess.old_base) if ref]:
        merge_base = g.git(scratch, "merge-base", old, new_commit, check=False) if old else None
        if old != new_commit and merge_base and merge_base.returncode == 0:
            sess.history_range = f"{old}..{new_commit}"
            break
    sess.save()

    # The old series on the old base: the left side of the range-diff.
    old_patches = [sess.old_patch_dir / p.file for p in sess.patches]
    g.git(scratch, "checkout", "-q", "-b", OLD_BRANCH, sess.old_base)
    try:
        patchset.am(scratch, old_patches)
    except SeriesError as e:
        raise SeriesError(
            f"the current series does not apply to its own base {mb.project} {mb.version}"
            f" ({sess.old_base[:12]}): {e}\nrun `{hints.make('test')}` and fix the series first"
        ) from None
    sess.old_tip = g.rev(scratch, "HEAD") or ""

    checkout = Path(sess.checkout)
    if checkout == scratch:
        g.git(scratch, "checkout", "-q", "-b", sess.branch, new_commit)
    else:
        log(f"working in your checkout {checkout} on new branch {sess.branch}")
        if sess.kind == "version":  # the sdist's base, as `make apply`'s refusal fetches it
            g.git(checkout, "fetch", "-q", "--no-tags", "--no-write-fetch-head", str(new_repo),
                  base_mod.BASE_BRANCH)  # fmt: skip
        _switch_user_checkout(checkout, sess.branch, new_commit, old_patches, scratch, log)
    sess.save()
    log(f"rebasing {len(sess.patches)} patches from {mb.project} {mb.version} onto"
        f" {sess.target['version']} ({new_commit[:12]}) in {checkout}")  # fmt: skip


def _switch_user_checkout(
    checkout: Path, branch: str, new_commit: str, patches, scratch: Path, log
) -> None:
    """Put the user's checkout on a new ``branch`` at ``new_commit``, as ``apply``
    switches it, its journal kept for the session; refused, changing nothing,
    when a file of the user's is where the new base or a patch puts one.  The
    blobs the patches' ``index`` lines name are copied in from ``scratch``:
    ``git am --3way`` and the placement check need them, and a checkout of
    another upstream revision may lack them."""
    head = g.out(checkout, "rev-parse", "--verify", "HEAD")
    # What the session may write: the files that differ at the new base, and
    # the patches' files, with whatever content `git am` and a resolution give.
    diff = g.out(checkout, "diff", "--name-status", "--no-renames", "-z", head, new_commit)
    fields = diff.split("\0")[:-1]  # status, path, status, path...
    moved = dict(zip(fields[1::2], fields[::2], strict=True))
    added = [path for path, status in moved.items() if status == "A"]
    created: dict[str, set[str]] = {
        path: {blob} for path, blob in g.blob_ids(checkout, new_commit, added).items() if blob
    }
    images, touched = patchset.images_and_paths(patches)
    for image in images:
        for path, (pre, post) in image.items():
            if pre is None and post is not None:
                created.setdefault(path, set()).add(post[1])
    at_head = g.tree_entries(checkout, head, sorted(created))
    created = {path: blobs for path, blobs in created.items() if path not in at_head}
    ref = f"refs/heads/{branch}"
    scope = journal.Scope(
        paths=dict.fromkeys([*moved, *(p for ps in touched for p in ps)]),
        refs={ref: None},
        am=True,
    )
    before = [("update-ref", "-m", "seriestool rebase", ref, new_commit, _NULL_OID)]
    hint = ", or rebase without KEEP=1 (your checkout is then only read),"
    switch(
        checkout, "rebase", head, new_commit, ref, scope, created, log, before, hint=hint, keep=True
    )
    blobs = {side[1] for image in images for pair in image.values() for side in pair if side}
    for oid in sorted(blobs):
        data = g.blob(scratch, oid)
        if not g.has_object(checkout, oid) and data is not None:  # else am names what it lacks
            g.git(checkout, "hash-object", "-w", "--no-filters", "--stdin", input=data, text=False)


def _apply_remaining(sess: Session, log: Log) -> None:
    """Apply patches from ``sess.next`` on; ``_stopped`` at a conflict."""
    checkout, scratch = Path(sess.checkout), Path(sess.scratch)
    images = patchset.images([sess.old_patch_dir / p.file for p in sess.patches])
    for i in range(sess.next, len(sess.patches)):
        entry = sess.patches[i]
        patch = sess.old_patch_dir / entry.file
        sess.next = i
        sess.pre_head = g.rev(checkout, "HEAD") or ""
        sess.save()
        # A commit of upstream history between the bases with the patch's ID.
        ids = (patchset.commit_patch_ids(scratch, sess.history_range,
                                         patchset.files_touched(scratch, patch))
               if sess.history_range else [])  # fmt: skip
        upstream = next((commit for commit, pid in ids if pid == entry.patch_id), None)
        # Only when the change is still there at the new base (upstream may
        # have reverted it since): its reverse must apply.
        if upstream and g.git(checkout, "apply", "--check", "-R", str(patch),
                              check=False).returncode == 0:  # fmt: skip
            entry.status = DROPPED_ABSORBED
            entry.how = f"patch ID is upstream commit {upstream[:12]}"
            log(f"{entry.file}: {entry.status}: {entry.how}")
            continue
        check = g.git(checkout, "apply", "--check", str(patch), check=False)
        plain = check.returncode == 0
        try:
            patchset.am(checkout, [patch], env=g.user_identity(checkout))
        except SeriesError as e:
            entry.status = CONFLICT
            why = patchset.failure_lines(checkout, f"{check.stderr}\n{e}", "the new base")
            log(f"{entry.file}: conflict")
            _stopped(sess, log, why)
        head = g.out(checkout, "rev-parse", "HEAD")
        disagree = placement.check(checkout, sess.pre_head, head, images[i], ours="the new base")
        if disagree:
            entry.status = CONFLICT
            log(f"{entry.file}: conflict (git am and the 3-way merge disagree)")
            if sess.keep:
                _leave_placement_conflict(sess, checkout, patch, images[i])
            _stopped(sess, log, disagree)
        if head == sess.pre_head:
            entry.status = DROPPED_ABSORBED
            entry.how = "no change after 3-way merge: upstream has it"
        else:
            entry.status, entry.how = APPLIED, "clean" if plain else "3-way merge"
        log(f"{entry.file}: {entry.status} ({entry.how})")
        _own_tests(sess, entry, log)
    sess.next = len(sess.patches)
    sess.conflict = ""
    sess.save()


def _own_tests(sess: Session, entry: PatchStatus, log: Log) -> None:
    """With ``--keep-conflict`` (and the tests on), the tests an applied patch adds
    or changes, run on the new base with it; ``_stopped`` there (the patch's
    commit open to amend) when they fail."""
    if not (sess.keep and not sess.skip_tests and entry.status == APPLIED):
        return
    checkout = Path(sess.checkout)
    tests = seriestest.patch_tests(checkout, sess.old_patch_dir / entry.file)
    if not tests:
        entry.tests = "none"
        return
    with contextlib.redirect_stdout(io.StringIO()):
        rc, summary, nodes = seriestest.run_pytest(
            checkout, tests, _old_manifest(sess).regression_tests.deselect
        )
    if rc == 0:
        entry.tests = "passed"
        return
    entry.status, entry.tests = TESTS_FAILED, f"FAILED: {', '.join(nodes) or summary}"
    log(f"{entry.file}: its tests fail on the new base")
    _stopped(sess, log, [f"tests: {entry.tests}", f"ran: pytest {' '.join(tests)}"])


def _leave_placement_conflict(
    sess: Session, checkout: Path, patch: Path, image: patchset.Image
) -> None:
    """For ``--keep-conflict``: the patch's ``git am`` stopped (by a failing
    ``pre-applypatch`` hook) before its commit, each disputed file holding the
    3-way merge from the recorded preimage, conflicts as unmerged stages."""
    g.git(checkout, "reset", "-q", "--hard", sess.pre_head)
    hooks = sess.work_dir / "stop-hook"
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / "pre-applypatch").write_text("#!/bin/sh\nexit 1\n")
    (hooks / "pre-applypatch").chmod(0o755)
    with contextlib.suppress(SeriesError):  # it stops: that is the point
        patchset.am(checkout, [patch], env=g.user_identity(checkout), hooks=hooks)
    target = g.tree_entries(checkout, sess.pre_head, sorted(image))
    index_info = []
    for path, (pre, post) in sorted(image.items()):
        if path not in target or pre is None or post is None or target[path][1] == pre[1]:
            continue
        merged, conflicts = placement.merge_file(checkout, target[path][1], pre[1], post[1])
        (checkout / path).write_bytes(merged)
        if conflicts:
            index_info += [f"0 {_NULL_OID}\t{path}", f"{pre[0]} {pre[1]} 1\t{path}",
                           f"{target[path][0]} {target[path][1]} 2\t{path}",
                           f"{post[0]} {post[1]} 3\t{path}"]  # fmt: skip
        else:
            g.git(checkout, "add", "--", path)
    if index_info:
        g.git(checkout, "update-index", "--index-info", input="\n".join(index_info) + "\n")


def _stopped(sess: Session, log: Log, why: list[str]) -> NoReturn:
    """A patch conflicted, or failed its tests (``why``): keep the session
    (``--keep-conflict``) or give up; raises what stopped it and what to do next."""
    folder = Path(sess.patch_dir).name
    entry = sess.patches[sess.next]
    sess.conflict = "\n".join([f"patch: {entry.file}", *why])
    sess.am_kept = g.operation_in_progress(Path(sess.checkout)) == "git am"
    verb, then = "conflicts with", f"then run\n    {_CONTINUE}\nor give up with\n    {_ABORT}\n"
    # What was resolved before this patch is dropped by --abort alone.
    resolved = sess.keep and any(p.how == RESOLVED or p.status in DROPPED[1:]
                                 for p in sess.patches[: sess.next])  # fmt: skip
    if entry.status == TESTS_FAILED or (sess.keep and (sess.am_kept or resolved)):
        interrupts.check()  # a Ctrl-C until here undoes the run; from here on it is kept
        sess.phase = "conflict"
        sess.save()
    if entry.status == TESTS_FAILED:
        result, verb = "STOPPED at a patch whose tests fail, left to fix", "fails its tests on"
        what = f"; it is applied, the last commit of branch {sess.branch} in {sess.checkout}."
        then = f"Fix it there (`git commit --amend`), {then}"
    elif sess.keep and sess.am_kept:
        result = "STOPPED at a conflict, left for manual resolution"
        what = (f"; the git am session is left in progress in {sess.checkout} (branch"
                f" {sess.branch}).")  # fmt: skip
        then = f"Resolve the files, `git add` them, {then}"
    elif resolved:
        result = "STOPPED at a conflict git am left no session for; your resolutions are kept"
        what = (f", and git am stopped without leaving a session in {sess.checkout}; what"
                f" you resolved before it is kept there (branch {sess.branch}).")  # fmt: skip
        then = f"Make its change by hand as one commit, {then}"
    elif sess.keep:
        # git am gave up without a session to resume (nothing in the checkout to
        # resolve): --continue could only mistake a kept run for a skip.
        result = "CONFLICT: rebase stopped, no git am session to keep"
        what = (f", and git am stopped without leaving a session to resolve in {sess.checkout};"
                f" nothing was kept: your checkouts and {folder}/ are as they were.")  # fmt: skip
        then = ""
    else:
        result = "CONFLICT: rebase stopped"
        what = f"; nothing was changed (your checkouts and {folder}/ are as they were)."
        then = (
            f"To resolve it by hand, keep the conflict with\n    {sess.make(TO=sess.to, KEEP=1)}\n"
        )
    _write_report(sess, result, "unchanged", log)
    if sess.phase != "conflict":
        _discard(sess, log)
    raise SeriesError(
        f"{entry.file} {verb} {sess.target['version']}{what}\n"
        f"{textwrap.indent(sess.conflict, '  ')}\n{then}report: {sess.report_path}"
    )


@interrupts.shielded()
def _discard(sess: Session, log: Log, force_command: str | None = None) -> None:
    """Abort any am, restore the user's checkout, remove scratch work and state
    (``force_command``: first refuse, changing nothing, when the checkout
    changed in ways the rebase could not have made)."""
    if sess.user_checkout:
        checkout = _restore_checkout(sess, log, force_command)
        branch = f"refs/heads/{sess.branch}"
        if checkout.exists() and (tip := g.rev(checkout, branch)):
            g.git(checkout, "update-ref", "-d", branch, tip)
    for folder in (sess.scratch, sess.old_patch_dir, sess.staging, sess.work_dir / "stop-hook"):
        shutil.rmtree(folder, ignore_errors=True)
    state_path().unlink(missing_ok=True)
    # A run refused before it wrote a report leaves no folder behind; a report
    # (a conflict, failing tests, a success) keeps its work/rebase/<to>/.
    for folder in (sess.work_dir, state_path().parent):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty (or already gone)


def _restore_checkout(sess: Session, log: Log, force_command: str | None, keep=()) -> Path:
    """The user's checkout put back as journaled (``keep``: refs it made that stay)."""
    checkout = Path(sess.user_checkout)
    tx = journal.Transaction.load(checkout) if checkout.exists() else None
    if tx is not None:
        if force_command:
            tx.foreign_changes(force_command)
        for note in tx.rollback(keep_refs=keep):
            log(note)
    return checkout


def _clear_stale_session(log: Log) -> None:
    """Refuse while a session is open; discard the scratch work of a killed run."""
    sess = Session.load()
    if sess is None:
        return
    # "applied" too: its process goes on with the tests and the write.
    if sess.phase in ("running", "applied", "swapping") and journal.pid_alive(sess.pid):
        raise SeriesError(
            f"a rebase to {sess.to} is running (pid {sess.pid}); wait for it. If no such"
            f" process exists, delete {state_path()} and run again"
        )
    if sess.phase == "swapping":
        log(f"the rebase to {sess.to} was interrupted while replacing"
            f" {sess.patch_dir}; that replacement has been completed")  # fmt: skip
        _discard(dataclasses.replace(sess, user_checkout=""), log)
        return
    if sess.resumable or (sess.keep and sess.phase != "running"):
        what = {
            "running": f"stopped for your resolution in {sess.checkout}, then interrupted;"
            " what you resolved is kept there",
            "conflict": f"stopped at a conflict in {sess.checkout}",
            "applied": "applied but not finished (a later step failed)",
        }.get(sess.phase, sess.phase)
        raise SeriesError(f"a rebase to {sess.to} is in progress ({what}); {hints.REBASE_OPEN}")
    if sess.keep and sess.user_checkout:  # interrupted while running
        raise SeriesError(
            f"a rebase to {sess.to} was interrupted while working in {sess.checkout}."
            " Undo what it did there, and nothing else, with:\n"
            f"    {_ABORT}\n(it refuses, changing nothing, if the"
            " checkout has changed since in ways the rebase could not have made)"
        )
    log(f"discarding the scratch work of an interrupted rebase to {sess.to}"
        f" (pid {sess.pid}); {Path(sess.patch_dir).name}/ was not touched")  # fmt: skip
    _discard(sess, log)


@interrupts.deferring
def resume(
    log: Log = print, force: bool = False, skip_tests: bool = False, *, guard: interrupts.Guard
) -> int:
    """``--continue``: finish the stopped patch, apply the rest, then succeed
    (``skip_tests`` from now on; ``force``: put the checkout back also when it
    changed in ways the rebase could not have made)."""
    sess = _open_session(guard, log)
    if sess is None:
        return 0
    if sess.phase == "running" and not sess.resumable:
        raise SeriesError(
            f"the rebase to {sess.to} was interrupted, not stopped at a conflict; undo it"
            f" with\n    {_ABORT}\nand start again"
        )
    sess.phase, sess.pid = "running", os.getpid()
    sess.skip_tests = sess.skip_tests or skip_tests
    sess.save()
    try:
        entry = sess.patches[sess.next] if sess.next < len(sess.patches) else None
        checkout = Path(sess.checkout)
        if entry is not None and entry.status == PENDING:  # an interrupted run's, cut short
            if g.operation_in_progress(checkout) == "git am":
                g.git(checkout, "am", "--abort")
            if g.rev(checkout, "HEAD") != sess.pre_head:
                g.git(checkout, "reset", "-q", "--hard", sess.pre_head)
                log(f"{entry.file}: applying it again (an interrupted run left it)")
        elif entry is not None and entry.status in (CONFLICT, TESTS_FAILED):
            _finish_conflicted_patch(sess, log)
            _own_tests(sess, entry, log)
            sess.next += 1
            sess.save()
        _apply_remaining(sess, log)
        force_command = None if force else hints.make("rebase", CONTINUE="1", FORCE="1")
        return _finish(sess, log, guard, force_command)
    except BaseException:
        current = Session.load()
        if current is not None and current.phase == "running":
            current.phase = "conflict" if current.next < len(current.patches) else "applied"
            current.save()
        raise


def _open_session(guard: interrupts.Guard, log: Log) -> Session | None:
    """The open session, its checkout locked as ``start`` locks it; None when it
    had completed (a killed run's swap of ``patches/`` is finished here)."""
    sess = Session.load()
    if sess is not None and sess.user_checkout:
        guard.enter_context(journal.locked(Path(sess.user_checkout)))
        sess = Session.load()  # as a run that held the lock until now left it
    if sess is None:
        raise SeriesError("no rebase is in progress; start one with make rebase TO=<a version>")
    recover_swap(Path(sess.patch_dir), log)
    if sess.phase in ("running", "swapping") and journal.pid_alive(sess.pid):
        raise SeriesError(f"the rebase to {sess.to} is still running (pid {sess.pid})")
    if sess.phase == "swapping":
        _clear_stale_session(log)
        log(f"the rebase to {sess.to} had completed; {sess.patch_dir} holds the rebased series")
        return None
    return sess


def _finish_conflicted_patch(sess: Session, log: Log) -> None:
    """The stopped patch as the user left it: a conflict resolved (``git am
    --continue``) or skipped, or a patch whose tests failed amended."""
    checkout = Path(sess.checkout)
    entry = sess.patches[sess.next]
    if entry.status == CONFLICT and g.operation_in_progress(checkout) == "git am":
        unmerged = g.out(checkout, "diff", "--name-only", "--diff-filter=U").splitlines()
        if unmerged:
            raise SeriesError(
                f"{entry.file}: still unmerged in {checkout}: {', '.join(unmerged)}; resolve"
                f" them, `git add` them and run `{_CONTINUE}` again"
            )
        check = g.git(checkout, "diff", "--cached", "--check", check=False).stdout
        markers = sorted({line.split(":")[0] for line in check.splitlines()
                          if "leftover conflict marker" in line})  # fmt: skip
        if markers:
            raise SeriesError(
                f"{entry.file}: conflict markers are still staged in {', '.join(markers)}"
                f" ({checkout}); finish resolving, `git add` and run"
                f" `{_CONTINUE}` again"
            )
        proc = g.git(checkout, "am", "--continue", check=False, env=g.user_identity(checkout))
        if proc.returncode != 0:
            staged = g.git(checkout, "diff", "--cached", "--quiet", check=False).returncode
            if staged == 0 and "No changes" in proc.stdout + proc.stderr:
                g.git(checkout, "am", "--skip")
                entry.status = DROPPED_RESOLVED
                entry.how = "your resolution left no change (git am --continue: No changes)"
                log(f"{entry.file}: {entry.status}: {entry.how}")
                return
            raise SeriesError(
                f"git am --continue failed in {checkout}: {(proc.stderr or proc.stdout).strip()}"
            )
    elif (
        entry.status == CONFLICT and not sess.am_kept and g.rev(checkout, "HEAD~1") != sess.pre_head
    ):
        # The rebase never left a session here (or its state predates the
        # record): a clean checkout is not the user's consent to skip; one
        # commit of the change, made by hand, is its resolution.
        where = g.operation_in_progress(checkout)
        raise SeriesError(
            f"{entry.file}: no git am session is in progress in {checkout}"
            + (f" ({where} is)" if where else "")
            + f", and the rebase did not leave one there: there is nothing to continue,"
            f" and {entry.file} is not skipped. Give up and restore the checkout with\n"
            f"    {_ABORT}"
        )
    head = g.rev(checkout, "HEAD")
    if head == sess.pre_head:
        entry.status = DROPPED_SKIPPED
        entry.how = "git am --skip during manual resolution: its change is given up"
    elif g.rev(checkout, "HEAD~1") == sess.pre_head:  # a patch whose tests failed keeps its how
        entry.status, entry.how = APPLIED, entry.how if entry.status == TESTS_FAILED else RESOLVED
    else:
        raise SeriesError(
            f"{checkout} moved from {sess.pre_head[:12]} to {(head or '?')[:12]} by more than"
            f" the one commit of {entry.file}; put the branch back or run ABORT=1"
        )
    log(f"{entry.file}: {entry.status} ({entry.how})")


@interrupts.deferring
def abort(log: Log = print, force: bool = False, *, guard: interrupts.Guard) -> int:
    """``--abort``: abort the am session, restore the checkout, remove the state
    (refused, unless ``force``, when that would undo changes the rebase did not make)."""
    sess = _open_session(guard, log)
    if sess is None:
        return 0
    _discard(sess, log, None if force else hints.make("rebase", ABORT="1", FORCE="1"))
    where = f"{sess.checkout} restored" if sess.user_checkout else "the scratch clone removed"
    what = f"rebase to {sess.to} aborted; {where}, {Path(sess.patch_dir).name}/ unchanged"
    if sess.resumable:
        what += "; the conflict resolutions made by hand are dropped"
    log(what)
    if sess.report_path.exists():  # it said what to do next: now there is nothing
        text = sess.report_path.read_text(encoding="utf-8", errors="surrogateescape")
        text = re.sub(r"\n\nThe rebase is stopped in[^\n]*", "", text)
        text = re.sub(
            r"^Result: .*", lambda _: f"Result: **ABORTED** ({what})", text, count=1, flags=re.M
        )
        sess.report_path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return 0


def _finish(
    sess: Session, log: Log, guard: interrupts.Guard, force_command: str | None = None
) -> int:
    """Export, manifest, range-diff, tests; then (and only then) swap patches/
    (``force_command``: as for ``_discard``)."""
    if not any(p.status == APPLIED for p in sess.patches):
        # Like `export` of an empty range: an empty series is never written.
        raise SeriesError(
            "the rebased series would have no patches ("
            + ", ".join(f"{p.file}: {p.status}" for p in sess.patches)
            + f"): it would delete the series; {Path(sess.patch_dir).name}/ is unchanged."
            + (f" Give up with\n    {_ABORT}" if sess.keep else "")
        )
    scratch = Path(sess.scratch)
    checkout = Path(sess.checkout)
    if sess.user_checkout:
        g.git(scratch, "fetch", "-q", "--no-write-fetch-head", str(checkout),
              f"+refs/heads/{sess.branch}:{NEW_REF}")  # fmt: skip
        # The user's checkout goes back exactly where it was; the branch stays.
        _restore_checkout(sess, log, force_command, keep={f"refs/heads/{sess.branch}"})
    else:
        g.git(scratch, "update-ref", NEW_REF, "HEAD")
    new_tip = sess.new_tip = g.rev(scratch, NEW_REF) or ""
    sess.phase = "applied"
    sess.save()

    shutil.rmtree(sess.staging, ignore_errors=True)
    sess.staging.mkdir(parents=True)
    files = export_mod.format_patches(scratch, sess.new_base, new_tip, sess.staging)
    applied = [p for p in sess.patches if p.status == APPLIED]
    if len(files) != len(applied):
        raise SeriesError(
            f"{len(applied)} patches applied but {sess.new_base[:12]}..{sess.branch} holds"
            f" {len(files)} commits; was the branch changed by hand? run ABORT=1"
        )
    for entry, f in zip(applied, files, strict=True):
        entry.new_file = f.name
    # The old manifest, its base the target and its patches the rebased ones
    # (``previous`` kept, less entries of patches that were dropped).
    manifest = _old_manifest(sess)
    t = sess.target
    manifest.base = manifest_mod.Base(
        project=manifest.base.project,
        version=t["version"],
        upstream_commit=t["upstream_commit"],
        sdist=manifest_mod.Sdist(t["sdist_filename"], t["sha256"]),
        commit=sess.new_base,
        touched_files={},
    )
    manifest = export_mod.refresh_manifest(manifest, scratch, sess.new_base, files, log)
    manifest.save(sess.staging / MANIFEST)
    check_manifest.refuse(
        manifest, sess.staging, "the exported series fails its own manifest check", ""
    )
    range_diff = rangediff.range_diff(scratch, sess.old_base, sess.old_tip, sess.new_base,
                                      new_tip)  # fmt: skip
    sess.uses_dropped = _uses_of_dropped(sess, scratch, new_tip)
    for line in sess.uses_dropped:
        log(f"warning: {line}")
    sess.save()

    if sess.skip_tests:
        sess.tests = "skipped (NOTEST=1)"
        ok = True
    else:
        _write_report(sess, "running the series' tests", "unchanged", log, range_diff, quiet=True)
        ok, sess.tests = _run_tests(sess, manifest, log)
    if not ok:
        sess.tests_failed = sess.tests
        sess.save()
        sess.failed_tests_path.write_text(sess.tests, encoding="utf-8")
        _write_report(sess, "TESTS FAILED on the new base", "unchanged: nothing written", log,
                      range_diff)  # fmt: skip
        failed = seriestest.FAILED_STEP
        steps = [s.removeprefix(failed) for s in sess.tests.splitlines() if s.startswith(failed)]
        if sess.keep:
            after = (
                f"fix the environment and run\n    {_CONTINUE}\nor"
                f" give up with\n    {_ABORT}\nor finish without"
                f" the tests with\n    {hints.make('rebase', CONTINUE='1', NOTEST='1')}"
            )
        else:
            _discard(sess, log)
            after = f"to rebase without the tests, run\n    {sess.make(TO=sess.to, NOTEST='1')}"
        raise SeriesError(
            f"the rebased series' tests did not pass on {sess.target['version']}"
            f" ({sess.tests.splitlines()[0]}):\n  "
            + "\n  ".join(steps or ["see the report"])
            + f"\nnothing was written into {sess.patch_dir}. report: {sess.report_path}\n"
            + after
        )

    patch_dir = Path(sess.patch_dir)
    outcome = (
        f"replaced: {len(files)} patches"
        + "".join(
            f", {n} {status}"
            for status in DROPPED
            if (n := sum(p.status == status for p in sess.patches))
        )
        + f", base {manifest.base.project} {manifest.base.version}"
    )
    result = "SUCCESS" + (", but later patches use dropped ones (below)" if sess.uses_dropped
                          else "")  # fmt: skip
    if sess.tests_failed and sess.skip_tests:
        result += ", the tests skipped after they FAILED (below)"
    _write_report(sess, result, outcome, log, range_diff, quiet=True)
    interrupts.check()  # the last moment a signal undoes the rebase
    sess.phase = "swapping"
    sess.save()
    with interrupts.shielded():
        swap_in(sess.staging, patch_dir)
        seriesdoc.sync(manifest, patch_dir, log)
        if sess.user_checkout:
            log(f"your checkout {checkout} is back where it was; branch {sess.branch}"
                " holds the rebased series")  # fmt: skip
            sess.user_checkout = ""  # keep the branch: do not delete it on cleanup
        elif sess.kind == "version":  # a VLLM= checkout is only read
            _keep_branch(sess, manifest, log)
    guard.completed()
    _write_report(sess, result, outcome, log, range_diff)
    sess.failed_tests_path.unlink(missing_ok=True)  # the report holds it now
    _discard(sess, log)
    return 0


def _keep_branch(sess: Session, manifest: manifest_mod.Manifest, log: Log) -> None:
    """Keep the rebased series as the branch ``apply`` would make, in the default
    checkout (made from the new base if absent): only a ref and its objects are
    added.  A failure is a note: ``patches/`` holds the result."""
    checkout = default_checkout()
    new_repo = base_mod.base_repo_path(manifest.base.project, manifest.base.version)
    try:
        fresh = not checkout.exists()
        if fresh:
            base_mod.clone(new_repo, checkout)
        else:  # borrow the new base's objects: nothing copied
            g.checkout_top(checkout)  # a folder in this repository is no checkout of its own
            scratch_mod.add_alternate(checkout, new_repo)
        branch = _free_branch(checkout, manifest.branch_name)
        g.git(checkout, "fetch", "-q", "--no-tags", "--no-write-fetch-head", sess.scratch,
              f"{NEW_REF}:refs/heads/{branch}")  # fmt: skip
        # As apply records it: status, remove and export know the branch.
        g.git(checkout, "config", f"branch.{branch}.{SERIES_BASE_KEY}", sess.new_base)
        if fresh:
            g.git(checkout, "checkout", "-q", branch)
    except SeriesError as e:
        log(f"note: the rebased branch could not be kept in {checkout} ({e});"
            f" {sess.patch_dir} holds the rebased series")  # fmt: skip
        return
    sess.kept_branch = f"{checkout}\t{branch}"
    where = "" if fresh else f"; to use it there:\n    {hints.git(checkout, 'checkout', branch)}"
    log(f"branch {branch} in {checkout} holds the rebased series{where}")


# A name a patch defines: a function, a class, or a module-level assignment.
_DEFINED = re.compile(r"^\+\s*(?:def|class)\s+(\w+)|^\+([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", re.M)


def _uses_of_dropped(sess: Session, scratch: Path, new_tip: str) -> list[str]:
    """ "patch N uses X from dropped patch M": a name a patch dropped by hand
    (skipped, or resolved to no change) defined, used in a later patch's added
    lines, and defined nowhere at the rebased tip."""
    found = []
    for i, gone in enumerate(sess.patches):
        if gone.status not in (DROPPED_RESOLVED, DROPPED_SKIPPED):
            continue
        text = (sess.old_patch_dir / gone.file).read_text(encoding="utf-8", errors="replace")
        names = {a or b for a, b in _DEFINED.findall(text)}
        for later in sess.patches[i + 1 :]:
            if later.status != APPLIED or not later.new_file:
                continue
            diff = (sess.staging / later.new_file).read_text(encoding="utf-8", errors="replace")
            added = "\n".join(re.findall(r"^\+(?!\+\+).*", diff, re.M))  # not "+++ b/..."
            for name in sorted(n for n in names if re.search(rf"\b{re.escape(n)}\b", added)):
                pattern = rf"^\s*(def|class)\s+{name}\b|^{name}\s*(:[^=]*)?="
                if g.git(scratch, "grep", "-q", "-E", "-e", pattern, new_tip, "--", "*.py",
                         check=False).returncode != 0:  # fmt: skip
                    found.append(f"patch {later.new_file[:4]} uses {name} from dropped"
                                 f" patch {gone.file[:4]}")  # fmt: skip
    return found


class _Tee(io.StringIO):
    """Keeps what is written, and passes it on to ``stream``."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text)
        return super().write(text)


def _run_tests(sess: Session, manifest: manifest_mod.Manifest, log: Log) -> tuple[bool, str]:
    """``seriestest.check_prefixes`` on the staged series; (passed, summary)."""
    log(f"running the series' tests on {manifest.base.project} {manifest.base.version} ...")
    captured = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(captured):
            rc = seriestest.check_prefixes(manifest, sess.staging, base_repo=Path(sess.scratch)
                                           if sess.kind == "commit" else None)  # fmt: skip
    except SeriesError as e:
        return False, f"could not run: {e}"
    lines = captured.getvalue().rstrip().splitlines()
    # Prefix 0001..N is where patch N's own tests run: its failure is patch N's.
    failed = {m[1]: m[2] for line in lines if (m := _PREFIX_FAILED.match(line))}
    for entry in sess.patches:
        if entry.status == APPLIED:
            entry.tests = (
                f"FAILED: {failed[n]}" if (n := entry.new_file[:4]) in failed else "passed"
            )
    tail = "\n".join(lines[-30:])
    # The failed steps, kept whole however long the output before them.
    steps = [line for line in lines[:-30] if line.startswith(seriestest.FAILED_STEP)]
    verdict = "passed" if rc == 0 else f"FAILED (exit {rc})"
    return rc == 0, "\n".join(
        [f"{verdict}: seriestest.check_prefixes", *steps, "", "```", tail, "```"]
    )


_PREFIX_FAILED = re.compile(
    rf"^{seriestest.FAILED_STEP}(?:pytest on )?prefix 0001\.\.(\d{{4}}): (.*)"
)


def _write_report(
    sess: Session,
    result: str,
    patches_outcome: str,
    log: Log,
    range_diff: str | None = None,
    quiet: bool = False,
) -> None:
    old = _old_manifest(sess).base
    t = sess.target
    rows = [
        ("old", f"{old.project} {old.version}", old.upstream_commit or "-",
         old.commit[:12] or "-", old.sdist.sha256 or "-"),
        ("new", f"{old.project} {t.get('version', sess.to)}", t.get("upstream_commit") or "-",
         sess.new_base[:12] or "-", t.get("sha256") or "-"),
    ]  # fmt: skip
    patch_rows = [
        (i, p.file, p.status, p.how or "-", p.tests or "-", p.new_file or "-")
        for i, p in enumerate(sess.patches, 1)
    ]
    absorbed = (
        f"searched `{sess.history_range}`"
        if sess.history_range
        else "not computable (the bases share no git history; only 3-way emptiness counts)"
    )
    # Paragraphs, a blank line between each; code blocks fenced.
    out = [
        f"# Rebase onto {old.project} {t.get('version', sess.to)}",
        f"Command: `{sess.command}`",
        f"Result: **{result}**",
        f"{Path(sess.patch_dir).name}/: {patches_outcome}",
        "## Bases",
        _fenced(table(("", "release", "upstream commit", "base commit", "sdist sha256"), rows)),
        "## Patches",
        _fenced(table(("#", "old patch", "status", "how", "tests", "new patch"), patch_rows)),
        f"Absorbed-upstream check by patch ID: {absorbed}",
    ]
    skipped = [p.file for p in sess.patches if p.status == DROPPED_SKIPPED]
    if skipped:
        out.append(
            f"Skipped by hand (`git am --skip`): {', '.join(skipped)}. Their changes are"
            " not in the new series, and the rebase did not find them upstream."
        )
    if sess.conflict:
        out += ["## Conflict", _fenced(sess.conflict)]
        if sess.keep:
            out.append(
                f"The rebase is stopped in `{sess.checkout}` (branch `{sess.branch}`). Resolve"
                f" (or amend), `git add`, then `{_CONTINUE}`; or `{_ABORT}`."
            )
    if range_diff is not None:
        out += [
            "## Range-diff (old series vs new series)",
            f"`git range-diff {sess.old_base[:12]}..{sess.old_tip[:12]}"
            f" {sess.new_base[:12]}..{sess.new_tip[:12]}`",
            _fenced(range_diff or "(empty: both series are empty)"),
        ]
    if sess.uses_dropped:
        out += [
            "## Uses of dropped patches",
            "Later patches use what a dropped patch added; they will fail to load until it is"
            " restored or they are changed:",
            "\n".join(f"- {line}" for line in sess.uses_dropped),
        ]
    if sess.kept_branch:
        where, branch = sess.kept_branch.split("\t")
        out.append(f"The rebased series is branch `{branch}` in `{where}`.")
    if sess.tests:
        out += ["## Tests", sess.tests]
    if sess.tests_failed and sess.tests_failed != sess.tests:
        out += ["## Tests: an earlier run of this rebase FAILED", sess.tests_failed]
    text = "\n\n".join(out) + "\n"
    sess.report_path.parent.mkdir(parents=True, exist_ok=True)
    sess.report_path.write_text(text, encoding="utf-8", errors="surrogateescape")
    if not quiet:
        log(text)
        log(f"report written to {sess.report_path}")


def _fenced(text: str) -> str:
    return f"```\n{text}\n```"


def run(args: argparse.Namespace) -> int:
    cont = getattr(args, "continue")
    if sum([bool(args.to), cont, args.abort]) != 1:
        raise SeriesError("give exactly one of TO=<version or commit>, CONTINUE=1 and ABORT=1")
    if cont:
        return resume(force=args.force, skip_tests=args.skip_tests)
    if args.abort:
        return abort(force=args.force)
    patch_dir = Path(args.patches_dir) if args.patches_dir else manifest_mod.PATCH_DIR
    return start(args.to, Path(args.vllm) if args.vllm else None, args.keep_conflict,
                 args.skip_tests, patch_dir, args.pip_arg)  # fmt: skip


def register(subparsers) -> None:
    p = subparsers.add_parser("rebase", help="carry the series to another vLLM version or commit")
    p.add_argument("--to", help="vLLM version (PyPI sdist) or commit/tag (needs --vllm)")
    p.add_argument("--vllm", type=hints.user_path, help="checkout holding the commit (and,"
                   " with --keep-conflict, where a conflict is left for resolution)")  # fmt: skip
    for flag, help_ in (
        ("--continue", "resume after resolving a conflict and `git add`"),
        ("--abort", "abort and restore the checkout"),
        ("--force", "with --continue or --abort: put the checkout back also when it changed in"
         " ways the rebase could not have made, undoing those changes (FORCE=1)"),
        ("--keep-conflict", "on a conflict, leave the git am session for manual resolution"),
        ("--skip-tests", "do not run the series' tests on the new base (they run by default)"),
    ):  # fmt: skip
        p.add_argument(flag, action="store_true", help=help_)
    p.add_argument("--patches-dir", metavar="DIR", help="patch folder to rebase (default:"
                   " patches/), as `check` and `check-manifest`")  # fmt: skip
    # The old spelling, kept working but not advertised.
    p.add_argument("--patch-dir", dest="patches_dir", help=argparse.SUPPRESS)
    p.add_argument("--pip-arg", action="append", default=[], help="extra pip option for"
                   " fetching sdists, e.g. --pip-arg=--no-index")  # fmt: skip
    p.set_defaults(func=run)
