"""The fast ListOps generator and reader make exactly the files and arrays of the straightforward algorithm.

The reference below is the generator and reader as they were before they were made fast (``sample_tree``,
``render``, ``evaluate`` and a csv loop, calling ``randint`` and ``choice``), kept here so that the module's own
copies cannot drift with the code they check. The SHA-256 values were computed with that code
(``lra/data/listops.py`` at commit df5e299, Python 3.11): ``write_generated(folder, config, generate(config))``,
then ``generator.json``'s record of each file and ``sha256(ids.tobytes() + labels.tobytes())`` of
``read_split(folder, split, config.max_length)``. Should a Python draw ``randint`` or ``choice`` otherwise, the
comparisons with the reference fail and those with the SHA-256 values still pass: the files stay these.
"""

import csv
import functools
import hashlib
import json
import random
import statistics

import numpy as np
import pytest

from lra.data import listops
from lra.data.listops import OPERATORS, SPLITS, VOCAB, GeneratorConfig


def reference_tree(rng, config, depth=1):
    r = rng.random() if depth < config.max_depth else 1.0
    if r > config.value_probability:
        return rng.randint(0, 9), 1
    num_args = rng.randint(2, config.max_args)
    children, length = [], 2
    for _ in range(num_args):
        child, child_length = reference_tree(rng, config, depth + 1)
        children.append(child)
        length += child_length
    return (rng.choice(OPERATORS), children), length


def reference_render(tree):
    if isinstance(tree, int):
        return str(tree)
    operator, children = tree
    text = operator
    for child in children:
        text = f"( {text} {reference_render(child)} )"
    return f"( {text} ] )"


def reference_evaluate(tree):
    if isinstance(tree, int):
        return tree
    operator, children = tree
    args = [reference_evaluate(child) for child in children]
    return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(statistics.median(a)), "[SM": lambda a: sum(a) % 10}[operator](args)


@functools.cache
def reference_generate(config):
    rng = random.Random(config.seed)
    accepted = {}
    while len(accepted) < config.total:
        tree, length = reference_tree(rng, config)
        if config.min_length < length < config.max_length:
            text = reference_render(tree)
            if text not in accepted:
                accepted[text] = reference_evaluate(tree)
    rows = list(accepted.items())
    a, b = config.num_train, config.num_train + config.num_val
    return {"train": rows[:a], "val": rows[a:b], "test": rows[b:]}


def reference_read(path, max_length):
    ids, labels = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if next(reader, None) != ["Source", "Target"]:
            raise ValueError("expected the header")
        for row in reader:
            if len(row) != 2:
                raise ValueError("expected 2 tab-separated fields")
            source, target = row
            tokens = [VOCAB[t] for t in source.replace("(", " ").replace(")", " ").replace("]", " ] ").split()]
            if len(tokens) > max_length:
                raise ValueError("exceed max_length")
            if not target.strip().isdigit() or not 0 <= int(target) < 10:
                raise ValueError("label must be an integer 0-9")
            row_ids = np.zeros(max_length, dtype=np.uint8)
            row_ids[: len(tokens)] = tokens
            ids.append(row_ids)
            labels.append(int(target))
    if not ids:
        raise ValueError("no samples")
    return np.stack(ids), np.asarray(labels, dtype=np.int64)


SMALL = GeneratorConfig(num_train=300, num_val=40, num_test=40, min_length=10, max_length=120, seed=3)
# Short trees of few shapes: 13 of the first 223 candidates repeat an earlier one, so dropping duplicates and
# drawing more once a chunk's duplicates are known both matter.
REPEATS = GeneratorConfig(num_train=150, num_val=30, num_test=30, min_length=2, max_length=9, max_depth=3, max_args=4, seed=5)
MID = GeneratorConfig(num_train=2000, num_val=100, num_test=100, seed=1)  # the official lengths, 2,200 samples
EDGES = [
    GeneratorConfig(num_train=5, num_val=2, num_test=3, min_length=0, max_length=2, max_depth=1, seed=1),
    GeneratorConfig(num_train=20, num_val=3, num_test=3, min_length=3, max_length=6, max_depth=2, max_args=3, seed=2),
    GeneratorConfig(num_train=50, num_val=5, num_test=5, min_length=3, max_length=30, max_args=2, seed=7),
    GeneratorConfig(num_train=40, num_val=5, num_test=5, min_length=20, max_length=200, max_args=17, value_probability=0.1),
]
EDGE_NAMES = ["digits only", "depth 2", "two arguments (1-bit draws)", "17 arguments (5-bit draws)"]

