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
  base already).
"""

from __future__ import annotations

import dataclasses
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

    @property
    def branch_name(self) -> str:
        """Branch that ``apply`` creates: series name and version, and the base."""
        return f"{self.name}/v{self.version}-on-{self.base.project}-{self.base.version}"

    def patch_paths(self, patch_dir: Path = PATCH_DIR) -> list[Path]:
        return [patch_dir / p.file for p in self.patches]

    def to_json(self) -> str:
        data = {
            "series": {"name": self.name, "version": self.version},
            "base": dataclasses.asdict(self.base),
            "patches": [dataclasses.asdict(p) for p in self.patches],
            "regression_tests": dataclasses.asdict(self.regression_tests),
        }
        return json.dumps(data, indent=2) + "\n"

    def save(self, path: Path = MANIFEST_PATH) -> None:
        # Write then rename: an interrupted save never leaves half a manifest.
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)


def load(path: Path = MANIFEST_PATH) -> Manifest:
    """Read and validate the manifest.

    Raises:
        SeriesError: the file is missing, not JSON, or lacks a field; the
            message names the file and the field.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SeriesError(f"manifest {path} is missing") from None
    except json.JSONDecodeError as e:
        raise SeriesError(f"manifest {path} is not valid JSON: {e}") from None
    try:
        base = data["base"]
        return Manifest(
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
        )
    except (KeyError, TypeError) as e:
        raise SeriesError(f"manifest {path} is missing or mistypes field {e}") from None
