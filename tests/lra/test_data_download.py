"""``python -m lra.data download``: a real HTTP server on 127.0.0.1 (with Range support) serves small
archives in the official layouts; nothing else on the network is touched (see ``loopback_only``)."""

import dataclasses
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
import types

import numpy as np
import pytest
from PIL import Image
from test_data_cache import write_listops_release
from test_task_readers import random_batch, write_aan, write_batch, write_imdb, write_pathfinder

from lra.data import cache, download, image, listops, pathfinder, retrieval, text
from lra.data.__main__ import main, task_data_config
from lra.data.records import DamagedData
from lra.data.tasks import load_task, prepare_task, resolve

RELEASE = "lra_release.gz"
IMDB = "aclImdb_v1.tar.gz"
CIFAR = "cifar-10-python.tar.gz"


# ------------------------------------------------------------------------------------- archives


def write_pathx(root, rng, count=10, side=128):
    """A Path-X difficulty folder: ``count`` random 128x128 images listed in metadata/0.npy."""
    (root / "metadata").mkdir(parents=True)
    (root / "imgs" / "0").mkdir(parents=True)
    lines = []
    for i in range(count):
        pixels = rng.integers(0, 256, size=(side, side), dtype=np.uint8)
        Image.fromarray(pixels, mode="L").save(root / f"imgs/0/sample_{i}.png")
        lines.append(f"imgs/0 sample_{i}.png {i} {i % 2} 1 14\n")
    (root / "metadata" / "0.npy").write_text("".join(lines))


def write_cifar(folder, rng):
    folder.mkdir(parents=True)
    for name in (*image.TRAIN_FILES, image.TEST_FILE):
        write_batch(folder / name, *random_batch(rng, 2))
    (folder / "batches.meta").write_bytes(b"not needed")


def tar_gz(root, *entries):
    """The tar.gz of the folders ``entries`` (paths relative to ``root``), as bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in entries:
            tar.add(root / entry, arcname=entry)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """The three archives in the official layouts, and the folders they were made from."""
    root = tmp_path_factory.mktemp("official")
    rng = np.random.default_rng(0)
    release = root / "lra_release" / "lra_release"
    write_listops_release(release / "listops-1000")
    write_aan(release / "tsv_data")
    write_pathfinder(release / "pathfinder32" / "curv_contour_length_14", rng)
    write_pathfinder(release / "pathfinder32" / "curv_baseline", rng)  # another level: never unpacked
    write_pathx(release / "pathfinder128" / "curv_contour_length_14", rng)
    write_imdb(root / "aclImdb")
    write_cifar(root / "cifar-10-batches-py", rng)
    folders = {
        "listops": release / "listops-1000",
        "retrieval": release / "tsv_data",
        "pathfinder": release / "pathfinder32" / "curv_contour_length_14",
        "pathx": release / "pathfinder128" / "curv_contour_length_14",
        "text": root / "aclImdb",
        "image": root / "cifar-10-batches-py",
    }
    files = {RELEASE: tar_gz(root, "lra_release"), IMDB: tar_gz(root, "aclImdb"), CIFAR: tar_gz(root, "cifar-10-batches-py")}
    return files, folders


@pytest.fixture
def published(monkeypatch, official):
    """The published MD5s and size replaced by the test archives' own."""
    files, _ = official
    for source, name in (("imdb", IMDB), ("cifar10", CIFAR)):
        md5 = hashlib.md5(files[name]).hexdigest()
        archive = download.ARCHIVES[source]
        size = len(files[name]) if archive.num_bytes else None
        monkeypatch.setitem(download.ARCHIVES, source, dataclasses.replace(archive, md5=md5, num_bytes=size))


# ------------------------------------------------------------------------------- loopback mirror


