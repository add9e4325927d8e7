"""SERIES.md's facts that ``patches/series.json`` records, rewritten from it
(``sync``), leaving every other line as it was.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import manifest as manifest_mod

DOC_NAME = "SERIES.md"
ROW = re.compile(r"^\|\s*(\d{4})\s*\|\s*`([^`]*)`\s*\|(.*)$")
_BASEROW = re.compile(r"^(\|\s*([a-z ]+?)\s*\|)(.*)$")


def section(lines: list[str], title: str) -> tuple[int, int] | None:
    """``(first, end)`` line indexes of the body of section ``## title``."""
    try:
        start = lines.index(f"## {title}") + 1
    except ValueError:
        return None
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def _rewrite_rows(lines: list[str], title: str, manifest: manifest_mod.Manifest, row) -> None:
    """Replace the ``| NNNN | `value` |...`` rows of a section with one per patch:
    ``| NNNN | row(patch, old rest of the row by normalised value)``."""
    span = section(lines, title)
    at = [i for i in range(*span) if ROW.match(lines[i])] if span else []
    if at:
        old = {manifest_mod.normalise(m[2]): m[3] for i in at if (m := ROW.match(lines[i]))}
        lines[at[0] : at[-1] + 1] = [f"| {p.file[:4]} | {row(p, old)}" for p in manifest.patches]


def _base_value(key: str, value: str, base: manifest_mod.Base) -> str:
    """One cell of the "Base" table with the manifest's facts put in."""
    ticks = re.findall(r"`[^`]*`", value)
    if key == "project":
        shown = f"v{base.version}" if base.version[:1].isdigit() else base.version
        return re.sub(r"\bv?\d[\w.+-]*", shown, value, count=1)
    if key == "upstream commit" and ticks:
        return value.replace(ticks[0], f"`{base.upstream_commit}`", 1)
    if key == "source of the tree":
        if not base.sdist.sha256:
            return f" the commit `{base.commit}` of a vLLM checkout (no sdist) |"
        return f" PyPI sdist `{base.sdist.filename}`, sha256 `{base.sdist.sha256}` |"
    if key == "materialised base commit" and ticks:
        return value.replace(ticks[0], f"`{base.commit}`", 1)
    return value


def render(text: str, manifest: manifest_mod.Manifest) -> str:
    """``text`` (SERIES.md) with the manifest's facts written into it."""
    lines = text.split("\n")

    def order(p, old):
        return f"`{p.subject}` |" + old.get(
            manifest_mod.normalise(p.subject), " TODO: its concern |"
        )

    _rewrite_rows(lines, "Order and why", manifest, order)
    _rewrite_rows(lines, "Stable patch IDs", manifest, lambda p, _old: f"`{p.patch_id}` |")
    span = section(lines, "Base")
    for i in range(*span) if span else ():
        if match := _BASEROW.match(lines[i]):
            lines[i] = match[1] + _base_value(match[2], match[3], manifest.base)
    return "\n".join(lines)


def sync(manifest: manifest_mod.Manifest, patch_dir: Path, log=print) -> None:
    """Rewrite the SERIES.md beside ``patch_dir`` (if any) from ``manifest``."""
    doc = Path(patch_dir).resolve().parent / DOC_NAME
    if not doc.is_file():
        return
    text = doc.read_text(encoding="utf-8")
    new = render(text, manifest)
    if new != text:
        manifest_mod.write_atomic(doc, new)
        log(f"updated {doc.name}: its patch subjects, stable patch IDs and base, from the manifest")
