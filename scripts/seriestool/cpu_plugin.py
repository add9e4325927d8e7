"""A pytest plugin for the vLLM-side tests on CPU, which ``seriestest.run_pytest``
(``make test-series``, ``make smoke``) loads with ``-p``: vLLM's CPU platform
configures on x86 without Triton.

Since vLLM 0.34.0, ``CpuPlatform.check_and_update_config`` refuses to configure
on x86 without Triton ("vLLM on x86 CPUs requires Triton (triton-cpu).").
vLLM's requirements/cpu.txt takes triton-cpu from a URL outside PyPI, so every
test that builds a ``VllmConfig`` here would error.  The tests of the series
build configs and models and run no Triton kernel: while that method runs,
``vllm.triton_utils.HAS_TRITON`` reads True, so its check passes, and every
other reader of ``HAS_TRITON`` still sees no Triton.  It affects only these
CPU test runs: it is no patch of the series and is not in the wheel.  A base
whose method lacks the check (0.33.0) is left as it is.
"""

from __future__ import annotations

import functools

REFUSAL = "vLLM on x86 CPUs requires Triton (triton-cpu)."


def pytest_configure(config) -> None:
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:  # not a vLLM tree
        return
    check = CpuPlatform.check_and_update_config.__func__
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

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
