"""``check``: audit a consolidated branch against the patch series (docs/audit.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from . import base as base_mod
from . import check_manifest, hints, interrupts, patchset, rangediff
from . import git as g
from . import manifest as manifest_mod
from . import scratch as scratch_mod
from .errors import SeriesError
from .report import table

IDENTICAL = "identical"
COMBINED = "combined"
SPLIT = "split"
# The most consecutive commits a split patch is looked for in.
SPLIT_MAX = 4
CHANGED = "changed"
MISSING = "missing"
# Statuses that fail the audit unless accepted.
FAILING = (CHANGED, MISSING)

# Where the pinned base can be fetched from, by project.
UPSTREAM_REPOSITORIES = {"vllm": "https://github.com/vllm-project/vllm.git"}


@dataclasses.dataclass
class Accept:
    """One ``--accept KEY --reason TEXT``; ``used`` once it covered a finding."""

    key: str
    reason: str
    used: bool = False


@dataclasses.dataclass
class PatchResult:
    file: str
    subject: str
    patch_id: str | None
    status: str = MISSING
    commits: list[str] = dataclasses.field(default_factory=list)
    note: str = ""
    range_diff: str | None = None
    accepted: str | None = None  # the reason, when accepted


@dataclasses.dataclass
class ExtraCommit:
    commit: str
    subject: str
    paths: list[str]
    accepted: str | None = None


@dataclasses.dataclass
class FileState:
    path: str
    series: dict[str, str] | None  # {"mode", "blob"}; None: absent
    consolidated: dict[str, str] | None
    diff: str | None = None
    accepted: str | None = None

    @property
    def equal(self) -> bool:
        return self.series == self.consolidated


@dataclasses.dataclass
class Report:
    repo: str
    base: str
    consolidated_ref: str
    consolidated: str
    series_paths: list[str]
    patches: list[PatchResult]
    extra: list[ExtraCommit]
    files: list[FileState]
    accepts: list[Accept]
    consolidated_commits: int  # commits of BASE..CONSOLIDATED touching series paths
    seconds: float = 0.0

    def failures(self) -> list[str]:
        """Unaccepted findings, one short line each; empty when the audit passes."""
        found = [
            f"{p.file}: {p.status}"
            for p in self.patches
            if p.status in FAILING and p.accepted is None
        ]
        found += [f"extra commit {e.commit[:12]}" for e in self.extra if e.accepted is None]
        found += [
            f"end state differs: {f.path}" for f in self.files if not f.equal and f.accepted is None
        ]
        return found

    def to_dict(self) -> dict:
        failures = self.failures()
        return {
            "ok": not failures,
            "repo": self.repo,
            "base": self.base,
            "consolidated": {"ref": self.consolidated_ref, "commit": self.consolidated},
            "series_paths": self.series_paths,
            "consolidated_commits_touching_series_paths": self.consolidated_commits,
            "patches": [dataclasses.asdict(p) for p in self.patches],
            "extra": [dataclasses.asdict(e) for e in self.extra],
            "end_state": {
                "equal": all(f.equal for f in self.files),
                "files": [dict(dataclasses.asdict(f), equal=f.equal) for f in self.files],
            },
            "accepted": [dataclasses.asdict(a) for a in self.accepts],
            "failures": failures,
            "seconds": round(self.seconds, 3),
        }


def audit(
    repo: Path,
    consolidated_ref: str,
    base_ref: str,
    patch_files: Sequence[Path],
    accepts: Sequence[Accept] = (),
    creation_factor: int | None = None,
    pinned: manifest_mod.Base | None = None,
) -> Report:
    """Audit ``BASE..CONSOLIDATED`` of ``repo`` against the series ``patch_files``
    (``pinned``: the manifest's base, for the advice when BASE lacks blobs the
    series needs); raises SeriesError when the audit cannot run."""
    started = time.monotonic()
    repo = Path(repo)
    if g.git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise SeriesError(
            f"{repo} is not a git repository: run `{hints.make('apply')}` to produce the default"
            " checkout, or name the repository that holds the consolidated branch with"
            " VLLM="
        )
    base = _resolve(repo, base_ref, "base", "BASE= the commit the branch starts from")
    cons = _resolve(repo, consolidated_ref, "consolidated", "CONSOLIDATED=")
    if g.git(repo, "merge-base", "--is-ancestor", base, cons, check=False).returncode != 0:
        raise SeriesError(
            f"base {base_ref} ({base[:12]}) is not an ancestor of {consolidated_ref}"
            f" ({cons[:12]}): name the commit {consolidated_ref} was built on with"
            " BASE="
        )
    for path in patch_files:
        if not path.is_file():
            raise SeriesError(
                f"patch file {path} listed in the manifest does not exist:"
                f" run `{hints.make('check-manifest')}` to see how the two disagree"
            )

    images, touched = patchset.images_and_paths(patch_files)
    paths = sorted({p for each in touched for p in each})
    _refuse_unplaceable(repo, base_ref, base, images, pinned)
    results = [
        PatchResult(file=f.name, subject=patchset.subject_of_file(f), patch_id=None)
        for f in patch_files
    ]
    extra, files, cons_ids = [], [], []  # an empty series: nothing owned, nothing to compare
    if paths:
        # `:(literal)`: series paths are file names, never glob patterns.
        pathspecs = [f":(literal){p}" for p in paths]
        with scratch_mod.checkout(repo, base, paths) as scratch:
            # One pipeline over the whole consolidated range; commits touching
            # no series path are skipped by git itself.
            cons_ids = patchset.commit_patch_ids(scratch, f"{base}..{cons}", pathspecs)
            try:
                series_commits = scratch_mod.apply_patches(scratch, patch_files, images, "BASE")
            except SeriesError as e:
                raise SeriesError(
                    f"{e}\nso the series' result cannot be built: name the commit the series is"
                    " based on with BASE=, or rebase the series"
                ) from None
            extra, files = _classify(
                scratch, base, series_commits, cons, paths, cons_ids, results,
                creation_factor,
            )  # fmt: skip
    report = Report(
        repo=str(repo), base=base, consolidated_ref=consolidated_ref, consolidated=cons,
        series_paths=paths, patches=results, extra=extra, files=files, accepts=list(accepts),
        consolidated_commits=len(cons_ids),
    )  # fmt: skip
    _apply_accepts(report, repo)
    report.seconds = time.monotonic() - started
    return report


def _classify(scratch: Path, base: str, series_commits: list[str], cons: str, paths: list[str],
              cons_ids: list[tuple[str, str]], results: list[PatchResult],
              creation_factor: int | None,
              ) -> tuple[list[ExtraCommit], list[FileState]]:  # fmt: skip
    """Fill ``results`` in place; return the extra commits and the end state."""
    pathspecs = [f":(literal){p}" for p in paths]
    series_ids = patchset.patch_ids_of_commits(scratch, series_commits, pathspecs)
    for result, commit in zip(results, series_commits, strict=True):
        result.patch_id = series_ids.get(commit)
    cons_order = [c for c, _ in cons_ids]
    m = _Match(scratch, base, series_commits, cons_order, results, dict(cons_ids), pathspecs)
    unclaimed = m.unclaimed

    # identical: the same verbatim patch ID, each commit used once.
    for result in results:
        if commit := _claim(unclaimed, result.patch_id):
            result.status, result.commits = IDENTICAL, [commit]

    _find_combined(m)
    _find_split(m)
    if unclaimed and any(r.status == MISSING for r in results):
        _pair_with_range_diff(m, cons, creation_factor)

    # Subject and series paths of each extra commit, in range order: one `git log`.
    extras = [c for c in cons_order if c in unclaimed]
    extra = []
    if extras:
        raw = g.out(
            scratch, "log", "--no-walk=unsorted", "--stdin", "--no-color", "--format=%x01%H%x00%s",
            "--name-only", "--no-renames", "-z", "--", *pathspecs,
            input="".join(f"{c}\n" for c in extras),
        )  # fmt: skip
        for chunk in raw.split("\x01")[1:]:
            commit, subject, *names = chunk.split("\0")
            extra.append(
                ExtraCommit(commit, subject, [n.lstrip("\n") for n in names if n.strip("\n")])
            )
    return extra, _end_state(scratch, series_commits[-1], cons, paths)


@dataclasses.dataclass
class _Match:
    """What the matching steps share; ``unclaimed``: the consolidated commits no
    patch has claimed yet (commit -> patch ID, in range order)."""

    scratch: Path
    base: str
    series_commits: list[str]
    cons_order: list[str]
    results: list[PatchResult]
    unclaimed: dict[str, str]
    pathspecs: list[str]


def _find_combined(m: _Match) -> None:
    """Mark runs of consecutive unmatched patches squashed into one commit (docs/audit.md),
    longest runs first, so a squash of three is not reported as two."""
    results, unclaimed, series_commits = m.results, m.unclaimed, m.series_commits
    unmatched = [i for i, r in enumerate(results) if r.status == MISSING and r.patch_id]
    # (first, last) of every stretch of two or more consecutive unmatched patches.
    spans = [
        (a, b) for a in unmatched for b in unmatched if a < b and set(range(a, b)) <= set(unmatched)
    ]
    if not spans or not unclaimed:
        return
    ids = _span_ids(m, {(a, b): (series_commits[b], series_commits[a - 1] if a else m.base)
                        for a, b in spans})  # fmt: skip
    for first, last in sorted(spans, key=lambda s: (s[0] - s[1], s[0])):
        members = results[first : last + 1]
        if any(r.status != MISSING for r in members):
            continue
        commit = _claim(unclaimed, ids.get((first, last)))
        if not commit:
            continue
        names = [r.file.split("-", 1)[0] for r in members]
        for r in members:
            r.status, r.commits = COMBINED, [commit]
            r.note = "squashed with " + ", ".join(n for n in names if not r.file.startswith(n))


def _claim(unclaimed: dict[str, str], patch_id: str | None) -> str | None:
    """Remove and return the first unclaimed commit whose patch ID is ``patch_id``."""
    commit = next((c for c, pid in unclaimed.items() if patch_id and pid == patch_id), None)
    if commit:
        del unclaimed[commit]
    return commit


def _find_split(m: _Match) -> None:
    """Mark a still unmatched patch split into 2 to ``SPLIT_MAX`` consecutive
    unclaimed commits (docs/audit.md)."""
    results, unclaimed, cons_order = m.results, m.unclaimed, m.cons_order
    wanted = {r.patch_id: r for r in results if r.status == MISSING and r.patch_id}
    n = len(cons_order)
    spans = [(i, j) for i in range(n) for j in range(i + 1, min(i + SPLIT_MAX, n))
             if all(c in unclaimed for c in cons_order[i : j + 1])]  # fmt: skip
    if not wanted or not spans:
        return
    ids = _span_ids(m, {(i, j): (cons_order[j], f"{cons_order[i]}^") for i, j in spans})
    for (i, j), pid in ids.items():
        result, parts = wanted.get(pid), cons_order[i : j + 1]
        if result and result.status == MISSING and all(c in unclaimed for c in parts):
            for c in parts:
                del unclaimed[c]
            result.status, result.commits = SPLIT, parts
            result.note = f"split into {len(parts)} consecutive commits"


def _span_ids(m: _Match, spans: dict) -> dict:
    """The patch ID (on the series paths) of each span's combined diff, ``{key: (tip,
    parent)}``: of a synthetic commit of ``tip``'s tree on ``parent``."""
    made = {g.out(m.scratch, "commit-tree", f"{tip}^{{tree}}", "-p", parent, "-m", "span",
                  env=base_mod.BASE_IDENTITY): key
            for key, (tip, parent) in spans.items()}  # fmt: skip
    ids = patchset.patch_ids_of_commits(m.scratch, list(made), m.pathspecs)
    return {made[c]: pid for c, pid in ids.items()}