class MirrorHandler(http.server.BaseHTTPRequestHandler):
    """GET /<file> with ``Range: bytes=<start>-`` support; the server's settings inject failures."""

    def do_GET(self):
        server = self.server
        name = self.path.lstrip("/")
        range_header = self.headers.get("Range")
        server.requests.append((name, range_header))
        if name in server.status:
            self.send_error(server.status[name])
            return
        if name not in server.files:
            self.send_error(404)
            return
        data = server.files[name]
        start = 0
        if range_header and server.ranges:
            start = int(re.fullmatch(r"bytes=(\d+)-", range_header).group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        drop_after = server.drop_after.get(name)
        if drop_after is not None and server.drops.get(name, 0) > 0:
            server.drops[name] -= 1
            self.wfile.write(body[:drop_after])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(official):
    """The official archives served under http://127.0.0.1:<port>/mirror/<file name>."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MirrorHandler)
    server.files = {f"mirror/{name}": data for name, data in official[0].items()}
    server.status = {}  # file -> HTTP status to answer instead
    server.drop_after, server.drops = {}, {}  # file -> bytes sent before dropping, and how many times
    server.requests = []  # (file, Range header) per request
    server.ranges = True  # False: ignore Range and send the whole file
    server.url = f"http://127.0.0.1:{server.server_address[1]}/mirror"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


PROXIES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Any connection to a host other than 127.0.0.1 fails the test; proxies are off."""
    connect = socket.create_connection

    def guarded(address, *args, **kwargs):
        assert address[0] == "127.0.0.1", f"a test tried to reach {address}"
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", guarded)
    for name in (*PROXIES, download.BASE_URL_ENV):
        monkeypatch.delenv(name, raising=False)


def run(tmp_path, mirror, *args):
    """``python -m lra.data download ARGS`` in this process; returns the error message or None."""
    try:
        main(["download", *args, "--dest", str(tmp_path / "data"), "--base-url", mirror.url])
    except SystemExit as exit:
        return str(exit.code)
    return None


def requested(mirror, name):
    return [range_header for file, range_header in mirror.requests if file == f"mirror/{name}"]


def unpacked_or_prepared(tmp_path):
    """Everything under the data folder but the downloads: empty after a failure."""
    data = tmp_path / "data"
    return sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.relative_to(data).parts[0] != "downloads")


# ---------------------------------------------------------------------------------- end to end


READERS = {
    "listops": listops,
    "retrieval": retrieval,
    "pathfinder": pathfinder,
    "pathx": pathfinder,
    "text": text,
    "image": image,
}
SEQ_LEN = {"listops": 2048, "retrieval": 4096, "pathfinder": 1024, "pathx": 16384, "text": 4096, "image": 1024}


def test_download_all_fetches_each_archive_once_and_training_reads_the_official_files(tmp_path, mirror, official, published):
    files, folders = official
    assert run(tmp_path, mirror, "all") is None
    assert [file for file, _ in mirror.requests] == [f"mirror/{name}" for name in (IMDB, CIFAR, RELEASE)]
    for task, source in folders.items():
        data = task_data_config(task, tmp_path / "data")  # what training composes with LRA_DATA_DIR
        assert (resolve(task, data).folder / "manifest.json").is_file()  # prepared by download
        loaded = load_task(task, SEQ_LEN[task], data)
        assert loaded.data_source == {"text": "imdb", "image": "cifar10"}.get(task, "lra_release")
        options = {**data["options"], **({"workers": 1} if READERS[task] is pathfinder else {})}
        expected = READERS[task].read(source, max_length=data["max_length"], **options)
        for split, dataset in loaded.splits.items():
            for name, array in expected.splits[split].arrays.items():
                np.testing.assert_array_equal(dataset.split.arrays[name], array)
            np.testing.assert_array_equal(dataset.split.labels, expected.splits[split].labels)
        name = {"text": IMDB, "image": CIFAR}.get(task, RELEASE)
        record = loaded.manifest["download"]
        assert record["url"] == f"{mirror.url}/{name}" and record["num_bytes"] == len(files[name])
        assert record["sha256"] == hashlib.sha256(files[name]).hexdigest()
        assert record["md5"] == hashlib.md5(files[name]).hexdigest()
        assert ("published by" in record["verified"]) == (name != RELEASE)
    data = tmp_path / "data"
    release_folders = sorted(p.name for p in (data / "lra_release").iterdir())
    assert release_folders == ["listops-1000", "pathfinder128", "pathfinder32", "tsv_data"]
    assert [p.name for p in (data / "lra_release" / "pathfinder32").iterdir()] == ["curv_contour_length_14"]
    assert not (data / "aclImdb" / "train" / "unsup").exists() and not (data / "aclImdb" / "imdb.vocab").exists()
    assert not (data / "cifar-10-batches-py" / "batches.meta").exists()
    assert sorted(p.name for p in (data / "downloads").iterdir()) == sorted([*files, *(name + ".url" for name in files)])

    mirror.requests.clear()  # a second run finds everything in place
    assert run(tmp_path, mirror, "all") is None
    assert mirror.requests == []


