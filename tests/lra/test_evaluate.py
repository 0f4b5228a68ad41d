"""``python -m lra.evaluate``: a run's checkpoint tested again, its answers counted against the labels."""

import collections
import csv
import json
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tiny_listops import TINY, operator_rule_from_text, outermost_operators_and_labels

from lra import checkpoints, config, evaluate
from lra.data.tasks import load_task
from lra.results import PRETRAINING, RunRecord


@pytest.fixture
def finished_run(tmp_path, run_train, monkeypatch):
    """A finished tiny ListOps run's folder and record, with the data where the run found it."""
    run_train()
    (path,) = (tmp_path / "outputs").rglob("results.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    return path.parent, json.loads(path.read_text())


def split_labels(split, *overrides):
    cfg = config.compose([*TINY, *overrides])
    task_data = load_task("listops", cfg.task.seq_len, OmegaConf.to_container(cfg.task.data, resolve=True))
    return task_data.splits[split].split.labels.tolist()


def answers_file(path):
    with open(path) as file:
        return list(csv.DictReader(file))


def test_the_best_checkpoint_answers_the_test_set_as_the_run_recorded(finished_run, tmp_path, capsys):
    """Its accuracy, and which test samples it answered correctly, are the run's own test's; the labels are the test
    split's, in its order; the answer counts add up to the split."""
    folder, record = finished_run
    evaluate.main([str(folder), "--answers", str(tmp_path / "answers.csv")])
    printed = capsys.readouterr().out
    rows = answers_file(tmp_path / "answers.csv")
    assert "".join(row["correct"] for row in rows) == record["test_correct"]
    assert [int(row["label"]) for row in rows] == split_labels("test")
    assert all(int(row["correct"]) == (row["label"] == row["answer"]) for row in rows)
    accuracy = f"{100 * record['test_acc']:.2f}%"
    assert f"accuracy {accuracy} ± " in printed and f"the run tested it at {accuracy}" in printed
    answered = dict(part.split(": ") for part in printed.split("its answers: ")[1].splitlines()[0].split("  "))
    assert sum(int(count.split()[0]) for count in answered.values()) == len(rows) == 24


def test_any_split_and_the_last_checkpoint(finished_run, tmp_path, capsys):
    """The validation split read whole and in order (training reads it shuffled, in part), from last.ckpt."""
    folder, _ = finished_run
    evaluate.main([str(folder), "--checkpoint", "last", "--split", "val", "--answers", str(tmp_path / "val.csv")])
    printed = capsys.readouterr().out
    assert "last.ckpt (step 6) on the val split, 32 samples" in printed
    assert "the run tested it" not in printed, "the run's test accuracy is not this checkpoint's on this split"
    labels = split_labels("val")
    assert [int(row["label"]) for row in answers_file(tmp_path / "val.csv")] == labels
    share = 100 * np.bincount(labels).max() / len(labels)
    assert f"scores {share:.2f}%" in printed


def test_a_changed_or_foreign_checkpoint_is_refused(finished_run, tmp_path, capsys):
    folder, record = finished_run
    best = folder / "checkpoints" / (record["best_checkpoint"].rsplit("/", 1)[-1])
    foreign = checkpoints.read(best)
    foreign["callbacks"][checkpoints.IDENTITY]["seed"] = 99  # another seed's run wrote it
    checkpoints.write(tmp_path / "other.ckpt", foreign)
    with pytest.raises(SystemExit, match=r"another configuration or seed .*seed 99"):
        evaluate.main([str(folder), "--checkpoint", str(tmp_path / "other.ckpt")])

    best.write_bytes(best.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match="is not the checkpoint that was written there"):
        evaluate.main([str(folder)])


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"has no results.json: give the output folder of a run of python -m lra.train"):
        evaluate.main([str(tmp_path)])
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(SystemExit, match="cannot be read .* it is damaged"):
        evaluate.main([str(tmp_path)])
    (tmp_path / "results.json").write_text(json.dumps({"record_version": 2, "task": "listops", "stage": PRETRAINING}))
    with pytest.raises(SystemExit, match="is a pretraining run .* evaluate the run fine-tuned from it"):
        evaluate.main([str(tmp_path)])


def test_a_run_not_finished_is_evaluated_at_its_latest_best_checkpoint(finished_run, capsys):
    """A record written before the test (a run under way or interrupted) names no best checkpoint: the latest
    best-step*.ckpt in the folder is the one its test would take."""
    folder, record = finished_run
    unfinished = {key: value for key, value in record.items() if key not in ("best_checkpoint", "test_acc", "test_correct")}
    (folder / "results.json").write_text(json.dumps({**unfinished, "status": "interrupted"}))
    best = folder / "checkpoints" / record["best_checkpoint"].rsplit("/", 1)[-1]
    evaluate.main([str(folder)])
    printed = capsys.readouterr().out
    assert f"{best.name} (step {record['best_val_step']}) on the test split" in printed
    assert "the run tested it" not in printed


