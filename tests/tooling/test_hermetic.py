"""The tool's own git calls are immune to the user's git setup.

Hooks and the programs settings name never run, and format/diff/apply/merge
settings, set in the repository, globally or system wide, do not change what
``export`` writes (byte for byte, manifest included).
"""

from __future__ import annotations

import pytest
from conftest import Repo
from seriestool import export as export_mod
from seriestool import manifest as manifest_mod

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
