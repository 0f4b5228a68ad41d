"""``python -m lra.train`` end to end, as a user runs it (a subprocess, Hydra command line)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

RESULT_KEYS = {
    "task", "attention", "attention_hparams", "seed", "data_source", "protocol", "model", "steps",
    "best_val_acc", "best_val_step", "test_acc", "wall_time_s", "peak_memory_mb", "device",
    "torch_version", "git_commit", "config_hash", "status",
}


def results_files(tmp_path):
    return sorted((tmp_path / "outputs").rglob("results.json"))


@pytest.mark.slow
def test_a_tiny_run_writes_results_and_a_rerun_is_skipped(tmp_path, run_train):
    first = run_train()
    (path,) = results_files(tmp_path)
    assert path.parent.parent == tmp_path / "outputs" / "listops" / "softmax"
    assert path.parent.name.startswith("task.data.generator.max_length=60,") and len(path.parent.name) == 120
    record = json.loads(path.read_text())
    assert RESULT_KEYS <= set(record)
    assert record["status"] == "finished"
    assert (record["task"], record["attention"], record["seed"]) == ("listops", "softmax", 0)
    assert record["attention_hparams"] == {"dropout": 0.1}
    assert record["data_source"] == "generated"
    assert record["protocol"]["name"] == "smoke"
    assert record["steps"] == 6 and record["best_val_step"] in (3, 6)
    assert record["num_samples"] == {"train": 64, "val": 32, "test": 24}
    for key in ("best_val_acc", "test_acc"):
        assert 0.0 <= record[key] <= 1.0
    # Test accuracy is over the whole 24-sample test set (no dropped partial batch).
    assert round(record["test_acc"] * 24, 6).is_integer()
    assert Path(record["best_checkpoint"]).is_file()
    assert "Generating ListOps" in first.stdout + first.stderr

    second = run_train()
    assert "Skipping" in second.stdout + second.stderr
    assert "Generating ListOps" not in second.stdout + second.stderr
    assert json.loads(path.read_text()) == record


@pytest.mark.slow
def test_multirun_over_attentions_yields_one_result_each(tmp_path, run_train):
    # yoso_32 and yoso_e are two presets of one registered attention: each needs its own folder.
    run_train("attention=softmax,yoso_32,yoso_e", flags=["-m"])
    paths = results_files(tmp_path)
    records = {p.parent.parent.name: json.loads(p.read_text()) for p in paths}
    assert sorted(records) == ["softmax", "yoso_32", "yoso_e"]
    assert {folder: r["row"] for folder, r in records.items()} == {name: name for name in records}
    assert all(r["status"] == "finished" for r in records.values())
    assert len({r["config_hash"] for r in records.values()}) == 3


@pytest.mark.slow
def test_missing_release_folder_is_a_clear_error(tmp_path, run_train):
    process = run_train("task.data.source=official", check=False)
    assert process.returncode != 0
    missing = tmp_path / "data" / "lra_release" / "listops-1000"
    assert f"ListOps data not found in {missing}" in process.stderr
    assert "task.data.source=generated" in process.stderr
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "failed" and "FileNotFoundError" in record["error"]


@pytest.mark.slow
def test_unknown_attention_lists_the_available_ones(tmp_path, run_train):
    process = run_train("attention=sofmax", check=False)
    assert process.returncode != 0
    assert "attention/sofmax" in process.stderr
    assert "softmax" in process.stderr and "none" in process.stderr


@pytest.mark.slow
def test_unknown_attention_hyperparameter_is_a_clear_error(tmp_path, run_train):
    process = run_train("+attention.hparams.dropuot=0.2", check=False)
    assert process.returncode != 0
    assert "unknown hyperparameter(s) ['dropuot']" in process.stderr
    assert "dropout: float = 0.1" in process.stderr


@pytest.mark.slow
def test_a_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path, run_train):
    # The second cell's evaluation interval exceeds its training length: an error inside the run.
    run_train("task.protocol.val_check_interval=3,100", flags=["-m"])
    records = {r["protocol"]["val_check_interval"]: r for r in map(json.loads, map(Path.read_text, results_files(tmp_path)))}
    assert records[3]["status"] == "finished"
    assert records[100]["status"] == "failed" and "val_check_interval=100 exceeds max_steps=6" in records[100]["error"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, tiny_overrides):
    overrides = [*tiny_overrides, "task.protocol.max_steps=400", "task.protocol.val_check_interval=5"]
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.Popen([sys.executable, "-m", "lra.train", *overrides], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not list((tmp_path / "outputs").rglob("last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # a crash: no chance to clean up
    process.wait()
    (path,) = results_files(tmp_path)
    assert json.loads(path.read_text())["status"] == "running"

    resumed = subprocess.run([sys.executable, "-m", "lra.train", *overrides], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming the interrupted run" in resumed.stdout + resumed.stderr
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["steps"] == 400
    assert record["resumed_from"].endswith("last.ckpt")
    # The evaluations before the interruption still count: one every 5 steps, 80 in all.
    metrics = (path.parent / "metrics" / "metrics.csv").read_text()
    assert record["best_val_step"] % 5 == 0 and "val/acc" in metrics


@pytest.mark.slow
def test_ddp_with_two_cpu_processes(tmp_path, run_train):
    run_train("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
              "trainer.num_workers=0")
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["processes"] == 2 and record["steps"] == 6
    # Tested once on rank 0 over the whole test set: 24 samples, no padding repeats.
    assert round(record["test_acc"] * 24, 6).is_integer()


@pytest.mark.slow
def test_joblib_sweep_runs_cells_in_parallel_processes(tmp_path, run_train):
    run_train("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "attention=softmax,none", flags=["-m"])
    records = [json.loads(p.read_text()) for p in results_files(tmp_path)]
    assert sorted(r["attention"] for r in records) == ["none", "softmax"]
    assert all(r["status"] == "finished" for r in records)
