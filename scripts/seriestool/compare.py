"""``compare``: what changed from one version of the series to another (docs/compare.md)."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import base as base_mod
from . import changelog, hints, interrupts, patchset, rangediff, versions
from . import git as g
from . import manifest as manifest_mod
from . import scratch as scratch_mod
from .errors import SeriesError
from .report import table

TESTS_DIR = "tests/"
# A new patch comes from an old one when at least this share of its added
# text (by length, so short boilerplate lines weigh little) was added by it.
SPLIT_SHARE = 0.6
# Pairs two patches whatever their difference: range-diff's cost of leaving
# both unpaired is this percentage of their sizes, and their diff is never
# larger than the two together.
_FORCE_PAIR = 1000


@dataclasses.dataclass
class Patch:
    """A patch of one side, as applied in the scratch repository."""

    number: int  # 1-based position in its series
    file: str
    subject: str
    commit: str

    @property
    def tag(self) -> str:
        """``0003``: the file's number (its position if the name has none)."""
        prefix = self.file.split("-", 1)[0]
        return prefix if prefix.isdigit() else f"{self.number:04d}"


@dataclasses.dataclass
class Derivation:
    """A recorded ancestor of a new patch that is not its pair, and their range-diff."""

    old: Patch
    range_diff: str


@dataclasses.dataclass
class Change:
    """One range-diff pair and what it means for the changelog."""

    status: str  # "=", "!", "<", ">"
    old: Patch | None
    new: Patch | None
    paired_by: str = ""  # "range-diff", "subject", "manifest" or "" (unpaired)
    range_diff: str = ""  # the pair's range-diff body, for "!"
    kinds: list[str] = dataclasses.field(default_factory=list)
    code_paths: list[str] = dataclasses.field(default_factory=list)
    test_paths: list[str] = dataclasses.field(default_factory=list)
    message_changed: bool = False
    author_changed: bool = False
    moved: bool = False
    from_old: Patch | None = None  # a new patch: the old one most of its lines come from
    pieces: list[Patch] = dataclasses.field(default_factory=list)  # split: the new patches
    # A new patch: the old patches its "previous" entry names, and those of them
    # that are not its pair, each with their range-diff.
    recorded: list[Patch] = dataclasses.field(default_factory=list)
    derivations: list[Derivation] = dataclasses.field(default_factory=list)
    merged_into: Patch | None = None  # an old patch left unpaired that a new one records

    def to_dict(self) -> dict:
        def patch(p: Patch | None) -> dict | None:
            return None if p is None else dataclasses.asdict(p) | {"tag": p.tag}

        return {
            "status": self.status, "old": patch(self.old), "new": patch(self.new),
            "paired_by": self.paired_by or None, "kinds": self.kinds,
            "code_paths": self.code_paths, "test_paths": self.test_paths,
            "message_changed": self.message_changed, "author_changed": self.author_changed,
            "from_old": patch(self.from_old), "split_into": [p.tag for p in self.pieces],
            "recorded_from": [p.tag for p in self.recorded],
            "derivations": [{"old": patch(d.old), "range_diff": d.range_diff}
                            for d in self.derivations],
            "merged_into": patch(self.merged_into),
            "range_diff": self.range_diff if self.status == "!" else None,
        }  # fmt: skip


@dataclasses.dataclass
class Side:
    """One version of the series, applied."""

    state: versions.SeriesVersion
    manifest: manifest_mod.Manifest
    base: str | None  # None: an empty series needs no base
    patches: list[Patch]

    def to_dict(self, changes: Sequence[Change], old: bool) -> dict:
        """This side's patches, each with its pair's status and kinds."""
        pairs = {(c.old if old else c.new).number: c for c in changes if (c.old if old else c.new)}
        b = self.manifest.base
        return {
            "spec": self.state.spec or None, "label": self.state.label,
            "version": self.state.version, "commit": self.state.commit,
            "base": {"project": b.project, "version": b.version, "commit": self.base},
            "patches": [
                {"number": p.number, "tag": p.tag, "file": p.file, "subject": p.subject,
                 "status": c.status, "kinds": c.kinds,
                 "paired_with": getattr(c.new if old else c.old, "tag", None)}
                for p in self.patches for c in [pairs[p.number]]
            ],
        }  # fmt: skip


