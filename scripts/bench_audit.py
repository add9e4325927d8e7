#!/usr/bin/env python3
"""Benchmark ``make check`` (the audit) against the raw patch-ID pipeline.

Builds, in a temporary folder, a consolidated history of N commits (default
16,800, the size of a long-lived vLLM fork) on the pinned base (the real
vLLM 0.33.0 tree): the series patches at spread-out points, every other
commit changing one other file of the tree.  Then, in the same run, times:

- raw: ``git log -p --no-merges BASE..TIP -- <series paths> | git patch-id
  --verbatim``, the pipeline that finds the series' patch IDs;
- audit: ``seriestool check`` on that history, as ``make check`` runs it (a
  fresh Python process), best of ``--repeat`` runs each;

and prints both and their ratio.  A measurement, not a test: nothing is
asserted.  Usage (from the repository root, after ``make venv``)::

    .venv/bin/python scripts/bench_audit.py [--commits 16800] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from seriestool import base as base_mod  # noqa: E402
from seriestool import manifest as manifest_mod  # noqa: E402

IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
}  # fmt: skip


def git(repo: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, **IDENTITY, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True,
                          capture_output=True, **kwargs)  # fmt: skip


def build(
    work: Path, commits: int, manifest: manifest_mod.Manifest, changed: bool = False
) -> tuple[Path, str, str]:
    """A clone of the pinned base with ``commits`` commits on branch ``fork``;
    ``changed``: the fork's commit of patch 3 carries a review fix."""
    bare, base, _sha = base_mod.materialise_pinned(manifest, log=lambda *_: None)
    # The series as commits, to be replayed inside the long history.
    series = work / "series"
    git(work, "clone", "-q", "--shared", "--branch", base_mod.BASE_BRANCH, str(bare), str(series))
    git(series, "-c", "core.hooksPath=/dev/null", "am", "-q", "--keep-non-patch",
        *map(str, manifest.patch_paths()))  # fmt: skip
    repo = work / "fork"
    git(work, "clone", "-q", "--shared", "--no-checkout", str(series), str(repo))
    # Each patch, as the fork merged it: the files it changes, at their new blobs.
    patch_commits = git(series, "rev-list", "--reverse", f"{base}..HEAD", text=True).stdout.split()
    files = git(repo, "ls-tree", "-r", "--name-only", base, text=True).stdout.split()
    owned = sorted(manifest.base.touched_files)
    others = [f for f in files if f not in set(owned) and f.endswith((".py", ".md"))]
    at = {commits * (k + 1) // (len(patch_commits) + 1): c for k, c in enumerate(patch_commits)}
    stream = [f"reset refs/heads/fork\nfrom {base}\n\n".encode()]
    when = 1_700_000_000
    for n in range(commits):
        message = f"upstream work {n}".encode()
        stream.append(
            f"commit refs/heads/fork\ncommitter Bench <bench@example.com> {when + n} +0000\n"
            f"data {len(message)}\n".encode()
            + message
            + b"\n"
        )
        if n in at:
            files_changed = git(series, "diff-tree", "--no-commit-id", "-r", "--no-renames", "-z",
                                at[n], text=True).stdout.split("\0")  # fmt: skip
            for meta, path in zip(files_changed[0::2], files_changed[1::2], strict=False):
                mode, new = meta.split()[1], meta.split()[3]
                if set(new) == {"0"}:
                    stream.append(f"D {path}\n".encode())
                elif changed and at[n] == patch_commits[2] and path.endswith(".py"):
                    text = git(series, "cat-file", "blob", new).stdout + b"# review fix\n"
                    stream.append(f"M {mode} inline {path}\ndata {len(text)}\n".encode() + text)
                    changed = False
                else:
                    stream.append(f"M {mode} {new} {path}\n".encode())
        else:
            path = others[(n * 7919) % len(others)]
            data = f"# upstream work {n}\n".encode()
            stream.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
        stream.append(b"\n")
    git(repo, "fast-import", "--quiet", input=b"".join(stream))
    return repo, base, "fork"


def timed(cmd, repeat: int, ok=(0, 1), **kwargs) -> float:
    """Best wall time of ``repeat`` runs; the audit's findings (exit 1) are fine."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, **kwargs)
        best = min(best, time.perf_counter() - start)
        if proc.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr}")
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=16_800)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--changed", action="store_true",
        help="one patch carries a review fix: the audit builds the series and runs range-diff",
    )  # fmt: skip
    parser.add_argument("--make", action="store_true", help="also time `make check` as typed")
    args = parser.parse_args()
    manifest = manifest_mod.load()
    paths = sorted(manifest.base.touched_files)
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        start = time.perf_counter()
        repo, base, tip = build(Path(tmp), args.commits, manifest, args.changed)
        count = git(repo, "rev-list", "--count", f"{base}..{tip}", text=True).stdout.strip()
        print(f"history: {count} commits on the pinned base, built in"
              f" {time.perf_counter() - start:.1f} s")  # fmt: skip
        pipeline = (
            f"git -C {repo} log -p --no-merges --no-color --format='commit %H' {base}..{tip}"
            f" -- {' '.join(paths)} | git patch-id --verbatim > /dev/null"
        )
        raw = timed(["bash", "-c", "set -o pipefail; " + pipeline], args.repeat)
        check = [sys.executable, "-m", "seriestool", "check", "--vllm", str(repo),
                 "--consolidated", tip, "--base", base]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
        proc = subprocess.run(check, capture_output=True, text=True, env=env)
        result = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
        audit = timed(check + ["--json"], args.repeat, env=env) if proc.returncode < 2 else 0
        print(f"audit result: {result}")
        print(f"raw git log -p | git patch-id: {raw:.2f} s (best of {args.repeat})")
        print(f"seriestool check (whole command): {audit:.2f} s (best of {args.repeat})")
        if raw and audit:
            print(f"ratio: {audit / raw:.2f}x the raw pipeline; the tool adds {audit - raw:.2f} s")
        if args.make:
            make = ["make", "-s", "-C", str(ROOT), "check", f"VLLM={repo}", f"CONSOLIDATED={tip}",
                    f"BASE={base}", "JSON=1"]  # fmt: skip
            took = timed(make, args.repeat, ok=(0, 2))  # make exits 2 on findings
            print(f"make check (with its `make venv` step): {took:.2f} s (best of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
