"""``export`` is byte-reproducible and refreshes the manifest; ``check-manifest``
catches tampered, missing and unlisted patches."""

from __future__ import annotations

import shutil

import pytest
from seriestool import apply as apply_mod
from seriestool import check_manifest, patchset
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod


def _export(repo, manifest, base, out_dir):
    out_dir.mkdir(exist_ok=True)
    return export_mod.export_series(
        repo.path, manifest, manifest.branch_name, base, patch_dir=out_dir,
        manifest_path=out_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip


def _contents(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_reexport_is_byte_identical_whatever_the_user_config(toy_series, tmp_path):
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    first = _contents(patch_dir)
    # Settings that would change format-patch output if they were not pinned.
    for key, value in [
        ("diff.noprefix", "true"),
        ("format.signature", "my signature"),
        ("format.numbered", "true"),
        ("diff.context", "5"),
        ("core.abbrev", "7"),
    ]:
        repo.git("config", key, value)
    _export(repo, manifest, base, tmp_path / "again")
    assert _contents(tmp_path / "again") == first


def test_export_format_allows_three_way_fallback(toy_series):
    repo, manifest, patch_dir = toy_series
    for entry in manifest.patches:
        text = (patch_dir / entry.file).read_text()
        assert text.startswith("From 0000000000000000000000000000000000000000 ")
        index_lines = [ln for ln in text.splitlines() if ln.startswith("index ")]
        assert index_lines
        for line in index_lines:
            old, new = line.split()[1].split("..")
            assert len(old) == len(new) == 40  # full blob ids
        assert "\n-- \n" not in text  # no signature footer


def test_export_refreshes_manifest(toy_series):
    repo, manifest, patch_dir = toy_series
    saved = manifest_mod.load(patch_dir / "series.json")
    assert [p.file for p in saved.patches] == sorted(p.name for p in patch_dir.glob("*.patch"))
    assert [p.subject for p in saved.patches] == [
        "[Loader] first change",
        "[Loader] second change",
    ]
    for entry in saved.patches:
        expected = repo.git("patch-id", "--verbatim",
                            input=(patch_dir / entry.file).read_text()).split()[0]  # fmt: skip
        assert entry.patch_id == expected
    base = repo.head()
    assert saved.base.touched_files == {
        "pkg/loader.py": repo.git("rev-parse", f"{base}:pkg/loader.py"),
        "tests/test_first.py": None,
        "tests/test_second.py": None,
    }
    assert check_manifest.problems(saved, patch_dir) == []


def test_tampered_patch_fails_check_manifest_naming_it(toy_series):
    _repo, manifest, patch_dir = toy_series
    entry = manifest.patches[1]
    path = patch_dir / entry.file
    path.write_text(path.read_text().replace("+    return x + 0", "+    return x + 1"))
    found = check_manifest.problems(manifest, patch_dir)
    assert len(found) == 1
    assert found[0].startswith(entry.file) and "stable patch ID" in found[0]


def test_indentation_only_tamper_is_caught(toy_series):
    _repo, manifest, patch_dir = toy_series
    entry = manifest.patches[1]
    path = patch_dir / entry.file
    path.write_text(path.read_text().replace("+    return x + 0", "+     return x + 0"))
    found = check_manifest.problems(manifest, patch_dir)
    assert [f.split(":")[0] for f in found] == [entry.file]


def test_missing_and_unlisted_patch_files_fail(toy_series):
    _repo, manifest, patch_dir = toy_series
    (patch_dir / manifest.patches[0].file).rename(patch_dir / "0009-stray.patch")
    found = check_manifest.problems(manifest, patch_dir)
    assert any(f.startswith("0009-stray.patch: patch file is not listed") for f in found)
    assert any(f.startswith(f"{manifest.patches[0].file}: listed") for f in found)


def test_check_manifest_cli_exit_status(toy_series, capsys):
    _repo, manifest, patch_dir = toy_series
    args = ["check-manifest", "--manifest", str(patch_dir / "series.json")]
    from seriestool.cli import main

    assert main(args) == 0
    path = patch_dir / manifest.patches[0].file
    path.write_text(path.read_text().replace("# first", "# tampered"))
    assert main(args) == 1
    assert manifest.patches[0].file in capsys.readouterr().out


def _series_doc(manifest) -> str:
    """A SERIES.md whose order and stable-ID tables are the manifest's."""
    order = "".join(f"| {p.file[:4]} | `{p.subject}` | why |\n" for p in manifest.patches)
    ids = "".join(f"| {p.file[:4]} | `{p.patch_id}` |\n" for p in manifest.patches)
    return (
        "# The series\n\n## Order and why\n\n| # | patch | concern |\n|---|---|---|\n"
        f"{order}\n## Stable patch IDs\n\n| patch | stable patch ID |\n|---|---|\n{ids}\n"
        "## Changes in v2\n\n| 0001 | `not a table of IDs` |\n"
    )


def test_check_manifest_checks_series_md_beside_the_patches(toy_series, capsys):
    _repo, manifest, patch_dir = toy_series
    from seriestool.cli import main

    args = ["check-manifest", "--manifest", str(patch_dir / "series.json")]
    doc = patch_dir.parent / "SERIES.md"
    doc.write_text(_series_doc(manifest))
    assert main(args) == 0
    assert "agree with SERIES.md" in capsys.readouterr().out

    first, second = manifest.patches
    wrong_id = "0" * 40
    doc.write_text(
        _series_doc(manifest)
        .replace(f"`{first.patch_id}`", f"`{wrong_id}`")
        .replace(f"`{second.subject}`", "`[Loader] second change, reworded`")
    )
    assert main(args) == 1
    out = capsys.readouterr().out
    assert (
        f"error: SERIES.md: 'Stable patch IDs' gives {first.file} the stable patch ID"
        f" '{wrong_id}', the manifest '{first.patch_id}'" in out
    )
    assert (
        f"error: SERIES.md: 'Order and why' gives {second.file} the subject"
        f" '[Loader] second change, reworded', the manifest '{second.subject}'" in out
    )

    # A row missing, and one for a patch the series does not have.
    doc.write_text(
        _series_doc(manifest).replace(f"| 0002 | `{second.patch_id}` |", "| 0003 | `x` |")
    )
    assert main(args) == 1
    out = capsys.readouterr().out
    assert f"'Stable patch IDs' has no row for {second.file}" in out
    assert "'Stable patch IDs' lists patch 0003, which the manifest has not" in out


def test_the_repository_series_md_agrees_with_its_manifest():
    from seriestool import manifest as manifest_mod

    manifest = manifest_mod.load(manifest_mod.MANIFEST_PATH)
    doc = manifest_mod.MANIFEST_PATH.parent.parent / "SERIES.md"
    assert check_manifest.doc_problems(manifest, doc) == []
    assert check_manifest.cited_run_problems(manifest, doc.parent) == []


def test_a_cited_gpu_run_of_other_patch_ids_fails(tmp_path):
    import json

    manifest = manifest_mod.load(manifest_mod.MANIFEST_PATH)
    shipped = [{"file": e.file, "patch_id": e.patch_id} for e in manifest.patches]
    runs = {"shipped/a": shipped, "old": [*shipped[:-1], {**shipped[-1], "patch_id": "0" * 40}],
            "smoke": []}  # fmt: skip
    for folder, patches in runs.items():
        (tmp_path / "qualification" / folder).mkdir(parents=True)
        run = {"bundle": {"patches": patches}}
        (tmp_path / "qualification" / folder / "qualification.json").write_text(json.dumps(run))
    (tmp_path / "README.md").write_text("[run](qualification/shipped/), `smoke/`\n")
    (tmp_path / "SERIES.md").write_text("figures: `old/run.log`\n")
    found = check_manifest.cited_run_problems(manifest, tmp_path)
    last = manifest.patches[-1].file[:4]
    assert found == [
        f"SERIES.md cites qualification/old/, a GPU run of other patch IDs than"
        f" patches/series.json (differ: {last}): cite a run of the shipped patches"
    ]


def test_the_series_the_loader_names_is_the_manifests(tmp_path):
    """The constant the patched loader logs (INSTANTTENSOR_LOADER_SERIES) is the
    manifest's name and version; another version is an error naming both."""
    shutil.copytree(manifest_mod.PATCH_DIR, tmp_path / "patches")
    manifest = manifest_mod.load(tmp_path / "patches" / "series.json")
    assert check_manifest.problems(manifest, tmp_path / "patches") == []
    manifest.version = "0.9"
    (problem,) = check_manifest.problems(manifest, tmp_path / "patches")
    assert f'the manifest says INSTANTTENSOR_LOADER_SERIES = "{manifest.name} v0.9"' in problem


def test_export_refuses_merge_commits(toy_series):
    repo, manifest, patch_dir = toy_series
    base = repo.head()
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    repo.git("checkout", "-q", "-b", "side", base)
    repo.commit("side", {"side.txt": "x\n"})
    repo.git("checkout", "-q", manifest.branch_name)
    repo.git("merge", "-q", "--no-edit", "side")
    from seriestool.errors import SeriesError

    with pytest.raises(SeriesError, match="merge commits"):
        _export(repo, manifest, base, patch_dir)


def test_files_touched_follows_git_for_renames(make_repo):
    repo = make_repo("r", {"a.py": "x = 1\n" * 20})
    repo.git("mv", "a.py", "b.py")
    repo.commit("rename")
    text = repo.git("format-patch", "-M", "--stdout", "HEAD~1..HEAD")
    patch = repo.path.parent / "rename.patch"
    patch.write_text(text + "\n")
    assert patchset.files_touched(repo.path, patch) == ["a.py", "b.py"]


def test_check_manifest_from_a_patch_folder_inside_a_repository(toy_series, make_repo):
    # git apply ignores paths outside the current directory when run in a
    # subdirectory of a repository: the product's patches/ is exactly that.
    _repo, manifest, patch_dir = toy_series
    project = make_repo("project")
    inside = project.path / "patches"
    inside.mkdir()
    for f in patch_dir.iterdir():
        (inside / f.name).write_bytes(f.read_bytes())
    assert check_manifest.problems(manifest, inside) == []


def test_export_starts_where_apply_started_not_below(toy_series, tmp_path):
    # A checkout with a local commit below the series: the series starts at
    # the commit apply recorded, so the local commit is not exported.
    repo, manifest, patch_dir = toy_series
    repo.commit("local unrelated change", {"notes/local.txt": "mine\n"})
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    out = tmp_path / "again"
    out.mkdir()
    files = export_mod.export_series(
        repo.path, manifest, manifest.branch_name, None, patch_dir=out,
        manifest_path=out / "series.json", log=lambda *_: None,
    )  # fmt: skip
    assert [f.name for f in files] == [p.file for p in manifest.patches]


def test_export_refuses_an_empty_range(toy_series):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    before = _contents(patch_dir)
    with pytest.raises(SeriesError, match="would delete the series"):
        _export_branch(repo, manifest, "main", patch_dir)
    assert _contents(patch_dir) == before


def test_export_refuses_to_overwrite_uncommitted_patch_edits(toy_series, make_repo):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    project = make_repo("project")
    inside = project.path / "patches"
    inside.mkdir()
    for f in patch_dir.iterdir():
        (inside / f.name).write_bytes(f.read_bytes())
    project.commit("series")
    edited = inside / manifest.patches[0].file
    edited.write_text(edited.read_text() + "\n")
    before = _contents(inside)
    with pytest.raises(SeriesError, match="uncommitted changes"):
        _export_branch(repo, manifest, manifest.branch_name, inside)
    assert _contents(inside) == before


def test_export_refuses_a_message_git_am_would_cut(toy_series):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    # A Markdown-style heading: `git am` ends the message at the `---` line.
    repo.commit("[Loader] third change\n\nWhat\n\nWhy\n---\nBecause.", {"pkg/other.py": "V = 2\n"})
    before = _contents(patch_dir)
    with pytest.raises(SeriesError, match="would be cut by git am at the line '---'"):
        _export_branch(repo, manifest, manifest.branch_name, patch_dir)
    assert _contents(patch_dir) == before


@pytest.mark.parametrize(
    "subject, becomes",
    [
        ("Re: [PATCH v3] [Loader] third change", "[Loader] third change"),
        ("[PATCH] [Loader] third change", "[Loader] third change"),
        ("[Loader] third change  ", "[Loader] third change"),
        ("  [Loader] third change", "[Loader] third change"),
    ],
)
def test_export_refuses_a_subject_git_am_would_rewrite(toy_series, subject, becomes):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    repo.write({"pkg/other.py": "V = 2\n"})
    repo.git("add", "-A")
    repo.git("commit", "-q", "--cleanup=verbatim", "-m", f"{subject}\n\nBody.\n")
    commit = repo.head()
    before = _contents(patch_dir)
    with pytest.raises(SeriesError) as err:
        _export_branch(repo, manifest, manifest.branch_name, patch_dir)
    message = str(err.value)
    assert f"the subject of commit {commit[:12]} (0003-" in message
    assert f"{subject!r} becomes {becomes!r}" in message and "reword the commit" in message
    assert _contents(patch_dir) == before


def test_export_says_git_am_cuts_a_message_at_a_diff_line(toy_series):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    message = "[Loader] third change\n\nAs in\ndiff --git a/x b/x\nand more."
    commit = repo.commit(message, {"pkg/other.py": "V = 2\n"})
    with pytest.raises(SeriesError) as err:
        _export_branch(repo, manifest, manifest.branch_name, patch_dir)
    text = str(err.value)
    assert f"commit {commit[:12]}" in text
    assert "cut by git am at the line 'diff --git a/x b/x'" in text
    assert "as the start of the patch and ends the message there" in text
    assert "`---`" not in text


def test_export_refuses_an_empty_commit_naming_it(toy_series):
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    repo.git("commit", "-q", "--allow-empty", "-m", "[Loader] nothing yet")
    commit = repo.head()
    before = _contents(patch_dir)
    with pytest.raises(SeriesError, match=f"commit {commit[:12]} \\(0003-.*\\) is empty"):
        _export_branch(repo, manifest, manifest.branch_name, patch_dir)
    assert _contents(patch_dir) == before


def _export_branch(repo, manifest, branch, out_dir):
    return export_mod.export_series(
        repo.path, manifest, branch, None, patch_dir=out_dir,
        manifest_path=out_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "edit",
    [
        (
            "author",
            "From: Test Author <author@example.com>",
            "From: Someone Else <else@example.com>",
        ),
        ("message", "Body of the first patch.", "Body of the first patch, reworded."),
        ("hunk line numbers", "@@ -1,2 +1,3 @@", "@@ -1,2 +2,3 @@"),
    ],
    ids=lambda e: e[0],
)
def test_changed_bytes_that_keep_the_patch_id_fail_check_manifest_and_apply(toy_series, edit):
    """The stable patch ID ignores authors, messages and line numbers; the
    manifest's sha256 of each patch file does not."""
    from conftest import snapshot
    from seriestool.errors import SeriesError

    repo, manifest, patch_dir = toy_series
    _what, old, new = edit
    entry = manifest.patches[0]
    path = patch_dir / entry.file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    assert patchset.patch_id_of_file(path) == entry.patch_id  # the gap
    found = check_manifest.problems(manifest, patch_dir)
    assert [f.split(":")[0] for f in found] == [entry.file]
    assert "sha256" in found[0]
    before = snapshot(repo)
    with pytest.raises(SeriesError, match=entry.file):
        apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
    assert snapshot(repo) == before


def test_manifest_pins_the_sha256_of_every_patch_file(toy_series):
    import hashlib

    _repo, _manifest, patch_dir = toy_series
    saved = manifest_mod.load(patch_dir / "series.json")
    for entry in saved.patches:
        assert entry.sha256 == hashlib.sha256((patch_dir / entry.file).read_bytes()).hexdigest()


def test_hints_imports_no_tool_module_that_imports_it():
    """``git`` prints ``hints``' messages: ``hints`` may import only ``manifest``."""
    import ast

    tree = ast.parse((manifest_mod.ROOT / "scripts" / "seriestool" / "hints.py").read_text())
    imported = {
        f"{node.module or ''}.{alias.name}".strip(".")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level
        for alias in node.names
    }
    assert imported == {"manifest.PATCH_DIR", "manifest.ROOT"}