@dataclasses.dataclass
class Comparison:
    old: Side
    new: Side
    range_diff: str
    changes: list[Change]
    recorded_notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        if self.old.state.version != self.new.state.version:
            return self.recorded_notes
        return [
            f'both sides record version {self.new.state.version}: set "series": {{"version":'
            f" ...}} in {versions.PATCH_DIR}/{versions.MANIFEST} when cutting the next version"
        ] + self.recorded_notes

    def to_dict(self) -> dict:
        return {
            "from": self.old.to_dict(self.changes, old=True),
            "to": self.new.to_dict(self.changes, old=False),
            "pairs": [c.to_dict() for c in self.changes],
            "summary": dict(_summary(self.changes)),
            "range_diff": self.range_diff,
            "notes": self.notes,
            "draft": changelog.draft(self),
        }


def compare(repo: Path, from_spec: str, to_spec: str | None, vllm: Path | None) -> Comparison:
    """Compare the series at ``from_spec`` with ``to_spec`` (None: the working tree)."""
    if not g.is_repo(Path(repo)):
        raise SeriesError(f"{repo} is not a git checkout: --repo must name the series repository")
    repo = g.toplevel(Path(repo))
    old_state = versions.resolve(repo, from_spec)
    new_state = versions.resolve(repo, to_spec)
    with tempfile.TemporaryDirectory(prefix="seriestool-compare-") as tmp_name:
        tmp = Path(tmp_name)
        old_manifest = versions.write_patches(repo, old_state, tmp / "from")
        new_manifest = versions.write_patches(repo, new_state, tmp / "to")
        old_files = old_manifest.patch_paths(tmp / "from")
        new_files = new_manifest.patch_paths(tmp / "to")
        images, touched = patchset.images_and_paths(old_files + new_files)
        paths = sorted({p for each in touched for p in each})
        split = len(old_files)

        scratch: Path | None = None
        sides = []
        for state, manifest, files, side_images in (
            (old_state, old_manifest, old_files, images[:split]),
            (new_state, new_manifest, new_files, images[split:]),
        ):
            base: str | None = None
            commits: list[str] = []
            if files:  # an empty series needs no base
                source, base = _base_commit(state, manifest, vllm)
                if scratch is None:
                    scratch = scratch_mod.make_checkout(source, tmp / "scratch", base, paths)
                else:
                    scratch_mod.add_alternate(scratch, source)
                    g.git(scratch, "checkout", "-q", "--detach", base)
                b = manifest.base
                ours = f"its pinned base {b.project} {b.version} ({base[:12]})"
                try:
                    commits = scratch_mod.apply_patches(scratch, files, side_images, ours)
                except SeriesError as e:
                    raise SeriesError(f"{state.label}: {e}") from None
            patches = [
                Patch(n, f.name, patchset.subject_of_file(f), c)
                for n, (f, c) in enumerate(zip(files, commits, strict=True), 1)
            ]
            sides.append(Side(state, manifest, base, patches))
        old, new = sides
        if scratch is None:  # both series are empty
            return Comparison(old, new, "", [])

        # range-diff of the two applied ranges; an empty side is an empty range.
        old_base, new_base = old.base or new.base, new.base or old.base
        old_tip = old.patches[-1].commit if old.patches else old_base
        new_tip = new.patches[-1].commit if new.patches else new_base
        text = rangediff.range_diff(scratch, old_base, old_tip, new_base, new_tip)
        # range-diff's pairs, then unpaired patches of equal subject paired by subject.
        changes = []
        for pair in rangediff.parse(text):
            o = old.patches[pair.left - 1] if pair.left else None
            n = new.patches[pair.right - 1] if pair.right else None
            changes.append(Change(pair.status, o, n, "range-diff" if o and n else "", pair.body))
        _pair_unpaired(scratch, changes, "subject", lambda n: [manifest_mod.normalise(n.subject)])
        notes = _pair_recorded(scratch, old, new, changes)
        # "previous" names the patches of the version just before the newer one:
        # against an older one, a subject it names that is gone is no mistake.
        known = list(versions.known_versions(repo))
        before = (
            known[known.index(new.state.version) + 1 :] if new.state.version in known else known
        )
        notes = notes if not before or before[0] == old.state.version else []
        _mark_moved(changes)
        for change in changes:
            if change.status == "!":
                _compare_pair(scratch, change)
        _find_splits(scratch, changes)
        for change in changes:
            change.kinds = _kinds(change)
        return Comparison(old, new, text, changes, notes)


