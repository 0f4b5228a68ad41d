"""The archive a campaign carries between machines: a tar.gz of named members, cut into parts where it is large, and a
manifest beside it, written last, that every byte is checked against before anything is unpacked.

On disk, ``FILE`` (or ``FILE.part000``, ``FILE.part001``, ... where it is larger than a part: ``cat`` joins them)
and ``FILE.manifest.json``: the SHA-256 and size of every part, of the whole, and of every member. :func:`read`
checks every part against it before joining them, the whole after, and every member after decompressing (tar stops
before gzip's own check, so a flipped bit would otherwise pass), and the members' names against ``grammar`` and
tarfile's ``data`` extraction filter; any mismatch is one :class:`ArchiveRefused` naming the part or member.

:func:`write` replaces an older archive at its path only once the new one is complete: its parts and manifest are
written into ``.FILE.packing/`` beside it, read back and checked, and only then moved into place, the manifest last;
a kill or a full disk before that leaves the older archive whole. A kill while the files are moved leaves the new
archive complete in that folder, and the next :func:`read` or :func:`write` finishes the move (:func:`settle`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from ..files import DiskFull, write_atomically
from .plan import CampaignError

FORMAT = "lra.campaign archive 1"
MANIFEST_SUFFIX = ".manifest.json"
PART = re.compile(r"\.part(\d{3})$")
COMPONENT = re.compile(r"[\w.,+=@-]+")  # one component of a member's name: no empty one, no separator


class ArchiveRefused(CampaignError):
    """An archive that must not be unpacked, in one line naming the part or member; nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; nothing unpacked", 1)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_of(path: Path) -> Path:
    """The archive's own path, given it, any of its parts or its manifest."""
    path = Path(path)
    return path.with_name(PART.sub("", path.name.removesuffix(MANIFEST_SUFFIX)))


def manifest_of(path: Path) -> Path:
    base = base_of(path)
    return base.with_name(base.name + MANIFEST_SUFFIX)


def staging_of(path: Path) -> Path:
    base = base_of(path)
    return base.with_name(f".{base.name}.packing")


def exists(path: Path) -> bool:
    """Whether there is an archive at ``path`` (its manifest, any of its files, or a move into place to finish)."""
    base = base_of(path)
    return any(p.exists() for p in (base, manifest_of(base), staging_of(base))) or any(
        base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]")
    )


def files_of(path: Path) -> list[Path]:
    """The files of the archive at ``path`` as its manifest names them, the manifest last."""
    manifest = read_manifest(path)
    return [base_of(path).with_name(part["name"]) for part in manifest["parts"]] + [manifest_of(path)]


def tar_gz(members: dict[str, bytes]) -> bytes:
    """The members as one tar.gz, in name order, each a regular file of mode 0644 with a fixed time: the same members
    give the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write(members: dict[str, bytes], out: Path, part_size: int) -> list[Path]:
    """Write ``members`` as the archive ``out`` (in parts of at most ``part_size`` bytes where larger), replacing an
    older one there only once the new one is complete and checked; the files written, the manifest last."""
    if part_size < 1:
        raise CampaignError(f"--part-size must be positive, got {part_size / 2**20:g} MiB")
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    settle(out)
    data = tar_gz(members)
    pieces = [data] if len(data) <= part_size else [data[i : i + part_size] for i in range(0, len(data), part_size)]
    names = [out.name] if len(pieces) == 1 else [f"{out.name}.part{i:03d}" for i in range(len(pieces))]
    manifest = {
        "format": FORMAT,
        "archive": out.name,
        "size": len(data),
        "sha256": sha256(data),
        "parts": [{"name": name, "size": len(piece), "sha256": sha256(piece)} for name, piece in zip(names, pieces)],
        "members": [{"name": name, "size": len(body), "sha256": sha256(body)} for name, body in sorted(members.items())],
    }
    staging = staging_of(out)
    shutil.rmtree(staging, ignore_errors=True)  # an earlier pack that did not finish: nothing of it counts
    staging.mkdir()
    try:
        for name, piece in zip(names, pieces):
            write_atomically(staging / name, piece)
            if sha256((staging / name).read_bytes()) != sha256(piece):
                raise CampaignError(f"{staging / name} did not read back as it was written (a failing disk?); nothing packed", 1)
        write_atomically(staging / manifest_of(out).name, (json.dumps(manifest, indent=1) + "\n").encode())
    except DiskFull as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise CampaignError(f"{error}; the older archive at {out} is whole", 1) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    settle(out)
    return [out.with_name(name) for name in names] + [manifest_of(out)]


def settle(path: Path) -> None:
    """Finish a :func:`write` that was stopped while it moved its files into place: where the staging folder holds a
    complete archive (its manifest, written last), move the rest of it into place, the manifest last, then remove the
    older archive's parts the manifest does not name; where it does not, remove it (the older archive is whole)."""
    base = base_of(path)
    staging, manifest = staging_of(base), manifest_of(base)
    if not staging.is_dir():
        return
    staged = staging / manifest.name
    try:
        values = json.loads(staged.read_text())
    except (OSError, ValueError):
        values = None
    if not well_formed(values) or not all(part_name(base, part["name"]) for part in values["parts"]):
        shutil.rmtree(staging)  # not written whole (a pack killed before its manifest): the older archive is whole
        return
    names = [part["name"] for part in values["parts"]]
    for name in names:
        if (staging / name).exists():
            (staging / name).replace(base.with_name(name))
    staged.replace(manifest)
    for stale in [base, *base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]")]:
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    shutil.rmtree(staging)