def _pair_with_range_diff(m: _Match, cons: str, creation_factor: int | None) -> None:
    """Pair still-missing patches with unclaimed commits by ``git range-diff`` of
    both histories on the series paths (docs/audit.md)."""
    scratch, base, unclaimed = m.scratch, m.base, m.unclaimed
    text = rangediff.range_diff(scratch, base, m.series_commits[-1], base, cons, creation_factor,
                                m.pathspecs)  # fmt: skip
    series_index = {c: i for i, c in enumerate(m.series_commits)}
    for pair in rangediff.parse(text):
        if pair.status not in "=!":
            continue
        # The headers' abbreviated ids: an ambiguous one resolves to None.
        lold, rold = g.rev(scratch, pair.left_sha), g.rev(scratch, pair.right_sha)
        if lold not in series_index or rold not in unclaimed:
            continue
        result = m.results[series_index[lold]]
        if result.status != MISSING:
            continue
        del unclaimed[rold]
        result.status, result.commits = CHANGED, [rold]
        result.range_diff = pair.body
        same = "IDs differ; range-diff shows no difference"
        result.note = "range-diff below" if pair.body.strip() else same


def _end_state(scratch: Path, series_tip: str, cons: str, paths: list[str]) -> list[FileState]:
    """Mode and blob of every series path at both tips; a ``git diff`` for each difference."""
    series, consolidated = (
        {path: {"mode": mode, "blob": oid} for path, (mode, oid) in entries.items()}
        for entries in (g.tree_entries(scratch, tip, paths) for tip in (series_tip, cons))
    )
    files = []
    for path in paths:
        state = FileState(path, series.get(path), consolidated.get(path))
        if not state.equal:
            state.diff = g.out(
                scratch, "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
                series_tip, cons, "--", f":(literal){path}",
            )  # fmt: skip
        files.append(state)
    return files