def test_one_task_of_the_release_unpacks_only_its_folder(tmp_path, mirror, capsys):
    assert run(tmp_path, mirror, "retrieval") is None
    assert [p.name for p in (tmp_path / "data" / "lra_release").iterdir()] == ["tsv_data"]
    assert "retrieval: ready in" in capsys.readouterr().out
    mirror.requests.clear()
    assert run(tmp_path, mirror, "listops") is None  # the kept archive: no second download
    assert mirror.requests == []
    assert sorted(p.name for p in (tmp_path / "data" / "lra_release").iterdir()) == ["listops-1000", "tsv_data"]


def test_an_unpacked_file_that_later_differs_from_the_download_record_is_an_error_naming_it(tmp_path, mirror):
    assert run(tmp_path, mirror, "listops") is None
    source = tmp_path / "data" / "lra_release" / "listops-1000"
    recorded = json.loads((source / cache.DOWNLOAD_RECORD).read_text())["files"]
    train = source / "basic_train.tsv"
    assert recorded["basic_train.tsv"] == {
        "num_bytes": train.stat().st_size,
        "sha256": hashlib.sha256(train.read_bytes()).hexdigest(),
    }
    data = task_data_config("listops", tmp_path / "data")
    train.write_bytes(b"".join(train.read_bytes().splitlines(keepends=True)[:2]))  # cut: the cache's fingerprint changes

    with pytest.raises(DamagedData, match=r"basic_train.tsv has \d+ bytes \(.lra_download.json records") as error:
        prepare_task("listops", data)
    assert "not regenerated or downloaded over" in str(error.value)
    assert len(train.read_bytes().splitlines()) == 2, "official data is left as the user has it"


# -------------------------------------------------------------------------------------- resuming


def test_a_connection_dropped_mid_file_is_resumed_with_a_range_request(tmp_path, mirror, official, published):
    mirror.drop_after[f"mirror/{CIFAR}"], mirror.drops[f"mirror/{CIFAR}"] = 10_000, 1
    assert run(tmp_path, mirror, "image") is None
    assert requested(mirror, CIFAR) == [None, "bytes=10000-"]
    assert (tmp_path / "data" / "downloads" / CIFAR).read_bytes() == official[0][CIFAR]
    assert (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").is_file()


def test_a_download_that_keeps_dropping_is_resumed_by_the_next_run(tmp_path, mirror, official, published):
    mirror.drop_after[f"mirror/{CIFAR}"], mirror.drops[f"mirror/{CIFAR}"] = 2000, download.RESUMES_PER_RUN + 1
    error = run(tmp_path, mirror, "image")
    part = tmp_path / "data" / "downloads" / (CIFAR + ".part")
    received = 2000 * (download.RESUMES_PER_RUN + 1)
    sizes = f"{download.human_bytes(received)} of {download.human_bytes(len(official[0][CIFAR]))} received"
    assert f"broke off ({sizes}, {download.RESUMES_PER_RUN} resumed)" in error
    assert f"are kept in {part}: run the same command again to resume" in error
    assert part.read_bytes() == official[0][CIFAR][:received]
    assert unpacked_or_prepared(tmp_path) == []

    mirror.requests.clear()
    assert run(tmp_path, mirror, "image") is None
    assert requested(mirror, CIFAR) == [f"bytes={received}-"]
    assert (tmp_path / "data" / "downloads" / CIFAR).read_bytes() == official[0][CIFAR]


def test_a_server_without_range_support_sends_the_whole_file_again(tmp_path, mirror, official, published):
    downloads = tmp_path / "data" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / (CIFAR + ".part")).write_bytes(b"stale bytes of another file")
    mirror.ranges = False
    assert run(tmp_path, mirror, "image") is None
    assert requested(mirror, CIFAR) == ["bytes=27-"]
    assert (downloads / CIFAR).read_bytes() == official[0][CIFAR]


def test_a_complete_part_file_is_renamed_without_downloading_again(tmp_path, mirror, official, published):
    downloads = tmp_path / "data" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / (IMDB + ".part")).write_bytes(official[0][IMDB])  # an earlier run stopped before renaming it
    assert run(tmp_path, mirror, "text") is None
    assert requested(mirror, IMDB) == [f"bytes={len(official[0][IMDB])}-"]  # answered 416
    assert (downloads / IMDB).read_bytes() == official[0][IMDB]


