"""``python -m lra.table``: run records -> Table 3 (Markdown, CSV, LaTeX, figure)."""

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import kill_at_step
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from lra import paper, run_lock, table
from lra.results import RunRecord, recomputed_config_hash
from lra.table import speed
from lra.table.curves import colour

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = Path(__file__).parent / "published"  # the published tables, copied as their sources print them
SMOKE = dict(
    name="smoke",
    batch_size=32,
    max_steps=400,
    warmup_steps=40,
    val_check_interval=50,
    limit_val_batches=8,
    lr=1e-3,
    weight_decay=0.0,
)
MODEL = dict(dim=64, depth=2, num_heads=2, head_dim=32, ffn_dim=128, dropout=0.1, head_hidden_dim=128, attention_in_float32=True)


def record(
    row,
    task,
    seed,
    acc,
    status="finished",
    source="generated",
    num_test=1000,
    finished_at="2026-01-01T00:00:00",
    protocol=None,
    model=None,
    hparams=None,
    **extra,
):
    """A run record as lra.train writes it, its config hash the one of the configuration it holds."""
    protocol = protocol or SMOKE
    hparams = {"dropout": 0.1} if hparams is None else hparams
    result = {
        "task": task,
        "attention": row.split(" ")[0],
        "row": row,
        "seed": seed,
        "status": status,
        "attention_hparams": hparams,
        "protocol": protocol,
        "model": model or MODEL,
        "seq_len": 256,
        "data": {"source": "generated", "max_length": 250},
        "finished_at": finished_at,
        "best_checkpoint": "/somewhere/best.ckpt",
        **extra,
    }
    if status == "finished":
        result.update(test_acc=acc, data_source=source, num_samples={"train": 2000, "val": 256, "test": num_test})
    else:
        result["error"] = extra.get("error", "RuntimeError: out of memory")
    return hashed(RunRecord.from_dict(result))


def hashed(run):
    """``run`` with the config hash of what it holds, as lra.train writes it (``--collect`` checks it)."""
    run.config_hash = recomputed_config_hash(run)
    return run


def write_runs(folder, records):
    for i, r in enumerate(records):
        run = folder / f"run{i}"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(r.to_dict()))


def only(sections, title):
    (section,) = [s for s in sections if s.title == title]
    return section


def sections_of(records):
    return table.build(records).sections


def test_runs_with_different_budgets_are_never_averaged_as_seeds():
    """The issue's case: smoke softmax/ListOps runs of 400, 20 and 10 steps, all seed 0, and failures."""
    records = [
        record("softmax", "listops", 0, 0.3125),
        record("softmax", "listops", 0, 0.15, protocol={**SMOKE, "max_steps": 20}),
        record("softmax", "listops", 0, 0.14, protocol={**SMOKE, "max_steps": 10}),
        record("softmax", "listops", 0, None, status="failed", finished_at="2025-01-01T00:00:00"),  # finished later
        record("softmax", "listops", 0, None, status="failed", protocol={**SMOKE, "max_steps": 5}),
    ]
    result = table.build(records)
    # The 5-step configuration has no finished run: no section of its own, one line at the end. The declared protocol
    # keeps its name beside the shortened runs (issue 71: a committed section was renamed by a user's runs).
    assert [s.title for s in result.sections] == ["smoke", "smoke, protocol.max_steps=10", "smoke, protocol.max_steps=20"]
    cell = only(result.sections, "smoke").cell("softmax", "listops")
    assert cell["accuracies"] == [31.25] and cell["seeds"] == [0]
    text = table.markdown(result, "test records")
    assert "## smoke\n" in text and "| softmax | 31.25 ± 1.47† | 37.10‡ |" not in text
    assert "| softmax | 31.25 ± 1.47† | 37.10 | – | 65.02 |" in text
    # Only the configuration with no finished run did not finish, listed once, at the end.
    (line,) = [line for line in text.splitlines() if "out of memory" in line]
    assert line.startswith("- listops / softmax / seed 0, protocol smoke, config ")
    assert line.endswith(": failed: RuntimeError: out of memory")
    assert text.index("## Not in the table") > text.index("## smoke, protocol.max_steps=20")


def test_sections_come_strongest_evidence_first_and_the_figure_draws_the_first_alone(tmp_path):
    """The paper's protocol first, then the section with the most rows, then the most runs: the README's first picture
    (the first section of comparison.png) shows the strongest evidence, readable whatever else was run."""
    short = {**SMOKE, "max_steps": 20}
    records = [record("softmax", "listops", seed, 0.3, protocol=short) for seed in range(3)]  # 1 row x 3 seeds
    records += [record(row, "listops", 0, 0.3) for row in ("softmax", "none", "linformer")]  # 3 rows x 1 seed
    records += [record(row, "listops", 0, 0.3, protocol={**SMOKE, "max_steps": 10}) for row in ("softmax", "none")]
    titles = [section.title for section in table.build(records).sections]
    assert titles == ["smoke", "smoke, protocol.max_steps=10", "smoke, protocol.max_steps=20"]
    records += [record("softmax", "listops", seed, 0.3, protocol={**SMOKE, "max_steps": 30}) for seed in range(4)]
    assert [s.title for s in table.build(records).sections][2:4] == ["smoke, protocol.max_steps=30", titles[2]]
    paper = table.build([*records, paper_record("softmax", "listops", 0, 0.36)])  # one run, one row
    assert paper.sections[0].paper_protocol and paper.sections[1].title == titles[0]
    built = table.build(records)
    table.figure(built, tmp_path / "every.png")
    table.figure(dataclasses.replace(built, sections=built.sections[:1]), tmp_path / "first.png")
    sizes = [plt.imread(tmp_path / name).shape for name in ("every.png", "first.png")]
    assert sizes[0] == sizes[1], "the other sections add nothing to the picture"


def test_seeds_of_one_configuration_pool_and_a_repeated_seed_counts_once():
    records = [
        record("softmax", "listops", 0, 0.36),
        record("softmax", "listops", 1, 0.38),
        # The same configuration and seed run again: the latest finished counts, and the table says so.
        record("softmax", "listops", 1, 0.30, finished_at="2026-02-01T00:00:00"),
    ]
    copy = dataclasses.replace(records[0])  # one run found twice (outputs/ and results/runs/) is one record
    result = table.build([*records, copy])
    (section,) = result.sections
    cell = section.cell("softmax", "listops")
    assert cell["accuracies"] == [36.0, 30.0] and cell["seeds"] == [0, 1]
    assert cell["std"] == pytest.approx(4.2426, rel=1e-4)
    # The seeds' spread and the sampling error of the test set they share (1000 samples at the mean, 33%), combined.
    assert cell["standard_error"] == pytest.approx(((cell["std"] / 2**0.5) ** 2 + 100**2 * 0.33 * 0.67 / 1000) ** 0.5)
    assert section.duplicates == [
        "listops / softmax / seed 1: 2 runs of one configuration, the latest (2026-02-01T00:00:00) counts"
    ]
    text = table.markdown(result, "test records")
    assert "Counted once:" in text and "A cell of one seed" not in text


def test_seeds_that_scored_alike_keep_the_sampling_error_of_the_test_set_they_share():
    """Two seeds that both predicted the majority class read 16.85 ± 0.00 when the error was their spread alone."""
    result = table.build([record("nystromformer", "listops", seed, 0.1685, num_test=2000) for seed in (0, 1)])
    cell = result.sections[0].cell("nystromformer", "listops")
    assert cell["std"] == 0 and cell["standard_error"] == pytest.approx(100 * (0.1685 * 0.8315 / 2000) ** 0.5)
    assert "| nystromformer | 16.85 ± 0.84† |" in table.markdown(result, "test records")


def test_one_seed_shows_the_binomial_standard_error_of_its_test_samples():
    result = table.build([record("softmax", "listops", 0, 0.331, num_test=1000)])
    assert result.sections[0].cell("softmax", "listops")["standard_error"] == pytest.approx(100 * (0.331 * 0.669 / 1000) ** 0.5)
    text = table.markdown(result, "test records")
    assert "Test samples: ListOps 1000." in text and "A cell of one seed: its ± is the sampling error" in text


def test_the_cells_that_pool_another_count_of_seeds_than_most_are_named():
    """A paper section filling up seed by seed: which cells' ± hold their seeds' spread, and which a test set's alone."""
    records = [
        *(
            record(row, "listops", 0, 0.34)
            for row in ("softmax", "linformer", "none", "nystromformer", "yoso_star_c_16", "yoso_32")
        ),
        *(record(row, "listops", 1, 0.30) for row in ("nystromformer", "yoso_star_c_16")),
    ]
    text = table.markdown(table.build(records), "test records")
    assert "Seeds per cell: 1, and 2 for ListOps's nystromformer and *yoso-C-16. Test samples: ListOps 1000." in text
    three = [*records, *(record("yoso_32", "listops", seed, 0.3) for seed in (1, 2))]
    text = table.markdown(table.build(three), "test records")
    assert "Seeds per cell: 1, and 2 for ListOps's nystromformer and *yoso-C-16, and 3 for ListOps's yoso-32. " in text
    uniform = table.markdown(table.build([record("softmax", "listops", seed, 0.3) for seed in (0, 1)]), "test records")
    assert "Seeds per cell: 2. Test samples" in uniform


def test_best_is_bold_only_beyond_the_noise():
    chance = [record("yoso_c_16", "pathfinder", 0, 0.511, hparams={}), record("none", "pathfinder", 0, 0.508, hparams={})]
    result = table.build(chance)
    assert result.sections[0].best("pathfinder") is None and "**" not in table.markdown(result, "test records")
    clear = [record("softmax", "listops", 0, 0.37), record("none", "listops", 0, 0.17, hparams={})]
    result = table.build(clear)
    assert result.sections[0].best("listops") == "softmax"
    assert "| softmax | **37.00 ± 1.53**† | 37.10 |" in table.markdown(result, "test records")


