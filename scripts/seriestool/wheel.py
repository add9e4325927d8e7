"""``wheel``: an installable patched vLLM, made from the released wheel of the
base (README: "Quick start").
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

from . import base as base_mod
from . import git as g
from . import hints, patchset
from . import manifest as manifest_mod
from .device import changed_files
from .errors import SeriesError

CACHE_DIR = base_mod.WORK_DIR / "wheel-cache"
OUT_DIR = base_mod.WORK_DIR / "wheel"
LOCAL_LABEL = "instanttensor"
PLATFORM = "manylinux_2_28_x86_64"  # the platform of the official vLLM image
PACKAGE = "vllm/"  # what the wheel installs of the series' files
ADDED_DATE = (2000, 1, 1, 0, 0, 0)  # zip date of files the series adds
# What zipfile raises reading a damaged archive: a bad header, a cut or corrupt
# stream, a compression method (NotImplementedError) or encryption flag
# (RuntimeError) made up by a bad byte, a seek out of the file (OSError).
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, OSError)


def local_version(version: str, series_version: str, patches: Sequence[Path]) -> str:
    """The patched wheel's version, ``<version>+instanttensor.v<N>.<digest>``: it
    satisfies ``==<version>``, names the series version and, by the digest of
    its patch files, the build (pip takes a wheel of the installed version as
    installed, so another build must have another version): the first 12 hex
    digits of a sha256 over the patch files' sha256s, one a line, in order (the
    sha256s ``patches/series.json`` records)."""
    label = f"{LOCAL_LABEL}.v{series_version}".lower()
    if not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", label):
        raise SeriesError(f"series version {series_version!r} makes no PEP 440 local version")
    sums = "".join(f"{base_mod.sha256_of(path)}\n" for path in patches)
    return f"{version}+{label}.{hashlib.sha256(sums.encode()).hexdigest()[:12]}"


class DamagedWheel(SeriesError):
    """The released wheel is damaged or another one; ``run`` adds how to get it again."""


def record_of(wheel: Path) -> Path:
    """Where the sha256 of a downloaded wheel is kept: beside it, as ``sha256sum`` writes it."""
    return wheel.with_name(wheel.name + ".sha256")


def released_wheel(project: str, version: str, cache: Path = CACHE_DIR, log=print) -> Path:
    """The released wheel of ``project==version`` for PLATFORM, downloaded once.

    pip checks the download against the sha256 the index publishes; it is
    recorded beside the wheel, and the cached wheel is checked against it at
    each use."""
    pattern = f"{project}-{version}-*.whl"
    links = os.environ.get("PIP_FIND_LINKS")  # where pip looks, as its environment says
    no_index = os.environ.get("PIP_NO_INDEX", "").strip().lower() in ("1", "true", "yes", "on")
    index = "" if no_index else os.environ.get("PIP_INDEX_URL") or "PyPI"
    sources = " and ".join(filter(None, [index, links])) or "no index"
    if found := sorted(cache.glob(pattern)):
        wheel, record = found[0], record_of(found[0])
        if not record.is_file():
            raise DamagedWheel(f"{wheel} has no {record.name} beside it, the sha256 recorded when"
                               " `make wheel` downloaded it: it cannot be checked")  # fmt: skip
        recorded, actual = record.read_text().split()[:1], base_mod.sha256_of(wheel)
        if recorded != [actual]:
            raise DamagedWheel(f"{wheel} has sha256 {actual}, not {''.join(recorded)}, the sha256"
                               " recorded when it was downloaded: it is damaged")  # fmt: skip
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    log(f"downloading {project}=={version}'s wheel from {sources} into {cache} (once; a"
        " few hundred MB)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="download-", dir=cache) as tmp:
        args = ["--only-binary=:all:", "--platform", PLATFORM, f"{project}=={version}"]
        rc, detail = base_mod.pip_download(Path(tmp), *args)
        got = sorted(Path(tmp).glob(pattern))
        if rc != 0 or len(got) != 1:
            wanted = f"{project}-{version}-*-{PLATFORM}.whl"
            if links:
                hint = f"PIP_FIND_LINKS={links} holds no {wanted}: put it there"
            elif no_index:
                hint = (f"PIP_NO_INDEX is set: pip reads only PIP_FIND_LINKS=<folder>, a folder"
                        f" with {wanted}")  # fmt: skip
            else:
                hint = f"download {wanted} into {cache}"
            raise SeriesError(
                f"pip found no {PLATFORM} wheel of {project}=={version} in {sources}:\n  "
                + "\n  ".join(detail[-4:]) + f"\n{hint}, or name one with WHEEL=<path>"
            )  # fmt: skip
        dest = cache / got[0].name
        # The record first: a wheel without one is refused, a record alone is unused.
        record_of(dest).write_text(f"{base_mod.sha256_of(got[0])}  {dest.name}\n")
        return Path(shutil.move(str(got[0]), dest))


def check_released(released: Path, project: str, version: str) -> None:
    """Refuse a file that is no complete and intact zip file (every member is
    read, checking its CRC), or that holds another release than
    ``project==version``, whatever its name says."""
    try:
        with zipfile.ZipFile(released) as zin:
            bad = zin.testzip()
            found = [n for n in zin.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            metadata = zin.read(found[0]).decode(errors="replace") if len(found) == 1 else ""
    except ZIP_ERRORS as e:
        raise DamagedWheel(f"{released} is not a complete zip file ({e}): a truncated or"
                           " damaged download") from None  # fmt: skip
    if bad:
        raise DamagedWheel(f"{released} is damaged: {bad} in it fails its CRC-32 check")
    fields = dict(re.findall(r"(?m)^(Name|Version): *(.*?) *$", metadata.partition("\n\n")[0]))
    held = (fields.get("Name", "").lower().replace("_", "-"), fields.get("Version"))
    if not found or None in held:
        raise DamagedWheel(f"{released} holds no single *.dist-info/METADATA naming a project"
                           f" and version: it is no wheel of {project} {version}")  # fmt: skip
    if held != (project, version):
        raise DamagedWheel(f"{released} holds {held[0]} {held[1]} (its {found[0]}), not"
                           f" {project} {version}, the base the series applies to")  # fmt: skip


def series_files(base_repo: Path, base_branch: str, patches: Sequence[Path]) -> dict:
    """``{path: content after the series, None if it deletes it}`` under PACKAGE,
    from the series applied to a clone of the base as ``apply`` applies it."""
    base_mod.WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheel-", dir=base_mod.WORK_DIR) as tmp:
        checkout = base_mod.clone(base_repo, Path(tmp) / "series", branch=base_branch)
        try:
            patchset.am(checkout, patches)
        except SeriesError as e:
            raise SeriesError(f"the series does not apply to the base: {e}") from None
        return {
            p: None if kind == "D" else g.blob(checkout, f"HEAD:{p}")
            for p, kind in changed_files(checkout, f"origin/{base_branch}").items()
            if p.startswith(PACKAGE)
        }


def build(base_repo: Path, base_branch: str, patches: Sequence[Path], released: Path,
          series_version: str, out_dir: Path = OUT_DIR) -> Path:  # fmt: skip
    """Write the patched wheel, the released one with the series' files and the
    new version, into ``out_dir``, in place of any other wheel of the project
    there; returns its path.  A damaged ``released`` or another release raises
    ``DamagedWheel``, and ``out_dir`` stays as it was."""
    project, version, tags = released.name[: -len(".whl")].split("-", 2)
    check_released(released, project, version)
    new_version = local_version(version, series_version, patches)
    series = series_files(base_repo, base_branch, patches)
    dest = out_dir / f"{project}-{new_version}-{tags}.whl"
    info_dir = f"{project}-{version}.dist-info/"
    renames = {f"{project}-{version}.{kind}/": f"{project}-{new_version}.{kind}/"
               for kind in ("dist-info", "data")}  # fmt: skip
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with (
        zipfile.ZipFile(released) as zin,
        tempfile.TemporaryDirectory(prefix="wheel-", dir=out_dir.parent) as tmp,
    ):
        names = set(zin.namelist())
        if f"{info_dir}RECORD" not in names:
            raise DamagedWheel(f"{released} has no {info_dir}RECORD: it is no wheel")
        for path in sorted(series):  # nothing is written before every file matches
            have = zin.read(path) if path in names else None
            want = g.blob(base_repo, f"{base_branch}:{path}")
            if have != want:
                how = ("is missing, unlike in" if have is None
                       else "is in it, not in" if want is None else "differs from")  # fmt: skip
                raise DamagedWheel(
                    f"{path} in {released.name} {how} the base {project} {version} the series"
                    f" applies to: refusing to build (is {released} the released wheel of"
                    f" {project}=={version}?)"
                )  # fmt: skip
        record = csv.reader(io.StringIO(zin.read(f"{info_dir}RECORD").decode()))
        hashes = {row[0]: row[1] for row in record if row}
        rows = []
        with zipfile.ZipFile(Path(tmp) / dest.name, "w") as zout:
            for info in zin.infolist():
                name = info.filename
                if name.startswith(f"{info_dir}RECORD") or series.get(name, b"") is None:
                    continue  # rewritten below (a signature would not hold), or deleted
                old = next((o for o in renames if name.startswith(o)), None)
                new = member(renames[old] + name[len(old) :] if old else name, info)
                if name in series:
                    rows.append(write(zout, new, [series[name]]))
                elif name == f"{info_dir}METADATA":  # check_released found its Version field
                    head, sep, body = zin.read(name).partition(b"\n\n")
                    head = re.sub(rb"(?m)^Version:.*$", f"Version: {new_version}".encode(), head)
                    rows.append(write(zout, new, [head + sep + body]))
                else:
                    with zin.open(info) as src:
                        rows.append(write(zout, new, iter(lambda: src.read(1 << 20), b"")))
                    if hashes.get(name, rows[-1][1]) not in ("", rows[-1][1]):
                        raise DamagedWheel(f"{name} in {released} does not match its RECORD:"
                                           " the file is damaged")  # fmt: skip
            for path in sorted(p for p in series if p not in names):  # what the series adds
                rows.append(write(zout, member(path), [series[path]]))
            rows.append((renames[info_dir] + "RECORD", "", ""))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            zout.writestr(member(rows[-1][0], zin.getinfo(f"{info_dir}RECORD")), text.getvalue())
        out_dir.mkdir(exist_ok=True)
        (Path(tmp) / dest.name).replace(dest)
    for older in set(out_dir.glob(f"{project}-*.whl")) - {dest}:
        older.unlink()  # one wheel: `pip install work/wheel/vllm-*.whl` takes it
    return dest


def member(name: str, like: zipfile.ZipInfo | None = None) -> zipfile.ZipInfo:
    """A zip entry named ``name`` with ``like``'s date and mode (else fixed ones)."""
    info = zipfile.ZipInfo(name, like.date_time if like else ADDED_DATE)
    info.external_attr = like.external_attr if like else 0o100644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def write(zout: zipfile.ZipFile, info: zipfile.ZipInfo, chunks) -> tuple[str, str, str]:
    """Write one member from ``chunks`` of bytes; returns its RECORD row."""
    digest, size = hashlib.sha256(), 0
    with zout.open(info, "w") as f:
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            f.write(chunk)
    encoded = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return info.filename, f"sha256={encoded}", str(size)


