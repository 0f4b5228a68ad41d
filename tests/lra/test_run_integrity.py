"""A wrong number never becomes a result (issue 57): a record is trusted for a skip or a commit only where its
configuration hashes to the hash it claims, every file a run writes is written whole or not at all, and a damaged
file found at resume is named with the fix."""

import errno
import json
import math
import os
import shutil

import disk_full_at_step
import pytest
import torch
from omegaconf import OmegaConf
from test_train import results_files

from lra import checkpoints, config, results, table
from lra.callbacks import AtomicCheckpointIO, RunIdentity
from lra.checkpoints import UNREADABLE as UNREADABLE_CHECKPOINT
from lra.checkpoints import step as checkpoint_step
from lra.config import checked
from lra.files import DiskFull
from lra.results import CLASSIFICATION, PRETRAINING, RunRecord, new_record, record_configuration
from lra.run import (
    EarlierRun,
    checked_and_hashed,
    finished_run,
    last_checkpoint,
    prepare,
    pretraining_stage,
)


def a_run(tmp_path, *overrides):
    """The configuration and the record of a run in ``tmp_path / "run"``, as lra.run has them before training."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    composed = config.compose(
        [
            f"callbacks.checkpoint.dirpath={folder}/checkpoints",
            f"paths.output_dir={tmp_path}/outputs",
            f"paths.runs_dir={tmp_path}/runs",
            *overrides,
        ]
    )
    cfg, _ = checked(composed, CLASSIFICATION)
    record = new_record(cfg, None, CLASSIFICATION)
    record_configuration(record, cfg, CLASSIFICATION)
    return cfg, record, folder


def finished(record, **changes):
    """A finished run's record: ``record`` with its results, and ``changes`` (an edit of what it holds)."""
    done = RunRecord.from_dict(record.to_dict())
    done.update(status="finished", steps=400, best_val_acc=0.3, best_val_step=400, test_acc=0.3, data_source="generated")
    done.update(num_samples={"train": 2000, "val": 256, "test": 256}, **changes)
    return done


@pytest.mark.parametrize(
    "overrides",
    [[], ["paths.data_dir=/somewhere/else"], ["pretrain=mlm", "seed=3"], ["attention=yoso_32", "trainer.precision=bf16-mixed"]],
    ids=["default", "data-elsewhere", "pretrained", "yoso-bf16"],
)
def test_a_runs_record_recomputes_to_its_own_hash_wherever_its_data_lies(tmp_path, overrides):
    """The hash of a record is recomputed from the configuration it keeps, which has no paths: where the data lies
    (LRA_DATA_DIR, paths.data_dir) must not change the hash, or a record made with the data elsewhere could never be
    checked (and was another cell)."""
    _, record, _ = a_run(tmp_path, *overrides)
    assert results.recomputed_config_hash(record) == record.config_hash
    _, here, _ = a_run(tmp_path, *[o for o in overrides if not o.startswith("paths.")])
    assert here.config_hash == record.config_hash


def test_a_pretraining_runs_record_recomputes_to_its_own_hash(tmp_path):
    cfg, _, _ = a_run(tmp_path, "pretrain=mlm")
    pretraining, _ = checked(pretraining_stage(cfg, None)[0], PRETRAINING)
    record = new_record(pretraining, None, PRETRAINING)
    record_configuration(record, pretraining, PRETRAINING)
    assert record.stage == PRETRAINING and results.recomputed_config_hash(record) == record.config_hash


def test_every_committed_record_that_keeps_its_configuration_recomputes_to_its_hash():
    """Records committed since the data and the length were recorded hash to what they say; the older ones (before
    those keys) are the only ones that cannot tell."""
    checked_records = 0
    for path in sorted((results.REPO_ROOT / "results" / "runs").glob("*.json")):
        record = RunRecord.read(path)
        recomputed = results.recomputed_config_hash(record)
        if record.data is None or record.seq_len is None:
            assert recomputed is None, path
            continue
        assert recomputed == record.config_hash, path
        checked_records += 1
    assert checked_records >= 80


