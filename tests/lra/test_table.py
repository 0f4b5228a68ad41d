"""``python -m lra.table``: run records -> Table 3 (Markdown, CSV, LaTeX, figure)."""

import json
import os
import subprocess
import sys

import pytest

from lra import table


def record(row, task, seed, acc, protocol="paper", status="finished", source="lra_release", **extra):
    return {
        "task": task, "attention": row.split("_")[0], "row": row, "seed": seed, "test_acc": acc,
        "protocol": {"name": protocol}, "status": status, "data_source": source,
        "config_hash": f"{row}-{task}-{seed}-{protocol}", "best_checkpoint": "/somewhere/best.ckpt", **extra,
    }


def write_runs(folder, records):
    for i, r in enumerate(records):
        run = folder / f"run{i}"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(r))


def test_cells_are_mean_and_std_over_seeds_beside_the_paper(tmp_path):
    records = [
        record("softmax", "listops", 0, 0.36), record("softmax", "listops", 1, 0.38),
        record("yoso_32", "listops", 0, 0.40, source="generated"),
        record("none", "listops", 0, 0.10, status="failed", error="RuntimeError: out of memory"),
    ]
    (md_table,) = table.build_tables(records)
    cell = md_table.cells[("softmax", "listops")]
    assert cell.mean == pytest.approx(37.0) and cell.std == pytest.approx(1.41421356, rel=1e-6)
    text = table.markdown([md_table])
    # paper: softmax 37.10 on ListOps, yoso-32 37.25; the best mean is bold; generated data marked.
    assert "| softmax | 37.00 ± 1.41 (37.10, -0.10) |" in text
    assert "| yoso-32 | **40.00**† (37.25, +2.75) |" in text
    assert "listops / none / seed 0: failed: RuntimeError: out of memory" in text
    # No Avg without all five tasks, and rows keep the paper's order.
    assert text.index("| softmax |") < text.index("| yoso-32 |") and "| – |" in text


def test_average_over_the_five_tasks_and_unknown_rows_after_the_paper_rows():
    records = [record("softmax", task, 0, 0.5 + 0.1 * i) for i, task in enumerate(table.TASKS)]
    records.append(record("my_attention", "image", 0, 0.9))
    (t,) = table.build_tables(records)
    assert t.average("softmax") == pytest.approx(70.0)
    assert t.rows == ["softmax", "my_attention"]
    csv = table.csv_text([t]).splitlines()
    assert csv[0].startswith("protocol,row,task,num_seeds,mean,std,paper,difference")
    assert "paper,softmax,listops,1,50.0000,0.0000,37.10,12.9000,lra_release,50.0000" in csv
    assert "paper,my_attention,image,1,90.0000,0.0000,,,lra_release,90.0000" in csv


def test_protocols_get_separate_tables_paper_first():
    records = [record("softmax", "listops", 0, 0.2, protocol="table3_short"), record("softmax", "listops", 0, 0.3)]
    tables = table.build_tables(records)
    assert [t.protocol for t in tables] == ["paper", "table3_short"]
    assert "not the paper's" in table.markdown(tables)


def test_the_same_runs_give_the_same_files_and_collect_drops_machine_paths(tmp_path):
    write_runs(tmp_path / "outputs", [record("softmax", "listops", s, 0.3 + s / 100) for s in range(3)]
               + [record("yoso_32", "pathfinder", 0, 0.7, source="generated")])
    table.main(["--runs", str(tmp_path / "outputs"), "--results", str(tmp_path / "results"), "--collect"])
    files = {p.name: p.read_bytes() for p in (tmp_path / "results").iterdir() if p.is_file()}
    assert set(files) == {"table3.md", "table3.csv", "table3.tex", "table3.png"}
    runs = sorted((tmp_path / "results" / "runs").iterdir())
    assert len(runs) == 4 and all("best_checkpoint" not in json.loads(p.read_text()) for p in runs)
    assert runs[0].name == "listops__softmax__paper__seed0__softmax-.json"

    # From the committed records alone (no outputs/), the same bytes again.
    table.main(["--runs", str(tmp_path / "nothing"), "--results", str(tmp_path / "results")])
    assert {p.name: p.read_bytes() for p in (tmp_path / "results").iterdir() if p.is_file()} == files
    assert "\\textbf{70.00}\\dag (72.33)" in files["table3.tex"].decode()


@pytest.mark.slow
def test_table_from_real_runs(tmp_path, run_train):
    run_train("attention=softmax,none", flags=["-m"])
    env = {**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.run([sys.executable, "-m", "lra.table", "--collect"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    text = (tmp_path / "results" / "table3.md").read_text()
    assert "## Protocol: smoke" in text and "| softmax |" in text and "| none |" in text
    assert len(list((tmp_path / "results" / "runs").glob("listops__*__smoke__seed0__*.json"))) == 2