def _base_commit(state: versions.SeriesVersion, manifest, vllm: Path | None) -> tuple[Path, str]:
    """The repository holding the manifest's base commit (``vllm`` when it has
    it, else the base materialised from the pinned sdist), and that commit."""
    b = manifest.base
    if vllm is not None:
        if g.git(vllm, "rev-parse", "--git-dir", check=False).returncode != 0:
            raise SeriesError(f"{hints.no_checkout(vllm)}: VLLM= must name a vLLM git checkout")
        found = g.rev(vllm, b.commit) if b.commit else None
        if found:
            return vllm, found
    cached = base_mod.base_repo_path(b.project, b.version)
    was_cached = cached.exists()
    try:
        stderr = functools.partial(print, file=sys.stderr)  # stdout is the report alone
        repo, commit, _sha = base_mod.materialise_pinned(manifest, log=stderr)
    except SeriesError as e:
        how = (
            ""
            if was_cached
            else f"\nIt is not cached in {cached}: run `{hints.make('venv')}` (its pip fetches"
            " the sdist) and try again, or name a repository that holds the base commit with"
            " VLLM="
        )
        raise SeriesError(
            f"{state.label} pins the base {b.project} {b.version}"
            f" (commit {b.commit[:12] or 'not recorded'}), which could not be materialised:"
            f" {e}{how}"
        ) from None
    return repo, commit


def _pair_unpaired(scratch: Path, changes: list[Change], how: str, wanted) -> None:
    """Pair each new patch left unpaired with the first unpaired old patch whose
    subject ``wanted(new patch)`` lists (normalised), with their forced range-diff."""
    for added in sorted((c for c in changes if c.status == ">"), key=lambda c: c.new.number):
        dropped = {manifest_mod.normalise(c.old.subject): c
                   for c in reversed(changes) if c.status == "<"}  # fmt: skip
        match = next((dropped[s] for s in wanted(added.new) if s in dropped), None)
        if match is not None:
            changes.remove(match)
            added.status, added.old, added.paired_by = "!", match.old, how
            added.range_diff = _forced_range_diff(scratch, match.old, added.new)


def _forced_range_diff(scratch: Path, o: Patch, n: Patch) -> str:
    """The range-diff body of ``o`` against ``n``, however much they differ."""
    forced = rangediff.range_diff(scratch, f"{o.commit}^", o.commit, f"{n.commit}^", n.commit,
                                  creation_factor=_FORCE_PAIR)  # fmt: skip
    return next((p.body for p in rangediff.parse(forced) if p.status in "=!"), forced)


