"""``rebase`` on throw-away repos: context drift needing the 3-way fallback, a
conflict (checkout restored exactly; or kept, then continued, skipped by hand
or aborted; a modify/delete conflict named as such), a patch absorbed upstream
(dropped), failing tests (nothing written), killed runs (re-run recovers,
``patches/`` never half-written), and the version path through pip and small
local sdists (a version the index lacks is refused, leaving nothing behind)."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    USER,
    Repo,
    export_work_branch,
    local_identity,
    snapshot,
    user_git,
    write_sdist,
)
from seriestool import base as base_mod
from seriestool import check_manifest, patchset, rangediff, seriestest
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod
from seriestool import rebase as rebase_mod
from seriestool.cli import build_parser, main
from seriestool.errors import SeriesError

LOADER = "".join(f"line_{n:02d} = {n}\n" for n in range(1, 31))


def _edit(text: str, n: int, new: str) -> str:
    """``text`` with line ``line_NN`` (1-based) replaced by ``new``."""
    lines = text.splitlines(keepends=True)
    lines[n - 1] = new + "\n"
    return "".join(lines)


PATCH_1 = _edit(LOADER, 10, "line_10 = 'ten'  # series")
PATCH_3 = _edit(PATCH_1, 25, "line_25 = 'twenty-five'  # series")


@pytest.fixture
def work_dir(tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(base_mod, "WORK_DIR", work)
    return work


def _series_on(repo: Repo, base: str, patch_dir: Path, manifest_base: manifest_mod.Base):
    """Commit the three-patch toy series on ``base`` and export it to ``patch_dir``."""
    repo.git("checkout", "-q", "-b", "work", base)
    repo.commit("[Loader] first change\n\nBody of the first patch.", {
        "pkg/loader.py": PATCH_1,
        "tests/test_first.py": "def test_first():\n    assert True\n",
    })  # fmt: skip
    repo.commit("[Loader] second change", {"pkg/other.py": "VALUE = 2\n\n\n\n\nOTHER = 1\n"})
    repo.commit("[Loader] third change", {
        "pkg/loader.py": PATCH_3,
        "tests/test_third.py": "def test_third():\n    assert True\n",
    })  # fmt: skip
    patch_dir.mkdir()
    manifest = manifest_mod.Manifest(
        name="toy", version="1", base=manifest_base, patches=[],
        regression_tests=manifest_mod.RegressionTests(),
    )  # fmt: skip
    export_mod.export_series(
        repo.path, manifest, "work", base, patch_dir=patch_dir,
        manifest_path=patch_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip
    repo.git("checkout", "-q", "-")
    repo.git("branch", "-q", "-D", "work")
    return manifest


@pytest.fixture
def series(make_repo, tmp_path, work_dir):
    """Upstream repo (the user's checkout) on ``main`` at the base, and a series.

    Returns (repo, patch_dir).  Upstream branches made by the tests are the
    new bases, reached with ``--vllm`` (the commit path).
    """
    repo = make_repo("upstream", {
        "pkg/loader.py": LOADER,
        "pkg/other.py": "VALUE = 1\n\n\n\n\nOTHER = 1\n",
    })  # fmt: skip
    base = repo.head()
    patch_dir = tmp_path / "patches"
    _series_on(repo, base, patch_dir, manifest_mod.Base(
        project="toy", version="1.0", upstream_commit=base[:9],
        sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64),
        commit=base, touched_files={},
    ))  # fmt: skip
    return repo, patch_dir


def _upstream(repo: Repo, name: str, files: dict[str, str], message: str = "upstream") -> str:
    """A new upstream commit on branch ``name`` from ``main``; back on ``main``."""
    repo.git("checkout", "-q", "-b", name, "main")
    commit = repo.commit(message, files)
    repo.git("checkout", "-q", "main")
    return commit


def _rebase(repo: Repo, to: str, patch_dir: Path, **kwargs) -> tuple[int, str]:
    lines: list[str] = []
    kwargs.setdefault("skip_tests", True)
    rc = rebase_mod.start(to, repo.path, patch_dir=patch_dir, log=lines.append, **kwargs)
    return rc, "\n".join(lines)


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _user_clutter(repo: Repo) -> None:
    repo.write({"pkg/other.py": "VALUE = 7\n"})
    repo.git("stash", "push", "-q", "-m", "user stash")
    repo.write({"notes.txt": "untracked user notes\n"})


def _no_session(work: Path) -> None:
    assert not rebase_mod.state_path().exists()
    rebase = work / "rebase"
    leftovers = (
        [p.relative_to(rebase).as_posix() for p in rebase.rglob("*")] if rebase.exists() else []
    )
    # The record: the report, and a test failure the next run's report keeps.
    kept = ("report.md", "tests-failed.md")
    assert all(p.count("/") == 0 or p.endswith(kept) for p in leftovers), leftovers


def _apply_check(repo: Repo, commit: str, patch: Path, tmp: Path) -> int:
    """``git apply --check`` (no 3-way) of ``patch`` on ``commit``, in a probe clone."""
    import tempfile

    probe = Path(tempfile.mkdtemp(dir=tmp)) / "probe"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(probe)], check=True)
    subprocess.run(["git", "-C", str(probe), "checkout", "-q", commit], check=True)
    proc = subprocess.run(["git", "-C", str(probe), "apply", "--check", str(patch)],
                          capture_output=True)  # fmt: skip
    return proc.returncode


# --------------------------------------------------------------------------
# Clean rebase with context drift


def test_context_drift_rebases_with_three_way_fallback(series, tmp_path, work_dir):
    repo, patch_dir = series
    # Upstream changed line 8: inside the first hunk's context, not adjacent.
    drift = _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    first = patch_dir / "0001-Loader-first-change.patch"
    assert _apply_check(repo, drift, first, tmp_path) != 0  # plain apply fails
    _user_clutter(repo)
    before = snapshot(repo)

    rc, output = _rebase(repo, "drift", patch_dir)

    assert rc == 0
    assert snapshot(repo) == before  # the user's checkout was only cloned
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert manifest.base.commit == drift
    assert manifest.base.version == drift[:12]  # git describe --always, no tags
    assert manifest.base.upstream_commit == drift[:9]
    assert manifest.base.touched_files["pkg/loader.py"] == repo.git(
        "rev-parse", f"{drift}:pkg/loader.py"
    )
    assert [p.subject for p in manifest.patches] == [
        "[Loader] first change", "[Loader] second change", "[Loader] third change",
    ]  # fmt: skip
    assert check_manifest.problems(manifest, patch_dir) == []
    assert _apply_check(repo, drift, first, tmp_path) == 0  # refreshed patch applies plainly
    report = (work_dir / "rebase" / "drift" / "report.md").read_text()
    assert report.rstrip("\n") in output  # the report is printed too
    assert "Result: **SUCCESS**" in report
    row = next(ln for ln in report.splitlines() if "0001-Loader-first-change.patch" in ln)
    assert "applied" in row and "3-way merge" in row
    assert "## Range-diff" in report and "git range-diff" in report
    assert "1:  " in report and " = 1:  " not in report.split("## Range-diff")[0]
    _no_session(work_dir)
    # Applied, the new series has both upstream's and the series' change.
    repo.git("checkout", "-q", "--detach", drift)
    repo.git("am", "-q", *[str(p) for p in manifest.patch_paths(patch_dir)])
    text = (repo.path / "pkg/loader.py").read_text()
    assert "line_08 = 'eight'" in text and "line_10 = 'ten'  # series" in text


def test_rebase_export_is_reproducible(series, tmp_path):
    repo, patch_dir = series
    _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    twin = tmp_path / "twin" / "patches"
    twin.parent.mkdir()
    import shutil

    shutil.copytree(patch_dir, twin)
    repo.git("config", "diff.noprefix", "true")  # user settings must not matter
    _rebase(repo, "drift", patch_dir)
    _rebase(repo, "drift", twin)
    assert _contents(patch_dir) == _contents(twin)


# --------------------------------------------------------------------------
# Conflicts


def _conflict_base(repo: Repo) -> str:
    return _upstream(repo, "conflict", {"pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'")})


@pytest.mark.parametrize("detached", [False, True])
def test_conflict_reports_and_leaves_everything_as_it_was(series, work_dir, detached):
    repo, patch_dir = series
    _conflict_base(repo)
    if detached:
        repo.git("checkout", "-q", "--detach", "HEAD")
    _user_clutter(repo)
    before, patches_before = snapshot(repo), _contents(patch_dir)

    with pytest.raises(SeriesError) as err:
        _rebase(repo, "conflict", patch_dir)

    message = str(err.value)
    assert "0001-Loader-first-change.patch conflicts" in message
    assert "conflict: pkg/loader.py: 1 conflicting hunk(s) at line 10" in message
    assert "git: error: patch failed: pkg/loader.py:7" in message  # the patch's hunk
    assert "git: error: Failed to merge in the changes." in message
    assert "nothing was changed" in message and "KEEP=1" in message
    assert snapshot(repo) == before
    assert _contents(patch_dir) == patches_before
    report = (work_dir / "rebase" / "conflict" / "report.md").read_text()
    assert "CONFLICT" in report and "## Conflict" in report
    assert "| " not in report  # plain-text tables in code blocks
    _no_session(work_dir)


def test_modify_delete_conflict_is_reported_as_such(series, work_dir):
    """Upstream deleted a file patch 2 changes: no markers to count, so the
    report names the kind of conflict and which side deleted the file."""
    repo, patch_dir = series
    repo.git("checkout", "-q", "-b", "deleted", "main")
    repo.git("rm", "-q", "pkg/other.py")
    repo.git("commit", "-q", "-m", "upstream removes pkg/other.py")
    repo.git("checkout", "-q", "main")

    with pytest.raises(SeriesError) as err:
        _rebase(repo, "deleted", patch_dir)

    message = str(err.value)
    assert "0002-Loader-second-change.patch conflicts" in message
    assert (
        "conflict: pkg/other.py: modify/delete (deleted in the new base, modified by the patch)"
        in message
    )
    assert "conflicting hunk(s)" not in message
    report = (work_dir / "rebase" / "deleted" / "report.md").read_text()
    assert "modify/delete (deleted in the new base" in report
    _no_session(work_dir)


def test_describe_conflict_names_each_unmerged_kind():
    def describe(code, path, markers):
        return patchset.describe_conflict(code, path, markers, ours="the new base")

    assert describe("UU", "a.py", [3, 9]) == "conflict: a.py: 2 conflicting hunk(s) at line 3, 9"
    assert describe("UD", "a.py", []) == (
        "conflict: a.py: modify/delete (modified in the new base, deleted by the patch)"
    )
    assert describe("DU", "a.py", []) == (
        "conflict: a.py: modify/delete (deleted in the new base, modified by the patch)"
    )
    assert "added on both sides" in describe("AA", "a.py", [1])
    assert describe("DD", "a.py", []) == "conflict: a.py: deleted on both sides, unmerged"


def test_keep_conflict_then_continue_after_resolution(series, work_dir):
    repo, patch_dir = series
    new_base = _conflict_base(repo)
    _user_clutter(repo)
    before, patches_before = snapshot(repo), _contents(patch_dir)

    with pytest.raises(SeriesError, match=r"(?s)left in progress.*CONTINUE=1.*ABORT=1"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)

    branch = "toy/v1-rebase-onto-conflict"
    assert repo.git("symbolic-ref", "--short", "HEAD") == branch
    assert (repo.path / ".git" / "rebase-apply").exists()
    assert "<<<<<<< " in (repo.path / "pkg/loader.py").read_text()
    assert rebase_mod.state_path().exists()
    assert _contents(patch_dir) == patches_before
    # A new rebase is refused while this one is open.
    with pytest.raises(SeriesError, match="(?s)in progress.*CONTINUE=1.*ABORT=1"):
        _rebase(repo, "conflict", patch_dir)
    # Continuing before resolving is refused and changes nothing.
    with pytest.raises(SeriesError, match="still unmerged.*pkg/loader.py"):
        rebase_mod.resume(log=lambda *_: None)
    assert (repo.path / ".git" / "rebase-apply").exists()

    resolved = _edit(_edit(LOADER, 10, "line_10 = 'X'"), 11, "line_11 = 11  # series, resolved")
    repo.write({"pkg/loader.py": resolved})
    repo.git("add", "pkg/loader.py")
    lines: list[str] = []
    assert rebase_mod.resume(log=lines.append) == 0

    # The user's checkout is back where it was; the rebased branch stays.
    after = snapshot(repo)
    assert {k: v for k, v in after.items() if k != "branches"} == {
        k: v for k, v in before.items() if k != "branches"
    }
    assert f"refs/heads/{branch} " in after["branches"]
    assert repo.git("rev-list", "--count", f"{new_base}..{branch}") == "3"
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert manifest.base.commit == new_base and len(manifest.patches) == 3
    assert check_manifest.problems(manifest, patch_dir) == []
    first = (patch_dir / manifest.patches[0].file).read_text()
    assert "+line_11 = 11  # series, resolved" in first
    report = "\n".join(lines)
    assert "resolved by hand" in report and "Result: **SUCCESS**" in report
    _no_session(work_dir)


def test_keep_conflict_then_abort_restores_exactly(series, work_dir):
    repo, patch_dir = series
    _conflict_base(repo)
    repo.git("checkout", "-q", "--detach", "HEAD")
    _user_clutter(repo)
    before, patches_before = snapshot(repo), _contents(patch_dir)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    assert snapshot(repo) != before
    repo.write({"pkg/loader.py": "half-way through resolving\n"})

    assert main(["rebase", "--abort"]) == 0

    assert snapshot(repo) == before
    assert _contents(patch_dir) == patches_before
    assert not rebase_mod.state_path().exists()
    report = (work_dir / "rebase" / "conflict" / "report.md").read_text()
    assert "Result: **ABORTED** (rebase to conflict aborted;" in report
    assert "STOPPED" not in report and "CONTINUE=1" not in report
    with pytest.raises(SeriesError, match="no rebase is in progress"):
        rebase_mod.abort(log=lambda *_: None)


def test_abort_refuses_to_undo_what_the_rebase_did_not_do(series, work_dir):
    repo, patch_dir = series
    _conflict_base(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.git("tag", "my-tag")
    repo.git("config", "remote.fork.url", "https://example.com/fork.git")
    during = snapshot(repo)

    with pytest.raises(SeriesError) as refused:
        rebase_mod.abort(log=lambda *_: None)
    message = str(refused.value)
    assert "refs/tags/my-tag: created" in message and "remote.fork.url added" in message
    assert "rebase ABORT=1 FORCE=1" in message
    assert snapshot(repo) == during

    assert main(["rebase", "--abort", "--force"]) == 0
    assert snapshot(repo) == before


def test_resolution_to_no_change_drops_the_patch(series):
    repo, patch_dir = series
    _conflict_base(repo)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.git("checkout", "HEAD", "--", "pkg/loader.py")  # keep upstream's side only
    repo.git("rm", "-q", "--cached", "tests/test_first.py")
    (repo.path / "tests/test_first.py").unlink()
    lines: list[str] = []
    assert rebase_mod.resume(log=lines.append) == 0
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert [p.subject for p in manifest.patches] == [
        "[Loader] second change", "[Loader] third change",
    ]  # fmt: skip
    output = "\n".join(lines)
    row = next(ln for ln in output.splitlines() if ln.startswith("1  0001-Loader-first"))
    assert "dropped (resolved to no change)" in row and "absorbed" not in row
    assert "replaced: 2 patches, 1 dropped (resolved to no change)," in output


def test_patch_skipped_by_hand_is_not_reported_as_absorbed(series, work_dir):
    """`git am --skip` gives the change up: the report must not call it absorbed."""
    repo, patch_dir = series
    _conflict_base(repo)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.git("am", "--skip")
    lines: list[str] = []
    assert rebase_mod.resume(log=lines.append) == 0

    manifest = manifest_mod.load(patch_dir / "series.json")
    assert [p.subject for p in manifest.patches] == [
        "[Loader] second change", "[Loader] third change",
    ]  # fmt: skip
    output = "\n".join(lines)
    row = next(ln for ln in output.splitlines() if ln.startswith("1  0001-Loader-first"))
    assert "dropped (skipped by hand)" in row and "git am --skip" in row
    assert "absorbed" not in row and "upstream has it" not in row
    assert "replaced: 2 patches, 1 dropped (skipped by hand)," in output
    assert "Skipped by hand (`git am --skip`): 0001-Loader-first-change.patch" in output
    assert "not in the new series" in output
    _no_session(work_dir)


# --------------------------------------------------------------------------
# Absorbed upstream


def test_patch_absorbed_upstream_is_dropped_and_files_renumbered(series, work_dir):
    repo, patch_dir = series
    # Upstream made patch 2's change and more in one commit: the patch merges
    # to no change (its patch ID is not upstream's).
    _upstream(repo, "absorbed", {"pkg/other.py": "VALUE = 2\n\n\n\n\nOTHER = 2\n"})

    rc, output = _rebase(repo, "absorbed", patch_dir)

    assert rc == 0
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert [(p.file, p.subject) for p in manifest.patches] == [
        ("0001-Loader-first-change.patch", "[Loader] first change"),
        ("0002-Loader-third-change.patch", "[Loader] third change"),
    ]
    assert sorted(p.name for p in patch_dir.glob("*.patch")) == [
        "0001-Loader-first-change.patch", "0002-Loader-third-change.patch",
    ]  # fmt: skip
    assert "pkg/other.py" not in manifest.base.touched_files
    assert check_manifest.problems(manifest, patch_dir) == []
    row = next(ln for ln in output.splitlines() if "0002-Loader-second-change.patch" in ln)
    assert "dropped (absorbed)" in row and "no change after 3-way merge" in row
    assert "replaced: 2 patches, 1 dropped (absorbed), base" in output
    assert "Skipped by hand" not in output
    third = next(ln for ln in output.splitlines() if ln.startswith("3  0003-Loader-third"))
    assert third.rstrip().endswith("0002-Loader-third-change.patch")
    assert "2:  " in output and " < -:  ---" in output  # range-diff shows the drop


def test_patch_id_found_in_upstream_history_is_dropped(series):
    repo, patch_dir = series
    # Upstream picked patch 2 as it is, then went on.
    repo.git("checkout", "-q", "-b", "picked", "main")
    repo.git("am", "-q", str(patch_dir / "0002-Loader-second-change.patch"))
    picked = repo.head()
    repo.commit("later upstream work", {"pkg/new.py": "NEW = 1\n"})
    repo.git("checkout", "-q", "main")

    rc, output = _rebase(repo, "picked", patch_dir)

    assert rc == 0
    row = next(ln for ln in output.splitlines() if "0002-Loader-second-change.patch" in ln)
    assert "dropped (absorbed)" in row
    assert f"patch ID is upstream commit {picked[:12]}" in row
    assert "searched `" in output
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert len(manifest.patches) == 2


def test_patch_id_upstream_but_reverted_since_is_not_dropped(series):
    repo, patch_dir = series
    repo.git("checkout", "-q", "-b", "reverted", "main")
    repo.git("am", "-q", str(patch_dir / "0002-Loader-second-change.patch"))
    repo.git("revert", "--no-edit", "HEAD")
    repo.git("checkout", "-q", "main")
    rc, output = _rebase(repo, "reverted", patch_dir)
    assert rc == 0
    assert len(manifest_mod.load(patch_dir / "series.json").patches) == 3


# --------------------------------------------------------------------------
# Refusals


def test_refusals_name_the_input_and_the_fix(series, work_dir, capsys):
    repo, patch_dir = series
    with pytest.raises(SeriesError, match="no commit or tag 'nope'; fetch it"):
        _rebase(repo, "nope", patch_dir)
    with pytest.raises(SeriesError, match="not a version.*needs VLLM="):
        rebase_mod.start("deadbeef", None, patch_dir=patch_dir, log=lambda *_: None)
    with pytest.raises(SeriesError, match="already based on"):
        _rebase(repo, "main", patch_dir)
    assert main(["rebase"]) == 1
    assert main(["rebase", "--to", "drift", "--continue"]) == 1
    assert "give exactly one of" in capsys.readouterr().err
    with pytest.raises(SeriesError, match="no rebase is in progress"):
        rebase_mod.resume(log=lambda *_: None)
    # A tampered series is refused before anything starts.
    _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    first = patch_dir / "0001-Loader-first-change.patch"
    first.write_text(first.read_text().replace("'ten'", "'TEN'"))
    with pytest.raises(SeriesError, match="(?s)disagrees with series.json.*0001-Loader-first"):
        _rebase(repo, "drift", patch_dir)
    _no_session(work_dir)


def test_keep_conflict_refuses_a_dirty_checkout(series):
    repo, patch_dir = series
    _conflict_base(repo)
    repo.write({"pkg/other.py": "dirty\n"})
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="uncommitted changes"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    assert snapshot(repo) == before


# --------------------------------------------------------------------------
# Tests on the new base


def _fake_tests(monkeypatch, rc: int, calls: list):
    def check_prefixes(manifest, patch_dir, base_repo=None):
        base = rebase_mod.g.rev(base_repo, "base") if base_repo else None
        calls.append((manifest, sorted(p.name for p in Path(patch_dir).iterdir()), base))
        print("fake series tests: " + ("1 passed" if rc == 0 else "1 failed"))
        return rc

    monkeypatch.setattr(seriestest, "check_prefixes", check_prefixes)


def test_tests_run_by_default_on_the_staged_series(series, monkeypatch):
    repo, patch_dir = series
    drift = _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    calls: list = []
    _fake_tests(monkeypatch, 0, calls)
    rc, output = _rebase(repo, "drift", patch_dir, skip_tests=False)
    assert rc == 0
    [(manifest, staged, base_in_repo)] = calls
    assert manifest.base.commit == drift == base_in_repo
    assert staged == sorted(p.name for p in patch_dir.iterdir())
    assert "## Tests" in output and "passed" in output and "fake series tests" in output


def test_failing_tests_write_nothing_into_patches(series, monkeypatch, work_dir):
    repo, patch_dir = series
    _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    _fake_tests(monkeypatch, 1, [])
    patches_before = _contents(patch_dir)
    with pytest.raises(SeriesError, match="(?s)tests did not pass.*FAILED.*nothing was written"):
        _rebase(repo, "drift", patch_dir, skip_tests=False)
    assert _contents(patch_dir) == patches_before
    report = (work_dir / "rebase" / "drift" / "report.md").read_text()
    assert "TESTS FAILED" in report and "unchanged: nothing written" in report
    assert "fake series tests: 1 failed" in report
    _no_session(work_dir)
    assert not list(patch_dir.parent.glob("patches.rebase-*"))


def test_failing_tests_name_the_step_and_print_a_notest_command(series, monkeypatch, work_dir):
    repo, patch_dir = series
    _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})

    def check_prefixes(manifest, patch_dir, base_repo=None):
        print("... pytest and ruff output ...\n" * 40, end="")
        print("failed step: pytest on prefix 0001..0003: tests/test_third.py::test_third")
        print("failed step: ruff (vLLM config): pkg/loader.py")
        return 1

    monkeypatch.setattr(seriestest, "check_prefixes", check_prefixes)
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "drift", patch_dir, skip_tests=False)
    message = str(err.value)
    assert "\n  pytest on prefix 0001..0003: tests/test_third.py::test_third\n" in message
    assert "\n  ruff (vLLM config): pkg/loader.py\n" in message
    [hint] = [line[4:] for line in message.splitlines() if line.startswith("    make ")]
    words = shlex.split(hint)
    assert words[:4] == ["make", "-C", str(ROOT), "rebase"]
    assert sorted(words[4:]) == sorted(
        ["TO=drift", f"VLLM={repo.path}", f"PATCHES={patch_dir}", "NOTEST=1"]
    )

    report = work_dir / "rebase" / "drift" / "report.md"
    rows = {
        line.split()[1]: line for line in report.read_text().splitlines() if " applied " in line
    }
    assert "FAILED: tests/test_third.py::test_third" in rows["0003-Loader-third-change.patch"]
    assert " passed " in rows["0001-Loader-first-change.patch"]

    # The hint's variables, as the Makefile passes them, rebase without the tests.
    calls: list = []
    _fake_tests(monkeypatch, 1, calls)
    args = ["rebase", "--to", "drift", "--vllm", str(repo.path), "--patches-dir",
            str(patch_dir), "--skip-tests"]  # fmt: skip
    assert main(args) == 0
    assert calls == []
    # The failure stays in the record of the run that wrote patches/.
    text = report.read_text()
    assert "tests skipped after they FAILED" in text
    assert "## Tests: an earlier run of this rebase FAILED" in text
    assert "pytest on prefix 0001..0003: tests/test_third.py::test_third" in text


def test_keep_continue_without_the_tests_keeps_their_failure_in_the_report(
    series, monkeypatch, work_dir
):
    repo, patch_dir = series
    _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    _fake_tests(monkeypatch, 1, [])
    with pytest.raises(SeriesError, match=r"(?s)tests did not pass.*CONTINUE=1 NOTEST=1"):
        _rebase(repo, "drift", patch_dir, skip_tests=False, keep_conflict=True)
    assert rebase_mod.resume(log=lambda *_: None, skip_tests=True) == 0
    text = (work_dir / "rebase" / "drift" / "report.md").read_text()
    assert "Result: **SUCCESS, the tests skipped after they FAILED (below)**" in text
    assert "fake series tests: 1 failed" in text


def test_keep_stops_at_a_patch_whose_own_tests_fail_on_the_new_base(
    make_repo, tmp_path, work_dir, monkeypatch
):
    checks = "import pkg.a\n\n\ndef test_first():\n    assert pkg.a.line_08 == 8\n"
    repo, patch_dir = _one_off_series(make_repo, tmp_path, {"pkg/a.py": LOADER}, [
        ("[Loader] first", {"pkg/a.py": PATCH_1,
                            "tests/test_first.py": checks}),
        ("[Loader] second", {"pkg/b.py": "VALUE = 1\n"}),
    ])  # fmt: skip
    _upstream(repo, "drift", {"pkg/a.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    _fake_tests(monkeypatch, 0, [])  # the whole series' step, after the patches
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "drift", patch_dir, skip_tests=False, keep_conflict=True)
    message = str(err.value)
    assert "0001-Loader-first.patch fails its tests on" in message
    assert "tests/test_first.py::test_first" in message and "CONTINUE=1" in message
    assert repo.git("log", "-1", "--format=%s") == "[Loader] first"  # applied, open to amend
    assert "tests failed" in (work_dir / "rebase" / "drift" / "report.md").read_text()

    repo.write({"tests/test_first.py": checks.replace("== 8", "== 'eight'")})
    repo.git("commit", "-q", "--amend", "--no-edit", "-a")
    assert rebase_mod.resume(log=lambda *_: None) == 0
    first = (patch_dir / "0001-Loader-first.patch").read_text()
    assert "+    assert pkg.a.line_08 == 'eight'" in first
    assert not list(repo.path.rglob("__pycache__"))


def test_commit_base_tests_run_on_the_new_base(series, monkeypatch):
    repo, patch_dir = series
    drift = _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    seen = {}

    def check_prefixes(manifest, patch_dir, base_repo=None):
        # A commit target has no sdist: the tests must use the rebased base.
        seen["base"] = Repo(base_repo).git("rev-parse", "base")
        return 0

    monkeypatch.setattr(seriestest, "check_prefixes", check_prefixes)
    _rebase(repo, "drift", patch_dir, skip_tests=False)
    assert seen["base"] == drift


# --------------------------------------------------------------------------
# Interrupted runs


_KILLER = """
import os, pathlib, signal, sys
sys.path.insert(0, {scripts!r})
from seriestool import rebase, seriestest
where = {where!r}
if where == "tests":
    def check_prefixes(manifest, patch_dir, base_repo=None):
        os.kill(os.getpid(), signal.SIGKILL)
    seriestest.check_prefixes = check_prefixes
else:
    real_rename = pathlib.Path.rename
    def rename(self, target):
        result = real_rename(self, target)
        if pathlib.Path(target).name.endswith(".rebase-old"):
            os.kill(os.getpid(), signal.SIGKILL)  # between the two renames
        return result
    pathlib.Path.rename = rename
rebase.start({to!r}, pathlib.Path({vllm!r}), skip_tests=where != "tests",
             patch_dir=pathlib.Path({patch_dir!r}))
"""


def _killed_run(repo: Repo, patch_dir: Path, work_dir: Path, where: str) -> None:
    script = _KILLER.format(scripts=str(ROOT / "scripts"), where=where, to="drift",
                            vllm=str(repo.path), patch_dir=str(patch_dir))  # fmt: skip
    env = dict(os.environ, SERIES_WORK_DIR=str(work_dir))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == -9, proc.stderr


def test_killed_during_tests_leaves_patches_and_rerun_recovers(series, work_dir):
    repo, patch_dir = series
    drift = _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    patches_before = _contents(patch_dir)
    _killed_run(repo, patch_dir, work_dir, "tests")
    assert _contents(patch_dir) == patches_before
    assert rebase_mod.state_path().exists()  # the killed run could not clean up
    assert (work_dir / "rebase" / "drift" / "staging").exists()

    rc, output = _rebase(repo, "drift", patch_dir)

    assert rc == 0
    assert "discarding the scratch work of an interrupted rebase to drift" in output
    assert manifest_mod.load(patch_dir / "series.json").base.commit == drift
    _no_session(work_dir)


def test_killed_between_the_swap_renames_is_finished_by_the_rerun(series, work_dir):
    repo, patch_dir = series
    drift = _upstream(repo, "drift", {"pkg/loader.py": _edit(LOADER, 8, "line_08 = 'eight'")})
    (patch_dir / "README").write_text("kept across the swap\n")
    _killed_run(repo, patch_dir, work_dir, "swap")
    assert not patch_dir.exists()  # killed exactly between the renames
    assert (patch_dir.parent / "patches.rebase-new").is_dir()
    assert (patch_dir.parent / "patches.rebase-old").is_dir()

    # Any rebase invocation finishes the swap first; here, one that then refuses.
    with pytest.raises(SeriesError, match="already based on"):
        _rebase(repo, "drift", patch_dir)

    manifest = manifest_mod.load(patch_dir / "series.json")
    assert manifest.base.commit == drift
    assert check_manifest.problems(manifest, patch_dir) == []
    assert (patch_dir / "README").read_text() == "kept across the swap\n"
    assert not list(patch_dir.parent.glob("patches.rebase-*"))
    _no_session(work_dir)


def test_recover_swap_discards_a_partial_copy_and_refuses_ambiguity(tmp_path):
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    (patch_dir / "0001-a.patch").write_text("old\n")
    partial = tmp_path / "patches.rebase-new.partial"
    partial.mkdir()
    (partial / "0001-a.patch").write_text("half")
    lines: list[str] = []
    rebase_mod.recover_swap(patch_dir, lines.append)
    assert not partial.exists() and (patch_dir / "0001-a.patch").read_text() == "old\n"
    assert "was not touched" in lines[0]
    (tmp_path / "patches.rebase-new").mkdir()
    (tmp_path / "patches.rebase-old").mkdir()
    with pytest.raises(SeriesError, match="all exist.*delete the other two"):
        rebase_mod.recover_swap(patch_dir, lines.append)


def test_killed_keep_conflict_session_in_a_checkout_refuses_until_aborted(series, work_dir):
    repo, patch_dir = series
    _conflict_base(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    # Make it look like a process that died while applying, before it stopped.
    sess = rebase_mod.Session.load()
    sess.phase, sess.pid = "running", 2**22 + 12345
    sess.patches[0].status = rebase_mod.PENDING
    sess.save()
    with pytest.raises(SeriesError, match="interrupted while working in"):
        _rebase(repo, "conflict", patch_dir)
    with pytest.raises(SeriesError, match="(?s)interrupted, not stopped at a conflict.*ABORT=1"):
        rebase_mod.resume(log=lambda *_: None)
    assert rebase_mod.abort(log=lambda *_: None) == 0
    assert snapshot(repo) == before


_CONTINUE_KILLER = """
import os, signal, sys
sys.path.insert(0, {scripts!r})
from seriestool import rebase
finish = rebase._finish_conflicted_patch
def killed(sess, log):
    finish(sess, log)
    os.kill(os.getpid(), signal.SIGKILL)  # the resolution committed, not yet recorded
rebase._finish_conflicted_patch = killed
rebase.resume()
"""


def _killed_continue(work_dir: Path) -> None:
    """``CONTINUE=1`` killed (SIGKILL) right after it committed the resolved patch."""
    script = _CONTINUE_KILLER.format(scripts=str(ROOT / "scripts"))
    env = dict(os.environ, SERIES_WORK_DIR=str(work_dir))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


# Upstream changed the lines of both patch 1 and patch 3: two conflicts.
TWO_CONFLICTS = _edit(_edit(LOADER, 10, "line_10 = 'X'"), 25, "line_25 = 'Y'")
RESOLVED_1 = _edit(TWO_CONFLICTS, 10, "line_10 = 'X'  # series")


def test_a_kill_during_continue_keeps_the_resolution_and_continue_goes_on(sdist_series, work_dir):
    patch_dir, pip_args, index = sdist_series
    _sdist(index, "4.0", TWO_CONFLICTS, "444444444")
    start = dict(keep_conflict=True, skip_tests=True, patch_dir=patch_dir, pip_args=pip_args,
                 log=lambda *_: None)  # fmt: skip
    with pytest.raises(SeriesError, match="left in progress"):
        rebase_mod.start("4.0", None, **start)
    checkout = Repo(work_dir / "rebase" / "4.0" / "vllm")
    checkout.write({"pkg/loader.py": RESOLVED_1})
    checkout.git("add", "pkg/loader.py")
    _killed_continue(work_dir)

    # A new run neither discards the resolution nor starts over.
    with pytest.raises(SeriesError, match="(?s)what you resolved is kept.*CONTINUE=1.*ABORT=1"):
        rebase_mod.start("4.0", None, **start)
    with pytest.raises(SeriesError, match="0003-Loader-third-change.patch conflicts"):
        rebase_mod.resume(log=lambda *_: None)
    checkout.write({"pkg/loader.py": _edit(RESOLVED_1, 25, "line_25 = 'Y'  # series")})
    checkout.git("add", "pkg/loader.py")
    assert rebase_mod.resume(log=lambda *_: None) == 0
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert [p.subject for p in manifest.patches] == [
        "[Loader] first change", "[Loader] second change", "[Loader] third change"
    ]  # fmt: skip
    assert "+line_10 = 'X'  # series" in (patch_dir / manifest.patches[0].file).read_text()
    _no_session(work_dir)


def test_a_kill_during_continue_in_a_checkout_is_dropped_only_by_abort(series, work_dir):
    repo, patch_dir = series
    _upstream(repo, "conflict", {"pkg/loader.py": TWO_CONFLICTS})
    _user_clutter(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="left in progress"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.write({"pkg/loader.py": RESOLVED_1})
    repo.git("add", "pkg/loader.py")
    _killed_continue(work_dir)
    resolved = repo.git("rev-parse", "HEAD")
    with pytest.raises(SeriesError, match="what you resolved is kept"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    assert repo.git("rev-parse", "HEAD") == resolved

    lines: list[str] = []
    assert rebase_mod.abort(log=lines.append) == 0
    assert "the conflict resolutions made by hand are dropped" in lines[-1]
    assert snapshot(repo) == before


# --------------------------------------------------------------------------
# The version path: bases materialised from sdists with pip


def _sdist(index: Path, version: str, loader: str, commit_id: str) -> str:
    """A toy ``toyvllm`` sdist pip can prepare; returns its sha256."""
    index.mkdir(exist_ok=True)
    top = f"toyvllm-{version}"
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "toyvllm"\nversion = "{version}"\n'
            '[tool.setuptools]\npackages = ["vllm"]\n'
        ),
        "vllm/_version.py": f"__version__ = '{version}'\ncommit_id = 'g{commit_id}'\n",
        "vllm/__init__.py": "",
        "pkg/loader.py": loader,
        "pkg/other.py": "VALUE = 1\n\n\n\n\nOTHER = 1\n",
    }
    return write_sdist(index / f"{top}.tar.gz", top, files)


@pytest.fixture
def sdist_series(tmp_path, work_dir):
    """Series on toyvllm 1.0 materialised from its sdist; 2.0 drifts, 3.0 conflicts."""
    index = tmp_path / "index"
    sha1 = _sdist(index, "1.0", LOADER, "111111111")
    _sdist(index, "2.0", _edit(LOADER, 8, "line_08 = 'eight'"), "222222222")
    _sdist(index, "3.0", _edit(LOADER, 10, "line_10 = 'X'"), "333333333")
    pip_args = ["--no-index", "--find-links", str(index)]
    bare, commit, _ = base_mod.materialise("toyvllm", "1.0", sha1, pip_args=pip_args,
                                           log=lambda *_: None)  # fmt: skip
    repo = Repo(base_mod.clone(bare, tmp_path / "series-work"))
    patch_dir = tmp_path / "patches"
    _series_on(repo, commit, patch_dir, manifest_mod.Base(
        project="toyvllm", version="1.0", upstream_commit="111111111",
        sdist=manifest_mod.Sdist("toyvllm-1.0.tar.gz", sha1), commit=commit,
        touched_files={},
    ))  # fmt: skip
    return patch_dir, pip_args, index


def test_version_rebase_materialises_the_sdist_and_updates_the_manifest(
    sdist_series, work_dir, capsys
):
    patch_dir, pip_args, index = sdist_series
    args = ["rebase", "--to", "v2.0", "--skip-tests", "--patches-dir", str(patch_dir)]
    assert main(args + [f"--pip-arg={a}" for a in pip_args]) == 0

    manifest = manifest_mod.load(patch_dir / "series.json")
    bare = base_mod.base_repo_path("toyvllm", "2.0")
    assert manifest.base.version == "2.0"
    assert manifest.base.upstream_commit == "222222222"
    assert manifest.base.sdist.filename == "toyvllm-2.0.tar.gz"
    assert (
        manifest.base.sdist.sha256
        == hashlib.sha256((work_dir / "sdist" / "toyvllm-2.0.tar.gz").read_bytes()).hexdigest()
    )
    assert manifest.base.commit == rebase_mod.g.rev(bare, "base")
    assert manifest.base.touched_files["pkg/loader.py"] == rebase_mod.g.out(
        bare, "rev-parse", "base:pkg/loader.py"
    )
    assert check_manifest.problems(manifest, patch_dir) == []
    out = capsys.readouterr().out
    assert "# Rebase onto toyvllm 2.0" in out and "3-way merge" in out
    assert "not computable (the bases share no git history" in out
    assert f" rebase TO=v2.0 NOTEST=1 PATCHES={patch_dir} ARGS=" in out  # the command, as typed
    _no_session(work_dir)


def test_patches_dir_is_spelled_as_in_check_and_the_old_spelling_still_parses(tmp_path, capsys):
    parser = build_parser()
    for command in ("rebase", "check", "check-manifest"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert "--patches-dir" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["rebase", "--help"])
    assert "--patch-dir " not in capsys.readouterr().out  # the old spelling is not advertised
    args = parser.parse_args(["rebase", "--to", "1.0", "--patches-dir", str(tmp_path)])
    assert args.patches_dir == str(tmp_path)
    old = parser.parse_args(["rebase", "--to", "1.0", "--patch-dir", str(tmp_path)])
    assert old.patches_dir == str(tmp_path)


def test_refused_version_leaves_nothing_behind(sdist_series, work_dir, capsys):
    """A version the index does not have is refused, and no folder is left in work/."""
    patch_dir, pip_args, _index = sdist_series
    before = sorted(p.relative_to(work_dir).as_posix() for p in work_dir.rglob("*"))
    patches_before = _contents(patch_dir)
    args = ["rebase", "--to", "9.9.9", "--skip-tests", "--patches-dir", str(patch_dir)]

    assert main(args + [f"--pip-arg={a}" for a in pip_args]) == 1

    assert "toyvllm==9.9.9" in capsys.readouterr().err
    assert not (work_dir / "rebase" / "9.9.9").exists()
    assert sorted(p.relative_to(work_dir).as_posix() for p in work_dir.rglob("*")) == before
    assert _contents(patch_dir) == patches_before


def test_version_keep_conflict_works_in_work_rebase_and_continues(sdist_series, work_dir):
    patch_dir, pip_args, _index = sdist_series
    with pytest.raises(SeriesError, match="left in progress in .*rebase/3.0/vllm"):
        rebase_mod.start("3.0", None, keep_conflict=True, skip_tests=True, patch_dir=patch_dir,
                         pip_args=pip_args, log=lambda *_: None)  # fmt: skip
    checkout = Repo(work_dir / "rebase" / "3.0" / "vllm")
    checkout.write({"pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'  # series")})
    checkout.git("add", "pkg/loader.py")
    assert main(["rebase", "--continue"]) == 0
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert manifest.base.version == "3.0" and len(manifest.patches) == 3
    assert check_manifest.problems(manifest, patch_dir) == []
    _no_session(work_dir)


def test_range_diff_with_an_empty_side_lists_the_other(series):
    repo, patch_dir = series
    base = repo.head()
    repo.git("checkout", "-q", "-b", "applied")
    repo.git("am", "-q", "--keep-non-patch", *[str(p) for p in sorted(patch_dir.glob("*.patch"))])
    tip = repo.head()
    text = rangediff.range_diff(repo.path, base, tip, base, base)
    assert text.splitlines()[0].startswith("1:  ") and " < -:  ---" in text
    assert text.splitlines()[2].endswith("[Loader] third change")
    text = rangediff.range_diff(repo.path, base, base, base, tip)
    assert text.splitlines()[1].startswith("-:  ") and " > 2:  " in text


def test_checkout_without_the_old_base_gets_its_blobs_for_three_way(
    sdist_series, make_repo, work_dir
):
    """A real vLLM checkout does not hold the sdist-imported old base: the old
    base comes from the sdist cache, and its pre-image blobs are copied into the
    checkout (as unreferenced objects) so ``git am --3way`` can merge there."""
    patch_dir, pip_args, _index = sdist_series
    user = make_repo("user-vllm", {
        "pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'"),
        "pkg/other.py": "VALUE = 1\n\n\n\n\nOTHER = 1\n",
    })  # fmt: skip
    preimage = user.git("hash-object", "--stdin", input=LOADER)

    def has_object(oid: str) -> bool:
        cmd = ["git", "-C", str(user.path), "cat-file", "-e", oid]
        return subprocess.run(cmd, capture_output=True).returncode == 0

    assert not has_object(preimage)
    _user_clutter(user)
    before = snapshot(user)
    with pytest.raises(SeriesError, match="left in progress"):
        rebase_mod.start("main", user.path, keep_conflict=True, skip_tests=True,
                         patch_dir=patch_dir, pip_args=pip_args, log=lambda *_: None)  # fmt: skip
    text = (user.path / "pkg/loader.py").read_text()
    assert "<<<<<<< " in text and "line_10 = 'ten'  # series" in text  # a real 3-way merge
    assert has_object(preimage)
    assert rebase_mod.abort(log=lambda *_: None) == 0
    assert snapshot(user) == before


# --------------------------------------------------------------------------
# Placement: git applies a hunk at the nearest matching context


BLOCK = "".join(f"block_{c} = '{c}'\n" for c in "abcdefg")
HEAD_LINES = [f"head_{n:02d} = {n}\n" for n in range(1, 11)]
TAIL = "".join(f"tail_{n:02d} = {n}\n" for n in range(1, 11))


@pytest.fixture
def copied_block(make_repo, tmp_path):
    """A one-patch series changing a block, and an upstream branch ``copied``
    that put a copy of that block five lines above it."""
    base_text = "".join(HEAD_LINES) + BLOCK + TAIL
    repo = make_repo("upstream", {"pkg/blocks.py": base_text})
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit("[Loader] change the block", {
        "pkg/blocks.py": base_text.replace("block_d = 'd'", "block_d = 'D'  # series"),
    })  # fmt: skip
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    manifest = manifest_mod.Manifest(
        name="toy", version="1", regression_tests=manifest_mod.RegressionTests(), patches=[],
        base=manifest_mod.Base(
            project="toy", version="1.0", upstream_commit=base[:9],
            sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64), commit=base, touched_files={},
        ),
    )  # fmt: skip
    export_mod.export_series(
        repo.path, manifest, "work", base, patch_dir=patch_dir,
        manifest_path=patch_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip
    repo.git("checkout", "-q", "main")
    copied = "".join(HEAD_LINES[:5]) + BLOCK + "".join(HEAD_LINES[5:]) + BLOCK + TAIL
    _upstream(repo, "copied", {"pkg/blocks.py": copied})
    return repo, patch_dir


def test_hunk_whose_context_appears_twice_is_not_placed_on_the_wrong_copy(
    copied_block, tmp_path, work_dir
):
    """git applies the hunk to the copy (the nearest match); the 3-way merge
    from the recorded preimage changes the real block: they disagree, so the
    rebase stops as a conflict naming patch, file and hunk."""
    repo, patch_dir = copied_block
    # The hazard: plain `git apply` changes the copy at line 9, not the block.
    probe = tmp_path / "probe"
    subprocess.run(["git", "clone", "-q", "--branch", "copied", str(repo.path), str(probe)],
                   check=True)  # fmt: skip
    patch = next(patch_dir.glob("*.patch"))
    subprocess.run(["git", "-C", str(probe), "apply", str(patch)], check=True)
    assert (probe / "pkg/blocks.py").read_text().splitlines()[8] == "block_d = 'D'  # series"
    patches_before = _contents(patch_dir)

    with pytest.raises(SeriesError) as err:
        _rebase(repo, "copied", patch_dir)

    message = str(err.value)
    assert f"{patch.name} conflicts" in message
    assert "pkg/blocks.py" in message and "@@ -11,7 +11,7 @@" in message
    assert "3-way merge" in message and "line 9" in message and "line 21" in message
    assert _contents(patch_dir) == patches_before
    _no_session(work_dir)


def test_misplaced_hunk_kept_for_resolution_holds_the_three_way_result(copied_block, work_dir):
    """With KEEP=1 the patch stops before its commit, the file holding the
    3-way merge; continuing commits it, and the new patch changes the block."""
    repo, patch_dir = copied_block
    with pytest.raises(SeriesError, match="(?s)placement: pkg/blocks.py.*CONTINUE=1"):
        _rebase(repo, "copied", patch_dir, keep_conflict=True)
    lines = (repo.path / "pkg/blocks.py").read_text().splitlines()
    assert lines[8] == "block_d = 'd'" and lines[20] == "block_d = 'D'  # series"
    assert (repo.path / ".git" / "rebase-apply").exists()
    assert rebase_mod.resume(log=lambda *_: None) == 0
    [patch] = patch_dir.glob("*.patch")
    assert "@@ -18,7 +18,7 @@" in patch.read_text()
    _no_session(work_dir)


def test_conflict_hint_carries_the_checkout_and_works_as_printed(
    make_repo, tmp_path, work_dir, make_work_dir
):
    """The hint names VLLM= (quoted: the path has a space) and every option the
    run had; pasted as printed it keeps the conflict for resolution."""
    repo = make_repo("my vllm", {
        "pkg/loader.py": LOADER,
        "pkg/other.py": "VALUE = 1\n\n\n\n\nOTHER = 1\n",
    })  # fmt: skip
    base = repo.head()
    patch_dir = tmp_path / "my patches"
    _series_on(repo, base, patch_dir, manifest_mod.Base(
        project="toy", version="1.0", upstream_commit=base[:9],
        sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64), commit=base, touched_files={},
    ))  # fmt: skip
    _conflict_base(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "conflict", patch_dir)
    hint = next(line.strip() for line in str(err.value).splitlines() if "make " in line)
    assert f"VLLM='{repo.path}'" in hint and "KEEP=1" in hint and "NOTEST=1" in hint
    assert f"PATCHES='{patch_dir}'" in hint

    env = dict(os.environ, SERIES_WORK_DIR=str(make_work_dir))
    done = subprocess.run(["bash", "-c", hint], cwd=tmp_path, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode != 0 and "left in progress" in done.stderr, done.stderr
    assert repo.git("symbolic-ref", "--short", "HEAD") == "toy/v1-rebase-onto-conflict"
    assert "<<<<<<< " in (repo.path / "pkg/loader.py").read_text()
    abort = subprocess.run(["make", "-C", str(ROOT), "rebase", "ABORT=1"], env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert abort.returncode == 0, abort.stderr
    assert snapshot(repo) == before


# --------------------------------------------------------------------------
# No am session to keep, nothing to continue, nothing left


def test_keep_conflict_without_an_am_session_keeps_nothing_and_says_so(
    series, work_dir, monkeypatch
):
    """git am can fail before it starts a session: KEEP=1 must not claim one."""
    repo, patch_dir = series
    _conflict_base(repo)
    before, patches_before = snapshot(repo), _contents(patch_dir)
    real_am = patchset.am

    def am(checkout, patches, *args, **kwargs):
        if Path(checkout) == repo.path:  # dies before its session, as git can
            raise SeriesError("git am failed: fatal: simulated failure before any session")
        return real_am(checkout, patches, *args, **kwargs)

    monkeypatch.setattr(patchset, "am", am)
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)

    message = str(err.value)
    assert "left in progress" not in message and "CONTINUE=1" not in message
    assert "without leaving a session" in message and "nothing was kept" in message
    assert snapshot(repo) == before
    assert _contents(patch_dir) == patches_before
    _no_session(work_dir)


def test_a_later_conflict_without_an_am_session_keeps_the_earlier_resolutions(
    series, work_dir, monkeypatch
):
    repo, patch_dir = series
    _upstream(repo, "conflict", {"pkg/loader.py": TWO_CONFLICTS})
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="left in progress"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.write({"pkg/loader.py": RESOLVED_1})
    repo.git("add", "pkg/loader.py")
    real_am = patchset.am

    def am(checkout, patches, *args, **kwargs):
        if Path(checkout) == repo.path and patches[0].name.startswith("0003"):
            raise SeriesError("git am failed: fatal: simulated failure before any session")
        return real_am(checkout, patches, *args, **kwargs)

    monkeypatch.setattr(patchset, "am", am)
    with pytest.raises(SeriesError, match="(?s)what you resolved before it is kept.*ABORT=1"):
        rebase_mod.resume(log=lambda *_: None)
    assert "+line_10 = 'X'  # series" in repo.git("log", "-p", "-2")
    # Its change made by hand as one commit is taken as its resolution.
    repo.write({"pkg/loader.py": _edit(RESOLVED_1, 25, "line_25 = 'Y'  # series")})
    repo.git("commit", "-q", "-a", "-m", "[Loader] third change")
    assert rebase_mod.resume(log=lambda *_: None) == 0
    assert len(manifest_mod.load(patch_dir / "series.json").patches) == 3
    assert {k: v for k, v in snapshot(repo).items() if k != "branches"} == {
        k: v for k, v in before.items() if k != "branches"
    }


def test_continue_without_the_am_session_it_left_refuses(series, work_dir):
    """A stopped session whose checkout holds no git am session (none was
    recorded as left there): a clean checkout is no consent to skip the patch."""
    import json

    repo, patch_dir = series
    _conflict_base(repo)
    patches_before = _contents(patch_dir)
    with pytest.raises(SeriesError):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    repo.git("am", "--abort")  # the state a session-less stop leaves: clean, at the base
    state = json.loads(rebase_mod.state_path().read_text())
    state.pop("am_kept", None)  # as a state written before the session was verified
    rebase_mod.state_path().write_text(json.dumps(state))

    for _ in range(2):
        with pytest.raises(SeriesError) as err:
            rebase_mod.resume(log=lambda *_: None)
        message = str(err.value)
        assert "no git am session is in progress" in message
        assert "is not skipped" in message and "rebase ABORT=1" in message
    assert _contents(patch_dir) == patches_before
    assert main(["rebase", "--abort"]) == 0
    assert _contents(patch_dir) == patches_before
    _no_session(work_dir)


def test_rebase_leaving_no_patch_is_refused(series, work_dir):
    """Upstream absorbed every patch: an empty series would delete the series."""
    repo, patch_dir = series
    repo.git("checkout", "-q", "-b", "all-in", "main")
    repo.git("am", "-q", *sorted(str(p) for p in patch_dir.glob("*.patch")))
    repo.git("checkout", "-q", "main")
    before, patches_before = snapshot(repo), _contents(patch_dir)

    with pytest.raises(SeriesError, match="would have no patches.*it would delete the series"):
        _rebase(repo, "all-in", patch_dir)

    assert _contents(patch_dir) == patches_before
    assert snapshot(repo) == before
    _no_session(work_dir)


def test_keep_conflict_works_with_the_identity_only_in_global_config(
    series, work_dir, global_identity
):
    repo, patch_dir = series
    repo.git("config", "--unset", "user.name")
    repo.git("config", "--unset", "user.email")
    _conflict_base(repo)

    with pytest.raises(SeriesError, match="left in progress"):
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    resolved = _edit(_edit(LOADER, 10, "line_10 = 'X'"), 11, "line_11 = 11  # resolved")
    repo.write({"pkg/loader.py": resolved})
    repo.git("add", "pkg/loader.py")
    assert rebase_mod.resume(log=lambda *_: None) == 0

    branch = "toy/v1-rebase-onto-conflict"
    assert user_git(repo.path, "log", "-3", "--format=%cn", branch).split("\n") == [USER[0]] * 3
    assert local_identity(repo.path) == ""


# --------------------------------------------------------------------------
# After a successful rebase the repository is consistent


def _series_doc(patch_dir: Path) -> Path:
    """A SERIES.md beside ``patch_dir`` stating what its manifest records."""
    manifest = manifest_mod.load(patch_dir / "series.json")
    b = manifest.base
    order = [f"| {p.file[:4]} | `{p.subject}` | concern of {p.subject[-12:]} |"
             for p in manifest.patches]  # fmt: skip
    ids = [f"| {p.file[:4]} | `{p.patch_id}` |" for p in manifest.patches]
    doc = patch_dir.parent / "SERIES.md"
    doc.write_text("\n".join([
        "# Toy", "", "## Base", "", "| | |", "|---|---|", f"| project | toy v{b.version} |",
        f"| upstream commit | `{b.upstream_commit}` (abbreviated) |",
        f"| source of the tree | PyPI sdist `{b.sdist.filename}`, sha256 `{b.sdist.sha256}` |",
        f"| materialised base commit | `{b.commit}` (fixed) |", "", "Prose about v1.0 stays.",
        "", "## Order and why", "", "| # | patch | concern |", "|---|---|---|", *order, "",
        "## Stable patch IDs", "", "| patch | stable patch ID |", "|---|---|", *ids, "",
    ]))  # fmt: skip
    assert check_manifest.doc_problems(manifest, doc) == []
    return doc


def test_rebase_rewrites_what_series_md_derives_from_the_manifest(series, work_dir):
    repo, patch_dir = series
    doc = _series_doc(patch_dir)
    new_base = _upstream(repo, "absorbed", {"pkg/other.py": "VALUE = 2\n\n\n\n\nOTHER = 2\n"})

    rc, output = _rebase(repo, "absorbed", patch_dir)

    assert rc == 0 and "on success this replaces the patches and manifest" in output
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert check_manifest.doc_problems(manifest, doc) == []
    text = doc.read_text()
    assert "| 0002 | `[Loader] third change` | concern of third change |" in text
    assert f"materialised base commit | `{new_base}` (fixed)" in text
    assert "Prose about v1.0 stays." in text
    assert main(["check-manifest", "--manifest", str(patch_dir / "series.json")]) == 0


def test_sdist_rebase_keeps_the_branch_where_make_apply_finds_it(sdist_series, work_dir):
    """Without VLLM=, the rebased branch stays in the default checkout under the
    name `apply` gives it: made from the new base when there is none, else
    added beside the old checkout, whose switch command is printed."""
    from seriestool import apply as apply_mod

    patch_dir, pip_args, _index = sdist_series
    lines: list[str] = []
    assert rebase_mod.start("2.0", None, skip_tests=True, patch_dir=patch_dir, pip_args=pip_args,
                            log=lines.append) == 0  # fmt: skip
    manifest = manifest_mod.load(patch_dir / "series.json")
    checkout = Repo(work_dir / "vllm")
    assert checkout.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name
    assert f"branch {manifest.branch_name} in {checkout.path}" in "\n".join(lines)
    lines.clear()
    assert apply_mod.apply_series(checkout.path, manifest, patch_dir, log=lines.append) == 0
    assert "series already applied" in "\n".join(lines)

    # Back to 3.0 from 2.0's checkout, resolved by hand: the old checkout keeps
    # its HEAD and gets the branch, and the printed command switches to it.
    with pytest.raises(SeriesError):
        rebase_mod.start("3.0", None, keep_conflict=True, skip_tests=True,
                         patch_dir=patch_dir, pip_args=pip_args, log=lambda *_: None)  # fmt: skip
    scratch = Repo(work_dir / "rebase" / "3.0" / "vllm")
    scratch.write({"pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'  # series")})
    scratch.git("add", "pkg/loader.py")
    head = checkout.head()
    lines.clear()
    assert rebase_mod.resume(log=lines.append) == 0
    assert checkout.head() == head
    manifest = manifest_mod.load(patch_dir / "series.json")
    output = "\n".join(lines).splitlines()
    switch = next(ln.strip() for ln in output if ln.strip().startswith("git -C"))
    # make apply on the old checkout names the same one command, not a rebase.
    with pytest.raises(SeriesError) as err:
        apply_mod.apply_series(checkout.path, manifest, patch_dir, log=lambda *_: None)
    assert switch in str(err.value) and " rebase TO=" not in str(err.value)
    subprocess.run(switch, shell=True, check=True)
    lines.clear()
    assert apply_mod.apply_series(checkout.path, manifest, patch_dir, log=lines.append) == 0
    assert "series already applied" in "\n".join(lines)
    # status and remove know the kept branch as one apply made, on the new base
    from seriestool import status as status_mod

    lines.clear()
    status_mod.status(checkout.path, patch_dir, log=lines.append)
    recorded = "(recorded by apply); commits on toy/v1-on-toyvllm-3.0 that are no series patch: 0"
    assert recorded in "\n".join(lines)
    status_mod.remove(checkout.path, log=lambda *_: None, patch_dir=patch_dir)
    assert checkout.head() == manifest.base.commit


def _one_off_series(make_repo, tmp_path, files: dict[str, str], patches) -> tuple[Repo, Path]:
    """Upstream on ``main`` with ``files``, and a series of ``patches``
    (``(message, files)`` each) exported beside it."""
    repo = make_repo("upstream", files)
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    for message, changed in patches:
        repo.commit(message, changed)
    patch_dir = tmp_path / "patches"
    export_work_branch(repo, base, patch_dir, sdist=("", ""))
    return repo, patch_dir


def test_a_later_patch_using_what_a_skipped_patch_added_is_reported(make_repo, tmp_path, work_dir):
    repo, patch_dir = _one_off_series(make_repo, tmp_path, {"pkg/a.py": LOADER}, [
        ("[Loader] add a marker", {"pkg/a.py": LOADER + "MARKER_ATTR = '_marked'\n"}),
        ("[Loader] other work", {"pkg/b.py": "VALUE = 1\n"}),
        ("[Loader] use the marker", {"pkg/b.py": "from pkg.a import MARKER_ATTR\nVALUE = 1\n"}),
    ])  # fmt: skip
    _upstream(repo, "moved", {"pkg/a.py": LOADER + "OTHER = 1\n"})
    with pytest.raises(SeriesError):
        _rebase(repo, "moved", patch_dir, keep_conflict=True)
    repo.git("am", "--skip")
    lines: list[str] = []
    assert rebase_mod.resume(log=lines.append) == 0  # tests skipped, as with NOTEST=1
    output = "\n".join(lines)
    assert "patch 0002 uses MARKER_ATTR from dropped patch 0001" in output
    assert "later patches use dropped ones" in output


def test_conflict_report_names_only_files_that_conflict(make_repo, tmp_path, work_dir):
    """A file whose hunk git apply rejects but the 3-way merge merges cleanly
    is not listed as needing resolution."""
    repo, patch_dir = _one_off_series(make_repo, tmp_path, {"a.py": LOADER, "b.py": LOADER}, [
        ("[Loader] both", {"a.py": _edit(LOADER, 10, "line_10 = 'a'"),
                           "b.py": _edit(LOADER, 10, "line_10 = 'b'")}),
    ])  # fmt: skip
    _upstream(repo, "drift", {"a.py": _edit(LOADER, 8, "line_08 = 'moved'"),
                              "b.py": _edit(LOADER, 10, "line_10 = 'X'")})  # fmt: skip
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "drift", patch_dir)
    message = str(err.value)
    assert "conflict: b.py" in message and "patch failed: b.py" in message
    assert "a.py" not in message.replace("0001", "")


def test_commit_without_sdist_is_refused_for_the_project_patches(series, work_dir, monkeypatch):
    repo, patch_dir = series
    _conflict_base(repo)
    monkeypatch.setattr(manifest_mod, "PATCH_DIR", patch_dir)
    before, patches_before = snapshot(repo), _contents(patch_dir)
    with pytest.raises(SeriesError, match="(?s)has no PyPI sdist.*nothing was changed.*PATCHES="):
        _rebase(repo, "conflict", patch_dir)
    assert snapshot(repo) == before and _contents(patch_dir) == patches_before
    assert not (work_dir / "rebase").exists()


def test_a_version_is_its_sdist_even_where_vllm_has_a_tag_of_that_name(sdist_series, tmp_path):
    """A local tag ``v2.0`` on another commit is no release: the sdist is the base."""
    patch_dir, pip_args, _index = sdist_series
    checkout = Repo(tmp_path / "series-work")
    checkout.git("tag", "v2.0", checkout.commit("not the release", {"pkg/other.py": "X = 1\n"}))
    before = snapshot(checkout)
    assert rebase_mod.start("2.0", checkout.path, skip_tests=True, patch_dir=patch_dir,
                            pip_args=pip_args, log=lambda *_: None) == 0  # fmt: skip
    base = manifest_mod.load(patch_dir / "series.json").base
    assert (base.upstream_commit, base.sdist.filename) == ("222222222", "toyvllm-2.0.tar.gz")
    assert base.commit == rebase_mod.g.rev(base_mod.base_repo_path("toyvllm", "2.0"), "base")
    assert snapshot(checkout) == before


def test_version_keep_conflict_in_vllm_brings_the_sdist_base_into_it(
    sdist_series, tmp_path, work_dir, monkeypatch
):
    patch_dir, pip_args, _index = sdist_series
    monkeypatch.setattr(manifest_mod, "PATCH_DIR", patch_dir)  # the project's own series
    checkout = Repo(tmp_path / "series-work")
    checkout.git("tag", "v3.0", "HEAD")
    with pytest.raises(SeriesError, match="left in progress in .*series-work"):
        rebase_mod.start("v3.0", checkout.path, keep_conflict=True, skip_tests=True,
                         patch_dir=patch_dir, pip_args=pip_args, log=lambda *_: None)  # fmt: skip
    checkout.write({"pkg/loader.py": _edit(LOADER, 10, "line_10 = 'X'  # series")})
    checkout.git("add", "pkg/loader.py")
    assert rebase_mod.resume(log=lambda *_: None) == 0
    manifest = manifest_mod.load(patch_dir / "series.json")
    assert manifest.base.sdist.filename == "toyvllm-3.0.tar.gz"
    assert manifest.base.upstream_commit == "333333333"
    assert check_manifest.problems(manifest, patch_dir) == []


def test_check_manifest_compares_the_upstream_commit_with_the_cached_sdist(
    sdist_series, monkeypatch, capsys
):
    patch_dir, _pip_args, _index = sdist_series
    manifest = manifest_mod.load(patch_dir / "series.json")
    manifest.base.upstream_commit = "999999999"
    manifest.save(patch_dir / "series.json")
    assert main(["check-manifest", "--patches-dir", str(patch_dir),
                 "--manifest", str(patch_dir / "series.json")]) == 1  # fmt: skip
    assert "toyvllm-1.0.tar.gz records '111111111'" in capsys.readouterr().out
    manifest.base.upstream_commit = "111111111"
    manifest.base.sdist = manifest_mod.Sdist("", "")
    monkeypatch.setattr(manifest_mod, "PATCH_DIR", patch_dir)
    assert any("pins no sdist" in p for p in check_manifest.problems(manifest, patch_dir))


def test_keep_conflict_with_the_branch_already_there_takes_a_free_name(series, work_dir):
    repo, patch_dir = series
    _conflict_base(repo)
    repo.git("branch", "toy/v1-rebase-onto-conflict", "main")
    with pytest.raises(SeriesError) as err:
        _rebase(repo, "conflict", patch_dir, keep_conflict=True)
    assert "branch -D" not in str(err.value)
    assert repo.git("symbolic-ref", "--short", "HEAD") == "toy/v1-rebase-onto-conflict-2"
    assert rebase_mod.abort(log=lambda *_: None) == 0
    assert repo.git("rev-parse", "toy/v1-rebase-onto-conflict") == repo.git("rev-parse", "main")


def test_vllm_inside_a_bigger_repository_is_refused(make_repo, series, work_dir):
    _repo, patch_dir = series
    mono = make_repo("mono", {"vendor/vllm/pkg/loader.py": LOADER, "app.py": "APP = 1\n"})
    vendored = mono.path / "vendor" / "vllm"
    with pytest.raises(SeriesError, match=f"inside the git repository {mono.path}"):
        rebase_mod.start("1.0", vendored, patch_dir=patch_dir, log=lambda *_: None)
    # apply's refusal would otherwise print `git -C <mono> checkout <base>`: the whole monorepo.
    from seriestool import apply as apply_mod

    before = snapshot(mono)
    manifest = manifest_mod.load(patch_dir / "series.json")
    with pytest.raises(SeriesError, match=f"inside the git repository {mono.path}") as err:
        apply_mod.apply_series(vendored, manifest, patch_dir, log=lambda *_: None)
    assert "git -C" not in str(err.value)
    assert snapshot(mono) == before
    assert main(["export", "--vllm", str(vendored), "--patches-dir", str(patch_dir)]) == 1


def test_kept_branch_never_lands_in_an_enclosing_repository(sdist_series, work_dir):
    """A plain folder where the default checkout belongs (inside a repository,
    as work/ is inside this project) is no checkout: nothing is written there."""
    patch_dir, pip_args, _index = sdist_series
    outer = Repo(work_dir)
    outer.git("init", "-q")
    (work_dir / "vllm").mkdir()
    lines: list[str] = []
    assert rebase_mod.start("2.0", None, skip_tests=True, patch_dir=patch_dir, pip_args=pip_args,
                            log=lines.append) == 0  # fmt: skip
    assert "could not be kept" in "\n".join(lines)
    assert outer.git("for-each-ref") == ""
    assert not (work_dir / ".git" / "objects" / "info" / "alternates").exists()


def test_a_second_rebase_while_the_first_runs_its_tests_says_it_is_running(work_dir):
    """Past its patches (phase "applied") the first rebase's process still runs
    the tests: a second one is told to wait, and nothing of the first changes."""
    with subprocess.Popen(["sleep", "60"]) as first:
        try:
            sess = rebase_mod.Session(
                to="0.32.0", slug="0.32.0", kind="version", keep=True, skip_tests=False,
                phase="applied", pid=first.pid, work=str(work_dir / "rebase" / "0.32.0"),
                scratch="", checkout="", branch="b", patch_dir="", command="",
                user_checkout="", vllm="", pip_args=[], patches=[],
            )  # fmt: skip
            rebase_mod.state_path().parent.mkdir(parents=True)
            sess.save()
            before = rebase_mod.state_path().read_bytes()
            with pytest.raises(SeriesError) as e:
                rebase_mod._clear_stale_session(lambda *_: None)
            assert f"a rebase to 0.32.0 is running (pid {first.pid}); wait for it" in str(e.value)
            assert "a later step failed" not in str(e.value)
            assert rebase_mod.state_path().read_bytes() == before
        finally:
            first.kill()