def correct_on(samples, num_test=1000):
    """A record's ``test_correct``: "1" on ``samples`` (indices of the test set), "0" elsewhere."""
    chosen = set(samples)
    return "".join("1" if i in chosen else "0" for i in range(num_test))


def test_rows_that_predict_alike_are_told_apart_by_the_paired_error_of_their_difference():
    """Two rows tested on one test set, the weaker right on a subset of the stronger's samples: 37.0 and 34.0 are
    within twice the two binomial errors combined (2.14), not within twice the paired error (0.54), which is the spread
    of the 1000 per-sample differences (30 of them 1, the others 0). A row whose run did not record its samples (a
    record of before runs did) is compared as before."""
    stronger = record("softmax", "listops", 0, 0.37, test_correct=correct_on(range(370)))
    weaker = record("none", "listops", 0, 0.34, hparams={}, test_correct=correct_on(range(340)))
    result = table.build([stronger, weaker])
    cells = result.sections[0].cells
    error, paired = table.difference_error(cells.loc[("none", "listops")], cells.loc[("softmax", "listops")])
    differences = np.array([1.0] * 30 + [0.0] * 970)
    assert paired and error == pytest.approx(100 * np.sqrt(differences.var() / 1000))
    assert result.sections[0].best("listops") == "softmax"
    assert "(paired on the test set where every run of both recorded" in table.markdown(result, "test records")
    unrecorded = record("none", "listops", 0, 0.34, hparams={})
    result = table.build([stronger, unrecorded])
    cells = result.sections[0].cells
    error, paired = table.difference_error(cells.loc[("none", "listops")], cells.loc[("softmax", "listops")])
    assert not paired and error == pytest.approx(100 * np.hypot(np.sqrt(0.37 * 0.63 / 1000), np.sqrt(0.34 * 0.66 / 1000)))
    assert result.sections[0].best("listops") is None
    # Another test set (the LRA release's where the other row's was generated): its sample i is another sequence.
    released = record("none", "listops", 0, 0.34, hparams={}, source="release", test_correct=correct_on(range(340)))
    result = table.build([stronger, released])
    (section,) = result.sections
    cells = section.cells
    assert not table.difference_error(cells.loc[("none", "listops")], cells.loc[("softmax", "listops")])[1]
    assert section.best("listops") is None


def test_a_paired_error_pools_each_samples_accuracy_over_the_seeds_and_keeps_their_spread():
    """Two seeds a cell: the per-sample differences are of the samples' accuracies over each cell's seeds, and each
    cell's seeds' spread (std / sqrt(2)) is added in quadrature, as in its own standard error."""
    a = [record("softmax", "listops", seed, acc, test_correct=correct_on(range(first, first + int(acc * 1000))))
         for seed, acc, first in ((0, 0.37, 0), (1, 0.35, 10))]  # fmt: skip
    b = [record("none", "listops", seed, 0.30, hparams={}, test_correct=correct_on(range(first, first + 300)))
         for seed, first in ((0, 5), (1, 40))]  # fmt: skip
    cells = table.build([*a, *b]).sections[0].cells
    error, paired = table.difference_error(cells.loc[("none", "listops")], cells.loc[("softmax", "listops")])
    per_sample = [np.mean([[float(c) for c in r.test_correct] for r in runs], axis=0) for runs in (a, b)]
    spread = [np.std([100 * r.test_acc for r in runs], ddof=1) / np.sqrt(2) for runs in (a, b)]
    test_error = 100 * np.sqrt((per_sample[0] - per_sample[1]).var() / 1000)
    assert paired and error == pytest.approx(np.sqrt(test_error**2 + spread[0] ** 2 + spread[1] ** 2))


def test_a_record_whose_per_sample_results_are_not_its_test_accuracys_is_listed_never_a_cell():
    """``test_correct`` is a claim like ``test_acc``: its count must be the accuracy, its length the test set's."""
    for forged, problem in (
        (correct_on(range(360)), "its test_correct counts 360 of 1000 samples correct, its test accuracy is 0.37"),
        (correct_on(range(370), num_test=999), "its test_correct has 999 samples, its test set 1000"),
        (correct_on(range(370)).replace("0", "x", 1), "its test_correct is not a string of 0s and 1s"),
    ):
        result = table.build([record("softmax", "listops", 0, 0.37, test_correct=forged)])
        assert not result.sections
        assert problem in table.markdown(result, "test records")


def paper_record(row, task, seed, acc, **changes):
    protocol, model = table.paper_setup(task)
    return record(row, task, seed, acc, source="lra_release", protocol={**protocol, **changes}, model=model)


def test_the_papers_number_beside_every_section_marked_where_its_protocol_is_not_the_sections():
    result = table.build([paper_record("softmax", "listops", 0, 0.36), paper_record("softmax", "listops", 1, 0.38)])
    assert result.sections[0].paper_protocol
    text = table.markdown(result, "test records")
    assert "| model | ListOps | paper | Text | paper |" in text and "| softmax | 37.00 ± 1.83 | 37.10 | – | 65.02 |" in text
    assert table.cells_frame(result).loc[0, ["paper", "paper_protocol", "difference"]].tolist() == [37.10, True, -0.10]
    # Named "paper" but shortened: the paper's number, marked as its full protocol, and no difference.
    short = table.build([paper_record("softmax", "listops", 0, 0.30, max_steps=1000)])
    assert not short.sections[0].paper_protocol and short.sections[0].not_paper_because == "protocol.max_steps"
    text = table.markdown(short, "test records")
    assert "The paper's protocol with other settings (protocol.max_steps): the paper‡ column" in text
    assert "| model | ListOps | paper‡ | Text | paper‡ |" in text and "| softmax | 30.00 ± 1.45 | 37.10 |" in text
    assert pd.isna(table.cells_frame(short).loc[0, "difference"])
    smoke = table.build([record("softmax", "listops", 0, 0.30)])
    assert "Protocol `smoke`, not the paper's: the paper‡ column" in table.markdown(smoke, "test records")
    # LaTeX: the paper's number beside ours, marked the same way.
    assert "\\multicolumn{2}{c}{ListOps}" in table.latex(smoke) and "paper$^\\ddagger$" in table.latex(smoke)
    assert "30.00 $\\pm$ 1.45\\dag & 37.10 &" in table.latex(smoke)
    # LRA Table 1 ran a protocol of its own: beside our `paper` protocol (the YOSO paper's) its numbers are a
    # reference, marked, with no difference.
    lra = table.build([paper_record("linformer", "listops", 0, 0.3455)], published=paper.LRA_TABLE1)
    assert not lra.sections[0].paper_protocol
    text = table.markdown(lra, "test records")
    assert "Protocol `paper`; LRA Table 1 ran a protocol of its own: the paper‡ column" in text
    assert "| Linformer | 34.55 ± 1.50 | 35.70 |" in text and "| model | ListOps | paper‡ |" in text
    assert "under LRA's own protocol" in text and pd.isna(table.cells_frame(lra).loc[0, "difference"])


def test_tasks_without_runs_keep_their_columns_and_say_how_to_get_their_data():
    result = table.build([record("softmax", "listops", 0, 0.30)])
    (rho_row,) = [line for line in table.markdown(result, "test records").splitlines() if line.startswith("| *Spearman")]
    cells = rho_row.split(" | ")
    # ListOps, then Text, Retrieval, Image (downloaded) and Pathfinder (generated), each with the paper's column.
    assert cells[1] == "needs ≥ 3 rows with the paper's number (1 here)"
    assert cells[3] == "no runs; data: `python -m lra.data download text`"
    assert cells[5] == "no runs; data: `python -m lra.data download retrieval`"
    assert cells[7] == "no runs; data: `python -m lra.data download image`" and cells[9] == "no runs"


LISTOPS_MEANS = {  # the paper's rows at about 37% first, then those at about 19%
    "softmax": 28.0,  # on the paper's side: >= 28
    "yoso_e": 33.0,
    "nystromformer": 14.3,  # not on the paper's side
    "longformer": 31.0,
    "linformer": 33.5,
    "yoso_32": 33.4,
    "yoso_c_16": 33.6,
    "yoso_star_16": 34.3,
    "yoso_star_c_16": 29.0,
    "none": 14.8,
    "reformer": 27.9,  # on the paper's side: < 28
    "performer": 30.0,  # not on the paper's side
}