def _pair_recorded(scratch: Path, old: Side, new: Side, changes: list[Change]) -> list[str]:
    """Pair and link what the newer manifest's ``previous`` records (docs/compare.md);
    returns notes on subjects it names that no old patch has."""
    norm = manifest_mod.normalise
    entries = {norm(k): [norm(s) for s in v] for k, v in new.manifest.previous.items()}
    if not entries:
        return []
    _pair_unpaired(scratch, changes, "manifest", lambda new: entries.get(norm(new.subject), []))

    notes = []
    by_subject = collections.defaultdict(list)
    for p in old.patches:
        by_subject[norm(p.subject)].append(p)
    unpaired_old = {c.old.number: c for c in changes if c.status == "<" and c.old}
    for change in sorted((c for c in changes if c.new), key=lambda c: c.new.number):
        for subject in entries.get(norm(change.new.subject), []):
            if not by_subject.get(subject):
                notes.append(
                    f"{versions.MANIFEST} of {new.state.label} records {change.new.tag}"
                    f" `{change.new.subject}` as derived from `{subject}`, which is no patch"
                    f' of {old.state.label}: check the subject in "previous"'
                )
            for ancestor in by_subject.get(subject, []):
                if any(a is ancestor for a in change.recorded):
                    continue
                change.recorded.append(ancestor)
                if ancestor is change.old:
                    continue
                body = _forced_range_diff(scratch, ancestor, change.new)
                change.derivations.append(Derivation(ancestor, body))
                gone = unpaired_old.get(ancestor.number)
                if gone is not None and gone.merged_into is None:
                    gone.merged_into = change.new
    for change in changes:
        if change.status == ">" and change.derivations:
            change.from_old = change.derivations[0].old
            change.pieces = changelog.recorded_pieces(changes, change.from_old)
    return notes if old.state.version != new.state.version else []


def _mark_moved(changes: list[Change]) -> None:
    """Mark paired patches outside the longest run that kept its relative order."""
    paired = sorted((c for c in changes if c.old and c.new), key=lambda c: c.old.number)
    sequence = [c.new.number for c in paired]
    # Longest increasing subsequence, O(n^2): series have tens of patches.
    length = [1] * len(sequence)
    before = [-1] * len(sequence)
    for i in range(len(sequence)):
        for j in range(i):
            if sequence[j] < sequence[i] and length[j] + 1 > length[i]:
                length[i], before[i] = length[j] + 1, j
    kept = set()
    i = max(range(len(sequence)), key=lambda k: (length[k], k), default=-1)
    while i != -1:
        kept.add(i)
        i = before[i]
    for k, change in enumerate(paired):
        change.moved = k not in kept


def _compare_pair(scratch: Path, change: Change) -> None:
    """Which files' changes differ (without context lines), and the message."""
    o, n = change.old, change.new
    # The paths either commit changes (both sides of a rename).
    commits = f"{o.commit}\n{n.commit}\n"
    raw = g.out(scratch, "diff-tree", "--stdin", "-r", "-z", "--name-only", "--no-commit-id",
                "--no-renames", input=commits)  # fmt: skip
    paths = sorted({p for p in raw.split("\0") if p})
    differ = []
    for path in paths:
        ids = patchset.patch_ids_of_commits(scratch, [o.commit, n.commit],
                                            [f":(literal){path}"], unified=0)  # fmt: skip
        if ids.get(o.commit) != ids.get(n.commit):
            differ.append(path)
    change.test_paths = [p for p in differ if p.startswith(TESTS_DIR)]
    change.code_paths = [p for p in differ if not p.startswith(TESTS_DIR)]
    shown = g.git(scratch, "show", "-s", "--format=%x00%an <%ae>%x00%B", o.commit, n.commit).stdout
    _, old_author, old_body, new_author, new_body = shown.split("\0")
    change.author_changed, change.message_changed = old_author != new_author, old_body != new_body


