"""Download, verify, unpack and prepare the official data: ``python -m lra.data download TASK``.

Three archives hold the six tasks' data:

=========================  =================================  ===========================================
archive                    tasks (folder in the archive)      verified by
=========================  =================================  ===========================================
``lra_release.gz``         listops, retrieval, pathfinder,    nothing is published: the size the server
(the LRA release, 7.7 GB)  pathx (``lra_release/lra_release/  announces, the gzip checksum of the whole
                           {listops-1000, tsv_data, ...}``)   stream, and the task's files after unpacking
``aclImdb_v1.tar.gz``      text (``aclImdb``)                 the MD5 published by torchtext
``cifar-10-python.tar.gz`` image (``cifar-10-batches-py``)    the MD5 (torchvision) and size published
=========================  =================================  ===========================================

Per archive, for the requested tasks whose folder (``task.data.source_dir``) is not there yet:

1. Download into ``<dest>/downloads/<file>.part`` with a progress bar. A dropped connection is
   resumed with an HTTP ``Range`` request, a few times in the same run and again by running the
   command again; a server that ignores ``Range`` sends the whole file, which replaces the partial
   one. Only a download of the announced size is renamed to ``<file>``.
2. Verify it against the published checksum, or the user's ``--sha256``/``--md5`` (a file that
   differs from the published one, accepted by the user's decision). A file that does not match is
   set aside as ``<file>.rejected`` and never unpacked.
3. Unpack, in one streaming pass, only the files the tasks' readers need, each into a temporary
   folder that is renamed to ``task.data.source_dir`` (where training looks) once the whole archive
   has been read (its gzip checksum included) and the task's files are all there. Every member
   name is checked: an absolute path or a ``..`` component (a path that leaves the destination)
   refuses the archive, and so does a link or device among the files to unpack. This is the rule
   of tarfile's ``data`` filter, applied the same way on every Python (the filter exists only from
   3.12 and in late patch releases of 3.10 and 3.11). The folder also gets :data:`DOWNLOAD_RECORD`:
   the archive's URL, size, MD5, SHA-256 and how it was verified, which the cache manifest copies,
   and the unpacked files' sizes and SHA-256 (:mod:`lra.data.records`), which are checked before the
   folder is prepared again: a file that differs is an error naming it, never downloaded over.
4. Prepare each task's cache (:func:`lra.data.tasks.prepare_task`), so that the next
   ``python -m lra.train task=TASK`` finds it. Training itself never downloads.

The archive stays in ``<dest>/downloads`` so that another task of the same archive unpacks without
downloading it again; it is never unpacked whole, so the LRA release never takes its 7.7 GB twice.
Streaming the members straight out of the HTTP response would keep no archive at all, but a
dropped connection could then only start over from the first byte (a gzip stream cannot be
resumed in the middle), and every later task would download the 7.7 GB again.

The downloader is urllib's, not pooch's (weighed against pooch 1.9.0, the usual library for data
files, in issue 29): pooch would be shorter only by dropping guarantees listed above.

- Resume: pooch's ``stream_download`` (core.py) writes each try into a fresh temporary file that
  ``temporary_file`` (utils.py) deletes on any failure, and no request of its carries ``Range``;
  ``retry_if_failed`` starts over, so a connection lost at 7 of the release's 7.7 GB costs all 7.7 again.
- Hashes: it checks one (sha256, md5, ...), but a mismatch raises ValueError and deletes the file,
  which cannot then be set aside and accepted with ``--sha256``.
- Unpacking: ``Untar`` (processors.py) passes tarfile's ``data`` filter only on Python >= 3.12; on
  3.11.7 it unpacked a symbolic link to /etc/passwd, and (unpacking all) a ``..`` member outside
  its folder. It selects members by name prefix, not pattern, after ``getmembers()`` (every member
  of the release in memory), and extracts in place: a failure leaves half a folder. So unpacking
  would stay here either way.
- Progress: tqdm in both (here ``tqdm.wrapattr`` on the file written or read: :func:`progress`).
  pooch would add requests (with urllib3, idna, charset-normalizer, certifi) and platformdirs.

With pooch, :func:`fetch` and its helpers (about 100 lines) would become one call plus a translation
of requests' exceptions into the messages here, and would lose the resume of the largest file.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from tqdm import tqdm

from . import image, listops, records, retrieval, text
from .cache import DOWNLOAD_RECORD, CacheError
from .formats import LRA_RELEASE_URL
from .staging import staged_folder
from .tasks import TASKS, Resolved, prepare_task

log = logging.getLogger(__name__)

BASE_URL_ENV = "LRA_DOWNLOAD_BASE_URL"
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60  # per connection attempt and per read: a stalled transfer fails and is resumed
RESUMES_PER_RUN = 5  # dropped connections resumed in one run; after that the .part waits for the next run


class DownloadError(RuntimeError):
    """Downloading, verifying or unpacking an archive failed; the message says why and what to do."""


@dataclass(frozen=True)
class Archive:
    file: str  # the file name, the same on the official host and on a mirror (--base-url)
    url: str  # the official address
    md5: str | None = None  # the published checksum; None where nothing is published
    num_bytes: int | None = None  # the published size
    published_by: str | None = None  # where the checksum is published


#: Keyed by the tasks' ``official_source`` label (lra.data.tasks.TASKS).
ARCHIVES = {  # in the order `download all` fetches them: the small ones first
    # MD5 from torchtext (torchtext/datasets/imdb.py: MD5), which other IMDb loaders use as well.
    "imdb": Archive("aclImdb_v1.tar.gz", text.IMDB_URL, md5="7c2ac02c03563afcf9b574c7e56c153a", published_by="torchtext"),
    # MD5 from torchvision (torchvision/datasets/cifar.py: tgz_md5); the size is the official file's.
    "cifar10": Archive(
        "cifar-10-python.tar.gz",
        image.CIFAR_URL,
        md5="c58f30108f718f92721af3b95e74349a",
        num_bytes=170_498_071,
        published_by="torchvision",
    ),
    # Nothing published to check the release against (see the module doc for what is checked).
    "lra_release": Archive("lra_release.gz", LRA_RELEASE_URL),
}


@dataclass(frozen=True)
class TaskFiles:
    """What a task's reader needs from its archive."""

    root: str  # the folder in the archive that becomes task.data.source_dir
    members: tuple[str, ...]  # fnmatch patterns, relative to root, of the files to unpack
    required: tuple[str, ...] = ()  # what must exist afterwards (default: members, as plain names)

    @property
    def expected(self) -> tuple[str, ...]:
        return self.required or self.members

    def present_in(self, folder: Path) -> bool:
        """Whether ``folder`` holds every expected file (a concurrent download unpacked it first)."""
        return all((folder / name).exists() for name in self.expected)


