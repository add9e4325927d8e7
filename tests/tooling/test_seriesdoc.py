"""SERIES.md's derived tables follow the manifest: ``export`` (with
``PATCHES=``) rewrites them, keeping the hand-written text."""

from __future__ import annotations

from seriestool import check_manifest
from seriestool import manifest as manifest_mod
from seriestool.cli import main
from test_rebase import _series_doc


def test_export_into_patches_dir_rewrites_series_md(toy_series):
    repo, manifest, patch_dir = toy_series
    doc = _series_doc(patch_dir)
    base = manifest.base.commit
    repo.git("checkout", "-q", "-b", "work", base)
    repo.git("am", "-q", "--keep-non-patch", *sorted(str(p) for p in patch_dir.glob("*.patch")))
    repo.commit("[Loader] third change", {"pkg/other.py": "VALUE = 3\n"})

    args = ["export", "--vllm", str(repo.path), "--branch", "work", "--base", base]
    assert main([*args, "--patches-dir", str(patch_dir)]) == 0

    manifest = manifest_mod.load(patch_dir / "series.json")
    assert [p.file[:4] for p in manifest.patches] == ["0001", "0002", "0003"]
    assert check_manifest.doc_problems(manifest, doc) == []
    text = doc.read_text()
    assert "| 0003 | `[Loader] third change` | TODO: its concern |" in text
    assert "| 0001 | `[Loader] first change` | concern of first change |" in text, text
    assert "Prose about v1.0 stays." in text
