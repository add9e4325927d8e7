"""``test-series`` fails loudly: a prefix without tests, a test file that
collects nothing (pytest exit 5), a failing test, a patch that does not apply.
It says as it goes what runs and how long it took, and why a test is
deselected; vLLM's CPU platform configures without Triton in its test runs."""

from __future__ import annotations

import re

import pytest
from seriestool import base as base_mod
from seriestool import seriestest


@pytest.fixture
def toy_base(toy_series, monkeypatch, tmp_path):
    repo, manifest, patch_dir = toy_series
    bare = tmp_path / "base.git"
    repo.git("clone", "-q", "--bare", str(repo.path), str(bare))
    repo.git("--git-dir", str(bare), "branch", "base", "main")
    monkeypatch.setattr(base_mod, "WORK_DIR", tmp_path / "work")
    monkeypatch.setattr(base_mod, "materialise", lambda *a, **k: (bare, manifest.base.commit, ""))
    return manifest, patch_dir


def _rewrite(patch_dir, entry, old, new):
    path = patch_dir / entry.file
    path.write_text(path.read_text().replace(old, new))


def test_every_prefix_passes(toy_base, capsys):
    manifest, patch_dir = toy_base
    assert seriestest.check_prefixes(manifest, patch_dir) == 0
    out = capsys.readouterr().out
    # Prefix 1 runs only patch 1's test; prefix 2 runs both.
    assert "prefix 0001..0001: pytest on 1 test file: tests/test_first.py\n" in out
    assert (
        "prefix 0001..0002: pytest on 2 test files: tests/test_first.py tests/test_second.py\n"
        in out
    )
    assert "2 passed" in out
    assert "apply/export round trip: ok" in out


def test_each_prefix_says_as_it_goes_what_runs_and_how_long_it_took(toy_base, capsys):
    manifest, patch_dir = toy_base
    assert seriestest.check_prefixes(manifest, patch_dir) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("=== prefix 0001..0002: pytest on 2 test files: tests/test_first.py"
                        " tests/test_second.py")  # fmt: skip
    end = next(
        n for n, line in enumerate(lines) if line.startswith("=== prefix 0001..0002: 2 passed")
    )
    assert re.fullmatch(r"=== prefix 0001..0002: 2 passed in [0-9.]+s \(\d+ s\)", lines[end])
    # pytest's own progress between them: a line per test file.
    progress = [line.split()[0] for line in lines[start:end] if line.startswith("tests/")]
    assert progress == ["tests/test_first.py", "tests/test_second.py"]


def test_deselected_tests_are_named_with_their_reason(toy_base, capsys):
    """An entry is a node id prefix: one name deselects every test it begins,
    as ``test_kda_online_loading`` does each parametrized case of
    ``test_kda_online_loading_releases_sources_and_zeros_padding``."""
    manifest, patch_dir = toy_base
    manifest.regression_tests.deselect = {"tests/test_second.py::test_sec": "needs CUDA"}
    assert seriestest.check_prefixes(manifest, patch_dir) == 0
    out = capsys.readouterr().out
    assert "deselected tests/test_second.py::test_sec*: needs CUDA\n" in out
    assert "1 passed, 1 deselected" in out


def test_failing_test_fails_the_series(toy_base, capsys):
    manifest, patch_dir = toy_base
    _rewrite(patch_dir, manifest.patches[1], "+    assert True", "+    assert False")
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "1 failed" in capsys.readouterr().out


def test_failed_steps_name_the_failing_tests_and_files(toy_base, capsys):
    manifest, patch_dir = toy_base
    _rewrite(patch_dir, manifest.patches[1], "+    assert True", "+    assert False")
    _rewrite(patch_dir, manifest.patches[1], "+    return x + 0", "+    return x+0")
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    steps = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("failed step")
    ]
    assert "failed step: pytest on prefix 0001..0002: tests/test_second.py::test_second" in steps
    assert "failed step: ruff (vLLM config): pkg/loader.py" in steps


def test_no_tests_collected_is_a_failure(toy_base, capsys):
    manifest, patch_dir = toy_base
    _rewrite(patch_dir, manifest.patches[0], "+def test_first():", "+def helper_first():")
    _rewrite(patch_dir, manifest.patches[1], "+def test_second():", "+def helper_second():")
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "no tests collected (pytest exit 5)" in capsys.readouterr().out