def _resolve(repo: Path, ref: str, what: str, option: str) -> str:
    commit = g.rev(repo, ref)
    if commit is None:
        raise SeriesError(f"{what} {ref!r} names no commit in {repo}: name it with {option}")
    return commit


def fetch_advice(repo: Path, pinned: manifest_mod.Base) -> str:
    """How to supply the pinned base: the fetch command, and the BASE= alternative."""
    url = UPSTREAM_REPOSITORIES.get(pinned.project)
    where = f"{pinned.project} v{pinned.version} (upstream commit {pinned.upstream_commit})"
    if g.out(repo, "rev-parse", "--is-shallow-repository") == "true":
        how = (
            f"{repo} is a shallow clone: its history stops before the base. Fetch the rest"
            f" of it, then run again:\n    {hints.git(repo, 'fetch', '--unshallow')}\n"
        )
    elif url:
        how = (
            f"Fetch {where} into the checkout, then run again (BASE then defaults to it):\n"
            f"    git -C {shlex.quote(str(repo))} fetch --no-tags {url} tag v{pinned.version}\n"
        )
    else:
        how = f"Fetch {where} into the checkout, then run again.\n"
    return how + (
        f"Or name the commit of this checkout that is {pinned.project} {pinned.version} with BASE=."
    )


def _refuse_unplaceable(
    repo: Path, base_ref: str, base: str, images, pinned: manifest_mod.Base | None
) -> None:
    """Refuse a BASE whose files are not the series' preimages when ``repo``
    lacks those preimage blobs: no 3-way merge could place the series there."""
    # Each path's first preimage: the earliest image's entry wins.
    first = {path: pre for image in reversed(images) for path, (pre, _post) in image.items()}
    at_base = g.tree_entries(repo, base, sorted(first))
    lacking = []
    for path, pre in sorted(first.items()):
        have = at_base[path][1] if path in at_base else None
        if pre is not None and have != pre[1] and not g.has_object(repo, pre[1]):
            what = f"blob {have[:12]}" if have else "no such file"
            lacking.append(f"{path}: BASE has {what}; the series' preimage is blob"
                           f" {pre[1][:12]}, which {repo} lacks")  # fmt: skip
    if lacking:
        advice = fetch_advice(repo, pinned) if pinned else "Name the series' base with BASE=."
        raise SeriesError(
            f"BASE {base_ref} ({base[:12]}) is not the series' base, and the repository"
            " lacks the blobs a 3-way merge would place the series with:\n  "
            + "\n  ".join(lacking) + "\n" + advice
        )  # fmt: skip


