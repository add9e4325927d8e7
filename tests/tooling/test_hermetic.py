"""The tool's own git calls are immune to the user's git setup.

Hooks never run (a hook that fails must not break apply or its restore), and
format/diff/apply/merge settings, set in the repository, globally or system
wide, change neither what ``export`` writes (byte for byte, manifest
included) nor what ``apply`` commits.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import Repo, snapshot
from seriestool import apply as apply_mod
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod
from seriestool.errors import SeriesError

LOADER = "".join(
    f"def f{n}(x):\n\n    return x + {n}\n\n" if n % 5 else f"# section {n}\n\n" for n in range(40)
)
BASE_FILES = {
    "pkg/loader.py": LOADER,
    "pkg/aa_first.py": "A = 1\n",
    "pkg/zz_last.py": "Z = 1\n",
    "pkg/gone.py": "GONE = 1\n",
    "docs/naïve.md": "# Naïve\n",
    "tests/test_loader.py": "def test_load():\n    pass\n",
}
# Trailing whitespace (apply.whitespace), a scissors line (mailinfo.scissors),
# non-ASCII text and path (encodings, core.quotePath), two hunks five lines
# apart (diff.interHunkContext), files an order file can reorder.
FIRST_MESSAGE = (
    "[Loader] première: a subject long enough to be cut by a short file-name limit\n\n"
    "Explains the change, with a scissors line below.\n\n-- >8 --\n\nAnd text after it."
)
FIRST = {
    "pkg/loader.py": LOADER.replace("return x + 11", "return x + 11  ").replace(
        "return x + 14", "return x - 14"
    ),
    "pkg/aa_first.py": "A = 2\n",
    "pkg/zz_last.py": "Z = 2\n",
    "docs/naïve.md": "# Naïve\n\nMore.\n",
    "tests/test_first.py": "def test_first():\n    assert True\n",
}
SECOND = {
    "pkg/gone.py": None,
    "pkg/loader.py": FIRST["pkg/loader.py"].replace("return x + 33", "return x * 33"),
    "tests/test_second.py": "def test_second():\n    assert True\n",
}


@pytest.fixture
def rich_series(make_repo, tmp_path):
    """(repo on ``main`` at the base with branch ``work`` = the series, manifest,
    patch_dir exported without any special configuration)."""
    repo = make_repo("upstream", BASE_FILES)
    base = repo.head()
    repo.git("checkout", "-q", "-b", "work")
    repo.commit(FIRST_MESSAGE, FIRST)
    repo.commit("[Loader] second change", SECOND)
    repo.git("checkout", "-q", "main")
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    manifest = manifest_mod.Manifest(
        name="toy", version="1",
        base=manifest_mod.Base(
            project="toy", version="1.0", upstream_commit=base[:9],
            sdist=manifest_mod.Sdist("toy-1.0.tar.gz", "0" * 64), commit=base,
            touched_files={},
        ),
        patches=[], regression_tests=manifest_mod.RegressionTests(),
    )  # fmt: skip
    _export(repo, manifest, base, patch_dir)
    return repo, manifest, patch_dir


def _export(repo: Repo, manifest, base: str, out_dir):
    return export_mod.export_series(
        repo.path, manifest, "work", base, patch_dir=out_dir,
        manifest_path=out_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip


def _contents(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _hooks(folder, marker):
    """Every hook git knows, each failing and leaving a trace in ``marker``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (
        "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit",
        "pre-merge-commit", "prepare-commit-msg", "commit-msg", "post-commit",
        "pre-rebase", "post-checkout", "post-merge", "pre-push", "pre-auto-gc",
        "post-rewrite", "reference-transaction", "post-index-change", "fsmonitor-watchman",
    ):  # fmt: skip
        hook = folder / name
        hook.write_text(f'#!/bin/sh\necho "{name} $*" >> "{marker}"\nexit 1\n')
        hook.chmod(0o755)
    return folder


