"""The prepared-data cache, source resolution, the dataset rows and ``python -m lra.data``."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lra.data import cache, listops
from lra.data.listops import VOCAB
from lra.data.tasks import TokenDataset, load_task, prepare_task, resolve

ROWS = {
    "train": [("( ( ( [MAX 2 ) 9 ) ] )", "9"), ("( ( ( ( [SM 3 ) 4 ) 5 ) ] )", "2"), ("( ( [MIN 7 ) ] )", "7")],
    "val": [("( ( ( [MED 1 ) 5 ) ] )", "3")],
    "test": [("( ( ( [MIN 4 ) 8 ) ] )", "4"), ("6", "6")],
}


def write_listops_release(folder, rows=ROWS):
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_rows in rows.items():
        with open(folder / f"basic_{split}.tsv", "w") as f:
            f.write("Source\tTarget\n")
            f.writelines(f"{source}\t{target}\n" for source, target in split_rows)


def data_config(tmp_path, **changes):
    data = {
        "source": "official",
        "source_dir": str(tmp_path / "release"),
        "cache_dir": str(tmp_path / "cache"),
        "max_length": 6,
        "options": {},
        "generated_dir": str(tmp_path / "generated"),
        "generator": {"num_train": 20, "num_val": 5, "num_test": 5, "min_length": 3, "max_length": 6, "seed": 1},
    }
    return {**data, **changes}


@pytest.fixture
def release(tmp_path):
    write_listops_release(tmp_path / "release")
    return tmp_path / "release"


def test_prepared_arrays_are_the_official_tokens_padded(tmp_path, release):
    data = data_config(tmp_path)
    resolved = prepare_task("listops", data)
    splits, manifest = cache.load(resolved.folder)
    np.testing.assert_array_equal(
        splits["train"].arrays["input_ids"],
        [
            [VOCAB["[MAX"], VOCAB["2"], VOCAB["9"], VOCAB["]"], 0, 0],
            [VOCAB["[SM"], VOCAB["3"], VOCAB["4"], VOCAB["5"], VOCAB["]"], 0],
            [VOCAB["[MIN"], VOCAB["7"], VOCAB["]"], 0, 0, 0],
        ],
    )
    np.testing.assert_array_equal(splits["train"].labels, [9, 2, 7])
    np.testing.assert_array_equal(splits["test"].labels, [4, 6])
    assert splits["train"].arrays["input_ids"].dtype == np.uint8
    assert isinstance(splits["train"].arrays["input_ids"], np.memmap)  # read lazily, not loaded
    assert manifest["task"] == "listops" and manifest["key"]["kind"] == "official"
    assert {split: entry["num_samples"] for split, entry in manifest["splits"].items()} == {"train": 3, "val": 1, "test": 2}
    assert manifest["source"]["path"] == str(release) and manifest["source"]["num_files"] == 3
    for entry in cache.stored_files(manifest):
        assert cache.file_sha256(resolved.folder / entry["file"]) == entry["sha256"]


def test_preparing_twice_is_a_no_op(tmp_path, release, caplog):
    data = data_config(tmp_path)
    prepare_task("listops", data)
    manifest_path = resolve("listops", data).folder / cache.MANIFEST
    before = manifest_path.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lra.data"):
        prepare_task("listops", data)
    assert caplog.messages == [] and manifest_path.stat().st_mtime_ns == before


def test_a_changed_source_is_prepared_again(tmp_path, release, caplog):
    data = data_config(tmp_path)
    prepare_task("listops", data)
    write_listops_release(release, {**ROWS, "val": [("( ( ( [MAX 1 ) 5 ) ] )", "5")]})
    with caplog.at_level(logging.INFO, logger="lra.data"):
        resolved = prepare_task("listops", data)
    assert any("changed since" in m for m in caplog.messages)
    np.testing.assert_array_equal(cache.load(resolved.folder)[0]["val"].labels, [5])


def test_a_corrupt_cache_file_is_named_and_rebuilt(tmp_path, release, caplog):
    data = data_config(tmp_path)
    folder = prepare_task("listops", data).folder
    target = folder / "train.input_ids.npy"
    content = bytearray(target.read_bytes())
    content[-1] ^= 0xFF  # same size, different bytes: only the checksum can tell
    target.write_bytes(bytes(content))
    with pytest.raises(cache.CacheError, match="train.input_ids.npy does not match the SHA-256"):
        cache.verify(folder, cache.read_manifest(folder), checksums=True)
    with caplog.at_level(logging.INFO, logger="lra.data"):
        prepare_task("listops", data)
    assert any("train.input_ids.npy" in m and "corrupt" in m for m in caplog.messages)
    cache.verify(folder, cache.read_manifest(folder), checksums=True)


def test_a_truncated_or_missing_cache_file_fails_loading_with_its_name(tmp_path, release):
    data = data_config(tmp_path)
    folder = prepare_task("listops", data).folder
    target = folder / "test.label.npy"
    target.write_bytes(target.read_bytes()[:-4])
    with pytest.raises(cache.CacheError, match=r"test\.label\.npy has \d+ bytes, its manifest says"):
        cache.load(folder)
    target.unlink()
    with pytest.raises(cache.CacheError, match=r"test\.label\.npy is missing"):
        cache.load(folder)
    (folder / cache.MANIFEST).write_text("{not json")
    with pytest.raises(cache.CacheError, match="manifest.json is not valid JSON"):
        cache.load(folder)


def test_the_cache_is_used_after_the_source_is_gone(tmp_path, release):
    data = data_config(tmp_path, source="auto")
    prepare_task("listops", data)
    for path in release.iterdir():
        path.unlink()
    release.rmdir()
    task = load_task("listops", 8, data)
    assert task.data_source == "lra_release" and len(task.splits["train"]) == 3


def test_auto_generates_when_there_is_no_official_data(tmp_path):
    data = data_config(tmp_path, source="auto")
    task = load_task("listops", 8, data)
    assert task.data_source == "generated" and [len(task.splits[s]) for s in ("train", "val", "test")] == [20, 5, 5]
    assert task.manifest["key"]["generator"]["seed"] == 1


def test_missing_official_data_is_an_error_naming_layout_and_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="basic_train.tsv.*lra_release.gz"):
        load_task("listops", 8, data_config(tmp_path, source="official"))


def test_tasks_without_a_generator_never_get_stand_in_data(tmp_path):
    with pytest.raises(ValueError, match="text has no generator"):
        resolve("text", data_config(tmp_path, source="generated"))
    with pytest.raises(ValueError, match="unknown task 'imdb'"):
        resolve("imdb", data_config(tmp_path))
    with pytest.raises(ValueError, match="unknown task.data.source 'release'"):
        resolve("listops", data_config(tmp_path, source="release"))


def test_dataset_rows_pad_to_seq_len_and_shift_pixels_when_asked():
    split = cache.CachedSplit(arrays={"input_ids": np.array([[3, 0, 255], [0, 1, 2]], dtype=np.uint8)}, labels=np.array([1, 0]))
    sample = TokenDataset(split, seq_len=5)[0]
    assert sample["input_ids"].dtype == torch.int64 and sample["label"].item() == 1
    assert sample["input_ids"].tolist() == [3, 0, 255, 0, 0]
    shifted = TokenDataset(split, seq_len=4, token_offset=1)[1]  # every pixel a token: ids 1..256
    assert shifted["input_ids"].tolist() == [1, 2, 3, 0]
    with pytest.raises(ValueError, match="hold 3 tokens but task.seq_len=2"):
        TokenDataset(split, seq_len=2)


def run_data_cli(*args, cwd, check=True):
    env = {**os.environ, "LRA_DATA_DIR": str(cwd / "data")}
    process = subprocess.run(
        [sys.executable, "-m", "lra.data", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if check and process.returncode != 0:
        raise AssertionError(f"lra.data failed:\n{process.stdout}\n{process.stderr}")
    return process


def test_cli_generate_prepare_and_info(tmp_path):
    out = tmp_path / "listops-small"
    run_data_cli(
        "generate",
        "listops",
        "--out",
        out,
        "--num-train",
        30,
        "--num-val",
        4,
        "--num-test",
        5,
        "--min-length",
        3,
        "--max-length",
        40,
        "--seed",
        7,
        cwd=tmp_path,
    )
    assert [len(listops.read_split(out, s, 40)[1]) for s in listops.SPLITS] == [30, 4, 5]
    again = run_data_cli("generate", "listops", "--out", out, "--seed", 7, cwd=tmp_path, check=False)
    assert again.returncode != 0 and "already holds" in again.stderr

    first = run_data_cli("prepare", "listops", "--source", out, "--max-length", 40, cwd=tmp_path)
    assert "Prepared listops (train 30, val 4, test 5)" in first.stdout
    second = run_data_cli("prepare", "listops", "--source", out, "--max-length", 40, cwd=tmp_path)
    assert "Prepared" not in second.stdout and "ready in" in second.stdout

    listing = run_data_cli("info", "--verify", cwd=tmp_path).stdout
    assert "listops (official), max_length 40, train 30 / val 4 / test 5" in listing and "checksums: ok" in listing
    (folder,) = (tmp_path / "data" / "cache" / "listops").iterdir()
    manifest = json.loads((folder / cache.MANIFEST).read_text())
    (folder / manifest["splits"]["val"]["files"]["input_ids"]["file"]).write_bytes(b"\x93NUMPY garbage")
    broken = run_data_cli("info", "--verify", cwd=tmp_path, check=False)
    assert broken.returncode == 1 and "CORRUPT" in broken.stdout and "val.input_ids.npy" in broken.stdout


def test_cli_prepare_names_a_missing_source(tmp_path):
    process = run_data_cli("prepare", "listops", "--source", tmp_path / "nowhere", cwd=tmp_path, check=False)
    assert process.returncode != 0 and "nowhere is not a folder" in process.stderr


def test_pathfinder_is_generated_read_and_cached_on_first_use(tmp_path):
    data = {
        "source": "auto",
        "source_dir": str(tmp_path / "no_release"),
        "cache_dir": str(tmp_path / "cache"),
        "max_length": 1024,
        "options": {"split_seed": 0},
        "generated_dir": str(tmp_path / "generated"),
        "generator": {"resolution": 32, "contour_length": 14, "num_samples": 30, "seed": 4},
    }
    task = load_task("pathfinder", 1024, data)
    assert task.data_source == "generated"
    assert [len(task.splits[s]) for s in ("train", "val", "test")] == [24, 3, 3]
    sample = task.splits["train"][0]
    assert sample["input_ids"].shape == (1024,) and 0 <= sample["input_ids"].max() <= 255
    assert (sample["input_ids"] == 0).float().mean() > 0.5  # mostly background: padding by the protocol
    (generated,) = (tmp_path / "generated").iterdir()
    assert task.manifest["source"]["path"] == str(generated)


def test_cli_generate_pathfinder_writes_the_official_layout_that_prepare_reads(tmp_path):
    out = tmp_path / "pathfinder32"
    run_data_cli("generate", "pathfinder", "--out", out, "--num-samples", 20, "--seed", 3, "--workers", 1, cwd=tmp_path)
    assert sorted(p.name for p in (out / "imgs" / "0").iterdir())[:2] == ["sample_0.png", "sample_1.png"]
    assert len((out / "metadata" / "0.npy").read_text().splitlines()) == 20
    prepared = run_data_cli("prepare", "pathfinder", "--source", out, cwd=tmp_path).stdout
    assert "Prepared pathfinder (train 16, val 2, test 2)" in prepared