def test_agreement_with_the_paper_the_listops_split_and_spearmans_rho():
    records = [record(row, "listops", 0, mean / 100, hparams={}) for row, mean in LISTOPS_MEANS.items()]
    # Pathfinder, three rows with known ranks: ours 1, 2, 3 against the paper's 1, 3, 2 (none < linformer < reformer).
    ranked = [("none", 0.5), ("reformer", 0.6), ("linformer", 0.7)]
    pathfinder = table.declared_protocol("smoke", "pathfinder")  # smoke's own Pathfinder protocol: one section with ListOps
    records += [record(row, "pathfinder", 0, acc, hparams={}, protocol=pathfinder) for row, acc in ranked]
    result = table.build(records)
    (section,) = result.sections
    agreement = section.agreement
    assert agreement.loc["listops", "rows"] == 12 and agreement.loc["listops", "on_papers_side"] == 10
    assert pd.isna(agreement.loc["pathfinder", "on_papers_side"])
    assert agreement.loc["pathfinder", "spearman"] == pytest.approx(0.5)
    ours = pd.Series(LISTOPS_MEANS)
    papers = pd.Series({row: paper.TABLE3.number(row, "listops") for row in LISTOPS_MEANS})
    by_hand = np.corrcoef(ours.rank(), papers.rank())[0, 1]  # ties (37.20, 37.25 twice each) at their average rank
    assert agreement.loc["listops", "spearman"] == pytest.approx(by_hand)
    text = table.markdown(result, "test records")
    assert f"| *Spearman's ρ with the paper* | {by_hand:+.2f} (12 rows) |" in text
    assert "| *ListOps: on the paper's side* | 10 of 12 |" in text
    frame = table.cells_frame(result).set_index(["row", "task"])
    assert not frame.loc[("nystromformer", "listops"), "papers_side"] and frame.loc[("performer", "listops"), "paper"] == 18.80
    assert frame["papers_side"].xs("listops", level="task").sum() == 10
    assert frame["papers_side"].xs("pathfinder", level="task").isna().all()
    tidy = table.agreement_frame(result)
    assert tidy["task"].tolist() == ["listops", "pathfinder"] and tidy["rows"].tolist() == [12, 3]
    assert tidy["on_papers_side"].iloc[0] == 10 and pd.isna(tidy["on_papers_side"].iloc[1])


def test_spearman_ties_take_their_average_rank():
    ours, papers = pd.Series([1.0, 1.0, 2.0]), pd.Series([1.0, 2.0, 3.0])
    assert table.spearman(ours, papers) == pytest.approx(3**0.5 / 2)  # ranks 1.5, 1.5, 3 against 1, 2, 3
    assert np.isnan(table.spearman(ours[:2], papers[:2])) and np.isnan(table.spearman(pd.Series([5.0] * 3), papers))


def test_only_sections_with_cells_and_runs_that_are_not_cells_listed_once_at_the_end():
    """The issue's symptoms: a section with an empty header, ``other settings ()``, ``Test samples: ListOps 256.0``."""
    paper_protocol, paper_model = table.paper_setup("listops")
    records = [
        record("softmax", "listops", 0, 0.30, num_test=256),
        record("softmax", "listops", 1, None, status="failed", protocol={**SMOKE, "max_steps": 5}),
        record("softmax", "listops", 1, None, status="failed", protocol={**SMOKE, "max_steps": 5}, finished_at="2026-03-01"),
        record("softmax", "listops", 0, None, status="failed", protocol=paper_protocol, model=paper_model),  # no cell
        record("my_attention", "listops", 0, 0.9),
        record("softmax", "listops", 0, 0.31, num_test=None),  # no test size recorded: no float column either
    ]
    records[-1].num_samples = {"train": 2000}
    records[-1].data = {"source": "generated", "max_length": 300}
    hashed(records[-1])
    result = table.build(records)
    assert [s.title for s in result.sections] == ["smoke, data.max_length=250", "smoke, data.max_length=300"]
    text = table.markdown(result, "test records")
    assert "| model |  |" not in text and "other settings" not in text and "256.0" not in text
    assert "Test samples: ListOps 256." in text and "Test samples: ListOps not recorded." in text
    assert text.count("## ") == 3 and text.count("## Not in the table") == 1
    left_out = text.split("## Not in the table")[1]
    assert [line.split(",")[0] for line in left_out.splitlines() if line.startswith("- ")] == [
        "- listops / my_attention / seed 0",
        "- listops / softmax / seed 0",
        "- listops / softmax / seed 1",
    ]
    assert "finished at 90.00%, but my_attention is not a row of the paper's Table 3" in left_out
    assert "| my_attention" not in text
    # The CSV and LaTeX follow the same rules: cells only, no empty table, the runs that are not cells as comments.
    assert set(table.cells_frame(result)["row"]) == {"softmax"} and len(table.cells_frame(result)) == 2
    tex = table.latex(result)
    assert tex.count("\\begin{tabular}") == 2 and "\n% listops / my_attention / seed 0, protocol smoke" in tex
    assert [line for line in tex.splitlines() if "my_attention" in line and not line.startswith("% ")] == []
    with pytest.raises(ValueError, match="no cells"):
        table.Section("empty", "smoke", "protocol.name=smoke", table.build(records).sections[0].cells.iloc[:0])


def test_a_table_of_failed_runs_alone_lists_them(tmp_path):
    result = table.build([record("softmax", "listops", 0, None, status="failed")])
    assert result.sections == [] and len(result.left_out) == 1
    assert "## " not in table.markdown(result, "test records").replace("## Not in the table", "")
    paths = table.write_all([record("softmax", "listops", 0, None, status="failed")], tmp_path, "test records")
    assert all(path.exists() for path in paths) and pd.read_csv(paths[1]).empty


def test_average_over_the_five_tasks_and_unknown_rows_at_the_end():
    records = [paper_record("softmax", task, 0, 0.5 + 0.1 * i) for i, task in enumerate(table.TASKS)]
    records.append(paper_record("my_attention", "image", 0, 0.9))
    result = table.build(records)
    (section,) = result.sections
    assert section.average("softmax") == pytest.approx(70.0)
    assert section.rows == ["softmax"] and result.left_out["row"].tolist() == ["my_attention"]
    assert "| softmax | 50.00 ± 1.58 | 37.10 |" in table.markdown(result, "test records")
    assert "| 70.00 | 58.77 |" in table.markdown(result, "test records")  # ours and the paper's Avg
    frame = table.cells_frame(result)
    softmax = frame[(frame.row == "softmax") & (frame.task == "listops")].iloc[0]
    assert (softmax["num_seeds"], softmax["mean"], softmax["paper"], softmax["difference"]) == (1, 50.0, 37.10, 12.9)
    assert frame["task"].tolist() == list(table.TASKS)


def test_a_row_whose_runs_still_differ_is_split_and_labelled():
    records = [
        record("yoso_32", "listops", 0, 0.33, hparams={"num_hashes": 32}),
        record("yoso_32", "listops", 1, 0.35, hparams={"num_hashes": 16}),
        record("softmax", "listops", 0, 0.33),
    ]
    result = table.build(records)
    (section,) = result.sections
    assert section.rows == ["softmax", "yoso_32 (attention_hparams.num_hashes=16)", "yoso_32 (attention_hparams.num_hashes=32)"]
    # A split row is not the paper's row as its preset defines it: no paper number, not compared.
    assert section.in_order()["paper"].notna().tolist() == [True, False, False] and section.agreement.loc["listops", "rows"] == 1


def test_the_papers_numbers_are_its_table_3():
    """lra/paper.py against the paper's LaTeX source of its Table 3 (``tests/lra/published/``, copied as printed)."""
    tabular = (PUBLISHED / "yoso_table3.tex").read_text()
    rows = [line.rstrip(" \\").split(" & ") for line in tabular.splitlines() if line.count(" & ") == 6]
    printed = {label.strip(): [float(v) for v in values[:5]] for label, *values in rows if values[0][0].isdigit()}
    printed["nystromformer"] = printed.pop('nystr\\"{o}mformer')
    assert len(printed) == len(paper.TABLE3.rows) == 12
    assert printed == {row.label: [row.accuracy[task] for task in table.TASKS] for row in paper.TABLE3.rows}


def test_the_lra_papers_numbers_are_its_table_1():
    """lra/paper.py against the LRA repository's README leaderboard (``tests/lra/published/``, copied as printed)."""
    leaderboard = (PUBLISHED / "lra_table1.md").read_text()
    rows = [[cell.strip().strip("*") for cell in line.split("|")] for line in leaderboard.splitlines() if "FAIL" in line]
    printed = {label: [float(v) for v in values[:5]] for label, *values in rows}
    labels = {"Local Att": "Local Attention"}
    printed = {labels.get(label, label): values for label, values in printed.items()}
    assert len(printed) == len(paper.LRA_TABLE1.rows) == 11
    assert printed == {row.label: [row.accuracy[task] for task in table.TASKS] for row in paper.LRA_TABLE1.rows}


def test_the_lra_table_has_its_rows_in_its_order_with_its_labels_and_each_table_lists_only_rows_no_table_has():
    records = [
        record(row, "listops", 0, acc)
        for row, acc in [("bigbird", 0.33), ("yoso_32", 0.34), ("local", 0.16), ("softmax", 0.35), ("my_attention", 0.2)]
    ]
    lra = table.build(records, paper.LRA_TABLE1)
    (section,) = lra.sections
    assert section.rows == ["softmax", "local", "bigbird"], "LRA's order: Transformer, Local Attention, ..., BigBird"
    text = table.markdown(lra, "test records")
    legend = " ".join(text.split())
    assert text.startswith("# LRA Table 1: ") and "| Transformer | 35.00 ± 1.51† | 36.37 ‡" not in text
    assert "| Transformer | 35.00 ± 1.51† | 36.37 |" in text and "| Local Attention | 16.00 ± 1.16† | 15.82 |" in text
    assert (
        "the Long Range Arena paper's Table 1" in legend and "Local Attention, Sparse Trans., Linear Trans., Performer" in legend
    )
    assert section.agreement.loc["listops", "on_papers_side"] == 3
    # yoso_32 is Table 3's and bigbird LRA's: each table leaves out only the row no published table has.
    assert lra.left_out["row"].tolist() == ["my_attention"]
    yoso = table.build(records)
    assert yoso.sections[0].rows == ["softmax", "yoso_32"] and yoso.left_out["row"].tolist() == ["my_attention"]


