"""The readers of the official Text (IMDb), Retrieval (AAN), Image (CIFAR-10) and Pathfinder files.

Every fixture is written here in the official on-disk format; the expected tokens are computed
independently of the readers (byte + 1 per byte, the grayscale formula per pixel, the PNG's pixels).
"""

import csv
import io
import os
import pickle
import re
import struct

import numpy as np
import pytest
from PIL import Image

from lra.data import image, pathfinder, retrieval, text
from lra.data.formats import SPLITS


def padded(values, length):
    values = list(values)[:length]
    return values + [0] * (length - len(values))


def byte_ids(data, length):
    return padded((b + 1 for b in data), length)


# ----------------------------------------------------------------------------------------- text

REVIEWS = {  # split -> folder -> id -> file contents
    "train": {
        "neg": {10: b"Dull.", 2: "Au café, 😀 non.".encode()},
        "pos": {7: b"  Great film, twelve+ bytes long.\n", 3: b"Fine"},
    },
    "test": {
        "neg": {0: b"Bad"},
        "pos": {5: "Très bien".encode(), 11: b'"Quoted" praise'},
    },
}
RATINGS = {"neg": 2, "pos": 9}
TEXT_LENGTH = 12


def write_imdb(root):
    for split, folders in REVIEWS.items():
        for folder, reviews in folders.items():
            (root / split / folder).mkdir(parents=True)
            for review_id, data in reviews.items():
                (root / split / folder / f"{review_id}_{RATINGS[folder]}.txt").write_bytes(data)
    (root / "train" / "unsup").mkdir()
    (root / "train" / "unsup" / "0_0.txt").write_bytes(b"unlabelled, not read")
    (root / "imdb.vocab").write_text("the\nand\n")
    (root / "train" / "urls_pos.txt").write_text("http://www.imdb.com/title/tt0453418/usercomments\n")
    return root


@pytest.fixture
def imdb(tmp_path):
    return write_imdb(tmp_path / "aclImdb")


def test_text_tokens_are_bytes_plus_one_in_neg_then_pos_numeric_id_order(imdb):
    prepared = text.read(imdb, max_length=TEXT_LENGTH)
    for split in ("train", "test"):
        expected_ids, expected_labels = [], []
        for folder, label in (("neg", 0), ("pos", 1)):
            for review_id in sorted(REVIEWS[split][folder]):  # numeric: 2 before 10
                expected_ids.append(byte_ids(REVIEWS[split][folder][review_id].strip(), TEXT_LENGTH))
                expected_labels.append(label)
        got = prepared.splits[split]
        assert got.arrays["input_ids"].dtype == np.uint16
        np.testing.assert_array_equal(got.arrays["input_ids"], np.array(expected_ids))
        np.testing.assert_array_equal(got.labels, expected_labels)
    assert prepared.notes == {"truncated_to_max_length": {"train": 2, "test": 1}}


def test_text_keeps_utf8_bytes_strips_surrounding_whitespace_and_truncates(imdb):
    rows = text.read(imdb, max_length=TEXT_LENGTH).splits["train"].arrays["input_ids"]
    cafe = "Au café, 😀 non.".encode()
    assert len(cafe) > TEXT_LENGTH and rows[0].tolist() == [b + 1 for b in cafe[:TEXT_LENGTH]]
    assert rows[0][6:8].tolist() == [0xC3 + 1, 0xA9 + 1]  # é is two bytes
    assert rows[0][10:12].tolist() == [0xF0 + 1, 0x9F + 1]  # the emoji's first two of four bytes
    assert rows[1].tolist() == byte_ids(b"Dull.", TEXT_LENGTH)
    assert rows[3].tolist() == byte_ids(b"Great film, twelve+", TEXT_LENGTH)  # no leading spaces


def test_text_val_is_the_test_split_and_default_length_is_4000(imdb):
    prepared = text.read(imdb)
    assert tuple(prepared.splits) == SPLITS
    assert prepared.splits["val"] is prepared.splits["test"]
    assert prepared.splits["train"].arrays["input_ids"].shape == (4, 4000)


def test_text_empty_review_is_an_error_naming_the_file(imdb):
    (imdb / "test" / "pos" / "12_8.txt").write_bytes(b" \n")
    with pytest.raises(ValueError, match=r"12_8\.txt: the review is empty"):
        text.read(imdb, max_length=TEXT_LENGTH)


