"""The series manifest, ``patches/series.json``: the pinned base (version,
sdist, commit, blob ids of touched files), the patches (file, subject, stable
patch ID, sha256), the upstream regression tests, ``previous`` and ``groups``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path

from .errors import SeriesError

ROOT = Path(__file__).resolve().parents[2]
PATCH_DIR = ROOT / "patches"
MANIFEST_PATH = PATCH_DIR / "series.json"


@dataclasses.dataclass
class Sdist:
    filename: str
    sha256: str


@dataclasses.dataclass
class Base:
    project: str
    version: str
    upstream_commit: str
    sdist: Sdist
    commit: str
    touched_files: dict[str, str | None]


@dataclasses.dataclass
class PatchEntry:
    file: str
    subject: str
    patch_id: str
    sha256: str = ""  # empty only in a manifest written before files were pinned


@dataclasses.dataclass
class RegressionTests:
    paths: list[str] = dataclasses.field(default_factory=list)
    deselect: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Group:
    name: str
    patches: list[str]  # subjects
    depends: list[str] = dataclasses.field(default_factory=list)
    upstream: bool = True
    why: str = ""


@dataclasses.dataclass
class Manifest:
    name: str
    version: str
    base: Base
    patches: list[PatchEntry]
    regression_tests: RegressionTests
    # Patch subject -> subjects of the previous version's patches it derives from.
    previous: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    groups: list[Group] = dataclasses.field(default_factory=list)

    @property
    def branch_name(self) -> str:
        """Branch that ``apply`` creates: series name and version, and the base."""
        return f"{self.name}/v{self.version}-on-{self.base.project}-{self.base.version}"

    def patch_paths(self, patch_dir: Path = PATCH_DIR) -> list[Path]:
        return [patch_dir / p.file for p in self.patches]

    def save(self, path: Path = MANIFEST_PATH) -> None:
        data = dataclasses.asdict(self)
        series = {key: data.pop(key) for key in ("name", "version", "previous", "groups")}
        # An empty "previous" or "groups" is left out.
        data = {"series": {k: v for k, v in series.items() if v not in ([], {})}, **data}
        write_atomic(path, json.dumps(data, indent=2) + "\n")

    def prune_departed(self, renamed: dict[str, str] | None = None) -> list[str]:
        """Follow ``renamed`` (old subject -> new, for a reworded patch) in
        ``previous`` and the groups, drop the subjects that are no patch's any
        more, then the groups left with no patch (those that depended on one
        depend on its dependencies instead); returns what changed, in words."""
        renamed = {normalise(old): new for old, new in (renamed or {}).items()}
        subjects = {normalise(p.subject) for p in self.patches}
        gone = "no patch has that subject any more"
        notes = [f"renamed {old!r} to {new!r} in the manifest's previous entries and groups"
                 for old, new in renamed.items()]  # fmt: skip
        for key in list(self.previous):
            value = self.previous.pop(key)
            key = renamed.get(normalise(key), key)
            if normalise(key) in subjects:
                self.previous[key] = value
            else:
                notes.append(f'dropped "previous" entry {key!r} from the manifest: {gone}')
        for group in self.groups:
            kept = [renamed.get(normalise(s), s) for s in group.patches]
            group.patches = [s for s in kept if normalise(s) in subjects]
            notes += [f"dropped {s!r} from the manifest's group {group.name!r}: {gone}"
                      for s in kept if normalise(s) not in subjects]  # fmt: skip
        empty = {group.name: group.depends for group in self.groups if not group.patches}

        def through(names: list[str]) -> list[str]:
            deps = (through(empty[n]) if n in empty else [n] for n in names)
            return list(dict.fromkeys(dep for each in deps for dep in each))

        for name, depends in empty.items():
            users = [group.name for group in self.groups if name in group.depends]
            notes.append(
                f"dropped the manifest's group {name!r}: it has no patch left"
                + (f"; {', '.join(users)} now depend(s) on {through(depends) or 'no group'}"
                   f" instead" if users else "")
            )  # fmt: skip
        self.groups = [group for group in self.groups if group.patches]
        for group in self.groups:
            group.depends = through(group.depends)
        return notes


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` (text as UTF-8) through a file renamed over it: an
    interrupted write never leaves half a file."""
    tmp = path.with_name(path.name + ".seriestool-tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def normalise(subject: str) -> str:
    """A subject with its whitespace runs as single spaces: how subjects match."""
    return " ".join(subject.split())


def previous_problems(manifest: Manifest) -> list[str]:
    """What is wrong with ``manifest.previous``: each key must be a patch's subject,
    once; each value a non-empty list of subjects (of the previous version's
    patches, which ``compare`` checks)."""
    field = '"series"."previous"'
    if not isinstance(manifest.previous, dict):
        return [
            f"{field} must be an object: patch subject -> list of the previous"
            f" version's patch subjects, not {type(manifest.previous).__name__}"
        ]
    subjects = [p.subject for p in manifest.patches]
    normal = {normalise(s) for s in subjects}
    found, seen = [], set()
    for key, value in manifest.previous.items():
        if normalise(key) not in normal:
            close = difflib.get_close_matches(key, subjects, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            found.append(
                f"{field} names {key!r}, which is not the subject of any patch"
                f" of this manifest (its keys are this version's subjects){hint}"
            )
        elif normalise(key) in seen:
            found.append(f"{field} names {key!r} twice")
        seen.add(normalise(key))
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(s, str) and s.strip() for s in value)
        ):
            found.append(
                f"{field}[{key!r}] must be a non-empty list of the previous"
                f" version's patch subjects, not {json.dumps(value)}"
            )
    return found