# Settings that change git's output or behaviour, each with a value that
# would; ``{tmp}`` names the test's folder, where ``_settings`` puts the
# order file, signature, mailmap, hooks and a program that fails.
SETTINGS = [
    ("format.subjectPrefix", "RFC PATCH"),
    ("format.filenameMaxLength", "20"),
    ("format.suffix", ".diff"),
    ("format.from", "Someone Else <else@example.com>"),
    ("diff.orderFile", "{tmp}/order"),
    ("diff.interHunkContext", "10"),
    ("format.useAutoBase", "true"),
    ("format.signOff", "true"),
    ("format.to", "list@example.com"),
    ("format.cc", "cc@example.com"),
    ("format.attach", "true"),
    ("format.numbered", "true"),
    ("format.coverLetter", "true"),
    ("format.headers", "X-Extra: 1"),
    ("format.thread", "deep"),
    ("format.outputDirectory", "{tmp}/elsewhere"),
    ("format.signature", "my signature"),
    ("format.signatureFile", "{tmp}/signature"),
    ("format.notes", "true"),
    ("format.encodeEmailHeaders", "false"),
    ("format.forceInBodyFrom", "true"),
    ("format.noprefix", "true"),
    ("diff.noprefix", "true"),
    ("diff.mnemonicPrefix", "true"),
    ("diff.renames", "copies"),
    ("diff.algorithm", "patience"),
    ("diff.context", "7"),
    ("diff.suppressBlankEmpty", "true"),
    ("diff.relative", "true"),
    ("diff.indentHeuristic", "false"),
    ("diff.statGraphWidth", "5"),
    ("diff.external", "{tmp}/fails.sh"),
    ("color.ui", "always"),
    ("core.quotePath", "true"),
    ("core.abbrev", "7"),
    ("i18n.logOutputEncoding", "ISO-8859-1"),
    ("i18n.commitEncoding", "ISO-8859-1"),
    ("log.showSignature", "true"),
    ("log.mailmap", "true"),
    ("mailmap.file", "{tmp}/mailmap"),
    ("core.pager", "{tmp}/fails.sh"),
    ("core.fsmonitor", "{tmp}/fails.sh"),
    ("am.threeWay", "true"),
    ("am.keepcr", "true"),
    ("am.messageId", "true"),
    ("mailinfo.scissors", "true"),
    ("apply.whitespace", "fix"),
    ("apply.ignoreWhitespace", "change"),
    ("commit.gpgSign", "true"),
    ("gpg.program", "{tmp}/fails.sh"),
    ("merge.conflictStyle", "diff3"),
    ("rerere.enabled", "true"),
    ("gc.auto", "1"),
    ("gc.autoDetach", "false"),
    ("submodule.recurse", "true"),
    ("status.renames", "copies"),
    ("core.hooksPath", "{tmp}/hooks"),
]


def _settings(tmp_path, settings=SETTINGS) -> list[tuple[str, str]]:
    """``settings`` with ``{tmp}`` resolved and the files they name written."""
    (tmp_path / "order").write_text("pkg/zz_last.py\ndocs/*\n")
    (tmp_path / "signature").write_text("my signature file\n")
    (tmp_path / "mailmap").write_text("Mapped Name <mapped@example.com> <author@example.com>\n")
    fails = tmp_path / "fails.sh"
    fails.write_text(f'#!/bin/sh\necho "$0 $*" >> "{tmp_path / "ran"}"\nexit 1\n')
    fails.chmod(0o755)
    _hooks(tmp_path / "hooks", tmp_path / "ran")
    return [(key, value.format(tmp=tmp_path)) for key, value in settings]


def _write_config(path, settings):
    for key, value in settings:
        Repo(path.parent).git("config", "--file", str(path), "--add", key, value)


def _hostile(scope: str, settings, repo: Repo, tmp_path, monkeypatch) -> None:
    if scope == "repo":
        for key, value in settings:
            repo.git("config", "--add", key, value)
        return
    path = tmp_path / f"{scope}.gitconfig"
    _write_config(path, settings)
    if scope == "global":
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(path))
    else:
        monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
        monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(path))


