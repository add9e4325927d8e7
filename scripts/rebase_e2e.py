#!/usr/bin/env python3
"""End-to-end rebase onto a real release, with recorded hand resolutions.

``make test-rebase-e2e [TO=0.32.0]`` runs, in a clone of this repository's
committed state (the repository itself, its ``patches/`` and ``SERIES.md``,
is only read), what a fork maintainer would type:

1. ``make rebase TO=<release> KEEP=1 NOTEST=1``: the release's PyPI sdist
   becomes the new base (pip fetches it once; it is cached in ``work/``);
2. at each conflict, every unmerged file is first resolved generically:
   upstream's changes, with the patch's own version of each region where
   both changed (``git merge-file --theirs`` of the three stages); a file
   that the new base or the patch deleted stays deleted (the patch's change
   to a file the new base lacks is dropped).  Then the hand resolution
   recorded for the patch, ``qualification/rebase/resolutions-<to>/
   <NNNN>.diff`` (``NNNN``: the patch's number; read from this checkout's
   working tree), is applied with ``git apply --index``: a diff from the
   generic resolution to the hand-resolved files, which may touch any file
   of the patch.  Then ``make rebase CONTINUE=1``, until the rebase succeeds;
3. ``make check-manifest``, ``make apply`` (the branch the rebase kept in
   ``work/vllm``) and a fresh ``make apply`` from the new base;
4. one prefix test: the whole series' own tests on the new base
   (``seriestool test-series --full-only``).

``--record`` (``make test-rebase-e2e ARGS=--record``) stops at each conflict
after the generic resolution and the recorded diff (applied to the work tree
only; one that no longer applies is left out, with a warning), for the
files to be edited by hand in the printed checkout; Enter writes ``git
diff`` there (the edits against the generic resolution) as that patch's
``<NNNN>.diff`` (none if empty) and goes on.
Prints a summary (each step's time and result, the rebase report's patch
table) and exits non-zero when a step fails.  ``make venv`` is not run in
the clone: the clone borrows this checkout's ``.venv`` as it is.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
steps: list[tuple[str, float, str]] = []


def run(name: str, cmd: list[str], cwd: Path, env: dict, ok=(0,)) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    steps.append((name, took, f"exit {proc.returncode}: {tail[0][:110]}"))
    print(f"--- {name} ({took:.1f} s, exit {proc.returncode})\n{proc.stdout}{proc.stderr}",
          flush=True)  # fmt: skip
    if proc.returncode not in ok:
        finish(f"FAILED at: {name}")
    return proc


def git(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, input=input,
                          capture_output=True, check=True).stdout  # fmt: skip


def resolve(checkout: Path, recorded: Path, record: bool) -> list[str]:
    """Resolve every unmerged file of a stopped ``git am`` (see the module doc);
    ``recorded``: this patch's hand resolution, a diff."""
    stages: dict[str, dict[int, str]] = {}
    for entry in git(checkout, "ls-files", "-u", "-z").decode().split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            _mode, blob, stage = meta.split()
            stages.setdefault(path, {})[int(stage)] = blob
    done = []
    for path, blobs in sorted(stages.items()):
        if 2 in blobs and 3 in blobs:
            with tempfile.TemporaryDirectory() as tmp:
                files = []
                for stage in (2, 1, 3):
                    f = Path(tmp) / str(stage)
                    blob = blobs.get(stage)  # no stage 1: both added the file
                    f.write_bytes(git(checkout, "cat-file", "blob", blob) if blob else b"")
                    files.append(str(f))
                proc = subprocess.run(["git", "merge-file", "-p", "--theirs", *files],
                                      capture_output=True, check=False)  # fmt: skip
                (checkout / path).write_bytes(proc.stdout)
            git(checkout, "add", "--", path)
            done.append(f"{path}: both changed: the patch's side of each conflicting region")
        else:
            git(checkout, "rm", "-q", "--", path)
            side = "the patch" if 2 in blobs else "the new base"
            done.append(f"{path}: deleted in {side}: stays deleted")
    if recorded.is_file():
        try:
            git(checkout, "apply", *(() if record else ("--index",)), str(recorded.resolve()))
            done.append(f"{recorded.name}: the recorded hand resolution applied")
        except subprocess.CalledProcessError as e:
            if not record:
                finish(f"FAILED: {recorded} does not apply: {e.stderr.decode().strip()}")
            print(f"warning: {recorded} does not apply; starting from the generic resolution")
    if record:
        input(f"\n{recorded.name}: resolve in {checkout} (`git diff`: the edits so far), "
              "then press Enter to record it ")  # fmt: skip
        diff = git(checkout, "diff", "--no-color", "--no-ext-diff")
        recorded.parent.mkdir(parents=True, exist_ok=True)
        if diff:
            recorded.write_bytes(diff)
        else:
            recorded.unlink(missing_ok=True)
        git(checkout, "add", "-u")
        done.append(f"{recorded.name}: recorded ({len(diff.splitlines())} lines)")
    return done