EXPECTED_FILES = {
    SMALL: {
        "basic_train.tsv": "3ec9e86f1b4b069f465e275fdd57c9693a441659e2b9496b3d9dfd0e71d8c632",
        "basic_val.tsv": "94db56b1e24e12c843271a1c1a2853dcae61c8dee90c30dce849c5904f39a9d4",
        "basic_test.tsv": "44a04fb8c9a38ff70ebb550de24a81b747635366595b0d0f0b0b440321df82da",
    },
    REPEATS: {
        "basic_train.tsv": "ad468e786d9ebd5090a0ece4ae7c86df1ee7f2305dabfe2777d2759f37af057f",
        "basic_val.tsv": "49855157cd6cd9ee7855dc65d10646e7212b752206e3c377940220267179814d",
        "basic_test.tsv": "96f87fbac4554ca046db4dd7783c98f5854b4109abd8aa1ed7666b2468c72e7a",
    },
    MID: {
        "basic_train.tsv": "5b2d778fc949be81ae342240524ca56b3328b0282fc6e81faaa627a7cff323f0",
        "basic_val.tsv": "2a0c19f2bb22d2b89228ac5b37539d5a761ff1a82793debcf4ccf17cce3af6d1",
        "basic_test.tsv": "774be8d82de9f661623db1c098db28116de31c3d201f9e85fd49c350ed8a2615",
    },
    GeneratorConfig(): {  # the paper's 96,000/2,000/2,000
        "basic_train.tsv": "f2134e02921e579f3bf4ac9d239360e790d8f3069666c7a99a65421dc41c847a",
        "basic_val.tsv": "aea1cad9ed11a71eec007f84b190aedc19b43549c6f0f51038c809bb9d922b3c",
        "basic_test.tsv": "0ac24a272f60037d106e02d2ca5c7b2c62b4817abab468a6169928a285b9b22b",
    },
}
EXPECTED_ARRAYS = {
    SMALL: {
        "train": "6de383609db38ed3796ddc2f93dc7bcdf89ea778cd7f482450c3d67407ca5d16",
        "val": "b02ed9b3348d41e26d74afd49cba743dc57c7b9c21b3b9d376d716a6a561564e",
        "test": "89cf125a62a4d723ea8bd4434221ec27c4340188756fddec86c897fe71fc5f72",
    },
    REPEATS: {
        "train": "dd25ee138ab13f2854d9fe43d6c8e924806d8e014a8f267dcb8351c2b79e8e4f",
        "val": "66e54ebf6d16b6c496be45a50f0de88cb2c608b2133e95455a9c2769c37a67bf",
        "test": "b40931c6aa97df280773f8378fdf3eded2cce0af94c725487a92b7cea46d1b15",
    },
    MID: {
        "train": "d1df8d5516a59c6d2ca8761ce77749ca3ffbcb429276b9c896da52f0a042e30c",
        "val": "57a944d6c451e038ee6a6010ece109335e32ce767dccba02e70dc35a20185435",
        "test": "bb483e7b8df2cfd6247a754f04890b149e0fb083fb4444c58a05f9742d1e6117",
    },
    GeneratorConfig(): {
        "train": "5ca35bd41271ee8a07234dabb07161eb4bd132c935af303ed729b9da65ab1182",
        "val": "a2d1edbc88b98a0a28f588fb4d371e3daa61f5d1e99f4ca7d1595fecdb4d7881",
        "test": "d735ded83c66d70c5b17829c146d26660688d40e6e634275a75c37e5500617d7",
    },
}


