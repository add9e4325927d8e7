"""Pull-request groups: ``check-manifest`` refuses inconsistent groups, export
keeps them, ``test-series`` tests each upstream group on its own, and
``make pr`` exports one group as a branch of the user's checkout, with its
description, changing nothing else."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT, snapshot
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


def test_without_signoff_the_branch_is_not_called_ready_for_the_dco(grouped):
    repo, manifest, patch_dir = grouped
    lines = []
    pr.make_pr(repo.path, manifest, "second", patch_dir, log=lines.append)
    assert "ready to push" not in lines[0]
    assert "NOT ready for vLLM's DCO check: 2 of its commits carry no Signed-off-by" in lines[0]
    assert lines[0].endswith(f"git -C {repo.path} branch -m pr/second pr/second-unsigned && make"
                             f" -C {ROOT} pr GROUP=second VLLM={repo.path} SIGNOFF=1")  # fmt: skip


def test_signoff_makes_the_user_author_and_signer_without_writing_config(grouped):
    repo, manifest, patch_dir = grouped
    config = snapshot(repo)["raw"]
    lines = []
    pr.make_pr(repo.path, manifest, "second", patch_dir, signoff=True, log=lines.append)
    assert lines[0].endswith(", ready to push")
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
        ({"first": ([], [])}, "0001-Loader-first-change.patch is in no group: add its subject,"
         " '[Loader] first change', to the \"patches\" of one group in \"series\".\"groups\""),
        ({"first": ([], [])}, "group 'first' has no patches: remove it"),
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


def _export(repo, manifest, branch, patch_dir):
    notes = []
    path = patch_dir / "series.json"
    export_mod.export_series(repo.path, manifest_mod.load(path), branch, manifest.base.commit,
                             patch_dir=patch_dir, manifest_path=path, log=notes.append)  # fmt: skip
    return manifest_mod.load(path), notes


def test_export_drops_a_departed_patch_and_the_group_it_leaves_empty(grouped, capsys):
    repo, manifest, patch_dir = grouped
    assert manifest_mod.load(patch_dir / "series.json").groups == manifest.groups
    repo.git("branch", "two", "work~1")
    saved, notes = _export(repo, manifest, "two", patch_dir)
    assert [(g.name, g.patches) for g in saved.groups] == [("first", [FIRST]), ("second", [SECOND])]
    assert f"note: dropped '{OTHER}' from the manifest's group 'other': no patch" in notes[0]
    assert "note: dropped the manifest's group 'other': it has no patch left" in notes[1]
    args = type("Args", (), {"manifest": str(patch_dir / "series.json"), "patches_dir": None})
    assert check_manifest.run(args) == 0, capsys.readouterr().out


def test_a_group_left_empty_hands_its_dependencies_to_the_groups_that_needed_it(grouped):
    _repo, manifest, _patch_dir = grouped
    manifest.groups.append(manifest_mod.Group("third", [OTHER], ["second"], False, "x"))
    manifest.groups[2].patches = []  # "other" gives its patch away
    manifest.patches = [p for p in manifest.patches if p.subject != FIRST]  # absorbed upstream
    notes = manifest.prune_departed()
    assert [(g.name, g.patches, g.depends) for g in manifest.groups] == [
        ("second", [SECOND], []), ("third", [OTHER], ["second"]),
    ]  # fmt: skip
    assert "dropped the manifest's group 'first': it has no patch left; second now" in notes[1]
    assert manifest_mod.group_problems(manifest) == []


def test_rewording_a_subject_keeps_the_patch_in_its_group(grouped, capsys):
    repo, manifest, patch_dir = grouped
    reworded = "[Loader] first change, reworded"
    repo.git("checkout", "-q", "-b", "reworded", "work~2")
    repo.git("commit", "-q", "--amend", "-m", _message(reworded, "tests/test_first.py"))
    repo.git("cherry-pick", "work~1", "work")
    saved, notes = _export(repo, manifest, "reworded", patch_dir)
    assert [(g.name, g.patches) for g in saved.groups][0] == ("first", [reworded])
    assert f"note: renamed '{FIRST}' to '{reworded}'" in notes[0]
    args = type("Args", (), {"manifest": str(patch_dir / "series.json"), "patches_dir": None})
    assert check_manifest.run(args) == 0, capsys.readouterr().out


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
    assert "=== group other: patches 0003, pytest on 1 test file: tests/test_fork.py\n" in out
    assert "=== group second: same patches as prefix 0001..0002, tested: skipped\n" in out
    # second without its dependency: its patch does not apply on the base alone.
    manifest.groups[1].depends = []
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "failed step: group second: does not apply" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["pr", "pr --signoff", "apply"])
def test_where_git_would_refuse_to_commit_the_tool_refuses_first(
    grouped, tmp_path, monkeypatch, command
):
    """No identity (``user.useConfigOnly``, nothing configured): no command
    commits as an invented one; each refuses, saying how to set one, and the
    checkout is unchanged byte for byte."""
    from seriestool import apply as apply_mod

    repo, manifest, patch_dir = grouped
    empty = tmp_path / "empty.gitconfig"
    empty.write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    for key in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_AUTHOR_NAME",
                "GIT_AUTHOR_EMAIL", "EMAIL"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    repo.git("config", "--unset", "user.name")
    repo.git("config", "--unset", "user.email")
    repo.git("config", "user.useConfigOnly", "true")
    _user_state(repo)
    repo.git("stash", "-q")
    before = snapshot(repo)
    with pytest.raises(SeriesError) as e:
        if command == "apply":
            apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
        else:
            pr.make_pr(repo.path, manifest, "second", patch_dir, signoff="--signoff" in command,
                       log=lambda *_: None)  # fmt: skip
    assert "git has no identity of yours to commit with" in str(e.value)
    assert 'git config --global user.name "Your Name"' in str(e.value)
    assert snapshot(repo) == before


def test_an_existing_pr_branch_is_moved_aside_as_printed_never_deleted(grouped):
    import subprocess

    repo, manifest, patch_dir = grouped
    mine = repo.git("rev-parse", "work")
    repo.git("branch", "pr/first", mine)
    with pytest.raises(SeriesError) as e:
        pr.make_pr(repo.path, manifest, "first", patch_dir, log=lambda *_: None)
    first = str(e.value).split("(`", 1)[1].split("`", 1)[0]
    assert "branch -m" in first and "would delete its commits" in str(e.value)
    subprocess.run(first, shell=True, check=True, capture_output=True)
    assert repo.git("rev-parse", "pr/first-old") == mine
    pr.make_pr(repo.path, manifest, "first", patch_dir, log=lambda *_: None)
