"""``apply`` on throw-away repos: success, idempotence, and every refusal
leaving HEAD, branch, index, work tree and stash exactly as they were."""

from __future__ import annotations

import errno
import os

import pytest
from conftest import snapshot
from seriestool import apply as apply_mod
from seriestool import journal, patchset
from seriestool.errors import SeriesError


def _apply(repo, manifest, patch_dir):
    lines: list[str] = []
    rc = apply_mod.apply_series(repo.path, manifest, patch_dir, log=lines.append)
    return rc, "\n".join(lines)


def _user_clutter(repo):
    """Untracked and stashed work of the user's that apply must not touch."""
    repo.write({"pkg/other.py": "VALUE = 2\n"})
    repo.git("stash", "push", "-q", "-m", "user stash")
    repo.write({"notes.txt": "untracked user notes\n"})


def test_apply_creates_branch_with_one_commit_per_patch(toy_series):
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    rc, output = _apply(repo, manifest, patch_dir)
    assert rc == 0
    assert repo.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name
    commits = repo.git("rev-list", "--reverse", f"{base}..HEAD").split()
    assert len(commits) == len(manifest.patches) == 2
    subjects = repo.git("log", "--reverse", "--format=%s", f"{base}..HEAD").splitlines()
    assert subjects == [p.subject for p in manifest.patches]
    # Each commit keeps the patch's author and carries its stable patch ID.
    assert repo.git("log", "-1", "--format=%an <%ae>", commits[0]) == (
        "Test Author <author@example.com>"
    )
    ids = [pid for _, pid in patchset.commit_patch_ids(repo.path, f"{base}..HEAD")]
    assert ids == [p.patch_id for p in manifest.patches]
    for p, commit in zip(manifest.patches, commits, strict=True):
        row = next(line for line in output.splitlines() if line.startswith(p.file))
        assert commit[:12] in row and p.patch_id[:12] in row and row.endswith("applied")


def test_second_apply_changes_nothing_and_exits_zero(toy_series):
    repo, manifest, patch_dir = toy_series
    assert _apply(repo, manifest, patch_dir)[0] == 0
    _user_clutter(repo)
    before = snapshot(repo)
    rc, output = _apply(repo, manifest, patch_dir)
    assert rc == 0
    assert "already applied" in output
    assert snapshot(repo) == before


def test_applied_series_is_detected_by_patch_id_not_branch_name(toy_series):
    repo, manifest, patch_dir = toy_series
    _apply(repo, manifest, patch_dir)
    repo.git("branch", "-q", "-m", manifest.branch_name, "renamed")
    before = snapshot(repo)
    rc, output = _apply(repo, manifest, patch_dir)
    assert rc == 0 and "already applied" in output
    assert snapshot(repo) == before


@pytest.mark.parametrize("change", ["unstaged", "staged"])
def test_dirty_tree_is_refused_unchanged(toy_series, change):
    repo, manifest, patch_dir = toy_series
    _user_clutter(repo)
    repo.write({"pkg/loader.py": "def load(x):\n    return None\n"})
    if change == "staged":
        repo.git("add", "pkg/loader.py")
    before = snapshot(repo)
    with pytest.raises(SeriesError, match=r"(?s)uncommitted changes.*pkg/loader.py"):
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before


def test_wrong_base_is_refused_naming_files_and_rebase(toy_series):
    repo, manifest, patch_dir = toy_series
    repo.commit("local change", {"pkg/loader.py": "def load(x):\n    return 2 * x\n"})
    _user_clutter(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as err:
        _apply(repo, manifest, patch_dir)
    assert "pkg/loader.py" in str(err.value)
    assert f" rebase TO={repo.head()[:12]} VLLM={repo.path}" in str(err.value)
    # The materialised base commit, not only the upstream one, and how to get it.
    assert f"base commit {manifest.base.commit} (`base.commit` in" in str(err.value)
    assert "`make base`" in str(err.value)
    assert f"checkout {manifest.base.commit}" in str(err.value)
    assert "tests/test_first.py" not in str(err.value)  # absent in both: fine
    assert snapshot(repo) == before


def test_am_in_progress_is_refused_unchanged(toy_series):
    repo, manifest, patch_dir = toy_series
    # A user's own am that stopped on a conflict.
    repo.commit("diverge", {"pkg/other.py": "VALUE = 3\n"})
    foreign = repo.path.parent / "foreign.patch"
    foreign.write_text(
        "From: Someone <s@example.com>\nSubject: [PATCH] other\n\n---\n"
        "diff --git a/pkg/other.py b/pkg/other.py\n--- a/pkg/other.py\n"
        "+++ b/pkg/other.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 4\n"
    )
    repo.git("am", str(foreign), check=False)
    assert (repo.path / ".git" / "rebase-apply").exists()
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="git am is in progress"):
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before
    assert (repo.path / ".git" / "rebase-apply").exists()