def arrays_sha256(ids, labels):
    assert ids.dtype == np.uint8 and labels.dtype == np.int64
    return hashlib.sha256(ids.tobytes() + labels.tobytes()).hexdigest()


def generate_and_check(folder, config, workers):
    """Generate ``config`` into ``folder`` and compare the record of its files and the arrays read from them."""
    listops.write_generated(folder, config, listops.generate(config, workers=workers))
    files = json.loads((folder / listops.GENERATOR_JSON).read_text())["files"]
    assert {name: entry["sha256"] for name, entry in files.items()} == EXPECTED_FILES[config]
    arrays = {split: arrays_sha256(*listops.read_split(folder, split, config.max_length, workers)) for split in SPLITS}
    assert arrays == EXPECTED_ARRAYS[config]


@pytest.mark.parametrize("config", [SMALL, REPEATS, MID], ids=["small", "repeats", "mid"])
@pytest.mark.parametrize("workers", [1, 3])
def test_files_and_arrays_are_the_original_generators(tmp_path, monkeypatch, config, workers):
    # Chunks of 64 candidates: the small sets go through the worker processes in several chunks, too.
    monkeypatch.setattr(listops, "CANDIDATES_PER_CHUNK", 64)
    monkeypatch.setattr(listops, "BYTES_PER_PART", 50_000)  # the files are read in several parts
    generate_and_check(tmp_path, config, workers)


@pytest.mark.slow
def test_the_papers_files_and_arrays_are_the_original_generators(tmp_path):
    generate_and_check(tmp_path, GeneratorConfig(), None)


@pytest.mark.parametrize("config", [SMALL, REPEATS, *EDGES], ids=["small", "repeats", *EDGE_NAMES])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("workers", [1, 2])
def test_generation_is_the_reference_whatever_the_workers_and_chunks(monkeypatch, config, chunk, workers):
    monkeypatch.setattr(listops, "CANDIDATES_PER_CHUNK", chunk)
    assert listops.generate(config, workers=workers) == reference_generate(config)


@pytest.mark.parametrize("config", [SMALL, REPEATS, *EDGES, GeneratorConfig()], ids=["small", "repeats", *EDGE_NAMES, "paper"])
def test_the_samplers_draw_what_sample_tree_draws(config):
    """Tree by tree, ``sample`` and ``skip`` leave the RNG where ``randint`` and ``choice`` leave it."""
    reference, fast = random.Random(11), random.Random(11)
    sample, skip = listops.tree_samplers(fast, config)
    for index in range(300):
        tree, length = reference_tree(reference, config)
        if index % 2:
            assert sample() == (reference_render(tree), length, reference_evaluate(tree))
        else:
            assert skip() == length
        assert fast.getstate() == reference.getstate()


def write_lines(path, text):
    path.write_bytes(text.encode())


