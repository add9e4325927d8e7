"""``make wheel``: a patched vLLM wheel from the released one.

The tests build from a small stand-in wheel of the released layout (``vllm/``
files as the base has them, a dist-info folder with METADATA, WHEEL and
RECORD), install the result with pip into a fresh venv and compare what is
installed with the series applied by plain ``git am``.  The released vLLM
wheel (hundreds of MB) is used only when ``make wheel`` has already cached it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import types
import venv
import zipfile
from pathlib import Path

import pytest
from seriestool import base as base_mod
from seriestool import manifest as manifest_mod
from seriestool import wheel
from seriestool.errors import SeriesError

BASE = {
    "vllm/__init__.py": "",
    "vllm/loader.py": "def load(x):\n    return x\n",
    "vllm/old.py": "OLD = 1\n",
    "vllm/kept.py": "KEPT = 1\n",
    "docs/readme.md": "docs\n",
    "tests/test_loader.py": "def test_load():\n    pass\n",
}
TAGS = "py3-none-any"


def record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def make_standin(path: Path, files: dict[str, bytes], version: str = "1.0", requires: str = "",
                 project: str = "vllm") -> Path:  # fmt: skip
    """A wheel laid out as vLLM's: the package, then dist-info with RECORD last;
    ``requires``: its Requires-Dist lines."""
    info = f"{project}-{version}.dist-info/"
    metadata = f"Metadata-Version: 2.4\nName: {project}\nVersion: {version}\n{requires}\n"
    members = {
        **files,
        f"{info}METADATA": metadata + "About.\n",
        f"{info}WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {TAGS}\n",
        f"{info}entry_points.txt": "[console_scripts]\nvllm = vllm.loader:load\n",
    }
    members = {k: v.encode() if isinstance(v, str) else v for k, v in members.items()}
    rows = [record_row(n, d) for n, d in members.items()] + [[f"{info}RECORD", "", ""]]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    dest = path / f"{project}-{version}-{TAGS}.whl"
    path.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}RECORD", text.getvalue())
    return dest


@pytest.fixture
def toy(make_repo, tmp_path, monkeypatch):
    """A vLLM-shaped base, a series that changes, adds and deletes vllm/ files
    (and touches docs and tests), the same tree applied by git am, and a
    stand-in released wheel of the base."""
    monkeypatch.setattr(base_mod, "WORK_DIR", tmp_path / "work")
    repo = make_repo("upstream", BASE)
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    one = {"vllm/loader.py": "def load(x):\n    return x + 1\n", "docs/readme.md": "docs 2\n"}
    repo.commit("[Loader] one", one)
    two = {"vllm/added.py": "ADDED = 2\n", "vllm/old.py": None, "tests/test_added.py": "pass\n"}
    repo.commit("[Loader] two", two)
    patch_dir = tmp_path / "patches"
    subprocess.run(["git", "-C", str(repo.path), "format-patch", "-q", "-o", str(patch_dir),
                    f"{base}..work"], check=True)  # fmt: skip
    applied = base_mod.clone(repo.path, tmp_path / "applied", branch="work")
    repo.git("checkout", "-q", "main")
    files = {k: v.encode() for k, v in BASE.items() if k.startswith("vllm/")}
    files["vllm/_C.abi3.so"] = bytes(range(256)) * 64  # a binary member, copied as is
    return repo, sorted(patch_dir.glob("*.patch")), applied, files


def build(toy, files, tmp_path, **kw):
    repo, patches, _applied, _ = toy
    released = make_standin(tmp_path / "released", files)
    return wheel.build(repo.path, "main", patches, released, "4", tmp_path / "out", **kw)


def check_record(path: Path) -> dict[str, bytes]:
    """Every member's RECORD row is its sha256 and size; returns the members."""
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    rows = list(csv.reader(io.StringIO(members[record].decode())))
    assert {r[0] for r in rows} == set(members)
    assert all(r == record_row(r[0], members[r[0]]) for r in rows if r[0] != record)
    return members