def test_lra_table_paper_lra_table1_writes_its_own_files(tmp_path):
    outputs = tmp_path / "outputs"
    write_runs(outputs, [record("local", "listops", s, 0.16 + s / 100) for s in range(3)])
    table.main(["--runs", str(outputs), "--results", str(tmp_path / "results"), "--out", str(outputs), "--paper", "lra_table1"])
    assert {p.name for p in outputs.glob("lra_table1*")} == {
        f"lra_table1{suffix}" for suffix in (".md", ".csv", "_agreement.csv", ".tex", ".png")
    }
    assert "| Local Attention | 17.00 ± 1.32† | 15.82 |" in (outputs / "lra_table1.md").read_text()


def test_a_plain_table_goes_to_the_outputs_and_the_committed_one_from_committed_records(tmp_path):
    outputs, results = tmp_path / "outputs", tmp_path / "results"
    write_runs(outputs, [hashed(record("softmax", "listops", s, 0.3 + s / 100)) for s in range(3)])
    committed = record("yoso_32", "pathfinder", 0, 0.7, hparams={})
    (results / "runs").mkdir(parents=True)
    (results / "runs" / "committed.json").write_text(json.dumps(committed.to_dict()))
    args = ["--runs", str(outputs), "--results", str(results), "--out", str(outputs)]

    table.main(args)
    assert sorted(p.name for p in results.iterdir()) == ["runs"], "a plain lra.table never writes into results/"
    user = (outputs / "comparison.md").read_text()
    assert "| softmax | 31.00 ± 1.57† | 37.10‡ |" not in user and "| softmax | 31.00 ± 1.57† | 37.10 | – | 65.02 |" in user
    assert "| yoso-32 | – | 37.25 | – | 63.12 | – | 78.69 | – | 40.21 | 70.00 ± 1.45† | 72.33 |" in user
    table.main([*args, "--paper", "table3"])
    assert sorted(p.name for p in results.iterdir()) == ["runs"]
    assert "| yoso-32 | – | 37.25 |" in (outputs / "table3.md").read_text()

    table.main([*args, "--committed", "--paper", "table3"])
    first = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    assert set(first) == {"table3.md", "table3.csv", "table3_agreement.csv", "table3.tex", "table3.png"}
    assert "| softmax |" not in first["table3.md"].decode(), "the committed table holds committed runs only"
    table.main([*args, "--committed", "--paper", "table3"])
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == first, "same records, same bytes"

    table.main([*args, "--collect"])
    collected = sorted((results / "runs").glob("listops__softmax__smoke__seed*.json"))
    assert len(collected) == 3 and all("best_checkpoint" not in json.loads(p.read_text()) for p in collected)
    assert "| softmax | 31.00 ± 1.57† | 37.10 | – |" in (results / "comparison.md").read_text()
    frame = pd.read_csv(results / "comparison.csv")
    assert list(frame.columns[:8]) == ["section", "protocol", "row", "task", "num_seeds", "seeds", "num_test", "mean"]
    # --collect remakes every committed table, so that none disagrees with the committed records; spt.* has no runs.
    assert "| softmax | 31.00 ± 1.57† | 37.10 |" in (results / "table3.md").read_text()
    assert "| Transformer | 31.00 ± 1.57† | 36.37 |" in (results / "lra_table1.md").read_text()
    assert not (results / "spt.md").exists()


