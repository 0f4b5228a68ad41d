"""``python -m lra.train`` end to end, as a user runs it (a subprocess, Hydra command line)."""

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import kill_at_step
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from tiny_listops import TINY

from lra import config, run_lock
from lra.campaign.state import evaluation_times

RESULT_KEYS = {
    "task",
    "attention",
    "attention_hparams",
    "seed",
    "data_source",
    "protocol",
    "model",
    "steps",
    "best_val_acc",
    "best_val_step",
    "test_acc",
    "wall_time_s",
    "peak_memory_mb",
    "device",
    "torch_version",
    "git_commit",
    "config_hash",
    "status",
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
    assert record["steps_per_second"] > 0  # lra.callbacks.TrainingSpeed: training batches only
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
def test_a_run_records_which_test_samples_its_best_checkpoint_classified_correctly(tmp_path, run_train, monkeypatch):
    """``test_correct``: the best checkpoint's own predictions on the test set, in its order, as many right as its
    test accuracy counts (lra.table pairs two rows' errors by it)."""
    from lra.datamodule import LRADataModule
    from lra.module import LRAClassificationModule

    run_train()
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    cfg = config.compose(list(TINY))
    datamodule = LRADataModule("listops", cfg.task.seq_len, OmegaConf.to_container(cfg.task.data, resolve=True), 16)
    datamodule.prepare_data()
    datamodule.setup("test")
    model = LRAClassificationModule.load_from_checkpoint(record["best_checkpoint"]).eval()
    with torch.no_grad():
        predicted = [model(input_ids=batch["input_ids"]).argmax(-1) == batch["label"] for batch in datamodule.test_dataloader()]
    assert record["test_correct"] == "".join("1" if right else "0" for right in torch.cat(predicted).tolist())
    assert len(record["test_correct"]) == 24 and record["test_correct"].count("1") == round(record["test_acc"] * 24)


@pytest.mark.slow
def test_rerun_runs_a_finished_configuration_again_and_keeps_the_earlier_one(tmp_path, run_train):
    """After the quick start, a recipe that changes only where a run reports (logger=tensorboard)
    finds the finished run: it is skipped with a message naming rerun=true, which runs it again."""
    run_train()
    (path,) = results_files(tmp_path)
    first = json.loads(path.read_text())

    skipped = run_train("logger=tensorboard")
    assert "add rerun=true to run it again" in skipped.stdout + skipped.stderr
    assert not (path.parent / "tensorboard").exists()

    run_train("logger=tensorboard", "rerun=true")
    assert results_files(tmp_path) == [path], "the same folder: rerun is not part of the run's identity"
    second = json.loads(path.read_text())
    assert second["status"] == "finished" and second["started_at"] > first["finished_at"]
    assert "resumed_from" not in second, "a rerun starts afresh, not from the earlier run's last.ckpt"
    assert list((path.parent / "tensorboard").rglob("events.out.tfevents.*"))
    (archived,) = (path.parent / "history").iterdir()
    assert json.loads((archived / "record.json").read_text()) == first
    assert Path(first["best_checkpoint"]).name in [p.name for p in (archived / "checkpoints").iterdir()]
    assert (archived / "metrics" / "metrics.csv").is_file() and Path(second["best_checkpoint"]).is_file()


@pytest.mark.slow
def test_a_rerun_that_fails_before_its_first_step_leaves_the_finished_run_where_it_was(tmp_path, run_train):
    """rerun=true moved the finished run to history/ and then failed at start: results.json said failed, checkpoints/
    was gone. Settings that keep the run's folder and fail before training, as the Trainer is built: an accelerator
    that does not exist, and a logger whose package is missing. (A batch that does not divide over the processes is refused
    before anything is written: the finished run is never moved.)"""
    run_train()
    (path,) = results_files(tmp_path)
    finished = path.read_text()
    checkpoints = sorted(p.name for p in (path.parent / "checkpoints").iterdir())
    refused = run_train("trainer.devices=3", "rerun=true", check=False)
    assert refused.returncode == 1 and "does not divide over 3 processes" in refused.stderr
    assert path.read_text() == finished and not (path.parent / "history").exists()
    failing = [("trainer.accelerator=no_such_device", "no_such_device")]
    if importlib.util.find_spec("wandb") is None:
        failing.append(("logger=wandb", "the logger (pytorch_lightning.loggers.WandbLogger) needs a package"))
    for override, message in failing:
        process = run_train(override, "rerun=true", check=False)
        assert process.returncode == 1 and message in process.stderr and "Traceback" not in process.stderr
        assert f"the earlier finished run is back in {path.parent} as it was" in process.stderr
        assert path.read_text() == finished, override
        assert sorted(p.name for p in (path.parent / "checkpoints").iterdir()) == checkpoints, override
        assert not (path.parent / "history").exists(), override
        assert message in (path.parent / "train.log").read_text(), "the failure's traceback stays in train.log"
    skipped = run_train()
    assert "already holds a finished run" in skipped.stderr


@pytest.mark.slow
def test_a_finished_configuration_is_skipped_whatever_its_override_text(tmp_path, run_train):
    """``seed=0`` spelled out names another folder than the default seed; the configuration is the same."""
    run_train()
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    spelled_out = run_train("seed=0")
    assert f"Skipping: {path} holds a finished run of this configuration ({record['config_hash']})" in spelled_out.stderr
    assert "add rerun=true to run it again in" in spelled_out.stderr
    assert results_files(tmp_path) == [path] and json.loads(path.read_text()) == record
    assert "Generating ListOps" not in spelled_out.stderr
    another = run_train("seed=1")  # another configuration trains
    assert "Skipping" not in another.stderr and len(results_files(tmp_path)) == 2
    rerun = run_train("seed=0", "rerun=true")
    assert "Skipping" not in rerun.stderr and len(results_files(tmp_path)) == 3


@pytest.mark.slow
def test_a_second_copy_of_a_running_command_stops_at_once_and_a_killed_holder_never_blocks(tmp_path, tiny_overrides):
    """Two copies of one command trained into one folder: train.log had every evaluation twice, metrics.csv
    duplicate rows, results.json the second's result. The second copy now stops naming the first; once the
    first is killed (its lock dies with it, its lock file stays), the same command resumes."""
    command = [sys.executable, "-m", "lra.train", *tiny_overrides, "task.protocol.max_steps=30"]
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not results_files(tmp_path) and time.monotonic() < deadline:  # written once it holds the folder
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGSTOP)  # frozen while it holds the folder: the second copy finds it held
        (path,) = results_files(tmp_path)
        record, log_before = path.read_text(), (path.parent / "train.log").read_text()

        second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 1
        (message,) = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        holder = f"(pid {first.pid} on {socket.gethostname()} since "
        assert message.startswith(f"error: {path.parent} is in use by another run {holder}")
        assert "Traceback" not in second.stderr and "Resuming" not in second.stderr
        assert path.read_text() == record and (path.parent / "train.log").read_text() == log_before, "nothing written"
    finally:
        first.kill()
        first.wait()

    third = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (path.parent / run_lock.LOCK_FILE).is_file(), "the dead holder's file is there and does not block"
    assert json.loads(path.read_text())["status"] == "finished" and json.loads(path.read_text())["steps"] == 30
    metrics = pd.read_csv(path.parent / "metrics" / "metrics.csv").dropna(subset=["val/acc"])
    assert metrics["step"].is_unique


