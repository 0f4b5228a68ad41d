"""A run resumed after its folder moved (issue 55): interrupted on one machine, carried to another, resumed there in a
folder at another absolute path. It must end as the same run left uninterrupted does."""

import json
import shutil
import signal
from pathlib import Path

import kill_at_step
import pandas as pd
import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lra.callbacks import RunFolderCheckpoint

# One batch per epoch (16 samples, batch 16) and no dropout: the resumed part sees the batches and draws the randomness
# the uninterrupted run does (the loader restarts its stream on a resume, the dropout generator is not checkpointed),
# so both runs reach the same weights and evaluations. No loader workers: one epoch per step would start them each step.
DETERMINISTIC = (
    "task.data.generator.num_train=16",
    "task.protocol.max_steps=12",
    "task.protocol.val_check_interval=2",
    "task.protocol.lr=1e-3",
    "model.dropout=0.0",
    "++attention.hparams.dropout=0.0",
    "num_workers=0",
    kill_at_step.OVERRIDE,  # in every run: the folder is named by the overrides
)
KILLED_AT = 8  # after the evaluations at 2, 4, 6 and 8; the uninterrupted run's best is among them


def record_of(outputs: Path) -> tuple[Path, dict]:
    (path,) = outputs.rglob("results.json")
    return path.parent, json.loads(path.read_text())


def evaluations(run_folder: Path) -> list[int]:
    metrics = pd.read_csv(run_folder / "metrics" / "metrics.csv")
    return metrics.dropna(subset=["val/acc"])["step"].tolist()


@pytest.mark.slow
def test_a_run_moved_to_another_folder_resumes_as_if_never_interrupted(tmp_path, run_train):
    def train(outputs: Path, **kill):
        return run_train(*DETERMINISTIC, env={"LRA_OUTPUT_DIR": str(outputs), **kill_at_step.environment(**kill)}, check=not kill)

    train(tmp_path / "uninterrupted")
    _, expected = record_of(tmp_path / "uninterrupted")
    assert expected["best_val_step"] <= KILLED_AT, "the best must come before the interruption, whose state keeps it"

    killed = train(tmp_path / "here", kill_at_step=KILLED_AT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    moved = tmp_path / "another" / "machine" / "outputs"
    moved.parent.mkdir(parents=True)
    shutil.move(tmp_path / "here", moved)
    run_folder, _ = record_of(moved)
    checkpoints = run_folder / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == KILLED_AT

    resumed = train(moved)
    assert f"Resuming the interrupted run from {checkpoints / 'last.ckpt'}" in resumed.stderr
    _, record = record_of(moved)
    assert record["status"] == "finished" and record["steps"] == expected["steps"]
    best = Path(record["best_checkpoint"])
    assert best.is_file() and best.parent == checkpoints, best
    assert (record["best_val_step"], record["best_val_acc"]) == (expected["best_val_step"], expected["best_val_acc"])
    assert record["test_acc"] == pytest.approx(expected["test_acc"], abs=1e-6)
    assert sorted(p.name for p in checkpoints.glob("best-step*.ckpt")) == [best.name], "the earlier best is replaced, not kept"
    assert evaluations(run_folder) == evaluations(record_of(tmp_path / "uninterrupted")[0]), "each evaluation once"


def test_the_saved_state_follows_the_folder_and_keeps_lightnings_key(tmp_path):
    old, new, elsewhere = (str(tmp_path / name / "checkpoints") for name in ("old", "new", "elsewhere"))
    callback = RunFolderCheckpoint(dirpath=new, filename="best-step{step}", monitor="val/acc", mode="max")
    state = {
        "monitor": "val/acc",
        "best_model_score": torch.tensor(0.5),
        "best_model_path": f"{old}/best-step6.ckpt",
        "current_score": torch.tensor(0.25),
        "dirpath": old,
        "best_k_models": {f"{old}/best-step6.ckpt": torch.tensor(0.5), f"{elsewhere}/best-step4.ckpt": torch.tensor(0.4)},
        "kth_best_model_path": f"{elsewhere}/best-step4.ckpt",
        "kth_value": torch.tensor(0.4),
        "last_model_path": f"{old}/last.ckpt",
    }
    callback.load_state_dict(state)
    assert callback.dirpath == new and callback.best_model_score == 0.5 and callback.kth_value == 0.4
    assert callback.best_model_path == f"{new}/best-step6.ckpt" and callback.last_model_path == f"{new}/last.ckpt"
    assert callback.best_k_models == {f"{new}/best-step6.ckpt": 0.5, f"{elsewhere}/best-step4.ckpt": 0.4}
    assert callback.kth_best_model_path == f"{elsewhere}/best-step4.ckpt", "a path outside the folder stays"
    # The key a last.ckpt saved by Lightning's own ModelCheckpoint holds the state under, so such a run resumes here too.
    lightnings = ModelCheckpoint(dirpath=new, filename="best-step{step}", monitor="val/acc", mode="max")
    assert callback.state_key == lightnings.state_key
