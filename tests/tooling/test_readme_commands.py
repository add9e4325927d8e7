"""The README's command blocks against the Makefile: every ```sh line is a
make target with variables the Makefile reads, or a command listed here as
run by hand (GPU-only, or git in a checkout, whose recipe other tests run)."""

from __future__ import annotations

import re
import shlex
import subprocess

from conftest import ROOT

# Lines that are not make commands, each with why no test runs it here.
BY_HAND = {
    "vllm serve": "GPU-only: serving a model",
    "git rebase --exec": "re-signing in the user's checkout, with the user's identity",
    "git -C work/vllm commit": "editing the series branch: the user's own commit",
    "git -C work/rebase/": "resolving a rebase conflict by hand",
    "git add patches SERIES.md": "committing the rebased series in this repository",
    "git commit -m": "committing the rebased series in this repository",
    "python3 -c 'import json,struct": "a checkpoint's largest tensors: test_wheel.py runs it",
    # The quick start: test_the_quick_start_installs_what_make_wheel_writes.
    "pip install --dry-run work/wheel/": "what installing the patched wheel would change",
    "pip install work/wheel/": "installing the patched wheel where vLLM is",
    "pip show vllm": "checking the installed vLLM",
    "pip check": "checking the installed vLLM's dependencies",
    "docker build -t vllm-instanttensor": "the container recipe",
    "FROM vllm/vllm-openai:": "the container recipe's Dockerfile",
    "COPY vllm-*.whl": "the container recipe's Dockerfile",
    "RUN python3 -m pip install": "the container recipe's Dockerfile",
    "python3 -m pip check": "the container recipe's Dockerfile",
    "EOF": "the container recipe's Dockerfile",
    "docker run --gpus all": "GPU-only: serving a model",
    # The GPU qualification, on the user's own GPU machine.
    "rsync -aR scripts/device .device": "copying the bundle to the GPU machine",
    "ssh gpu-host": "GPU-only: the qualification",
    "OUT=$PWD/evidence": "the rest of an ssh line: GPU-only",
    "rsync -a gpu-host:": "copying the evidence back",
}
GPU_ONLY_TARGETS = {"device-bundle"}  # its block's other lines are device-tool calls (comments)


def _blocks() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [[line.split("#", 1)[0].strip() for line in b.splitlines()] for b in blocks]


def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", text, re.M))
    variables = set(re.findall(r"^([A-Z]+) \?=", text, re.M))
    return targets, variables


def test_every_readme_command_is_a_make_target_or_listed_by_hand():
    targets, variables = _makefile()
    seen = set()
    for block in _blocks():
        for line in filter(None, block):
            for command in line.split("&&"):
                if not command.strip().startswith("make"):
                    assert any(command.strip().startswith(k) for k in BY_HAND), command
                    continue
                words = shlex.split(command.strip())
                target = next((w for w in words[1:] if "=" not in w), "help")
                assert target in targets, line
                for word in words[1:]:
                    if "=" in word:
                        assert word.split("=", 1)[0] in variables, line
                seen.add(target)
    assert {"apply", "smoke", "test", "status", "remove", "export"} <= seen
    assert seen >= GPU_ONLY_TARGETS


def test_a_bare_make_lists_every_target():
    done = subprocess.run(["make", "-s", "-C", str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^make ([\w-]+)", done.stdout, re.M))
    targets, _ = _makefile()
    assert listed == targets - {"help"}
    assert ".venv" not in done.stderr  # nothing built


def test_the_quick_start_installs_what_make_wheel_writes():
    """The quick start's paths, versions and options are those of the code."""
    import fnmatch

    from seriestool import manifest as manifest_mod
    from seriestool import wheel

    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    manifest = manifest_mod.load()
    version = manifest.base.version
    built = wheel.local_version(version, manifest.version, manifest.patch_paths())
    built = f"vllm-{built}-cp38-abi3-{wheel.PLATFORM}.whl"
    assert wheel.OUT_DIR == ROOT / "work" / "wheel"
    installs = re.findall(r"pip install (.*)", quick)
    words = [w.strip("`().,;") for line in installs for w in line.split()]
    wheels = [w for w in words if w.endswith(".whl")]
    assert len(wheels) == 4
    for path in wheels:  # as the recipe runs it: from this folder, or in work/wheel
        assert fnmatch.fnmatch(f"work/wheel/{built}", path) or fnmatch.fnmatch(
            f"/tmp/{built}", path
        )
    # Installed as the release itself, with its dependencies: never --no-deps.
    assert not [line for line in installs if ".whl" in line and "--no-deps" in line]
    assert f"--force-reinstall --no-deps vllm=={version}`" in " ".join(quick.split())
    assert f"FROM vllm/vllm-openai:v{version}\n" in quick and "-f - work/wheel <<'EOF'" in quick
    assert f"`{version}+{wheel.LOCAL_LABEL}.v<N>.<hash>`" in quick
    # Every option the README names is one the patches define.
    patches = "".join(p.read_text() for p in (ROOT / "patches").glob("*.patch"))
    for key in set(re.findall(r"\b(instanttensor_[a-z_]+|INSTANTTENSOR_[A-Z_]+)", text)):
        assert key in patches, key


def test_the_readme_stays_short():
    """At most 250 lines, read through by a new user; the details are under docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
