"""ListOps (Nangia & Bowman, 2018) as the Long Range Arena uses it: the generator and the reader.

The generator re-implements the official LRA algorithm (``lra_benchmarks/data/listops.py``):

* a tree is sampled top-down from depth 1: below ``max_depth`` a node is a leaf (a digit 0-9) with
  probability 1 - ``value_probability`` (0.75), otherwise an operator (MIN, MAX, MED or SM, uniform)
  with ``randint(2, max_args)`` children; at ``max_depth`` it is always a leaf;
* a tree's length counts digits, operators and ``]`` but not parentheses, i.e. exactly the number
  of tokens the reader produces; a tree is kept iff ``min_length < length < max_length`` (strict);
* trees are deduplicated and split in the order they were first accepted (train, then val, then
  test). The official script is unseeded and splits a Python ``set`` in its hash order; here the
  RNG is ``random.Random(seed)`` and the order is insertion order, so a seed reproduces the files;
* an operator node is rendered left-nested like a curried application,
  ``( ( ( [MAX 2 ) 9 ) ] )``, and the label is the value of the expression: MIN, MAX, MED
  (``int(median)``, so an even count truncates the mean of the middle two) and SM (sum mod 10).

Files are the official TSVs ``basic_{train,val,test}.tsv`` with the header ``Source<TAB>Target``,
so the reader loads the generated folder and the real ``lra_release/listops-1000`` alike. Beside them,
``generator.json`` holds the parameters and the record of the three files (bytes, SHA-256, samples), which
:func:`ensure_generated` checks before every use.

The reader removes ``(`` and ``)`` and makes ``]`` a token of its own, then maps tokens through the
fixed vocabulary :data:`VOCAB` (0 is padding; an unknown token is an error naming file and line).
Sequences are padded with zeros to ``max_length`` (2000, LRA's length); the model pads them to its
``seq_len`` (2048 in the paper's protocol).
"""

from __future__ import annotations

import csv
import json
import logging
import random
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import records
from .formats import LRA_RELEASE_URL, SPLITS, Prepared, Split
from .staging import folder_lock, staged_folder

log = logging.getLogger(__name__)

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
NUM_CLASSES = 10

#: Token -> id. Id 0 is padding; the order is fixed here (the official pipeline's order comes from a
#: Python set and is arbitrary, which does not matter to a model with learned embeddings).
VOCAB: dict[str, int] = {token: i for i, token in enumerate((*OPERATORS, CLOSE, *map(str, range(10))), start=1)}
PAD_ID = 0
VOCAB_SIZE = len(VOCAB) + 1  # 16: padding plus 15 symbols

GENERATOR_JSON = "generator.json"

# csv's default field limit (128 KiB) is below the longest official rows' size.
csv.field_size_limit(sys.maxsize)


@dataclass(frozen=True)
class GeneratorConfig:
    """Parameters of the official generator; the defaults are the LRA release's."""

    num_train: int = 96_000
    num_val: int = 2_000
    num_test: int = 2_000
    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2_000
    value_probability: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_train, self.num_val, self.num_test) < 1:
            raise ValueError(f"every split needs at least one sample, got {self}")
        if self.max_args < 2 or self.max_depth < 1:
            raise ValueError(f"need max_args >= 2 and max_depth >= 1, got {self}")
        if not 0 <= self.min_length < self.max_length - 1:
            raise ValueError(f"need 0 <= min_length < max_length - 1 (bounds are strict), got {self}")
        if not 0.0 < self.value_probability < 1.0:
            raise ValueError(f"value_probability must be in (0, 1), got {self.value_probability}")

    @property
    def total(self) -> int:
        return self.num_train + self.num_val + self.num_test


def sample_tree(rng: random.Random, config: GeneratorConfig, depth: int = 1) -> tuple[object, int]:
    """Sample one tree; return it and its length (digits, operators and closing brackets).

    A tree is a digit (``int``) or an operator node ``(operator, [children])``.
    """
    r = rng.random() if depth < config.max_depth else 1.0
    if r > config.value_probability:
        return rng.randint(0, 9), 1
    num_args = rng.randint(2, config.max_args)
    children, length = [], 2  # the operator token and its closing bracket
    for _ in range(num_args):
        child, child_length = sample_tree(rng, config, depth + 1)
        children.append(child)
        length += child_length
    return (rng.choice(OPERATORS), children), length


