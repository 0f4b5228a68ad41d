"""What a task reader returns: token-id arrays and labels per split, before they are cached.

Every task module in ``lra.data`` has ``read(source: Path, *, max_length: int, **options) ->
Prepared``. It reads the official files under ``source`` and returns fixed-length token arrays
(``(num_samples, max_length)``, unsigned integers, id 0 = padding, right-padded) and labels. The
cache (:mod:`lra.data.cache`) stores them compactly and the datamodule pads them to the model's
``seq_len``. A reader raises ``FileNotFoundError`` naming the expected layout and where the
official data is published when files are missing, and ``ValueError`` naming the file (and line or
record) when a file is corrupt; it never drops or truncates anything silently (truncation that is
part of the protocol, like IMDb's first 4000 bytes, is documented in the reader).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SPLITS = ("train", "val", "test")
#: The official LRA release: ListOps, Retrieval, Pathfinder and Path-X (a tar archive despite its name).
LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"


@dataclass
class Split:
    """One split: named token arrays (``input_ids``, or ``input_ids_0``/``input_ids_1``) and labels."""

    arrays: dict[str, np.ndarray]
    labels: np.ndarray  # (num_samples,) int64

    def __post_init__(self) -> None:
        if self.labels.ndim != 1:
            raise ValueError(f"labels must be 1-D, got shape {self.labels.shape}")
        for name, array in self.arrays.items():
            if array.ndim != 2 or len(array) != len(self.labels):
                raise ValueError(f"{name} must be (num_samples={len(self.labels)}, length), got shape {array.shape}")
            if array.dtype.kind != "u":
                raise ValueError(f"{name} must hold unsigned token ids, got dtype {array.dtype}")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class Prepared:
    """A reader's result. A split may be the same object as another (IMDb: val is test); the cache
    then stores it once. ``notes`` go into the cache manifest (e.g. skipped empty images)."""

    splits: dict[str, Split]
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if tuple(self.splits) != SPLITS:
            raise ValueError(f"a reader must return the splits {SPLITS} in that order, got {tuple(self.splits)}")