@pytest.mark.slow
def test_a_run_folder_held_by_a_live_process_is_refused_and_a_sweep_names_the_holder(tmp_path, run_train):
    run_train()
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    record["status"] = "running"  # as a run under way leaves it
    path.write_text(json.dumps(record))
    with run_lock.held(path.parent):
        single = run_train(check=False)
        sweep = run_train("attention=softmax,none", flags=["-m"], check=False)  # the softmax cell is the held folder
    assert single.returncode == 1 and f"error: {path.parent} is in use by another run (pid {os.getpid()} on" in single.stderr
    assert json.loads(path.read_text()) == record
    assert sweep.returncode == 1 and "Sweep: 2 cells, 1 finished, 1 not finished" in sweep.stdout
    assert f"in use by another run (pid {os.getpid()} on" in sweep.stdout.split("Sweep: ")[1]


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_latest_evaluation_not_its_best(tmp_path, run_train):
    """``last.ckpt`` held the best step's state, so a run killed after evaluating at 3, 6 and 9 resumed at 3 and
    trained 6 steps again. A learning rate too small to change any prediction keeps the best at step 3."""
    extra = ("task.protocol.max_steps=15", "task.protocol.lr=1e-9", kill_at_step.OVERRIDE)
    killed = run_train(*extra, check=False, env=kill_at_step.environment(kill_at_step=9))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (path,) = results_files(tmp_path)
    checkpoints = path.parent / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 9
    assert [p.name for p in checkpoints.glob("best-*.ckpt")] == ["best-step3.ckpt"]

    resumed = run_train(*extra, env=kill_at_step.environment())
    assert f"Resuming the interrupted run from {checkpoints / 'last.ckpt'}" in resumed.stderr
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["steps"] == 15 and record["best_val_step"] == 3
    assert train_log_evaluations(path.parent) == [3, 6, 9, 12, 15], "resumed at 9: no evaluation twice"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 15