def test_todays_configuration_of_every_committed_table3_cpu_cell_has_the_committed_hash():
    """The committed ``experiment=table3_cpu`` sweep, composed today cell by cell, hashes to what its records say, so a
    sweep or campaign counts those cells finished and the table pools new seeds with them: a hyperparameter added to
    an attention's config, or any other new setting, must keep the hash at its default (ADDED_SETTINGS)."""
    checked_records = 0
    for path in sorted((results.REPO_ROOT / "results" / "runs").glob("*__table3_cpu__*.json")):
        record = RunRecord.read(path)
        overrides = ["experiment=table3_cpu", f"task={record.task}", f"attention={record.row}", f"seed={record.seed}"]
        assert checked_and_hashed(config.compose(overrides))[1] == record.config_hash, (path.name, overrides)
        checked_records += 1
    assert checked_records >= 55


@pytest.mark.parametrize("where", ["this folder", "another folder", "committed"])
def test_a_record_claiming_this_configurations_hash_for_another_configuration_is_no_skip(tmp_path, where, caplog):
    """The issue's case: a finished record whose stored hash claims this configuration while it ran another (lr 1e6)
    made this configuration be skipped, wherever it lay. It is named and trained past; the true record is a skip."""
    cfg, record, folder = a_run(tmp_path)
    path = {
        "this folder": folder / results.RESULTS_FILE,
        "another folder": tmp_path / "outputs" / "listops" / "softmax" / "seed=0" / results.RESULTS_FILE,
        "committed": tmp_path / "runs" / "listops__softmax__smoke__seed0__x.json",
    }[where]
    path.parent.mkdir(parents=True, exist_ok=True)
    finished(record, protocol={**record.protocol, "lr": 1e6}).write(path)
    assert finished_run(cfg, record, folder, EarlierRun(folder, last_checkpoint(cfg))) is None
    assert f"Not skipping for {path}: it says config_hash {record.config_hash} but the configuration it holds" in caplog.text

    finished(record).write(path)
    skipped_for = finished_run(cfg, record, folder, EarlierRun(folder, last_checkpoint(cfg)))
    assert skipped_for is not None and skipped_for.config_hash == record.config_hash and skipped_for.status == "finished"


def test_collect_refuses_a_record_whose_hash_is_not_its_configurations_and_collects_nothing(tmp_path):
    _, record, _ = a_run(tmp_path)
    outputs, committed = tmp_path / "outputs", tmp_path / "results"
    for name, run in {
        "true": finished(record),
        "edited": finished(record, seed=1, protocol={**record.protocol, "lr": 1e6}),
    }.items():
        (outputs / name).mkdir(parents=True)
        run.write(outputs / name / results.RESULTS_FILE)
    edited = outputs / "edited" / results.RESULTS_FILE
    with pytest.raises(SystemExit, match=rf"error: {edited}: it says config_hash {record.config_hash} but .* hashes to"):
        table.main(["--runs", str(outputs), "--results", str(committed), "--out", str(outputs), "--collect"])
    assert not committed.exists(), "nothing was collected"
    table.check_hashes(table.find_record_files([outputs / "true"]))  # the true record is collected


