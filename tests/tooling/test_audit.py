"""``seriestool check``: auditing a consolidated branch against the series.

Every test builds a throw-away vLLM-like repository, a three-patch series
(exported with ``git format-patch``; the series branch is deleted again, so the
audit must rebuild it from the patch files) and a consolidated branch shaped
the way the test names; then it runs the real CLI and checks the status of
each patch, the exit code and the JSON fields.  Each run also checks that the
user's repository (refs, HEAD, index, work tree) is left exactly as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import IDENTITY, Repo
from seriestool import audit, check_manifest, cli
from seriestool import base as base_mod
from seriestool.errors import SeriesError
from seriestool.git import blob_ids
from seriestool.manifest import load as load_manifest
from seriestool.patchset import files_touched, patch_id_of_file, sha256_of_file, subject_of_file

CONFIG_0 = "A = 1\nB = 2\nC = 3\n"
CONFIG_3 = "A = 1\nB = 2\nC = 3\nLOADER = 'safetensors'\n"
LOADER_1 = (
    "import json\n"
    "\n"
    "\n"
    "def load(path):\n"
    "    with open(path) as f:\n"
    "        header = json.loads(f.readline())\n"
    "    tensors = {}\n"
    "    for name, meta in header.items():\n"
    "        tensors[name] = meta['shape']\n"
    "    return tensors\n"
    "\n"
    "\n"
    "def names(path):\n"
    "    return sorted(load(path))\n"
)
QUANT = "\n\ndef quant(x, scale):\n    y = x * scale\n    return round(y)\n"
LOADER_2 = LOADER_1 + QUANT
TEST_LOADER = "def test_load():\n    assert callable(load)\n"
TEST_QUANT = "def test_quant():\n    assert quant(2, 3) == 6\n"

BASE_FILES = {"README": "base\n", "vllm/config.py": CONFIG_0, "unrelated/other.py": "X = 0\n"}
PATCH_1 = (
    "Add safetensors loader",
    {"vllm/loader.py": LOADER_1, "tests/test_loader.py": TEST_LOADER},
)
PATCH_2 = ("Add quantisation hook", {"vllm/loader.py": LOADER_2, "tests/test_quant.py": TEST_QUANT})
PATCH_3 = ("Configure the loader", {"vllm/config.py": CONFIG_3})
SERIES = [PATCH_1, PATCH_2, PATCH_3]
FILES = [
    "0001-Add-safetensors-loader.patch",
    "0002-Add-quantisation-hook.patch",
    "0003-Configure-the-loader.patch",
]


class Series:
    """A repository holding the base, plus the series as patch files and manifest."""

    def __init__(self, repo: Repo, base: str, patch_dir: Path, manifest: Path):
        self.repo, self.base, self.patch_dir, self.manifest = repo, base, patch_dir, manifest

    def consolidate(self, commits, name: str = "cons") -> list[str]:
        """Branch ``name`` from the base with one commit per (message, files)."""
        self.repo.git("checkout", "-q", "-b", name, self.base)
        shas = [self.repo.commit(message, files) for message, files in commits]
        self.repo.git("checkout", "-q", "main")
        return shas

    def check(self, capsys, *args: str, json_out: bool = True) -> tuple[int, dict | str]:
        """Run ``seriestool check`` on this repo; the repo must come out unchanged."""
        before = snapshot(self.repo)
        argv = [
            "check",
            "--vllm",
            str(self.repo.path),
            "--patches-dir",
            str(self.patch_dir),
            "--manifest",
            str(self.manifest),
            *args,
        ]
        if json_out:
            argv.append("--json")
        capsys.readouterr()
        rc = cli.main(argv)
        captured = capsys.readouterr()
        assert snapshot(self.repo) == before, "the audit modified the user's repository"
        if rc == 2:
            return rc, captured.err
        return rc, json.loads(captured.out) if json_out else captured.out


def snapshot(repo: Repo) -> tuple[str, ...]:
    """Everything the audit promises not to touch."""
    return (
        repo.git("for-each-ref", "--format=%(refname) %(objectname)"),
        repo.git("rev-parse", "HEAD"),
        repo.git("symbolic-ref", "-q", "HEAD", check=False),
        repo.git("status", "--porcelain=v1", "--untracked-files=all"),
        repo.git("ls-files", "--stage"),
        repo.git("config", "--list", "--local"),
    )


def write_manifest(path: Path, patch_dir: Path, base: str, repo: Repo) -> None:
    """The manifest as `make export` writes it, so `check-manifest` finds it consistent."""
    files = sorted(p.name for p in patch_dir.glob("*.patch"))
    touched = sorted({t for f in files for t in files_touched(repo.path, patch_dir / f)})
    data = {
        "series": {"name": "loader-series", "version": "1"},
        "base": {
            "project": "vllm",
            "version": "0.0.0",
            "upstream_commit": "0000000",
            "sdist": {"filename": "vllm-0.0.0.tar.gz", "sha256": "0" * 64},
            "commit": base,
            "touched_files": blob_ids(repo.path, base, touched),
        },
        "patches": [
            {
                "file": f,
                "subject": subject_of_file(patch_dir / f),
                "patch_id": patch_id_of_file(patch_dir / f),
                "sha256": sha256_of_file(patch_dir / f),
            }
            for f in files
        ],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def build_series(
    make_repo, tmp_path, series=SERIES, base_files=BASE_FILES, name="vllm", setup=None
):
    """Base repo + series exported as patch files; ``setup(repo)`` may add commits by hand."""
    repo = make_repo(name, dict(base_files))
    base = repo.head()
    repo.git("checkout", "-q", "-b", "series")
    if setup:
        setup(repo)
    else:
        for message, files in series:
            repo.commit(message, files)
    patch_dir = tmp_path / "patches"
    repo.git(
        "format-patch",
        "-q",
        "--zero-commit",
        "--full-index",
        "--no-signature",
        "-o",
        str(patch_dir),
        f"{base}..series",
    )
    repo.git("checkout", "-q", "main")
    repo.git("branch", "-q", "-D", "series")  # the audit must rebuild it from the files
    manifest = patch_dir / "series.json"
    write_manifest(manifest, patch_dir, base, repo)
    return Series(repo, base, patch_dir, manifest)


def _no_range_diff(*_args, **_kwargs) -> str:
    raise AssertionError("git range-diff must not run for this audit")


def statuses(report: dict) -> list[str]:
    return [p["status"] for p in report["patches"]]


@pytest.fixture
def series(make_repo, tmp_path) -> Series:
    return build_series(make_repo, tmp_path)


# ---------------------------------------------------------------- identical


def test_identical(series, capsys, monkeypatch):
    # Identical patches are proven by patch IDs alone: no range-diff is needed.
    monkeypatch.setattr(audit.rangediff, "range_diff", _no_range_diff)
    shas = series.consolidate(
        [("[fork] " + m, f) for m, f in SERIES] + [("Unrelated fork work", {"README": "fork\n"})]
    )
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 0
    assert report["ok"] is True and report["failures"] == []
    assert [p["file"] for p in report["patches"]] == FILES
    assert statuses(report) == ["identical"] * 3
    assert [p["commits"] for p in report["patches"]] == [[s] for s in shas[:3]]
    assert all(p["patch_id"] and p["range_diff"] is None for p in report["patches"])
    assert report["extra"] == []  # the README commit touches no series file
    assert report["consolidated_commits_touching_series_paths"] == 3
    assert report["series_paths"] == [
        "tests/test_loader.py",
        "tests/test_quant.py",
        "vllm/config.py",
        "vllm/loader.py",
    ]
    assert report["end_state"]["equal"] is True
    assert all(f["equal"] and f["diff"] is None for f in report["end_state"]["files"])
    assert report["consolidated"]["commit"] == series.repo.git("rev-parse", "cons")

    rc, text = series.check(capsys, "--consolidated", "cons", json_out=False)
    assert rc == 0
    assert "Result: OK" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("000")]
    assert [(r[0], "identical" in r) for r in rows] == [(f, True) for f in FILES]
    assert "all equal the series' result" in text


def test_default_arguments_audit_the_branch_apply_made(make_repo, tmp_path, capsys, monkeypatch):
    """No --vllm/--consolidated/--base: work/vllm, the manifest's branch and base."""
    (tmp_path / "work").mkdir()
    series = build_series(make_repo, tmp_path, name="work/vllm")
    branch = _branch_name(series.manifest)
    # What `make apply` does: the series applied with `git am` on a new branch.
    series.repo.git("checkout", "-q", "-b", branch, series.base)
    series.repo.git("am", "-q", "--3way", *sorted(map(str, series.patch_dir.glob("*.patch"))))
    series.repo.git("checkout", "-q", "main")
    monkeypatch.setattr(base_mod, "WORK_DIR", tmp_path / "work")
    capsys.readouterr()
    rc = cli.main(
        [
            "check",
            "--patches-dir",
            str(series.patch_dir),
            "--manifest",
            str(series.manifest),
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert report["repo"] == str(tmp_path / "work" / "vllm")
    assert report["consolidated"]["ref"] == branch
    assert report["base"] == series.base
    assert statuses(report) == ["identical"] * 3


def _branch_name(path: Path) -> str:
    from seriestool.manifest import load

    return load(path).branch_name


# ---------------------------------------------------------------- changed


def test_reordered_test_lands_in_another_commit(series, capsys):
    """Patch 1's test lands in patch 2's commit: IDs differ, range-diff shows it."""
    c1, c2, c3 = series.consolidate(
        [
            ("Add safetensors loader", {"vllm/loader.py": LOADER_1}),
            (
                "Add quantisation hook",
                {
                    "vllm/loader.py": LOADER_2,
                    "tests/test_quant.py": TEST_QUANT,
                    "tests/test_loader.py": TEST_LOADER,
                },
            ),
            PATCH_3,
        ]
    )
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 1
    assert statuses(report) == ["changed", "changed", "identical"]
    p1, p2, p3 = report["patches"]
    assert (p1["commits"], p2["commits"], p3["commits"]) == ([c1], [c2], [c3])
    # The range-diffs show the moved test, and only that.
    assert "tests/test_loader.py" in p1["range_diff"] and "quant" not in p1["range_diff"]
    assert "tests/test_loader.py" in p2["range_diff"]
    assert "-+def test_load" in p1["range_diff"] and "++def test_load" in p2["range_diff"]
    assert report["end_state"]["equal"] is True
    assert report["failures"] == [f"{FILES[0]}: changed", f"{FILES[1]}: changed"]

    rc, report = series.check(
        capsys,
        "--consolidated",
        "cons",
        "--accept",
        "0001",
        "--reason",
        "test moved to the quant commit",
        "--accept",
        FILES[1],
        "--reason",
        "receives the loader test",
    )
    assert rc == 0 and report["ok"] is True
    assert [p["accepted"] for p in report["patches"]] == [
        "test moved to the quant commit",
        "receives the loader test",
        None,
    ]
    assert [a["used"] for a in report["accepted"]] == [True, True]

    rc, text = series.check(
        capsys,
        "--consolidated",
        "cons",
        "--accept",
        "0001",
        "--reason",
        "test moved",
        json_out=False,
    )
    assert rc == 1  # 0002 is still changed
    assert "changed (accepted)" in text and "0001: test moved" in text
    assert f"range-diff {FILES[1]} -> {c2[:12]}:" in text
    assert "Result: FAIL" in text and f"{FILES[1]}: changed" in text


def test_review_fix_folded_in(series, capsys):
    fixed = LOADER_2.replace(
        "    return round(y)\n", "    if y < 0:\n        raise ValueError(y)\n    return round(y)\n"
    )
    c1, c2, c3 = series.consolidate(
        [
            PATCH_1,
            ("Add quantisation hook", {"vllm/loader.py": fixed, "tests/test_quant.py": TEST_QUANT}),
            PATCH_3,
        ]
    )
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 1
    assert statuses(report) == ["identical", "changed", "identical"]
    p2 = report["patches"][1]
    assert p2["commits"] == [c2]
    assert "++    if y < 0:" in p2["range_diff"]
    files = {f["path"]: f for f in report["end_state"]["files"]}
    assert report["end_state"]["equal"] is False
    assert [p for p, f in files.items() if not f["equal"]] == ["vllm/loader.py"]
    assert "+    if y < 0:" in files["vllm/loader.py"]["diff"]
    assert set(report["failures"]) == {f"{FILES[1]}: changed", "end state differs: vllm/loader.py"}
    _rc, text = series.check(capsys, "--consolidated", "cons", json_out=False)
    assert "; 1 differs from the series' result" in text  # one file: singular

    # Accepting the patch alone is not enough: the tip still differs.
    rc, report = series.check(
        capsys, "--consolidated", "cons", "--accept", "0002", "--reason", "fix"
    )
    assert rc == 1 and report["failures"] == ["end state differs: vllm/loader.py"]
    rc, report = series.check(
        capsys,
        "--consolidated",
        "cons",
        "--accept",
        "0002",
        "--reason",
        "fix",
        "--accept",
        "file:vllm/loader.py",
        "--reason",
        "fix upstreamed",
    )
    assert rc == 0
    assert (
        files["vllm/loader.py"]["series"]["blob"] != files["vllm/loader.py"]["consolidated"]["blob"]
    )


def test_indentation_only_change_is_changed(series, capsys):
    reindented = LOADER_2.replace(
        "    y = x * scale\n    return round(y)\n",
        "        y = x * scale\n        return round(y)\n",
    )
    assert reindented != LOADER_2
    _, c2, _ = series.consolidate(
        [
            PATCH_1,
            (
                "Add quantisation hook",
                {"vllm/loader.py": reindented, "tests/test_quant.py": TEST_QUANT},
            ),
            PATCH_3,
        ]
    )
    # Non-verbatim patch IDs would call this identical; the audit must not.
    series.repo.git("checkout", "-q", "-b", "reference", series.base)
    ref = [series.repo.commit(m, f) for m, f in SERIES][1]
    series.repo.git("checkout", "-q", "main")
    assert _patch_id(series.repo, ref, "--stable") == _patch_id(series.repo, c2, "--stable")
    assert _patch_id(series.repo, ref, "--verbatim") != _patch_id(series.repo, c2, "--verbatim")

    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 1
    assert statuses(report) == ["identical", "changed", "identical"]
    assert "-+    y = x * scale" in report["patches"][1]["range_diff"]
    assert "++        y = x * scale" in report["patches"][1]["range_diff"]
    assert not {f["path"]: f for f in report["end_state"]["files"]}["vllm/loader.py"]["equal"]


def _patch_id(repo: Repo, commit: str, mode: str) -> str:
    diff = repo.git("show", "--format=commit %H", commit)
    return subprocess.run(
        ["git", "patch-id", mode], input=diff + "\n", capture_output=True, text=True, check=True
    ).stdout.split()[0]


# ---------------------------------------------------------------- combined


def test_squashed_patches_are_combined(series, capsys):
    c1, c23 = series.consolidate(
        [
            PATCH_1,
            ("Quantisation hook and config", {**PATCH_2[1], **PATCH_3[1]}),
        ]
    )
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 0
    assert statuses(report) == ["identical", "combined", "combined"]
    assert [p["commits"] for p in report["patches"]] == [[c1], [c23], [c23]]
    assert report["patches"][1]["note"] == "squashed with 0003"
    assert report["patches"][2]["note"] == "squashed with 0002"
    assert report["extra"] == [] and report["end_state"]["equal"] is True


def test_whole_series_squashed_into_one_commit(series, capsys):
    (c,) = series.consolidate([("Loader series", {**PATCH_1[1], **PATCH_2[1], **PATCH_3[1]})])
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 0
    assert statuses(report) == ["combined"] * 3
    assert all(p["commits"] == [c] for p in report["patches"])


def test_a_patch_split_into_two_commits_is_split(series, capsys):
    """0001 split in two (the loader, then its test): "split", not changed + extra."""
    loader, test = ({"vllm/loader.py": LOADER_1}, {"tests/test_loader.py": TEST_LOADER})
    c1a, c1b, c2, c3 = series.consolidate(
        [("Loader", loader), ("Loader test", test), PATCH_2, PATCH_3]
    )
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 0, report
    assert statuses(report) == ["split", "identical", "identical"]
    assert report["patches"][0]["commits"] == [c1a, c1b]
    assert report["patches"][0]["note"] == "split into 2 consecutive commits"
    assert report["extra"] == [] and report["end_state"]["equal"] is True


# ---------------------------------------------------------------- missing / extra


def test_missing_patch(series, capsys):
    series.consolidate([PATCH_1, PATCH_2, ("Unrelated", {"README": "x\n"})])
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 1
    assert statuses(report) == ["identical", "identical", "missing"]
    assert report["patches"][2]["commits"] == []
    files = {f["path"]: f for f in report["end_state"]["files"]}
    assert not files["vllm/config.py"]["equal"]
    assert "-LOADER = 'safetensors'" in files["vllm/config.py"]["diff"]
    assert set(report["failures"]) == {f"{FILES[2]}: missing", "end state differs: vllm/config.py"}


def test_extra_commit(series, capsys):
    shas = series.consolidate(
        SERIES
        + [
            ("Unrelated", {"README": "fork\n"}),
            ("Fork-only config knob", {"vllm/config.py": CONFIG_3 + "FORK = True\n"}),
        ]
    )
    extra = shas[-1]
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert rc == 1
    assert statuses(report) == ["identical"] * 3
    assert report["extra"] == [
        {
            "commit": extra,
            "subject": "Fork-only config knob",
            "paths": ["vllm/config.py"],
            "accepted": None,
        }
    ]
    assert f"extra commit {extra[:12]}" in report["failures"]

    rc, report = series.check(
        capsys,
        "--consolidated",
        "cons",
        "--accept",
        f"extra:{extra[:10]}",
        "--reason",
        "fork knob, not upstreamed",
        "--accept",
        "file:vllm/config.py",
        "--reason",
        "carries the fork knob",
        "--accept",
        "0001",
        "--reason",
        "stale",
    )
    assert rc == 0
    assert report["extra"][0]["accepted"] == "fork knob, not upstreamed"
    assert [a["used"] for a in report["accepted"]] == [True, True, False]

    rc, text = series.check(capsys, "--consolidated", "cons", json_out=False)
    assert "Extra commits" in text and extra[:12] in text and "Fork-only config knob" in text


def test_commit_touching_an_unrelated_file_is_compared_on_series_paths(series, capsys):
    fixed = LOADER_2 + "\n\nSCALE = 1\n"
    c1, c2, _ = series.consolidate(
        [
            (
                PATCH_1[0],
                {**PATCH_1[1], "README": "fork readme\n", "unrelated/other.py": "X = 1\n"},
            ),
            (PATCH_2[0], {**PATCH_2[1], "vllm/loader.py": fixed, "unrelated/other.py": "X = 2\n"}),
            PATCH_3,
        ]
    )
    touched = series.repo.git("show", "--format=", "--name-only", c1).split()
    assert "README" in touched and "unrelated/other.py" in touched
    rc, report = series.check(capsys, "--consolidated", "cons")
    assert statuses(report) == ["identical", "changed", "identical"]
    assert report["patches"][0]["commits"] == [c1]
    # The range-diff runs on histories projected onto the series paths.
    rd = report["patches"][1]["range_diff"]
    assert "++SCALE = 1" in rd and "unrelated" not in rd and "X = 2" not in rd
    assert report["extra"] == []
    assert "unrelated/other.py" not in report["series_paths"]
    assert rc == 1


# ---------------------------------------------------------------- rename and mode


def _rename_series(repo: Repo) -> None:
    repo.write(
        {
            "pkg/new_name.py": repo.path.joinpath("pkg/old_name.py").read_text() + "Z = 3\n",
            "pkg/old_name.py": None,
        }
    )
    os.chmod(repo.path / "tools/run.sh", 0o755)
    repo.commit("Rename the module and make the tool executable")
    repo.commit("Use the new module", {"tools/run.sh": "#!/bin/sh\npython -m pkg.new_name\n"})


RENAME_BASE = {
    "pkg/old_name.py": "".join(f"V{i} = {i}\n" for i in range(30)),
    "tools/run.sh": "#!/bin/sh\npython -m pkg.old_name\n",
}


@pytest.mark.parametrize("keep_mode", [True, False])
def test_rename_and_mode_change(make_repo, tmp_path, capsys, keep_mode):
    series = build_series(make_repo, tmp_path, base_files=RENAME_BASE, setup=_rename_series)
    patch1 = (
        series.patch_dir / "0001-Rename-the-module-and-make-the-tool-executable.patch"
    ).read_text()
    assert "rename from pkg/old_name.py" in patch1 and "new mode 100755" in patch1
    series.repo.git("checkout", "-q", "-b", "cons", series.base)
    _rename_series(series.repo) if keep_mode else _rename_series_without_mode(series.repo)
    series.repo.git("checkout", "-q", "main")

    rc, report = series.check(capsys, "--consolidated", "cons")
    assert report["series_paths"] == ["pkg/new_name.py", "pkg/old_name.py", "tools/run.sh"]
    files = {f["path"]: f for f in report["end_state"]["files"]}
    assert files["pkg/old_name.py"]["series"] is None
    if keep_mode:
        assert rc == 0
        assert statuses(report) == ["identical", "identical"]
        assert files["tools/run.sh"]["series"]["mode"] == "100755"
        assert report["end_state"]["equal"] is True
    else:
        assert rc == 1
        assert statuses(report) == ["changed", "identical"]
        assert "mode change 100644 => 100755" in report["patches"][0]["range_diff"]
        run = files["tools/run.sh"]
        assert run["series"]["blob"] == run["consolidated"]["blob"]
        assert (run["series"]["mode"], run["consolidated"]["mode"]) == ("100755", "100644")
        assert "old mode 100755\nnew mode 100644" in run["diff"]


def _rename_series_without_mode(repo: Repo) -> None:
    repo.write(
        {
            "pkg/new_name.py": repo.path.joinpath("pkg/old_name.py").read_text() + "Z = 3\n",
            "pkg/old_name.py": None,
        }
    )
    repo.commit("Rename the module")
    repo.commit("Use the new module", {"tools/run.sh": "#!/bin/sh\npython -m pkg.new_name\n"})


# ---------------------------------------------------------------- refusals


def test_accept_refusals(series, capsys):
    series.consolidate(SERIES)
    with pytest.raises(SystemExit) as exc:  # argparse: accept followed by another accept
        cli.main(["check", "--accept", "0001", "--accept", "0002", "--reason", "x"])
    assert exc.value.code == 2
    assert "--accept 0001 needs a --reason" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", "--reason", "orphan"])
    assert exc.value.code == 2

    rc, err = series.check(capsys, "--consolidated", "cons", "--accept", "0001")
    assert rc == 2 and "--accept 0001 needs a --reason" in err
    rc, err = series.check(capsys, "--consolidated", "cons", "--accept", "0009", "--reason", "x")
    assert rc == 2 and "names no series patch" in err and "0001, 0002, 0003" in err
    rc, err = series.check(
        capsys, "--consolidated", "cons", "--accept", "file:README", "--reason", "x"
    )
    assert rc == 2 and "not a series-owned path" in err
    rc, err = series.check(
        capsys, "--consolidated", "cons", "--accept", "extra:nosuch", "--reason", "x"
    )
    assert rc == 2 and "names no commit" in err


def test_series_merged_into_a_fork_branch(series, capsys):
    """The fork merges the series branch (`make apply`'s) with a merge commit."""
    repo = series.repo
    repo.git("checkout", "-q", "-b", "fork", series.base)
    repo.commit("Fork work", {"README": "fork\n"})
    repo.git("checkout", "-q", "-b", "applied", series.base)
    shas = [repo.commit(m, f) for m, f in SERIES]
    repo.git("checkout", "-q", "fork")
    repo.git("merge", "-q", "--no-ff", "-m", "Merge the loader series", "applied")
    repo.git("checkout", "-q", "main")
    rc, report = series.check(capsys, "--consolidated", "fork")
    assert rc == 0
    assert statuses(report) == ["identical"] * 3
    assert [p["commits"] for p in report["patches"]] == [[s] for s in shas]
    assert report["extra"] == [] and report["end_state"]["equal"] is True


def test_input_refusals(series, capsys, tmp_path):
    series.consolidate(SERIES)
    rc, err = series.check(capsys, "--consolidated", "no-such-branch")
    assert rc == 2 and "'no-such-branch' names no commit" in err
    series.repo.git("checkout", "-q", "--orphan", "elsewhere")
    series.repo.commit("unrelated root", {"README": "other\n"})
    series.repo.git("checkout", "-q", "main")
    rc, err = series.check(capsys, "--consolidated", "elsewhere")
    assert rc == 2 and "is not an ancestor of elsewhere" in err
    rc = cli.main(
        [
            "check",
            "--vllm",
            str(tmp_path / "nowhere"),
            "--consolidated",
            "cons",
            "--manifest",
            str(series.manifest),
        ]
    )
    assert rc == 2 and "is not a git repository" in capsys.readouterr().err


def test_the_fixture_series_agrees_with_its_manifest(series):
    """The refusal below must be the only reason an audit is refused."""
    assert check_manifest.problems(load_manifest(series.manifest), series.patch_dir) == []


def test_tampered_patch_file_is_refused_not_audited(series, capsys, monkeypatch):
    """A patch edited after export is not the series: the audit must not trust it.

    The consolidated branch carries the tampered change; the command refuses
    before auditing, naming the file.
    """
    tampered = series.patch_dir / FILES[2]
    text = tampered.read_text()
    assert "+LOADER = 'safetensors'\n" in text
    tampered.write_text(text.replace("+LOADER = 'safetensors'\n", "+LOADER = 'pickle'\n"))
    pickle_config = CONFIG_3.replace("'safetensors'", "'pickle'")
    series.consolidate([PATCH_1, PATCH_2, (PATCH_3[0], {"vllm/config.py": pickle_config})])
    files = [series.patch_dir / f for f in FILES]
    # The hand edit left the index line's postimage behind: even the audit
    # itself no longer builds the series from it.
    with pytest.raises(SeriesError, match="not the patch's postimage"):
        audit.audit(series.repo.path, "cons", series.base, files)
    monkeypatch.setattr(audit, "audit", _no_audit)

    rc, err = series.check(capsys, "--consolidated", "cons")

    assert rc == 2
    assert f"{FILES[2]}: stable patch ID" in err
    assert "disagrees with" in err and str(series.manifest) in err
    # The commands name the audited series' own folder, not the project's patches/.
    patches = f"PATCHES={series.manifest.parent}"
    assert f" check-manifest {patches}`" in err and f" export {patches}`" in err


def _no_audit(*args, **kwargs):
    raise AssertionError("an inconsistent series must be refused before the audit runs")


# ---------------------------------------------------------------- scale


def _fast_import(repo: Repo, branch: str, base: str, steps) -> None:
    """Build ``branch`` from ``base`` with one commit per step (a dict of files) in one process."""
    chunks = []
    when = 1_700_000_000
    for n, (message, files) in enumerate(steps):
        msg = message.encode()
        chunks.append(
            f"commit refs/heads/{branch}\n"
            f"author A U Thor <a@example.com> {when + n} +0000\n"
            f"committer A U Thor <a@example.com> {when + n} +0000\n"
            f"data {len(msg)}\n".encode()
            + msg
            + b"\n"
        )
        if n == 0:
            chunks.append(f"from {base}\n".encode())
        for path, text in files.items():
            data = text.encode()
            chunks.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
        chunks.append(b"\n")
    env = dict(os.environ, **IDENTITY)
    subprocess.run(
        ["git", "-C", str(repo.path), "fast-import", "--quiet"],
        input=b"".join(chunks),
        check=True,
        env=env,
    )


@pytest.mark.parametrize("n_commits", [3000])
def test_scale_thousands_of_commits(series, capsys, n_commits):
    """A fork branch of thousands of commits, three touching series files, one changed."""
    fixed = LOADER_2 + "\n\nSCALE = 1\n"
    placed = {
        n_commits // 4: PATCH_1,
        n_commits // 2: (PATCH_2[0], {**PATCH_2[1], "vllm/loader.py": fixed}),
        3 * n_commits // 4: PATCH_3,
    }
    steps = []
    for k in range(n_commits):
        steps.append((f"fork work {k}", {f"noise/f{k % 97}.txt": f"{k}\n"}))
        if k in placed:
            message, files = placed[k]
            steps.append((message, {**files, f"noise/g{k}.txt": "mixed\n"}))
    start = time.monotonic()
    _fast_import(series.repo, "big", series.base, steps)
    built = time.monotonic() - start
    assert int(series.repo.git("rev-list", "--count", f"{series.base}..big")) == n_commits + 3

    start = time.monotonic()
    rc, report = series.check(capsys, "--consolidated", "big")
    took = time.monotonic() - start
    with capsys.disabled():
        print(
            f"\n[scale] {n_commits + 3} consolidated commits: built in {built:.2f} s,"
            f" audited in {took:.2f} s (report says {report['seconds']:.2f} s)"
        )
    assert statuses(report) == ["identical", "changed", "identical"]
    assert report["consolidated_commits_touching_series_paths"] == 3
    assert "++SCALE = 1" in report["patches"][1]["range_diff"]
    assert "noise" not in report["patches"][1]["range_diff"]
    assert report["extra"] == [] and rc == 1
    assert took < 60, "auditing thousands of commits must take seconds, not minutes"


# ---------------------------------------------------------------- a fork without the base


def test_fork_lacking_the_pinned_base_is_told_what_is_missing_and_how_to_supply_it(
    make_repo, tmp_path, capsys
):
    """A fork's own history: neither the base commit nor its blobs are there."""
    series = build_series(make_repo, tmp_path)
    fork = make_repo("fork", {**BASE_FILES, "vllm/config.py": CONFIG_0 + "FORK = 1\n"})
    fork.commit("fork: the loader series", {**PATCH_1[1], **PATCH_2[1]})
    args = ["check", "--vllm", str(fork.path), "--consolidated", "main",
            "--patches-dir", str(series.patch_dir), "--manifest", str(series.manifest)]  # fmt: skip
    capsys.readouterr()

    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert series.base[:12] in err and "not in" in err
    assert f"git -C {fork.path} fetch" in err and "v0.0.0" in err and "BASE=" in err

    assert cli.main([*args, "--base", "main~1"]) == 2
    err = capsys.readouterr().err
    assert "vllm/config.py" in err and "lacks" in err
    assert "lacks necessary blobs" not in err  # git's words, not an explanation
    assert "fetch" in err and "BASE=" in err


def test_a_depth_1_clone_is_told_to_unshallow_and_that_works(series, tmp_path, capsys):
    for message, files in SERIES:
        series.repo.commit(message, files)
    clone = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{series.repo.path}",
                    str(clone)], check=True)  # fmt: skip
    args = ["check", "--vllm", str(clone), "--consolidated", "HEAD",
            "--patches-dir", str(series.patch_dir), "--manifest", str(series.manifest)]  # fmt: skip
    capsys.readouterr()
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    command = f"git -C {clone} fetch --unshallow"
    assert "is a shallow clone" in err and command in err and "--base" not in err
    subprocess.run(command, shell=True, check=True, capture_output=True)
    assert cli.main(args) == 0, capsys.readouterr()