def test_text_missing_label_folder_is_named(imdb):
    for path in (imdb / "test" / "pos").iterdir():
        path.unlink()
    (imdb / "test" / "pos").rmdir()
    with pytest.raises(FileNotFoundError, match=r"test/pos does not exist"):
        text.read(imdb, max_length=TEXT_LENGTH)


def test_text_missing_source_names_layout_download_and_command(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        text.read(tmp_path / "nowhere" / "aclImdb")
    message = str(error.value)
    for expected in (
        "train/pos",
        "test/neg",
        "<id>_<rating>.txt",
        text.IMDB_URL,
        "python -m lra.data prepare text --source <dir>/aclImdb",
    ):
        assert expected in message


# ------------------------------------------------------------------------------------ retrieval

AAN_LENGTH = 8


def write_aan(folder, train=None):
    folder.mkdir(parents=True, exist_ok=True)
    train = train or (
        b"1\tA1\tB1\tplain text one\tsecond doc\n"
        b'0.0\tA2\tB2\t"quoted\tspan" x\n'  # 5 fields: quotes are literal bytes
        b'1.0\tA3\tB3\tcaf\xc3\xa9 \xff\t"\r\n'  # \xff -> 256; text2 is one quote; \r\n ends the record
    )
    (folder / "new_aan_pairs.train.tsv").write_bytes(train)
    (folder / "new_aan_pairs.eval.tsv").write_bytes(b"0\tC\tD\tx\ty")  # no final newline
    (folder / "new_aan_pairs.test.tsv").write_bytes(b"1\tE\tF\tsame\tsame\n\n")  # a final empty line
    return folder


@pytest.fixture
def aan(tmp_path):
    return write_aan(tmp_path / "lra_release" / "tsv_data")


def test_retrieval_splits_fields_on_every_tab_with_quotes_literal(aan):
    prepared = retrieval.read(aan, max_length=AAN_LENGTH)
    train = prepared.splits["train"]
    expected_0 = [byte_ids(text, AAN_LENGTH) for text in (b"plain text one", b'"quoted', b"caf\xc3\xa9 \xff")]
    expected_1 = [byte_ids(text, AAN_LENGTH) for text in (b"second doc", b'span" x', b'"')]
    assert train.arrays["input_ids_0"].dtype == train.arrays["input_ids_1"].dtype == np.uint16
    np.testing.assert_array_equal(train.arrays["input_ids_0"], expected_0)
    np.testing.assert_array_equal(train.arrays["input_ids_1"], expected_1)
    assert train.arrays["input_ids_0"][2, 6] == 256  # byte 0xff
    np.testing.assert_array_equal(train.labels, [1, 0, 1])
    np.testing.assert_array_equal(prepared.splits["val"].arrays["input_ids_1"], [byte_ids(b"y", AAN_LENGTH)])
    np.testing.assert_array_equal(prepared.splits["test"].labels, [1])
    assert prepared.notes == {"truncated_to_max_length": {"train": 2, "val": 0, "test": 0}}


def test_a_quote_aware_csv_reader_would_merge_the_quoted_tab():
    line = '0.0\tA2\tB2\t"quoted\tspan" x'
    assert len(next(csv.reader(io.StringIO(line), delimiter="\t"))) == 4  # the trap the reader avoids
    assert len(line.split("\t")) == 5


def test_retrieval_default_length_is_4000_per_document(aan):
    train = retrieval.read(aan).splits["train"]
    assert train.arrays["input_ids_0"].shape == train.arrays["input_ids_1"].shape == (3, 4000)


@pytest.mark.parametrize(
    "row, message",
    [
        (b"1\tA\tB\tonly four", r"new_aan_pairs\.train\.tsv:2: expected 5 tab-separated fields .* got 4"),
        (b"1\tA\tB\tx\ty\tz", r"new_aan_pairs\.train\.tsv:2: expected 5 tab-separated fields .* got 6"),
        (b"2\tA\tB\tx\ty", r"new_aan_pairs\.train\.tsv:2: the label must be 0 or 1, got b'2'"),
        (b"yes\tA\tB\tx\ty", r"new_aan_pairs\.train\.tsv:2: the label must be 0 or 1"),
        (b"0\tA\tB\t\ty", r"new_aan_pairs\.train\.tsv:2: text1 is empty"),
        (b"", r"new_aan_pairs\.train\.tsv:2: empty line"),
    ],
)
def test_retrieval_bad_rows_are_errors_naming_file_and_line(tmp_path, row, message):
    folder = write_aan(tmp_path / "tsv_data", train=b"1\tA\tB\tx\ty\n" + row + b"\n1\tA\tB\tx\ty\n")
    with pytest.raises(ValueError, match=message):
        retrieval.read(folder, max_length=AAN_LENGTH)


def test_retrieval_missing_files_name_layout_and_release(aan):
    (aan / "new_aan_pairs.eval.tsv").unlink()
    with pytest.raises(FileNotFoundError) as error:
        retrieval.read(aan)
    message = str(error.value)
    for expected in (
        "missing new_aan_pairs.eval.tsv",
        "new_aan_pairs.train.tsv",
        "lra_release/tsv_data",
        "https://storage.googleapis.com/long-range-arena/lra_release.gz",
        "tar",
    ):
        assert expected in message


# ---------------------------------------------------------------------------------------- image

BATCH_SIZE = 2  # per data batch: 10 training images -> train 9, val 1
TEST_SIZE = 3


def random_batch(rng, size):
    return rng.integers(0, 256, size=(size, 3072), dtype=np.uint8), [int(x) for x in rng.integers(0, 10, size)]


def write_batch(path, data, labels):
    """As the CIFAR-10 python files: a pickled dict with bytes keys, uint8 data and a list of ints."""
    batch = {
        b"batch_label": b"training batch",
        b"labels": labels,
        b"data": data,
        b"filenames": [f"image_{i}.png".encode() for i in range(len(labels))],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=4)


@pytest.fixture
def cifar(tmp_path):
    """The folder and its batches; image 0 of data_batch_1 has known colours in its first pixels."""
    rng = np.random.default_rng(5)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = {}
    for name in (*image.TRAIN_FILES, image.TEST_FILE):
        batches[name] = random_batch(rng, TEST_SIZE if name == image.TEST_FILE else BATCH_SIZE)
    data = batches["data_batch_1"][0]
    for pixel, rgb in enumerate([(255, 255, 255), (255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (100, 150, 200)]):
        data[0, pixel], data[0, 1024 + pixel], data[0, 2048 + pixel] = rgb
    for name, (data, labels) in batches.items():
        write_batch(folder / name, data, labels)
    return folder, batches


def gray_pixel(r, g, b):
    """tf.image.rgb_to_grayscale on one uint8 pixel, step by step in float32."""
    f32 = np.float32
    scale = f32(1.0 / 255.0)
    gray = (f32(r) * scale) * f32(0.2989) + (f32(g) * scale) * f32(0.5870) + (f32(b) * scale) * f32(0.1140)
    return int(f32(gray) * f32(255.5))  # convert_image_dtype back to uint8: * 255.5, truncate


def gray_image(row):
    """One CIFAR row (red, green, blue planes of 32x32) to 1024 gray tokens, row-major."""
    pixels = [y * 32 + x for y in range(32) for x in range(32)]
    return [gray_pixel(row[i], row[1024 + i], row[2048 + i]) for i in pixels]


def test_image_grayscale_matches_tensorflow_formula_per_pixel(cifar):
    folder, batches = cifar
    prepared = image.read(folder)
    train_rows = [row for name in image.TRAIN_FILES for row in batches[name][0]]
    train_labels = [label for name in image.TRAIN_FILES for label in batches[name][1]]
    expected = {
        "train": ([gray_image(row) for row in train_rows[:9]], train_labels[:9]),
        "val": ([gray_image(row) for row in train_rows[9:]], train_labels[9:]),
        "test": ([gray_image(row) for row in batches[image.TEST_FILE][0]], batches[image.TEST_FILE][1]),
    }
    for split, (ids, labels) in expected.items():
        got = prepared.splits[split]
        assert got.arrays["input_ids"].dtype == np.uint8
        np.testing.assert_array_equal(got.arrays["input_ids"], np.array(ids))
        np.testing.assert_array_equal(got.labels, labels)
    # white, red, green, blue, black and (100, 150, 200), worked out by hand with 0.2989/0.5870/0.1140
    assert prepared.splits["train"].arrays["input_ids"][0, :6].tolist() == [255, 76, 149, 29, 0, 141]
    assert {split: len(s) for split, s in prepared.splits.items()} == {"train": 9, "val": 1, "test": 3}


def python2_pickle(data, labels):
    """The opcodes Python 2's cPickle (protocol 2) wrote for the official files: str (bytes) keys and
    data, and the array rebuilt by numpy.core.multiarray._reconstruct, numpy.ndarray and numpy.dtype."""
    raw = data.tobytes()
    return b"".join(
        [
            b"\x80\x02}(U\x04data",
            b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R",
            b"(K\x01M" + struct.pack("<H", len(data)) + b"M\x00\x0c\x86cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R",
            b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89T" + struct.pack("<I", len(raw)) + raw + b"tb",
            b"U\x06labels](" + b"".join(b"K" + bytes([label]) for label in labels) + b"eu.",
        ]
    )


def test_image_reads_batches_pickled_by_python2_like_the_official_files(cifar):
    folder, batches = cifar
    for name, (data, labels) in batches.items():
        (folder / name).write_bytes(python2_pickle(data, labels))
    prepared = image.read(folder)
    test_rows, test_labels = batches[image.TEST_FILE]
    np.testing.assert_array_equal(prepared.splits["test"].arrays["input_ids"], [gray_image(row) for row in test_rows])
    np.testing.assert_array_equal(prepared.splits["test"].labels, test_labels)
    assert prepared.splits["train"].arrays["input_ids"][0, :6].tolist() == [255, 76, 149, 29, 0, 141]


def test_image_max_length_must_be_1024(cifar):
    with pytest.raises(ValueError, match="max_length must be 1024"):
        image.read(cifar[0], max_length=4096)


def test_image_truncated_pickle_is_named(cifar):
    folder, _ = cifar
    path = folder / "data_batch_3"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"data_batch_3: not a readable CIFAR-10 python batch"):
        image.read(folder)


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_image_pickle_with_a_forbidden_global_is_refused_unexecuted(cifar, tmp_path):
    folder, _ = cifar
    marker = tmp_path / "executed"
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump({b"data": RunsACommand(marker), b"labels": []}, f, protocol=4)
    with pytest.raises(ValueError, match=r"data_batch_2: .*forbidden global (posix|os)\.system"):
        image.read(folder)
    assert not marker.exists()


@pytest.mark.parametrize(
    "batch, message",
    [
        ({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, r"b'data' must be a uint8 array .*\(N, 3072\)"),
        ({b"data": np.zeros((2, 3072), np.int64), b"labels": [0, 1]}, r"b'data' must be a uint8 array"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"label 1 must be an int 0-9, got 10"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, r"b'labels' must be a list of 2 ints"),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, r"lacks the keys \[b'data', b'labels'\]"),
    ],
)
def test_image_wrong_contents_are_errors_naming_the_file(cifar, batch, message):
    folder, _ = cifar
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch, f, protocol=4)
    with pytest.raises(ValueError, match=r"test_batch: .*" + message):
        image.read(folder)