def _added_text(scratch: Path, commit: str) -> collections.Counter[str]:
    """The lines ``commit`` adds (stripped; those with a letter or digit), counted."""
    diff = g.out(scratch, "diff-tree", "-p", "--unified=0", "--no-commit-id", "--no-color",
                 "--no-ext-diff", "--no-textconv", "--no-renames", commit)  # fmt: skip
    lines: collections.Counter[str] = collections.Counter()
    in_hunk = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            in_hunk = False
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith("+"):
            text = line[1:].strip()
            if any(ch.isalnum() for ch in text):
                lines[text] += 1
    return lines


def _find_splits(scratch: Path, changes: list[Change]) -> None:
    """Give each new patch the old one (dropped or changed) it takes most lines
    from; an old patch whose content is now in two or more new patches was split."""
    donors = [c.old for c in changes if c.old and c.status in "<!"]
    # What series.json's "previous" records is not guessed at.
    added = [c for c in changes if c.status == ">" and not c.derivations]
    recorded = {p.number for c in changes for p in c.recorded}
    if not donors or not added:
        return
    donor_lines = {p.number: _added_text(scratch, p.commit) for p in donors}
    for change in added:
        lines = _added_text(scratch, change.new.commit)
        shared = {d.number: lines & donor_lines[d.number] for d in donors}
        weight = {k: sum(len(text) * n for text, n in c.items()) for k, c in shared.items()}
        best = max(donors, key=lambda d: weight[d.number])  # the first of the heaviest
        total = sum(len(text) * n for text, n in lines.items())
        if total and weight[best.number] / total >= SPLIT_SHARE:
            change.from_old = best
    for donor in donors:
        if donor.number in recorded:
            continue
        own = next(c for c in changes if c.old is donor)
        pieces = [c.new for c in changes if c.from_old is donor]
        if own.new is not None:
            pieces.insert(0, own.new)
        if len(pieces) >= 2:
            pieces.sort(key=lambda p: p.number)
            for c in changes:
                if c is own or c.from_old is donor:
                    c.pieces = pieces


def _kinds(change: Change) -> list[str]:
    if change.pieces:
        return [changelog.SPLIT]
    if change.status == "<":
        return [changelog.MERGED] if change.merged_into else [changelog.DROPPED]
    if change.status == ">":
        return [changelog.NEW]
    kinds = [changelog.REWRITTEN] if change.paired_by == "manifest" else []
    if change.status == "!":
        if change.code_paths:
            kinds.append(changelog.CONTRACT_CHANGED)
        elif change.test_paths:
            kinds.append(changelog.TEST_ONLY)
        elif change.message_changed or change.author_changed:
            kinds.append(changelog.REWORDED)
        else:
            kinds.append(changelog.CONTEXT_ONLY)
    if change.derivations:
        kinds.append(changelog.MERGED)
    if change.moved:
        kinds.append(changelog.REORDERED)
    return kinds or [changelog.UNCHANGED]


def _summary(changes: Sequence[Change]) -> collections.Counter[str]:
    return collections.Counter(kind for c in changes for kind in c.kinds)