def render(tree: object) -> str:
    """The official text form: each application is ``( left right )``, nested to the left."""
    if isinstance(tree, int):
        return str(tree)
    operator, children = tree
    text = operator
    for child in children:
        text = f"( {text} {render(child)} )"
    return f"( {text} {CLOSE} )"


def evaluate(tree: object) -> int:
    if isinstance(tree, int):
        return tree
    operator, children = tree
    args = [evaluate(child) for child in children]
    if operator == "[MIN":
        return min(args)
    if operator == "[MAX":
        return max(args)
    if operator == "[MED":
        return int(statistics.median(args))
    return sum(args) % 10


def generate(config: GeneratorConfig) -> dict[str, list[tuple[str, int]]]:
    """Sample ``config.total`` distinct accepted expressions and split them into train/val/test."""
    rng = random.Random(config.seed)
    accepted: dict[str, int] = {}  # rendered expression -> label, in acceptance order
    # The paper's size (100,000 samples) took about 2 minutes on the 2-core VM: a bar on a terminal, none in logs.
    with tqdm(total=config.total, desc="Generating ListOps", unit="sample", disable=None, leave=False) as bar:
        while len(accepted) < config.total:
            tree, length = sample_tree(rng, config)
            if config.min_length < length < config.max_length:
                text = render(tree)
                if text not in accepted:
                    accepted[text] = evaluate(tree)
                    bar.update()
    rows = list(accepted.items())
    bounds = np.cumsum([0, config.num_train, config.num_val, config.num_test])
    return {split: rows[start:end] for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:], strict=True)}


def split_path(folder: Path, split: str) -> Path:
    return Path(folder) / f"basic_{split}.tsv"