def fresh_venv(path: Path) -> Path:
    """A venv without pip (pip installs into it from outside); returns its python."""
    venv.create(path, with_pip=False)
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-index", "--disable-pip-version-check", *map(str, args)],
                   check=True)  # fmt: skip


def installed_version(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('vllm'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_the_built_wheel_installs_the_patched_vllm(toy, tmp_path):
    _repo, patches, applied, files = toy
    dest = build(toy, files, tmp_path)
    version = wheel.local_version("1.0", "4", patches)
    assert dest.name == f"vllm-{version}-{TAGS}.whl"
    members = check_record(dest)
    info = f"vllm-{version}.dist-info/"
    assert f"\nVersion: {version}\n".encode() in members[f"{info}METADATA"]
    assert (
        members[f"{info}WHEEL"]
        == f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {TAGS}\n".encode()
    )
    assert not [n for n in members if n.startswith("vllm-1.0.dist-info/")]

    python = fresh_venv(tmp_path / "venv")
    pip_install(python, dest)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", where], capture_output=True, text=True, check=True)
    site = Path(site.stdout.strip())
    for path in ("vllm/loader.py", "vllm/added.py", "vllm/kept.py", "vllm/__init__.py"):
        assert (site / path).read_bytes() == (applied / path).read_bytes(), path
    assert not (site / "vllm/old.py").exists()
    assert (site / "vllm/_C.abi3.so").read_bytes() == files["vllm/_C.abi3.so"]
    assert not (site / "docs").exists() and not (site / "tests").exists()
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m, vllm.added, vllm.loader;"
         " print(vllm.loader.load(1), vllm.added.ADDED, m.version('vllm'))"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["2", "2", version]

    # The next series version's wheel takes the place of this one.
    repo, patches, _applied, _ = toy
    newer = wheel.build(
        repo.path,
        "main",
        patches,
        dest.parent.parent / "released" / f"vllm-1.0-{TAGS}.whl",
        "5",
        dest.parent,
    )
    assert sorted(dest.parent.iterdir()) == [newer] and newer.name.startswith(
        "vllm-1.0+instanttensor.v5."
    )


@pytest.mark.parametrize(
    "path, content, how",
    [
        ("vllm/loader.py", b"def load(x):\n    return -x\n", "differs from"),
        ("vllm/old.py", None, "is missing, unlike in"),  # a file the series deletes
        ("vllm/added.py", b"ADDED = 2\n", "is in it, not in"),  # one the series adds
    ],
)
def test_a_touched_file_that_is_not_the_base_is_refused(toy, tmp_path, path, content, how):
    files = dict(toy[3])
    if content is None:
        del files[path]
    else:
        files[path] = content
    with pytest.raises(
        SeriesError, match=f"^{path} in vllm-1.0-{TAGS}.whl {how} the base vllm 1.0"
    ):
        build(toy, files, tmp_path)
    assert not (tmp_path / "out").exists()


def test_a_member_that_does_not_match_the_release_record_is_refused(toy, tmp_path):
    files = dict(toy[3])
    released = make_standin(tmp_path / "released", files)
    damaged = tmp_path / "damaged" / released.name
    damaged.parent.mkdir()
    with zipfile.ZipFile(released) as zin, zipfile.ZipFile(damaged, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            zout.writestr(item, b"KEPT = 2\n" if item.filename == "vllm/kept.py" else data)
    repo, patches, _applied, _ = toy
    with pytest.raises(SeriesError, match="vllm/kept.py in .* does not match its RECORD"):
        wheel.build(repo.path, "main", patches, damaged, "4", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", ["missing", "relative", "folder"])
def test_a_released_wheel_that_is_not_there_is_named(tmp_path, monkeypatch, capsys, given):
    """WHEEL= naming no file: said so before the base is materialised (not a
    hint about free space), with what WHEEL= expects."""
    from seriestool import cli

    base = manifest_mod.load().base
    name = f"{base.project}-{base.version}-{TAGS}.whl"
    path = {"missing": tmp_path / name, "relative": Path("nowhere") / name,
            "folder": tmp_path / name}[given]  # fmt: skip
    if given == "folder":
        path.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(base_mod, "materialise_pinned", lambda _m: (tmp_path, "", ""))
    monkeypatch.setattr(wheel, "series_files", lambda *_a: {})
    assert cli.main(["wheel", "--wheel", str(path)]) == 1
    error = capsys.readouterr().err
    shown = str(path) if given != "relative" else f"{path} (that is {tmp_path / path})"
    assert f"WHEEL=: {shown} {'is not a file' if given == 'folder' else 'does not exist'}" in error
    assert f"released wheel of {base.project} {base.version}" in error
    assert "free space" not in error


def damaged(released: Path, how: str) -> bytes:
    """The bytes of ``released`` damaged ``how``."""
    data = released.read_bytes()
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "flipped":  # a byte inside vllm/_C.abi3.so's compressed data
        with zipfile.ZipFile(released) as zf:
            info = zf.getinfo("vllm/_C.abi3.so")
        at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 100
        return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
    raise AssertionError(how)


@pytest.fixture
def wheel_cli(toy, tmp_path, monkeypatch, capsys):
    """``make wheel`` on the toy series: returns a function that runs it with
    its arguments and returns (exit status, stdout, stderr); the base is the toy's
    repository, the cache and output folders are under ``tmp_path``."""
    from seriestool import cli

    repo, patches, _applied, files = toy
    stand_in = types.SimpleNamespace(base=types.SimpleNamespace(project="vllm", version="1.0"),
                                     version="4", patch_paths=lambda: patches)  # fmt: skip
    monkeypatch.setattr(manifest_mod, "load", lambda: stand_in)
    monkeypatch.setattr(base_mod, "materialise_pinned", lambda _m: (repo.path, "", ""))
    monkeypatch.setattr(base_mod, "BASE_BRANCH", "main")
    monkeypatch.setattr(wheel, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(wheel, "OUT_DIR", tmp_path / "out")

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["wheel", *argv])
        return code, *capsys.readouterr()

    return run


@pytest.mark.parametrize("how", ["truncated", "flipped", "another version"])
def test_a_damaged_or_wrong_wheel_given_is_a_message(toy, tmp_path, wheel_cli, how):
    files = dict(toy[3])
    given = tmp_path / "given" / f"vllm-1.0-{TAGS}.whl"
    given.parent.mkdir()
    if how == "another version":  # the wheel of another release, renamed
        given.write_bytes(make_standin(tmp_path / "other", files, "0.9").read_bytes())
    else:
        given.write_bytes(damaged(make_standin(tmp_path / "released", files), how))
    code, _out, error = wheel_cli("--wheel", str(given))
    assert code == 1 and "Traceback" not in error
    wrong = {
        "truncated": "is not a complete zip file",
        "flipped": "is damaged: vllm/_C.abi3.so in it fails its CRC-32 check",
        "another version": "holds vllm 0.9 (its vllm-0.9.dist-info/METADATA), not vllm 1.0",
    }
    assert f"error: {given} {wrong[how]}" in error
    assert "pip download --no-deps --only-binary=:all: --platform" in error
    assert "vllm==1.0" in error and "or leave WHEEL= out" in error
    assert not (tmp_path / "out").exists()


def test_every_damaged_byte_or_length_is_a_message_or_harmless(toy, tmp_path, monkeypatch):
    """A byte flipped anywhere in the released wheel, or the file cut anywhere:
    the build either refuses it with a message or, where the byte is one no
    reader uses (a zip date), builds the same files."""
    repo, patches, _applied, files = toy
    released = make_standin(tmp_path / "released", files)
    good = check_record(wheel.build(repo.path, "main", patches, released, "4", tmp_path / "good"))
    series = wheel.series_files(repo.path, "main", patches)
    monkeypatch.setattr(wheel, "series_files", lambda *_a: series)
    data = released.read_bytes()
    variants = [data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]
                for at in range(0, len(data), 5)]  # fmt: skip
    variants += [data[:length] for length in range(0, len(data), len(data) // 40)]
    for n, variant in enumerate(variants):
        given = tmp_path / f"v{n}" / released.name
        given.parent.mkdir()
        given.write_bytes(variant)
        try:
            built = wheel.build(repo.path, "main", patches, given, "4", tmp_path / f"out{n}")
        except wheel.DamagedWheel as e:
            assert str(e).startswith(("vllm/", str(given))), e
            assert not (tmp_path / f"out{n}").exists()
        else:
            assert check_record(built) == good


def test_a_wheel_named_for_another_version_is_refused(tmp_path, wheel_cli):
    given = make_standin(tmp_path / "given", {"vllm/__init__.py": b""}, "0.9")
    code, _out, error = wheel_cli("--wheel", str(given))
    assert code == 1
    assert f"error: {given} is named as a wheel of vllm 0.9, not vllm 1.0, the base" in error
    assert "pip download" in error


def test_the_cached_wheel_is_checked_against_the_sha256_recorded_at_download(
    toy, tmp_path, wheel_cli, monkeypatch
):
    """pip download checks the wheel against the index's sha256; the tool
    records it beside the wheel and checks it at each use."""
    from seriestool import interrupts

    released = make_standin(tmp_path / "released", dict(toy[3]))
    downloads = []

    def pip_download(cmd, **_kw):
        downloads.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        (folder / released.name).write_bytes(released.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(interrupts, "run", pip_download)
    code, _out, error = wheel_cli()
    assert code == 0, error
    cached = tmp_path / "cache" / released.name
    record = cached.with_name(cached.name + ".sha256")
    digest = hashlib.sha256(released.read_bytes()).hexdigest()
    assert record.read_text() == f"{digest}  {released.name}\n"  # as sha256sum writes it
    built = sorted((tmp_path / "out").iterdir())
    assert wheel_cli()[::2] == (0, "") and len(downloads) == 1  # used again, not downloaded

    for how in ("flipped", "truncated"):
        cached.write_bytes(damaged(released, how))
        code, _out, error = wheel_cli()
        assert code == 1 and "Traceback" not in error
        assert f"error: {cached} has sha256 " in error and f"not {digest}, the sha256" in error
        assert f"rm -f {cached} {record}" in error
        assert sorted((tmp_path / "out").iterdir()) == built  # the earlier build is kept
    record.unlink()
    cached.write_bytes(released.read_bytes())
    code, _out, error = wheel_cli()
    assert code == 1 and f"error: {cached} has no {record.name} beside it" in error
    assert f"rm -f {cached} {record}" in error and len(downloads) == 1


def test_the_install_command_printed_leaves_no_mixed_environment(toy, tmp_path, wheel_cli):
    """Over another release, the command ``make wheel`` prints installs the
    base's own dependencies with it: ``pip check`` finds nothing broken."""
    files = dict(toy[3])
    index = tmp_path / "index"  # what pip may install: a dependency of each release
    for version in ("1", "2"):
        make_standin(index, {}, version, project="dep")
    python = fresh_venv(tmp_path / "venv")
    other = make_standin(tmp_path / "other", files, "1.1", "Requires-Dist: dep==2\n")
    pip_install(python, "--find-links", index, other)
    released = make_standin(tmp_path / "released", files, "1.0", "Requires-Dist: dep==1\n")
    code, out, error = wheel_cli("--wheel", str(released))
    assert code == 0, error
    [command] = [line.split() for line in out.splitlines() if line.strip().startswith("pip ")]
    assert command[:2] == ["pip", "install"]
    pip_install(python, "--find-links", index, *command[2:])
    check = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "check"],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout
    assert installed_version(python) == wheel.local_version("1.0", "4", toy[1])


def test_offline_the_download_names_its_folder_and_pip_find_links(tmp_path, monkeypatch):
    """With PIP_FIND_LINKS the download says it reads that folder, not PyPI;
    offline without the wheel there, the refusal says what PIP_FIND_LINKS is for."""
    from seriestool import interrupts

    folder = tmp_path / "wheels"
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    missing = "ERROR: No matching distribution found for vllm==1.0"
    failed = subprocess.CompletedProcess([], 1, "", missing)
    monkeypatch.setattr(interrupts, "run", lambda *_a, **_kw: failed)
    said: list[str] = []
    with pytest.raises(SeriesError) as refused:
        wheel.released_wheel("vllm", "1.0", tmp_path / "cache", log=said.append)
    assert "PyPI" not in said[0] and f"from {folder}" in said[0]
    assert missing in str(refused.value)
    assert f"PIP_FIND_LINKS={folder} holds no vllm-1.0-*-{wheel.PLATFORM}.whl" in str(refused.value)
    monkeypatch.delenv("PIP_FIND_LINKS")
    with pytest.raises(SeriesError) as refused:
        wheel.released_wheel("vllm", "1.0", tmp_path / "cache", log=said.append)
    assert "PIP_NO_INDEX is set: pip reads only PIP_FIND_LINKS=<folder>" in str(refused.value)


def renamed_patches(patches: list[Path], folder: Path) -> list[Path]:
    """Copies of ``patches`` whose second subject is reworded: other bytes, same files."""
    folder.mkdir()
    for patch in patches:
        (folder / patch.name).write_bytes(patch.read_bytes().replace(b"] two", b"] 2"))
    return sorted(folder.iterdir())


def test_the_local_version_names_the_series_and_its_patches_and_keeps_the_pin(toy, tmp_path):
    version = pytest.importorskip("packaging.version")
    specifiers = pytest.importorskip("packaging.specifiers")
    patches = toy[1]
    built = wheel.local_version("0.33.0", "4", patches)
    assert re.fullmatch(r"0\.33\.0\+instanttensor\.v4\.[0-9a-f]{12}", built)
    assert str(version.Version(built)) == built
    assert specifiers.SpecifierSet("==0.33.0").contains(built)
    assert wheel.local_version("0.33.0", "4", list(patches)) == built  # the same patches
    other = renamed_patches(patches, tmp_path / "other")
    assert wheel.local_version("0.33.0", "4", other) != built
    assert wheel.local_version("0.33.0", "4", patches[::-1]) != built  # another order
    with pytest.raises(SeriesError, match="no PEP 440 local version"):
        wheel.local_version("0.33.0", "4-rc 1", patches)


def test_a_rebuild_from_other_patches_replaces_the_installed_one(toy, tmp_path):
    """pip takes a wheel of the installed version as installed: another build
    of the same series version must have another version to be installed."""
    repo, patches, _applied, files = toy
    first = build(toy, files, tmp_path)
    other = renamed_patches(patches, tmp_path / "other")
    released = tmp_path / "released" / f"vllm-1.0-{TAGS}.whl"
    second = wheel.build(repo.path, "main", other, released, "4", tmp_path / "again")
    assert second.name != first.name
    python = fresh_venv(tmp_path / "venv")
    shown = []
    for dest in (first, second):
        pip_install(python, dest)
        shown.append(installed_version(python))
    assert shown == [wheel.local_version("1.0", "4", p) for p in (patches, other)]


def test_the_released_wheel_when_cached(tmp_path):
    """The pinned release, end to end, when ``make wheel`` has fetched it."""
    manifest = manifest_mod.load()
    project, version = manifest.base.project, manifest.base.version
    released = sorted(wheel.CACHE_DIR.glob(f"{project}-{version}-*.whl"))
    repo = base_mod.base_repo_path(project, version)
    if not released or not repo.exists():
        pytest.skip(f"no released wheel in {wheel.CACHE_DIR} or no base: run `make wheel` first")
    dest = wheel.build(repo, base_mod.BASE_BRANCH, manifest.patch_paths(), released[0],
                       manifest.version, tmp_path / "out")  # fmt: skip
    applied = base_mod.clone(repo, tmp_path / "applied")
    subprocess.run(["git", "-C", str(applied), "-c", "user.name=t", "-c", "user.email=t@t", "am",
                    "-q", *map(str, manifest.patch_paths())], check=True)  # fmt: skip
    touched = subprocess.run(["git", "-C", str(applied), "diff", "--name-status", "--no-renames",
                              "origin/base", "HEAD", "--", "vllm/"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    touched = touched.stdout.splitlines()
    members = check_record(dest)
    for kind, path in (line.split("\t") for line in touched):
        assert members.get(path) == (None if kind == "D" else (applied / path).read_bytes()), path
    assert len(touched) > 0


def test_the_readme_load_options_give_every_key_the_patches_accept(tmp_path):
    """The README's load options: every key the patched loader accepts (its
    ``INSTANTTENSOR_SETTINGS``), with its type, default and variable; and the
    command that lists a checkpoint's largest tensors runs on one."""
    st = pytest.importorskip("safetensors.numpy")
    np = pytest.importorskip("numpy")
    readme = (manifest_mod.ROOT / "README.md").read_text()
    options = readme.split("### Load options", 1)[1].split("\n## ", 1)[0]
    code = re.sub(r"(?m)^\+", "", "".join(p.read_text() for p in manifest_mod.load().patch_paths()))
    accepted = dict(re.findall(r'(?m)^    "(instanttensor_\w+)": "an? (.+)",$', code))
    # The variables the patched loader reads, each named for the key it stands for.
    variables = {
        f"instanttensor_{name.lower()}": f"INSTANTTENSOR_{name}"
        for name in re.findall(r'os\.environ\.get\("INSTANTTENSOR_(\w+)"\)', code)
    }
    rows = [[cell.strip() for cell in line.split("|")[1:4]] for line in options.splitlines()
            if line.startswith("| `instanttensor_")]  # fmt: skip
    assert sorted(row[0].strip("`") for row in rows) == sorted(accepted)
    assert variables and set(variables) <= set(accepted), variables
    for key, kind, variable in rows:
        key = key.strip("`")
        assert kind.startswith(accepted[key]) and re.search(r"\(.+\)$", kind), key
        assert variable.startswith(f"`{variables[key]}`") if key in variables else not variable
    assert "those tensors" not in options

    for name, tensors in {
        "a": {"embed": (4096, 1024), "norm": (8,)},
        "b": {"w": (512, 512)},
    }.items():
        st.save_file({k: np.zeros(shape, np.float32) for k, shape in tensors.items()},
                     tmp_path / f"{name}.safetensors")  # fmt: skip
    [command] = [line for line in options.splitlines() if line.startswith("python3 -c ")]
    shown = subprocess.run(["bash", "-c", command.replace("<model>", str(tmp_path))],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert [line.split() for line in shown.splitlines()] == [
        ["0.0", "MiB", "norm"], ["1.0", "MiB", "w"], ["16.0", "MiB", "embed"]
    ]  # fmt: skip


def test_the_quick_start_says_what_the_first_run_needs_and_where_the_user_docs_are():
    """The time and disk of the first run hold for a CPU build of torch; the
    user docs of the series are in the patched source, not in the wheel."""
    readme = (manifest_mod.ROOT / "README.md").read_text()
    quick = " ".join(readme.split("## Quick start", 1)[1].split("\n## ", 1)[0].split())
    assert re.search(r"about 5 minutes and \d+ GB where pip finds torch [\d.]+'s CPU build", quick)
    assert "from plain PyPI it takes the CUDA build, about 5 GB more" in quick
    assert "the patched `docs/" not in quick
    assert "`docs/models/extensions/instanttensor.md` in the vLLM source with the series" in quick