@pytest.mark.parametrize("detached", [False, True])
def test_failing_patch_restores_checkout_exactly(toy_series, detached):
    repo, manifest, patch_dir = toy_series
    # Patch 2 no longer applies: its context names a line that is not there
    # (recorded in the manifest, as a series exported from another tree is).
    second = patch_dir / manifest.patches[1].file
    second.write_text(second.read_text().replace(" def load(x):", " def load(y):"))
    manifest.patches[1].patch_id = patchset.patch_id_of_file(second)
    manifest.patches[1].sha256 = patchset.sha256_of_file(second)
    if detached:
        repo.git("checkout", "-q", "--detach", "HEAD")
    _user_clutter(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as err:
        _apply(repo, manifest, patch_dir)
    message = str(err.value)
    assert "nothing was changed" in message
    assert "number 2" in message and "pkg/loader.py" in message
    assert snapshot(repo) == before
    assert not (repo.path / ".git" / "rebase-apply").exists()


def test_partially_applied_series_is_refused(toy_series):
    repo, manifest, patch_dir = toy_series
    repo.git("am", "-q", str(patch_dir / manifest.patches[0].file))
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="only part of the series"):
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before


def test_existing_series_branch_is_refused(toy_series):
    repo, manifest, patch_dir = toy_series
    repo.git("branch", manifest.branch_name)
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="already exists"):
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before


def test_tampered_patch_is_refused_before_touching_the_checkout(toy_series):
    repo, manifest, patch_dir = toy_series
    second = patch_dir / manifest.patches[1].file
    second.write_text(second.read_text().replace("+    return x + 0", "+    return x + 1"))
    before = snapshot(repo)
    with pytest.raises(SeriesError, match="disagree with the manifest") as err:
        _apply(repo, manifest, patch_dir)
    assert manifest.patches[1].file in str(err.value)
    assert snapshot(repo) == before
    # The advice is the editing loop: that folder's export from the series branch.
    advice = str(err.value).split("disagree with the manifest", 1)[1]
    assert "series branch" in advice and f"export PATCHES={patch_dir}" in advice


def test_apply_records_where_the_series_starts(toy_series):
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    _apply(repo, manifest, patch_dir)
    key = f"branch.{manifest.branch_name}.{apply_mod.SERIES_BASE_KEY}"
    assert repo.git("config", "--get", key) == base


# --------------------------------------------------------------------------
# Paths the series creates, and what "already applied" means


@pytest.mark.parametrize("how", ["gitignore", "info/exclude", "untracked"])
def test_a_file_at_a_path_the_series_creates_is_refused_naming_it(toy_series, how):
    """An ignored file is user data too: apply must not overwrite it."""
    repo, manifest, patch_dir = toy_series
    if how == "gitignore":
        repo.write({".gitignore": ".gitignore\ntests/test_second.py\n"})
    elif how == "info/exclude":
        (repo.path / ".git" / "info").mkdir(exist_ok=True)
        (repo.path / ".git" / "info" / "exclude").write_text("tests/test_second.py\n")
    repo.write({"tests/test_second.py": "the user's own file\n"})
    _user_clutter(repo)
    before = snapshot(repo)
    with pytest.raises(SeriesError) as err:
        _apply(repo, manifest, patch_dir)
    assert "tests/test_second.py" in str(err.value)
    assert snapshot(repo) == before
    assert (repo.path / "tests/test_second.py").read_text() == "the user's own file\n"


def _objects(repo) -> list[str]:
    """Every file of the object database: loose objects, packs and their indexes."""
    root = repo.path / ".git" / "objects"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("how", ["dirty", "failing patch", "disk full", "file appears"])
