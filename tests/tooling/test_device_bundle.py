"""``device-bundle`` and the scripts that run on the GPU machine, tested on CPU.

The trees are checked on a throw-away repository and series: an overlay laid
over the base must give exactly the patched checkout, the negative-control
tree exactly the prefix plus the control's test file.  The device scripts are
compiled, their report code fed made-up results, and (when the materialised
vLLM base is cached, as after ``make venv``) the whole device procedure runs
once on CPU against the real base tree with a stand-in ``instanttensor``.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from seriestool import base as base_mod
from seriestool import device, interrupts
from seriestool import git as g
from seriestool import manifest as manifest_mod
from seriestool.errors import SeriesError

ROOT = Path(__file__).resolve().parents[2]
DEVICE_SCRIPTS = ROOT / "scripts" / "device"
sys.path.insert(0, str(DEVICE_SCRIPTS))
import common  # noqa: E402
import report  # noqa: E402

CONTROL = "tests/model/test_control.py"


@pytest.fixture
def toy(make_repo, tmp_path, monkeypatch):
    """A vLLM-shaped repo and a 3-patch series: the second patch adds the
    control test; patches change, add and delete files under vllm/."""
    monkeypatch.setattr(device, "CACHE_DIR", tmp_path / "cache")
    repo = make_repo(
        "upstream",
        {
            "vllm/__init__.py": "",
            "vllm/loader.py": "def load(x):\n    return x\n",
            "vllm/old.py": "OLD = 1\n",
            "vllm/data/config.json": "{}\n",
            "docs/readme.md": "docs\n",
            "pyproject.toml": "[tool.pytest.ini_options]\n",
            "tests/__init__.py": "",
            "tests/model/__init__.py": "",
            "tests/model/test_upstream.py": "def test_up():\n    pass\n",
        },
    )
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit(
        "[Loader] one",
        {
            "vllm/loader.py": "def load(x):\n    # one\n    return x\n",
            "tests/model/test_one.py": "def test_one():\n    pass\n",
            "docs/readme.md": "docs changed\n",
        },
    )
    repo.commit(
        "[Reload] two",
        {
            "vllm/reload.py": "OWN = True\n",
            CONTROL: "def test_ctl():\n    pass\n",
        },
    )
    repo.commit(
        "[Loader] three",
        {
            "vllm/old.py": None,
            "vllm/loader.py": "def load(x):\n    # three\n    return x\n",
            "tests/model/test_upstream.py": (
                "def test_up():\n    assert True\n\n\ndef test_new():\n    pass\n"
            ),
        },
    )
    patch_dir = tmp_path / "patches"
    subprocess.run(
        ["git", "-C", str(repo.path), "format-patch", "-q", "-o", str(patch_dir), f"{base}..work"],
        check=True,
    )
    repo.git("checkout", "-q", "main")
    return repo, sorted(patch_dir.glob("*.patch"))


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_overlays_reproduce_the_patched_checkouts(toy, tmp_path):
    repo, patches = toy
    out = tmp_path / "bundle"
    meta = device.build_trees(
        repo.path, "main", patches, out, negative_controls=[CONTROL], log=lambda *_: None
    )
    bundle = {"trees": meta["trees"]}
    assert set(meta["trees"]) == {"base", "series", "before-0002"}
    assert meta["series_tests"] == [
        "tests/model/test_control.py",
        "tests/model/test_one.py",
        "tests/model/test_upstream.py::test_new",  # upstream file: only what the series adds
    ]
    assert meta["tests_not_run"] == []
    assert meta["negative_controls"] == [
        {"tree": "before-0002", "test": CONTROL, "without_patch": patches[1].name, "expect": "fail"}
    ]
    assert meta["trees"]["series"]["deleted"] == ["vllm/old.py"]

    # The series tree is the base with all patches applied: every carried
    # file has the patched content, deleted files are gone, docs not carried.
    series = common.unpack_tree(out, bundle, "series", tmp_path / "t-series")
    full = base_mod.clone(repo.path, tmp_path / "full", branch="main")
    subprocess.run(["git", "-C", str(full), "am", "-q", *map(str, patches)], check=True)
    got = tree_files(series)
    want = {f: (full / f).read_bytes() for f in got}
    assert got == want
    assert "vllm/old.py" not in got and "docs/readme.md" not in got
    assert {
        "vllm/reload.py",
        "tests/model/test_one.py",
        CONTROL,
        "pyproject.toml",
        "tests/model/test_upstream.py",
        "vllm/data/config.json",
    } <= set(got)

    # The control tree: patch 0001 only, plus the control's test file.
    before = tree_files(common.unpack_tree(out, bundle, "before-0002", tmp_path / "t-before"))
    assert before["vllm/loader.py"] == b"def load(x):\n    # one\n    return x\n"
    assert "vllm/reload.py" not in before and "vllm/old.py" in before
    assert before[CONTROL] == (full / CONTROL).read_bytes()

    base_tree = tree_files(common.unpack_tree(out, bundle, "base", tmp_path / "t-base"))
    assert base_tree["vllm/loader.py"] == b"def load(x):\n    return x\n"
    assert "tests/model/test_upstream.py" not in base_tree  # only __init__.py of tests/


def test_missing_control_and_empty_series(toy, tmp_path):
    repo, patches = toy
    meta = device.build_trees(
        repo.path,
        "main",
        patches,
        tmp_path / "b1",
        negative_controls=["tests/nowhere/test_x.py"],
        log=lambda *_: None,
    )
    assert meta["negative_controls"] == []
    assert meta["negative_controls_missing"] == ["tests/nowhere/test_x.py"]
    meta = device.build_trees(repo.path, "main", [], tmp_path / "b2", log=lambda *_: None)
    assert set(meta["trees"]) == {"base"}


def test_archives_are_deterministic_and_cached(toy, tmp_path, monkeypatch):
    repo, patches = toy
    digests = []
    for i in range(2):
        monkeypatch.setattr(device, "CACHE_DIR", tmp_path / f"cache{i}")
        out = tmp_path / f"out{i}"
        device.build_trees(repo.path, "main", patches, out, log=lambda *_: None)
        digests.append(
            {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "trees").iterdir()}
        )
    assert digests[0] == digests[1]
    packed = []
    device.build_trees(repo.path, "main", patches, tmp_path / "out2", log=packed.append)
    assert not [m for m in packed if m.startswith("packing")]  # all cached
    with tarfile.open(tmp_path / "out0" / "trees" / "base.tar.xz") as tar:
        members = tar.getmembers()
    assert all(m.mtime == device.ARCHIVE_MTIME and m.uid == 0 for m in members)
    assert [m.name for m in members] == sorted(m.name for m in members)


def test_a_patch_that_does_not_apply_is_refused(toy, tmp_path):
    repo, patches = toy
    broken = tmp_path / "0001-broken.patch"
    broken.write_text(patches[0].read_text().replace("return x", "return y"))
    with pytest.raises(SeriesError, match="does not apply"):
        device.build_trees(repo.path, "main", [broken], tmp_path / "b", log=lambda *_: None)


# --- wheels --------------------------------------------------------------------


def test_wheel_pins_one_version_each_with_instanttensor(tmp_path, monkeypatch):
    names = [device.normalise(n) for n, _ in device.WHEELS]
    assert len(names) == len(set(names))
    assert ("instanttensor", "0.2.2") in device.WHEELS
    calls = []

    def pip(cmd, **_kw):
        calls.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        folder.mkdir(parents=True)  # as pip does
        _fake_wheel(folder, "pydantic-2.14.4-py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(interrupts, "run", pip)
    device.fetch_wheels([("pydantic", "2.14.4")], cache=tmp_path, log=lambda *_: None)
    [cmd] = calls
    assert {"--no-deps", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_28_x86_64" in cmd and cmd[-1] == "pydantic==2.14.4"


def test_wheel_pins_satisfy_vllm_requirements():
    packaging = pytest.importorskip("packaging.requirements")
    manifest = manifest_mod.load()
    repo = base_mod.base_repo_path(manifest.base.project, manifest.base.version)
    if not repo.exists():
        pytest.skip("the vLLM base is not materialised here (make venv does it)")
    text = g.out(repo, "show", f"{base_mod.BASE_BRANCH}:requirements/common.txt")
    env = {
        "platform_machine": "x86_64",
        "python_version": "3.12",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "implementation_name": "cpython",
    }
    pins = {device.normalise(n): v for n, v in device.WHEELS}
    checked = 0
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = packaging.Requirement(line)
        name = device.normalise(req.name)
        if name in pins and (req.marker is None or req.marker.evaluate(env)):
            assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name])
            checked += 1
    assert checked >= 8


def _fake_wheel(folder: Path, filename: str) -> Path:
    path = folder / filename
    name = filename.split("-")[0]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-1.dist-info/METADATA", "Name: x\n")
    return path


def test_check_wheels_refuses_two_versions_and_foreign_wheels(tmp_path):
    ok = [
        _fake_wheel(tmp_path, "a_b-1.0-py3-none-any.whl"),
        _fake_wheel(tmp_path, "c-2.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ]
    device.check_wheels(ok)
    with pytest.raises(SeriesError, match="two versions of a-b"):
        device.check_wheels([*ok, _fake_wheel(tmp_path, "a_b-1.1-py3-none-any.whl")])
    with pytest.raises(SeriesError, match="not for x86_64"):
        device.check_wheels([_fake_wheel(tmp_path, "d-1-cp312-cp312-manylinux_2_28_aarch64.whl")])


def test_cached_wheels_need_no_network(tmp_path, monkeypatch):
    cache = tmp_path / "wheels"
    (cache / "a-b-1.0").mkdir(parents=True)
    _fake_wheel(cache / "a-b-1.0", "a_b-1.0-py3-none-any.whl")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    found = device.fetch_wheels([("a_b", "1.0")], cache=cache, log=lambda *_: None)
    assert [p.name for p in found] == ["a_b-1.0-py3-none-any.whl"]


# --- device scripts ----------------------------------------------------------------


def test_device_scripts_compile(tmp_path):
    for path in DEVICE_SCRIPTS.glob("*.py"):
        py_compile.compile(str(path), cfile=str(tmp_path / (path.name + "c")), doraise=True)
    subprocess.run(["bash", "-n", str(DEVICE_SCRIPTS / "run_all.sh")], check=True)


def test_layered_bound_is_the_largest_incomplete_module():
    spec = common.layered_spec(small=True)
    modules = common.layered_modules(spec)
    sizes = {n: common.nbytes_of(s, d) for shard in spec for n, s, d in shard}
    # safetensors writes tensors sorted by name: gate before up, k and q before v.
    order = sorted(sizes, key=lambda n: (int(n.split(".")[1]), n))
    qkv = modules["layers.0.self_attn.qkv_proj"]
    assert [p[1] for p in qkv["parts"]] == ["q", "k", "v"]
    assert qkv["shape"] == [128 + 32 + 32, 128]
    gate = sizes["layers.0.mlp.gate_proj.weight"]
    qk = sizes["layers.0.self_attn.q_proj.weight"] + sizes["layers.0.self_attn.k_proj.weight"]
    assert common.incomplete_bound(modules, order, sizes) == max(gate, qk)


JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a.test_x" name="test_cpu" file="tests/a/test_x.py"/>
<testcase classname="tests.a.test_x" name="test_cuda" file="tests/a/test_x.py">
  <skipped type="pytest.skip" message="needs a GPU">x</skipped></testcase>
<testcase classname="tests.b.test_y" name="test_z" file="tests/b/test_y.py">
  <failure message="assert 1 == 2">tb</failure></testcase>
</testsuite></testsuites>"""