def a_checkpoint(path, step, identity=None):
    """A checkpoint as Lightning saves one, stamped with ``identity`` (a RunIdentity) where given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"callbacks": {RunIdentity.__qualname__: identity.state_dict()}} if identity else {}
    torch.save({"global_step": step, **stamp}, path)


def test_a_checkpoints_step_is_read_and_a_missing_or_damaged_one_raises(tmp_path):
    a_checkpoint(tmp_path / "last.ckpt", 7)
    assert checkpoint_step(tmp_path / "last.ckpt") == 7
    (tmp_path / "cut.ckpt").write_bytes(b"")  # a write cut short
    for unreadable in (tmp_path / "cut.ckpt", tmp_path / "missing.ckpt"):
        with pytest.raises(UNREADABLE_CHECKPOINT):
            checkpoint_step(unreadable)


@pytest.mark.parametrize("record_file", ["truncated", "not a record", "missing"])
def test_a_damaged_record_beside_this_runs_last_checkpoint_resumes_from_it(tmp_path, record_file):
    """A truncated or invalid results.json made an interrupted run start again from step 0, over its last.ckpt. The
    checkpoint's identity says whose it is: this run's is resumed."""
    cfg, record, folder = a_run(tmp_path)
    if record_file != "missing":
        text = {"truncated": json.dumps(record.to_dict())[:40], "not a record": "[1, 2]"}[record_file]
        (folder / results.RESULTS_FILE).write_text(text)
    a_checkpoint(last_checkpoint(cfg), 3, RunIdentity(record.config_hash, record.seed))
    assert prepare(cfg, record, folder)[0] == last_checkpoint(cfg)


@pytest.mark.parametrize("stamp", ["another run", "none"])
def test_a_damaged_record_beside_a_last_checkpoint_that_is_not_this_runs_is_named_with_the_fix(tmp_path, stamp):
    cfg, record, folder = a_run(tmp_path)
    (folder / results.RESULTS_FILE).write_text('{"task": "listops", "sta')  # a write cut short by an older version
    a_checkpoint(last_checkpoint(cfg), 3, RunIdentity("0" * 16, record.seed) if stamp == "another run" else None)
    said = {
        "another run": rf"{last_checkpoint(cfg)} is a checkpoint of another configuration or seed .*: move it away or delete it",
        "none": rf"{folder / results.RESULTS_FILE} cannot be read \(it is damaged\), so nothing tells whether .*last\.ckpt",
    }[stamp]
    with pytest.raises(ValueError, match=said):
        prepare(cfg, record, folder)


def failing_fsync(error_number):
    """``os.fsync`` of a disk that refuses what was written so far: the write is cut short after half a file."""

    def fsync(fd):
        raise OSError(error_number, os.strerror(error_number))

    return fsync


@pytest.mark.parametrize("error_number", [errno.ENOSPC, errno.EIO], ids=["full-disk", "io-error"])
def test_a_record_write_cut_short_leaves_the_previous_record_whole(tmp_path, monkeypatch, error_number):
    path = tmp_path / results.RESULTS_FILE
    RunRecord(task="listops", status="running").write(path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", failing_fsync(error_number))
    with pytest.raises(OSError) as raised:
        RunRecord(task="listops", status="finished", test_acc=0.3).write(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name], "the previous record, and nothing else"
    if error_number == errno.ENOSPC:
        assert isinstance(raised.value, DiskFull)
        assert str(raised.value).startswith(f"no space left (a full disk or quota): writing {path} needed 0.0 MB and ")
        assert "MB are free there; its previous version is intact" in str(raised.value)


@pytest.mark.parametrize("error_number", [errno.ENOSPC, errno.EIO], ids=["full-disk", "io-error"])
def test_a_checkpoint_save_cut_short_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch, error_number):
    """The checkpoint writer of every run's Trainer (lra.fit): Lightning's own staged the file under $TMPDIR and
    copied it over, so a kill or a full disk left a 0-byte or truncated last.ckpt where the outputs lie on another
    filesystem. The writer is what the run's Trainer uses."""
    from lra.fit import build_trainer, trainer_arguments

    cfg, _, folder = a_run(tmp_path, f"callbacks.latest.dirpath={folder_of(tmp_path)}", *logging_overrides(tmp_path))
    arguments, _, _ = trainer_arguments(cfg)
    writer = build_trainer(cfg, folder, None, arguments).strategy.checkpoint_io
    path = folder / "checkpoints" / "last.ckpt"
    weights = {"w": torch.arange(1000.0)}
    writer.save_checkpoint({"global_step": 3, "state_dict": weights}, path)
    monkeypatch.setattr(os, "fsync", failing_fsync(error_number))
    with pytest.raises(OSError) as raised:
        writer.save_checkpoint({"global_step": 6, "state_dict": {"w": -weights["w"]}}, path)
    assert isinstance(raised.value, DiskFull) == (error_number == errno.ENOSPC) and raised.value.errno == error_number
    monkeypatch.undo()
    saved = checkpoints.read(path)  # against its digest, which the failed save left as it was
    assert saved["global_step"] == 3 and torch.equal(saved["state_dict"]["w"], weights["w"])
    assert sorted(os.listdir(path.parent)) == ["last.ckpt", "last.ckpt.sha256"]
    assert isinstance(writer, AtomicCheckpointIO)


def folder_of(tmp_path):
    return tmp_path / "run" / "checkpoints"


def logging_overrides(tmp_path):
    """Where the callbacks and the logger write, which Hydra's run folder names in a real run."""
    return [f"callbacks.on_interrupt.dirpath={folder_of(tmp_path)}", f"logger.save_dir={tmp_path / 'run'}"]