# The release's folders are taken from lra_release/lra_release/, where LRA's own dataset_setup.sh
# and the setups built on it move them from.
RELEASE_ROOT = "lra_release/lra_release"
LISTOPS_FILES = tuple(listops.split_path(Path(), split).name for split in listops.SPLITS)
PATHFINDER_FILES = ("metadata/*.npy", "imgs/*.png")
IMDB_FOLDERS = tuple(f"{split}/{label}" for split in ("train", "test") for label, _ in text.LABELS)
TASK_FILES = {
    "listops": TaskFiles(f"{RELEASE_ROOT}/listops-1000", LISTOPS_FILES),
    "retrieval": TaskFiles(f"{RELEASE_ROOT}/tsv_data", tuple(retrieval.FILES.values())),
    "pathfinder": TaskFiles(f"{RELEASE_ROOT}/pathfinder32/curv_contour_length_14", PATHFINDER_FILES, ("metadata", "imgs")),
    "pathx": TaskFiles(f"{RELEASE_ROOT}/pathfinder128/curv_contour_length_14", PATHFINDER_FILES, ("metadata", "imgs")),
    "text": TaskFiles("aclImdb", tuple(f"{folder}/*.txt" for folder in IMDB_FOLDERS), IMDB_FOLDERS),
    "image": TaskFiles("cifar-10-batches-py", (*image.TRAIN_FILES, image.TEST_FILE)),
}
assert set(TASK_FILES) == set(TASKS), "every task needs its files listed"


def archive_url(archive: Archive, base_url: str | None) -> str:
    """The official address, or the same file name under a mirror's ``base_url``."""
    if not base_url:
        return archive.url
    return f"{base_url.rstrip('/')}/{archive.file}"


