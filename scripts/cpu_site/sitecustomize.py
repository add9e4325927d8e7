"""Imported at start-up by every Python process of the vLLM-side test runs on
CPU (``seriestest.pytest_command`` puts this folder on their ``PYTHONPATH``:
pytest, and the processes the tests spawn): vLLM's CPU platform configures on
x86 without Triton.

Since vLLM 0.34.0, ``CpuPlatform.check_and_update_config`` refuses to configure
on x86 without Triton ("vLLM on x86 CPUs requires Triton (triton-cpu).").
vLLM's requirements/cpu.txt takes triton-cpu from a URL outside PyPI, so every
test that builds a ``VllmConfig`` here would error.  The tests of the series
build configs and models and run no Triton kernel: once ``vllm.platforms.cpu``
is imported, that method is wrapped so that ``vllm.triton_utils.HAS_TRITON``
reads True while it runs, and only then; every other reader of ``HAS_TRITON``
still sees no Triton.  It affects only these CPU test runs: it is no patch of
the series and is not in the wheel.  A base whose method lacks the check
(0.33.0) is left as it is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

REFUSAL = "vLLM on x86 CPUs requires Triton (triton-cpu)."


def configure_without_triton(platform) -> None:
    """Wrap ``platform.check_and_update_config`` if it makes the Triton check."""
    check = platform.check_and_update_config.__func__
    if REFUSAL not in check.__code__.co_consts:
        return

    @functools.wraps(check)
    def check_and_update_config(cls, vllm_config) -> None:
        import vllm.triton_utils as triton_utils

        has_triton, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = has_triton

    platform.check_and_update_config = classmethod(check_and_update_config)


class CpuPlatformImport(importlib.abc.MetaPathFinder):
    """Finds ``vllm.platforms.cpu`` as usual, then wraps its platform once loaded."""

    def find_spec(self, name, path, target=None):
        if name != "vllm.platforms.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            configure_without_triton(module.CpuPlatform)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, CpuPlatformImport())
