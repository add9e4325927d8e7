"""``device-bundle``: what the GPU machine needs to qualify the series, in ``.device/``.

The GPU machine has no network and no vLLM: it gets a copy of this folder and
of ``scripts/device/``.  ``bundle.json`` lists the wheels the GPU image lacks
and the trees (the base, the series' overlay, one overlay per negative
control), built with ``patchset.am`` as ``apply`` builds them; the device
needs neither git nor patch (qualification/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from . import base as base_mod
from . import git as g
from . import manifest as manifest_mod
from . import patchset
from .errors import SeriesError
from .seriestest import is_test_file

BUNDLE_DIR = manifest_mod.ROOT / ".device"
CACHE_DIR = base_mod.WORK_DIR / "device-cache"

# What vLLM 0.33.0's model_executor.model_loader.{weight_utils,default_loader,
# reload.layerwise} need on the GPU image (Python 3.12, torch 2.11) and the
# image lacks (see shared/device-notes.md), plus InstantTensor itself.  The
# versions are those pip resolves for vLLM 0.33.0's requirements/common.txt
# (fastapi < 0.137, starlette >= 1.0.1, openai >= 2.25, pydantic >= 2.12,
# llguidance 1.7.x, xgrammar == 0.2.8, typing_extensions >= 4.16 for this
# pydantic); none pins torch above 2.11.  compressed-tensors (and its loguru):
# the model-loading tests import model modules that need it.  One version
# each: pip refuses two.
WHEELS: tuple[tuple[str, str], ...] = tuple(tuple(pin.split("==")) for pin in (
    "annotated-types==0.8.0", "apache-tvm-ffi==0.1.15.post2", "cachetools==8.0.2",
    "cbor2==6.3.0", "compressed-tensors==0.17.0", "fastapi==0.136.3", "httpcore2==2.16.2",
    "httpx2==2.16.2", "instanttensor==0.2.2", "llguidance==1.7.6", "loguru==0.7.3",
    "msgspec==0.22.0", "openai==3.57.0", "oss-harmony==0.0.11",
    "partial-json-parser==0.2.1.1.post7", "pybase64==1.5.1", "pydantic==2.14.4",
    "pydantic-core==2.50.5", "pyzmq==27.3.0", "sniffio==1.3.1", "starlette==1.10.0",
    "truststore==0.10.5", "typing-extensions==4.16.0", "typing-inspection==0.4.5",
    "xgrammar==0.2.8",
))  # fmt: skip

# pip matches manylinux tags exactly: list every glibc level the image
# (Ubuntu 24.04, glibc 2.39) can run.
PLATFORMS = (
    "manylinux1_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35, 39)),
)

# Tests (files or node ids) whose CUDA tests must fail on the series prefix
# before the patch that adds them: evidence that they detect what it fixes.
NEGATIVE_CONTROLS: tuple[str, ...] = (
    "tests/model_executor/model_loader/test_reload.py::test_reloaded_attention_calls_own_their_sources",
)

# Fixed metadata for archive members: the archives depend on content only.
ARCHIVE_MTIME = 946684800  # 2000-01-01T00:00:00Z
XZ_PRESET = 6


# --- trees -----------------------------------------------------------------


def in_tree(path: str) -> bool:
    """Whether a base file goes into the device's vLLM tree: all of ``vllm/`` (data
    files read at import time too), ``pyproject.toml`` (pytest's markers) and the
    test packages' ``__init__.py``; test files come with the overlays."""
    return (
        path.startswith("vllm/")
        or path == "pyproject.toml"
        or (path.startswith("tests/") and path.endswith("/__init__.py"))
    )


def in_overlay(path: str) -> bool:
    """Whether a file the series adds or changes goes into an overlay."""
    return in_tree(path) or path.startswith("tests/")


def write_archive(root: Path, paths: Iterable[str], dest: Path) -> int:
    """Write ``paths`` (relative to ``root``) as a deterministic tar.xz (sorted,
    owned by root, dated ARCHIVE_MTIME, mode 644 or 755); returns their number."""
    paths = sorted(paths)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = ARCHIVE_MTIME, 0, 0, "root", "root"
        info.mode = 0o755 if info.mode & 0o100 else 0o644
        return info

    with tarfile.open(tmp, "w:xz", preset=XZ_PRESET, format=tarfile.PAX_FORMAT) as tar:
        for rel in paths:
            tar.add(root / rel, arcname=rel, recursive=False, filter=fixed)
    tmp.replace(dest)
    return len(paths)


def changed_files(checkout: Path, base_rev: str) -> dict[str, str]:
    """``{path: git's status letter (A, M, D...)}`` of what HEAD changes since ``base_rev``."""
    status = g.out(checkout, "diff", "--name-status", "--no-renames", "-z", base_rev, "HEAD")
    fields = status.split("\0")
    return dict(zip(fields[1::2], fields[0::2], strict=False))


def added_tests(checkout: Path, base_rev: str, path: str) -> list[str]:
    """Node ids of the tests the series adds to ``path``: in an upstream file only those run."""
    diff = g.out(checkout, "diff", "-U0", base_rev, "HEAD", "--", path)
    return [f"{path}::{n}" for n in re.findall(r"^\+(?:async )?def (test_\w+)\(", diff, re.M)]


def build_trees(
    base_repo: Path,
    base_branch: str,
    patches: Sequence[Path],
    out_dir: Path,
    negative_controls: Sequence[str] = NEGATIVE_CONTROLS,
    log=print,
) -> dict:
    """Write the base archive and the overlays into ``out_dir/trees``; returns
    the ``trees`` / ``tests`` / ``negative_controls`` part of bundle.json."""
    base_commit = g.rev(base_repo, base_branch)
    pids = [patchset.patch_id_of_file(p) for p in patches]
    series_key = hashlib.sha256(
        json.dumps([base_commit, pids, sorted(negative_controls)]).encode()
    ).hexdigest()[:16]
    (out_dir / "trees").mkdir(parents=True, exist_ok=True)
    keys = ("series_tests", "tests_not_run", "negative_controls", "negative_controls_missing")
    result: dict = {"trees": {}, **{key: [] for key in keys}}

    (CACHE_DIR / "scratch").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="device-", dir=CACHE_DIR / "scratch") as tmp_name:

        def checkout(name: str, prefix: Sequence[Path]) -> Path:
            path = Path(tmp_name) / name
            if not path.exists():
                base_mod.clone(base_repo, path, branch=base_branch)
                if prefix:
                    patchset.am(path, prefix)
            return path

        def add_tree(name: str, prefix: Sequence[Path] | None = None, extra=()) -> None:
            """Pack tree ``name``, the base or (``prefix`` given) the overlay of
            ``prefix`` plus the series' ``extra`` files, once per cache key; copy it in."""
            folder = CACHE_DIR / "trees" / (series_key if prefix is not None else base_commit[:16])
            archive, meta_path = folder / f"{name}.tar.xz", folder / f"{name}.json"
            if not (archive.exists() and meta_path.exists()):
                log(f"packing {name} ...")
                co = checkout(name, prefix or [])
                if prefix is None:
                    files = [p for p in g.out(co, "ls-files", "-z").split("\0") if in_tree(p)]
                    meta = {"files": write_archive(co, files, archive)}
                else:
                    for rel in extra:  # a control's test file, from the full series
                        (co / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(series / rel, co / rel)
                    status = changed_files(co, base_commit)
                    members = sorted({*(p for p, k in status.items() if k != "D"), *extra})
                    members = [p for p in members if in_overlay(p)]
                    meta = {
                        "files": write_archive(co, members, archive),
                        "deleted": [p for p, k in status.items() if k == "D" and in_overlay(p)],
                        "changed": members,
                    }
                meta_path.write_text(json.dumps(meta, indent=1) + "\n")
            shutil.copy2(archive, out_dir / "trees" / f"{name}.tar.xz")
            tree = {"archive": f"trees/{name}.tar.xz"}
            if prefix is not None:
                tree |= {"overlay_of": "base", "patches": [p.name for p in prefix]}
            result["trees"][name] = tree | json.loads(meta_path.read_text())

        add_tree("base")
        if not patches:
            return result

        try:
            series = checkout("series", patches)
        except SeriesError as e:
            raise SeriesError(f"the series does not apply to the base: {e}") from None
        add_tree("series", patches)
        status = changed_files(series, base_commit)
        tests = [p for p in status if is_test_file(p) and status[p] != "D"]
        nodes = {p: added_tests(series, base_commit, p) for p in tests if status[p] != "A"}
        result["series_tests"] = [p for p in tests if p not in nodes] + sum(nodes.values(), [])
        result["tests_not_run"] = [p for p in nodes if not nodes[p]]

        commits = g.out(series, "rev-list", "--reverse", f"{base_commit}..HEAD").split()
        for test in negative_controls:
            path, _, func = test.partition("::")
            pick = [f"-Sdef {func}("] if func else ["--diff-filter=A"]
            log_args = ["log", *pick, "--format=%H", f"{base_commit}..HEAD", "--", path]
            added = g.out(series, *log_args).split() if status.get(path, "D") != "D" else []
            if not added:
                result["negative_controls_missing"].append(test)
                log(f"note: no patch of the series adds {test}; negative control skipped")
                continue
            index = commits.index(added[-1])
            without = patches[index]
            name = f"before-{without.name[:4]}"
            add_tree(name, patches[:index], extra=[path])
            result["negative_controls"].append(
                {"tree": name, "test": test, "without_patch": without.name, "expect": "fail"}
            )
    return result


# --- wheels ------------------------------------------------------------------


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(normalised distribution name, version) from a wheel's file name."""
    parts = filename[: -len(".whl")].split("-")
    return normalise(parts[0]), parts[1]


def fetch_wheels(
    wheels: Sequence[tuple[str, str]] = WHEELS, cache: Path | None = None, log=print
) -> list[Path]:
    """One cp312 manylinux x86_64 wheel per pinned requirement, cached."""
    cache = cache or CACHE_DIR / "wheels"
    binary = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    binary += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    found = []
    for name, version in wheels:
        folder = cache / f"{normalise(name)}-{version}"
        have = sorted(folder.glob("*.whl"))
        if len(have) != 1:  # none, or a failed download's leftovers: fetched again
            shutil.rmtree(folder, ignore_errors=True)
            log(f"downloading {name}=={version} ...")
            rc, detail = base_mod.pip_download(folder, *binary, f"{name}=={version}")
            have = sorted(folder.glob("*.whl"))
            if rc != 0 or len(have) != 1:
                detail = [line for line in detail if line.strip() and "is ignored" not in line]
                raise SeriesError(
                    f"pip found no cp312 manylinux x86_64 wheel of {name}=={version}:\n  "
                    + "\n  ".join(detail[-6:])
                )
        found.append(have[0])
    return found


def check_wheels(paths: Sequence[Path]) -> None:
    """One version per distribution, each for x86_64 (pip picked CPython 3.12 wheels)."""
    seen: dict[str, str] = {}
    for path in paths:
        name, version = wheel_name_version(path.name)
        if name in seen:
            raise SeriesError(f"two versions of {name}: {seen[name]} and {version}")
        seen[name] = version
        platform = path.name[: -len(".whl")].split("-")[-1]
        if not (platform == "any" or "x86_64" in platform):
            raise SeriesError(f"{path.name} is not for x86_64")


# --- the bundle --------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Write the whole bundle into ``--out`` (replacing it), then say what it holds."""
    manifest = manifest_mod.load()
    out_dir = Path(args.out) if args.out else BUNDLE_DIR
    repo, commit, sha = base_mod.materialise_pinned(manifest)
    wheels = fetch_wheels()
    check_wheels(wheels)

    staging = out_dir.with_name(out_dir.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "wheels").mkdir(parents=True)
    for whl in wheels:
        shutil.copy2(whl, staging / "wheels" / whl.name)
    trees = build_trees(repo, base_mod.BASE_BRANCH, manifest.patch_paths(), staging)
    bundle = {
        "schema": 1,
        "series": {"name": manifest.name, "version": manifest.version},
        "base": {
            "project": manifest.base.project,
            "version": manifest.base.version,
            "commit": commit,
            "upstream_commit": manifest.base.upstream_commit,
            "sdist_sha256": sha,
        },
        "patches": [
            {"file": p.file, "subject": p.subject, "patch_id": p.patch_id} for p in manifest.patches
        ],
        "mode": "series" if manifest.patches else "base-only",
        **trees,
        "wheels": [
            {"file": w.name, "name": name, "version": version, "sha256": base_mod.sha256_of(w)}
            for w in wheels
            for name, version in [wheel_name_version(w.name)]
        ],
        "image": {"python": "3.12", "torch": "2.11"},
    }
    (staging / "bundle.json").write_text(json.dumps(bundle, indent=1) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)

    def mib(path: Path) -> str:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        return f"{sum(p.stat().st_size for p in files) / 2**20:.1f} MiB"

    print(
        f"\n{out_dir}: {mib(out_dir)} ({bundle['mode']}; base {bundle['base']['commit'][:12]},"
        f" {len(bundle['patches'])} patches)"
    )
    parts = {"wheels": "wheels", **{name: t["archive"] for name, t in bundle["trees"].items()}}
    for name, path in parts.items():
        print(f"  {name:<14} {mib(out_dir / path)}")
    if bundle["series_tests"]:
        print("  series tests run on the device: " + ", ".join(bundle["series_tests"]))
    for control in bundle["negative_controls"]:
        print(
            f"  negative control: {control['test']} on {control['tree']}"
            f" (without {control['without_patch']})"
        )
    for test in bundle["negative_controls_missing"]:
        print(f"  negative control missing: no patch adds {test}")
    print(
        "\nthen, on a GPU machine (README: GPU qualification):\n"
        "  rsync -aR scripts/device .device gpu-host:series/\n"
        "  ssh gpu-host 'cd series && OUT=$PWD/evidence bash scripts/device/run_all.sh'"
    )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "device-bundle", help="build .device/: wheels and vLLM trees for the GPU machine"
    )
    p.add_argument("--out", help="folder to write (default: .device)")
    p.set_defaults(func=run)
