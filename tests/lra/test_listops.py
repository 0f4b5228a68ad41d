"""The ListOps generator (official algorithm) and the reader of the official TSV files."""

import csv
import hashlib
import json
import logging
import random

import numpy as np
import pytest

from lra.data import listops
from lra.data.listops import VOCAB, GeneratorConfig
from lra.data.staging import lock_path

SMALL = GeneratorConfig(num_train=300, num_val=40, num_test=40, min_length=10, max_length=120, seed=3)


def evaluate_tokens(source: str) -> int:
    """An independent evaluator: a stack machine over the token stream, parentheses ignored."""
    stack = [[]]
    for token in source.replace("(", " ").replace(")", " ").split():
        if token.startswith("["):
            stack.append([token])
        elif token == "]":
            operator, *args = stack.pop()
            value = {
                "[MIN": min,
                "[MAX": max,
                "[MED": lambda a: int(np.median(a)),
                "[SM": lambda a: sum(a) % 10,
            }[operator](args)
            stack[-1].append(value)
        else:
            stack[-1].append(int(token))
    (result,) = stack[0]
    return result


@pytest.fixture(scope="module")
def small_splits():
    return listops.generate(SMALL)


def test_split_sizes(small_splits):
    assert {split: len(rows) for split, rows in small_splits.items()} == {"train": 300, "val": 40, "test": 40}


def test_every_label_is_the_value_of_its_expression(small_splits):
    for rows in small_splits.values():
        for source, label in rows:
            assert label == evaluate_tokens(source), source


def test_lengths_are_strictly_inside_the_bounds(small_splits):
    lengths = [len(listops.tokenize(source)) for rows in small_splits.values() for source, _ in rows]
    assert SMALL.min_length < min(lengths) and max(lengths) < SMALL.max_length


def test_no_duplicates_within_or_across_splits(small_splits):
    sources = [source for rows in small_splits.values() for source, _ in rows]
    assert len(sources) == len(set(sources))


def test_seeded_determinism(small_splits):
    assert listops.generate(SMALL) == small_splits
    other_seed = GeneratorConfig(**{**SMALL.__dict__, "seed": 4})
    assert listops.generate(other_seed)["train"] != small_splits["train"]


def test_rendering_is_the_official_left_nested_form():
    tree = ("[MAX", [2, ("[SM", [3, 9]), 9])
    assert listops.render(tree) == "( ( ( ( [MAX 2 ) ( ( ( [SM 3 ) 9 ) ] ) ) 9 ) ] )"
    assert listops.evaluate(tree) == 9
    assert listops.evaluate(("[MED", [1, 2, 4, 9])) == 3  # int of the mean of the middle two


def test_sampled_tree_length_counts_tokens_without_parentheses():
    rng = random.Random(0)
    for _ in range(200):
        tree, length = listops.sample_tree(rng, GeneratorConfig())
        assert length == len(listops.tokenize(listops.render(tree)))


def test_official_defaults_reproduce_the_published_statistics():
    """Official settings: lengths 501..1999 with median about 1000, labels 0 and 9 about 17% each."""
    splits = listops.generate(GeneratorConfig(num_train=1500, num_val=1, num_test=1, seed=0))
    lengths = np.array([len(listops.tokenize(source)) for source, _ in splits["train"]])
    labels = np.array([label for _, label in splits["train"]])
    assert 800 < np.median(lengths) < 1200
    assert 0.12 < np.mean(labels == 0) < 0.23 and 0.12 < np.mean(labels == 9) < 0.23
    assert np.mean(labels == 4) < 0.12


def write_official_tsv(path, rows):
    with open(path, "w") as f:
        f.write("Source\tTarget\n")
        for source, target in rows:
            f.write(f"{source}\t{target}\n")


def test_reader_on_a_hand_written_official_file(tmp_path):
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", "9"), ("( ( ( ( [SM 3 ) 4 ) 5 ) ] )", "2")]
    for split in listops.SPLITS:
        write_official_tsv(tmp_path / f"basic_{split}.tsv", rows)
    ids, labels = listops.read_split(tmp_path, "train", max_length=8)
    expected = np.array(
        [
            [VOCAB["[MAX"], VOCAB["2"], VOCAB["9"], VOCAB["]"], 0, 0, 0, 0],
            [VOCAB["[SM"], VOCAB["3"], VOCAB["4"], VOCAB["5"], VOCAB["]"], 0, 0, 0],
        ]
    )
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(labels, [9, 2])
    assert ids.dtype == np.uint8 and listops.PAD_ID == 0 and listops.VOCAB_SIZE == 16
    assert sorted(VOCAB.values()) == list(range(1, 16))


