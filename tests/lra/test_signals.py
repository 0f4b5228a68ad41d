"""lra.signals: a stopping handler stays in the process that installed it; forked processes take the signals as they
would have without it, including one sent at the very moment of the fork."""

import os
import signal
import subprocess
import sys

import pytest

from lra import signals

TIMEOUT_S = 180  # each script runs in a fresh interpreter: a hang is a failure, not a stuck CI

# One CPU for both: the parent goes on after fork() and signals the child before it has run a single instruction.
SIGNALLED_AT_BIRTH = """
import os, signal, sys, time
from lra import signals

os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
noted = []
previous = signals.take(lambda number, frame: noted.append(number))
lost = []
for _ in range(10):
    child = os.fork()
    if child == 0:
        time.sleep(1)
        os._exit(7)  # only if the signal was lost or taken by the parent's handler
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != -signal.SIGTERM:
        lost.append(os.waitstatus_to_exitcode(status))
assert not lost, f"SIGTERMs sent at a fork lost or taken by the parent's handler (exit codes): {lost}"
os.kill(os.getpid(), signal.SIGTERM)
assert noted == [signal.SIGTERM], f"the parent's own handler still takes its signals: {noted}"
assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}, "the signals stay blocked"
"""

# A data generator's pool forked while a stopping handler is installed: the training's (the datamodule generates on
# first use, inside fit) or the campaign's, which only takes note of a stop (a worker that inherited it outlived the
# pool's terminate()). Its workers, and a process forked after it, die of SIGTERM as with the default handler.
FORKED_WORKERS = """
import multiprocessing, os, signal, sys, tempfile
from lra import callbacks, campaign

def wait_for_a_signal(ready):
    ready.set()
    signal.pause()

fork = multiprocessing.get_context("fork")
{install}
with fork.Pool(2) as pool:
    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
ready = fork.Event()
worker = fork.Process(target=wait_for_a_signal, args=(ready,), daemon=True)
worker.start()
try:
    assert ready.wait(timeout=60)
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(timeout=60)
finally:
    worker.kill()
assert worker.exitcode == -signal.SIGTERM, f"a forked worker dies of SIGTERM as with the default handler: {{worker.exitcode}}"
{then}
"""
INSTALLS = {
    "training": (
        "stopper = callbacks.CheckpointOnInterrupt(tempfile.mkdtemp())\n"
        "handling = stopper.stop_between_steps()\n"
        "handling.__enter__()",
        "assert stopper.stop_requested is None, 'a signal to a worker never reaches the training'\n"
        "assert signal.getsignal(signal.SIGTERM) == stopper._on_signal, 'still installed here'",
    ),
    "campaign": (
        "stopping = campaign.Stopping()",
        "assert stopping.why is None, 'a signal to a worker never reaches the campaign'\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stopping.why == 'signal SIGTERM', stopping.why",
    ),
}


def run_fresh(script: str) -> None:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_a_sigterm_sent_to_a_child_forked_a_moment_before_is_never_lost():
    """A pool's terminate() can SIGTERM a worker forked a moment before. Given a Python handler, CPython drops a signal
    that lands before the child's interpreter is ready (it clears caught signals' flags after fork), and terminate()
    then waited forever on a worker that never died (CI hung twice); held back over the fork, every such SIGTERM kills
    the child, as the default handler would. (SIGINT's default is itself a Python handler, which CPython's fork can lose
    in any program: the child gets it back, and nothing more is promised.)"""
    run_fresh(SIGNALLED_AT_BIRTH)


@pytest.mark.parametrize("handler", sorted(INSTALLS))
def test_a_pool_forked_under_a_stopping_handler_ends_and_its_workers_die_of_sigterm(handler):
    install, then = INSTALLS[handler]
    run_fresh(FORKED_WORKERS.format(install=install, then=then))


def test_give_back_restores_the_handlers_of_before_innermost_first():
    def outer(number, frame):
        pass

    def inner(number, frame):
        pass

    before = signal.getsignal(signal.SIGTERM)
    outer_previous = signals.take(outer, [signal.SIGTERM])
    inner_previous = signals.take(inner, [signal.SIGTERM])
    try:
        assert signal.getsignal(signal.SIGTERM) is inner
    finally:
        signals.give_back(inner, inner_previous)
        assert signal.getsignal(signal.SIGTERM) is outer
        signals.give_back(outer, outer_previous)
    assert signal.getsignal(signal.SIGTERM) == before
    assert signal.SIGTERM not in signals._taken
