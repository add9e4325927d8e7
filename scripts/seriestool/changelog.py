"""The "Changes in vN" section of SERIES.md: its words, and a draft of it.

One line per patch of the new version, in its order, then one per old patch
that is gone: what git shows changed (the kinds below, with the files and
patch numbers behind them) and a ``Why: TODO.`` for the reviewer-facing
reason, which only a person can give.  ``compare`` classifies; this module
only words the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .compare import Change, Comparison

UNCHANGED = "unchanged"
NEW = "new"
DROPPED = "dropped"
SPLIT = "split"
REORDERED = "reordered"
REWORDED = "reworded"
TEST_ONLY = "test only"
CONTRACT_CHANGED = "contract changed"
CONTEXT_ONLY = "context only"

# Kinds that need no reason: nothing a reviewer must re-read.
_NO_WHY = {UNCHANGED, CONTEXT_ONLY}


def draft(comparison: Comparison) -> str:
    """The Markdown section, ending with a newline."""
    old, new = comparison.old, comparison.new
    ov = old.state.version
    command = f"make compare FROM={old.state.spec}"
    if new.state.commit is not None:
        command += f" TO={new.state.spec}"
    lines = [
        f"## Changes in v{new.state.version}",
        "",
        f"Against v{ov} ({_where(old.state)}); `{command}` shows the range-diff."
        f" {_base_sentence(comparison)}",
        "",
    ]
    ordered = sorted((c for c in comparison.changes if c.new), key=lambda c: c.new.number)
    gone = sorted(
        (c for c in comparison.changes if not c.new and not c.pieces), key=lambda c: c.old.number
    )
    for change in ordered + gone:
        lines.append(_line(change, comparison))
    if not ordered and not gone:
        lines.append("(both versions are empty)")
    return "\n".join(lines) + "\n"


def _where(state) -> str:
    return "the working tree" if state.commit is None else f"commit {state.commit[:12]}"


def _base_sentence(comparison: Comparison) -> str:
    old, new = comparison.old.manifest.base, comparison.new.manifest.base
    if (old.project, old.version, old.commit) == (new.project, new.version, new.commit):
        return f"Base: {new.project} {new.version}, unchanged."
    return f"Base: {old.project} {old.version} -> {new.project} {new.version}."


def _line(change: Change, comparison: Comparison) -> str:
    ov = comparison.old.state.version
    old, new = change.old, change.new
    if new is None:
        assert old is not None
        head = f"- v{ov} {old.tag} `{old.subject}`"
    else:
        head = f"- {new.tag} `{new.subject}`"
        # The old number, unless the kind's own words say where it came from.
        if old is not None and old.tag != new.tag and not {SPLIT, REORDERED} & set(change.kinds):
            head += f" (v{ov} {old.tag})"
    parts = [_describe(kind, change, comparison) for kind in change.kinds]
    why = "" if set(change.kinds) <= _NO_WHY else " Why: TODO."
    return f"{head}: {'; '.join(parts)}.{why}"


def _describe(kind: str, change: Change, comparison: Comparison) -> str:
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
    if kind == SPLIT:
        donor = change.from_old or old
        tags = ", ".join(p.tag for p in change.pieces)
        return f"split from v{ov} {donor.tag} `{donor.subject}` into {tags}"
    if kind == REORDERED:
        return f"reordered (was v{ov} {old.tag})"
    if kind == REWORDED:
        what = {
            (True, False): "message only",
            (False, True): "author only",
            (True, True): "message and author only",
        }[(change.message_changed, change.author_changed)]
        return f"reworded: {what}{_subject_note(change)}"
    if kind == TEST_ONLY:
        return f"test only: {', '.join(change.test_paths)}{_subject_note(change, also=True)}"
    if kind == CONTRACT_CHANGED:
        tests = f"; tests differ in {', '.join(change.test_paths)}" if change.test_paths else ""
        return (
            f"contract changed: code differs in {', '.join(change.code_paths)}{tests}"
            f"{_subject_note(change, also=True)}"
        )
    if kind == CONTEXT_ONLY:
        return "context only: the same change, the lines around it moved"
    return kind


def _subject_note(change: Change, also: bool = False) -> str:
    old, new = change.old, change.new
    if old is not None and new is not None and old.subject != new.subject:
        return f"; subject was `{old.subject}`"
    if also and change.message_changed:
        return "; message changed too"
    return ""