@pytest.mark.slow
def test_a_run_committed_under_results_runs_is_not_run_again_in_a_fresh_checkout(tmp_path, run_train):
    """A sweep resumed in a new sitting has lost outputs/; the committed records say what is done."""
    run_train()
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    runs = tmp_path / "results" / "runs"
    runs.mkdir(parents=True)
    (runs / "listops__softmax__smoke__seed0__x.json").write_text(json.dumps(record))
    shutil.rmtree(tmp_path / "outputs")

    again = run_train()
    assert "holds a finished run of this configuration" in again.stdout + again.stderr and "committed" in again.stderr
    assert not (tmp_path / "outputs").exists() or not results_files(tmp_path)
    another_seed = run_train("seed=1")
    assert "Skipping" not in another_seed.stdout + another_seed.stderr and len(results_files(tmp_path)) == 1


@pytest.mark.slow
def test_a_data_folder_override_does_not_name_the_run_folder(tmp_path, run_train):
    """A path in the folder name nested the run folders (outputs/listops/softmax/task.data.generated_dir=/tmp/...)."""
    run_train(f"task.data.generated_dir={tmp_path / 'elsewhere'}")
    (path,) = results_files(tmp_path)
    assert path.parent.parent == tmp_path / "outputs" / "listops" / "softmax" and "generated_dir" not in path.parent.name
    assert list((tmp_path / "elsewhere").iterdir()), "the data went where the override said"


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


@pytest.mark.parametrize(
    "earlier, checkpoint, resumes",
    [("same", True, True), ("other", True, False), ("same", False, False), (None, True, False)],
    ids=["same-configuration", "another-configuration", "no-last-checkpoint", "no-earlier-record"],
)
def test_a_run_resumes_only_its_own_configurations_last_checkpoint(tmp_path, earlier, checkpoint, resumes):
    """lra.run.prepare, in-process: the resume decision that the slow end-to-end tests reach through a killed run.
    A last.ckpt in the folder is resumed only when the folder's record is of the same configuration."""
    from lra import results
    from lra.config import checked
    from lra.results import new_record, record_configuration
    from lra.run import last_checkpoint, prepare

    cfg, _ = checked(config.compose([f"callbacks.checkpoint.dirpath={tmp_path}/checkpoints"]), results.CLASSIFICATION)
    record = new_record(cfg, None, results.CLASSIFICATION)
    record_configuration(record, cfg, results.CLASSIFICATION)
    if earlier is not None:
        previous = new_record(cfg, None, results.CLASSIFICATION)
        previous.config_hash = record.config_hash if earlier == "same" else "0" * len(record.config_hash)
        previous.update(started_at="2026-01-02T03:04:05+00:00", wall_time_s=1234.5)
        previous.write(tmp_path / results.RESULTS_FILE)
    if checkpoint:
        last_checkpoint(cfg).parent.mkdir(parents=True)
        torch.save({"global_step": 3}, last_checkpoint(cfg))  # a checkpoint written before run identities
    resume_from, world_size = prepare(cfg, record, tmp_path)
    assert world_size == 1
    assert resume_from == (last_checkpoint(cfg) if resumes else None)
    assert record.resumed_from == (str(last_checkpoint(cfg)) if resumes else None)
    # One run in pieces: a resumed one starts when its first piece started and counts the time that piece ran.
    assert (record.started_at == "2026-01-02T03:04:05+00:00") == resumes
    assert record.wall_time_s == (1234.5 if resumes else None)


