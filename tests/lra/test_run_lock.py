"""``lra.run_lock``: one process per run folder, decided by a lock that dies with its holder, not by a file."""

import errno
import fcntl
import multiprocessing
import os
import socket

import pytest

from lra import run_lock


def test_a_held_folder_is_refused_with_its_holder_named_and_free_again_once_released(tmp_path):
    with run_lock.held(tmp_path / "run"):
        holder = run_lock.holder(tmp_path / "run")
        assert holder.startswith(f"pid {os.getpid()} on {socket.gethostname()} since ")
        # Another open of the file is another lock, as a second process's would be.
        with pytest.raises(run_lock.RunFolderBusy, match=rf"^{tmp_path / 'run'} is in use by another run \(pid {os.getpid()} on"):
            with run_lock.held(tmp_path / "run"):
                pass
    assert (tmp_path / "run" / run_lock.LOCK_FILE).is_file() and run_lock.holder(tmp_path / "run") is None
    with run_lock.held(tmp_path / "run"):  # the file left behind does not block
        pass


def sleep_until_told(ready, done):
    ready.set()
    done.wait(30)


def test_a_process_forked_while_the_folder_is_held_does_not_keep_it_held(tmp_path):
    """A data loader's worker or a generator's pool, forked during training, outlived a killed run in such a case."""
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    with run_lock.held(tmp_path):
        child = context.Process(target=sleep_until_told, args=(ready, done))
        child.start()
        assert ready.wait(30)
    try:
        assert child.is_alive() and run_lock.holder(tmp_path) is None
    finally:
        done.set()
        child.join(30)


def test_a_filesystem_without_locks_is_one_clear_message(tmp_path, monkeypatch):
    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(run_lock.RunFolderBusy, match=r"cannot be locked .*on a filesystem with flock"):
        with run_lock.held(tmp_path):
            pass