def test_a_mixed_precision_run_is_evaluated_under_its_autocast(tmp_path, run_train, monkeypatch, capsys):
    """A bf16-mixed run's checkpoint is tested under the autocast its run tested under (Lightning's precision plugin),
    so its answers are the run's own; a float32 run's under none."""
    run_train("trainer.precision=bf16-mixed")
    (path,) = (tmp_path / "outputs").rglob("results.json")
    record = json.loads(path.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    evaluate.main([str(path.parent), "--answers", str(tmp_path / "answers.csv")])
    assert "bf16-mixed on cpu" in capsys.readouterr().out
    assert "".join(row["correct"] for row in answers_file(tmp_path / "answers.csv")) == record["test_correct"]

    cpu = torch.device("cpu")
    with evaluate.precision_of(RunRecord(precision="bf16-mixed"), cpu).forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with evaluate.precision_of(RunRecord(precision="32-true"), cpu).forward_context():
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(evaluate.CannotEvaluate, match="trained in 64-true"):
        evaluate.precision_of(RunRecord(precision="64-true"), cpu)


def test_the_model_answers_in_evaluation_mode(finished_run):
    """Dropout off: every layer of the network runs with ``training`` False, whatever mode the module was handed in."""
    folder, _ = finished_run
    record, cfg = evaluate.run_folder(folder)
    module, _ = evaluate.load_model(evaluate.checkpoint_path(folder, record, "best"), record)
    module.train()
    modes = []
    for layer in module.modules():
        layer.register_forward_pre_hook(lambda layer, _: modes.append(layer.training))
    cpu = torch.device("cpu")
    evaluate.evaluate(module, evaluate.data_of(cfg, 8, []), "test", cpu, evaluate.precision_of(record, cpu))
    assert modes and not any(modes)
    assert any(isinstance(layer, torch.nn.Dropout) and layer.p > 0 for layer in module.modules()), "a network with dropout"


def test_a_generated_split_drawn_anew(finished_run, tmp_path, capsys):
    """``--data generator.seed=5``: the test split the generator draws with another seed, which the run never saw, its
    labels in its order; the report says the data is not the run's and does not set the run's test beside it."""
    folder, _ = finished_run
    evaluate.main([str(folder), "--data", "generator.seed=5", "--answers", str(tmp_path / "fresh.csv")])
    printed = capsys.readouterr().out
    fresh = [int(row["label"]) for row in answers_file(tmp_path / "fresh.csv")]
    assert fresh == split_labels("test", "task.data.generator.seed=5") != split_labels("test")
    assert "the run's changed by generator.seed=5: not what the run trained and tested on" in printed
    assert "the run tested it" not in printed
    evaluate.main([str(folder)])
    assert "data: the run's generated data" in capsys.readouterr().out


def test_a_data_change_that_is_not_one_is_refused(finished_run, tmp_path):
    """A key the run's task.data lacks, a change without a value, and the generator's settings where the data read is
    the official files' (which they would not change) are refused, each in a message naming the fix."""
    folder, _ = finished_run
    with pytest.raises(
        SystemExit, match=r"--data: the run's task.data has no generator.sed \(generator keys: num_train, num_val, "
    ):
        evaluate.main([str(folder), "--data", "generator.sed=5"])
    with pytest.raises(SystemExit, match=r"--data generator.seed: give KEY=VALUE"):
        evaluate.main([str(folder), "--data", "generator.seed"])
    with pytest.raises(SystemExit, match=r"--data source=release: unknown task.data.source 'release' for listops"):
        evaluate.main([str(folder), "--data", "source=release"])
    official = tmp_path / "official"
    shutil.copytree(next((tmp_path / "data" / "generated").iterdir()), official)  # the release's file names and format
    with pytest.raises(SystemExit, match=r"the data read is lra_release's, .* add source=generated"):
        evaluate.main([str(folder), "--data", "source=official", f"source_dir={official}", "generator.seed=5"])


def test_listops_answers_are_counted_by_the_outermost_operator_beside_its_rule(finished_run, tmp_path, capsys):
    """On ListOps the report gives what answering each sequence with its outermost operator's most common training
    label scores (also in the summary), and the model's answers under each operator, both as the files' text says; a
    fresh draw is answered by the rule of the run's own training split, not the draw's."""
    folder, _ = finished_run
    evaluate.main([str(folder), "--answers", str(tmp_path / "a.csv"), "--summary", str(tmp_path / "s.csv")])
    printed = capsys.readouterr().out
    (data,) = (path for path in (tmp_path / "data" / "generated").iterdir() if path.is_dir())  # beside it: its lock
    answers, otherwise = operator_rule_from_text(data)
    test = outermost_operators_and_labels(data, "test")
    rule = sum(answers.get(top, otherwise) == label for top, label in test) / len(test)
    assert f"outermost operator ({', '.join(f'{top} {label}' for top, label in answers.items())}" in printed
    assert f") scores {100 * rule:.2f}%\nits answers by the outermost operator:\n" in printed
    written = answers_file(tmp_path / "a.csv")
    assert [row["outermost_operator"] for row in written] == [top for top, _ in test]
    model = [int(row["answer"]) for row in written]
    for name in sorted({top for top, _ in test}):
        under = [(answer, label) for answer, (top, label) in zip(model, test) if top == name]
        right = 100 * sum(answer == label for answer, label in under) / len(under)
        top_answer, n = collections.Counter(answer for answer, _ in under).most_common(1)[0]
        assert f"  {name:<4}{len(under)} sequences, {right:.2f}% right: {top_answer}: {n} (" in printed, name
    (row,) = answers_file(tmp_path / "s.csv")
    assert float(row["operator_rule_accuracy"]) == pytest.approx(rule, abs=5e-7)

    evaluate.main([str(folder), "--data", "generator.seed=5", "generator.num_train=1"])
    (fresh,) = (path for path in (tmp_path / "data" / "generated").iterdir() if path.is_dir() and path != data)
    drawn = outermost_operators_and_labels(fresh, "test")
    rule = sum(answers.get(top, otherwise) == label for top, label in drawn) / len(drawn)
    assert f") scores {100 * rule:.2f}%\n" in capsys.readouterr().out


def test_a_summary_file_of_other_columns_is_refused_before_evaluating(finished_run, tmp_path):
    folder, _ = finished_run
    old = tmp_path / "old.csv"
    old.write_text("task,row,seed,accuracy\nlistops,none,0,0.17\n")
    with pytest.raises(SystemExit, match=r"--summary .*old.csv: its columns are task, row, seed, accuracy, not this"):
        evaluate.main([str(folder), "--summary", str(old)])
    assert old.read_text() == "task,row,seed,accuracy\nlistops,none,0,0.17\n"


def test_a_data_change_leaves_the_run_config_as_it_was(finished_run):
    """The changes make a new ``task.data``; the run's config, as read from its folder, keeps its values and still
    takes new keys."""
    _, cfg = evaluate.run_folder(finished_run[0])
    before = OmegaConf.to_container(cfg.task, resolve=True)
    changed = evaluate.task_data(cfg, ["generator.seed=5"])
    assert changed["generator"]["seed"] == 5 != before["data"]["generator"]["seed"]
    assert OmegaConf.to_container(cfg.task, resolve=True) == before
    cfg.task.data.added_by_the_caller = 1  # struct mode was the merge's, not left on the caller's config


def test_a_sampling_attention_answers_alike_under_one_seed_and_each_evaluation_appends_its_row(
    tmp_path, run_train, monkeypatch, capsys
):
    """YOSO-32 draws its hashes as it answers: under one --seed two evaluations give the same answers (the run's
    test drew its own, so its accuracy is not repeated to the sample). --summary appends a row per evaluation, its
    header once, its accuracy the answers'."""
    run_train("attention=yoso_32")
    (path,) = (tmp_path / "outputs").rglob("results.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    summary = tmp_path / "summary.csv"
    many = ["--data", "generator.num_test=400"]  # answers enough that hashes drawn anew would change some
    for name, options in [("first", many), ("again", many), ("val", ["--split", "val", "--data", "generator.seed=5"])]:
        evaluate.main(
            [str(path.parent), "--seed", "3", "--answers", str(tmp_path / f"{name}.csv"), "--summary", str(summary), *options]
        )
    assert answers_file(tmp_path / "first.csv") == answers_file(tmp_path / "again.csv")
    rows = answers_file(summary)
    assert [(row["split"], row["data_changes"], row["evaluation_seed"], row["row"]) for row in rows] == [
        ("test", "generator.num_test=400", "3", "yoso_32"),
        ("test", "generator.num_test=400", "3", "yoso_32"),
        ("val", "generator.seed=5", "3", "yoso_32"),
    ]
    for row, name in zip(rows, ["first", "again", "val"]):
        answers = answers_file(tmp_path / f"{name}.csv")
        assert float(row["accuracy"]) == pytest.approx(np.mean([int(a["correct"]) for a in answers]), abs=1e-6)
        assert int(row["samples"]) == len(answers) and row["run_test_acc"] == f"{json.loads(path.read_text())['test_acc']:.6f}"
    assert "its row appended to" in capsys.readouterr().out