def test_image_every_batch_is_required_and_the_download_is_named(cifar, tmp_path):
    folder, _ = cifar
    (folder / "data_batch_5").unlink()
    expected = r"missing data_batch_5\. .*cifar-10-batches-py.*" + re.escape(image.CIFAR_URL)
    with pytest.raises(FileNotFoundError, match=expected):
        image.read(folder)
    with pytest.raises(FileNotFoundError, match=r"missing data_batch_1, .*, test_batch\. "):
        image.read(tmp_path / "nowhere", max_length=1)


# ----------------------------------------------------------------------------------- pathfinder

SIDE = 32
EMPTY = "imgs/2/sample_3.png"


def write_png(path, pixels):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode="L").save(path)


def write_pathfinder(root, rng):
    """Two metadata files (2 and 10: numeric order differs from name order), 13 images, one of them
    a zero-byte file. Returns the non-empty images' pixels (row-major) and labels in reading order."""
    pixels, labels = [], []
    (root / "metadata").mkdir(parents=True)
    for k, count in ((2, 7), (10, 6)):
        lines = []
        for i in range(count):
            label = int(rng.integers(0, 2))
            lines.append(f"imgs/{k} sample_{i}.png {i} {label} 1 14 2 5 2 1 2\n")
            path = root / f"imgs/{k}/sample_{i}.png"
            if f"imgs/{k}/sample_{i}.png" == EMPTY:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
                continue
            image_pixels = rng.integers(0, 256, size=(SIDE, SIDE), dtype=np.uint8)
            write_png(path, image_pixels)
            pixels.append(image_pixels.reshape(-1))
            labels.append(label)
        (root / "metadata" / f"{k}.npy").write_text("".join(lines))
    return np.array(pixels), np.array(labels)


