"""Handlers of the stopping signals (SIGINT, SIGTERM) that stay in the process that installed them.

A process forked while one is installed (a data generator's multiprocessing pool, a data-loader worker) must take
these signals as it would have without it: a pool's ``terminate()`` SIGTERMs its workers and waits for them to die.
Inheriting the handler, a worker instead stopped "between steps" of a training it does not run, or ignored the signal
(the campaign's handler only takes note), and the pool waited forever. Resetting the handler in the child is not
enough: CPython clears the flags of caught signals after a fork (issue9535), so a signal that lands before the child's
interpreter is ready is lost, and a pool terminated a moment after it forked a worker hung (CI did, twice). So while
one of these handlers is installed, the signals it takes are blocked across every ``os.fork`` (multiprocessing's
included); in the child they come back, still pending if one was sent, once the handlers that were there before are.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from typing import Any

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, Any], Any]
# By signal, the handlers installed by take() in this process and each one's predecessor, innermost last.
_taken: dict[int, list[tuple[Handler, Any]]] = {}
_mask_before_fork: set[int] = set()


def take(handler: Handler, signals: Iterable[int] = STOPPING_SIGNALS) -> dict[int, Any]:
    """Install ``handler`` for ``signals`` in this process (main thread only, as :func:`signal.signal`); processes
    forked from now on start with the handlers installed before. Returns those, for :func:`give_back`."""
    previous = {}
    for number in signals:
        previous[number] = signal.signal(number, handler)
        _taken.setdefault(number, []).append((handler, previous[number]))
    return previous


def give_back(handler: Handler, previous: dict[int, Any]) -> None:
    """Undo :func:`take`: ``previous`` (what it returned) become the handlers again."""
    for number, before in previous.items():
        signal.signal(number, signal.SIG_DFL if before is None else before)
        _taken[number].remove((handler, before))
        if not _taken[number]:
            del _taken[number]


def _block_over_fork() -> None:
    global _mask_before_fork
    if _taken:
        _mask_before_fork = signal.pthread_sigmask(signal.SIG_BLOCK, list(_taken))


def _unblock_in_parent() -> None:
    if _taken:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork)


def _unblock_in_child() -> None:
    if not _taken:
        return
    for number, stack in _taken.items():
        current = signal.getsignal(number)
        if any(current == handler for handler, _ in stack):  # not where another (Lightning's) has replaced ours since
            first = stack[0][1]
            signal.signal(number, signal.SIG_DFL if first is None else first)
    _taken.clear()
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(before=_block_over_fork, after_in_parent=_unblock_in_parent, after_in_child=_unblock_in_child)