def run(args: argparse.Namespace) -> int:
    manifest = manifest_mod.load()
    project, version = manifest.base.project, manifest.base.version
    if args.wheel and not args.wheel.is_file():  # before the base is materialised
        raise SeriesError(f"WHEEL=: {hints.no_checkout(args.wheel, 'a file')}; it names the"
                          f" released wheel of {project} {version} ({project}-{version}-*.whl)"
                          " you have; without WHEEL= pip downloads it")  # fmt: skip
    patches = manifest.patch_paths()
    try:
        if args.wheel and not args.wheel.name.startswith(f"{project}-{version}-"):
            named = " ".join(args.wheel.name.split("-")[:2])
            raise DamagedWheel(f"{args.wheel} is named as a wheel of {named}, not {project}"
                               f" {version}, the base the series applies to")  # fmt: skip
        released = args.wheel or released_wheel(project, version, CACHE_DIR)
        repo, _commit, _sha = base_mod.materialise_pinned(manifest)
        dest = build(repo, base_mod.BASE_BRANCH, patches, released, manifest.version, OUT_DIR)
    except DamagedWheel as e:  # how to get the released wheel again
        make = hints.make("wheel")
        if args.wheel:
            how = (f"get the released wheel of {project}=={version} (`pip download --no-deps"
                   f" --only-binary=:all: --platform {PLATFORM} -d <folder> {project}=={version}`:"
                   f" pip checks it against the index's sha256), or leave WHEEL= out: `{make}`"
                   " downloads it")  # fmt: skip
        else:
            cached = sorted(CACHE_DIR.glob(f"{project}-{version}-*.whl"))
            paths = " ".join(shlex.quote(str(p)) for w in cached for p in (w, record_of(w)))
            how = f"delete it (`rm -f {paths}`) and run `{make}` again: it downloads it again"
        raise SeriesError(f"{e}\n{how}") from None
    built = local_version(version, manifest.version, patches)
    print(f"wrote {dest}: {project} {version} with the {len(patches)} patches of series"
          f" {manifest.version}, version {built}.\nInstall it as {project} {version} itself:"
          f" pip resolves that release's own dependencies (where {project}=={version} is"
          f" installed, only {project}'s files change; `--dry-run` first shows what would):"
          f"\n  pip install {shlex.quote(str(dest))}\nthen `pip show {project}` shows Version:"
          f" {built}, and `pip check` no broken requirement.")  # fmt: skip
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("wheel", help="a patched vLLM wheel from the released one")
    p.add_argument("--wheel", type=hints.user_path, help="the released wheel (default: fetched)")
    p.set_defaults(func=run)