def test_reader_accepts_a_bracket_glued_to_a_digit(tmp_path):
    write_official_tsv(tmp_path / "basic_val.tsv", [("( [MIN 3 7] )", "3")])
    ids, _ = listops.read_split(tmp_path, "val", max_length=4)
    np.testing.assert_array_equal(ids[0], [VOCAB["[MIN"], VOCAB["3"], VOCAB["7"], VOCAB["]"]])


def test_writer_and_reader_round_trip(tmp_path, small_splits):
    listops.write_tsv(tmp_path / "basic_test.tsv", small_splits["test"])
    with open(tmp_path / "basic_test.tsv") as f:
        assert f.readline() == "Source\tTarget\n"
    ids, labels = listops.read_split(tmp_path, "test", max_length=128)
    assert ids.shape == (40, 128)
    for row, (source, _label) in zip(ids, small_splits["test"]):
        tokens = listops.tokenize(source)
        np.testing.assert_array_equal(row[: len(tokens)], [VOCAB[t] for t in tokens])
        assert (row[len(tokens) :] == 0).all()
    np.testing.assert_array_equal(labels, [label for _, label in small_splits["test"]])


@pytest.mark.parametrize(
    "rows, header, message",
    [
        ([("( [MIN 3 x ] )", "3")], "Source\tTarget", "unknown ListOps token 'x'"),
        ([("( [MIN 3 4 ] )", "12")], "Source\tTarget", "label must be an integer 0-9"),
        ([("( [MIN 3 4 ] )", "3")], "text\tlabel", "expected the header"),
        ([("( [MIN 3 4 5 6 7 8 ] )", "3")], "Source\tTarget", "exceed max_length=4"),
    ],
)
def test_reader_errors_name_file_line_and_problem(tmp_path, rows, header, message):
    with open(tmp_path / "basic_train.tsv", "w") as f:
        f.write(header + "\n")
        for source, target in rows:
            f.write(f"{source}\t{target}\n")
    with pytest.raises(ValueError, match=message) as error:
        listops.read_split(tmp_path, "train", max_length=4)
    assert "basic_train.tsv" in str(error.value)