def human_bytes(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def disk_full_message(folder: Path, needed: int | None) -> str:
    free = shutil.disk_usage(folder).free
    need = f"needs {human_bytes(needed)}, " if needed is not None else ""
    return (
        f"not enough space on the disk holding {folder} ({need}{human_bytes(free)} free): free some space, or "
        "download to another disk with --dest DIR (then train with LRA_DATA_DIR=DIR)"
    )


def progress(file: BinaryIO, method: str, total: int | None, desc: str, initial: int = 0) -> Any:
    """``file``, its ``method`` ("read" or "write") advancing a progress bar of bytes, rate and time left."""
    bar = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "dynamic_ncols": True}  # also at the first display
    return tqdm.wrapattr(file, method, total=total, initial=initial, desc=desc, **bar)


# ------------------------------------------------------------------------------------- download


class ConnectionDropped(Exception):
    """The transfer stopped before the announced size: resumable."""


def _request(url: str, offset: int) -> http.client.HTTPResponse:
    """GET ``url`` from byte ``offset`` on; HTTP and connection failures become DownloadError, but for
    HTTP 416 to a resumed request (the ``.part`` file is not shorter than the file), left to :func:`fetch`."""
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            raise
        raise DownloadError(http_error_message(url, error.code, error.reason)) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        host = urllib.parse.urlsplit(url).netloc
        raise DownloadError(
            f"cannot reach {host} to download {url} ({reason}): check the network connection (and proxy "
            f"settings), or download from a mirror with --base-url URL (or {BASE_URL_ENV}=URL)"
        ) from None


def http_error_message(url: str, code: int, reason: str) -> str:
    file = url.rsplit("/", 1)[-1]
    if code in (401, 403):
        why = "the host refuses to serve it (the LRA release's bucket has answered 401 and 403 before)"
    elif code == 404:
        why = "the file is not there (hosts move files)"
    else:
        why = "the server failed"
    return (
        f"{url} answered HTTP {code} {reason}: {why}. Download {file} from a mirror that serves it under the "
        f"same name with --base-url URL (or {BASE_URL_ENV}=URL), or download it yourself, unpack it and run "
        "`python -m lra.data prepare TASK --source DIR`"
    )


def _total_size(response: http.client.HTTPResponse, offset: int) -> int | None:
    """The whole file's size: from a 206's ``Content-Range: bytes <offset>-<end>/<total>`` (which
    must start at ``offset``) or a 200's ``Content-Length``; None when the server does not say."""
    if response.status != 206:
        length = response.headers.get("Content-Length")
        return int(length) if length is not None else None
    content_range = response.headers.get("Content-Range", "")
    match = re.fullmatch(rf"bytes {offset}-\d+/(\d+|\*)", content_range)
    if match is None:
        raise DownloadError(
            f"{response.url} answered a request for bytes {offset}- with Content-Range {content_range!r}: "
            "the server's resume is broken; delete the .part file and download again"
        )
    return int(match[1]) if match[1] != "*" else None


def fetch(url: str, target: Path) -> None:
    """Download ``url`` into ``target`` through ``target.part``, resuming with HTTP Range.

    Raises :class:`DownloadError` for an unreachable host, an HTTP error, a full disk, or a transfer
    that keeps dropping (the ``.part`` file then stays for the next run to resume).
    """
    part = target.with_name(target.name + ".part")
    resumes = 0
    while True:
        offset = part.stat().st_size if part.exists() else 0
        try:
            response = _request(url, offset)
        except urllib.error.HTTPError as error:  # 416, with Content-Range: bytes */<the file's size>
            if error.headers.get("Content-Range", "").endswith(f"/{offset}"):  # an earlier run stopped before renaming it
                break
            log.info(f"{part} is longer than {url}: starting over")
            part.unlink()
            continue
        with response:
            if offset and response.status != 206:
                log.info(f"{urllib.parse.urlsplit(url).netloc} does not resume downloads (no Range support): starting over")
                offset = 0
            total = _total_size(response, offset)
            target.parent.mkdir(parents=True, exist_ok=True)
            if total is not None and shutil.disk_usage(target.parent).free < total - offset:
                raise DownloadError(disk_full_message(target.parent, total - offset))
            try:
                _copy_response(response, part, offset, total, target.name)
                break
            except ConnectionDropped as dropped:
                received = part.stat().st_size
                if received <= offset or resumes >= RESUMES_PER_RUN:
                    raise DownloadError(
                        f"the download of {url} broke off ({dropped}, {resumes} resumed); {human_bytes(received)} "
                        f"are kept in {part}: run the same command again to resume"
                    ) from None
                resumes += 1
                log.info(f"The connection dropped after {human_bytes(received)} ({dropped}); resuming")
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                remaining = None if total is None else total - part.stat().st_size
                raise DownloadError(
                    f"{disk_full_message(target.parent, remaining)}; {part} is kept and the download resumes from it"
                ) from None
    os.replace(part, target)


