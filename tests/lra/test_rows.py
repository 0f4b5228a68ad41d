"""lra.rows: the one store of measurement rows, read typed, merged by key, written whole, and their figures."""

import errno
import os

import pytest

from lra import rows as store
from lra.files import DiskFull


def test_rows_read_back_typed_and_a_column_an_older_file_lacks_is_empty(tmp_path):
    path = tmp_path / "deep" / "bench.csv"
    store.write_rows([{"method": "yoso", "n": 1024, "ms": 3.5}, {"method": "sdpa", "n": 1024}], path, ["method", "n", "ms"])
    assert path.read_text() == "method,n,ms\nyoso,1024,3.5\nsdpa,1024,\n"
    assert store.read_rows(path) == [{"method": "yoso", "n": "1024", "ms": "3.5"}, {"method": "sdpa", "n": "1024", "ms": ""}]
    typed = store.read_rows(path, {"n": int, "ms": float, "noisy": lambda text: text == "True"})
    assert typed == [
        {"method": "yoso", "n": 1024, "ms": 3.5, "noisy": ""},
        {"method": "sdpa", "n": 1024, "ms": "", "noisy": ""},
    ]
    assert store.read_rows(tmp_path / "missing.csv") == []
    with pytest.raises(ValueError, match="not in fieldnames"):
        store.write_rows([{"method": "x", "extra": 1}], path, ["method"])


def test_a_new_measurement_replaces_the_earlier_one_of_its_key_in_place_and_keeps_the_others():
    old = [{"device": "cpu", "n": "512", "ms": "1"}, {"device": "cpu", "n": "1024", "ms": "2"}, {"device": "cuda", "n": "512"}]
    new = [{"device": "cpu", "n": 1024, "ms": 9}, {"device": "cpu", "n": 2048, "ms": 4}]
    assert store.merge_rows(old, new, ["device", "n"]) == [old[0], new[0], old[2], new[1]]
    assert store.merge_rows([], new, ["device"]) == [new[1]], "two new rows of one key: the later one"


def test_a_full_disk_leaves_the_earlier_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "bench.csv"
    store.write_rows([{"a": 1}], path, ["a"])

    def full(fd):  # a disk that takes the bytes into its cache and refuses them at the flush
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as disk:
        disk.setattr(os, "fsync", full)
        with pytest.raises(DiskFull):
            store.write_rows([{"a": 2}] * 1000, path, ["a"])
    assert path.read_text() == "a\n1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv"]


def test_the_same_figure_twice_is_the_same_bytes(tmp_path):
    plt = store.pyplot()
    open_before = plt.get_fignums()
    for name in ("a.png", "b.png"):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        store.save_figure(fig, tmp_path / name)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert plt.get_fignums() == open_before, "closed"