def _apply_accepts(report: Report, repo: Path) -> None:
    """Mark findings covered by ``--accept``: a patch number (``0002``) or file
    name, ``extra:<commit>``, ``file:<path>``; a key naming none is refused."""
    by_number = {p.file.split("-", 1)[0]: p for p in report.patches}
    by_file = {p.file: p for p in report.patches}
    files = {f.path: f for f in report.files}
    extras = {e.commit: e for e in report.extra}
    for acc in report.accepts:
        kind, _, value = acc.key.partition(":")
        if acc.key in by_file or acc.key in by_number:
            patch = by_file.get(acc.key) or by_number[acc.key]
            if patch.status in FAILING:
                patch.accepted, acc.used = acc.reason, True
        elif kind == "extra" and value:
            commit = g.rev(repo, value)
            if commit is None:
                raise SeriesError(
                    f"--accept {acc.key}: {value!r} names no commit in {report.repo};"
                    " use the commit id the report lists under extra"
                )
            if commit in extras:
                extras[commit].accepted, acc.used = acc.reason, True
        elif kind == "file" and value:
            if value not in files:
                raise SeriesError(
                    f"--accept {acc.key}: {value!r} is not a series-owned path;"
                    f" series-owned paths: {', '.join(files) or '(none)'}"
                )
            if not files[value].equal:
                files[value].accepted, acc.used = acc.reason, True
        else:
            raise SeriesError(
                f"--accept {acc.key!r} names no series patch: use a patch number"
                f" ({', '.join(by_number) or 'the series is empty'}), a patch file"
                " name, extra:<commit> or file:<path>"
            )


