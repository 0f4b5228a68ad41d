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
import os
import random
import statistics
import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
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
DIGITS = tuple(map(str, range(10)))
NUM_CLASSES = 10

#: Token -> id. Id 0 is padding; the order is fixed here (the official pipeline's order comes from a
#: Python set and is arbitrary, which does not matter to a model with learned embeddings).
VOCAB: dict[str, int] = {token: i for i, token in enumerate((*OPERATORS, CLOSE, *map(str, range(10))), start=1)}
PAD_ID = 0
VOCAB_SIZE = len(VOCAB) + 1  # 16: padding plus 15 symbols

GENERATOR_JSON = "generator.json"
#: Candidates a generating worker process renders per task (about 6 MB of text at the paper's lengths): enough
#: to make sending them cheap, few enough to keep every worker busy to the end (the paper's size is 100 chunks).
CANDIDATES_PER_CHUNK = 1000

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


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a batch scheduler may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def tree_samplers(rng: random.Random, config: GeneratorConfig) -> tuple[Callable[[], tuple[str, int, int]], Callable[[], int]]:
    """Two faster forms of :func:`sample_tree` on ``rng``: ``sample()`` returns a tree's text (as :func:`render`),
    length and label (as :func:`evaluate`), ``skip()`` only its length. Both draw what :func:`sample_tree` draws,
    in its order, so they may take turns on one stream.

    ``randint(a, b)`` is ``a + _randbelow(b - a + 1)`` and ``choice(seq)`` is ``seq[_randbelow(len(seq))]``, and
    ``_randbelow(n)`` calls ``getrandbits(n.bit_length())`` until the result is below ``n`` (the same in CPython
    3.8 to 3.13). Calling ``getrandbits`` so here draws the same numbers without randint's argument checks
    (a randint takes about 200 ns, a getrandbits 20), and a leaf is drawn in its parent's loop instead of a call
    of its own. The tests hold both to ``sample_tree``, tree by tree, on the state they leave the RNG in.
    """
    uniform, bits = rng.random, rng.getrandbits
    p, max_depth = config.value_probability, config.max_depth
    arg_span = config.max_args - 1  # randint(2, max_args) is 2 + _randbelow(max_args - 1)
    num_operators = len(OPERATORS)
    arg_bits, digit_bits, operator_bits = arg_span.bit_length(), (10).bit_length(), num_operators.bit_length()

    def sample_operator(depth: int) -> tuple[str, int, int]:
        num_args = bits(arg_bits)
        while num_args >= arg_span:
            num_args = bits(arg_bits)
        num_args += 2
        texts: list[str] = []
        values: list[int] = []
        length = num_args + 2  # the operator, its bracket and a token per child; a child operator adds the rest
        leaves_only = depth + 1 >= max_depth  # sample_tree draws no uniform at max_depth
        for _ in range(num_args):
            if leaves_only or uniform() > p:
                digit = bits(digit_bits)
                while digit >= 10:
                    digit = bits(digit_bits)
                texts.append(DIGITS[digit])
                values.append(digit)
            else:
                text, child_length, value = sample_operator(depth + 1)
                texts.append(text)
                values.append(value)
                length += child_length - 1
        operator = bits(operator_bits)
        while operator >= num_operators:
            operator = bits(operator_bits)
        if operator == 0:
            value = min(values)
        elif operator == 1:
            value = max(values)
        elif operator == 2:  # int(statistics.median(values)): the middle one, or the floor of the middle two's mean
            values.sort()
            half = num_args // 2
            value = values[half] if num_args % 2 else (values[half - 1] + values[half]) // 2
        else:
            value = sum(values) % 10
        return f"{'( ' * (num_args + 1)}{OPERATORS[operator]} {' ) '.join(texts)} ) ] )", length, value

    def skip_operator(depth: int) -> int:
        num_args = bits(arg_bits)
        while num_args >= arg_span:
            num_args = bits(arg_bits)
        num_args += 2
        length = num_args + 2
        if depth + 1 >= max_depth:
            for _ in range(num_args):
                while bits(digit_bits) >= 10:
                    pass
        else:
            for _ in range(num_args):
                if uniform() > p:
                    while bits(digit_bits) >= 10:
                        pass
                else:
                    length += skip_operator(depth + 1) - 1
        while bits(operator_bits) >= num_operators:
            pass
        return length

    def sample() -> tuple[str, int, int]:
        if max_depth > 1 and not uniform() > p:
            return sample_operator(1)
        digit = bits(digit_bits)
        while digit >= 10:
            digit = bits(digit_bits)
        return DIGITS[digit], 1, digit

    def skip() -> int:
        if max_depth > 1 and not uniform() > p:
            return skip_operator(1)
        while bits(digit_bits) >= 10:
            pass
        return 1

    return sample, skip