def test_a_damaged_last_checkpoint_is_named_with_the_fix_before_training(tmp_path):
    from lra import results
    from lra.config import checked
    from lra.results import new_record, record_configuration
    from lra.run import last_checkpoint, prepare

    cfg, _ = checked(config.compose([f"callbacks.checkpoint.dirpath={tmp_path}/checkpoints"]), results.CLASSIFICATION)
    record = new_record(cfg, None, results.CLASSIFICATION)
    record_configuration(record, cfg, results.CLASSIFICATION)
    record.write(tmp_path / results.RESULTS_FILE)
    last_checkpoint(cfg).parent.mkdir(parents=True)
    last_checkpoint(cfg).write_bytes(b"")  # a kill during the save left it empty
    with pytest.raises(ValueError, match=r"last\.ckpt cannot be read \(.*\): it is damaged, perhaps by a write cut short"):
        prepare(cfg, record, tmp_path)


def assert_one_clear_message(process, message, exception):
    """The run failed with ``message`` on the console and no traceback; results.json and train.log have the rest."""
    assert process.returncode == 1
    assert message in process.stderr
    assert "Traceback" not in process.stdout + process.stderr
    return assert_recorded_failure(process, exception)


def assert_recorded_failure(process, exception):
    folder = Path(process.stderr.split("the error is recorded in ")[1].split()[0]).parent
    record = json.loads((folder / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith(f"{exception}: ")
    assert "Traceback" in (folder / "train.log").read_text()
    return record


@pytest.mark.slow
def test_missing_release_folder_is_a_clear_error(tmp_path, run_train):
    process = run_train("task.data.source=official", check=False)
    missing = tmp_path / "data" / "lra_release" / "listops-1000"
    assert "task.data.source=generated" in process.stderr
    assert_one_clear_message(process, f"ListOps data not found in {missing}", "FileNotFoundError")


@pytest.mark.slow
def test_unknown_attention_lists_the_available_ones(tmp_path, run_train):
    for flags, extra in (((), ()), ((), ("attention.hparams.dropout=0.2",)), (("-m",), ("attention=none,sofmax",))):
        process = run_train("attention=sofmax", *extra, flags=flags, check=False)
        assert process.returncode == 1
        (line,) = process.stderr.strip().splitlines()
        assert line.startswith("error: attention=sofmax is not an attention; did you mean softmax? The choices: ")
        assert "none" in line and "yoso_32" in line and "search path" not in line.lower()
    assert not (tmp_path / "outputs").exists(), "nothing ran"
    process = run_train("task=listopz", check=False)
    assert process.returncode == 1 and "search path" not in process.stderr.lower()
    (line,) = process.stderr.strip().splitlines()
    assert line.startswith("error: task=listopz is not an option of task; did you mean listops? The choices: ")


@pytest.mark.slow
def test_a_registered_attention_or_preset_without_a_yaml_trains_as_its_row(tmp_path, run_train):
    """Issue 36: ``attention=yoso`` (registered, no YAML) and ``attention=performer_lra`` (a preset whose row YAML
    has another name) train, each in its own folder and as its own row."""
    run_train("attention=yoso,performer_lra", flags=["-m"])
    for name, attention in (("yoso", "yoso"), ("performer_lra", "performer")):
        (path,) = (tmp_path / "outputs" / "listops" / name).glob("*/results.json")
        record = json.loads(path.read_text())
        assert (record["status"], record["row"], record["attention"]) == ("finished", name, attention)


@pytest.mark.parametrize(
    "override, message, exception",
    [
        ("+attention.hparams.dropuot=0.2", "unknown hyperparameter(s) ['dropuot']", "ValueError"),
        ("attention.hparams.dropout=abc", "hyperparameter 'dropout' of attention 'softmax' must be float", "TypeError"),
        ("attention.hparams.dropout=2.0", "dropout must be in [0, 1), got 2.0", "ValueError"),
        ("task.protocol.max_steps=ten", "task.protocol.max_steps must be int, got 'ten'", "TypeError"),
        ("task.seq_len=-5", "task.seq_len must be a positive whole number of tokens, got -5", "ValueError"),
        ("task.seq_len=0", "task.seq_len must be a positive whole number of tokens, got 0", "ValueError"),
        ("task.seq_len=20", "task.seq_len=20 is shorter than task.data.max_length=", "ValueError"),
        ("seed=abc", "seed=abc is not a seed: it takes a whole number (seed=0, seed=1, ...)", "ValueError"),
        (
            "task.protocol.warmup_steps=1",
            "task.protocol.warmup_steps=1 does not fit the learning-rate schedule: it takes 0 (no warmup) or 2 to "
            "max_steps - 1 = 5 steps",
            "ValueError",
        ),
    ],
    ids=[
        "unknown",
        "ill-typed",
        "bad-value",
        "ill-typed-protocol",
        "negative-length",
        "zero-length",
        "truncating-length",
        "ill-typed-seed",
        "warmup-of-one",
    ],  # fmt: skip
)
def test_a_configuration_error_is_one_clear_message_before_anything_is_written(
    tmp_path, refuse_train, override, message, exception
):
    """Bad values were found after the run's folder and a failed record existed, which then sat in the table's failed
    list: they are refused as unknown keys are, before Hydra makes a folder (the run's own check stays behind it)."""
    status, stderr = refuse_train(override)
    assert status == 1 and stderr.startswith("error: ") and stderr.count("error: ") == 1 and message in stderr, stderr
    assert not (tmp_path / "outputs").exists()
    if "dropuot" in override:
        assert "dropout: float = 0.1" in stderr  # the valid keys and their defaults


@pytest.mark.parametrize(
    "attention, first_refusing, valid",
    [(None, "softmax", "dropout: float = 0.1"), ("yoso_32,softmax", "yoso_32", "num_hashes: int = 32")],
    ids=["default", "sweep"],
)
def test_an_unknown_hyperparameter_without_plus_lists_the_valid_ones(tmp_path, refuse_train, attention, first_refusing, valid):
    """Hydra alone answers "Key 'dropuot' is not in struct"; the user needs the valid keys."""
    flags = ("-m", f"attention={attention}") if attention else ()
    status, stderr = refuse_train("attention.hparams.dropuot=0.2", flags=flags)
    assert status == 1
    assert stderr.startswith(f"error: attention={first_refusing}: unknown hyperparameter(s) ['dropuot'] for attention")
    assert valid in stderr
    assert not (tmp_path / "outputs").exists()  # refused before any run starts


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.attention_in_fp32=false", "model.attention_in_fp32 is now called model.attention_in_float32"),
        (
            "attention.hparams.conv_kernel_size=35",
            "hyperparameter 'conv_kernel_size' of attention 'nystromformer' is now called 'conv_window'",
        ),
    ],
    ids=["model", "attention"],
)
def test_a_renamed_setting_names_its_new_name(tmp_path, refuse_train, override, message):
    status, stderr = refuse_train("attention=nystromformer", override)
    assert status == 1
    assert stderr.startswith(f"error: {'attention=nystromformer: ' if 'hparams' in override else ''}{message}")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_the_full_traceback_on_request(tmp_path, run_train):
    process = run_train("attention.hparams.dropout=2.0", check=False, env={"HYDRA_FULL_ERROR": "1"})
    assert process.returncode == 1
    assert "Traceback" in process.stderr and "ValueError: dropout must be in [0, 1), got 2.0" in process.stderr


