"""``staged_folder``: a folder appears whole or not at all, and a writer that loses a race keeps the winner's;
``folder_lock``: one writer at a time, released when its process ends."""

import fcntl
import logging
import subprocess
import sys

import pytest

from lra.data.staging import folder_lock, lock_path, staged_folder


def complete(folder):
    return (folder / "done").is_file()


def test_the_folder_appears_only_when_the_block_ends_and_nothing_else_is_left(tmp_path):
    target = tmp_path / "data" / "set"
    with staged_folder(target, complete=complete) as staging:
        (staging / "done").write_text("mine")
        assert not target.exists() and staging.parent == target.parent
    assert (target / "done").read_text() == "mine"
    assert [path.name for path in target.parent.iterdir()] == ["set"]


def test_a_failing_writer_leaves_nothing(tmp_path):
    target = tmp_path / "set"
    with pytest.raises(RuntimeError, match="interrupted"), staged_folder(target, complete=complete) as staging:
        (staging / "half").write_text("written")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_loses_the_race_keeps_the_winners_complete_folder(tmp_path):
    target = tmp_path / "set"
    with staged_folder(target, complete=complete) as slow:
        (slow / "done").write_text("slow")
        with staged_folder(target, complete=complete) as fast:  # a concurrent run that finishes first
            (fast / "done").write_text("fast")
    assert (target / "done").read_text() == "fast"
    assert [path.name for path in tmp_path.iterdir()] == ["set"]


def test_a_folder_in_the_way_that_is_not_complete_is_an_error(tmp_path):
    target = tmp_path / "set"
    (target / "stray").mkdir(parents=True)
    with pytest.raises(OSError), staged_folder(target, complete=complete) as staging:
        (staging / "done").write_text("mine")
    assert not (target / "done").exists() and [path.name for path in tmp_path.iterdir()] == ["set"]


def test_replace_swaps_an_outdated_folder_for_the_new_one(tmp_path):
    target = tmp_path / "set"
    target.mkdir()
    (target / "old").write_text("outdated")
    with staged_folder(target, complete=complete, replace=True) as staging:
        (staging / "done").write_text("new")
    assert sorted(path.name for path in target.iterdir()) == ["done"]


HOLD_THE_LOCK = """
import sys, time
from lra.data.staging import folder_lock
with folder_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def lock_is_free(folder):
    with open(lock_path(folder), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True


def test_the_folder_lock_is_held_by_one_process_and_dies_with_it(tmp_path, caplog):
    target = tmp_path / "set"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        assert not lock_is_free(target)
        assert f"process {holder.pid}" in lock_path(target).read_text()
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the OS drops the lock
        holder.wait()
    with caplog.at_level(logging.INFO, logger="lra.data.staging"), folder_lock(target):
        assert not lock_is_free(target)
    assert "Waiting" not in caplog.text and lock_is_free(target)
