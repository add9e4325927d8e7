"""The "Changes in vN" section of SERIES.md: its words, and a draft of it
(``compare`` classifies; this module words it, importing nothing of it).
"""

from __future__ import annotations

from collections.abc import Sequence

UNCHANGED = "unchanged"
NEW = "new"
DROPPED = "dropped"
SPLIT = "split"
REORDERED = "reordered"
REWORDED = "reworded"
TEST_ONLY = "test only"
CONTRACT_CHANGED = "contract changed"
CONTEXT_ONLY = "context only"
REWRITTEN = "rewritten"  # paired as series.json's "previous" records
MERGED = "merged"  # a further recorded ancestor of a new patch, and that patch

# Kinds that need no reason: nothing a reviewer must re-read.
_NO_WHY = {UNCHANGED, CONTEXT_ONLY}


def draft(comparison) -> str:
    """The Markdown section, ending with a newline."""
    old, new = comparison.old, comparison.new
    command = f"make compare FROM={old.state.spec}"
    if new.state.commit is not None:
        command += f" TO={new.state.spec}"
    was, now = old.manifest.base, new.manifest.base
    base = f"{now.project} {now.version}"
    same = (was.project, was.version, was.commit) == (now.project, now.version, now.commit)
    base = f"{base}, unchanged." if same else f"{was.project} {was.version} -> {base}."
    lines = [
        f"## Changes in v{new.state.version}",
        "",
        f"Against {old.state.label}; `{command}` shows the range-diff. Base: {base}",
        "",
    ]
    ordered = sorted((c for c in comparison.changes if c.new), key=lambda c: c.new.number)
    gone = sorted(
        (c for c in comparison.changes if not c.new and not c.pieces and not c.merged_into),
        key=lambda c: c.old.number,
    )
    lines += [_line(c, comparison) for c in ordered + gone] or ["(both versions are empty)"]
    return "\n".join(lines) + "\n"


def _line(change, comparison) -> str:
    ov = comparison.old.state.version
    old, new = change.old, change.new
    if new is None:
        head = f"- v{ov} {old.tag} `{old.subject}`"
    else:
        head = f"- {new.tag} `{new.subject}`"
        # The old number, unless the kind's own words say where it came from.
        if (
            old is not None
            and old.tag != new.tag
            and not {SPLIT, REORDERED, REWRITTEN} & set(change.kinds)
        ):
            head += f" (v{ov} {old.tag})"
    parts = [_describe(kind, change, comparison) for kind in change.kinds]
    text = "; ".join(parts)
    if change.kinds[0] == REWRITTEN and len(parts) > 1:
        text = f"{parts[0]}: {'; '.join(parts[1:])}"  # "rewritten from ...: what differs"
    why = "" if set(change.kinds) <= _NO_WHY else " Why: TODO."
    return f"{head}: {text}.{why}"


def _describe(kind: str, change, comparison) -> str:
    ov = comparison.old.state.version
    old = change.old
    if kind == NEW:
        if change.from_old is not None:
            f = change.from_old
            return f"new; most of its added lines were in v{ov} {f.tag} `{f.subject}`"
        return NEW
    if kind == DROPPED:
        heirs = [c.new.tag for c in comparison.changes if c.from_old is old and c.new]
        return DROPPED + (f"; most of its lines are now in {', '.join(heirs)}" if heirs else "")
    if kind == SPLIT and change.derivations and change.new is not None:
        return "; ".join(
            f"split from v{ov} {d.old.tag} `{d.old.subject}` (recorded; pieces:"
            f" {', '.join(p.tag for p in recorded_pieces(comparison.changes, d.old))})"
            for d in change.derivations
        )
    if kind == SPLIT:
        donor = change.from_old or old
        tags = ", ".join(p.tag for p in change.pieces)
        return f"split from v{ov} {donor.tag} `{donor.subject}` into {tags}"
    if kind == REWRITTEN:
        return f"rewritten from v{ov} {old.tag} `{old.subject}`"
    if kind == MERGED:
        return "; ".join(
            f"also from v{ov} {d.old.tag} `{d.old.subject}` (recorded)" for d in change.derivations
        )
    if kind == REORDERED and REWRITTEN in change.kinds:
        return REORDERED  # "rewritten from" names the old patch
    if kind == REORDERED:
        return f"reordered (was v{ov} {old.tag})"
    if kind == REWORDED:
        message, author = change.message_changed, change.author_changed
        what = "message and author" if message and author else "message" if message else "author"
        return f"reworded: {what} only{_subject_note(change)}"
    if kind == TEST_ONLY:
        return f"test only: {', '.join(change.test_paths)}{_subject_note(change, also=True)}"
    if kind == CONTRACT_CHANGED:
        docs = [
            p for p in change.code_paths if p.startswith("docs/") or p.endswith((".md", ".rst"))
        ]
        code = [p for p in change.code_paths if p not in docs]
        parts = [
            f"{what} in {', '.join(paths)}"
            for what, paths in (
                ("code differs", code),
                ("docs differ", docs),
                ("tests differ", change.test_paths),
            )
            if paths
        ]
        return f"contract changed: {'; '.join(parts)}{_subject_note(change, also=True)}"
    if kind == CONTEXT_ONLY:
        return "context only: the same change, the lines around it moved"
    return kind


def recorded_pieces(changes: Sequence, ancestor) -> list:
    """The new patches that carry ``ancestor``: its pair and those that record it."""
    return sorted(
        (
            c.new
            for c in changes
            if c.new and (c.old is ancestor or any(d.old is ancestor for d in c.derivations))
        ),
        key=lambda p: p.number,
    )


def _subject_note(change, also: bool = False) -> str:
    old, new = change.old, change.new
    rewritten = change.paired_by == "manifest"  # "rewritten from" names the old subject
    if old is not None and new is not None and old.subject != new.subject and not rewritten:
        return f"; subject was `{old.subject}`"
    if also and change.message_changed:
        return "; message changed too"
    return ""
