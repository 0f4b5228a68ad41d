"""``lra.sweep``: the summary a multirun sweep ends with, and its exit status."""

from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import read_write
from tiny_listops import TINY

from lra import campaign, results, run, sweep
from lra.results import RunRecord


def finished_record(path: Path, overrides: list[str], test_acc: float) -> str:
    """Write the record of a finished run of ``overrides``'s configuration, as lra.train records it; its hash."""
    checked, _ = run.checked_and_hashed(campaign.compose(overrides))
    record = RunRecord(task="listops", attention="softmax", row="softmax", seed=0, status="finished", test_acc=test_acc)
    results.record_configuration(record, checked, results.CLASSIFICATION)
    path.parent.mkdir(parents=True, exist_ok=True)
    record.write(path)
    return record.config_hash


@pytest.mark.parametrize("where", ["another folder", "committed"])
def test_a_cell_skipped_for_its_configuration_finished_elsewhere_counts_as_finished(where, tmp_path, monkeypatch, capsys):
    """``seed=0`` spelled out names another folder than the default seed's, for the same configuration: lra.train
    skips the cell and leaves no record in its folder, which the summary reported as "no results.json ... not
    finished", and the sweep exited 1. Likewise for a configuration committed under results/runs/."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv(sweep.LEDGER_ENV, "")  # restored after the test, whatever the callback left
    (default,), _, _ = campaign.make_plan(list(TINY))  # the default seed's cell: its folder, and lra.train's hash
    if where == "committed":
        elsewhere = tmp_path / "results" / "runs" / "listops__softmax__smoke__seed0__x.json"
    else:
        elsewhere = Path(default.folder) / results.RESULTS_FILE
    assert finished_record(elsewhere, list(TINY), test_acc=0.25) == default.config_hash

    cfg = campaign.compose([*TINY, "seed=0"])
    HydraConfig.instance().set_config(cfg)
    folder = Path(str(cfg.hydra.run.dir)).absolute()
    assert folder != Path(default.folder)
    with read_write(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.runtime.output_dir = str(folder)
    callback = sweep.SweepSummary()
    callback.on_multirun_start(cfg)
    job = JobReturn(overrides=[*TINY, "seed=0"], status=JobStatus.COMPLETED, _return_value=0.25)  # lra.train's skip
    callback.on_job_end(cfg, job)
    callback.on_multirun_end(cfg)  # exits 1 where a cell did not finish

    said = capsys.readouterr().out
    assert "Sweep: 1 cells, 1 finished, 0 not finished" in said, said
    assert f"test acc 0.2500, skipped: its configuration finished in {elsewhere}" in said, said


def test_a_cell_without_a_record_anywhere_is_not_finished(tmp_path):
    lines, failed = sweep.summary([{"folder": str(tmp_path / "run"), "finished_in": ""}])
    assert failed == 1 and "no results.json" in lines[1] and "the job ended without a record" in lines[1]
