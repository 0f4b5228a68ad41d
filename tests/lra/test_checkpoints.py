"""Checkpoints are read with ``weights_only=True``: one holding a pickled callable is refused and runs nothing."""

import json
from pathlib import Path

import pytest
import torch
from test_train import assert_one_clear_message, results_files

from lra import checkpoints


class TouchesAFileWhenUnpickled:
    """What a malicious checkpoint can carry: unpickling calls ``Path.touch(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_checkpoint_of_tensors_and_plain_data_is_read(tmp_path):
    state = {"global_step": 7, "state_dict": {"w": torch.arange(3.0)}, "hyper_parameters": {"lr": 1e-3, "name": "x"}}
    path = tmp_path / "ok.ckpt"
    torch.save(state, path)
    loaded = checkpoints.read(path)
    assert loaded["global_step"] == 7 and torch.equal(loaded["state_dict"]["w"], torch.arange(3.0))


def test_a_checkpoint_carrying_a_callable_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.ckpt"
    torch.save({"global_step": 7, "payload": TouchesAFileWhenUnpickled(marker)}, path)
    with pytest.raises(ValueError, match=r"refused to load the checkpoint .*evil\.ckpt: it holds more than tensors"):
        checkpoints.read(path)
    assert not marker.exists()


@pytest.mark.slow
def test_resuming_from_a_tampered_last_checkpoint_is_one_clear_message(tmp_path, run_train):
    run_train()
    (record_path,) = results_files(tmp_path)
    record = json.loads(record_path.read_text())
    record["status"] = "failed"  # as an interrupted run leaves it: the next run resumes from last.ckpt
    record_path.write_text(json.dumps(record))
    last = record_path.parent / "checkpoints" / "last.ckpt"
    marker = tmp_path / "code-ran"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    torch.save({**saved, "payload": TouchesAFileWhenUnpickled(marker)}, last)
    checkpoints.digest_file(last).unlink()  # whoever edits it can drop its digest too: then nothing in it may run

    process = run_train(check=False)
    assert_one_clear_message(process, "refused to load the checkpoint", "CheckpointRefused")
    assert "last.ckpt" in process.stderr and not marker.exists()