@pytest.fixture
def pathfinder_folder(tmp_path):
    root = tmp_path / "pathfinder32" / "curv_contour_length_14"
    pixels, labels = write_pathfinder(root, np.random.default_rng(11))
    return root, pixels, labels


def test_pathfinder_tokens_are_the_pixels_split_by_the_seeded_permutation(pathfinder_folder):
    root, pixels, labels = pathfinder_folder
    prepared = pathfinder.read(root, max_length=SIDE * SIDE, split_seed=3, workers=1)
    order = np.random.default_rng(3).permutation(12)
    expected = {"train": order[:9], "val": order[9:10], "test": order[10:]}  # 12 * 8 // 10, 12 // 10, rest
    for split, indices in expected.items():
        got = prepared.splits[split]
        assert got.arrays["input_ids"].dtype == np.uint8
        np.testing.assert_array_equal(got.arrays["input_ids"], pixels[indices])
        np.testing.assert_array_equal(got.labels, labels[indices])
    assert prepared.notes == {"skipped_empty": [EMPTY]}


def test_pathfinder_split_is_deterministic_disjoint_and_covers_every_image(pathfinder_folder):
    root, pixels, _ = pathfinder_folder
    first = pathfinder.read(root, split_seed=0, workers=1)
    again = pathfinder.read(root, split_seed=0, workers=1)
    other = pathfinder.read(root, split_seed=1, workers=1)
    for split in SPLITS:
        np.testing.assert_array_equal(first.splits[split].arrays["input_ids"], again.splits[split].arrays["input_ids"])
    row_index = {row.tobytes(): i for i, row in enumerate(pixels)}
    assert len(row_index) == len(pixels)
    for prepared in (first, other):
        indices = {split: [row_index[row.tobytes()] for row in prepared.splits[split].arrays["input_ids"]] for split in SPLITS}
        everything = sum(indices.values(), [])
        assert sorted(everything) == list(range(12))  # disjoint, and every non-empty image once
        assert [len(indices[split]) for split in SPLITS] == [9, 1, 2]
    assert not np.array_equal(first.splits["train"].arrays["input_ids"], other.splits["train"].arrays["input_ids"])