def group_patches(manifest: Manifest, name: str) -> list[PatchEntry]:
    """The patches group ``name`` is applied as, in series order: its own and
    those of the groups it depends on, transitively (a cycle is refused)."""
    groups = {group.name: group for group in manifest.groups}
    subjects: set[str] = set()

    def visit(current: str, path: list[str]) -> None:
        if current in path:
            cycle = " -> ".join([*path[path.index(current) :], current])
            raise SeriesError(f"the groups depend on each other in a cycle: {cycle}")
        if current not in groups:
            by = f" (a dependency of {path[-1]!r})" if path else ""
            raise SeriesError(f"no group {current!r}{by}; the groups: {', '.join(groups)}")
        subjects.update(normalise(s) for s in groups[current].patches)
        for dependency in groups[current].depends:
            visit(dependency, [*path, current])

    visit(name, [])
    return [p for p in manifest.patches if normalise(p.subject) in subjects]


def group_problems(manifest: Manifest) -> list[str]:
    """What is wrong with ``manifest.groups``: every patch must be in one group,
    every subject a group names a patch's, every dependency a group (no cycle),
    and a group's patches after those of the groups it depends on."""
    subjects = {normalise(p.subject): n for n, p in enumerate(manifest.patches)}
    names = [group.name for group in manifest.groups]
    found = [f"two groups are named {n!r}" for n in sorted(set(names)) if names.count(n) > 1]
    owner: dict[str, str] = {}
    for group in manifest.groups:
        for subject in group.patches:
            key = normalise(subject)
            if key not in subjects:
                close = difflib.get_close_matches(subject, [p.subject for p in manifest.patches], 1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                found.append(f"group {group.name!r} names {subject!r}, no patch's subject{hint}")
            elif key in owner:
                found.append(f"{subject!r} is in two groups, {owner[key]!r} and {group.name!r}")
            owner.setdefault(key, group.name)
    found += [f'{p.file} is in no group: add its subject, {p.subject!r}, to the "patches" of'
              f' one group in "series"."groups" of the manifest' for p in manifest.patches
              if manifest.groups and normalise(p.subject) not in owner]  # fmt: skip
    found += [f'group {group.name!r} has no patches: remove it from "series"."groups" (and'
              " from the depends of the groups that name it)" for group in manifest.groups
              if not group.patches]  # fmt: skip
    for group in manifest.groups:
        own = {subjects[normalise(s)] for s in group.patches if normalise(s) in subjects}
        try:
            deps = [subjects[normalise(p.subject)] for p in group_patches(manifest, group.name)]
        except SeriesError as e:
            found += [str(e)] if str(e) not in found else []
            continue
        late = [n for n in deps if n not in own and own and n > min(own)]
        if late:
            found.append(
                f"group {group.name!r}: {manifest.patches[min(own)].file} comes before"
                f" {', '.join(manifest.patches[n].file for n in late)} of the groups it depends"
                " on; a group's patches must come after its dependencies' in the series"
            )
    return found


def load(path: Path = MANIFEST_PATH) -> Manifest:
    """Read and validate the manifest; a refusal names the file and the field."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SeriesError(f"manifest {path} is missing") from None
    except json.JSONDecodeError as e:
        raise SeriesError(f"manifest {path} is not valid JSON: {e}") from None
    try:
        manifest = Manifest(
            name=data["series"]["name"],
            version=str(data["series"]["version"]),
            base=Base(**{**data["base"], "sdist": Sdist(**data["base"]["sdist"])}),
            patches=[PatchEntry(**p) for p in data["patches"]],
            regression_tests=RegressionTests(**data.get("regression_tests", {})),
            previous=data["series"].get("previous", {}),
            groups=[Group(**group) for group in data["series"].get("groups", [])],
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise SeriesError(f"manifest {path} is missing or mistypes field {e}") from None
    found = previous_problems(manifest)
    if found:
        raise SeriesError(f"manifest {path}:\n  " + "\n  ".join(found))
    return manifest