# ------------------------------------------------------------------------------------- bad cases


def test_a_checksum_mismatch_sets_the_file_aside_until_the_user_accepts_it(tmp_path, mirror, official):
    archive = official[0][IMDB]  # not the published file: its MD5 differs
    error = run(tmp_path, mirror, "text")
    downloads = tmp_path / "data" / "downloads"
    sha256 = hashlib.sha256(archive).hexdigest()
    assert f"has MD5 {hashlib.md5(archive).hexdigest()} where {download.ARCHIVES['imdb'].md5} was expected" in error
    assert f"set aside as {downloads / IMDB}.rejected and not used" in error and f"--sha256 {sha256}" in error
    assert (downloads / (IMDB + ".rejected")).read_bytes() == archive and not (downloads / IMDB).exists()
    assert unpacked_or_prepared(tmp_path) == []

    assert run(tmp_path, mirror, "text", "--sha256", sha256) is None
    record = load_task("text", 4096, task_data_config("text", tmp_path / "data")).manifest["download"]
    assert record["sha256"] == sha256
    assert record["verified"].startswith("SHA-256 given by the user (--sha256); the published MD5 is 7c2ac02c")


def test_the_published_size_is_checked(tmp_path, mirror, official, published, monkeypatch):
    cifar = download.ARCHIVES["cifar10"]
    monkeypatch.setitem(download.ARCHIVES, "cifar10", dataclasses.replace(cifar, num_bytes=170_498_071))
    error = run(tmp_path, mirror, "image")
    assert f"has {len(official[0][CIFAR]):,} bytes where the published file has 170,498,071" in error
    assert (tmp_path / "data" / "downloads" / (CIFAR + ".rejected")).is_file()


@pytest.mark.parametrize("code, reason", [(404, "the file is not there"), (403, "the host refuses to serve it")])
def test_an_http_error_names_the_url_and_the_mirror_option(tmp_path, mirror, code, reason):
    mirror.status[f"mirror/{RELEASE}"] = code
    error = run(tmp_path, mirror, "listops")
    assert error.startswith(f"error: listops: {mirror.url}/{RELEASE} answered HTTP {code} ")
    assert reason in error and "--base-url URL (or LRA_DOWNLOAD_BASE_URL=URL)" in error
    assert not (tmp_path / "data").exists()


def test_an_unreachable_host_is_one_clear_error(tmp_path, mirror):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mirror.url = f"http://127.0.0.1:{port}"
    error = run(tmp_path, mirror, "image")
    url = f"http://127.0.0.1:{port}/{CIFAR}"
    assert error.startswith(f"error: image: cannot reach 127.0.0.1:{port} to download {url} (")
    assert "check the network connection" in error and not (tmp_path / "data").exists()


def test_a_truncated_archive_is_set_aside_and_nothing_is_unpacked(tmp_path, mirror, official):
    mirror.files[f"mirror/{RELEASE}"] = official[0][RELEASE][: len(official[0][RELEASE]) * 2 // 3]
    error = run(tmp_path, mirror, "listops", "pathx")
    assert f"{RELEASE} is truncated or damaged (" in error and "Nothing was unpacked" in error
    assert (tmp_path / "data" / "downloads" / (RELEASE + ".rejected")).is_file()
    assert unpacked_or_prepared(tmp_path) == []


def release_with(official, name, link=None):
    """The test release plus one last member ``name`` (a symbolic link to ``link`` when given)."""
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(gzip.decompress(official[0][RELEASE]))) as source,
        tarfile.open(fileobj=buffer, mode="w:gz") as tar,
    ):
        for member in source:
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        extra = tarfile.TarInfo(name)
        if link is None:
            extra.size = 7
            tar.addfile(extra, io.BytesIO(b"escaped"))
        else:
            extra.type, extra.linkname = tarfile.SYMTYPE, link
            tar.addfile(extra)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "name",
    [
        "lra_release/lra_release/listops-1000/../../../../escaped.tsv",
        "../escaped.tsv",
        "/tmp/lra-download-test-escaped.tsv",
    ],
)
def test_a_member_whose_path_leaves_the_destination_is_refused(tmp_path, mirror, official, name):
    mirror.files[f"mirror/{RELEASE}"] = release_with(official, name)
    error = run(tmp_path, mirror, "listops")
    assert f"refused to unpack {RELEASE}: its member {name!r} has a path that leaves the destination folder" in error
    assert not list(tmp_path.rglob("escaped*")) and not os.path.exists("/tmp/lra-download-test-escaped.tsv")
    assert unpacked_or_prepared(tmp_path) == []
    assert (tmp_path / "data" / "downloads" / (RELEASE + ".rejected")).is_file()