def test_pathfinder_parallel_decoding_gives_the_same_arrays(pathfinder_folder, monkeypatch):
    root = pathfinder_folder[0]
    serial = pathfinder.read(root, workers=1)
    monkeypatch.setattr(pathfinder, "PARALLEL_MIN_IMAGES", 0)
    parallel = pathfinder.read(root, workers=2)
    for split in SPLITS:
        expected, got = serial.splits[split], parallel.splits[split]
        np.testing.assert_array_equal(expected.arrays["input_ids"], got.arrays["input_ids"])
        np.testing.assert_array_equal(expected.labels, got.labels)


def test_pathfinder_missing_metadata_folder_or_files_name_the_layout(pathfinder_folder):
    root = pathfinder_folder[0]
    for path in (root / "metadata").iterdir():
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"metadata folder .* has no <k>\.npy files.*imgs/<k>/sample_<i>\.png"):
        pathfinder.read(root)
    (root / "metadata").rmdir()
    with pytest.raises(FileNotFoundError, match=r"there is no metadata folder .*generate pathfinder --out DIR"):
        pathfinder.read(root)


@pytest.mark.parametrize(
    "line, message",
    [
        ("imgs/10 sample_0.png 0", r"10\.npy:2: expected at least 4 space-separated fields .* got 3"),
        ("imgs/10 sample_0.png 0 2 1", r"10\.npy:2: the label \(field 4\) must be 0 or 1, got '2'"),
        ("imgs/10 sample_99.png 99 1", r"imgs/10/sample_99\.png: image listed in .*10\.npy:2 does not exist"),
    ],
)
def test_pathfinder_bad_metadata_lines_are_named(pathfinder_folder, line, message):
    root = pathfinder_folder[0]
    metadata = root / "metadata" / "10.npy"
    lines = metadata.read_text().splitlines()
    lines[1] = line
    metadata.write_text("\n".join(lines) + "\n")
    error = FileNotFoundError if "does not exist" in message else ValueError
    with pytest.raises(error, match=message):
        pathfinder.read(root, workers=1)


def test_pathfinder_wrong_size_or_mode_is_an_error_naming_the_image(pathfinder_folder):
    root = pathfinder_folder[0]
    write_png(root / "imgs/10/sample_4.png", np.zeros((16, 16), np.uint8))
    with pytest.raises(ValueError, match=r"imgs/10/sample_4\.png: the image is 16x16 but max_length=1024 needs 32x32"):
        pathfinder.read(root, workers=1)
    Image.new("RGB", (SIDE, SIDE)).save(root / "imgs/10/sample_4.png")
    with pytest.raises(ValueError, match=r"imgs/10/sample_4\.png: expected an 8-bit grayscale image .* got mode RGB"):
        pathfinder.read(root, workers=1)
    write_png(root / "imgs/10/sample_4.png", np.zeros((SIDE, SIDE), np.uint8))
    with pytest.raises(ValueError, match=r"sample_.\.png: the image is 32x32 but max_length=16384 needs 128x128"):
        pathfinder.read(root, max_length=16384, workers=1)