def test_junit_counts_and_the_zero_skip_rule(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    parsed = report.parse_junit(path)
    assert parsed["files"]["tests/a/test_x.py"] == {
        "passed": 1,
        "failed": 0,
        "error": 0,
        "skipped": 1,
    }
    assert parsed["totals"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    problems = report.series_test_problems(parsed, ["tests/a/test_x.py", "tests/c/test_w.py"])
    assert any("failed or errored" in p and "test_z" in p for p in problems)
    assert any("1 skipped" in p and "needs a GPU" in p for p in problems)
    assert any("tests/c/test_w.py" in p for p in problems)
    assert report.negative_control_verdict(parsed) == "fails as expected"
    assert report.negative_control_verdict({"totals": {"passed": 3}}) == "UNEXPECTED PASS"
    assert report.negative_control_verdict({"totals": {"error": 1}}).startswith("inconclusive")
    missing = report.parse_junit(tmp_path / "none.xml")
    assert "error" in missing and report.series_test_problems(missing, [])


def test_targets_and_summary_from_made_up_results():
    gib, mib = common.GiB, common.MiB

    def load(seconds, ring=None, peak=None, cpu=0):
        return {
            "seconds": seconds,
            "bytes": 8 * gib,
            "cpu_bytes": cpu,
            "cpu_seconds": 0.04,
            "peak_used_delta": peak,
            "torch_peak_delta": 0,
            "readers": [{"buffer_size": ring, "copy": True}] if ring else [],
        }

    def configs(times: dict) -> dict:
        return {label: report.summarise_loads([load(*args)]) for label, args in times.items()}

    tput = configs(
        {
            "base InstantTensor": (0.25,),
            "series COPY=1": (0.255,),
            "series COPY=0": (0.24,),
            "series COPY=0, retention check off": (0.235,),
            "base InstantTensor (A/A repeat)": (0.251,),
        }
    )
    staging = configs(
        {
            "series bound": (0.6, 64 * mib, 200 * mib, gib),
            "series bound, pinned staging": (0.3, 64 * mib, 204 * mib, gib),
            "series unbound": (0.25, 2 * gib, 3 * gib),
        }
    )
    heavy = configs(
        {
            "series bound": (1.5, 64 * mib, 200 * mib, 3 * gib),
            "series bound, pinned staging": (0.5, 64 * mib, 240 * mib, 3 * gib),
            "series unbound": (0.28, 2 * gib, 3 * gib),
        }
    )
    for table in (staging, heavy):
        for c in table.values():
            c["ratio_vs_unbound"] = c["median_s"] / table["series unbound"]["median_s"]

    def deferred(extra, tp=1):
        bound = 32 * mib
        return {
            "tp": tp,
            "extra_peak_alloc": extra,
            "incomplete_bound_bytes": bound,
            "tp_local_bound_bytes": bound // tp,
            "n_mismatched_modules": 0,
        }

    res = {
        "mode": "series",
        "throughput": {
            "configs": tput,
            "pinned_gib_s": 50.0,
            "retention_check_ratio": tput["series COPY=0"]["gib_s"]
            / tput["series COPY=0, retention check off"]["gib_s"],
        },
        "staging": {"configs": staging, "bound_bytes": 64 * mib},
        "heavy": {"configs": heavy, "bound_bytes": 64 * mib, "oversized_fraction": 0.43},
        "deferred": {
            "tp": 8,
            "configs": {
                "base (always copies)": deferred(64 * mib),
                "series COPY=0": deferred(0),
                "base (always copies) tp=8": deferred(64 * mib, 8),
                "series COPY=0 tp=8": deferred(8 * mib, 8),
            },
        },
    }
    targets = {t["name"]: t for t in report.evaluate_targets(res)}
    assert targets["throughput series COPY=1 / base"]["met"]
    assert targets["throughput series COPY=0 / base"]["met"]
    assert "A/A repeat of the base: 0.996" in targets["throughput series COPY=0 / base"]["note"]
    check = targets["retention check: COPY=0 throughput with / without it"]
    assert check["value"] == pytest.approx(0.235 / 0.24) and "2.1 %" in check["note"]
    assert not any("ambitious" in name for name in targets)  # the tuning phase did not run
    fallback = targets["CPU fallback with pinned staging, to the end of the GPU copy (GB/s)"]
    assert fallback["value"] == pytest.approx(gib / 0.04 / 1e9) and fallback["met"]
    one_big = targets["bounded load (64 MiB, one 1 GiB tensor) with pinned staging / unbounded"]
    assert one_big["value"] == pytest.approx(1.2) and one_big["met"]
    assert one_big["note"] == "pageable fallback 2.40"
    many = targets["heavy checkpoint (43 % oversized) bounded with pinned staging / unbounded"]
    assert many["value"] == pytest.approx(0.5 / 0.28) and not many["met"]
    assert targets["ring with pinned staging (MiB)"]["met"]
    peak = targets["peak GPU memory, pinned staging minus pageable fallback (MiB)"]
    assert peak["value"] == 40 and not peak["met"]  # the heavy checkpoint's 40 MiB
    assert targets["deferred extra peak, series COPY=0 (MiB)"]["met"]
    tp8 = targets["deferred extra peak, series COPY=0 tp=8 (MiB)"]
    assert tp8["value"] == 8 and not tp8["met"] and tp8["note"] == "base: 64.00 MiB"
    assert targets["deferred values bitwise equal (series, whole and TP-like)"]["met"]

    res["tuning"] = {"grid": [{"label": "defaults", "gib_s": 41.0}], "best": {"gib_s": 41.0}}
    targets = {t["name"]: t for t in report.evaluate_targets(res)}
    assert targets["series best / pinned H2D ceiling (ambitious)"]["value"] == pytest.approx(0.82)
    res["targets"] = list(targets.values())
    res["status"] = "pass"
    # As measured: at tp=1 the TP-local size is not the bound whole rows are held to.
    res["deferred"]["configs"]["series COPY=0"]["tp_local_bound_bytes"] = 64 * mib
    text = report.render_summary(res)
    assert "| series COPY=0, retention check off |" in text and "## Targets" in text
    assert "43 % of it above the bound" in text and "series COPY=0 tp=8" in text
    # The procedure passed, the targets did not all hold: both said, distinctly.
    missed = sum(not t["met"] for t in targets.values())
    assert missed >= 3
    status = next(line for line in text.splitlines() if line.startswith("- status:"))
    assert status.startswith(
        f"- status: **pass** (procedure); targets missed: {missed} of {len(targets)};"
    )
    # The deferred table's bound is the one each row's target uses.
    assert "| series COPY=0 | 0.0 | – | – | 32.0 |" in text
    assert "| series COPY=0 tp=8 | 8.0 | – | – | 4.0 |" in text


def _base_checkout(tmp_path: Path) -> Path:
    manifest = manifest_mod.load()
    repo = base_mod.base_repo_path(manifest.base.project, manifest.base.version)
    if not g.rev(repo, base_mod.BASE_BRANCH):
        pytest.skip("the vLLM base is not materialised here (make venv does it)")
    return base_mod.clone(repo, tmp_path / "vllm")


STANDIN = '''"""CPU stand-in for instanttensor 0.2.2: streams safetensors files in
instanttensor's order; copy=False yields views into one reused ring, each made
with torch.from_dlpack as InstantTensor makes them, so that every yielded
tensor has storage of its own (the series' retention check relies on it)."""
import enum
import json
import os

import torch
from safetensors import safe_open as _st_open


class Backend(enum.Enum):
    MMAP = 5


class safe_open:  # noqa: N801
    def __init__(self, filename, framework, device, process_group=None, *,
                 buffer_size=None, copy=True, tensor_filter=None, **kwargs):
        files = sorted([filename] if isinstance(filename, str) else filename)
        keep = None if tensor_filter is None else set(tensor_filter)
        self.ordered_tensor_metadatas = []
        for path in files:
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            header.pop("__metadata__", None)
            for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
                if keep is None or name in keep:
                    self.ordered_tensor_metadatas.append((name, dict(header[name], path=path)))
        sizes = [m["data_offsets"][1] - m["data_offsets"][0]
                 for _, m in self.ordered_tensor_metadatas]
        self.total_tensor_size = sum(sizes)
        env = int(os.environ.get("INSTANTTENSOR_BUFFER_SIZE", "0"))
        self.buffer_size = max(buffer_size or env or 2 * max(sizes), max(sizes))
        self.chunk_size, self.concurrency, self.io_depth = 2 << 20, 12, 36
        self.backend, self.copy = Backend.MMAP, copy
        self.ring = torch.empty(self.buffer_size, dtype=torch.uint8)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ring.fill_(0xEE)

    def tensors(self):
        offset, handles = 0, {}
        for name, meta in self.ordered_tensor_metadatas:
            if meta["path"] not in handles:
                handles[meta["path"]] = _st_open(meta["path"], framework="pt")
            t = handles[meta["path"]].get_tensor(name)
            if self.copy:
                yield name, t.clone()
                continue
            n = t.numel() * t.element_size()
            offset = 0 if offset + n > self.buffer_size else offset
            view = self.ring[offset:offset + n]
            view.copy_(t.reshape(-1).view(torch.uint8))
            offset += n
            yield name, torch.from_dlpack(view).view(t.dtype).view(t.shape)
'''


def write_standin(folder: Path) -> Path:
    """An ``instanttensor`` package made of STANDIN under ``folder``; returns
    ``folder`` (for ``--extra-path``)."""
    package = folder / "instanttensor"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from ._impl import Backend, safe_open\n")
    (package / "_impl.py").write_text(STANDIN)
    return folder


def run_all(
    bundle_dir: Path, tmp_path: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """run_all.py on CPU with tiny checkpoints and the stand-in; returns the
    process and qualification.json."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(DEVICE_SCRIPTS / "run_all.py"),
            "--bundle",
            str(bundle_dir),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--device",
            "cpu",
            "--small",
            "--repeats",
            "1",
            "--budget",
            "500",
            "--extra-path",
            str(write_standin(tmp_path / "standin")),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=560,
    )
    for name in ("qualification.json", "summary.md", "run.log", "bench.log"):
        assert (out / name).exists(), (name, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "==== summary ====" in proc.stdout and "STATUS" in proc.stdout
    return proc, json.loads((out / "qualification.json").read_text())


def test_device_procedure_end_to_end_on_cpu(tmp_path):
    """run_all.py against the real base tree alone (a smoke run), on CPU, with
    tiny checkpoints and a stand-in instanttensor: every phase runs and the
    evidence is written; the CUDA smoke tests are skipped (and reported as a
    problem, as they must be on the GPU machine); the configurations that
    need the series are listed as not run."""
    pytest.importorskip("transformers")
    checkout = _base_checkout(tmp_path)
    bundle_dir = tmp_path / ".device"
    (bundle_dir / "trees").mkdir(parents=True)
    (bundle_dir / "wheels").mkdir()
    files = [f for f in g.out(checkout, "ls-files", "-z").split("\0") if f and device.in_tree(f)]
    with tarfile.open(bundle_dir / "trees" / "base.tar", "w") as tar:
        for rel in files:
            tar.add(checkout / rel, arcname=rel)
    (bundle_dir / "bundle.json").write_text(
        json.dumps(
            {
                "trees": {"base": {"archive": "trees/base.tar"}},
                "wheels": [],
                "patches": [],
                "base": {"version": "test"},
                "mode": "base-only",
            }
        )
    )
    proc, res = run_all(bundle_dir, tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]  # CUDA tests skipped on CPU
    assert res["mode"] == "base-only smoke"
    assert res["skipped_phases"] == ["bound", "tuning"] and "tuning" not in res
    smoke = res["tests"]["smoke (base tree)"]
    assert smoke["totals"] == {"passed": 1, "failed": 0, "error": 0, "skipped": 1}
    assert [p for p in res["problems"] if "skipped" not in p and "plot" not in p] == []
    for label, c in res["real_writer"]["configs"].items():
        assert c["names_equal"] and c["n_mismatches"] == 0, label
        assert c["n_tensors"] == res["checkpoints"]["real"]["n_tensors"]
    # Borrowed mode is the series' loader option alone: the base never gets it.
    assert res["real_writer"]["not_run"] == [
        "series COPY=0 (inline) (needs the series)",
        "series bound COPY=0 (inline) (needs the series)",
        "series bound, pinned staging (inline) (needs the series)",
        "series priority + bound + COPY=0 (inline) (needs the series)",
    ]
    assert res["throughput"]["not_run"] == [
        "series COPY=0 (needs the series)",
        "series COPY=0, retention check off (needs the series)",
    ]
    assert "series COPY=1" in res["throughput"]["configs"]
    for label, c in res["throughput"]["configs"].items():
        assert c["verify"]["n_mismatches"] == 0 and c["verify"]["names_ok"], label
        assert c["runs"] == 1
        assert c["copy_args"] == ([] if "safetensors" in label else ["True"]), label
    assert res["deferred"]["not_run"] == ["series COPY=0 (needs the series)"]
    for kind in ("staging", "heavy"):
        configs = res[kind]["configs"]
        assert "series bound, pinned staging" not in configs
        assert configs["series bound"]["verify"]["names_ok"], kind
    for label, c in res["deferred"]["configs"].items():
        assert c["n_mismatched_modules"] == 0 and c["never_processed"] == 0, label
    assert {c["tp"] for c in res["deferred"]["configs"].values()} == {1, 8}
    assert res["pinned_read"]["pinned_reader"] == "absent from this tree"
    many = res["many"]
    assert set(many["configs"]) == {"base release", "series, options unset", "series bound"}
    assert many["not_run"] == ["series, instanttensor_copy: false (needs the series)"]
    assert all(c["runs"] for c in many["configs"].values())
    assert "SMOKE RUN" in (tmp_path / "out" / "summary.md").read_text()


# --- the device procedure on the series --------------------------------------------

SERIES_ENV = "DEVICE_TEST_SERIES"


def _series_patches(folder: Path) -> list[Path]:
    """The series the device scripts are written for: the commits after the
    base of the vLLM checkout named by DEVICE_TEST_SERIES, else patches/."""
    checkout = os.environ.get(SERIES_ENV)
    if not checkout:
        return manifest_mod.load().patch_paths(manifest_mod.PATCH_DIR)
    base = manifest_mod.load().base.commit
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "-C", checkout, "format-patch", "-q", "-o", str(folder), f"{base}..HEAD"],
        check=True,
    )
    return sorted(folder.glob("*.patch"))


@pytest.fixture(scope="module")
def series_bundle(tmp_path_factory) -> Path:
    """A device bundle of the series (no wheels) built as ``make
    device-bundle`` builds one, with fast compression."""
    manifest = manifest_mod.load()
    repo = base_mod.base_repo_path(manifest.base.project, manifest.base.version)
    if not g.rev(repo, base_mod.BASE_BRANCH):
        pytest.skip("the vLLM base is not materialised here (make venv does it)")
    tmp = tmp_path_factory.mktemp("series-bundle")
    patches = _series_patches(tmp / "patches")
    if not any("class _PinnedReader" in p.read_text() for p in patches):
        pytest.skip(
            "the series has no pinned host staging, which the device scripts measure:"
            f" set {SERIES_ENV} to a vLLM checkout of the series (base + patches as commits)"
        )
    bundle_dir = tmp / ".device"
    (bundle_dir / "wheels").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(device, "CACHE_DIR", tmp / "cache")
        mp.setattr(device, "XZ_PRESET", 0)
        trees = device.build_trees(repo, base_mod.BASE_BRANCH, patches, bundle_dir, log=print)
    bundle = {
        "base": {"version": manifest.base.version, "commit": g.rev(repo, base_mod.BASE_BRANCH)},
        "patches": [
            {"file": p.name, "patch_id": device.patchset.patch_id_of_file(p)} for p in patches
        ],
        "mode": "series",
        **trees,
        "wheels": [],
    }
    (bundle_dir / "bundle.json").write_text(json.dumps(bundle, indent=1))
    return bundle_dir


def test_device_procedure_on_the_series_on_cpu(series_bundle, tmp_path):
    """run_all.py on the series' bundle (base, series and negative-control
    trees), on CPU: every benchmark configuration runs, and what each one
    claims holds where a CPU can tell (copy argument, retention check off,
    priority tensors first, pinned staging's owned tensors, bitwise
    values whole and TP-like); the report has every target, and the GPU
    test phase is skipped (tests run in test-series)."""
    pytest.importorskip("transformers")
    proc, res = run_all(series_bundle, tmp_path, "--skip", "tests,tuning,bound")
    assert res["mode"] == "series"
    assert [p for p in res["problems"] if "plot" not in p] == [], proc.stdout[-3000:]
    assert proc.returncode == 0 and res["status"] == "pass"
    controls = res["bundle"]["negative_controls"]
    assert [c["test"] for c in controls] == list(device.NEGATIVE_CONTROLS)

    tp = res["throughput"]["configs"]
    # Borrowed mode through the loader option (no environment variable): checked.
    assert tp["series COPY=0"]["copy_args"] == ["False"]
    assert tp["series COPY=1"]["copy_args"] == ["True"]
    assert tp["series COPY=0, retention check off"]["copy_args"] == ["False"]
    assert tp["series COPY=0, retention check off"]["verify"]["n_mismatches"] == 0
    assert res["throughput"]["retention_check_ratio"] is not None

    real = res["real_writer"]["configs"]
    assert "not_run" not in res["real_writer"]
    for label, c in real.items():
        assert c["names_equal"] and c["n_mismatches"] == 0, label
    assert real["series COPY=0 (inline)"]["borrowed_marker"] == "_vllm_borrowed_weight"
    for label, c in real.items():
        assert c["copy_args"] == (["False"] if "COPY=0" in label else ["True"]), label
    pinned = real["series bound, pinned staging (inline)"]
    # embed_tokens and lm_head, above the bound: read on CPU, owned
    assert pinned["cpu_borrowed"] == 0
    priority = real["series priority + bound + COPY=0 (inline)"]
    assert priority["priority_first"] and priority["n_priority"] == 2

    for kind in ("staging", "heavy"):
        configs = res[kind]["configs"]
        assert set(configs) == {label for label, _, _ in run_all_module().bounded_configs(kind)}
        for label, c in configs.items():
            assert c["verify"]["n_mismatches"] == 0 and c["verify"]["names_ok"], (kind, label)
            assert c["ratio_vs_unbound"] is not None, (kind, label)
        assert configs["series bound"]["ring_bytes"] <= res[kind]["bound_bytes"]
    assert res["heavy"]["oversized_fraction"] >= 0.4

    deferred = res["deferred"]["configs"]
    control = controls[0]["tree"]
    for prefix in ("base (always copies)", "series COPY=1", "series COPY=0"):
        for key in (prefix, f"{prefix} tp=8"):
            if "COPY=0" in key and "error" in deferred[key]:
                # On CPU the stand-in's borrowed tensors are CPU sources, which
                # layerwise loading queues: their use after the iterator moved
                # on fails, naming the fix, and never loads wrong values.
                assert "instanttensor_copy" in deferred[key]["error"], deferred[key]
                continue
            assert deferred[key].get("n_mismatched_modules") == 0, (key, deferred[key])
    # The control tree: borrowed when it has the loader option, else copies
    # (a prefix before the borrowed-mode patch rejects the key).
    row = [k for k in deferred if k.startswith(f"{control} ") and not k.endswith("tp=8")]
    assert row in ([f"{control} COPY=0 (no ownership)"], [f"{control} (no borrowed mode: copies)"])
    for key in (row[0], f"{row[0]} tp=8"):
        assert "error" not in deferred[key], key
    for key, c in deferred.items():
        if "error" not in c:
            assert c["copy_args"] == (["False"] if "COPY=0" in key else ["True"]), key
    peaks = res["deferred"]["processing_peak"]
    assert peaks["shape"] == [256, 256] and "base" in peaks and "series" in peaks
    cpu = res["deferred"]["cpu_sources_peak"]
    assert cpu["base"] > 0 and cpu["ratio"] is not None  # materialized bytes on CPU
    whole, local = deferred["series COPY=1"], deferred["series COPY=1 tp=8"]
    assert local["tp_local_bound_bytes"] * 8 == whole["tp_local_bound_bytes"]
    assert local["materialised_bytes"] < whole["materialised_bytes"] / 4

    pr = res["pinned_read"]
    assert len(pr["methods"]) == 1 + 3 * 3
    assert all(m["bitwise_equal"] for m in pr["methods"].values())
    assert not any(m["borrowed_marked"] for m in pr["methods"].values())
    assert pr["default"]["threads"] == 16 and pr["best"]["gb_s"] > 0
    assert pr["default"]["chunk_bytes"] == 64 * common.MiB
    for label, m in pr["methods"].items():  # each grid cell's threads really set
        assert m.get("reader_threads") in (None, m.get("threads")), label
    if pr["settings"] == "module constants":
        assert all(m["reader_threads"] for m in pr["methods"].values() if "threads" in m)

    rounds = run_all_module().MANY_REPEATS
    assert res["many"]["rounds"] == rounds and "not_run" not in res["many"]
    assert list(res["many"]["configs"]) == list(run_all_module().MANY_MODES)
    assert all(c["runs"] == rounds for c in res["many"]["configs"].values())
    assert all(c["ratio_best"] is not None for c in res["many"]["configs"].values())
    assert res["throughput"]["rounds"] == 1  # --repeats 1
    assert all(c["time_ratio_best"] is not None for c in tp.values() if c["runs"])
    assert all("first_tensor_s" in p for p in res["many"]["profile_first"].values())

    targets = {t["name"]: t for t in res["targets"]}
    assert len(targets) == 41 and not any("ambitious" in name for name in targets)
    for name in ("Kimi-K2-class mix", "draft after target", "disk, series"):
        assert any(n.startswith(name) for n in targets), name
    refused = {k for k, c in deferred.items() if "error" in c}  # borrowed CPU sources, above
    for name, t in targets.items():
        if name.startswith("deferred") and refused:
            continue
        assert t["value"] is not None, name
    summary = (tmp_path / "out" / "summary.md").read_text()
    for heading in ("Reading one", "Staging bound", "Deferred ownership", "## Targets"):
        assert heading in summary, heading


def run_all_module():
    import run_all

    return run_all


def test_many_tensor_benchmark_alone_on_cpu(series_bundle, tmp_path):
    """``--only many``: no tests, only the many-tensor checkpoints written,
    and every many-tensor row measured on the tree its label names, with
    the time to the first tensor, the time per tensor, a ratio to the base
    for each configuration and the retention check's cost at stack depth 1
    and 60, whose "check off" rows really ran without the check."""
    proc, res = run_all(series_bundle, tmp_path, "--only", "many", "--many-configs", "all")
    assert [p for p in res["problems"] if "plot" not in p] == [], proc.stdout[-3000:]
    assert proc.returncode == 0 and res["status"] == "pass"
    assert "tests" not in res["phases"] and res["tests"] == {}
    assert set(res["checkpoints"]) == {"many"}
    assert not any(key in res for key in ("throughput", "staging", "real_writer"))
    many = res["many"]
    labels = [label for label, _, _ in run_all_module().many_configs(res["checkpoints"])]
    assert list(many["configs"]) == labels and len(labels) == 11
    rounds = run_all_module().MANY_REPEATS
    assert many["rounds"] == rounds and many["n_tensors"] == 400
    assert many["part"]["n_tensors"] == 80
    for label, c in many["configs"].items():
        assert c["runs"] == rounds and c["errors"] == [], label
        assert c["first_tensor_s"] < c["median_s"], label
        assert c["us_per_tensor"] == pytest.approx(c["median_s"] * 1e6 / c["n_tensors"])
        assert c["retention_check_off"] == label.endswith("check off"), label
    configs = many["configs"]
    assert (
        configs["base release"]["tree"] == "base" and configs["base release"]["ratio_vs_base"] == 1
    )
    assert configs["series, instanttensor_copy: false"]["copy_args"] == ["False"]
    assert configs["series, options unset"]["copy_args"] == ["True"]
    for depth in (1, 60):
        label = f"check cost: keeps an owned tensor, depth {depth}"
        on, off = configs[label], configs[f"{label}, check off"]
        assert on["n_tensors"] == 80 and "ratio_vs_base" not in on
        assert on["check_ratio"] == pytest.approx(on["median_s"] / off["median_s"])
    targets = {t["name"]: t for t in res["targets"]}
    assert all(name.startswith("many tensors: ") for name in targets) and len(targets) == 12
    bound = run_all_module().BASE_BOUND
    assert f"many tensors: series bound, pinned staging / {bound} (time)" in targets
    assert configs["series bound"]["base"] == bound and configs[bound]["tree"] == "base"
    assert targets["many tensors: retention check cost, depth 60 (with / without)"]["value"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Many small tensors (400 tensors of 256 B in 10 shards" in summary
    assert "many check cost: keeps an owned tensor, depth 60" in proc.stdout
    for label, c in configs.items():
        if "ratio_vs_base" in c:
            base = configs[c["base"]]
            assert c["ratio_best"] == pytest.approx(c["min_s"] / base["min_s"]), label


def test_many_tensor_rows_and_rounds_chosen(series_bundle, tmp_path):
    """``--many-configs`` runs the rows it names, ``--many-rounds`` that many
    rounds, and the summary's command line shows both, pasteable."""
    rows = "base release;series, options unset"
    proc, res = run_all(
        series_bundle, tmp_path, "--only", "many", "--many-configs", rows, "--many-rounds", "2"
    )
    assert proc.returncode == 0 and res["status"] == "pass", proc.stdout[-3000:]
    many = res["many"]
    assert list(many["configs"]) == rows.split(";") and many["rounds"] == 2
    assert all(c["runs"] == 2 for c in many["configs"].values())
    status = (tmp_path / "out" / "summary.md").read_text().splitlines()[2]
    assert status.count("`bash scripts/device/run_all.sh --") == 1 and "--out" not in status
    assert f" --only many --many-configs '{rows}' --many-rounds 2`" in status


def test_tp2_on_cpu(series_bundle, tmp_path):
    """tp2.py with two gloo ranks on CPU and the stand-in: it unpacks the
    trees it needs from the bundle, loads both checkpoints in every
    configuration bitwise on both ranks, and both ranks fail with the same
    error, quickly, when their bounds differ."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(DEVICE_SCRIPTS / "tp2.py"),
            "--bundle",
            str(series_bundle),
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--small",
            "--rounds",
            "2",
            "--budget",
            "240",
            "--extra-path",
            str(write_standin(tmp_path / "standin")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    res = json.loads((out / "tp2.json").read_text())
    assert res["problems"] == [], proc.stdout[-3000:]
    assert proc.returncode == 0 and "STATUS pass" in proc.stdout
    assert (out / "tp2.log").exists()
    assert set(res["results"]) == {"typical", "heavy"}
    for ck_name, rows in res["results"].items():
        assert set(rows) == set(res["configs"]), ck_name
        for label, row in rows.items():
            assert row["verified"] and len(row["samples_s"]) == 2, (ck_name, label)
    typical = res["checkpoints"]["typical"]
    assert 0 < typical["oversized_bytes"] <= 0.1 * typical["payload_bytes"]
    heavy = res["checkpoints"]["heavy"]
    assert 0.4 <= heavy["oversized_bytes"] / heavy["payload_bytes"] <= 0.6
    agreement = res["agreement"]
    assert len(agreement) == 2 and agreement[0]["raised"] == agreement[1]["raised"]
    assert "instanttensor_buffer_size" in agreement[0]["raised"]
    assert all(a["seconds"] < 30 for a in agreement)
    assert {t["name"] for t in res["targets"]} >= {"typical: series bound / base collective"}


def test_geometry_bound_and_bound_rows():
    """The geometry rule's bound is twice the largest tensor that stays on
    the GPU at that bound, leaving the largest tensors on CPU; the bound
    phase's rows put each tree's bounded rows side by side."""
    mib = common.MiB
    assert common.geometry_bound([4, 56 * mib, 62 * mib, 1024 * mib]) == (124 * mib, 62 * mib)
    # 100 MiB is within twice 56 MiB: the rule holds at twice 100 MiB.
    assert common.geometry_bound([56 * mib, 100 * mib, 1024 * mib]) == (200 * mib, 100 * mib)
    assert common.geometry_bound([mib, mib]) == (2 * mib, mib)  # all on the GPU
    module = run_all_module()
    labels = [label for label, _, _ in module.bound_configs("staging", 124 * mib)]
    assert labels == [
        "series unbound",
        "pieces unbound",
        "series 64 MiB, copy",
        "pieces 64 MiB, copy",
        "series 64 MiB, borrowed",
        "pieces 64 MiB, borrowed",
        "series 256 MiB, copy",
        "pieces 256 MiB, copy",
        "series 256 MiB, borrowed",
        "pieces 256 MiB, borrowed",
        "series 124 MiB (geometry rule), copy",
    ]
    for label, tree, kw in module.bound_configs("heavy", 124 * mib):
        assert label.split()[0] == tree
        extra = kw.get("extra", {})
        assert ("unbound" in label) == ("instanttensor_buffer_size" not in extra)
        assert extra.get("instanttensor_copy", True) == ("borrowed" not in label)


@pytest.fixture
def pieces_bundle(series_bundle, tmp_path) -> Path:
    """The series' bundle with a ``pieces`` tree, as add_tree.sh adds one
    (here the series itself: the plumbing is the same, though it no longer
    streams in pieces)."""
    bundle_dir = tmp_path / ".device-pieces"
    (bundle_dir / "trees").mkdir(parents=True)
    (bundle_dir / "wheels").symlink_to(series_bundle / "wheels")
    bundle = json.loads((series_bundle / "bundle.json").read_text())
    for tree in bundle["trees"].values():
        archive = bundle_dir / tree["archive"]
        archive.symlink_to(series_bundle / tree["archive"])
    (bundle_dir / "trees" / "pieces.tar.xz").symlink_to(series_bundle / "trees" / "series.tar.xz")
    bundle["trees"]["pieces"] = {
        **bundle["trees"]["series"],
        "archive": "trees/pieces.tar.xz",
        "commit": "e1378a4",
    }
    (bundle_dir / "bundle.json").write_text(json.dumps(bundle, indent=1))
    return bundle_dir


def test_bound_phase_alone_on_cpu(pieces_bundle, tmp_path, monkeypatch):
    """``--only bound``: the staging and heavy checkpoints, the series and the
    pieces tree side by side at each bound, copy and borrowed, each tree
    unbounded, the series at the geometry rule's bound; every row verified
    bitwise, timed against its own tree unbounded and the series rows
    against the pieces rows; a worker for the pieces tree, none for the
    negative control."""
    proc, res = run_all(pieces_bundle, tmp_path, "--only", "bound")
    # The stand-in pieces tree is the series, which the phase says, and only that.
    stand_in = "bound: the bundle's pieces tree does not stream tensors in pieces"
    assert [p for p in res["problems"] if "plot" not in p] == [stand_in], proc.stdout[-3000:]
    assert res["phases"]["unpack trees"]["trees"] == ["base", "pieces", "series"]
    assert "worker pieces import" in res["phases"]
    assert not any(k.startswith("worker before-") for k in res["phases"])
    module = run_all_module()
    for key, value in module.SMALL_SIZES.items():  # the labels of --small's bounds
        monkeypatch.setitem(module.SIZES, key, value)
    bound = res["bound"]
    assert bound["trees"] == {"series": {"has_pieces": False}, "pieces": {"has_pieces": False}}
    for kind in ("staging", "heavy"):
        out = bound[kind]
        geometry = out["geometry"]["bound_bytes"]
        assert geometry == 2 * out["geometry"]["largest_on_gpu_bytes"]
        assert geometry < out["largest_tensor_bytes"]
        labels = [label for label, _, _ in module.bound_configs(kind, geometry)]
        assert list(out["configs"]) == labels, kind
        assert out["rounds"] == module.BOUND_PHASE_REPEATS
        for label, c in out["configs"].items():
            assert c["tree"] == label.split()[0], (kind, label)
            assert c["verify"]["n_mismatches"] == 0 and c["verify"]["names_ok"], (kind, label)
            assert c["runs"] == module.BOUND_PHASE_REPEATS, (kind, label)
            assert c["ratio_vs_unbound"] is not None, (kind, label)
            assert c["ratio_best_vs_unbound"] is not None, (kind, label)
            assert c["peak_used_delta"] is not None, (kind, label)
            if label.startswith("series ") and "geometry" not in label:
                assert c["ratio_vs_pieces"] is not None, (kind, label)
            if c["bound_bytes"]:
                assert c["ring_bytes"] <= c["bound_bytes"], (kind, label)
                assert c["cpu_n"], (kind, label)  # the big tensors, on CPU
    targets = {t["name"]: t for t in res["targets"]}
    assert targets["bound, heavy checkpoint: every row bitwise equal"]["met"]
    assert targets["bound, staging checkpoint: ring within the bound, every bounded row"]["met"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Bound: the series against the series with pieces, heavy checkpoint" in summary
    assert "bound heavy series 1 MiB, borrowed" in proc.stdout
