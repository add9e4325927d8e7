"""``test-series``: every prefix of the series applies and passes its tests,
then each upstream group alone (docs/testing.md); each failed step ends the
output with ``failed step: <what>``, which ``rebase`` quotes.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import base as base_mod
from . import export as export_mod
from . import git as g
from . import interrupts, patchset
from . import manifest as manifest_mod
from .errors import SeriesError
from .report import table


def is_test_file(path: str) -> bool:
    return re.fullmatch(r"tests/(.*/)?test_[^/]*\.py", path) is not None


def patch_tests(checkout: Path, patch: Path) -> list[str]:
    """Test files a patch adds or changes that exist after it is applied."""
    return [
        p for p in patchset.files_touched(checkout, patch)
        if is_test_file(p) and (checkout / p).exists()
    ]  # fmt: skip


FAILED_STEP = "failed step: "


def pytest_command(checkout: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of pytest on CPU in the vLLM tree ``checkout``; its
    processes start with ``scripts/cpu_site/sitecustomize.py`` (docs/testing.md)
    and leave no ``__pycache__`` in it (its untracked files stay as they were)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    path = os.pathsep.join([str(checkout), str(Path(__file__).parents[1] / "cpu_site")])
    return cmd, dict(
        os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1"
    )


def run_pytest(
    checkout: Path, tests: list[str], deselect: dict[str, str]
) -> tuple[int, str, list[str]]:
    """pytest on ``tests``, its output printed as it comes (a line per test
    file), less the ``deselect`` node id prefixes, each named with its reason;
    (exit status, its last line, the failing tests)."""
    cmd, env = pytest_command(checkout, "-rfEs", *tests)
    for nodeid, why in deselect.items():
        cmd += ["--deselect", nodeid]
        if nodeid.split("::")[0] in tests:
            print(f"deselected {nodeid}*: {why}")
    echo = functools.partial(print, end="", flush=True)
    proc = interrupts.run(cmd, cwd=checkout, env=env, text=True, echo=echo)
    tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
    failed = re.findall(r"(?m)^(?:FAILED|ERROR) (.+?)(?: - .*)?[ \t]*$", proc.stdout)  # -rfE
    return proc.returncode, tail[0].strip("= "), list(dict.fromkeys(failed))


def run_ruff(checkout: Path, files: list[str]) -> tuple[int, list[str]]:
    """ruff check + format --check with the base's own configuration;
    (exit status, the files ruff reports)."""
    ruff = [sys.executable, "-m", "ruff"]
    procs = [
        subprocess.run([*ruff, *args, *files], cwd=checkout, text=True, capture_output=True)
        for args in (["check"], ["format", "--check"])
    ]
    output = "".join(proc.stdout + proc.stderr for proc in procs)
    print(output, end="")
    # The files ruff check (any output format) and ruff format --check report.
    pattern = r"(?:\s*-->\s*)?([^\s:][^:]*\.pyi?):\d+:\d+|Would reformat: (.+)$"
    found = [m[1] or m[2] for line in output.splitlines() if (m := re.match(pattern, line))]
    return max(proc.returncode for proc in procs), list(dict.fromkeys(found))


def check_prefixes(
    manifest: manifest_mod.Manifest,
    patch_dir: Path = manifest_mod.PATCH_DIR,
    only_full: bool = False,
    base_repo: Path | None = None,
) -> int:
    """Run the prefix checks, then each upstream group's (``group_plan``); 0 when all
    apply and pass.  ``base_repo``: a repository whose ``base`` branch is the base
    (a rebase onto a commit, which has no sdist); else the pinned one."""
    if not manifest.patches:
        print("the series is empty: no vLLM-side tests to run")
        return 0
    repo = base_repo or base_mod.materialise_pinned(manifest)[0]
    patches = manifest.patch_paths(patch_dir)
    scratch_root = base_mod.WORK_DIR / "test-series"
    rows = []
    failed: list[str] = []  # the failed steps, each with what failed in it
    # (label, its patches or None: not tested, why not, scratch folder name)
    sets = [
        (f"prefix 0001..{patches[k - 1].name[:4]}", patches[:k], "", f"prefix-{k:02d}")
        for k in range(len(patches) if only_full else 1, len(patches) + 1)
    ]
    problems = [] if only_full else manifest_mod.group_problems(manifest)
    failed += [f"groups (none tested): {problem}" for problem in problems]
    for name, numbers, what in [] if only_full or problems else group_plan(manifest):
        chosen = None if numbers is None else [patches[n] for n in numbers]
        sets.append((f"group {name}", chosen, what, f"group-{name}"))
    for label, chosen, what, folder in sets:
        if chosen is None:
            print(f"\n=== {label}: {what}")
            rows.append((label, "-", what, "-"))
            continue
        started = time.monotonic()
        checkout = scratch_root / folder
        shutil.rmtree(checkout, ignore_errors=True)
        start = g.rev(base_mod.clone(repo, checkout), "HEAD")
        prefix, full = label.startswith("prefix"), chosen == patches
        try:
            patchset.am(checkout, chosen)
        except SeriesError as e:
            print(f"{label}: {e}")
            problem = "does not apply"
        else:
            untested = prefix and not patch_tests(checkout, chosen[-1])
            problem = f"{chosen[-1].name} adds or changes no test" if untested else ""
        if problem:
            rows.append((label, "-", problem, "-"))
            failed.append(f"{label}: {problem}")
            continue
        tests = sorted({t for p in chosen for t in patch_tests(checkout, p)})
        if full or not prefix:
            tests += [p for p in manifest.regression_tests.paths if p not in tests]
        files = f"{len(tests)} test file{'s' * (len(tests) != 1)}"
        print(f"\n=== {label}: {what or 'pytest'} on {files}: {' '.join(tests)}", flush=True)
        rc, summary, nodes = run_pytest(checkout, tests, manifest.regression_tests.deselect)
        if rc == 5:
            summary = "no tests collected (pytest exit 5)"
        print(f"=== {label}: {summary} ({time.monotonic() - started:.0f} s)", flush=True)
        if rc != 0:
            failed.append(f"pytest on {label}: " + (", ".join(nodes) or summary))
        lint = "-"
        if full and prefix:
            with tempfile.TemporaryDirectory(prefix="round-trip-") as tmp:
                try:  # the patch files that export of start..HEAD would not reproduce
                    exported = export_mod.format_patches(checkout, start, "HEAD", Path(tmp))
                    again = {f.name: f.read_bytes() for f in exported}
                    differ = [p.name for p in patches if again.pop(p.name, None) != p.read_bytes()]
                    differ += sorted(again)
                except SeriesError as e:
                    differ = [str(e)]
            print(f"\n=== apply/export round trip: {'ok' if not differ else 'DIFFERS'}")
            for line in differ:
                print(f"  not reproduced by export: {line}")
            if differ:
                failed.append("apply/export round trip: not reproduced: " + ", ".join(differ))
            touched = sorted(manifest.base.touched_files)
            py_files = [f for f in touched if f.endswith(".py") and (checkout / f).exists()]
            print(f"\n=== ruff (vLLM config) on {len(py_files)} touched files")
            lint_rc, lint_files = run_ruff(checkout, py_files)
            lint = "ok" if lint_rc == 0 else "FAILED"
            if lint_rc != 0:
                failed.append("ruff (vLLM config): " + (", ".join(lint_files) or "see its output"))
        rows.append((label, len(tests), summary, lint))
    print("\n" + table(("prefix or group", "test files", "pytest", "ruff"), rows))
    for step in failed:
        print(f"{FAILED_STEP}{step}")
    return 1 if failed else 0


def group_plan(manifest: manifest_mod.Manifest) -> list[tuple[str, list[int] | None, str]]:
    """``(name, indexes of the patches to test or None, what they are or why none)``
    per valid group: its dependencies' patches and its own, unless a prefix or
    another group tested that set already, or the group is fork-only."""
    index = {p.file: n for n, p in enumerate(manifest.patches)}
    done = {
        tuple(range(k)): f"prefix 0001..{p.file[:4]}" for k, p in enumerate(manifest.patches, 1)
    }
    plan = []
    for group in manifest.groups:
        numbers = tuple(index[p.file] for p in manifest_mod.group_patches(manifest, group.name))
        if not group.upstream:
            plan.append((group.name, None, "fork-only: not tested on its own"))
        elif numbers in done:
            plan.append((group.name, None, f"same patches as {done[numbers]}, tested: skipped"))
        else:
            done[numbers] = f"group {group.name}"
            files = ", ".join(manifest.patches[n].file[:4] for n in numbers)
            plan.append((group.name, list(numbers), f"patches {files}, pytest"))
    return plan


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "test-series", help="every prefix and upstream group applies and passes its tests"
    )
    p.add_argument("--full-only", action="store_true", help="only the whole series")
    p.set_defaults(func=lambda args: check_prefixes(manifest_mod.load(), only_full=args.full_only))
