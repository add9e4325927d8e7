"""Pull-request groups: ``check-manifest`` refuses inconsistent groups, export
keeps them, ``test-series`` tests each upstream group on its own, and
``make pr`` exports one group as a branch of the user's checkout, with its
description, changing nothing else."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import snapshot
from seriestool import base as base_mod
from seriestool import check_manifest, pr, seriestest
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod
from seriestool.errors import SeriesError

FIRST, SECOND, OTHER = "[Loader] first change", "[Loader] second change", "[Other] fork change"


def _message(subject: str, test: str) -> str:
    return (
        f"{subject}\n\nIntro of {subject}.\n\nWhat changes\n- the change of {subject}\n\n"
        f"Why\n- the reason of {subject}\n\nValidation (CPU)\n- pytest {test}: 1 passed\n\n"
        "Signed-off-by: Team <team@example.com>"
    )


@pytest.fixture
def grouped(make_repo, tmp_path, monkeypatch):
    """A three-patch series in groups: ``first``; ``second`` (its patch
    changes the first's lines) depending on ``first``; ``other``, fork-only.
    Returns (repo at the base, with branch ``work`` holding the series;
    manifest; patch folder)."""
    repo = make_repo("upstream", {
        "pkg/loader.py": "def load(x):\n    return x\n",
        "pkg/other.py": "VALUE = 1\n",
    })  # fmt: skip
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    for subject, files in [
        (FIRST, {"pkg/loader.py": "def load(x):\n    # first\n    return x\n"}),
        (SECOND, {"pkg/loader.py": "def load(x):\n    # first\n    return x + 0\n"}),
        (OTHER, {"pkg/other.py": "VALUE = 2\n"}),
    ]:
        test = f"tests/test_{subject.split()[1]}.py"
        repo.commit(_message(subject, test), {**files, test: "def test_it():\n    pass\n"})
    repo.git("checkout", "-q", "main")
    patch_dir = tmp_path / "patches"
    manifest = manifest_mod.Manifest(
        name="toy", version="1",
        base=manifest_mod.Base("toy", "1.0", base[:9], manifest_mod.Sdist("t.gz", ""), base, {}),
        patches=[], regression_tests=manifest_mod.RegressionTests(),
        groups=[
            manifest_mod.Group("first", [FIRST], [], True, "stands alone"),
            manifest_mod.Group("second", [SECOND], ["first"], True, "changes first's lines"),
            manifest_mod.Group("other", [OTHER], [], False, "fork-only by nature"),
        ],
    )  # fmt: skip
    export_mod.export_series(repo.path, manifest, "work", base, patch_dir=patch_dir,
                             manifest_path=patch_dir / "series.json", log=print)  # fmt: skip
    monkeypatch.setattr(base_mod, "WORK_DIR", tmp_path / "work")
    return repo, manifest, patch_dir


def _user_state(repo):
    """Work of the user's the tool must leave alone: a staged change, an
    untracked file, a stash."""
    repo.write({"pkg/other.py": "VALUE = 3\n"})
    repo.git("stash", "-q")
    repo.write({"notes.txt": "mine\n", "pkg/loader.py": "def load(x):\n    return -x\n"})
    repo.git("add", "pkg/loader.py")


def test_pr_branch_holds_exactly_the_group_and_its_dependencies(grouped):
    repo, manifest, patch_dir = grouped
    _user_state(repo)
    before = snapshot(repo)
    pr.make_pr(repo.path, manifest, "second", patch_dir, log=lambda *_: None)
    after = snapshot(repo)
    new = set(after.pop("branches").splitlines()) - set(before.pop("branches").splitlines())
    assert after == before
    assert [line.split()[0] for line in new] == ["refs/heads/pr/second"]
    base = manifest.base.commit
    log = repo.git("log", "--reverse", "--format=%s", f"{base}..pr/second").splitlines()
    assert log == [FIRST, SECOND]
    assert repo.git("rev-parse", "pr/second~2") == base
    assert repo.git("show", "pr/second:pkg/other.py") == "VALUE = 1"
    pr.make_pr(repo.path, manifest, "first", patch_dir, log=lambda *_: None)
    assert repo.git("log", "--format=%s", f"{base}..pr/first").splitlines() == [FIRST]


def test_description_renders_the_template_from_the_messages(grouped):
    repo, manifest, patch_dir = grouped
    path = pr.make_pr(repo.path, manifest, "second", patch_dir, log=lambda *_: None)
    assert path == base_mod.WORK_DIR / "pr" / "second.md"
    text = path.read_text()
    purpose, rest = text.split("## Test Plan\n")
    plan, result = rest.split("## Test Result\n")
    assert purpose.startswith("## Purpose\n")
    assert "Depends on the pull requests of first, whose commits come first" in purpose
    assert f"- {FIRST}\n" in purpose and f"### {FIRST}" not in text
    assert f"### {SECOND}\n\nIntro of {SECOND}.\n" in purpose
    assert "**What changes**\n- the change of" in purpose and "**Why**" in purpose
    assert "Validation" not in purpose and "Signed-off-by" not in text
    assert "pytest -q -rs tests/test_second.py\n" in plan and "test_first" not in plan
    assert (
        f"### {SECOND}\n\n**Validation (CPU)**\n- pytest tests/test_second.py: 1 passed" in result
    )


def test_signoff_makes_the_user_author_and_signer_without_writing_config(grouped):
    repo, manifest, patch_dir = grouped
    config = snapshot(repo)["raw"]
    pr.make_pr(repo.path, manifest, "second", patch_dir, signoff=True, log=lambda *_: None)
    for rev in ("pr/second", "pr/second~1"):
        assert repo.git("log", "-1", "--format=%an <%ae>", rev) == "Test User <user@example.com>"
        trailers = repo.git("log", "-1", "--format=%(trailers:key=Signed-off-by,valueonly)", rev)
        assert trailers.splitlines() == ["Team <team@example.com>", "Test User <user@example.com>"]
    assert snapshot(repo)["raw"] == config


@pytest.mark.parametrize(
    "group, expected",
    [
        ("nothing", "'nothing' is no group"),
        ("other", "'other' is fork-only"),
        ("first", "branch pr/first already exists"),
    ],
)
def test_a_refusal_changes_nothing_in_the_checkout(grouped, group, expected):
    repo, manifest, patch_dir = grouped
    repo.git("branch", "pr/first", "main")
    _user_state(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as e:
        pr.make_pr(repo.path, manifest, group, patch_dir, log=lambda *_: None)
    assert expected in str(e.value)
    if group != "first":
        assert "  other (fork-only): fork-only by nature" in str(e.value)
    assert snapshot(repo) == before
    assert not (base_mod.WORK_DIR / "pr").exists()


def _groups(manifest, **changes):
    """The manifest with its groups changed: name -> (patches, depends)."""
    groups = [
        dataclasses.replace(g, **dict(zip(("patches", "depends"), changes[g.name], strict=True)))
        if g.name in changes else g
        for g in manifest.groups
    ]  # fmt: skip
    return dataclasses.replace(manifest, groups=groups)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"first": (["[Loader] frist change"], [])},
         "group 'first' names '[Loader] frist change', no patch's subject; did you mean"),
        ({"first": ([], [])}, "0001-Loader-first-change.patch is in no group"),
        ({"other": ([OTHER, FIRST], [])}, f"'{FIRST}' is in two groups, 'first' and 'other'"),
        ({"second": ([SECOND], ["fist"])}, "no group 'fist' (a dependency of 'second')"),
        ({"first": ([FIRST], ["second"])}, "in a cycle: first -> second -> first"),
        ({"first": ([FIRST], ["other"])},
         "group 'first': 0001-Loader-first-change.patch comes before 0003-Other-fork-change.patch"),
    ],
)  # fmt: skip
def test_check_manifest_refuses_inconsistent_groups(grouped, capsys, changes, expected):
    _repo, manifest, patch_dir = grouped
    assert manifest_mod.group_problems(manifest) == []
    broken = _groups(manifest, **changes)
    assert any(expected in line for line in manifest_mod.group_problems(broken))
    broken.save(patch_dir / "series.json")
    args = type("Args", (), {"manifest": str(patch_dir / "series.json"), "patches_dir": None})
    assert check_manifest.run(args) == 1
    assert expected in capsys.readouterr().out


def test_export_keeps_the_groups_and_drops_a_departed_patch_with_a_note(grouped):
    repo, manifest, patch_dir = grouped
    path = patch_dir / "series.json"
    assert manifest_mod.load(path).groups == manifest.groups
    repo.git("branch", "two", "work~1")
    notes = []
    export_mod.export_series(repo.path, manifest_mod.load(path), "two", manifest.base.commit,
                             patch_dir=patch_dir, manifest_path=path, log=notes.append)  # fmt: skip
    saved = manifest_mod.load(path)
    assert [(g.name, g.patches) for g in saved.groups] == [
        ("first", [FIRST]), ("second", [SECOND]), ("other", []),
    ]  # fmt: skip
    assert f"note: dropped '{OTHER}' from the manifest's group 'other': no patch" in notes[0]


def test_group_plan_tests_each_upstream_set_once(grouped):
    _repo, manifest, _ = grouped
    # first and second are prefixes; other is fork-only.
    assert seriestest.group_plan(manifest) == [
        ("first", None, "same patches as prefix 0001..0001, tested: skipped"),
        ("second", None, "same patches as prefix 0001..0002, tested: skipped"),
        ("other", None, "fork-only: not tested on its own"),
    ]
    manifest.groups[2].upstream = True
    manifest.groups.append(manifest_mod.Group("again", [], ["other"]))
    assert seriestest.group_plan(manifest)[2:] == [
        ("other", [2], "patches 0003, pytest"),
        ("again", None, "same patches as group other, tested: skipped"),
    ]


@pytest.fixture
def grouped_base(grouped, monkeypatch, tmp_path):
    repo, manifest, patch_dir = grouped
    bare = tmp_path / "base.git"
    repo.git("clone", "-q", "--bare", str(repo.path), str(bare))
    repo.git("--git-dir", str(bare), "branch", "base", "main")
    monkeypatch.setattr(base_mod, "materialise", lambda *a, **k: (bare, manifest.base.commit, ""))
    return manifest, patch_dir


def test_test_series_applies_each_group_alone_and_fails_one_that_does_not_stand(
    grouped_base, capsys
):
    manifest, patch_dir = grouped_base
    manifest.groups[2].upstream = True
    assert seriestest.check_prefixes(manifest, patch_dir) == 0
    out = capsys.readouterr().out
    assert "=== group other: patches 0003, pytest tests/test_fork.py\n" in out
    assert "=== group second: same patches as prefix 0001..0002, tested: skipped\n" in out
    # second without its dependency: its patch does not apply on the base alone.
    manifest.groups[1].depends = []
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "failed step: group second: does not apply" in capsys.readouterr().out