def test_pathfinder_missing_source_names_release_and_generator(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        pathfinder.read(tmp_path / "lra_release" / "pathfinder32" / "curv_contour_length_14", max_length=1)
    message = str(error.value)
    for expected in (
        "does not exist",
        "metadata/<k>.npy",
        "imgs/<k>/sample_<i>.png",
        "lra_release/pathfinder32/curv_contour_length_14",
        "pathfinder128/curv_contour_length_14",
        "https://storage.googleapis.com/long-range-arena/lra_release.gz",
        "python -m lra.data generate pathfinder --out DIR",
    ):
        assert expected in message


# ------------------------------------------------- through the cache and the datamodule, as training reads them


def datamodule_batches(task, source, tmp_path, max_length, seq_len, **data):
    """Every split of ``task`` as one batch from the LRA datamodule (prepare_data, then setup)."""
    from lra.datamodule import LRADataModule

    config = {
        "source": "official",
        "source_dir": str(source),
        "cache_dir": str(tmp_path / "cache"),
        "max_length": max_length,
        "options": {},
        **data,
    }
    module = LRADataModule(task, seq_len, config, batch_size=1)
    module.prepare_data()
    module.setup()
    return {split: next(iter(module._loader(split, shuffle=False, drop_last=False))) for split in SPLITS}, module


def test_text_through_the_datamodule(imdb, tmp_path):
    import torch

    module = datamodule_batches("text", imdb, tmp_path, TEXT_LENGTH, 16)[1]
    rows = torch.stack([module.task_data.splits["train"][i]["input_ids"] for i in range(4)])
    expected = [
        byte_ids(REVIEWS["train"][f][i].strip(), TEXT_LENGTH) + [0] * 4
        for f in ("neg", "pos")
        for i in sorted(REVIEWS["train"][f])
    ]
    assert rows.dtype == torch.int64 and rows.tolist() == expected
    assert module.task_data.data_source == "imdb"
    manifest = module.task_data.manifest
    assert manifest["splits"]["test"] == {"same_as": "val", "num_samples": 3}  # the same 25k stored once


def test_retrieval_through_the_datamodule_feeds_two_documents(aan, tmp_path):
    batches, module = datamodule_batches("retrieval", aan, tmp_path, AAN_LENGTH, 10)
    train = batches["train"]
    assert set(train) == {"input_ids_0", "input_ids_1", "label"}
    assert train["input_ids_0"][0].tolist() == byte_ids(b"plain text one", AAN_LENGTH) + [0, 0]
    assert train["input_ids_1"][0].tolist() == byte_ids(b"second doc", AAN_LENGTH) + [0, 0]
    assert train["label"].tolist() == [1]


def test_image_through_the_datamodule_with_and_without_the_zero_pixel_mask(cifar, tmp_path):
    folder, batches = cifar
    first_image = gray_image(batches["data_batch_1"][0][0])
    masked = datamodule_batches("image", folder, tmp_path, 1024, 1024)[0]["train"]
    assert masked["input_ids"][0].tolist() == first_image and first_image[4] == 0  # black pixel -> id 0
    unmasked = datamodule_batches("image", folder, tmp_path, 1024, 1024, pixel_zero_is_padding=False)[0]["train"]
    assert unmasked["input_ids"][0].tolist() == [p + 1 for p in first_image]  # no pixel is padding
    assert masked["label"].item() == batches["data_batch_1"][1][0]


def test_pathfinder_through_the_datamodule(pathfinder_folder, tmp_path):
    root, pixels, labels = pathfinder_folder
    batches, module = datamodule_batches("pathfinder", root, tmp_path, SIDE * SIDE, SIDE * SIDE, options={"split_seed": 3})
    order = np.random.default_rng(3).permutation(12)
    assert batches["test"]["input_ids"][0].tolist() == pixels[order[10]].tolist()
    assert batches["test"]["label"].item() == labels[order[10]]
    assert module.task_data.manifest["notes"]["skipped_empty"] == [EMPTY]
