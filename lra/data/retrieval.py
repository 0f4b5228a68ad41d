"""ACL Anthology Network document matching, LRA's "Retrieval" task: the reader of ``tsv_data``.

Official format: ``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (eval is the
validation split). There is no header. Each line is one pair with exactly five tab-separated fields,
``label id1 id2 text1 text2``; label 1 means that the two papers are linked by a citation. Like LRA
(``CsvDataset(..., use_quote_delim=False)``), the reader does not treat quotes specially: the files
are parsed as bytes, every tab separates two fields and a ``"`` is an ordinary byte of the text (a
quote-aware CSV reader would merge fields across a quoted tab). A record ends at ``\\n`` (a
trailing ``\\r`` is removed) and empty lines at the end of a file are ignored. The label is a number
(``1``, ``0``, ``1.0``; LRA parses a float and casts it to int) and must be 0 or 1. The ids are not
used.

Tokenisation, bytes exactly as for Text (:mod:`lra.data.text`): each byte ``b`` of a document
becomes id ``b + 1`` (vocabulary 257, id 0 = padding). Each document keeps its first ``max_length``
bytes (4000 per document, LRA's protocol truncation, so 8K per pair) and is right-padded with zeros,
in the uint16 arrays ``input_ids_0`` (text1) and ``input_ids_1`` (text2) of a dual encoder. LRA
first cuts every text to 10,000 bytes, which changes nothing for ``max_length`` <= 10,000. The
number of truncated documents per split goes into ``Prepared.notes``.

Splits: train, val (``eval``) and test as released: 147,086 / 18,090 / 17,437 pairs, in file order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .formats import LRA_RELEASE_URL, SPLITS, Prepared, Split
from .text import VOCAB_SIZE as VOCAB_SIZE  # the bytes exactly as for Text
from .text import write_byte_ids

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
FIELDS = ("label", "id1", "id2", "text1", "text2")
NUM_CLASSES = 2  # the two documents cite each other or not


def records(path: Path) -> Iterator[tuple[int, bytes]]:
    """The non-empty lines of ``path`` with their line numbers, without ``\\n`` or ``\\r\\n``.

    An empty line is an error unless only empty lines follow it (the end of the file).
    """
    first_empty = None
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if not line:
                if first_empty is None:
                    first_empty = number
                continue
            if first_empty is not None:
                raise ValueError(f"{path}:{first_empty}: empty line (expected {len(FIELDS)} tab-separated fields)")
            yield number, line


def parse_label(field: bytes, path: Path, number: int) -> int:
    try:
        value = float(field)
    except ValueError:
        value = None
    if value not in (0.0, 1.0):
        raise ValueError(f"{path}:{number}: the label must be 0 or 1, got {field[:40]!r}")
    return int(value)


def read_split(path: Path, max_length: int) -> tuple[Split, int]:
    """Read one TSV; return the split and how many documents were truncated to ``max_length``."""
    num_pairs = sum(1 for _ in records(path))
    if num_pairs == 0:
        raise ValueError(f"{path}: no pairs")
    documents = np.zeros((2, num_pairs, max_length), dtype=np.uint16)
    labels = np.empty(num_pairs, dtype=np.int64)
    truncated = 0
    for index, (number, line) in enumerate(records(path)):
        fields = line.split(b"\t")
        if len(fields) != len(FIELDS):
            raise ValueError(
                f"{path}:{number}: expected {len(FIELDS)} tab-separated fields ({' '.join(FIELDS)}), got "
                f"{len(fields)} (quotes are not special: every tab separates fields)"
            )
        labels[index] = parse_label(fields[0], path, number)
        for k, text in enumerate(fields[3:]):
            if not text:
                raise ValueError(f"{path}:{number}: {FIELDS[3 + k]} is empty")
            write_byte_ids(documents[k, index], text)
            if len(text) > max_length:
                truncated += 1
    split = Split(arrays={"input_ids_0": documents[0], "input_ids_1": documents[1]}, labels=labels)
    return split, truncated


def read(source: Path, *, max_length: int = 4000) -> Prepared:
    """The three AAN pair files of ``source`` (a ``tsv_data`` folder) as byte ids per document."""
    source = Path(source)
    missing = [name for name in FILES.values() if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(missing_data_message(source, missing))
    splits, truncated = {}, {}
    for split in SPLITS:
        splits[split], truncated[split] = read_split(source / FILES[split], max_length)
    return Prepared(splits, {"truncated_to_max_length": truncated})


def missing_data_message(source: Path, missing: list[str] | None = None) -> str:
    return (
        f"AAN retrieval data not found in {source}: missing {', '.join(missing or FILES.values())}. Expected the 'tsv_data' "
        "folder of the official LRA release with new_aan_pairs.train.tsv, new_aan_pairs.eval.tsv and "
        "new_aan_pairs.test.tsv (no header; label<TAB>id1<TAB>id2<TAB>text1<TAB>text2 per line). Run "
        "`python -m lra.data download retrieval` (downloads, verifies, unpacks and prepares it), or download "
        f"{LRA_RELEASE_URL} yourself (a tar archive despite its name: tar xf), then point "
        "task.data.source_dir at lra_release/tsv_data or run "
        "`python -m lra.data prepare retrieval --source <dir>/lra_release/tsv_data`."
    )