@pytest.mark.slow
def test_a_failing_cell_is_recorded_the_sweep_goes_on_and_ends_with_a_summary(tmp_path, run_train):
    # The second cell asks for the official release, which is not there: an error before training.
    process = run_train("task.data.source=generated,official", flags=["-m"], check=False)
    assert process.returncode == 1, "a sweep with a failed cell must not exit 0"
    records = {r["data"]["source"]: r for r in map(json.loads, map(Path.read_text, results_files(tmp_path)))}
    assert records["generated"]["status"] == "finished"
    assert records["official"]["status"] == "failed" and "ListOps data not found" in records["official"]["error"]
    summary = process.stdout[process.stdout.index("Sweep: 2 cells, 1 finished, 1 not finished") :]
    assert "finished  listops / softmax / seed 0" in summary and "failed    listops / softmax / seed 0" in summary
    assert "FileNotFoundError: ListOps data not found in" in summary
    assert all(str(path.parent) in summary for path in results_files(tmp_path))


@pytest.mark.slow
def test_a_shortened_run_adjusts_warmup_and_evaluation_and_says_so(tmp_path, run_train, tiny_overrides):
    data_only = [
        o
        for o in tiny_overrides
        if not o.startswith(("task.protocol.max_steps", "task.protocol.warmup_steps", "task.protocol.val_check_interval"))
    ]
    process = run_train("task.protocol.max_steps=20", overrides=data_only)
    assert "Adjusted task.protocol.warmup_steps from 40 to 2" in process.stderr
    assert "Adjusted task.protocol.val_check_interval from 50 to 20" in process.stderr
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["steps"] == 20
    assert record["protocol"]["warmup_steps"] == 2 and record["protocol"]["val_check_interval"] == 20
    assert record["adjusted"]["warmup_steps"]["from"] == 40 and record["adjusted"]["val_check_interval"]["to"] == 20
    assert "Adjusted task.protocol.warmup_steps" in (path.parent / "train.log").read_text()