# --------------------------------------------------------------------------
# export


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s[0])
def test_export_is_byte_identical_with_each_repo_setting(rich_series, tmp_path, setting):
    repo, manifest, patch_dir = rich_series
    expected = _contents(patch_dir)
    [(key, value)] = _settings(tmp_path, [setting])
    repo.git("config", "--add", key, value)
    again = tmp_path / "again"
    again.mkdir()
    _export(repo, manifest, manifest.base.commit, again)
    assert _contents(again) == expected, f"{key}={value} changed the export"
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("scope", ["global", "system"])
def test_export_is_byte_identical_with_every_setting_at_once(
    rich_series, tmp_path, monkeypatch, scope
):
    repo, manifest, patch_dir = rich_series
    expected = _contents(patch_dir)
    _hostile(scope, _settings(tmp_path), repo, tmp_path, monkeypatch)
    again = tmp_path / "again"
    again.mkdir()
    _export(repo, manifest, manifest.base.commit, again)
    assert _contents(again) == expected
    assert not (tmp_path / "ran").exists()


# --------------------------------------------------------------------------
# apply


def _commits(repo: Repo, base: str) -> list[str]:
    """What apply committed: tree, author, date and message of each commit
    (read with explicit options: the test's own git sees the same config)."""
    log = repo.git("log", "--reverse", "--encoding=UTF-8", "--no-mailmap", "--no-notes",
                   "--format=%T %an <%ae> %aI%n%B%x00", f"{base}..HEAD")  # fmt: skip
    return log.split("\0")


@pytest.fixture
def applied_reference(rich_series, tmp_path):
    """The commits apply makes without any special configuration."""
    repo, manifest, patch_dir = rich_series
    clean = Repo(tmp_path / "clean")
    shutil.copytree(repo.path, clean.path)
    apply_mod.apply_series(clean.path, manifest, patch_dir, log=lambda *_: None)
    return _commits(clean, manifest.base.commit)


@pytest.mark.parametrize("scope", ["repo", "global", "system"])
def test_apply_commits_the_same_whatever_the_config(
    rich_series, applied_reference, tmp_path, monkeypatch, scope
):
    repo, manifest, patch_dir = rich_series
    _hostile(scope, _settings(tmp_path), repo, tmp_path, monkeypatch)
    assert apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None) == 0
    assert _commits(repo, manifest.base.commit) == applied_reference
    assert repo.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name
    assert repo.git("status", "--porcelain", "--untracked-files=no") == ""
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("where", ["global core.hooksPath", "repo core.hooksPath", ".git/hooks"])
@pytest.mark.parametrize("outcome", ["applies", "fails"])
def test_user_hooks_neither_run_nor_break_apply_or_its_restore(
    toy_series, tmp_path, monkeypatch, where, outcome
):
    repo, manifest, patch_dir = toy_series
    marker = tmp_path / "ran"
    if where == ".git/hooks":
        _hooks(repo.path / ".git" / "hooks", marker)
    else:
        hooks = _hooks(tmp_path / "hooks", marker)
        scope = "global" if where.startswith("global") else "repo"
        _hostile(scope, [("core.hooksPath", str(hooks))], repo, tmp_path, monkeypatch)
    if outcome == "fails":
        second = patch_dir / manifest.patches[1].file
        second.write_text(second.read_text().replace(" def load(x):", " def load(y):"))
        from seriestool import check_manifest, patchset

        manifest.patches[1].patch_id = patchset.patch_id_of_file(second)
        manifest.patches[1].sha256 = patchset.sha256_of_file(second)
        assert check_manifest.problems(manifest, patch_dir) == []
    before = snapshot(repo)
    if outcome == "applies":
        assert apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None) == 0
        assert repo.git("symbolic-ref", "--short", "HEAD") == manifest.branch_name
    else:
        with pytest.raises(SeriesError, match="nothing was changed"):
            apply_mod.apply_series(repo.path, manifest, patch_dir, log=lambda *_: None)
        assert snapshot(repo) == before
    assert not marker.exists(), marker.read_text()