class _AcceptAction(argparse.Action):
    """``--accept KEY --reason TEXT``: each accept followed by its own reason."""

    def __call__(self, parser, namespace, values, option_string=None):
        pending = namespace.accepts = namespace.accepts or []
        if option_string == "--accept":
            if pending and pending[-1].reason == "":
                parser.error(
                    f"--accept {pending[-1].key} needs a --reason before the next --accept"
                )
            pending.append(Accept(key=values, reason=""))
        elif not pending or pending[-1].reason:
            parser.error("--reason must follow the --accept it explains")
        elif not values.strip():
            parser.error(f"--accept {pending[-1].key}: the reason must not be empty")
        else:
            pending[-1].reason = values


def _render_text(report: Report) -> str:
    lines = [
        f"Audit of {report.consolidated_ref} ({report.consolidated[:12]}) against"
        f" {len(report.patches)} series patches on base {report.base[:12]}",
        f"repository: {report.repo}",
        f"series-owned paths: {len(report.series_paths)}; consolidated commits touching"
        f" them: {report.consolidated_commits}",
        "",
    ]
    rows = []
    for p in report.patches:
        status = p.status + (" (accepted)" if p.accepted is not None else "")
        subject = p.subject if len(p.subject) <= 48 else p.subject[:45] + "..."
        rows.append([p.file, subject, status, ", ".join(c[:12] for c in p.commits), p.note])
    headers = ("patch", "subject", "status", "consolidated", "note")
    lines += (
        table(headers, rows, rule=False).splitlines()
        if report.patches
        else ["(the series is empty)"]
    )

    if report.extra:
        lines += ["", "Extra commits (touch series-owned files, no series counterpart):"]
        for e in report.extra:
            acc = f"  (accepted: {e.accepted})" if e.accepted is not None else ""
            lines.append(f"  {e.commit[:12]}  {e.subject}  [{', '.join(e.paths)}]{acc}")

    differ = [f for f in report.files if not f.equal]
    verdict = (
        f"{len(differ)} {'differs' if len(differ) == 1 else 'differ'} from"
        if differ
        else "all equal"
    )
    lines += [
        "",
        f"End state: {len(report.files)} series-owned files at the consolidated tip;"
        f" {verdict} the series' result",
    ]
    for f in differ:
        acc = f"  (accepted: {f.accepted})" if f.accepted is not None else ""
        lines.append(f"  differs  {f.path}{acc}")

    if report.accepts:
        lines += ["", "Accepted:"]
        for a in report.accepts:
            unused = "" if a.used else "  [unused: nothing to accept]"
            lines.append(f"  {a.key}: {a.reason}{unused}")

    for p in report.patches:
        if p.range_diff is not None:
            lines += ["", f"range-diff {p.file} -> {p.commits[0][:12]}:", p.range_diff]
    for f in differ:
        lines += [
            "",
            f"end-state diff {f.path} (series' result -> consolidated tip):",
            f.diff or "",
        ]

    failures = report.failures()
    lines += [
        "",
        f"Result: {'OK' if not failures else 'FAIL'} ({report.seconds:.2f} s)"
        + "".join(f"\n  {f}" for f in failures),
    ]
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="audit a consolidated branch against the series",
                              description=(
        "Classify every series patch as identical, combined, changed or missing in"
        " BASE..CONSOLIDATED, list extra commits touching series files, and compare the"
        " series-owned files at the tip. Exit 0: passes; 1: unaccepted findings; 2: the audit"
        " could not run."))  # fmt: skip
    p.add_argument("--consolidated", metavar="REF", help="branch or commit to audit (default:"
                   " the branch `make apply` creates)")  # fmt: skip
    p.add_argument("--vllm", metavar="PATH", type=hints.user_path, help="repository holding it"
                   " (default: work/vllm, the checkout `make apply` makes)")  # fmt: skip
    p.add_argument("--base", metavar="REF", help="commit the branch starts from (default: the"
                   " manifest's base commit)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    p.add_argument("--accept", metavar="KEY", action=_AcceptAction, help="accept a finding; KEY"
                   " is a patch number (0002) or file name, extra:<commit> or file:<path>; must"
                   " be followed by --reason")  # fmt: skip
    p.add_argument("--reason", metavar="TEXT", action=_AcceptAction,
                   help="why the preceding --accept is fine")  # fmt: skip
    p.add_argument("--creation-factor", type=int, metavar="N",
                   help="passed to git range-diff (default: git's 60)")  # fmt: skip
    p.add_argument("--patches-dir", type=Path, metavar="DIR",
                   help="series folder (default: patches/, or the manifest's folder)")  # fmt: skip
    p.add_argument("--manifest", type=Path, metavar="FILE",
                   help="manifest (default: patches/series.json)")  # fmt: skip
    p.set_defaults(func=run, accepts=None)