def write_tsv(path: Path, rows: list[tuple[str, int]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writerow(["Source", "Target"])
        writer.writerows(rows)


def write_splits(folder: Path, splits: dict[str, list[tuple[str, int]]]) -> None:
    """Write the official ``basic_{train,val,test}.tsv`` files of ``splits`` into ``folder``."""
    for split, rows in splits.items():
        write_tsv(split_path(folder, split), rows)


def generated_folder(cache_dir: Path, config: GeneratorConfig) -> Path:
    """The cache folder of one generator configuration (every parameter is in the name)."""
    c = config
    name = (
        f"listops-generated-n{c.num_train}-{c.num_val}-{c.num_test}-len{c.min_length}-{c.max_length}"
        f"-depth{c.max_depth}-args{c.max_args}-p{c.value_probability:g}-seed{c.seed}"
    )
    return Path(cache_dir) / name


def write_generated(folder: Path, config: GeneratorConfig, splits: dict[str, list[tuple[str, int]]]) -> None:
    """Write the TSVs of ``splits`` into ``folder`` and, last, ``generator.json``: ``config``'s parameters and the
    record of the files (:mod:`lra.data.records`: bytes, SHA-256 and samples of each)."""
    write_splits(folder, splits)
    counts = {split_path(folder, split).name: len(rows) for split, rows in splits.items()}
    record = {**asdict(config), "files": records.describe(folder, counts=counts, skip=(GENERATOR_JSON,))}
    (Path(folder) / GENERATOR_JSON).write_text(json.dumps(record, indent=2) + "\n")


def generated_problem(folder: Path, config: GeneratorConfig) -> str | None:
    """Why ``folder`` is not the intact data of ``config`` (None when it is): missing, another configuration, no
    record of its files (written by an earlier version), or a file that differs from its record."""
    try:
        recorded = json.loads((Path(folder) / GENERATOR_JSON).read_text())
    except FileNotFoundError:
        return f"{folder / GENERATOR_JSON} is missing"
    except (OSError, ValueError) as error:
        return f"{folder / GENERATOR_JSON} cannot be read ({error})"
    files = recorded.pop("files", None)
    if recorded != asdict(config):
        return f"{folder / GENERATOR_JSON} records other parameters than {config}"
    if not files:
        return f"{folder / GENERATOR_JSON} records no sizes or checksums of the files (written by an earlier version)"
    return records.difference(folder, files, GENERATOR_JSON)


def ensure_generated(cache_dir: Path, config: GeneratorConfig) -> Path:
    """The folder of ``config`` under ``cache_dir``, generated unless it is there and intact.

    Processes that start at once generate it once: the first takes the folder's lock (an OS lock, released
    when its process ends) and generates; the others wait, then find its files and check them. The files
    are written to a temporary folder renamed into place, so a killed generator never leaves a folder that
    looks complete. Before use every file is checked against the record in ``generator.json`` (size, then
    SHA-256); a file that differs is named in a log line and the folder is generated again.
    """
    folder = generated_folder(cache_dir, config)
    with folder_lock(folder, "the ListOps data"):
        problem = generated_problem(folder, config)
        if problem is None:
            return folder
        if folder.exists():
            log.warning("Generating ListOps again: %s", problem)
        log.info("Generating ListOps (%d samples, seed %d) into %s", config.total, config.seed, folder)
        splits = generate(config)
        with staged_folder(folder, complete=lambda done: generated_problem(done, config) is None, replace=True) as staging:
            write_generated(staging, config, splits)
    return folder


def tokenize(source: str) -> list[str]:
    return source.replace("(", " ").replace(")", " ").replace(CLOSE, f" {CLOSE} ").split()


def read_split(folder: Path, split: str, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Read ``basic_<split>.tsv`` into token ids ``(num_samples, max_length)`` uint8 and int64 labels.

    Raises ``FileNotFoundError`` naming the expected layout when the file is missing, and
    ``ValueError`` naming file and line for a malformed header, an unknown token, a bad label or a
    sequence longer than ``max_length`` (nothing is silently truncated).
    """
    path = split_path(folder, split)
    if not path.is_file():
        raise FileNotFoundError(missing_data_message(Path(folder)))
    ids, labels = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header != ["Source", "Target"]:
            raise ValueError(f"{path}: expected the header 'Source<TAB>Target', got {header!r}")
        for line_number, row in enumerate(reader, start=2):
            if len(row) != 2:
                raise ValueError(f"{path}:{line_number}: expected 2 tab-separated fields, got {len(row)}")
            source, target = row
            try:
                tokens = [VOCAB[token] for token in tokenize(source)]
            except KeyError as error:
                raise ValueError(
                    f"{path}:{line_number}: unknown ListOps token {error.args[0]!r}; valid tokens: {' '.join(VOCAB)}"
                ) from None
            if len(tokens) > max_length:
                raise ValueError(
                    f"{path}:{line_number}: {len(tokens)} tokens exceed max_length={max_length}; "
                    "raise the task's data.max_length (and seq_len)"
                )
            if not target.strip().isdigit() or not 0 <= int(target) < NUM_CLASSES:
                raise ValueError(f"{path}:{line_number}: label must be an integer 0-9, got {target!r}")
            row_ids = np.zeros(max_length, dtype=np.uint8)
            row_ids[: len(tokens)] = tokens
            ids.append(row_ids)
            labels.append(int(target))
    if not ids:
        raise ValueError(f"{path}: no samples after the header")
    return np.stack(ids), np.asarray(labels, dtype=np.int64)


def read(source: Path, *, max_length: int = 2000) -> Prepared:
    """The three official TSVs of ``source`` (a ``listops-1000`` folder) as token arrays."""
    splits = {}
    for split in SPLITS:
        input_ids, labels = read_split(source, split, max_length)
        splits[split] = Split(arrays={"input_ids": input_ids}, labels=labels)
    return Prepared(splits)


def missing_data_message(folder: Path) -> str:
    return (
        f"ListOps data not found in {folder}: expected basic_train.tsv, basic_val.tsv and basic_test.tsv "
        "(header 'Source<TAB>Target'). Run `python -m lra.data download listops` (downloads the official "
        f"LRA release {LRA_RELEASE_URL}, verifies it, unpacks listops-1000 and prepares it), or point "
        "task.data.source_dir at the 'listops-1000' folder of a release you unpacked yourself, or generate the "
        "data with the official algorithm: task.data.source=generated (or `python -m lra.data generate listops "
        "--out DIR`)."
    )
