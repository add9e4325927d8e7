"""The series manifest, ``patches/series.json``: the pinned base and the patches.

One file records, once, everything the tooling checks against:

- the base: vLLM version, upstream commit (abbreviated, as the sdist's
  ``vllm/_version.py`` records it), the PyPI sdist name and sha256, the commit
  id of the materialised base (fixed identity and dates, so identical on every
  machine) and the git blob id, in the base, of every file the series touches
  (``null`` for a file the series creates);
- the patches, in order: file name, subject, stable patch ID
  (``git patch-id --verbatim``: whitespace counts, since indentation is
  meaning in Python; it identifies a change across rebases) and the sha256 of
  the file's bytes (it pins everything else: author, message, line numbers);
- regression tests: upstream vLLM test files, outside the patches, that cover
  the touched code and run with every prefix of the series, and the node-id
  prefixes deselected from them with the reason (network, or failing on the
  base already);
- optionally, in ``"series"``, ``"previous"``: which patches of the previous
  version each patch derives from (patch subject -> list of previous-version
  subjects: one for a rewrite or a piece split from it, several for a merge),
  so that ``compare`` pairs a rewrite that ``git range-diff`` cannot.
  Subjects, not file names, so renumbering and re-export keep it.  Written
  only when non-empty: a manifest without it round-trips byte for byte.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
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
class Manifest:
    name: str
    version: str
    base: Base
    patches: list[PatchEntry]
    regression_tests: RegressionTests
    # Patch subject -> subjects of the previous version's patches it derives from.
    previous: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def branch_name(self) -> str:
        """Branch that ``apply`` creates: series name and version, and the base."""
        return f"{self.name}/v{self.version}-on-{self.base.project}-{self.base.version}"

    def patch_paths(self, patch_dir: Path = PATCH_DIR) -> list[Path]:
        return [patch_dir / p.file for p in self.patches]

    def to_json(self) -> str:
        series: dict = {"name": self.name, "version": self.version}
        if self.previous:
            series["previous"] = self.previous
        data = {
            "series": series,
            "base": dataclasses.asdict(self.base),
            "patches": [dataclasses.asdict(p) for p in self.patches],
            "regression_tests": dataclasses.asdict(self.regression_tests),
        }
        return json.dumps(data, indent=2) + "\n"

    def save(self, path: Path = MANIFEST_PATH) -> None:
        # Write then rename: an interrupted save never leaves half a manifest.
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)

    def prune_previous(self) -> list[str]:
        """Drop the ``previous`` entries whose subject is no patch's any more;
        returns the dropped subjects (the rest is kept as it was)."""
        subjects = {normalise(p.subject) for p in self.patches}
        gone = [key for key in self.previous if normalise(key) not in subjects]
        for key in gone:
            del self.previous[key]
        return gone


def normalise(subject: str) -> str:
    """A subject with its whitespace runs as single spaces: how subjects match."""
    return " ".join(subject.split())


def previous_problems(manifest: Manifest) -> list[str]:
    """What is wrong with ``manifest.previous`` (empty: nothing).

    Every key must be the subject of one of the manifest's patches (compared
    with whitespace normalised), at most once; every value a non-empty list
    of subjects.  The values name the previous version's patches, which this
    manifest does not list: ``compare`` reports one that names no patch there.
    """
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


def load(path: Path = MANIFEST_PATH) -> Manifest:
    """Read and validate the manifest.

    Raises:
        SeriesError: the file is missing, not JSON, or lacks a field, or its
            ``"previous"`` names a subject none of its patches has; the
            message names the file and the field (or the subject).
    """
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SeriesError(f"manifest {path} is missing") from None
    except json.JSONDecodeError as e:
        raise SeriesError(f"manifest {path} is not valid JSON: {e}") from None
    try:
        base = data["base"]
        manifest = Manifest(
            name=data["series"]["name"],
            version=str(data["series"]["version"]),
            base=Base(
                project=base["project"],
                version=base["version"],
                upstream_commit=base["upstream_commit"],
                sdist=Sdist(**base["sdist"]),
                commit=base["commit"],
                touched_files=dict(base["touched_files"]),
            ),
            patches=[PatchEntry(**p) for p in data["patches"]],
            regression_tests=RegressionTests(**data.get("regression_tests", {})),
            previous=data["series"].get("previous", {}),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise SeriesError(f"manifest {path} is missing or mistypes field {e}") from None
    found = previous_problems(manifest)
    if found:
        raise SeriesError(f"manifest {path}:\n  " + "\n  ".join(found))
    return manifest