def run(args: argparse.Namespace) -> int:
    """The ``check`` command: print the report, return 0, 1 or 2 (see module doc)."""
    try:
        with interrupts.deferred():
            report = _run(args)
    except interrupts.Interrupted:
        raise
    except SeriesError as e:
        raise SeriesError(str(e), exit_code=2) from None
    print(json.dumps(report.to_dict(), indent=2) if args.json else _render_text(report))
    return 1 if report.failures() else 0


def _run(args: argparse.Namespace) -> Report:
    accepts = args.accepts or []
    if accepts and accepts[-1].reason == "":
        raise SeriesError(f'--accept {accepts[-1].key} needs a --reason "..." after it')
    # PATCHES= names a series folder: its manifest is the one beside its patches.
    patch_dir = args.patches_dir or (args.manifest.parent if args.manifest else None)
    manifest_path = args.manifest or (patch_dir or manifest_mod.PATCH_DIR) / "series.json"
    patch_dir = patch_dir or manifest_mod.PATCH_DIR
    manifest = manifest_mod.load(manifest_path)
    # The audit rebuilds the series from the patch files: ones that are not the
    # manifest's series would pass a branch against an edited series.
    check_manifest.refuse(
        manifest, patch_dir, f"the series in {patch_dir} disagrees with {manifest_path}, so"
        " there is no trustworthy series to audit against",
        f"\n{check_manifest.fix_series(patch_dir)}, then run the audit again",
    )  # fmt: skip
    repo = args.vllm or base_mod.WORK_DIR / "vllm"
    pinned = manifest.base
    if not args.base and g.git(repo, "rev-parse", "--git-dir", check=False).returncode == 0:
        # The materialised base commit, else the upstream commit it was made from.
        refs = (pinned.commit, pinned.upstream_commit)
        args.base = next((c for ref in refs if ref and (c := g.rev(repo, ref))), None)
        if args.base is None:
            raise SeriesError(
                f"the pinned base {pinned.project} {pinned.version} is not in {repo}: neither the"
                f" base commit {pinned.commit[:12]} (materialised from the sdist) nor the upstream"
                f" commit {pinned.upstream_commit} is there.\n" + fetch_advice(repo, pinned)
            )
    return audit(
        repo=repo,
        consolidated_ref=args.consolidated or manifest.branch_name,
        base_ref=args.base or manifest.base.commit,
        patch_files=manifest.patch_paths(patch_dir),
        accepts=accepts,
        creation_factor=args.creation_factor,
        pinned=pinned,
    )
