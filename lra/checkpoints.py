"""Every checkpoint the harness writes or reads passes through here: torch only, nothing of Lightning's.

A checkpoint is Lightning's dict of tensors and plain data. It is read with torch's ``weights_only`` unpickler
(:func:`read`): one that holds anything else (a class, a function: unpickling it could run code) is refused, and
nothing in it runs. It is written whole or not at all (:func:`write`), with its SHA-256 recorded beside it in
``<name>.sha256``; read back, resumed, tested or packed, a checkpoint whose bytes are not the ones recorded is refused
(:func:`read_bytes`), so that a flipped bit, a copy cut short or an edit after it was written is never trained on,
tested or carried. A checkpoint written before digests were recorded has none and is read as it is. Its identity
(:func:`identity`: the run's configuration hash and seed, stamped by :class:`lra.callbacks.RunIdentity`) tells a
run's own checkpoint from another's (:func:`read_own`).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from pathlib import Path
from typing import Any

import torch

from .files import write_atomically

DIGEST_SUFFIX = ".sha256"  # <checkpoint>.sha256: the SHA-256 of the checkpoint's bytes, recorded when it was written
IDENTITY = "RunIdentity"  # the callbacks' state under which lra.callbacks.RunIdentity stamps a checkpoint
TRAINING_STATE = ("optimizer_states", "lr_schedulers")  # what only resuming needs; testing reads the weights alone
# What reading a checkpoint that cannot be read raises (missing, cut short, not a checkpoint, refused): no step to read.
# An empty file (a write cut short at once) raises EOFError.
UNREADABLE = (OSError, EOFError, RuntimeError, KeyError, ValueError)


class CheckpointRefused(ValueError):
    """A checkpoint that must not be used, in one message: what is wrong with it, and what to do."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_file(path: Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def recorded_digests(path: Path) -> list[str]:
    """The digests recorded for ``path`` (two only while a write replaces it: the new one and the one it replaces); none
    for a checkpoint written before digests were."""
    try:
        return digest_file(path).read_text().split()
    except FileNotFoundError:
        return []


def read_bytes(path: Path) -> bytes:
    """The bytes of the checkpoint ``path``, checked against the digest recorded when it was written."""
    data = Path(path).read_bytes()
    recorded = recorded_digests(path)
    if recorded and sha256(data) not in recorded:
        raise CheckpointRefused(
            f"{path} is not the checkpoint that was written there: its SHA-256 is {sha256(data)[:16]}..., the one recorded "
            f"in {digest_file(path).name} is {recorded[0][:16]}...; it was changed or damaged since. Put back the file "
            f"that was written, or delete it and {digest_file(path).name} to train from the start"
        )
    return data


def load(data: bytes, path: Path) -> dict[str, Any]:
    """A checkpoint's contents from its bytes (read from ``path``), unpickled with ``weights_only=True``."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise CheckpointRefused(
            f"refused to load the checkpoint {path}: it holds more than tensors and plain data ({reason}), and "
            "unpickling that could run code. Use checkpoints this harness wrote; delete this one to start the run afresh"
        ) from None


def read(path: Path) -> dict[str, Any]:
    """The contents of the checkpoint ``path``: its recorded digest checked, tensors and plain data only. Raises one of
    :data:`UNREADABLE` where there is none to read (:class:`CheckpointRefused` where it must not be used)."""
    return load(read_bytes(path), path)


def step(path: Path) -> int:
    """The training step a checkpoint was saved at."""
    return int(read(path)["global_step"])


def identity(contents: dict[str, Any]) -> dict[str, Any] | None:
    """The run a checkpoint's contents belong to (its configuration hash and seed); None for one written before run
    identities were stamped."""
    return contents.get("callbacks", {}).get(IDENTITY)


def read_own(path: Path, config_hash: str, seed: int, fix: str) -> dict[str, Any]:
    """The contents of ``path`` where it is a checkpoint of the run of ``config_hash`` and ``seed`` (or one written
    before run identities); else one message naming the file, what is wrong with it and ``fix``. Another
    configuration's checkpoint (copied or moved in) would be trained on, tested and recorded as this one's: Lightning
    reads any whose shapes fit."""
    try:
        contents = read(path)
    except CheckpointRefused:
        raise
    except Exception as error:  # a write cut short by an older version, a copy cut short, a damaged disk
        raise CheckpointRefused(
            f"{path} cannot be read ({type(error).__name__}: {str(error)[:120]}): it is damaged, perhaps by a write "
            f"cut short; {fix}"
        ) from None
    stamped = identity(contents)
    if stamped is not None and (stamped.get("config_hash"), stamped.get("seed")) != (config_hash, seed):
        raise CheckpointRefused(
            f"{path} is a checkpoint of another configuration or seed (config {stamped.get('config_hash')}, seed "
            f"{stamped.get('seed')}), not of this run's ({config_hash}, seed {seed}): {fix}"
        )
    return contents


def to_bytes(contents: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(contents, buffer)
    return buffer.getvalue()


def write(path: Path, contents: dict[str, Any]) -> None:
    """Write the checkpoint ``contents`` to ``path`` (:func:`write_bytes`)."""
    write_bytes(path, to_bytes(contents))


def write_bytes(path: Path, data: bytes) -> None:
    """Write a checkpoint's bytes to ``path`` whole (:func:`lra.files.write_atomically`) and record their digest beside
    it. While it replaces an older checkpoint, both digests are recorded, so that a kill at any moment leaves the file
    that is there with its own digest recorded."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replaced = recorded_digests(path) or ([sha256(path.read_bytes())] if path.is_file() else [])
    new = sha256(data)
    write_atomically(digest_file(path), "\n".join(dict.fromkeys([new, *replaced])).encode() + b"\n")
    write_atomically(path, data)
    write_atomically(digest_file(path), f"{new}\n".encode())


def remove(path: Path) -> None:
    """Remove a checkpoint and its recorded digest."""
    Path(path).unlink(missing_ok=True)
    digest_file(path).unlink(missing_ok=True)


def weights(path: Path) -> bytes:
    """The checkpoint ``path`` without the optimizer's and scheduler's state (:data:`TRAINING_STATE`): what testing it
    needs, a third of its size."""
    contents = read(path)
    for key in TRAINING_STATE:
        contents.pop(key, None)
    return to_bytes(contents)
