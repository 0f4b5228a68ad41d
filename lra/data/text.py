"""Byte-level IMDb sentiment (Maas et al., 2011), LRA's "Text" task: the reader of ``aclImdb``.

Official format: the Large Movie Review Dataset (``aclImdb_v1.tar.gz``) unpacks to ``aclImdb/`` with
``{train,test}/{pos,neg}/<id>_<rating>.txt``, one review per file, 12,500 per folder. Reviews in
``pos`` are labelled 1 and those in ``neg`` 0. ``train/unsup`` (unlabelled reviews) and the other
files (``imdb.vocab``, ``*.feat``, ``urls_*.txt``, README) are not used. LRA loads the same files
through TFDS ``imdb_reviews``.

Tokenisation, as LRA's ``ByteTextEncoder``: TFDS strips leading and trailing ASCII whitespace from
each file (``f.read().strip()``), so this reader does too. Each remaining byte ``b`` becomes id
``b + 1`` (vocabulary 257, id 0 = padding), so a multi-byte UTF-8 character becomes several tokens.
A review keeps its first ``max_length`` bytes and is right-padded with zeros; the ids are uint16.
This truncation is the protocol's: 4000 bytes (the paper's 4K; the JAX config says 1000, see the
protocol reference). The number of truncated reviews per split goes into ``Prepared.notes``.

Splits: train is ``train/`` (25,000 reviews) and test is ``test/`` (25,000). val is the same
``Split`` object as test, because LRA validates on the IMDb test set (IMDb has no validation
split); the cache stores it once.

Deviation: the sample order is ``neg`` then ``pos``, each by numeric id, which is deterministic but
not TFDS's order. Training shuffles, so this does not change the task.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .formats import Prepared, Split

IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
LABELS = (("neg", 0), ("pos", 1))  # folder, label, in reading order
NUM_CLASSES = len(LABELS)
VOCAB_SIZE = 257  # padding plus the 256 byte values (id = byte + 1)
REVIEW_NAME = re.compile(r"(\d+)_(\d+)\.txt")


def write_byte_ids(row: np.ndarray, data: bytes) -> None:
    """Write the ids (byte + 1) of the first ``len(row)`` bytes of ``data`` into the zero row ``row``."""
    kept = np.frombuffer(data, dtype=np.uint8, count=min(len(data), len(row)))
    row[: len(kept)] = kept.astype(np.uint16) + 1


def review_files(folder: Path, source: Path) -> list[Path]:
    """The ``<id>_<rating>.txt`` files of one ``pos``/``neg`` folder, by numeric id."""
    if not folder.is_dir():
        raise FileNotFoundError(missing_data_message(source, folder))
    reviews = []
    for path in folder.glob("*.txt"):
        match = REVIEW_NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path}: an IMDb review file must be named <id>_<rating>.txt")
        reviews.append((int(match.group(1)), path))
    if not reviews:
        raise ValueError(f"{folder}: no <id>_<rating>.txt review files")
    return [path for _, path in sorted(reviews)]


def read_split(source: Path, split: str, max_length: int) -> tuple[Split, int]:
    """Read ``source/<split>/{neg,pos}``; return the split and how many reviews were truncated."""
    files = [(path, label) for folder, label in LABELS for path in review_files(source / split / folder, source)]
    input_ids = np.zeros((len(files), max_length), dtype=np.uint16)
    labels = np.array([label for _, label in files], dtype=np.int64)
    truncated = 0
    for row, (path, _) in zip(input_ids, files, strict=True):
        review = path.read_bytes().strip()
        if not review:
            raise ValueError(f"{path}: the review is empty")
        write_byte_ids(row, review)
        if len(review) > max_length:
            truncated += 1
    return Split(arrays={"input_ids": input_ids}, labels=labels), truncated


def read(source: Path, *, max_length: int = 4000) -> Prepared:
    """The labelled reviews of an ``aclImdb`` folder as byte ids; val is test (see the module doc)."""
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(missing_data_message(source, source))
    train, train_truncated = read_split(source, "train", max_length)
    test, test_truncated = read_split(source, "test", max_length)
    notes = {"truncated_to_max_length": {"train": train_truncated, "test": test_truncated}}
    return Prepared({"train": train, "val": test, "test": test}, notes)


def missing_data_message(source: Path, missing: Path | None = None) -> str:
    return (
        f"IMDb data not found in {source}: {missing or source} does not exist. Expected the 'aclImdb' folder of the "
        "Large Movie Review Dataset, with train/pos, train/neg, test/pos and test/neg holding one review per "
        "<id>_<rating>.txt file. Run `python -m lra.data download text` (downloads, verifies, unpacks and "
        f"prepares it), or download {IMDB_URL} yourself, unpack it (tar xzf), and run "
        "`python -m lra.data prepare text --source <dir>/aclImdb` (or point task.data.source_dir at the "
        "aclImdb folder)."
    )