@pytest.mark.slow
def test_the_console_shows_what_a_user_needs_and_train_log_has_the_run(tmp_path, run_train):
    process = run_train("attention=yoso_32", "trainer.enable_progress_bar=true")
    console = process.stdout + process.stderr
    for noise in ("litlogger", "LeafSpec", "v_num", "No CUDA runtime", "Seed set"):
        assert noise not in console, noise
    assert re.search(r"listops / yoso_32 / seed 0: 6 steps of batch 16 \(protocol smoke\) -> .*, [\d,]+ parameters", console)
    assert "Training: 100%" in console and "6/6" in console and "Epoch" not in console  # one bar over the run's steps
    assert "train/steps_per_s=" in console and "test acc" in console  # the training rate beside the bar's
    (path,) = results_files(tmp_path)
    train_log = (path.parent / "train.log").read_text()
    assert "Generating ListOps" in train_log and "Prepared listops" in train_log
    assert "step 3: val/acc" in train_log and "step 6: val/acc" in train_log
    assert [step for _, step in evaluation_times(path.parent / "train.log")] == [3, 6]  # lra.campaign status reads them
    assert "test acc" in train_log
    # metrics.csv numbers the evaluations as train.log and the progress bar do (issue 40: it said 2 and 5)
    metrics = pd.read_csv(path.parent / "metrics" / "metrics.csv")
    assert metrics.dropna(subset=["val/acc"])["step"].tolist() == [3, 6]
    assert metrics.dropna(subset=["test/acc"])["step"].tolist() == [6]