def part_name(base: Path, name: str) -> bool:
    """Whether ``name`` is one of the archive ``base``'s own files: itself, or one of its parts."""
    return re.fullmatch(re.escape(base.name) + r"(\.part\d{3})?", name) is not None


def read_manifest(path: Path) -> dict:
    manifest = manifest_of(path)
    try:
        values = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise ArchiveRefused(
            f"{base_of(path).name} has no manifest ({manifest.name}, written last by pack): it was not packed whole, or "
            "not by this version's pack"
        ) from None
    except (OSError, ValueError) as error:
        raise ArchiveRefused(f"{manifest} cannot be read ({error})") from None
    if not well_formed(values):
        raise ArchiveRefused(f"{manifest} is not the manifest of a campaign archive ({FORMAT})")
    if values.get("archive") != base_of(path).name:
        raise ArchiveRefused(f"{manifest} is the manifest of {values.get('archive')!r}, not of {base_of(path).name}")
    return values


def well_formed(manifest: object) -> bool:
    """Whether ``manifest`` has the keys and types :func:`write` gives one (a damaged one is refused, not a KeyError)."""

    def entries(value: object) -> bool:
        return isinstance(value, list) and all(
            isinstance(e, dict)
            and isinstance(e.get("name"), str)
            and isinstance(e.get("size"), int)
            and isinstance(e.get("sha256"), str)
            for e in value
        )

    return (
        isinstance(manifest, dict)
        and manifest.get("format") == FORMAT
        and isinstance(manifest.get("sha256"), str)
        and entries(manifest.get("parts"))
        and entries(manifest.get("members"))
    )


def joined(path: Path, manifest: dict) -> bytes:
    """The archive's bytes: every part checked against the manifest (size, SHA-256), then the whole."""
    base = base_of(path)
    pieces = []
    for part in manifest["parts"]:
        if not part_name(base, part["name"]):
            raise ArchiveRefused(f"{manifest_of(base).name} names {part['name']!r}, which is not a file of {base.name}")
        file = base.with_name(part["name"])
        if not file.is_file():
            raise ArchiveRefused(f"{base.name} is missing its file {part['name']}")
        piece = file.read_bytes()
        if len(piece) != part["size"] or sha256(piece) != part["sha256"]:
            what = f"{len(piece)} bytes where the manifest says {part['size']}" if len(piece) != part["size"] else "other bytes"
            raise ArchiveRefused(f"{part['name']} holds {what} than the manifest's: it was cut, changed or swapped")
        pieces.append(piece)
    data = b"".join(pieces)
    if len(data) != manifest.get("size") or sha256(data) != manifest["sha256"]:
        raise ArchiveRefused(f"{base.name}: its parts joined are not the archive the manifest describes")
    return data


def read(path: Path, grammar: Callable[[str], bool]) -> dict[str, bytes]:
    """The members of the archive at ``path``, every one checked (see the module's docstring); their names must satisfy
    ``grammar`` and tarfile's ``data`` filter (no absolute path, none outside its folder, no link, no device)."""
    if not exists(path):
        raise CampaignError(
            f"there is no archive at {path}: neither it, its parts nor its manifest (a first job has nothing to unpack: "
            "unpack --missing-ok goes on)"
        )
    settle(path)
    manifest = read_manifest(path)
    data = joined(path, manifest)
    expected = {member["name"]: member for member in manifest["members"]}
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                check_name(member, grammar)
                body = archive.extractfile(member).read()
                want = expected.get(member.name)
                if member.name in members or want is None or (len(body), sha256(body)) != (want["size"], want["sha256"]):
                    raise ArchiveRefused(f"{base_of(path).name}: its member {member.name!r} is not the manifest's")
                members[member.name] = body
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ArchiveRefused(f"{base_of(path).name} is not a readable tar.gz ({error})") from None
    if missing := sorted(set(expected) - set(members)):
        raise ArchiveRefused(f"{base_of(path).name} lacks the member(s) {', '.join(missing)} its manifest names")
    return members


def check_name(member: tarfile.TarInfo, grammar: Callable[[str], bool]) -> None:
    """Refuse a member that is not a regular file, whose name has an empty, ``.`` or ``..`` component, that tarfile's
    ``data`` filter refuses, or that ``grammar`` does not accept."""
    parts = member.name.split("/")
    well_formed = member.isfile() and all(COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts)
    if well_formed and hasattr(tarfile, "data_filter"):  # Python 3.10.12 and later
        try:
            tarfile.data_filter(member, "/nonexistent/destination")
        except tarfile.FilterError:
            well_formed = False
    if not well_formed or not grammar(member.name):
        raise ArchiveRefused(f"the archive holds {member.name!r}, which is not part of a campaign archive")
