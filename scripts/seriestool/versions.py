"""Series versions: states of ``patches/`` in this repository's history, read
from git objects.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import git as g
from . import manifest as manifest_mod
from . import patchset
from .errors import SeriesError
from .git import describe_blob as _describe

PATCH_DIR = manifest_mod.PATCH_DIR.relative_to(manifest_mod.ROOT).as_posix()
MANIFEST = manifest_mod.MANIFEST_PATH.name


@dataclasses.dataclass(frozen=True)
class SeriesVersion:
    """One state of the series: a commit's ``patches/``, or the working tree's."""

    spec: str  # as the user gave it ("1", a commit-ish, or "" for the working tree)
    version: str  # what its manifest records
    commit: str | None  # None: the working tree

    @property
    def label(self) -> str:
        where = "working tree" if self.commit is None else f"commit {self.commit[:12]}"
        return f"v{self.version} ({where})"


def history(repo: Path) -> Iterator[tuple[str, str | None]]:
    """``(commit, version or None)`` of each commit changing ``patches/``, newest first."""
    if g.rev(repo, "HEAD") is None:
        return
    for commit in g.out(repo, "rev-list", "--topo-order", "HEAD", "--", PATCH_DIR).split():
        yield commit, _recorded_version(repo, commit)


def _recorded_version(repo: Path, commit: str) -> str | None:
    try:  # no manifest there: json.loads(None) raises TypeError
        version = json.loads(g.blob(repo, f"{commit}:{PATCH_DIR}/{MANIFEST}"))["series"]["version"]
    except (ValueError, KeyError, TypeError):
        return None
    return None if version is None else str(version)


def known_versions(repo: Path) -> dict[str, str]:
    """Each version found in the history and its newest commit."""
    found: dict[str, str] = {}
    for commit, version in history(repo):
        if version is not None:
            found.setdefault(version, commit)
    return found


def resolve(repo: Path, spec: str | None) -> SeriesVersion:
    """The series state ``spec`` names: a version, a commit-ish, or (None) the working
    tree; a refusal lists the versions that exist."""
    if spec is None:
        manifest = manifest_mod.load(repo / PATCH_DIR / MANIFEST)
        return SeriesVersion(spec="", version=manifest.version, commit=None)
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)", spec)  # "2", "v2", "2.1"; else a commit-ish
    if match and (commit := known_versions(repo).get(match[1])):
        return SeriesVersion(spec=spec, version=match[1], commit=commit)
    commit = g.rev(repo, spec)
    if commit is None:
        what = (
            f"no series version {match.group(1)} in the history of {repo}"
            if match
            else f"{spec!r} is neither a series version nor a commit of {repo}"
        )
        raise SeriesError(f"{what}; {what_exists(repo)}")
    version = _recorded_version(repo, commit)
    if version is None:
        raise SeriesError(
            f"commit {commit[:12]} ({spec}) has no readable {PATCH_DIR}/{MANIFEST}"
            f" with a series version; {what_exists(repo)}"
        )
    return SeriesVersion(spec=spec, version=version, commit=commit)


def what_exists(repo: Path) -> str:
    found = known_versions(repo)
    if not found:
        return f"no commit of its history has a {PATCH_DIR}/{MANIFEST} with a series version"
    listed = ", ".join(f"{v} (commit {c[:12]})" for v, c in found.items())
    return f"versions in its history, newest first: {listed}; or pass a commit"


def write_patches(repo: Path, state: SeriesVersion, dest: Path) -> manifest_mod.Manifest:
    """Write ``state``'s manifest and the patch files it lists, byte for byte, into
    the new folder ``dest``."""
    dest.mkdir(parents=True)
    if state.commit is None:
        source = repo / PATCH_DIR
        shutil.copyfile(source / MANIFEST, dest / MANIFEST)
    else:
        (dest / MANIFEST).write_bytes(g.blob(repo, f"{state.commit}:{PATCH_DIR}/{MANIFEST}"))
    try:
        manifest = manifest_mod.load(dest / MANIFEST)
    except SeriesError as e:  # name the version and its manifest, not the scratch copy
        raise SeriesError(
            f"{state.label}: " + str(e).replace(str(dest / MANIFEST), f"{PATCH_DIR}/{MANIFEST}")
        ) from None
    for entry in manifest.patches:
        if state.commit is None:
            data = (source / entry.file).read_bytes() if (source / entry.file).is_file() else None
        else:
            data = g.blob(repo, f"{state.commit}:{PATCH_DIR}/{entry.file}")
        if data is None:
            raise SeriesError(
                f"{state.label}: {PATCH_DIR}/{MANIFEST} lists {entry.file}, which is missing"
            )
        (dest / entry.file).write_bytes(data)
    return manifest


def classify(
    head: dict[str, str | None], states: list[dict[str, str | None]]
) -> tuple[int | None, list[str]]:
    """How many patches the checkout's files hold: ``(k, [])`` when they are
    exactly the series after ``k`` patches, else ``(None, differences from the base)``."""
    for k in (len(states) - 1, 0, *range(1, len(states) - 1)):
        if head == states[k]:
            return k, []
    base, result = states[0], states[-1]
    also = {p: ", the series' result" if head[p] == result[p] else "" for p in base}
    return None, [
        f"{p}: {_describe(head[p])}{also[p]}; base has {_describe(base[p])}"
        for p in sorted(base)
        if head[p] != base[p]
    ]


# A series state whose first ``held`` of ``total`` patches a commit's files hold.
Held = collections.namedtuple("Held", "state held total manifest")


def held_in(repo: Path, commit: str, patch_dir: Path) -> Held | None:
    """Which series a commit of a vLLM checkout carries, by the blob ids of the
    files each touches: the one in ``patch_dir``, else its earlier states in
    the history of the repository holding ``patch_dir`` (newest first)."""
    current = manifest_mod.load(patch_dir / MANIFEST)
    found = _held(repo, commit, SeriesVersion("", current.version, None), current, patch_dir)
    if found:
        return found
    seen = {(patch_dir / MANIFEST).read_bytes()}
    with tempfile.TemporaryDirectory(prefix="seriestool-versions-") as tmp:
        for tooling, rev, version, text in _past_manifests(patch_dir):
            if version is None or text in seen:
                continue
            seen.add(text)
            state, folder = SeriesVersion(rev, version, rev), Path(tmp) / rev
            with contextlib.suppress(SeriesError):  # a broken state is no version
                found = _held(repo, commit, state, write_patches(tooling, state, folder), folder)
            if found:
                return found
    return None


def _past_manifests(patch_dir: Path) -> Iterator[tuple[Path, str, str | None, bytes | None]]:
    """``(repository, commit, version, manifest)`` of each state in ``history`` of
    the project's ``patches/`` (none for another folder)."""
    tooling = patch_dir.resolve().parent
    if patch_dir.name == PATCH_DIR and g.is_repo(tooling):
        for rev, version in history(tooling):
            yield tooling, rev, version, g.blob(tooling, f"{rev}:{PATCH_DIR}/{MANIFEST}")