def generate(config: GeneratorConfig, workers: int | None = None) -> dict[str, list[tuple[str, int]]]:
    """Sample ``config.total`` distinct accepted expressions and split them into train/val/test.

    ``workers`` (default: every core) only changes the speed: the trees are one stream from ``random.Random(seed)``,
    kept in the order they are drawn. With more than one, this process only draws each tree's length (``skip``
    of :func:`tree_samplers`), notes the candidates (lengths within the bounds) and sends every
    :data:`CANDIDATES_PER_CHUNK` of them with the RNG state their chunk starts from to a worker process, which
    draws the chunk again and renders and evaluates its candidates. Duplicates are dropped here in stream order;
    when they leave the data set short, the stream goes on where it stopped, as in a single process.

    The paper's size (100,000 samples, what ``experiment=table3 task=listops`` generates before its first cell)
    through :func:`ensure_generated` (writing and recording the files included) on the 2-core VM, idle,
    2026-11-28: 92 s before (``sample_tree``, ``render`` and ``evaluate`` in one process), 35 s with one worker,
    26 s with two. The measuring pass alone takes about 15 s there: the floor on any number of cores.
    """
    workers = min(workers or available_cores(), -(-config.total // CANDIDATES_PER_CHUNK))
    accepted: dict[str, int] = {}  # rendered expression -> label, in acceptance order
    with tqdm(total=config.total, desc="Generating ListOps", unit="sample", disable=None, leave=False) as bar:
        if workers > 1:
            _generate_in_workers(config, workers, accepted, bar)
        else:
            sample, _ = tree_samplers(random.Random(config.seed), config)
            while len(accepted) < config.total:
                text, length, label = sample()
                if config.min_length < length < config.max_length and text not in accepted:
                    accepted[text] = label
                    bar.update()
    rows = list(accepted.items())
    bounds = np.cumsum([0, config.num_train, config.num_val, config.num_test])
    return {split: rows[start:end] for split, start, end in zip(SPLITS, bounds[:-1], bounds[1:], strict=True)}


def _generate_in_workers(config: GeneratorConfig, workers: int, accepted: dict[str, int], bar: tqdm) -> None:
    rng = random.Random(config.seed)
    _, skip = tree_samplers(rng, config)
    pending: deque[tuple[Future, int]] = deque()  # chunks sent, oldest first, and their numbers of candidates
    pool = ProcessPoolExecutor(workers)
    try:
        while len(accepted) < config.total:
            # No more candidates than would all be new: the stream is never drawn past the last one needed.
            needed = config.total - len(accepted) - sum(size for _, size in pending)
            if needed > 0:
                state, picks, index = rng.getstate(), [], 0
                while len(picks) < min(needed, CANDIDATES_PER_CHUNK):
                    if config.min_length < skip() < config.max_length:
                        picks.append(index)
                    index += 1
                pending.append((pool.submit(_sample_chunk, config, state, picks), len(picks)))
            else:  # all the candidates needed are out; duplicates in the oldest chunk would ask for more
                wait([pending[0][0]])
            while pending and pending[0][0].done():
                before = len(accepted)
                for text, label in pending.popleft()[0].result():
                    accepted.setdefault(text, label)
                bar.update(len(accepted) - before)
    finally:
        pool.shutdown(cancel_futures=True)


def _sample_chunk(config: GeneratorConfig, state: tuple, picks: list[int]) -> list[tuple[str, int]]:
    """Text and label of the trees numbered ``picks`` (ascending) in the stream that starts at RNG ``state``."""
    rng = random.Random()
    rng.setstate(state)
    sample, skip = tree_samplers(rng, config)
    rows = []
    for index in range(picks[-1] + 1):
        if index != picks[len(rows)]:
            skip()
            continue
        text, length, label = sample()
        if not config.min_length < length < config.max_length:
            raise RuntimeError(f"sample() and skip() drew different trees: length {length} for a candidate")
        rows.append((text, label))
    return rows


def split_path(folder: Path, split: str) -> Path:
    return Path(folder) / f"basic_{split}.tsv"


def write_tsv(path: Path, rows: list[tuple[str, int]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writerow(["Source", "Target"])
        for row in rows:
            source, target = row
            # A text with nothing to escape and an int are written as csv writes them, without its checks per
            # character (the paper's train split: 8.4 s through csv, 1.0 s so); anything else goes through csv.
            if type(source) is str and type(target) is int and not any(c in source for c in '\t\n\r"'):
                f.write(f"{source}\t{target}\n")
            else:
                writer.writerow(row)


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


def read_split(folder: Path, split: str, max_length: int, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read ``basic_<split>.tsv`` into token ids ``(num_samples, max_length)`` uint8 and int64 labels.

    Raises ``FileNotFoundError`` naming the expected layout when the file is missing, and
    ``ValueError`` naming file and line for a malformed header, an unknown token, a bad label or a
    sequence longer than ``max_length`` (nothing is silently truncated).

    A file whose lines hold only tokens, spaces and parentheses, a tab and a one-digit label, each ended by a
    newline (what the generator writes), is read in parts of whole lines by ``workers`` processes (default:
    every core), by bytes operations instead of a loop over tokens. Any other file (CR line ends, other
    whitespace, a label with spaces, an error) is read line by line, which gives the same arrays or names the
    line at fault. Preparing the paper's 100,000 samples (``tasks.prepare_task``: checking the generated files,
    reading the three, writing the cache) on the 2-core VM, idle, 2026-11-28: 11.7 s line by line, 8.2 s by
    bytes with one worker, 5.5 s with two.
    """
    path = split_path(folder, split)
    if not path.is_file():
        raise FileNotFoundError(missing_data_message(Path(folder)))
    arrays = _read_in_parts(path, max_length, workers or available_cores())
    return arrays if arrays is not None else _read_lines(path, max_length)


def _read_lines(path: Path, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The reader of any file csv reads, line by line: the definition of the arrays, and the errors."""
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


# The reader by bytes replaces each operator by one byte (\x01-\x04), so that every token is one byte. A line then
# reads as the line-by-line reader reads it exactly when it holds only tokens, spaces, parentheses and brackets
# (no other byte: "!" below), no two tokens touch (its tokens are split at those only: "xx") and its one tab is
# followed by one token and the newline (a count of "txn"); the ids are then its bytes, less the separators.
HEADER = b"Source\tTarget\n"
_ALPHABET = "".join(sorted(set("".join(VOCAB)) | {" ", "(", ")", "\t", "\n"})).encode()
_OPERATOR_BYTES = [(operator.encode(), bytes([code])) for code, operator in enumerate(OPERATORS, start=1)]


def _byte_table(mapping: dict[bytes, bytes], default: bytes) -> bytes:
    table = bytearray(default * 256)
    for characters, value in mapping.items():
        for character in characters:
            table[character] = value[0]
    return bytes(table)


_TOKEN_CLASS = _byte_table({b"\x01\x02\x03\x04" + "".join(DIGITS).encode(): b"x", b" ()]": b" ", b"\t": b"t", b"\n": b"n"}, b"!")
_TOKEN_ID = _byte_table(
    {
        **{code: bytes([VOCAB[operator.decode()]]) for operator, code in _OPERATOR_BYTES},
        CLOSE.encode(): bytes([VOCAB[CLOSE]]),
        **{digit.encode(): bytes([VOCAB[digit]]) for digit in DIGITS},
        b"\t": b"\xfe",
        b"\n": b"\xff",
    },
    b"\0",
)
#: Bytes of a file each reading process takes at a time.
BYTES_PER_PART = 4 << 20


def _read_in_parts(path: Path, max_length: int, workers: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The arrays of a file whose every line reads by bytes, read in parts of whole lines; None for other files."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.readline() != HEADER:
            return None
        starts = [f.tell()]
        for offset in range(starts[0] + BYTES_PER_PART, size, BYTES_PER_PART):
            f.seek(offset - 1)  # a part starts after the end of the line that holds its first byte
            f.readline()
            if starts[-1] < f.tell() < size:
                starts.append(f.tell())
    parts = [(path, start, end, max_length) for start, end in zip(starts, [*starts[1:], size])]
    workers = min(workers, len(parts))
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        arrays = []
        for part in pool.map(_read_part, *zip(*parts)) if pool else (_read_part(*part) for part in parts):
            if part is None:  # the line-by-line reader reads this file, or names its error: no need to read on
                return None
            arrays.append(part)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    if not sum(len(labels) for _, labels in arrays):
        return None
    return np.concatenate([ids for ids, _ in arrays]), np.concatenate([labels for _, labels in arrays])


def _read_part(path: Path, start: int, end: int, max_length: int) -> tuple[np.ndarray, np.ndarray] | None:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if data.translate(None, _ALPHABET) or not data.endswith(b"\n"):
        return None
    for operator, code in _OPERATOR_BYTES:
        data = data.replace(operator, code)
    classes = data.translate(_TOKEN_CLASS)
    num_lines = classes.count(b"n")
    if b"!" in classes or b"xx" in classes or not classes.count(b"t") == classes.count(b"txn") == num_lines:
        return None
    ids = np.zeros((num_lines, max_length), dtype=np.uint8)
    labels = np.empty(num_lines, dtype=np.int64)
    for index, line in enumerate(data.translate(_TOKEN_ID, b" ()").split(b"\xff")[:-1]):
        length = len(line) - 2  # the tokens, then the tab and the label
        if length > max_length or line[-1] < VOCAB["0"]:
            return None
        ids[index, :length] = np.frombuffer(line, dtype=np.uint8, count=length)
        labels[index] = line[-1] - VOCAB["0"]
    return ids, labels


def read(source: Path, *, max_length: int = 2000, workers: int | None = None) -> Prepared:
    """The three official TSVs of ``source`` (a ``listops-1000`` folder) as token arrays (``workers``: see
    :func:`read_split`)."""
    splits = {}
    for split in SPLITS:
        input_ids, labels = read_split(source, split, max_length, workers)
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


# The outermost-operator rule: what reading the first token alone scores.


def outermost_operators(input_ids: np.ndarray) -> np.ndarray:
    """Each sequence's outermost operator, as its token id: its first token, since the reader drops the parentheses and
    an operator comes before its arguments. ``(n, length) -> (n,)``. A sequence that starts otherwise is not ListOps as
    LRA keeps it (its trees are 500-2000 tokens, never a lone digit), and is named."""
    first = np.asarray(input_ids[:, 0])  # (n,)
    stray = ~np.isin(first, [VOCAB[operator] for operator in OPERATORS])
    if stray.any():
        index = int(stray.argmax())
        raise ValueError(
            f"sequence {index} starts with token id {int(first[index])}, not an operator: the outermost-operator rule "
            "reads ListOps token ids (lra.data.listops.VOCAB)"
        )
    return first


@dataclass(frozen=True)
class OperatorRule:
    """Answer each sequence with the most common label of its outermost operator in a training split (ties: the smaller
    label; an operator the training split never has outermost: its most common label overall). In the paper-size
    generated training split (seed 0, 96000 trees) MAX's value is 9 in 57.0% of its trees, MIN's 0 in 56.6%, MED's 4
    in 21.4% and SM's each digit in about 10%, so the rule scores 36.20% of it where always answering one label scores
    16.97% (``python -m lra.data info``): what a model that has learned the outermost operator and nothing below it
    scores."""

    answers: dict[str, int]  # operator (MAX) -> label
    otherwise: int  # the training split's most common label

    @classmethod
    def fit(cls, input_ids: np.ndarray, labels: np.ndarray) -> OperatorRule:
        operators, labels = outermost_operators(input_ids), np.asarray(labels)
        answers = {}
        for operator in OPERATORS:
            counts = np.bincount(labels[operators == VOCAB[operator]], minlength=NUM_CLASSES)
            if counts.any():
                answers[operator.removeprefix("[")] = int(counts.argmax())  # argmax: the first, smaller label of a tie
        return cls(answers, int(np.bincount(labels, minlength=NUM_CLASSES).argmax()))

    def predict(self, input_ids: np.ndarray) -> np.ndarray:
        """The rule's answer to each sequence ``(n, length) -> (n,)``."""
        operators = outermost_operators(input_ids)
        answers = np.full(len(operators), self.otherwise)
        for operator, label in self.answers.items():
            answers[operators == VOCAB[f"[{operator}"]] = label
        return answers

    def describe(self) -> str:
        """``MAX 9, MED 4, MIN 0, SM 7``, and the answer to the operators training never had outermost, if any."""
        named = ", ".join(f"{operator} {label}" for operator, label in sorted(self.answers.items()))
        return named if len(self.answers) == len(OPERATORS) else f"{named}, otherwise {self.otherwise}"