@pytest.mark.slow
def test_a_bf16_run_prints_no_warning_of_a_dependency(tmp_path, run_train):
    """Issue 40: Lightning's "Precision bf16-mixed is not supported by the model summary" was on the console."""
    process = run_train("trainer.precision=bf16-mixed")
    console = process.stdout + process.stderr
    for noise in ("UserWarning", "Warning:", "model summary"):
        assert noise not in console, console[-3000:]


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, tiny_overrides):
    overrides = [*tiny_overrides, "task.protocol.max_steps=100", "task.protocol.val_check_interval=5"]
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.Popen(
        [sys.executable, "-m", "lra.train", *overrides],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not list((tmp_path / "outputs").rglob("last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # a crash: no chance to clean up
    process.wait()
    (path,) = results_files(tmp_path)
    assert json.loads(path.read_text())["status"] == "running"

    interrupted_log = (path.parent / "train.log").read_text()
    assert "step 5: val/acc" in interrupted_log, "train.log holds the run's log up to the interruption"
    before = pd.read_csv(path.parent / "metrics" / "metrics.csv")
    assert before["val/acc"].notna().sum() >= 1

    resumed = subprocess.run(
        [sys.executable, "-m", "lra.train", *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming the interrupted run" in resumed.stdout + resumed.stderr
    for noise in ("exists and is not empty", "ended before the epoch ended"):  # Lightning's, about the resume itself
        assert noise not in resumed.stdout + resumed.stderr, noise
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["steps"] == 100
    assert record["resumed_from"].endswith("last.ckpt")
    assert record["best_val_step"] % 5 == 0
    # Every step's metrics, from before and after the interruption, each once: one evaluation every
    # 5 steps, 20 in all, and the training loss at the same steps, numbered as train.log numbers them.
    metrics = pd.read_csv(path.parent / "metrics" / "metrics.csv")
    evaluations = metrics.dropna(subset=["val/acc"])["step"].tolist()
    assert evaluations == list(range(5, 101, 5))
    assert metrics.dropna(subset=["train/loss"])["step"].tolist() == list(range(5, 101, 5))
    # train.log is appended to: an evaluation logged after the checkpoint and before the kill appears twice.
    assert sorted(set(train_log_evaluations(path.parent))) == list(range(5, 101, 5))


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"], ids=["ctrl-c", "preempted"])
def test_an_interrupted_run_keeps_every_step_it_reached(tmp_path, tiny_overrides, signal_name):
    """Ctrl+C or SIGTERM between evaluations saves last.ckpt at the step reached (the callback
    on_interrupt, lra.callbacks.CheckpointOnInterrupt), and the resumed run continues from there.

    The resumed weights cannot equal an uninterrupted run's bitwise: the resume starts its epoch's
    data afresh (the loader has no saved position) and the dropout generator's state is not in the
    checkpoint. So the test checks the steps and the evaluations instead."""
    overrides = [*tiny_overrides, "task.protocol.max_steps=100", "task.protocol.val_check_interval=25"]
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    command = [sys.executable, "-m", "lra.train", *overrides]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl+C as a terminal sends it: a shell's background job (nohup pytest &) ignores SIGINT, the
        # child would inherit that, and Python then never raises KeyboardInterrupt (seen in such a run).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while 25 not in train_log_evaluations_under(tmp_path / "outputs") and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(getattr(signal, signal_name))
    output, _ = process.communicate(timeout=120)
    (path,) = results_files(tmp_path)
    interrupted = json.loads(path.read_text())
    assert interrupted["status"] == "interrupted", output[-3000:]
    assert "Interrupted: running the same command again resumes from" in output
    reached = torch.load(path.parent / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 25 <= reached < 100
    assert interrupted["steps"] == reached and "error" not in interrupted, "an interruption, with its step, not a failure"

    began = time.monotonic()
    resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    resumed_seconds = time.monotonic() - began
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["steps"] == 100 and record["resumed_from"].endswith("last.ckpt")
    assert record["started_at"] == interrupted["started_at"], "one run in two pieces: it started with the first"
    second_piece = record["wall_time_s"] - interrupted["wall_time_s"]
    assert 0 < second_piece <= resumed_seconds, "its wall time counts both pieces"
    metrics = pd.read_csv(path.parent / "metrics" / "metrics.csv")
    assert metrics.dropna(subset=["val/acc"])["step"].tolist() == [25, 50, 75, 100]


def test_every_run_saves_last_ckpt_at_each_evaluation_and_on_an_interruption_where_it_resumes():
    callbacks = OmegaConf.to_container(config.compose().callbacks, resolve=False)
    (on_interrupt,) = (node for node in callbacks.values() if node["_target_"] == "lra.callbacks.CheckpointOnInterrupt")
    assert on_interrupt["filename"] == "last" and on_interrupt["dirpath"] == callbacks["checkpoint"]["dirpath"]
    latest = callbacks["latest"]
    assert latest["filename"] == "last" and latest["dirpath"] == callbacks["checkpoint"]["dirpath"]
    assert "monitor" not in latest and not callbacks["checkpoint"].get("save_last"), "last.ckpt: the latest, not the best"


def train_log_evaluations_under(outputs):
    logs = list(outputs.rglob("train.log"))
    return train_log_evaluations(logs[0].parent) if logs else []


def train_log_evaluations(folder):
    lines = (folder / "train.log").read_text().splitlines()
    return [int(line.split("step ")[1].split(":")[0]) for line in lines if "[lra.train.file]" in line and ": val/acc" in line]


@pytest.mark.slow
def test_ddp_with_two_cpu_processes(tmp_path, run_train):
    run_train("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true", "num_workers=0")
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["processes"] == 2 and record["steps"] == 6
    # Tested once on rank 0 over the whole test set: 24 samples, no padding repeats.
    assert round(record["test_acc"] * 24, 6).is_integer()


@pytest.mark.slow
def test_joblib_sweep_runs_cells_in_parallel_processes(tmp_path, run_train):
    process = run_train("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "attention=softmax,none", flags=["-m"])
    records = [json.loads(p.read_text()) for p in results_files(tmp_path)]
    assert sorted(r["attention"] for r in records) == ["none", "softmax"]
    assert all(r["status"] == "finished" for r in records)
    assert "Sweep: 2 cells, 2 finished, 0 not finished" in process.stdout, "the workers report to the summary"


@pytest.mark.slow
def test_the_tensorboard_logger_writes_event_files_in_the_run_folder(tmp_path, run_train):
    run_train("logger=tensorboard")
    (path,) = results_files(tmp_path)
    assert json.loads(path.read_text())["status"] == "finished"
    assert list((path.parent / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_a_logger_whose_package_is_missing_is_one_clear_message(tmp_path, run_train):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here; the project does not require it, so CI has none")
    process = run_train("logger=wandb", check=False)
    assert_one_clear_message(process, "the logger (pytorch_lightning.loggers.WandbLogger) needs a package", "RuntimeError")


@pytest.mark.slow
@pytest.mark.parametrize("diverges_at", ["before an evaluation", "after evaluations"])
def test_a_run_whose_loss_becomes_non_finite_stops_is_recorded_as_diverged_and_is_no_result(tmp_path, run_train, diverges_at):
    """A loss that becomes NaN stops the run with one message and exit status 1; its record says diverged at that step,
    no checkpoint holds a non-finite weight, and the table lists it under its failed runs, never as a cell."""
    # The tiny model diverges from its first steps at lr 1e6, before the evaluation of step 3; at 1e5 warmed up slowly,
    # a few steps later (step 3 or 4, as rounding goes: softmax trains on the fused CPU kernel), after the evaluation
    # of step 1 that the second case asks for.
    lr, warmup, every = ("1e6", "2", "3") if diverges_at == "before an evaluation" else ("1e5", "58", "1")
    extra = [
        f"task.protocol.lr={lr}",
        "task.protocol.max_steps=60",
        f"task.protocol.warmup_steps={warmup}",
        f"task.protocol.val_check_interval={every}",
    ]
    process = run_train(*extra, check=False)
    assert process.returncode == 1
    said = process.stdout + process.stderr
    assert said.count("training diverged: the loss or its gradients are not finite from step") == 1 and "Traceback" not in said
    [path] = (tmp_path / "outputs").rglob("results.json")
    record = json.loads(path.read_text())
    assert record["status"] == "diverged" and record.get("test_acc") is None and isinstance(record["steps"], int)
    assert f"from step {record['steps']} " in record["error"]
    checkpoints = sorted((path.parent / "checkpoints").glob("*.ckpt"))
    assert bool(checkpoints) == (diverges_at == "after evaluations")
    for checkpoint in checkpoints:
        weights = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(value).all() for value in weights.values() if value.is_floating_point()), checkpoint
        assert torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"] <= record["steps"]
    table = subprocess.run(
        [sys.executable, "-m", "lra.table"],
        cwd=tmp_path,
        env={**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert table.returncode == 0, table.stderr
    cells = pd.read_csv(tmp_path / "outputs" / "comparison.csv")
    assert cells.empty or "softmax" not in set(cells.get("row", []))
    assert "diverged: training diverged" in (tmp_path / "outputs" / "comparison.md").read_text()


@pytest.mark.slow
def test_a_last_checkpoint_of_another_configuration_is_refused_not_resumed(tmp_path, run_train):
    """A last.ckpt copied in from a run of another configuration (same shapes, another learning rate) was resumed
    silently, its optimizer and schedule recorded as this run's. Every checkpoint now carries its run's identity."""
    other = run_train("task.protocol.lr=1e-2")  # finished: its folder keeps its last.ckpt
    assert other.returncode == 0
    killed = run_train(kill_at_step.OVERRIDE, check=False, env=kill_at_step.environment(kill_at_step=4))
    assert killed.returncode != 0
    status = {path.parent: json.loads(path.read_text())["status"] for path in (tmp_path / "outputs").rglob("results.json")}
    [theirs] = [folder for folder, value in status.items() if value == "finished"]
    [ours] = [folder for folder, value in status.items() if value != "finished"]
    shutil.copy(theirs / "checkpoints" / "last.ckpt", ours / "checkpoints" / "last.ckpt")  # without its digest
    refused = run_train(kill_at_step.OVERRIDE, check=False, env=kill_at_step.environment())
    assert refused.returncode == 1
    said = refused.stdout + refused.stderr
    assert f"{ours / 'checkpoints' / 'last.ckpt'} is not the checkpoint that was written there" in said, said[-2000:]
    for name in ("last.ckpt", "last.ckpt.sha256"):  # with it: the checkpoint is whole, and another run's
        shutil.copy(theirs / "checkpoints" / name, ours / "checkpoints" / name)
    refused = run_train(kill_at_step.OVERRIDE, check=False, env=kill_at_step.environment())
    assert refused.returncode == 1
    said = refused.stdout + refused.stderr
    assert f"{ours / 'checkpoints' / 'last.ckpt'} is a checkpoint of another configuration" in said, said[-2000:]
    assert json.loads((ours / "results.json").read_text())["status"] == "failed"