def test_a_link_among_the_files_to_unpack_is_refused(tmp_path, mirror, official):
    name = "lra_release/lra_release/pathfinder32/curv_contour_length_14/imgs/2/sample_99.png"
    mirror.files[f"mirror/{RELEASE}"] = release_with(official, name, link="/etc/passwd")
    error = run(tmp_path, mirror, "pathfinder")
    assert f"its member {name!r} is a symbolic link where the task expects a regular file" in error
    assert unpacked_or_prepared(tmp_path) == []


def test_an_archive_without_the_task_files_is_kept_and_named(tmp_path, mirror, official):
    root = tmp_path / "other"
    write_listops_release(root / "lra_release" / "listops-1000")  # one level up from the official place
    mirror.files[f"mirror/{RELEASE}"] = tar_gz(root, "lra_release")
    error = run(tmp_path, mirror, "listops")
    assert "does not hold the listops files where the official archive has them: basic_train.tsv, " in error
    assert "missing under lra_release/lra_release/listops-1000/ " in error
    assert "(the archive's top folders: lra_release/listops-1000)" in error
    assert (tmp_path / "data" / "downloads" / RELEASE).is_file() and unpacked_or_prepared(tmp_path) == []


def test_a_full_disk_is_named_before_downloading(tmp_path, mirror, monkeypatch):
    almost_full = types.SimpleNamespace(total=10**9, used=10**9, free=10)
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: almost_full)
    error = run(tmp_path, mirror, "text")
    expected = r"not enough space on the disk holding \S+/data/downloads \(needs [\d.]+ K?B, 10 B free\): free some space"
    assert re.search(expected + r", or download to another disk with --dest DIR", error)
    assert list((tmp_path / "data").rglob("*")) == [tmp_path / "data" / "downloads"]


def test_a_disk_that_fills_while_unpacking_leaves_nothing_unpacked(tmp_path, mirror, monkeypatch, published):
    def full(tar, member, target):
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(download, "_write_member", full)
    error = run(tmp_path, mirror, "text")
    assert "not enough space on the disk holding" in error
    assert f"Nothing was unpacked; {tmp_path / 'data' / 'downloads' / IMDB} is kept" in error
    assert unpacked_or_prepared(tmp_path) == []


def test_one_checksum_cannot_cover_several_archives(tmp_path, mirror):
    error = run(tmp_path, mirror, "text", "image", "--md5", "0" * 32)
    assert "--sha256/--md5 give one file's checksum, but these tasks come from several archives" in error
    assert mirror.requests == []


# ------------------------------------------------------------------------------------ training


def test_the_missing_data_error_of_training_names_the_download_command(tmp_path):
    for task in ("listops", "text", "retrieval", "image", "pathfinder", "pathx"):
        data = {**task_data_config(task, tmp_path / "data"), "source": "official"}
        expected = "`download pathx`" if task == "pathx" else f"Run `python -m lra.data download {task}`"
        with pytest.raises(FileNotFoundError, match=expected):
            load_task(task, 16384, data)


@pytest.mark.slow
def test_training_finds_what_download_prepared(tmp_path, mirror, official):
    assert run(tmp_path, mirror, "image", "--md5", hashlib.md5(official[0][CIFAR]).hexdigest()) is None
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    train = [
        sys.executable,
        "-m",
        "lra.train",
        "task=image",
        "task.protocol.batch_size=1",
        "task.protocol.max_steps=4",
        "task.protocol.warmup_steps=2",
        "task.protocol.val_check_interval=2",
        "task.protocol.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
    ]
    trained = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Preparing" not in trained.stdout + trained.stderr  # the cache download made, as it is
    (result,) = (tmp_path / "outputs").rglob("results.json")
    record = json.loads(result.read_text())
    (cache_folder,) = (p for p in (tmp_path / "data" / "cache" / "image").iterdir() if p.is_dir())  # beside it: its lock
    assert record["data_source"] == "cifar10" and record["data_folder"] == str(cache_folder)