# Files the reader by bytes must read as the csv loop does, or hand over to it: each is one split file.
ODD_FILES = {
    "generated form": "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [SM 3 ) 4 ) ] )\t7\n",
    "glued brackets and parentheses": "Source\tTarget\n([MIN 3 7])\t3\n(( [MED(1)2 )])\t1\n",
    "empty source": "Source\tTarget\n\t4\n( [SM 3 ] )\t3\n",
    "CRLF": "Source\tTarget\r\n( [MIN 3 7 ] )\t3\r\n",
    "CR inside a line": "Source\tTarget\n( [MIN 3\r7 ] )\t3\n",
    "label with spaces": "Source\tTarget\n( [MIN 3 7 ] )\t 3 \n",
    "label 03": "Source\tTarget\n( [MIN 3 7 ] )\t03\n",
    "vertical tab between tokens": "Source\tTarget\n( [MIN 3\x0b7 ] )\t3\n",
    "non-ASCII space": "Source\tTarget\n( [MIN 3\xa07 ] )\t3\n",
    "no final newline": "Source\tTarget\n( [MIN 3 7 ] )\t3",
    "touching digits": "Source\tTarget\n( [MIN 37 ] )\t3\n",
    "operator glued to a digit": "Source\tTarget\n( [MIN3 7 ] )\t3\n",
    "digit glued to an operator": "Source\tTarget\n( 3[MIN 7 ] )\t3\n",
    "unknown operator": "Source\tTarget\n( [MIX 3 7 ] )\t3\n",
    "lower-case operator": "Source\tTarget\n( [min 3 7 ] )\t3\n",
    "stray letters": "Source\tTarget\n( [MINN 3 7 ] )\t3\n",
    "bracket alone": "Source\tTarget\n( [ 3 7 ] )\t3\n",
    "operator as label": "Source\tTarget\n( [MIN 3 7 ] )\t[SM\n",
    "bracket as label": "Source\tTarget\n( [MIN 3 7 ] )\t]\n",
    "label 10": "Source\tTarget\n( [MIN 3 7 ] )\t10\n",
    "two tabs": "Source\tTarget\n( [MIN 3 7 ] )\t3\t4\n",
    "no tab": "Source\tTarget\n( [MIN 3 7 ] ) 3\n",
    "blank line": "Source\tTarget\n( [MIN 3 7 ] )\t3\n\n",
    "too long": "Source\tTarget\n( [MIN 3 7 1 2 3 4 5 ] )\t3\n",
    "other header": "source\ttarget\n( [MIN 3 7 ] )\t3\n",
    "header only": "Source\tTarget\n",
    "control bytes": "Source\tTarget\n( [MIN 3 \x01 7 ] )\t3\n",
}


@pytest.mark.parametrize("name", ODD_FILES)
def test_the_reader_reads_any_file_as_the_csv_loop_does(tmp_path, name):
    write_lines(tmp_path / "basic_train.tsv", ODD_FILES[name])
    try:
        expected = reference_read(tmp_path / "basic_train.tsv", max_length=8)
    except (ValueError, KeyError):
        with pytest.raises(ValueError, match=r"basic_train\.tsv"):
            listops.read_split(tmp_path, "train", max_length=8)
        return
    ids, labels = listops.read_split(tmp_path, "train", max_length=8)
    assert ids.dtype == np.uint8 and labels.dtype == np.int64
    np.testing.assert_array_equal(ids, expected[0])
    np.testing.assert_array_equal(labels, expected[1])


def test_an_error_past_the_first_part_is_named_with_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(listops, "BYTES_PER_PART", 200)
    rows = listops.generate(SMALL, workers=1)["train"]
    listops.write_tsv(tmp_path / "basic_train.tsv", rows[:200] + [("( [MIN 3 x ] )", 3)] + rows[200:])
    with pytest.raises(ValueError, match=r"basic_train\.tsv:202: unknown ListOps token 'x'"):
        listops.read_split(tmp_path, "train", max_length=120, workers=2)


@pytest.mark.parametrize(
    "rows",
    [
        [("( [MIN 3 7 ] )", 3), ("( [SM 3 4 ] )", 7)],
        [("x", "7"), ("y", True), ("", 3), ("z", 2.5), ("q", None), ("a\rb", 1), (np.str_("s"), np.int64(4))],
        [("fine", 1), ('a"b', 1)],
        [("a\tb", 1)],
        [("a\nb", 1)],
    ],
    ids=["ints", "other types", "quote", "tab", "newline"],
)
def test_write_tsv_writes_what_csv_writes(tmp_path, rows):
    def written(write, path):
        try:
            write(path, rows)
        except csv.Error as error:
            return str(error)
        return path.read_bytes()

    def csv_write(path, rows):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
            writer.writerow(["Source", "Target"])
            writer.writerows(rows)

    assert written(listops.write_tsv, tmp_path / "fast.tsv") == written(csv_write, tmp_path / "csv.tsv")