def finish(result: str) -> None:
    print("\n## Summary\n")
    for name, took, what in steps:
        print(f"- {name}: {took:.1f} s, {what}")
    print(f"\nResult: {result}")
    sys.exit(0 if result == "PASSED" else 1)


# What `make test-rebase-e2e X=...` puts in the environment, for make to
# export; the sub-makes take only the variables the script passes them.
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "ARGS", "TO", "VLLM", "PATCHES",
                  "CONTINUE", "ABORT", "KEEP", "NOTEST", "FORCE")  # fmt: skip


def make_env(environ: Mapping[str, str], work: Path) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in MAKE_VARIABLES}
    return {**env, "SERIES_WORK_DIR": str(work)}


def main() -> None:
    parser = argparse.ArgumentParser(description="End-to-end rebase onto a real release.")
    parser.add_argument("to", nargs="?", default="0.32.0")
    parser.add_argument("--record", action="store_true",
                        help="resolve each conflict by hand and record it")  # fmt: skip
    args = parser.parse_args()
    to = args.to
    real_work = Path(os.environ.get("SERIES_WORK_DIR", ROOT / "work")).absolute()
    real_work.mkdir(parents=True, exist_ok=True)  # on the cache's file system: renames work
    with tempfile.TemporaryDirectory(prefix="rebase-e2e-", dir=real_work) as tmp:
        clone = Path(tmp) / "series"
        subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True)
        (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
        work = clone / "work"
        work.mkdir()
        for name in ("base", "sdist"):  # the cache of materialised bases is shared
            (real_work / name).mkdir(parents=True, exist_ok=True)
            (work / name).symlink_to(real_work / name)
        env = make_env(os.environ, work)
        make = ["make", "-s", "-o", "venv", "-C", str(clone)]
        proc = run(f"make rebase TO={to} KEEP=1 NOTEST=1", [*make, "rebase", f"TO={to}",
                   "KEEP=1", "NOTEST=1"], clone, env, ok=(0, 1, 2))  # fmt: skip
        scratch = work / "rebase" / to / "vllm"
        for _ in range(40):
            if proc.returncode == 0:
                break
            if "left in progress" not in proc.stdout + proc.stderr:
                finish("FAILED: the rebase stopped without a conflict to resolve")
            patch = re.search(r"(\d{4}-\S+\.patch) conflicts", proc.stderr)
            name = patch[1] if patch else "?"
            recorded = ROOT / "qualification" / "rebase" / f"resolutions-{to}" / f"{name[:4]}.diff"
            for line in resolve(scratch, recorded, args.record):
                steps.append((f"resolved {name}", 0.0, line))
            proc = run("make rebase CONTINUE=1", [*make, "rebase", "CONTINUE=1"], clone, env,
                       ok=(0, 1, 2))  # fmt: skip
        else:
            finish("FAILED: too many conflicts")
        report = (work / "rebase" / to / "report.md").read_text()
        table = report.split("## Patches", 1)[1].split("```")[1]
        steps.append(("rebase report", 0.0, "patches:" + table.rstrip().replace("\n", "\n    ")))
        run("make check-manifest", [*make, "check-manifest"], clone, env)
        run("make apply (the branch the rebase kept)", [*make, "apply"], clone, env)
        shutil.rmtree(work / "vllm")
        run("make apply (a fresh checkout of the new base)", [*make, "apply"], clone, env)
        series = [str(clone / ".venv" / "bin" / "python"), "-m", "seriestool"]
        run("test-series --full-only (one prefix: the whole series)",
            [*series, "test-series", "--full-only"], clone,
            {**env, "PYTHONPATH": "scripts"})  # fmt: skip
        finish("PASSED")


if __name__ == "__main__":
    main()