@pytest.mark.slow
def test_a_full_disk_is_one_message_naming_the_file_and_the_space_and_the_run_resumes_after(tmp_path, run_train):
    """The disk fills after the first evaluation: the next checkpoint cannot be written. One message names the file
    and the space it needed, the record says what happened (status failed, DiskFull), last.ckpt keeps the first
    evaluation's state whole, and the same command resumes from it once there is room."""
    extra = (disk_full_at_step.OVERRIDE,)
    full = run_train(*extra, check=False, env=disk_full_at_step.environment(step=4, above_bytes=64 * 1024))
    said = full.stdout + full.stderr
    assert full.returncode == 1, said[-3000:]
    assert said.count("no space left (a full disk or quota): writing ") == 1 and "Traceback" not in said, said[-3000:]
    assert "MB are free there; its previous version is intact" in said
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "failed" and record["error"].startswith("DiskFull: no space left"), record
    last = path.parent / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 3
    assert not [name for name in os.listdir(last.parent) if name.endswith(".tmp")]

    resumed = run_train(*extra, env=disk_full_at_step.environment())
    assert "Resuming the interrupted run from" in resumed.stdout + resumed.stderr
    assert json.loads(path.read_text())["status"] == "finished"


@pytest.mark.slow
def test_testing_a_best_checkpoint_of_another_configuration_is_refused(tmp_path, run_train):
    """A resumed run tests the best checkpoint its folder holds: one of another configuration (copied in) was tested
    and recorded as this configuration's result."""
    run_train("task.protocol.lr=1e-2")
    run_train()
    by_lr = {json.loads(path.read_text())["protocol"]["lr"]: path.parent for path in results_files(tmp_path)}
    ours, theirs = by_lr[1e-3], by_lr[1e-2]
    record = json.loads((ours / results.RESULTS_FILE).read_text())
    (ours / results.RESULTS_FILE).write_text(json.dumps({**record, "status": "interrupted"}))  # resumed at its end
    (best,) = (ours / "checkpoints").glob("best-*.ckpt")
    (their_best,) = (theirs / "checkpoints").glob("best-*.ckpt")
    shutil.copy(their_best, best)  # without its digest: not the file written there
    refused = run_train(check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and f"{best} is not the checkpoint that was written there" in said, said[-3000:]
    (ours / results.RESULTS_FILE).write_text(json.dumps({**record, "status": "interrupted"}))
    shutil.copy(checkpoints.digest_file(their_best), checkpoints.digest_file(best))  # with it: whole, and another run's
    refused = run_train(check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and f"{best} is a checkpoint of another configuration or seed" in said, said[-3000:]
    assert json.loads((ours / results.RESULTS_FILE).read_text())["status"] == "failed"


def test_the_opt_in_to_skip_non_finite_steps_at_its_default_keeps_every_committed_hash_and_cell():
    """``task.protocol.skip_non_finite_steps`` came after runs were committed: at its default (false) a run has the
    hash and the table cell it had without it, so that no committed run is trained again or pooled apart."""
    cfg, _ = checked(config.compose([]), CLASSIFICATION)
    assert cfg.task.protocol.skip_non_finite_steps is False
    for path in sorted((results.REPO_ROOT / "results" / "runs").glob("*.json")):
        record = RunRecord.read(path)
        if record.data is None:  # an older record: its hash cannot be recomputed (see above)
            continue
        today = RunRecord.from_dict(record.to_dict())
        today.protocol = {**record.protocol, "skip_non_finite_steps": False}
        if record.pretrain and "protocol" in record.pretrain:
            today.pretrain = {**record.pretrain, "protocol": {**record.pretrain["protocol"], "skip_non_finite_steps": False}}
        assert results.recomputed_config_hash(today) == record.config_hash, path
        assert today.configuration() == record.configuration(), path
    skipping = RunRecord.from_dict(record.to_dict())
    skipping.protocol = {**record.protocol, "skip_non_finite_steps": True}
    assert results.recomputed_config_hash(skipping) != record.config_hash, "skipping steps is another configuration"


def a_step(skip_non_finite_steps, loss_value):
    """A tiny classifier after one step's backward whose loss is ``loss_value``, and its optimizer."""
    from lra.module import LRAClassificationModule

    cfg, _ = checked(config.compose(["task.seq_len=16", "task.data.max_length=16"]), CLASSIFICATION)
    module = LRAClassificationModule(
        "listops",
        16,
        OmegaConf.to_container(cfg.model, resolve=True),
        OmegaConf.to_container(cfg.attention, resolve=True),
        lr=1e-2,
        warmup_steps=0,
        max_steps=10,
        skip_non_finite_steps=skip_non_finite_steps,
    )
    optimizer = module.configure_optimizers()["optimizer"]
    loss = sum(parameter.sum() for parameter in module.parameters()) * loss_value
    loss.backward()
    module._step_loss = loss.detach()
    return module, optimizer


@pytest.mark.parametrize("loss_value", [float("nan"), float("inf"), 1.0], ids=["nan", "inf", "finite"])
def test_a_protocol_that_opts_in_skips_a_non_finite_step_and_counts_it(loss_value):
    """As a mixed-precision scaler does: no update at all (weights and AdamW's moments as they were), one more step
    counted; a finite step updates as ever."""
    module, optimizer = a_step(True, loss_value)
    before = {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
    module.on_before_optimizer_step(optimizer)
    optimizer.step()
    unchanged = all(torch.equal(before[name], parameter) for name, parameter in module.named_parameters())
    skipped = not math.isfinite(loss_value)
    assert unchanged == skipped and module.skipped_steps == int(skipped)
    assert all(not optimizer.state[parameter] for parameter in module.parameters()) == skipped
    saved = {}
    module.on_save_checkpoint(saved)
    assert saved["skipped_non_finite_steps"] == int(skipped), "a resumed run goes on counting"


def test_without_the_opt_in_a_non_finite_step_is_left_to_the_divergence_guard():
    module, optimizer = a_step(False, float("nan"))
    module.on_before_optimizer_step(optimizer)
    assert module.skipped_steps == 0 and all(parameter.grad is not None for parameter in module.parameters())


@pytest.mark.slow
def test_a_run_that_opts_in_finishes_past_non_finite_steps_and_its_record_counts_them(tmp_path, run_train):
    """lr 1e6 makes the tiny model's gradients non-finite from its second step: the run that opts in finishes, its
    record keeps the setting and the count; without it the same run diverges (test_train)."""
    run_train("task.protocol.lr=1e6", "task.protocol.skip_non_finite_steps=true")
    (path,) = results_files(tmp_path)
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["protocol"]["skip_non_finite_steps"] is True
    assert 0 < record["skipped_steps"] < record["steps"] == 6


@pytest.mark.parametrize("resume_step", [None, 3], ids=["fresh", "resumed"])
def test_metrics_rows_cut_short_leave_the_rows_saved_before_whole(tmp_path, monkeypatch, resume_step):
    """Lightning appended metrics.csv's rows in place: a kill or a full disk could leave half a row, which the resumed
    run reads back. Each save now writes the whole file beside it and renames it."""
    from lra.loggers import CSVLogger

    if resume_step is not None:  # an interrupted run's rows, one of them past the checkpoint it resumes from
        (tmp_path / "metrics").mkdir()
        (tmp_path / "metrics" / "metrics.csv").write_text("step,train/loss\n3,2.0\n5,1.9\n")
    logger = CSVLogger(save_dir=tmp_path, name="metrics", version="", resume_step=resume_step)
    logger.log_metrics({"train/loss": 1.5}, step=5)
    logger.save()
    path = tmp_path / "metrics" / "metrics.csv"
    before = path.read_bytes()
    assert before.decode().splitlines() == ["step,train/loss", *(["3,2.0"] if resume_step else []), "6,1.5"]
    monkeypatch.setattr(os, "fsync", failing_fsync(errno.ENOSPC))
    logger.log_metrics({"train/loss": 1.25, "val/acc": 0.5}, step=8)
    with pytest.raises(DiskFull, match=rf"writing {path} needed"):
        logger.save()
    assert path.read_bytes() == before and sorted(os.listdir(path.parent)) == ["metrics.csv"]


def test_a_campaign_counts_a_cell_finished_only_where_its_record_hashes_to_the_cells_hash(tmp_path):
    """lra.campaign decides which cells to launch from the records it finds: an edited one must not stand for a cell."""
    from lra.campaign import Cell, finished_records

    _, record, _ = a_run(tmp_path)
    cell = Cell(0, "listops / softmax / seed 0", [], str(tmp_path / "outputs" / "cell"), record.config_hash, "listops", 400, 0)
    outputs, runs = tmp_path / "outputs", tmp_path / "runs"
    for path in (outputs / "elsewhere" / results.RESULTS_FILE, runs / "listops__softmax__smoke__seed0__x.json"):
        path.parent.mkdir(parents=True)
        finished(record, protocol={**record.protocol, "lr": 1e6}).write(path)
    assert finished_records([cell], outputs, runs) == ({}, {})
    for path in (outputs / "elsewhere" / results.RESULTS_FILE, runs / "listops__softmax__smoke__seed0__x.json"):
        finished(record).write(path)
    found, committed = finished_records([cell], outputs, runs)
    assert list(found) == list(committed) == [record.config_hash]
