import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import attention_zoo
from lra import config, devices, results
from lra.config import checked
from lra.results import CLASSIFICATION, RunRecord, defining_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident set is read from Linux's /proc")
def test_each_run_of_a_multirun_reports_its_own_peak_memory():
    """Hydra's multirun trains every job in one process: a peak left by an earlier job must not
    become a later job's figure."""
    cpu = torch.device("cpu")
    devices.reset_peak_memory(cpu)
    before, kind = devices.peak_memory_mb(cpu)
    block = np.ones(400 * 2**20 // 8)  # 400 MB, touched, then freed (glibc unmaps a block this large)
    during, _ = devices.peak_memory_mb(cpu)
    del block
    devices.reset_peak_memory(cpu)
    after, _ = devices.peak_memory_mb(cpu)
    assert kind == "cpu_max_rss"
    assert during > before + 350, (before, during)
    assert after < during - 350, (during, after)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_the_peak_memory_of_a_process_that_has_not_used_cuda_yet_can_be_reset():
    """A run resets the peak before its first CUDA allocation; in a fresh process that once failed
    with 'Invalid device argument' and every training run on a GPU failed with it."""
    script = (
        "import torch\n"
        "from lra.results import reset_peak_memory, peak_memory_mb\n"
        "device = torch.device('cuda', 0)\n"
        "reset_peak_memory(device)\n"
        "x = torch.ones(2**20, device=device)\n"
        "print(peak_memory_mb(device)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) >= 4.0  # the 4 MiB tensor


def test_a_renamed_setting_keeps_the_hash_and_the_cell_of_the_runs_recorded_before_it():
    """Records committed before ``model.attention_in_fp32`` became ``attention_in_float32`` and Nystromformer's
    ``conv_kernel_size`` became ``conv_window`` keep what they wrote; today's configuration has their hash (a sweep
    skips them) and the same configuration (a table pools today's runs with them)."""
    path = next((REPO / "results" / "runs").glob("listops__nystromformer__table3_cpu__seed0__*.json"))
    record = RunRecord.read(path)
    assert "attention_in_fp32" in record.model and "conv_kernel_size" in record.attention_hparams, "as written"
    composed = config.compose(["experiment=table3_cpu", "task=listops", "attention=nystromformer", "seed=0"])
    cfg, _ = checked(composed, CLASSIFICATION)
    assert results.config_hash(defining_config(cfg)) == record.config_hash
    today = RunRecord(
        attention=cfg.attention.name,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention_hparams=dataclasses.asdict(attention_zoo.make_config(cfg.attention.name, **cfg.attention.hparams)),
    )
    assert "attention_in_float32" in today.model and "conv_window" in today.attention_hparams
    for key in ("model", "attention_hparams"):
        assert record.configuration()[key] == today.configuration()[key]


def test_every_committed_record_loads_and_is_written_back_as_it_is():
    """Records of every version (1, ``schema_version``, before RunRecord; 2 since) are read, not rewritten: one
    --collect again gives the same bytes."""
    paths = sorted((REPO / "results" / "runs").glob("*.json"))
    assert paths
    for path in paths:
        record = RunRecord.read(path)
        assert record.record_version in results.VERSION_KEYS and record.status == "finished" and record.config_hash, path.name
        assert record.to_dict() == json.loads(path.read_text()), path.name
        assert json.dumps(record.to_dict(committed=True), indent=2, sort_keys=True) + "\n" == path.read_text(), path.name


def test_a_record_writes_what_it_holds_in_its_order_and_the_machine_stays_out_of_a_committed_one(tmp_path):
    record = RunRecord(task="listops", attention="softmax", row="softmax", seed=0, status="running")
    record.update(data=results.recorded_data({"source": "generated", "max_length": 60, "cache_dir": "/data/cache"}))
    record.update(steps=6, steps_per_second=None, best_checkpoint="/here/best.ckpt", test_acc=0.5)
    record.status = "finished"
    path = tmp_path / results.RESULTS_FILE
    record.write(path)
    written = json.loads(path.read_text())
    # The version first, then the schema's order; a measurement not made is null, a key never set is not written.
    assert list(written) == [
        "record_version", "task", "attention", "row", "seed", "status", "data", "steps", "steps_per_second",
        "test_acc", "best_checkpoint",
    ]  # fmt: skip
    assert written["record_version"] == results.RECORD_VERSION and written["steps_per_second"] is None
    assert written["data"] == {"source": "generated", "max_length": 60}, "task.data's paths are never recorded"
    assert RunRecord.read(path) == record and RunRecord.read(path).to_dict() == written
    record.write(path, committed=True)
    committed = json.loads(path.read_text())
    assert set(committed) == set(written) - {"best_checkpoint"} and list(committed) == sorted(committed)
    assert all(key in results.RECORD_KEYS or "." in key for key in results.MACHINE_KEYS + results.CONFIGURATION_KEYS)


def test_an_older_record_reads_with_the_settings_added_since_at_their_old_values_and_a_foreign_key_is_refused():
    old = RunRecord.from_dict({"schema_version": 1, "task": "listops", "attention": "softmax", "seed": 0, "model": {"dim": 64}})
    assert old.row == "softmax" and old.pretrain is None
    assert old.configuration() == {
        "task": "listops",
        "attention": "softmax",
        "model": {"dim": 64, "positions": "learned"},
        "pretrain": {"objective": "none"},
        "precision": "32-true",  # every run was float32 before precision was part of a run's identity
    }
    with pytest.raises(ValueError, match="no key"):
        RunRecord.from_dict({"task": "listops", "test_accuracy": 0.5})
    with pytest.raises(KeyError):
        old.update(test_accuracy=0.5)


def test_precision_is_part_of_the_config_hash_but_float32_keeps_the_hash_runs_had_before():
    """Issue 37: a bf16 run is another configuration; a float32 run keeps its committed hash, so it is still found."""
    defining = defining_config(config.compose(["task.protocol.max_steps=20"]))
    assert defining["precision"] == "32-true"
    before = {key: value for key, value in defining.items() if key != "precision"}
    assert results.config_hash(defining) == results.config_hash(before)
    bf16 = defining_config(config.compose(["task.protocol.max_steps=20", "trainer.precision=bf16-mixed"]))
    assert bf16["precision"] == "bf16-mixed" and results.config_hash(bf16) != results.config_hash(defining)
    short = defining_config(config.compose(["task.protocol.max_steps=20", "trainer.precision=bf16"]))
    assert results.config_hash(short) == results.config_hash(bf16), "Lightning's short name is the same precision"
    assert RunRecord(precision="32").configuration()["precision"] == "32-true"


def test_a_non_finite_number_is_recorded_as_null_with_what_it_was_so_the_record_stays_json(tmp_path):
    from lra.results import RunRecord

    record = RunRecord(task="listops", attention="softmax", status="finished", test_acc=0.2, test_loss=float("nan"))
    record.update(steps_per_second=float("inf"))
    path = tmp_path / "results.json"
    record.write(path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    values = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert values["test_loss"] is None and values["steps_per_second"] is None and values["test_acc"] == 0.2
    assert values["non_finite"] == {"test_loss": "nan", "steps_per_second": "inf"}
    again = RunRecord.read(path)
    assert again.test_loss is None and again.non_finite == {"test_loss": "nan", "steps_per_second": "inf"}
