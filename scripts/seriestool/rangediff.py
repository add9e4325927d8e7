"""``git range-diff``: run it between two applied series and read its pairs.

git does the pairing and the diff of diffs; only the pair header lines are
parsed, the bodies are kept verbatim for reports.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from . import git as g

# A `git range-diff` pair header, e.g. ` 2:  1e811a7 ! 2:  5240e5d subject`
# (range-diff.c, output_pair_header).  Body lines of a pair are indented by
# four spaces; headers carry at most width-1 spaces of padding.
_PAIR_HEADER = re.compile(
    r"^ {0,3}(?P<lno>\d+|-+):\s+(?P<lsha>[0-9a-f]+|-+) (?P<st>[=!<>]) "
    r"\s*(?P<rno>\d+|-+):\s+(?P<rsha>[0-9a-f]+|-+)(?: .*)?$"
)


@dataclasses.dataclass
class Pair:
    """One pair header of range-diff output (``=``, ``!``, ``<``, ``>``) and its body;
    positions 1-based, None on the side the commit is missing from."""

    status: str
    left: int | None
    left_sha: str | None
    right: int | None
    right_sha: str | None
    body: str = ""


def parse(text: str) -> list[Pair]:
    """Every pair of ``git range-diff`` output, in its order."""
    pairs: list[Pair] = []
    for line in text.splitlines():
        match = None if line.startswith("    ") else _PAIR_HEADER.match(line)
        if match:
            lno, lsha, rno, rsha = (
                None if v.startswith("-") else v for v in match.group("lno", "lsha", "rno", "rsha")
            )
            pairs.append(Pair(match["st"], lno and int(lno), lsha, rno and int(rno), rsha))
        elif pairs:
            pairs[-1].body += f"{line}\n"
    for pair in pairs:
        pair.body = pair.body.removesuffix("\n")
    return pairs


def range_diff(
    repo: Path,
    old_base: str,
    old_tip: str,
    new_base: str,
    new_tip: str,
    creation_factor: int | None = None,
    pathspecs: tuple[str, ...] | list[str] = (),
) -> str:
    """``git range-diff old_base..old_tip new_base..new_tip [-- pathspecs]``; git
    refuses an empty side, whose counterpart is then listed in its notation."""
    if old_tip != old_base and new_tip != new_base:
        factor = [] if creation_factor is None else [f"--creation-factor={creation_factor}"]
        return g.out(repo, "range-diff", "--no-color", *factor, f"{old_base}..{old_tip}",
                     f"{new_base}..{new_tip}", "--", *pathspecs)  # fmt: skip
    lines = []
    for side, (base, tip) in (("old", (old_base, old_tip)), ("new", (new_base, new_tip))):
        log = g.out(repo, "log", "--no-color", "--reverse", "--format=%h %s", f"{base}..{tip}")
        for n, line in enumerate(log.splitlines(), 1):
            commit, subject = line.split(" ", 1)
            if side == "old":
                lines.append(f"{n}:  {commit} < -:  {'-' * len(commit)} {subject}")
            else:
                lines.append(f"-:  {'-' * len(commit)} > {n}:  {commit} {subject}")
    return "\n".join(lines)