def test_patch_without_tests_fails(toy_series, toy_base, capsys):
    repo, _, _ = toy_series
    manifest, patch_dir = toy_base
    # Re-export the series with patch 2's test moved into patch 1.
    from seriestool import export as export_mod

    base = manifest.base.commit
    repo.git("checkout", "-q", "-b", "moved", base)
    repo.commit("[Loader] first change", {
        "pkg/loader.py": "def load(x):\n    # first\n    return x\n",
        "tests/test_first.py": "def test_first():\n    assert True\n",
        "tests/test_second.py": "def test_second():\n    assert True\n",
    })  # fmt: skip
    repo.commit("[Loader] second change", {
        "pkg/loader.py": "def load(x):\n    # first\n    return x + 0\n",
    })  # fmt: skip
    export_mod.export_series(
        repo.path, manifest, "moved", base, patch_dir=patch_dir,
        manifest_path=patch_dir / "series.json", log=lambda *_: None,
    )  # fmt: skip
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "adds or changes no test" in capsys.readouterr().out


def test_patch_that_does_not_apply_fails(toy_base, capsys):
    manifest, patch_dir = toy_base
    _rewrite(patch_dir, manifest.patches[1], " def load(x):", " def load(y):")
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    assert "does not apply" in capsys.readouterr().out


def test_message_cut_by_git_am_fails_the_round_trip(toy_base, capsys):
    manifest, patch_dir = toy_base
    # A Markdown underline in the message: git am ends the message there, so
    # the series cannot be re-exported as it is (the patch ID is unchanged).
    _rewrite(patch_dir, manifest.patches[0], "Body of the first patch.",
             "Body of the first patch.\n\nWhy\n---\nThe reason.")  # fmt: skip
    assert seriestest.check_prefixes(manifest, patch_dir) == 1
    out = capsys.readouterr().out
    assert "apply/export round trip: DIFFERS" in out
    assert f"not reproduced by export: {manifest.patches[0].file}" in out


def test_smoke_picks_each_patch_a_test_of_its_own(tmp_path):
    """A patch that adds a test to a file an earlier patch added gets that test,
    not the earlier patch's; one adding none shares, and says so."""
    from seriestool import smoke

    patches = []
    for name, added in (("0001-a.patch", "test_first"), ("0002-b.patch", "test_second"),
                        ("0003-c.patch", None)):  # fmt: skip
        patch = tmp_path / name
        patch.write_text("+++ b/tests/test_x.py\n" + (f"+def {added}():\n" if added else " x\n"))
        patches.append(patch)
    nodes = {"tests/test_x.py": ["tests/test_x.py::test_first", "tests/test_x.py::test_second"]}
    files = [["tests/test_x.py"]] * 3
    assert smoke.pick(patches, files, nodes) == [
        "tests/test_x.py::test_first", "tests/test_x.py::test_second",
        "tests/test_x.py::test_first",
    ]  # fmt: skip


# A vLLM tree in miniature: the CPU platform as in 0.34.0, which refuses x86
# without Triton, or (``REFUSAL`` left out) as in 0.33.0, which has no such check.
CPU_PLATFORM = """
class CpuPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        from vllm.triton_utils import HAS_TRITON
REFUSAL
        vllm_config.append(HAS_TRITON)
"""
REFUSAL = """
        if not HAS_TRITON:
            raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")
"""
TEST_CONFIG = """
import subprocess
import sys

import vllm.triton_utils
from vllm.platforms.cpu import CpuPlatform

CHECK = "from vllm.platforms.cpu import CpuPlatform as P; s = []; P.check_and_update_config(s)"


def test_config():
    seen = []
    CpuPlatform.check_and_update_config(seen)
    assert seen == [REFUSES] and vllm.triton_utils.HAS_TRITON is False


def test_config_in_a_process_the_test_starts():
    child = subprocess.run([sys.executable, "-c", CHECK + "; print(s)"], capture_output=True,
                           text=True)
    assert child.stdout == f"[{REFUSES}]\\n", child.stderr
"""


@pytest.mark.parametrize("refuses", [True, False])
def test_vllm_cpu_platform_configures_without_triton_in_test_runs_only(tmp_path, refuses):
    """While the platform's own check runs, and only then, Triton reads as
    present, in pytest and in the processes a test starts; a platform without
    the check is left as it is."""
    for path, text in {
        "vllm/__init__.py": "",
        "vllm/platforms/__init__.py": "",
        "vllm/platforms/cpu.py": CPU_PLATFORM.replace("REFUSAL\n", REFUSAL if refuses else ""),
        "vllm/triton_utils/__init__.py": "HAS_TRITON = False\n",
        "tests/test_config.py": f"REFUSES = {refuses}\n{TEST_CONFIG}",
    }.items():  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    rc, summary, failed = seriestest.run_pytest(tmp_path, ["tests/test_config.py"], {})
    assert (rc, failed) == (0, []), summary
