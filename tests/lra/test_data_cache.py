"""The prepared-data cache, source resolution, the dataset rows and ``python -m lra.data``."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tiny_listops import operator_rule_from_text, outermost_operators_and_labels

from lra.data import cache, listops
from lra.data.listops import VOCAB
from lra.data.records import DamagedData
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


def outermost_operator_rule(folder):
    """``lra.data info``'s outermost-operator line, from the TSVs' text: the rule, and each split's share it answers
    right."""
    answers, otherwise = operator_rule_from_text(folder)
    rule = ", ".join(f"{name} {label}" for name, label in answers.items())
    rule += "" if len(answers) == 4 else f", otherwise {otherwise}"
    scores = []
    for split in listops.SPLITS:
        pairs = outermost_operators_and_labels(folder, split)
        right = sum(answers.get(top, otherwise) == label for top, label in pairs)
        scores.append(f"{split} {100 * right / len(pairs):.2f}%")
    return f"{rule}: {', '.join(scores)}"


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
    shares = []
    for split in listops.SPLITS:
        labels = list(listops.read_split(out, split, 40)[1])
        top = max(sorted(set(labels)), key=labels.count)  # the smallest label among the most common, as np.unique's argmax
        shares.append(f"{split} {top} ({100 * labels.count(top) / len(labels):.2f}%)")
    assert f"  majority class: {', '.join(shares)} (the accuracy of always answering it)" in listing
    assert f"  outermost-operator rule: {outermost_operator_rule(out)}" in listing
    (folder,) = (p for p in (tmp_path / "data" / "cache" / "listops").iterdir() if p.is_dir())  # beside it: its lock
    manifest = json.loads((folder / cache.MANIFEST).read_text())
    (folder / manifest["splits"]["val"]["files"]["input_ids"]["file"]).write_bytes(b"\x93NUMPY garbage")
    broken = run_data_cli("info", "--verify", cwd=tmp_path, check=False)
    assert broken.returncode == 1 and "CORRUPT" in broken.stdout and "val.input_ids.npy" in broken.stdout
    unverified = run_data_cli("info", cwd=tmp_path, check=False)  # the labels' reading opens the split's arrays
    assert unverified.returncode == 1 and "CORRUPT" in unverified.stdout and "val.input_ids.npy" in unverified.stdout


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
    (generated,) = (p for p in (tmp_path / "generated").iterdir() if p.is_dir())
    assert task.manifest["source"]["path"] == str(generated)


def test_cli_generate_pathfinder_writes_the_official_layout_that_prepare_reads(tmp_path):
    out = tmp_path / "pathfinder32"
    run_data_cli("generate", "pathfinder", "--out", out, "--num-samples", 20, "--seed", 3, "--workers", 1, cwd=tmp_path)
    assert sorted(p.name for p in (out / "imgs" / "0").iterdir())[:2] == ["sample_0.png", "sample_1.png"]
    assert len((out / "metadata" / "0.npy").read_text().splitlines()) == 20
    prepared = run_data_cli("prepare", "pathfinder", "--source", out, cwd=tmp_path).stdout
    assert "Prepared pathfinder (train 16, val 2, test 2)" in prepared


def test_cut_generated_data_is_generated_again_not_trained_on(tmp_path, caplog):
    """Issue 37: basic_train.tsv cut short was prepared again and trained on with fewer samples than generated."""
    data = data_config(tmp_path, source="generated")
    prepare_task("listops", data)
    (generated,) = (p for p in (tmp_path / "generated").iterdir() if p.is_dir())
    train = generated / "basic_train.tsv"
    train.write_bytes(b"".join(train.read_bytes().splitlines(keepends=True)[:11]))  # 10 of the 20 samples

    with caplog.at_level(logging.INFO, logger="lra.data"):
        prepare_task("listops", data)  # what LRADataModule.prepare_data runs at the start of training
    task = load_task("listops", 8, data)

    assert [len(task.splits[s]) for s in ("train", "val", "test")] == [20, 5, 5]
    (line,) = [r.getMessage() for r in caplog.records if "Generating ListOps again" in r.getMessage()]
    assert "basic_train.tsv has" in line and "generator.json records" in line and "20 samples" in line


def test_damaged_official_data_is_an_error_naming_the_file_and_never_regenerated(tmp_path):
    release = tmp_path / "release"  # a folder `python -m lra.data generate listops --out` wrote, given as the official data
    config = listops.GeneratorConfig(num_train=20, num_val=5, num_test=5, min_length=3, max_length=6, seed=2)
    release.mkdir()
    listops.write_generated(release, config, listops.generate(config))
    data = data_config(tmp_path, source="official")
    prepare_task("listops", data)
    val = release / "basic_val.tsv"
    val.write_bytes(val.read_bytes()[:-3])

    with pytest.raises(DamagedData, match=r"release is damaged: basic_val.tsv has \d+ bytes \(generator.json records"):
        prepare_task("listops", data)
    assert not (tmp_path / "generated").exists()
    recorded = json.loads((release / "generator.json").read_text())["files"]["basic_val.tsv"]
    assert val.stat().st_size < recorded["num_bytes"], "the damaged file is left as it is"


# Each process: wait until all are ready (so that they start together), then do what a training run does first.
CONCURRENT_RUN = r"""
import hashlib, logging, os, sys, time
from pathlib import Path
from lra.data import listops
from lra.data.tasks import load_task, prepare_task

root, index, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
generate = listops.generate
def counted(config):
    with open(root / "generations", "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)  # a generation long enough that the others arrive while it runs
    return generate(config)
listops.generate = counted
(root / f"ready-{index}").touch()
while len(list(root.glob("ready-*"))) < count:
    time.sleep(0.01)
data = {
    "source": "generated", "source_dir": str(root / "none"), "cache_dir": str(root / "cache"), "max_length": 40,
    "options": {}, "generated_dir": str(root / "generated"),
    "generator": {"num_train": 200, "num_val": 20, "num_test": 20, "min_length": 3, "max_length": 40, "seed": 5},
}
prepare_task("listops", data)
task = load_task("listops", 40, data)
digest = hashlib.sha256()
for split in ("train", "val", "test"):
    digest.update(task.splits[split].split.arrays["input_ids"].tobytes() + task.splits[split].split.labels.tobytes())
print("data", len(task.splits["train"]), digest.hexdigest())
"""


def test_processes_starting_at_once_generate_and_prepare_the_data_once_and_all_use_it(tmp_path):
    count = 3
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_RUN, str(tmp_path), str(i), str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(count)
    ]
    outputs = [process.communicate(timeout=240) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-3000:]

    assert len((tmp_path / "generations").read_text().splitlines()) == 1, "the generator ran once"
    results = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(results) == 1 and results.pop().startswith("data 200 "), "every process read the same 200 samples"
    logs = [err for _, err in outputs]
    assert sum("Generating ListOps (240 samples" in log for log in logs) == 1
    assert sum("Preparing listops from" in log for log in logs) == 1, "the cache was prepared once"
    waited = [log.count("to finish writing the ListOps data") for log in logs]  # those that came while it generated
    assert max(waited) == 1 and sum(waited) >= 1 and "Waiting for process" in "".join(logs), "one line per wait"
    left = [p.name for folder in (tmp_path / "generated", tmp_path / "cache" / "listops") for p in folder.iterdir()]
    assert not [name for name in left if ".tmp-" in name], f"a temporary folder was left: {left}"
    assert len([name for name in left if not name.endswith(".lock")]) == 2
