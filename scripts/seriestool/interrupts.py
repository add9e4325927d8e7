"""SIGINT, SIGTERM and SIGHUP, acted on at safe points only: while
``deferred()`` is active, the next git call raises ``Interrupted``.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import TypeVar

from .errors import SeriesError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
T = TypeVar("T")

_pending: list[int] = []
_shield_depth = 0
_child: subprocess.Popen | None = None


class Interrupted(SeriesError):
    """The user interrupted the command; raised at a safe point."""

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}", exit_code=128 + signum)


def _record(signum, _frame) -> None:
    _pending.append(signum)
    if _child is not None and _child.poll() is None:
        _child.send_signal(signum)


class Guard(contextlib.ExitStack):
    """Handed out by ``deferred()``, holding context managers (a checkout's lock)
    until the block ends; ``completed()`` marks the point after which the
    command's work stands (a signal then no longer undoes it)."""

    done = False

    def completed(self) -> None:
        if not self.done:
            self.done = True
            # Until the block ends: reports and cleanup run to the end.
            self.enter_context(shielded())


@contextlib.contextmanager
def deferred() -> Iterator[Guard]:
    """Record signals instead of dying; raise ``Interrupted`` at safe points and,
    on leaving, for a signal still pending (unless the block raised or was
    ``completed()``).  One per command: no command runs another's."""
    guard = Guard()
    _pending.clear()
    previous = {s: signal.signal(s, _record) for s in SIGNALS}
    try:
        yield guard
        if not guard.done:
            check()
    except SeriesError as e:
        # A program that died of the same Ctrl-C (pip, pytest) is not the news.
        if _pending and not isinstance(e, Interrupted):
            raise Interrupted(_pending[0]) from e
        raise
    finally:
        guard.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


def deferring(func: Callable[..., T]) -> Callable[..., T]:
    """``func`` run inside ``deferred()``, given its guard as ``guard=``."""

    @functools.wraps(func)
    def run_deferred(*args, **kwargs) -> T:
        with deferred() as guard:
            return func(*args, guard=guard, **kwargs)

    return run_deferred


def pending() -> int | None:
    """The first signal received and not yet acted on, if any."""
    return _pending[0] if _pending else None


def check() -> None:
    """Raise ``Interrupted`` when a signal is pending (not while shielded)."""
    if _pending and _shield_depth == 0:
        raise Interrupted(_pending[0])


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run undo work to its end, whatever signals arrive meanwhile."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1


def run(cmd, echo: Callable[[str], None] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run``, its output captured, whose child also receives a
    deferred signal.  With ``echo`` (and ``text=True``), each line of its output,
    stderr included, is passed to ``echo`` as it comes, and returned as ``stdout``."""
    global _child
    check()
    kwargs.pop("capture_output", None)  # every caller captures: always done
    stderr = subprocess.STDOUT if echo else subprocess.PIPE
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, **kwargs) as proc:
        _child = proc
        try:
            streamed = [echo(line) or line for line in proc.stdout] if echo else []
            stdout, stderr = proc.communicate()
        finally:
            _child = None
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(streamed) or stdout, stderr)