def _copy_response(response: http.client.HTTPResponse, part: Path, offset: int, total: int | None, name: str) -> None:
    """Write the response body into ``part`` from ``offset`` on, with a progress bar (bytes, rate,
    time left); raise :class:`ConnectionDropped` when it stops short of ``total``."""
    with (
        open(part, "ab" if offset else "wb") as file,
        progress(file, "write", total, name, initial=offset) as out,
    ):
        while True:
            try:
                chunk = response.read(CHUNK_BYTES)
            except (http.client.HTTPException, OSError) as error:  # reset, timeout, incomplete chunked body
                raise ConnectionDropped(f"{type(error).__name__}: {error}") from None
            if not chunk:
                break
            out.write(chunk)
        received = out.tell()
    if total is not None and received < total:
        raise ConnectionDropped(f"{human_bytes(received)} of {human_bytes(total)} received")


# --------------------------------------------------------------------------------------- verify


def file_digests(path: Path) -> tuple[str, str]:
    """MD5 and SHA-256 of ``path``, in one read with a progress bar."""
    md5, sha256 = hashlib.md5(), hashlib.sha256()
    with (
        open(path, "rb") as file,
        progress(file, "read", path.stat().st_size, f"checking {path.name}") as f,
    ):
        while chunk := f.read(CHUNK_BYTES):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def set_aside(path: Path) -> Path:
    """Rename a file that must not be used to ``<name>.rejected`` (replacing an older one)."""
    rejected = path.with_name(path.name + ".rejected")
    os.replace(path, rejected)
    return rejected


def verify(archive: Archive, path: Path, url: str, *, sha256: str | None = None, md5: str | None = None) -> dict[str, Any]:
    """Check ``path`` against the user's checksum or the published one; return its download record.

    A file that does not match is set aside (:func:`set_aside`) and a :class:`DownloadError` says so.
    """
    num_bytes = path.stat().st_size
    actual_md5, actual_sha256 = file_digests(path)
    published = f"the published MD5 is {archive.md5} ({archive.published_by})" if archive.md5 else "none is published"
    if sha256 or md5:
        algorithm, expected, actual = ("SHA-256", sha256, actual_sha256) if sha256 else ("MD5", md5, actual_md5)
        verified = f"{algorithm} given by the user (--{'sha256' if sha256 else 'md5'}); {published}"
    elif archive.md5:
        algorithm, expected, actual = "MD5", archive.md5, actual_md5
        verified = f"MD5 published by {archive.published_by}"
    else:
        algorithm = expected = actual = None
        verified = (
            "nothing is published to check it against: the size the server announced, the gzip checksum "
            "and the task's files after unpacking were checked"
        )
    problem = None
    if archive.num_bytes is not None and not (sha256 or md5) and num_bytes != archive.num_bytes:
        problem = f"has {num_bytes:,} bytes where the published file has {archive.num_bytes:,}"
    elif expected is not None and actual != expected.lower():
        problem = f"has {algorithm} {actual} where {expected.lower()} was expected ({verified})"
    if problem:
        rejected = set_aside(path)
        raise DownloadError(
            f"{path.name} from {url} {problem}: it is not the expected file (a damaged download, or another file "
            f"under that name). It is set aside as {rejected} and not used; run the command again to download it "
            f"anew. If you have checked this file yourself and want to use it, move it back to {path} and run the "
            f"command with --sha256 {actual_sha256}"
        )
    return {
        "file": archive.file,
        "url": url,
        "num_bytes": num_bytes,
        "md5": actual_md5,
        "sha256": actual_sha256,
        "verified": verified,
    }


# --------------------------------------------------------------------------------------- unpack


class Refused(Exception):
    """An archive member that must not be unpacked (see :func:`member_parts`)."""