def test_the_committed_tables_are_what_lra_table_makes_of_the_committed_records(tmp_path):
    """`python -m lra.table --committed` remakes every committed table; each is what is committed."""
    shutil.copytree(REPO / "results" / "runs", tmp_path / "results" / "runs")
    subprocess.run(
        [sys.executable, "-m", "lra.table", "--committed"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    names = ("comparison", "table3", "spt", "lra_table1")
    for name in [f"{name}{suffix}" for name in names for suffix in (".md", ".csv", "_agreement.csv", ".tex", "_curves.csv")]:
        made = tmp_path / "results" / name
        assert made.exists() == (REPO / "results" / name).exists(), name
        if made.exists():
            assert made.read_text() == (REPO / "results" / name).read_text(), name


# The header of the README's table of the paper-protocol cells.
README_PAPER_TABLE = "| row | test accuracy (%), seed 0 | seed 1 | seed 2 | the paper | best validation (%), seed 0 |"
NOT_FINISHED = "—"  # the README's table: a seed with no run yet


def quoted_table(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with ``header`` in ``text``, each a list of its
    stripped cells."""
    lines = text[text.index(header) :].splitlines()[2:]  # past the header and its | --- | line
    rows = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]


def preset_of(label: str) -> str:
    """The preset of a Table 3 row as the README's tables name it (``*YOSO-C-16``, ``Nyströmformer``)."""
    presets = {paper.TABLE3.label(preset).lower(): preset for preset in paper.TABLE3.presets}
    return presets[label.lower().replace("ö", "o")]


def paper_protocol_record(label: str, seed: int = 0) -> dict:
    """The committed float32 run record of ``seed`` of the paper-protocol ListOps cell of the Table 3 row ``label``."""
    runs = (REPO / "results" / "runs").glob(f"listops__{preset_of(label)}__paper__seed{seed}__*.json")
    (run,) = [record for record in map(json.loads, map(Path.read_text, runs)) if record["precision"] == "32-true"]
    return run


def test_the_readme_quotes_the_committed_paper_protocol_cells_as_they_are():
    """The README's table of the paper-protocol ListOps cells (the CPU, float32) is typed by hand when a cell
    finishes: each seed it quotes has its committed run's test accuracy ± the binomial error of its test set and the
    step its curve first reached the split (``table3_curves.csv``), and each row the paper's number and seed 0's best
    validation accuracy. A dash may stand for a run committed since: pausing
    the campaign commits a cell that finished without touching the documents, and the next edit quotes it."""
    readme = (REPO / "README.md").read_text()
    header = README_PAPER_TABLE
    assert header in readme, "README.md's 'Where it stands' has lost its table of the paper-protocol cells"
    quoted = quoted_table(readme, header)
    total = len(paper.TABLE3.rows)
    finished = (
        f"all {total} of its seed-0 cells have finished"
        if len(quoted) == total
        else f"{len(quoted)} of its {total} cells have finished"
    )
    assert finished in " ".join(readme.split()), f"the line above the table says '{finished}'"
    curves = pd.read_csv(REPO / "results" / "table3_curves.csv").set_index(["row", "seed"])
    for label, *accuracies, paper_number, best_validation, at_split in quoted:
        steps = at_split.split(" / ")
        assert len(steps) == len(accuracies), f"{label}: a step at the split for each seed, '{NOT_FINISHED}' for none"
        for seed, (accuracy, step) in enumerate(zip(accuracies, steps)):
            if accuracy == NOT_FINISHED:
                assert step == NOT_FINISHED, (label, seed)
                continue
            run = paper_protocol_record(label, seed)
            p, n = run["test_acc"], run["num_samples"]["test"]
            assert accuracy == f"{100 * p:.2f} ± {100 * np.sqrt(p * (1 - p) / n):.2f}", (label, seed)
            first = curves.loc[(paper.TABLE3.label(preset_of(label)), seed), "first_step_at_split"]
            assert step == ("never" if pd.isna(first) else str(int(first))), (label, seed)
        assert float(paper_number) == paper.TABLE3.number(preset_of(label), "listops"), label
        assert float(best_validation) == round(100 * paper_protocol_record(label)["best_val_acc"], 2), label


def assert_cost_as_recorded(run: dict, hours: str, peak_memory: str, finished: str, commit: str) -> None:
    assert float(hours) == round(run["wall_time_s"] / 3600, 2)
    assert int(peak_memory) == round(run["peak_memory_mb"])
    assert finished == run["finished_at"][:16].replace("T", " ")
    assert run["git_commit"].startswith(commit)


def test_the_results_readme_quotes_what_each_paper_protocol_cell_cost_as_recorded():
    """``results/README.md``'s provenance of the paper-protocol cells quotes, for the same rows as the README's table
    (seed 0) and for the runs of seeds 1 and 2 it lists (a run committed since may not be listed yet: see above), each
    run's recorded run time, peak memory, end and commit."""
    results_readme = (REPO / "results" / "README.md").read_text()
    quoted = quoted_table(results_readme, "| row | run time (h) | peak memory (MB) | finished (UTC) | commit |")
    readme_rows = [row[0] for row in quoted_table((REPO / "README.md").read_text(), README_PAPER_TABLE)]
    assert sorted(row[0] for row in quoted) == sorted(readme_rows), "the two tables quote different cells"
    for label, *cost in quoted:
        assert_cost_as_recorded(paper_protocol_record(label), *cost)

    later = quoted_table(results_readme, "| row | seed | run time (h) | peak memory (MB) | finished (UTC) | commit |")
    assert later and all(seed in ("1", "2") for _, seed, *_ in later)
    for label, seed, *cost in later:
        assert_cost_as_recorded(paper_protocol_record(label, int(seed)), *cost)


def test_the_test_draws_quoted_are_the_committed_evaluations():
    """``results/listops_test_draws.csv`` (``python -m lra.evaluate --summary``): its table in ``results/README.md`` and
    the ranges the README and ``docs/protocols.md`` quote are its accuracies, and each evaluation is of the run whose
    record is committed (its recorded test accuracy)."""
    draws = pd.read_csv(REPO / "results" / "listops_test_draws.csv", dtype={"data_changes": str})
    draws["draw"] = draws["split"].where(draws["data_changes"].isna(), draws["data_changes"].str.extract(r"seed=(\d)")[0])
    table = draws.pivot(index="row", columns="draw", values="accuracy") * 100
    fresh = table[[str(seed) for seed in range(1, 6)]]
    results_readme = (REPO / "results" / "README.md").read_text()
    quoted = quoted_table(results_readme, "| row | the runs' test split | validation split | draw 1 |")
    *quoted, (rule_label, *rule_numbers, no_paper) = quoted
    assert len(quoted) == len(table) == 5 and rule_label == "the outermost-operator rule" and no_paper == "–"
    rule = draws.pivot(index="row", columns="draw", values="operator_rule_accuracy") * 100
    assert (rule.nunique() == 1).all(), "one rule per split, whichever checkpoint was evaluated"
    rule_fresh = rule.iloc[0][[str(seed) for seed in range(1, 6)]]
    expected_rule = [rule.iloc[0]["test"], rule.iloc[0]["val"], *rule_fresh, rule_fresh.mean()]
    assert [float(number) for number in rule_numbers] == [round(value, 2) for value in expected_rule]
    for label, *numbers, paper_number in quoted:
        preset = preset_of(label)
        expected = [table.loc[preset, "test"], table.loc[preset, "val"], *fresh.loc[preset], fresh.loc[preset].mean()]
        assert [float(number) for number in numbers] == [round(value, 2) for value in expected], label
        assert float(paper_number) == paper.TABLE3.number(preset, "listops")
        run = paper_protocol_record(label, seed=1)
        assert set(draws[draws["row"] == preset]["run_test_acc"]) == {round(run["test_acc"], 6)}, label
    means = fresh.mean(axis=1)
    for text in ((REPO / "README.md").read_text(), (REPO / "docs" / "protocols.md").read_text()):
        text = " ".join(text.split())
        assert f"{means.min():.1f}-{means.max():.1f}%" in text
        assert f"{table['test'].min():.1f}-{table['test'].max():.1f}%" in text
    draw_means = table.mean()
    assert f"mean is {draw_means['test']:.2f}% on the runs' test split" in " ".join(results_readme.split())
    test_sets = ["test", *(str(seed) for seed in range(1, 6))]
    above = draw_means[test_sets] - rule.iloc[0][test_sets]
    for text in ((REPO / "README.md").read_text(), (REPO / "docs" / "protocols.md").read_text(), results_readme):
        assert f"{above.min():.2f}-{above.max():.2f} points above" in " ".join(text.split())
    for text in ((REPO / "README.md").read_text(), (REPO / "docs" / "protocols.md").read_text()):
        text = " ".join(text.split())
        on_the_test_split = f"{rule.iloc[0]['test']:.2f}%"
        assert f"{on_the_test_split} on the runs' test split" in text or f"{on_the_test_split} of their test" in text
        assert f"{rule_fresh.min():.2f}-{rule_fresh.max():.2f}%" in text and f"{rule_fresh.mean():.2f}% over the" in text


def test_the_answers_by_outermost_operator_quoted_are_the_committed_answers():
    """``results/listops_answers/`` (``python -m lra.evaluate --answers``): each file is a committed run's checkpoint
    answering the runs' test split (its labels and outermost operators those of the five learning rows' other files),
    and ``results/README.md``'s table of them is their shares."""
    results_readme = (REPO / "results" / "README.md").read_text()
    quoted = quoted_table(results_readme, "| checkpoint | test accuracy | MAX answered 9 | MIN answered 0 |")
    files = sorted((REPO / "results" / "listops_answers").glob("*.csv"))
    assert len(quoted) == len(files)
    first = pd.read_csv(files[0])
    for cell, *numbers in quoted:
        label, seed = cell.split(", seed ")
        answers = pd.read_csv(REPO / "results" / "listops_answers" / f"{preset_of(label)}__seed{seed}__test.csv")
        assert answers[["label", "outermost_operator"]].equals(first[["label", "outermost_operator"]]), cell
        assert (answers["correct"] == (answers["label"] == answers["answer"])).all(), cell
        run = paper_protocol_record(label, int(seed))
        assert abs(answers["correct"].mean() - run["test_acc"]) <= 0.0085 + 1e-9, cell  # YOSO's hashes, drawn anew
        under = {operator: answers[answers["outermost_operator"] == operator] for operator in ("MAX", "MIN", "MED", "SM")}
        expected = [100 * answers["correct"].mean()]
        expected += [100 * (under[top]["answer"] == answer).mean() for top, answer in (("MAX", 9), ("MIN", 0), ("MED", 4))]
        expected += [100 * under[operator]["correct"].mean() for operator in ("MAX", "MIN", "MED", "SM")]
        assert [float(number) for number in numbers] == [round(value, 2) for value in expected], cell
    counts = first["outermost_operator"].value_counts()
    assert f"{counts['MAX']} MAX, {counts['MIN']} MIN, {counts['MED']} MED and {counts['SM']} SM sequences" in results_readme


@pytest.mark.slow
def test_table_from_real_runs(tmp_path, run_train):
    run_train("attention=softmax,none", flags=["-m"])
    env = {**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.run(
        [sys.executable, "-m", "lra.table"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    text = (tmp_path / "outputs" / "comparison.md").read_text()
    assert "## smoke" in text and "| softmax |" in text and "| none |" in text
    assert not (tmp_path / "results").exists()
    process = subprocess.run(
        [sys.executable, "-m", "lra.table", "--collect"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    assert len(list((tmp_path / "results" / "runs").glob("listops__*__smoke__seed0__*.json"))) == 2
    assert "| softmax |" in (tmp_path / "results" / "comparison.md").read_text()


def test_from_scratch_pretrained_and_rotary_runs_are_separate_labelled_sections():
    mlm = {"objective": "mlm", "mask_rate": 0.15, "protocol": SMOKE}
    longer = {**mlm, "protocol": {**SMOKE, "max_steps": 800}}
    records = [
        record("softmax", "listops", 0, 0.30),  # written before pretrain and positions existed
        record("softmax", "listops", 1, 0.32, pretrain={"objective": "none"}, model={**MODEL, "positions": "learned"}),
        record("softmax", "listops", 0, 0.40, pretrain=mlm),
        record("softmax", "listops", 1, 0.42, pretrain=mlm),
        record("softmax", "listops", 0, 0.50, pretrain=longer),
        record("softmax", "listops", 0, 0.60, pretrain=mlm, model={**MODEL, "positions": "rotary"}),
    ]
    sections = {s.title: s for s in sections_of(records)}
    scratch = sections["smoke, model.positions=learned, pretrain=none (from scratch)"]
    assert scratch.cell("softmax", "listops")["seeds"] == [0, 1]  # the old record is a from-scratch, learned run
    pretrained = sections["smoke, model.positions=learned, pretrain=mlm (mask_rate=0.15, protocol as fine-tuning)"]
    assert pretrained.cell("softmax", "listops")["accuracies"] == pytest.approx([40.0, 42.0])
    assert sections["smoke, model.positions=learned, pretrain=mlm (mask_rate=0.15, max_steps=800)"]
    rotary = sections["smoke, model.positions=rotary, pretrain=mlm (mask_rate=0.15, protocol as fine-tuning)"]
    assert rotary.cell("softmax", "listops")["accuracies"] == pytest.approx([60.0])
    assert len(sections) == 4


def test_pretraining_runs_are_not_cells(tmp_path):
    write_runs(tmp_path, [record("softmax", "listops", 0, 0.3), record("softmax", "listops", 0, 0.9, stage="pretraining")])
    assert [r.test_acc for r in table.find_records([tmp_path])] == [0.3]


def test_json_that_is_not_a_runs_record_is_no_run_and_only_finished_runs_are_collected(tmp_path):
    """A folder of records may hold other JSON (a list, a sweep's summary): not a run. The record of a run that failed
    before it had a configuration is one, failed (the table lists it, never as a cell). --collect copies finished runs
    only; a failed one never becomes a committed cell."""
    write_runs(tmp_path, [record("softmax", "listops", 0, 0.3), record("softmax", "listops", 1, 0.0, status="failed")])
    (tmp_path / "summary.json").write_text(json.dumps({"cells": 2}))
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    early = tmp_path / "early"
    early.mkdir()
    (early / "results.json").write_text(json.dumps({"task": "listops", "status": "failed", "error": "bad override"}))
    records = table.find_records([tmp_path])
    assert sorted((r.seed, r.status, r.config_hash is None) for r in records if r.seed is not None) == [
        (0, "finished", False),
        (1, "failed", False),
    ]
    assert [(r.status, r.error) for r in records if r.seed is None] == [("failed", "bad override")]
    runs_dir = tmp_path / "runs"
    assert table.collect(table.find_record_files([tmp_path]), runs_dir) == 1
    assert [json.loads(p.read_text())["seed"] for p in runs_dir.iterdir()] == [0]
    assert table.collect(table.find_record_files([tmp_path]), runs_dir) == 0, "collected again: nothing new"


def test_one_protocols_table_under_its_own_name(tmp_path):
    write_runs(
        tmp_path / "outputs",
        [record("softmax", "listops", 0, 0.3), record("yoso_32", "listops", 0, 0.4, protocol={**SMOKE, "name": "spt_short"})],
    )
    table.main(
        [
            "--runs",
            str(tmp_path / "outputs"),
            "--results",
            str(tmp_path / "results"),
            "--out",
            str(tmp_path / "out"),
            "--protocol",
            "spt_short",
            "--name",
            "spt",
        ]
    )
    text = (tmp_path / "out" / "spt.md").read_text()
    assert "## spt_short" in text and "yoso-32" in text.lower() and "smoke" not in text
    assert not (tmp_path / "out" / "table3.md").exists()


def test_the_comparison_table_has_every_attention_with_runs_the_papers_rows_first_and_a_dash_for_no_number():
    """Issue 36: a new attention's runs are a row, beside the paper's rows and the LRA leaderboard's, never left out."""
    records = [
        record(row, "listops", 0, acc)
        for row, acc in [("cosine", 0.30), ("bigbird", 0.33), ("yoso_32", 0.34), ("local", 0.16), ("softmax", 0.35)]
    ]
    records.append(record("cosine", "listops", 1, None, status="failed"))
    result = table.build(records, rows=table.ALL_ROWS)
    (section,) = result.sections
    assert section.rows == ["softmax", "yoso_32", "bigbird", "cosine", "local"], "Table 3's order, then the others by name"
    assert result.left_out["row"].tolist() == ["cosine"] and "failed" in result.left_out["why"].iloc[0], "only the failure"
    text = table.markdown(result, "test records")
    assert text.startswith("# Comparison: LRA test accuracy (%) of each attention, beside the YOSO paper's Table 3")
    assert "| cosine | 30.00 ± 1.45† | – | – | – |" in text and "| yoso-32 | 34.00 ± 1.50† | 37.25 |" in text
    assert "not a row of the paper" not in text
    # Agreement only over the rows with the paper's number (softmax, yoso_32): too few for Spearman's rho.
    assert section.agreement.loc["listops", "rows"] == 2
    assert "needs ≥ 3 rows with the paper's number (2 here)" in text
    frame = table.cells_frame(result)
    assert frame["row"].tolist() == section.rows and frame.set_index("row")["paper"].isna().tolist() == [False] * 2 + [True] * 3
    assert "cosine" in table.latex(result) and "Not in the table (failed runs):" in table.latex(result)
    # --rows picks and orders; the published table is the paper's rows only, the others named once at the end.
    picked = table.build(records, rows=("cosine", "softmax"))
    assert picked.sections[0].rows == ["cosine", "softmax"] and picked.left_out["row"].tolist() == ["cosine"]
    published = table.build(records)
    assert published.sections[0].rows == ["softmax", "yoso_32"]
    assert "the comparison table (python -m lra.table) has every row" in table.markdown(published, "test records")


def test_lra_table_without_paper_writes_the_comparison_and_rows_picks_them(tmp_path, capsys):
    outputs, results = tmp_path / "outputs", tmp_path / "results"
    write_runs(outputs, [record("cosine", "listops", s, 0.3 + s / 100) for s in range(2)] + [record("none", "listops", 0, 0.17)])
    args = ["--runs", str(outputs), "--results", str(results), "--out", str(outputs)]
    table.main(args)
    assert {p.name for p in outputs.glob("comparison*")} == {
        f"comparison{suffix}" for suffix in (".md", ".csv", "_agreement.csv", ".tex", ".png")
    }
    assert not results.exists(), "a plain lra.table never writes into results/"
    text = (outputs / "comparison.md").read_text()
    assert text.index("| none |") < text.index("| cosine | **30.50 ± 1.54**† | – |")
    table.main([*args, "--rows", "cosine,linformer", "--name", "mine"])  # a registered row without runs: a note
    assert "note: no finished runs of linformer; rows with finished runs: cosine, none" in capsys.readouterr().out
    assert "| none |" not in (outputs / "mine.md").read_text() and "| cosine |" in (outputs / "mine.md").read_text()
    # A name that is no row at all (a typo) is an error, and nothing is written (the earlier tables stay as they were).
    before = {path: path.read_bytes() for path in outputs.glob("*") if path.is_file()}
    with pytest.raises(SystemExit, match=r"--rows names no attention, preset or recorded row: cosin \(did you mean cosine\?\)"):
        table.main([*args, "--rows", "cosin", "--name", "mine"])
    assert {path: path.read_bytes() for path in outputs.glob("*") if path.is_file()} == before
    table.main([*args, "--paper", "lra_table1", "--rows", "all"])
    assert "beside the Long Range Arena paper's Table 1" in (outputs / "comparison_lra_table1.md").read_text()


def test_speed_and_memory_columns_from_the_records():
    records = [
        record("softmax", "listops", seed, 0.3, steps_per_second=sps, peak_memory_mb=mb, device="cpu (2 cores)")
        for seed, sps, mb in [(0, 2.0, 700.0), (1, 3.0, 900.0)]
    ]
    records.append(record("none", "listops", 0, 0.17))  # recorded neither
    result = table.build(records, rows=table.ALL_ROWS, speed=True)
    text = table.markdown(result, "test records")
    assert "| model | ListOps | paper‡ | steps/s | MB | Text |" in text
    assert "| softmax | **30.00 ± 1.45**† | 37.10 | 2.50 | 800 |" in text and "| none | 17.00 ± 1.19† | 19.20 | – | – |" in text
    assert "Trained on cpu (2 cores); not recorded, in float32." in text
    assert "compare them only between runs of one machine" in text
    frame = table.cells_frame(result).set_index("row")
    assert frame.loc["softmax", ["steps_per_s", "peak_memory_mb"]].tolist() == [2.5, 800.0]
    assert "steps/s" not in table.markdown(table.build(records, rows=table.ALL_ROWS), "test records"), "optional"


def test_speed_marks_a_rate_timed_under_load():
    """--speed put a run trained beside another job (0.67 steps/s) next to one trained alone (13 steps/s) with nothing
    said about the machine's load. A run's own threads are not load: two threads on two CPUs, alone, are unmarked."""
    alone = {"cpus": 2, "threads": 2, "load_at_start": 1.9, "load_at_end": 2.6}  # 0.3 per CPU beyond its own threads
    beside = {"cpus": 2, "threads": 2, "load_at_start": 2.1, "load_at_end": 4.4}  # 1.2 per CPU: another job's threads
    records = [
        record("softmax", "listops", 0, 0.3, steps_per_second=13.0, machine_load=alone, device="cpu (2 cores)"),
        record("none", "listops", 0, 0.17, steps_per_second=0.67, machine_load=beside, device="cpu (2 cores)"),
        record("yoso_32", "listops", 0, 0.3, steps_per_second=5.0, device="cpu (2 cores)"),  # recorded before the load was
    ]
    text = table.markdown(table.build(records, rows=table.ALL_ROWS, speed=True), "test records")
    assert "| softmax | 30.00 ± 1.45† | 37.10 | 13.00 |" in text and "| none | 17.00 ± 1.19† | 19.20 | 0.67§ |" in text
    assert "| yoso-32 | 30.00 ± 1.45† | 37.25 | 5.00 |" in text
    assert f"§: timed under load, other work keeping more than {table.LOADED:g} threads per CPU running" in text
    tex = table.latex(table.build(records, rows=table.ALL_ROWS, speed=True))
    assert "0.67\\S" in tex and "13.00\\S" not in tex


def test_speed_marks_a_rate_of_a_compiled_run(tmp_path):
    """trainer.compile=auto trains some rows compiled and others eager: their rates stand side by side only marked."""
    records = [
        record("none", "listops", 0, 0.17, steps_per_second=1.3, compiled=True, peak_memory_mb=500.0),
        record("yoso_32", "listops", 0, 0.3, steps_per_second=0.9, compiled=False, peak_memory_mb=800.0),
    ]
    result = table.build(records, rows=table.ALL_ROWS, speed=True)
    text = table.markdown(result, "test records")
    assert "| none | 17.00 ± 1.19† | 19.20 | 1.30ᶜ |" in text and "| yoso-32 | **30.00 ± 1.45**† | 37.25 | 0.90 |" in text
    assert "ᶜ: trained compiled (`trainer.compile`), the others eager" in text
    assert "1.30$^c$" in table.latex(result) and "0.90$^c$" not in table.latex(result)
    assert table.cells_frame(result).set_index("row")["compiled"].to_dict() == {"none": True, "yoso_32": False}
    assert [(p.row, p.compiled) for p in speed.points(result.sections[0])] == [("none", True), ("yoso_32", False)]


def test_a_lone_shortened_run_names_its_budget_and_sections_follow_the_numbers():
    """Issue 36: a title names every setting in which its runs depart from the protocol as declared, even where
    nothing else in the section differs; the values as asked, not the shortened run's fitted warmup and interval."""
    fitted = {**SMOKE, "max_steps": 20, "warmup_steps": 2, "val_check_interval": 20}
    adjusted = {"warmup_steps": {"from": 40, "to": 2, "why": "..."}, "val_check_interval": {"from": 50, "to": 20, "why": "..."}}
    lone = table.build([record("softmax", "listops", 0, 0.2, protocol=fitted, adjusted=adjusted)])
    assert [s.title for s in lone.sections] == ["smoke, protocol.max_steps=20"]
    assert [s.title for s in table.build([record("softmax", "listops", 0, 0.2)]).sections] == ["smoke"], "as declared"
    steps = [5, 60, 400, 10, 12, 30]
    shortened = table.build([record("softmax", "listops", 0, 0.2, protocol={**SMOKE, "max_steps": n}) for n in steps])
    assert [s.title for s in shortened.sections] == ["smoke"] + [
        f"smoke, protocol.max_steps={n}" for n in sorted(steps) if n != 400
    ]
    # A protocol that no experiment declares (named on the command line) has nothing to depart from.
    assert [
        s.title for s in table.build([record("softmax", "listops", 0, 0.2, protocol={**SMOKE, "name": "mine"})]).sections
    ] == ["mine"]


def test_one_sweep_of_two_tasks_is_one_section_and_a_users_shortened_runs_rename_no_committed_section(tmp_path):
    """Issue 71: the README's task=listops,pathfinder sweep, shortened on its command line, gave two sections (one task's
    experiment declares the value, the other's does not); and a committed section was renamed where a user's own runs
    of its protocol had other steps. One section per protocol as the user declared it, the user's runs first."""
    shortened = ["task.protocol.max_steps=200"]
    listops = {**table.declared_protocol("smoke", "listops"), "max_steps": 200}
    pathfinder = {**table.declared_protocol("smoke", "pathfinder"), "max_steps": 200}
    assert (
        table.declared_protocol("smoke", "pathfinder")["max_steps"]
        == 200
        != table.declared_protocol("smoke", "listops")["max_steps"]
    )
    sweep = [
        record("softmax", "listops", 0, 0.3, protocol=listops, overrides=shortened),
        record("softmax", "pathfinder", 0, 0.6, protocol=pathfinder, overrides=shortened),
    ]
    assert [s.title for s in table.build(sweep).sections] == ["smoke, protocol.max_steps=200"]

    committed = [record(row, "listops", seed, 0.3) for row in ("softmax", "none") for seed in (0, 1)]
    mine = record("softmax", "listops", 0, 0.25, protocol={**SMOKE, "max_steps": 100}, overrides=["task.protocol.max_steps=100"])
    result = table.build([*committed, mine], local={mine.config_hash})
    assert [s.title for s in result.sections] == ["smoke, protocol.max_steps=100", "smoke"], "the user's first, the other kept"


def test_precision_is_part_of_a_cells_identity_and_its_title():
    """Issue 37: a float32 and a bf16-mixed run of the same settings are two cells, never one configuration's latest."""
    bf16 = record("softmax", "listops", 0, 0.25, precision="bf16-mixed", finished_at="2026-02-01T00:00:00")
    float32 = record("softmax", "listops", 0, 0.30, precision="32-true")
    older = record("softmax", "listops", 1, 0.32)  # written before precision was recorded: float32, as runs were then
    result = table.build([float32, bf16, older])
    assert [s.title for s in result.sections] == ["smoke, precision=32-true", "smoke, precision=bf16-mixed"]
    assert only(result.sections, "smoke, precision=32-true").cell("softmax", "listops")["seeds"] == [0, 1]
    assert not any(s.duplicates for s in result.sections)
    assert [s.title for s in table.build([bf16]).sections] == ["smoke, precision=bf16-mixed"], "a lone bf16 run says so"
    assert [s.title for s in table.build([float32, older]).sections] == ["smoke"]


def test_one_protocol_in_two_precisions_is_compared_row_by_row_within_the_noise():
    """Issue 68: the paper's protocol in float32 on a CPU and in bf16 on a GPU are two sections, and the rows both have
    are a check across devices: agreement where the difference is within twice its standard error."""
    cpu, gpu = "AMD EPYC (2 cores)", "NVIDIA H200"

    protocol, model = table.paper_setup("listops")

    def run(row, seed, acc, precision, device):
        return record(row, "listops", seed, acc, protocol=protocol, model=model, precision=precision, device=device)

    def binomial(p):  # one seed's standard error: its test set's
        return 100 * np.sqrt(p * (1 - p) / 1000)

    records = [
        run("softmax", 0, 0.370, "32-true", cpu),
        run("none", 0, 0.190, "32-true", cpu),
        run("yoso_32", 0, 0.360, "32-true", cpu),  # no bf16 run of it: nothing to compare
        run("softmax", 0, 0.375, "bf16-mixed", gpu),
        run("softmax", 1, 0.372, "bf16-mixed", gpu),
        run("none", 0, 0.300, "bf16-mixed", gpu),
    ]
    result = table.build(records)
    assert [s.title for s in result.sections] == ["paper, precision=32-true", "paper, precision=bf16-mixed"]
    (pair,) = result.precision_pairs
    assert (pair.first.precision, pair.second.precision) == ("32-true", "bf16-mixed")
    cells = pair.cells.sort_index()
    assert list(cells.index) == [("none", "listops"), ("softmax", "listops")]
    none, softmax = cells.loc[("none", "listops")], cells.loc[("softmax", "listops")]
    assert none["difference"] == pytest.approx(11.0) and not none["agree"]
    assert none["difference_error"] == pytest.approx(np.hypot(binomial(0.19), binomial(0.30)))
    assert softmax["difference"] == pytest.approx(0.35) and softmax["agree"]
    assert softmax["devices_first"] == cpu and softmax["devices_second"] == gpu and softmax["num_seeds_second"] == 2
    text = table.markdown(result, "test records")
    assert "## `paper, precision=32-true` against `paper, precision=bf16-mixed`" in text
    assert "1 of 2 agree." in text
    assert (
        f"| none | ListOps | 19.00 ± {binomial(0.19):.2f} (1) | {cpu} | 30.00 ± {binomial(0.3):.2f} (1) | {gpu} | +11.00" in text
    )
    assert f"Trained on {cpu}, in float32." in text and f"Trained on {gpu}, in bf16-mixed." in text
    # Another protocol's sections, or one precision alone, are no pair.
    assert not table.build([*records[:3], record("softmax", "listops", 0, 0.3, precision="bf16-mixed")]).precision_pairs
    assert "against" not in table.markdown(table.build(records[:3]), "test records")


def test_one_model_on_two_devices_is_compared_sample_by_sample_where_its_runs_recorded_their_samples():
    """A bf16 run right on 15 fewer of the same 1000 test samples than the float32 run: -1.50 is within twice the two
    binomial errors combined (2 x 2.16) but not within twice the paired error (2 x 0.38); three samples changed each
    way are within it."""
    protocol, model = table.paper_setup("listops")

    def run(row, acc, precision, samples):
        hparams = {} if row == "none" else None
        return record(row, "listops", 0, acc, protocol=protocol, model=model, precision=precision, hparams=hparams,
                      test_correct=correct_on(samples))  # fmt: skip

    records = [
        run("softmax", 0.37, "32-true", range(370)),
        run("softmax", 0.355, "bf16-mixed", range(15, 370)),
        run("none", 0.19, "32-true", range(190)),
        run("none", 0.19, "bf16-mixed", [*range(3, 190), 500, 501, 502]),
    ]
    (pair,) = table.build(records).precision_pairs
    softmax, none = pair.cells.loc[("softmax", "listops")], pair.cells.loc[("none", "listops")]
    assert softmax["paired"] and softmax["difference"] == pytest.approx(-1.5)
    assert softmax["difference_error"] == pytest.approx(100 * np.sqrt(0.015 * 0.985 / 1000)) and not softmax["agree"]
    assert np.hypot(softmax["standard_error_first"], softmax["standard_error_second"]) > 1.5 / 2, "independent: agree"
    assert none["paired"] and none["difference_error"] == pytest.approx(100 * np.sqrt(0.006 / 1000)) and none["agree"]
    text = table.markdown(table.build(records), "test records")
    assert "| -1.50 ± 0.38 paired | no |" in text and "1 of 2 agree." in text


def curve_csv(path, points, test_acc):
    """A metrics.csv as Lightning's CSV logger writes it: training rows, an evaluation row per (step, accuracy), the
    test row at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["epoch,step,test/acc,train/loss,val/acc"]
    for step, accuracy in points:
        lines += [f"0,{step - 1},,2.0,", f"0,{step},,,{accuracy}"]
    lines.append(f"1,{points[-1][0]},{test_acc},,")
    path.write_text("\n".join(lines) + "\n")


def test_the_learning_curves_of_the_strongest_section_are_drawn_from_the_runs_metrics(tmp_path):
    """Issue 68: a committed run's curve is results/runs/curves/<its name>.csv, a local run's its metrics.csv; the
    table draws the first section with curves, a panel per row, each seed a line in its own shade of the row's colour."""
    results, outputs = tmp_path / "results", tmp_path / "outputs"
    committed = [paper_record("softmax", "listops", seed, 0.37) for seed in (0, 1)] + [paper_record("none", "listops", 0, 0.19)]
    (results / "runs").mkdir(parents=True)
    for run in committed:
        hashed(run)
        name = table.run_file_name(run)
        run.write(results / "runs" / name, committed=True)
        curve_csv(results / "runs" / "curves" / name.replace(".json", ".csv"), [(50, 0.17), (100, 0.30)], run.test_acc)
    local = hashed(record("softmax", "listops", 0, 0.30))  # a smoke run: another section, not the first
    write_runs(outputs, [local])
    curve_csv(outputs / "run0" / "metrics" / "metrics.csv", [(50, 0.2)], 0.3)

    found = table.find_record_files([outputs, results / "runs"])
    curves = table.find_curves(found)
    assert set(curves) == {run.config_hash for run in [*committed, local]}
    assert table.curves.validation_curve(curves[committed[0].config_hash]) == [(50, 17.0), (100, 30.0)]
    result = table.build([run for _, run in found])
    assert [(row, task, [seed for seed, _ in files]) for row, task, files in table.curves.panels(result.sections[0], curves)] == [
        ("none", "listops", [0]),
        ("softmax", "listops", [0, 1]),
    ]
    plotted = []
    original = plt.Axes.plot
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            plt.Axes, "plot", lambda ax, x, y, **kw: plotted.append((list(x), list(y), kw["color"])) or original(ax, x, y, **kw)
        )
        table.main(["--runs", str(outputs), "--results", str(results), "--out", str(outputs), "--paper", "table3"])
        assert plotted == [([50], [20.0], colour("softmax"))], "the user's own section comes first"
        plotted.clear()
        table.main(["--committed", "--results", str(results), "--paper", "table3"])
    assert [line[:2] for line in plotted] == [([50, 100], [17.0, 30.0])] * 3, "the first section's three runs, each once"
    assert [line[2] for line in plotted] == [colour("none", 0), colour("softmax", 0), colour("softmax", 1)]
    assert len({colour("softmax", seed) for seed in (0, 1, 2)} | {colour("yoso_32", seed) for seed in (0, 1, 2)}) == 6
    assert (outputs / "table3_curves.png").stat().st_size > 0 and (results / "table3_curves.png").stat().st_size > 0
    # The same curves as numbers: 17% then 30%, so at the split (28%) at step 100, and ended at their mean.
    numbers = pd.read_csv(results / "table3_curves.csv")
    assert numbers[["row", "seed", "test_acc", "evaluations", "last_step"]].values.tolist() == [
        ["none", 0, 19.0, 2, 100],
        ["softmax", 0, 37.0, 2, 100],
        ["softmax", 1, 37.0, 2, 100],
    ]
    ends = numbers[["best_val", "best_val_step", "val_last", "first_step_at_split"]]
    assert ends.values.tolist() == [[30.0, 100, 23.5, 100]] * 3
    # Without any curve, no figure of them.
    (results / "runs" / "curves").rename(tmp_path / "elsewhere")
    table.main(["--committed", "--results", str(results), "--paper", "table3"])
    assert not (results / "table3_curves.png").exists() and (results / "table3.png").exists()
    assert not (results / "table3_curves.csv").exists()


def test_the_curves_numbers_say_when_a_run_reached_the_split_and_where_it_ended(tmp_path):
    """``<name>_curves.csv``: a run that stays under the split has no step at it; the best evaluation's step is the
    first that reached it; the end is the mean of the last ten evaluations."""
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    late, never = paper_record("yoso_32", "listops", 0, 0.35), paper_record("none", "listops", 0, 0.17)
    plateau = [(50 * i, 0.17) for i in range(1, 11)] + [(550, 0.36), (600, 0.36)] + [(650 + 50 * i, 0.35) for i in range(9)]
    for run, points in ((late, plateau), (never, [(50, 0.16), (100, 0.19), (150, 0.18)])):
        hashed(run)
        name = table.run_file_name(run)
        run.write(results / "runs" / name, committed=True)
        curve_csv(results / "runs" / "curves" / name.replace(".json", ".csv"), points, run.test_acc)
    table.main(["--committed", "--results", str(results), "--paper", "table3"])
    numbers = pd.read_csv(results / "table3_curves.csv").set_index("row")
    learned = numbers.loc["yoso-32", ["evaluations", "last_step", "best_val", "best_val_step", "first_step_at_split"]]
    assert learned.tolist() == [21, 1050, 36.0, 550, 550]
    assert numbers.loc["yoso-32", "val_last"] == pytest.approx((0.36 + 9 * 0.35) * 10)
    assert numbers.loc["none", ["best_val", "best_val_step", "val_last"]].tolist() == pytest.approx([19.0, 100, 17.67], abs=0.005)
    assert pd.isna(numbers.loc["none", "first_step_at_split"])


def test_a_curve_of_a_resumed_run_counts_each_evaluation_once(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,val/acc\n0,50,0.2\n0,100,0.25\n0,100,0.26\n0,150,0.3\n")
    assert table.curves.validation_curve(path) == [(50, 20.0), (100, 26.0), (150, 30.0)]


def test_the_listops_split_puts_a_mean_of_exactly_28_on_the_learning_side():
    """A mean at exactly LISTOPS_SPLIT is on the side of the rows at 34-37% (issue 41: the old test's cell at
    ``100 * 0.28`` is 28.000000000000004, so ``>=`` and ``>`` gave the same table)."""
    index = pd.MultiIndex.from_tuples([("a", "listops"), ("b", "listops"), ("c", "listops")], names=["label", "task"])
    cells = pd.DataFrame({"mean": [28.0, np.nextafter(28.0, 0), 28.0], "paper": [37.1, 37.1, 19.2]}, index=index)
    assert table.LISTOPS_SPLIT == 28.0 and cells["mean"].iloc[0] == 28.0
    assert table.on_papers_side(cells).tolist() == [True, False, False]


def refused(override, error):
    """The record lra.train writes of a run refused for a bad value: its configuration was never resolved."""
    return RunRecord.from_dict(
        {
            "task": "listops",
            "attention": "softmax",
            "row": "softmax",
            "seed": 0,
            "overrides": ["task.protocol.max_steps=6", override],
            "status": "failed",
            "error": error,
        }
    )


def not_in_the_table(result):
    return [line for line in table.markdown(result, "test records").split("## Not in the table")[1].splitlines() if line]


def test_runs_refused_for_a_bad_value_and_failures_are_listed_with_their_overrides(tmp_path):
    """The failed runs left out runs refused for a bad value (their record has no configuration: they were skipped as
    not a run's) and named a failure without its overrides, so two failures of one row looked alike."""
    write_runs(
        tmp_path,
        [
            refused("task.protocol.batch_size=0", "ValueError: task.protocol.batch_size must be at least 1, got 0"),
            refused("task.protocol.lr=-1", "ValueError: need warmup_steps >= 0, lr > 0 and weight_decay >= 0"),
            record("softmax", "listops", 1, None, status="failed", overrides=["seed=1", "trainer.devices=3"]),
            record("softmax", "listops", 0, 0.3),
        ],
    )
    result = table.build(table.find_records([tmp_path]))
    assert [cell["row"] for cell in table.cells_frame(result).to_dict("records")] == ["softmax"], "only the finished run"
    lines = not_in_the_table(result)
    assert lines[1:] == [
        "- listops / softmax / seed 0, no configuration resolved, overrides: task.protocol.max_steps=6 "
        "task.protocol.batch_size=0: failed: ValueError: task.protocol.batch_size must be at least 1, got 0",
        "- listops / softmax / seed 0, no configuration resolved, overrides: task.protocol.max_steps=6 "
        "task.protocol.lr=-1: failed: ValueError: need warmup_steps >= 0, lr > 0 and weight_decay >= 0",
        f"- listops / softmax / seed 1, protocol smoke, config {result.left_out['config_hash'].iloc[2][:8]}, overrides: "
        "seed=1 trainer.devices=3: failed: RuntimeError: out of memory",
    ], lines


def test_a_killed_run_is_abandoned_beside_a_live_one_that_is_running(tmp_path):
    """A run killed with SIGKILL leaves its record saying "running": the table listed it as running beside a live
    one. Its folder's lock, which dies with its process, tells them apart."""
    write_runs(tmp_path, [record("softmax", "listops", seed, None, status="running") for seed in (0, 1)])
    (tmp_path / "run1" / run_lock.LOCK_FILE).write_text("pid 1234 on a-host since 2026-01-01T00:00:00+00:00\n")  # its holder died
    with run_lock.held(tmp_path / "run0"):
        lines = not_in_the_table(table.build(table.find_records([tmp_path])))
    assert lines[1].startswith("- listops / softmax / seed 0, protocol smoke, config ")
    assert f": running: in progress (pid {os.getpid()} on {socket.gethostname()} since " in lines[1], lines
    assert lines[2].startswith("- listops / softmax / seed 1, protocol smoke, config ")
    assert ": abandoned: its process ended without recording how (killed: SIGKILL" in lines[2], lines


@pytest.mark.slow
def test_runs_refused_for_a_bad_value_leave_nothing_and_a_killed_run_is_in_the_failed_runs(tmp_path, run_train):
    """As a user meets them: two runs refused for a bad value (one line each, before Hydra makes a folder: nothing to
    list) and one killed with SIGKILL, then python -m lra.table."""
    for override, message in (
        ("task.protocol.batch_size=0", "error: task.protocol.batch_size must be at least 1, got 0"),
        ("task.protocol.lr=-1", "error: task.protocol.lr must be positive, got -1.0"),
    ):
        refused = run_train(override, check=False)
        assert refused.returncode == 1 and refused.stderr.strip() == message, refused.stderr[-2000:]
        assert not (tmp_path / "outputs").exists(), "no folder, no record"
    killed = run_train(kill_at_step.OVERRIDE, check=False, env=kill_at_step.environment(kill_at_step=3))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    env = {**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.run(
        [sys.executable, "-m", "lra.table"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    failed = (tmp_path / "outputs" / "comparison.md").read_text().split("## Not in the table")[1]
    assert "task.protocol.batch_size=0" not in failed and "task.protocol.lr=-1" not in failed
    assert f"{kill_at_step.OVERRIDE}: abandoned: its process ended without recording how" in failed, failed


def test_the_lra_papers_figure_3_accuracy_against_speed_with_memory_from_the_records(tmp_path):
    """Issue 71: the figure users know from the LRA paper, test accuracy against training speed with peak memory as
    the marker's size, from the records' own speed and memory, beside comparison.png."""
    runs = tmp_path / "outputs"
    write_runs(
        runs,
        [
            record("softmax", "listops", 0, 0.36, steps_per_second=2.0, peak_memory_mb=800),
            record("softmax", "listops", 1, 0.34, steps_per_second=4.0, peak_memory_mb=600),
            record("none", "listops", 0, 0.18, steps_per_second=9.0, peak_memory_mb=100),
            record("yoso_32", "listops", 0, 0.33),  # no speed or memory recorded: no point
        ],
    )
    drawn = []
    original = plt.Axes.scatter
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt.Axes, "scatter", lambda ax, x, y, s, **kw: drawn.append((x, y, s)) or original(ax, x, y, s=s, **kw))
        table.main(["--runs", str(runs), "--results", str(tmp_path / "results"), "--out", str(runs)])
    assert drawn == [(9.0, pytest.approx(18.0), 40 + 1200 * 100 / 700), (3.0, pytest.approx(35.0), 40 + 1200 * 700 / 700)]
    assert (runs / "comparison_speed.png").stat().st_size > 0
    for path in runs.glob("run*/results.json"):  # the same runs without their speed: no figure, an earlier one removed
        values = json.loads(path.read_text())
        path.write_text(json.dumps({key: value for key, value in values.items() if key != "steps_per_second"}))
    table.main(["--runs", str(runs), "--results", str(tmp_path / "results"), "--out", str(runs)])
    assert not (runs / "comparison_speed.png").exists()