def _held(repo, commit, state, manifest, patch_dir) -> Held | None:
    images = patchset.images(manifest.patch_paths(patch_dir))
    states = patchset.states(manifest.base.touched_files, images)
    k, _ = classify(g.blob_ids(repo, commit, sorted(manifest.base.touched_files)), states)
    return Held(state, k, len(images), manifest) if k else None


def foreign_commits(repo: Path, base: str, head: str, patch_dir: Path) -> list[str]:
    """Commits of ``base..head`` that are no known series patch (by patch ID): the
    user's.  Known: the series in ``patch_dir`` and, for the project's
    ``patches/``, every earlier version in its repository's history."""
    known = {p.patch_id for p in manifest_mod.load(patch_dir / MANIFEST).patches}
    for _tooling, _rev, _version, text in _past_manifests(patch_dir):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            known.update(p["patch_id"] for p in json.loads(text or "")["patches"])
    log = g.git(repo, "log", "-p", "--no-merges", "--no-renames", "--full-index", "--no-color",
                "--format=commit %H", f"{base}..{head}", text=False).stdout  # fmt: skip
    ids = dict(patchset.patch_ids_of_log(repo, log))
    return [c for c in g.out(repo, "rev-list", "--reverse", f"{base}..{head}").split()
            if ids.get(c) not in known]  # fmt: skip


def listing(repo: Path, commits: list[str]) -> list[str]:
    """``<short sha> <subject>`` of each of ``commits``."""
    listed = g.out(repo, "log", "--no-walk=unsorted", "--format=%h %s", *commits) if commits else ""
    return listed.splitlines()