def _render_text(comparison: Comparison, draft_path: Path | None) -> str:
    old, new = comparison.old, comparison.new
    b_old, b_new = (
        f"{b.project} {b.version} ({(s.base or b.commit)[:12]})"
        for s in (old, new)
        for b in [s.manifest.base]
    )
    bases = f"{b_new} on both sides" if b_old == b_new else f"{b_old} -> {b_new}"
    lines = [f"Series {old.state.label} -> {new.state.label}", f"Base: {bases}"]
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(_summary(comparison.changes).items()))
    lines.append(f"{len(old.patches)} patches -> {len(new.patches)} patches: {summary or '-'}")
    lines += [f"note: {note}" for note in comparison.notes]
    rows = []
    for c in comparison.changes:
        subject = (c.new or c.old).subject
        subject = subject if len(subject) <= 60 else subject[:57] + "..."
        rows.append([c.old.tag if c.old else "-", c.status, c.new.tag if c.new else "-",
                     ", ".join(c.kinds), subject])  # fmt: skip
    lines.append("")
    if rows:
        lines += table((f"from v{old.state.version}", "", f"to v{new.state.version}", "change",
                        "subject"), rows, rule=False).splitlines()  # fmt: skip
    else:
        lines.append("(both series are empty)")
    lines += ["", f"git range-diff {old.state.label} -> {new.state.label}:",
              comparison.range_diff or "(empty)"]  # fmt: skip
    ov, nv = old.state.version, new.state.version
    by_new = sorted((c for c in comparison.changes if c.new), key=lambda c: c.new.number)
    for paired_by, heading in (
        ("subject", "paired by subject (range-diff left them unpaired)"),
        ("manifest", f"paired as recorded in {versions.MANIFEST} (range-diff left them unpaired)"),
    ):
        for c in by_new:
            if c.paired_by == paired_by:
                lines += ["", f"{heading}: v{ov} {c.old.tag} -> v{nv} {c.new.tag}", c.range_diff]
    for c in by_new:
        for d in c.derivations:
            if c.old is not None:  # a further ancestor of a paired patch
                how, why = "merged", f"v{nv} {c.new.tag} is paired with v{ov} {c.old.tag}"
            else:
                partner = next((x.new for x in by_new if x.old is d.old), None)
                taken = f"paired with v{nv} {partner.tag}" if partner else "merged elsewhere"
                how, why = "split", f"v{ov} {d.old.tag} is {taken}"
            lines += ["", f"{how} as recorded in {versions.MANIFEST} ({why}):"
                      f" v{ov} {d.old.tag} -> v{nv} {c.new.tag}", d.range_diff]  # fmt: skip
    lines.append("")
    if draft_path is not None:
        lines.append(f"Draft of the changelog section written to {draft_path}")
    else:
        lines += ["Draft for SERIES.md (what git shows; edit it, and add the why):", "",
                  changelog.draft(comparison).rstrip("\n")]  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The ``compare`` command: print the report; 0, or 2 when it could not run."""
    repo = args.repo or manifest_mod.ROOT
    try:
        if not args.from_spec:
            example = hints.make("compare", FROM="1")
            raise SeriesError(f"FROM= names the older side, e.g. `{example}`; "
                              + versions.what_exists(repo))  # fmt: skip
        with interrupts.deferred():
            comparison = compare(repo, args.from_spec, args.to_spec, args.vllm)
            if args.draft:
                args.draft.write_text(changelog.draft(comparison), encoding="utf-8",
                                      errors="surrogateescape")  # fmt: skip
    except interrupts.Interrupted:
        raise
    except (SeriesError, OSError) as e:
        raise SeriesError(str(e), exit_code=2) from None
    print(json.dumps(comparison.to_dict(), indent=2) if args.json
          else _render_text(comparison, args.draft))  # fmt: skip
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="range-diff two versions of the series and draft their changelog",
        description="Apply two versions of the series (states of patches/ in this repository's"
        " history, or the working tree) onto their pinned bases in a scratch repository, print"
        " their git range-diff, classify every patch and draft the 'Changes in vN' section of"
        " SERIES.md. Exit 0; 2 when it could not run.",
    )  # fmt: skip
    p.add_argument("--from", dest="from_spec", metavar="VERSION|COMMIT",
                   help="the older side: a series version (newest commit whose"
                   " patches/series.json records it) or a commit-ish")  # fmt: skip
    p.add_argument("--to", dest="to_spec", metavar="VERSION|COMMIT",
                   help="the newer side (default: the working tree's patches/)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--draft", type=Path, metavar="FILE", help="write the changelog draft to FILE")
    p.add_argument("--vllm", type=hints.user_path, metavar="PATH", help="a checkout holding"
                   " the bases (default: materialise each from its sdist)")  # fmt: skip
    p.add_argument("--repo", type=Path, metavar="DIR", help="repository whose history holds"
                   " the versions (default: this one)")  # fmt: skip
    p.set_defaults(func=run)