def member_parts(member: tarfile.TarInfo) -> tuple[str, ...]:
    """The components of a member's name; :class:`Refused` for a name that leaves the destination
    (absolute, or with a ``..`` component), as tarfile's ``data`` filter refuses it."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        raise Refused(f"its member {member.name!r} has a path that leaves the destination folder")
    return path.parts


def relative_to_root(parts: tuple[str, ...], root: str) -> str | None:
    """``parts`` below the archive folder ``root``, as a relative path, or None when outside it."""
    root_parts = PurePosixPath(root).parts
    if len(parts) > len(root_parts) and parts[: len(root_parts)] == root_parts:
        return "/".join(parts[len(root_parts) :])
    return None


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if not member.isfile():  # a link could point anywhere; a device or FIFO is no data
        kind = "symbolic link" if member.issym() else "hard link" if member.islnk() else "device or FIFO"
        raise Refused(f"its member {member.name!r} is a {kind} where the task expects a regular file")
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None, "a regular file always has contents"
    with source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK_BYTES)
    os.utime(target, (member.mtime, member.mtime))  # the archive's times: unpacking again changes no fingerprint


def read_members(path: Path, stagings: dict[str, tuple[TaskFiles, Path]]) -> tuple[dict[str, int], set[str]]:
    """Stream through the archive ``path`` once and write each task's files into its staging folder.

    ``stagings`` maps a task to its files and staging folder. Returns the number of files written
    per task and the archive's top folders (two levels deep, for messages). Reads the archive to
    its very end, so that gzip checks the checksum and length of the whole stream.
    """
    counts = dict.fromkeys(stagings, 0)
    top_folders: set[str] = set()
    with (
        open(path, "rb") as raw,
        progress(raw, "read", path.stat().st_size, f"unpacking {path.name}") as reader,
    ):
        compressed = raw.read(2) == b"\x1f\x8b"  # the gzip magic (read past the bar); a plain tar is read as is
        raw.seek(0)
        stream: Any = gzip.GzipFile(fileobj=reader, mode="rb") if compressed else reader
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # tarfile would keep every member it read: ~0.1 KB each, millions here
                parts = member_parts(member)
                if member.isdir():
                    continue
                top_folders.add("/".join(parts[: min(2, len(parts) - 1)]))
                for task, (files, staging) in stagings.items():
                    relative = relative_to_root(parts, files.root)
                    if relative is not None and any(fnmatchcase(relative, pattern) for pattern in files.members):
                        _write_member(tar, member, staging / relative)
                        counts[task] += 1
        while stream.read(CHUNK_BYTES):  # the tar's end padding, then the gzip trailer: its checksum is checked
            pass
    return counts, top_folders


def unpack(
    path: Path,
    targets: dict[str, tuple[TaskFiles, Path]],
    record: dict[str, Any],
) -> None:
    """Unpack each task's files (``targets``: task -> (files, source folder)) from the archive ``path``.

    Every folder appears whole or not at all: the files go into temporary folders beside their
    destinations, renamed into place once the archive has been read to its end and every task's
    expected files are there.
    """
    created: list[Path] = []  # parent folders made here, removed again if nothing is unpacked
    unpacked = False
    try:
        with ExitStack() as renamed_at_exit:  # every staging folder renamed into place, or none
            stagings: dict[str, tuple[TaskFiles, Path]] = {}
            for task, (files, folder) in targets.items():
                created += [parent for parent in reversed(folder.parents) if not parent.exists()]
                staging = renamed_at_exit.enter_context(staged_folder(folder, complete=files.present_in))
                stagings[task] = (files, staging)
            try:
                counts, top_folders = read_members(path, stagings)
            except Refused as refused:
                rejected = set_aside(path)
                raise DownloadError(
                    f"refused to unpack {path.name}: {refused}; the official archive has none, so this file is not it. "
                    f"Nothing was unpacked; the file is set aside as {rejected}"
                ) from None
            except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:  # BadGzipFile is an OSError
                rejected = set_aside(path)
                raise DownloadError(
                    f"{path.name} is truncated or damaged ({type(error).__name__}: {error}). Nothing was unpacked; the "
                    f"file is set aside as {rejected}: run the command again to download it anew"
                ) from None
            for task, (files, staging) in stagings.items():
                missing = [name for name in files.expected if not (staging / name).exists()]
                if missing:
                    raise DownloadError(
                        f"{path.name} does not hold the {task} files where the official archive has them: "
                        f"{', '.join(missing)} missing under {files.root}/ (the archive's top folders: "
                        f"{', '.join(sorted(top_folders)[:12])}). It is not the official archive, or its layout "
                        f"changed. Nothing was unpacked; {path} is kept"
                    )
                # The unpacked files' sizes and SHA-256 (lra.data.records): checked before the folder is read again.
                unpacked_files = records.describe(staging, skip=(DOWNLOAD_RECORD,))
                task_record = {**record, "folder": files.root, "files": unpacked_files}
                (staging / DOWNLOAD_RECORD).write_text(json.dumps(task_record, indent=2) + "\n")
        unpacked = True
        for task, (files, folder) in targets.items():
            log.info(f"{task}: unpacked {counts[task]} files of {files.root}/ into {folder}")
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        folder = next(iter(targets.values()))[1].parent
        raise DownloadError(f"{disk_full_message(folder, None)}. Nothing was unpacked; {path} is kept") from None
    finally:
        if not unpacked:
            for parent in reversed(created):  # deepest first; a folder that is not empty stays
                try:
                    parent.rmdir()
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------- tasks


def _archive_of(path: Path, url: str) -> str:
    """Where an archive found in the downloads folder came from (written by :func:`download`)."""
    origin = path.with_name(path.name + ".url")
    return origin.read_text().strip() if origin.is_file() else f"{path} (placed there by hand; official: {url})"


def download_archive(
    archive: Archive,
    configs: dict[str, dict[str, Any]],
    downloads: Path,
    *,
    base_url: str | None = None,
    sha256: str | None = None,
    md5: str | None = None,
) -> dict[str, Resolved]:
    """Download, verify and unpack ``archive`` for the tasks in ``configs`` (task -> its
    ``task.data`` section) whose source folder is missing, then prepare every one of them."""
    targets = {}
    for task, data in configs.items():
        folder = Path(data["source_dir"])
        if folder.is_dir():
            log.info(f"{task}: {folder} is already there, not downloading it again")
        else:
            targets[task] = (TASK_FILES[task], folder)
    if targets:
        path = downloads / archive.file
        url = archive_url(archive, base_url)
        if path.is_file():
            log.info(f"Using {path}, downloaded earlier")
            url = _archive_of(path, url)
        else:
            log.info(f"Downloading {url}")
            fetch(url, path)
            path.with_name(path.name + ".url").write_text(url + "\n")
        record = verify(archive, path, url, sha256=sha256, md5=md5)
        unpack(path, targets, record)
    prepared = {}
    for task, data in configs.items():
        try:
            prepared[task] = prepare_task(task, {**data, "source": "official"})
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise DownloadError(f"{disk_full_message(Path(data['cache_dir']), None)}; nothing was prepared") from None
    if targets:
        log.info(
            f"{path} is kept, so that other tasks of {archive.file} unpack without downloading it again; "
            "delete it when you do not need it"
        )
    return prepared


def download_tasks(
    configs: dict[str, dict[str, Any]],
    downloads: Path,
    *,
    base_url: str | None = None,
    sha256: str | None = None,
    md5: str | None = None,
) -> tuple[dict[str, Resolved], list[str]]:
    """Download and prepare the tasks of ``configs`` (task -> its ``task.data`` section), archive by
    archive; a failing archive does not stop the others. Returns the prepared tasks and one
    message per failure."""
    groups: dict[str, dict[str, dict[str, Any]]] = {source: {} for source in ARCHIVES}
    for task, data in configs.items():
        groups[TASKS[task].official_source][task] = data
    groups = {source: tasks for source, tasks in groups.items() if tasks}
    if (sha256 or md5) and len(groups) > 1:
        files = ", ".join(ARCHIVES[source].file for source in groups)
        raise DownloadError(
            f"--sha256/--md5 give one file's checksum, but these tasks come from several archives ({files}): "
            "download one archive's tasks at a time"
        )
    prepared: dict[str, Resolved] = {}
    errors = []
    for source, tasks in groups.items():
        try:
            prepared.update(download_archive(ARCHIVES[source], tasks, downloads, base_url=base_url, sha256=sha256, md5=md5))
        except (DownloadError, FileNotFoundError, ValueError, CacheError) as error:  # readers name the file at fault
            errors.append(f"{', '.join(tasks)}: {error}")
    return prepared, errors