def test_missing_folder_names_it_and_how_to_get_the_data(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        listops.read_split(tmp_path / "nowhere", "train", max_length=8)
    message = str(error.value)
    assert str(tmp_path / "nowhere") in message
    assert "listops-1000" in message and "task.data.source=generated" in message


def test_ensure_generated_writes_once(tmp_path, monkeypatch):
    folder = listops.ensure_generated(tmp_path, SMALL)
    assert sorted(p.name for p in folder.iterdir()) == ["basic_test.tsv", "basic_train.tsv", "basic_val.tsv", "generator.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock_path(folder).name, folder.name], "no staging folder is left"

    def fail(config):
        raise AssertionError("the data was generated a second time")

    monkeypatch.setattr(listops, "generate", fail)
    assert listops.ensure_generated(tmp_path, SMALL) == folder
    with open(folder / "basic_train.tsv") as f:
        assert sum(1 for _ in csv.reader(f, delimiter="\t")) == 301


def test_generator_json_records_each_files_samples_bytes_and_sha256(tmp_path):
    folder = listops.ensure_generated(tmp_path, SMALL)
    recorded = json.loads((folder / "generator.json").read_text())
    assert {key: recorded[key] for key in ("num_train", "seed")} == {"num_train": 300, "seed": 3}
    files = recorded["files"]
    assert sorted(files) == ["basic_test.tsv", "basic_train.tsv", "basic_val.tsv"]
    assert [files[f"basic_{s}.tsv"]["num_samples"] for s in listops.SPLITS] == [300, 40, 40]
    train = folder / "basic_train.tsv"
    assert files["basic_train.tsv"]["num_bytes"] == train.stat().st_size
    assert files["basic_train.tsv"]["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest()


@pytest.mark.parametrize("damage", ["truncated", "same size, other contents", "deleted"])
def test_a_damaged_generated_file_is_named_and_generated_again(tmp_path, caplog, damage):
    folder = listops.ensure_generated(tmp_path, SMALL)
    train = folder / "basic_train.tsv"
    intact = train.read_bytes()
    if damage == "truncated":  # the case: the file cut to its first lines
        train.write_bytes(b"".join(intact.splitlines(keepends=True)[:101]))
    elif damage == "deleted":
        train.unlink()
    else:
        first_label = intact.index(b"\t") + 1
        train.write_bytes(intact[:first_label] + bytes([intact[first_label] ^ 1]) + intact[first_label + 1 :])

    with caplog.at_level(logging.INFO, logger="lra.data.listops"):
        assert listops.ensure_generated(tmp_path, SMALL) == folder

    assert train.read_bytes() == intact, "the seed reproduces the files"
    (line,) = [r.getMessage() for r in caplog.records if "again" in r.getMessage()]
    assert "Generating ListOps again: basic_train.tsv" in line
    expected = {"truncated": "bytes (generator.json records", "deleted": "is missing", "same size, other contents": "SHA-256"}
    assert expected[damage] in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [lock_path(folder).name, folder.name], "no staging folder is left"


def test_a_folder_generated_before_records_existed_is_generated_again(tmp_path, caplog):
    folder = listops.ensure_generated(tmp_path, SMALL)
    recorded = json.loads((folder / "generator.json").read_text())
    del recorded["files"]
    (folder / "generator.json").write_text(json.dumps(recorded))
    (folder / "basic_val.tsv").write_text("Source\tTarget\n")  # nothing could tell this damage apart
    with caplog.at_level(logging.INFO, logger="lra.data.listops"):
        listops.ensure_generated(tmp_path, SMALL)
    assert "records no sizes or checksums" in caplog.text
    assert len(listops.read_split(folder, "val", 120)[1]) == 40 and "files" in json.loads((folder / "generator.json").read_text())


def token_ids(*sources: str) -> np.ndarray:
    """The reader's token ids of ``sources``, padded to the longest."""
    tokens = [[VOCAB[token] for token in listops.tokenize(source)] for source in sources]
    ids = np.zeros((len(tokens), max(map(len, tokens))), dtype=np.uint8)
    for row, sequence in zip(ids, tokens):
        row[: len(sequence)] = sequence
    return ids


def test_the_outermost_operator_is_the_first_token_the_reader_gives(tmp_path, small_splits):
    """Read back from the official files, each generated sequence's outermost operator is the first bracketed word of
    its source text."""
    listops.write_splits(tmp_path, small_splits)
    for split in listops.SPLITS:
        ids, _ = listops.read_split(tmp_path, split, SMALL.max_length)
        first_words = [next(w for w in source.split() if w.startswith("[")) for source, _ in small_splits[split]]
        assert listops.outermost_operators(ids).tolist() == [VOCAB[word] for word in first_words]
    with pytest.raises(ValueError, match=r"sequence 1 starts with token id 14, not an operator"):
        listops.outermost_operators(np.array([[VOCAB["[MAX"], VOCAB["9"]], [VOCAB["8"], 0]]))


def test_the_operator_rule_answers_each_operators_most_common_training_label():
    """MAX's training labels 9, 9, 8: it answers 9; MIN's 0, 1, 1: 1; MED's 4, 5: the smaller of the tie; SM, never
    outermost in training: the most common training label overall (9 and 1 twice each: 1)."""
    sources = ["[MAX 9 1 ]", "[MAX 9 2 ]", "[MAX 8 ]", "[MIN 0 ]", "[MIN 1 ]", "[MIN 1 3 ]", "[MED 4 ]", "[MED 5 ]"]
    rule = listops.OperatorRule.fit(token_ids(*sources), np.array([9, 9, 8, 0, 1, 1, 4, 5]))
    assert rule.answers == {"MAX": 9, "MIN": 1, "MED": 4} and rule.otherwise == 1
    assert rule.describe() == "MAX 9, MED 4, MIN 1, otherwise 1"
    assert rule.predict(token_ids("[SM 3 4 ]", "[MED [MAX 2 7 ] 3 ]", "[MIN 5 ]", "[MAX 0 ]")).tolist() == [1, 4, 1, 9]
    complete = listops.OperatorRule.fit(token_ids("[MAX 9 ]", "[MIN 0 ]", "[MED 4 ]", "[SM 3 ]"), np.array([9, 0, 4, 3]))
    assert complete.describe() == "MAX 9, MED 4, MIN 0, SM 3"


@pytest.mark.parametrize("seed", [0, 1])
def test_the_operator_rule_scores_about_36_percent_of_the_official_distribution(seed):
    """On trees of the official settings MAX's most common value is 9 and MIN's 0 (each about 57% of their trees), so
    the rule fitted on one draw answers a second, independent draw at about 36%: twice the majority class's 17%."""
    splits = listops.generate(GeneratorConfig(num_train=1200, num_val=1, num_test=800, seed=seed))
    train, test = splits["train"], splits["test"]
    rule = listops.OperatorRule.fit(token_ids(*(s for s, _ in train)), np.array([label for _, label in train]))
    assert rule.answers["MAX"] == 9 and rule.answers["MIN"] == 0
    answers = rule.predict(token_ids(*(s for s, _ in test)))
    labels = np.array([label for _, label in test])
    assert 0.31 < np.mean(answers == labels) < 0.41
    assert np.mean(answers == labels) > np.mean(labels == np.bincount(labels).argmax()) + 0.1