def test_a_refused_apply_adds_no_object(toy_series, monkeypatch, how):
    """Refused before or after the series was built: no new object or pack."""
    repo, manifest, patch_dir = toy_series
    if how == "dirty":
        repo.write({"pkg/loader.py": "def load(x):\n    return None\n"})
    elif how == "failing patch":
        second = patch_dir / manifest.patches[1].file
        second.write_text(second.read_text().replace(" def load(x):", " def load(y):"))
        manifest.patches[1].patch_id = patchset.patch_id_of_file(second)
        manifest.patches[1].sha256 = patchset.sha256_of_file(second)
    elif how == "disk full":  # the journal cannot be written, after the build

        def full(*_args, **_kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(journal.shutil, "copy2", full)
    else:  # a file lands where the series creates one after apply looked: read-tree refuses
        monkeypatch.setattr(journal, "occupied", lambda *_args: [])
        repo.write({"tests/test_second.py": "the user's own file\n"})
    before, objects = snapshot(repo), _objects(repo)
    with pytest.raises((SeriesError, OSError)):
        _apply(repo, manifest, patch_dir)
    assert _objects(repo) == objects
    assert snapshot(repo) == before


def test_applied_then_reverted_series_is_applied_again(toy_series):
    """History holds the series' patch IDs, the tree does not: not applied."""
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    _apply(repo, manifest, patch_dir)
    applied_tree = repo.git("rev-parse", "HEAD^{tree}")
    repo.git("branch", "-q", "-m", manifest.branch_name, "tried-it")
    repo.git("revert", "--no-edit", f"{base}..HEAD")
    assert repo.git("rev-parse", "HEAD^{tree}") == repo.git("rev-parse", f"{base}^{{tree}}")

    rc, output = _apply(repo, manifest, patch_dir)

    assert rc == 0 and "already applied" not in output
    assert repo.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name
    assert repo.git("rev-parse", "HEAD^{tree}") == applied_tree


def test_series_result_in_one_squashed_commit_counts_as_applied(toy_series):
    """The tree holds the series' result without its commits: already applied."""
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    repo.git("am", "-q", *[str(p) for p in manifest.patch_paths(patch_dir)])
    repo.git("reset", "-q", "--soft", base)
    repo.git("commit", "-q", "-m", "the loader series, squashed")
    _user_clutter(repo)
    before = snapshot(repo)
    rc, output = _apply(repo, manifest, patch_dir)
    assert rc == 0 and "already applied" in output
    assert snapshot(repo) == before


def test_git_am_dying_mid_patch_leaves_nothing_behind(toy_series, fake_git, monkeypatch):
    """git killed after writing a patch's files: no file of it may remain."""
    repo, manifest, patch_dir = toy_series
    _user_clutter(repo)
    before = snapshot(repo)
    for key, value in fake_git.env(half_am=1).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SeriesError, match="nothing was changed"):
        _apply(repo, manifest, patch_dir)
    assert snapshot(repo) == before


def test_vllm_path_with_a_tilde_is_expanded(toy_series, tmp_path, monkeypatch):
    """`make apply VLLM="~/src/vllm"`: make passes it quoted, no shell expands it."""
    from seriestool.cli import main

    repo, manifest, patch_dir = toy_series
    monkeypatch.setenv("HOME", str(repo.path.parent))
    assert main(["apply", "--vllm", f"~/{repo.path.name}", "--patches-dir", str(patch_dir)]) == 0
    assert repo.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name


@pytest.mark.parametrize("command", ["apply", "export", "restore"])
def test_a_relative_vllm_path_that_does_not_exist_is_named_absolute(
    toy_series, tmp_path, monkeypatch, capsys, command
):
    from seriestool.cli import main

    _repo, _manifest, patch_dir = toy_series
    monkeypatch.chdir(tmp_path)
    extra = ["--patches-dir", str(patch_dir)] if command == "apply" else []
    assert main([command, "--vllm", "src/vllm", *extra]) != 0
    err = capsys.readouterr().err
    assert f"src/vllm (that is {tmp_path / 'src' / 'vllm'}) does not exist" in err, err


def test_a_required_filter_that_is_missing_is_named_with_the_fix(toy_series):
    from conftest import snapshot
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    repo.commit("attributes", {".gitattributes": "pkg/loader.py filter=fake\n"})
    repo.git("config", "filter.fake.required", "true")
    repo.git("config", "filter.fake.smudge", "no-such-filter-program smudge")
    repo.git("config", "filter.fake.clean", "cat")
    before = snapshot(repo)
    with pytest.raises(SeriesError) as e:
        apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    assert "the smudge filter 'fake' that the checkout's .gitattributes name" in str(e.value)
    assert "install the program its filter.fake.smudge runs" in str(e.value)
    assert snapshot(repo) == before


def test_not_at_base_recipes_run_as_printed_each_into_a_fresh_copy(make_repo):
    """The project's series on a checkout that is not at its base: the way to
    the base is one chain (`make base` first), and the rebase recipe copies
    the series into a new folder each time it is pasted."""
    import subprocess

    from seriestool import manifest as manifest_mod

    repo = make_repo("fork", {"README": "a fork\n"})
    manifest = manifest_mod.load()
    with pytest.raises(SeriesError) as err:
        apply_mod.apply_series(repo.path, manifest, manifest_mod.PATCH_DIR, log=lambda *_: None)
    message = str(err.value)
    assert "(after `make base`)" not in message
    assert f"make -C {manifest_mod.ROOT} base && git -C {repo.path} fetch" in message
    recipe = message.rsplit("\n", 1)[1].strip()
    assert f' rebase TO={repo.head()[:12]} VLLM={repo.path} PATCHES="$copy"' in recipe
    copy = recipe.split(" && make ", 1)[0] + ' && echo "$copy"'
    made = [subprocess.run(copy, shell=True, check=True, capture_output=True, text=True)
            .stdout.strip() for _ in range(2)]  # fmt: skip
    assert made[0] != made[1]
    for folder in made:
        assert sorted(os.listdir(folder)) == sorted(os.listdir(manifest_mod.PATCH_DIR))
        subprocess.run(["rm", "-r", folder], check=True)
