"""``python -m lra.bench step``: the full training step per task and attention, its rows, ratios and data-loading line."""

import csv
import functools

import pytest
import torch
from torch.utils.benchmark import Measurement
from torch.utils.benchmark.utils.common import TaskSpec

from lra import config
from lra import rows as store
from lra.bench import step as bench
from lra.bench.efficiency import entries
from lra.data.tasks import get_spec
from lra.datamodule import LRADataModule
from lra.module import compile_model
from lra.paper import TABLE3


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def entry(row):
    return next(e for e in entries() if e.row == row)


QUICK = ["--max-run-time", "0.2", "--warmup", "0"]  # Timer stops a cell's steps after 0.2 s (at least one step)


def test_writes_a_row_per_task_and_attention_with_ratios_and_a_data_loading_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))  # no data here: ListOps is generated, Retrieval skipped
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "retrieval", "--attentions", "yoso_32", "none", "--seq-len", "64", "--batch", "2"]
    assert bench.main([*argv, *QUICK, "--quiet", "--out", str(out)]) == 0

    with open(out / "step_cpu.csv", newline="") as f:
        assert next(csv.reader(f)) == bench.FIELDS
    rows = read_rows(out / "step_cpu.csv")
    assert [(r["task"], r["attention"], r["data_loading"]) for r in rows] == [
        ("listops", "none", "False"),
        ("listops", "yoso_32", "False"),
        ("listops", "none", "True"),
        ("retrieval", "none", "False"),
        ("retrieval", "yoso_32", "False"),
        ("retrieval", "none", "True"),
    ]
    assert (out / "step_cpu.png").stat().st_size > 0
    assert {r["seq_len"] for r in rows} == {"64"} and {r["batch"] for r in rows} == {"2"}
    assert [r["inputs"] for r in rows] == ["1"] * 3 + ["2"] * 3  # Retrieval's dual encoder: two documents per sample
    assert {(r["compiled"], r["precision"], r["threads"]) for r in rows} == {("False", "32", str(torch.get_num_threads()))}

    measured = [r for r in rows if r["status"] == "ok"]
    assert len(measured) == 5
    for task in ("listops", "retrieval"):
        floor = next(r for r in measured if r["task"] == task and r["attention"] == "none" and r["data_loading"] == "False")
        assert float(floor["ratio_to_none"]) == 1.0
        for row in (r for r in measured if r["task"] == task):
            assert float(row["ratio_to_none"]) == pytest.approx(float(row["step_ms"]) / float(floor["step_ms"]), abs=1e-3)
    for row in measured:
        assert float(row["step_ms"]) > 0 and float(row["memory_mb"]) >= 0
        assert float(row["samples_per_s"]) == pytest.approx(2 / float(row["step_ms"]) * 1e3, rel=1e-3)
        assert float(row["loop_ms"]) > 0 and float(row["eval_loop_ms"]) > 0  # the same work back to back
        assert int(row["steps"]) >= int(row["attempts"]) >= 1, "Timer's blocks hold the steps timed"
        assert 0 < float(row["padding"]) < 1  # ListOps and Retrieval inputs are zero-padded

    loading, skipped = rows[2], rows[5]
    assert loading["status"] == "ok" and loading["data_source"].startswith("generated here")
    assert skipped["status"] == "skipped" and skipped["ratio_to_none"] == "" and skipped["step_ms"] == ""

    # A part of the grid in another precision goes into the same file: the earlier rows stay, its ratios are its own.
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "64", "--batch", "2", "--precision", "bf16-mixed"]
    assert bench.main([*argv, *QUICK, "--quiet", "--out", str(out)]) == 0
    merged = read_rows(out / "step_cpu.csv")
    assert merged[:6] == rows
    assert [(r["task"], r["attention"], r["data_loading"], r["precision"]) for r in merged[6:]] == [
        ("listops", "none", "False", "bf16 autocast (attention in float32)"),
        ("listops", "none", "True", "bf16 autocast (attention in float32)"),
    ]
    assert float(merged[6]["ratio_to_none"]) == 1.0
    assert "retrieval data is 4096 tokens long, not 64" in skipped["error"] and "nothing is downloaded" in skipped["error"]


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_the_timed_step_updates_the_weights_and_advances_the_schedule(precision):
    cfg = bench.task_config("listops", torch.device("cpu"))
    module = bench.build_module(cfg, entry("softmax"), 32).train()
    assert (module.hparams.lr, module.hparams.max_steps) == (cfg.task.protocol.lr, cfg.task.protocol.max_steps)
    step = bench.TrainingStep(module, precision)
    batch = bench.random_batch(cfg, 32, 2, torch.Generator().manual_seed(0))
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    first_lr = step.scheduler.get_last_lr()[0]

    loss = step(batch)

    assert torch.isfinite(loss) and loss.dtype == torch.float32
    changed = [name for name, p in module.named_parameters() if not torch.equal(p, before[name])]
    assert "model.head.2.weight" in changed and "model.encoder.blocks.0.attention.query.weight" in changed
    assert step.scheduler.last_epoch == 1 and step.scheduler.get_last_lr()[0] > first_lr  # OneCycleLR's warm-up
    assert all("exp_avg" in step.optimizer.state[p] for p in module.parameters())  # AdamW took the step
    assert step.accuracy.device == loss.device and 0 <= float(step.accuracy) <= 1  # the training accuracy, as logged


def test_random_batches_have_each_tasks_shape_vocabulary_and_padding():
    generator = torch.Generator().manual_seed(0)
    for task in bench.TASKS:
        cfg = bench.task_config(task, torch.device("cpu"))
        spec = get_spec(task)
        batch = bench.random_batch(cfg, 2048, 64, generator)
        assert set(batch) == {*spec.inputs, "label"}
        assert batch["label"].shape == (64,) and int(batch["label"].max()) < spec.num_classes
        for name in spec.inputs:
            ids = batch[name]
            assert ids.shape == (64, 2048) and ids.dtype == torch.int64
            assert 0 <= int(ids.min()) <= int(ids.max()) < spec.vocab_size
        share = bench.padding_share(batch)
        if task == "listops":  # real lengths 501..1999 of 2048 (the generator's bounds): zeros after them only
            lengths = (batch["input_ids"] != 0).sum(1)
            assert 501 <= int(lengths.min()) and int(lengths.max()) <= 1999
            assert torch.equal(batch["input_ids"] != 0, torch.arange(2048) < lengths[:, None])
        elif task == "pathfinder":
            assert share == pytest.approx(bench.BLACK_PIXEL_SHARE["pathfinder"], abs=0.01)
        elif task == "image":
            assert share < 0.01  # CIFAR's black pixels are rare
        else:
            assert 0.02 < share < 0.98  # Text and Retrieval: lengths 1..4000 of 4096


def test_an_unknown_attention_or_length_is_one_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--attentions", "bogus", "none"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "unknown attention(s) ['bogus']; available: " in error and "Traceback" not in error
    available = error.split("available: ", 1)[1].split("\n", 1)[0].split(", ")
    assert available == sorted(config.attention_rows()), "every row of conf/attention, sorted"
    with pytest.raises(SystemExit):
        bench.main(["--seq-len", "0"])
    assert "a sequence length is 'paper' (the task's own) or a positive integer, got '0'" in capsys.readouterr().err


# --- noise: Timer times a cell's steps until they spread little, and a cell that still spreads is marked -------------


def measured(*milliseconds):
    """A Timer measurement whose blocks took these milliseconds per step (a step a block)."""
    return Measurement(number_per_run=1, raw_times=[ms / 1e3 for ms in milliseconds], task_spec=TaskSpec("call()", "pass"))


def test_a_cells_columns_are_timers_median_and_spread_and_noise_is_judged_by_the_stated_bound():
    steady = bench.timed_columns(measured(10.0, 10.0, 10.2, 10.2), batch=4)
    assert steady == {
        "step_ms": 10.1,
        "step_ms_std": pytest.approx(0.12, abs=0.005),
        "samples_per_s": pytest.approx(4 / 10.1 * 1e3, rel=1e-3),
        "spread": 0.02,  # IQR 0.2 over the median 10.1: 10.0 and 10.2 are the quartiles
        "attempts": 4,
        "steps": 4,
        "noisy": False,
    }
    wide = bench.timed_columns(measured(20.0, 20.0, 40.0, 40.0), batch=4)
    assert (wide["step_ms"], wide["spread"], wide["noisy"]) == (30.0, 0.667, True)
    just_under = 100.0 + 0.99 * bench.SPREAD_BOUND * 100  # quartiles 100 and this: IQR / median a little under the bound
    assert not bench.timed_columns(measured(100.0, 100.0, just_under, just_under), 1)["noisy"]
    blocks = Measurement(number_per_run=10, raw_times=[0.1, 0.1, 0.1, 0.1], task_spec=TaskSpec("call()", "pass"))
    assert bench.timed_columns(blocks, batch=1)["steps"] == 40 and bench.timed_columns(blocks, batch=1)["step_ms"] == 10.0


class ScriptedTimer:
    """Timer's adaptive_autorange, giving the next measurement of a script: the steps' and the evaluation's per cell."""

    def __init__(self, measurements):
        self.measurements = iter(measurements)
        self.asked = []

    def adaptive_autorange(self, threshold, max_run_time):
        self.asked.append((threshold, max_run_time))
        return next(self.measurements)


def test_the_cli_takes_comma_lists_and_marks_noisy_cells_in_csv_output_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    # Per cell in the grid's order, its steps then its evaluation batches: none, yoso_32 (noisy), none + data loading.
    evaluation = measured(1.0, 1.0, 1.0, 1.0)
    script = ScriptedTimer(
        [measured(10.0, 10.0, 10.2, 10.2), evaluation, measured(20.0, 20.0, 40.0, 40.0), evaluation]
        + [measured(12.0, 12.0, 12.0, 12.0), evaluation]
    )
    monkeypatch.setattr(bench, "timer", lambda run, device: script)
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none,yoso_32", "--seq-len", "64", "--batch", "2", "--max-run-time", "7"]
    assert bench.main([*argv, "--warmup", "0", "--out", str(out)]) == 0

    assert script.asked == [(bench.SPREAD_BOUND, 7.0)] * 6
    rows = read_rows(out / "step_cpu.csv")
    assert [(r["attention"], r["data_loading"], r["step_ms"], r["spread"], r["noisy"]) for r in rows] == [
        ("none", "False", "10.1", "0.02", "False"),
        ("yoso_32", "False", "30.0", "0.667", "True"),
        ("none", "True", "12.0", "0.0", "False"),
    ]
    assert float(rows[1]["ratio_to_none"]) == pytest.approx(30.0 / 10.1, abs=1e-3) and rows[0]["eval_ms"] == "1.0"
    printed = capsys.readouterr().out
    (noisy_line,) = [line for line in printed.splitlines() if "NOISY" in line]
    assert "yoso_32" in noisy_line and f"spread 67% > {bench.SPREAD_BOUND:.0%} of their median after 4 steps" in noisy_line
    assert (out / "step_cpu.png").stat().st_size > 0
    assert store.read_rows(out / "step_cpu.csv", bench.TYPES)[1]["noisy"] is True


def test_list_options_take_spaces_commas_or_both_and_name_an_unknown_item(capsys):
    assert bench.listed(["none,softmax", "yoso_32", "none"]) == ["none", "softmax", "yoso_32"]
    help_text = " ".join(bench.build_parser().format_help().split())
    assert f"spread less than {bench.SPREAD_BOUND:.0%} of their median (interquartile range / median)" in help_text
    with pytest.raises(SystemExit):
        bench.main(["--tasks", "listops,imdb"])
    assert "unknown task(s) ['imdb']; available: listops, text, retrieval, image, pathfinder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--attentions", "none,bogus"])
    assert "unknown attention(s) ['bogus']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--seq-len", "paper,0"])
    assert "a sequence length is 'paper' (the task's own) or a positive integer, got '0'" in capsys.readouterr().err


def test_a_published_tables_name_picks_its_rows_in_its_order():
    assert bench.attention_rows(["table3"]) == list(TABLE3.presets)
    assert bench.attention_rows(["local,table3", "none"]) == ["local", *TABLE3.presets]
    assert set(TABLE3.presets) <= set(config.attention_rows()), "every row of the table is one of conf/attention"
    assert "or a table's rows: table3, lra_table1" in " ".join(bench.build_parser().format_help().split())


@pytest.mark.slow
def test_the_twelve_table3_rows_run_compiled_in_one_command(tmp_path, monkeypatch):
    """``--attentions table3 --compile``, as a GPU runs it; here Dynamo captures each cell's steps at 32 tokens and one
    step and runs its graphs as they are (the eager backend: tests/lra/test_compile_rows.py holds every row's graphs
    under AOTAutograd). Every cell compiles its own two graphs: none runs eagerly past Dynamo's limit of compilations
    per function (8), as the ninth row on did before each cell compiled afresh."""
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr("lra.module.compile_model", functools.partial(compile_model, backend=recording))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "table3", "--compile", "--seq-len", "32", "--batch", "2"]
    assert bench.main([*argv, *QUICK, "--quiet", "--out", str(out)]) == 0
    rows = read_rows(out / "step_cpu.csv")
    assert [(row["attention"], row["data_loading"]) for row in rows] == [
        *((preset, "False") for preset in TABLE3.presets),
        ("none", "True"),
    ]
    assert {(row["status"], row["compiled"]) for row in rows} == {("ok", "True")}, [row["error"] for row in rows]
    assert all(float(row["compile_s"]) > 0 and float(row["step_ms"]) > 0 and float(row["eval_ms"]) > 0 for row in rows)
    assert len(graphs) == 2 * len(rows)  # each cell compiled once: training and evaluation


def test_eager_too_measures_the_compiled_grid_and_then_the_same_grid_eagerly_into_one_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    aot_eager = functools.partial(compile_model, backend=torch._dynamo.lookup_backend("aot_eager"))
    monkeypatch.setattr("lra.module.compile_model", aot_eager)  # Dynamo and AOTAutograd without code generation
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "32", "--batch", "2", *QUICK, "--quiet"]
    assert bench.main([*argv, "--compile", "--eager-too", "--out", str(out)]) == 0
    rows = read_rows(out / "step_cpu.csv")
    assert [(r["data_loading"], r["compiled"], r["status"]) for r in rows] == [
        ("False", "True", "ok"),
        ("True", "True", "ok"),
        ("False", "False", "ok"),
        ("True", "False", "ok"),
    ]
    assert rows[0]["compile_s"] != "" and rows[2]["compile_s"] == "" and float(rows[2]["ratio_to_none"]) == 1.0
    with pytest.raises(SystemExit):
        bench.main([*argv, "--eager-too"])  # without --compile there is no compiled grid to follow


def test_profile_writes_each_phase_of_the_step_and_the_row_times_an_evaluation_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "32", "--batch", "2", *QUICK]
    assert bench.main([*argv, "--profile", "--quiet", "--out", str(out)]) == 0
    (row, _loading) = read_rows(out / "step_cpu.csv")
    assert float(row["eval_ms"]) > 0 and row["compile_mode"] == "" and row["device_ms"] == ""  # no device on a CPU
    profiles = out / "step_cpu_profile"
    # The data-loading line's profile has its own file: it once overwrote the profile of the row without loading.
    assert sorted(path.name for path in profiles.iterdir()) == ["listops_n32_none_32.txt", "listops_n32_none_data_loading_32.txt"]
    assert "listops n=32 none + data loading, batch 2" in (profiles / "listops_n32_none_data_loading_32.txt").read_text()
    text = (profiles / "listops_n32_none_32.txt").read_text()
    assert "listops n=32 none, batch 2" in text
    phases = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0] in bench.PHASES
    }
    assert set(phases) == set(bench.PHASES) and phases["forward"] > 0 and phases["backward"] > 0
    with pytest.raises(SystemExit):
        bench.main([*argv, "--compile-mode", "reduce-overhead"])  # a mode without --compile


def test_the_data_loading_line_reads_batches_pinned_for_a_gpu_as_the_trainer_does(tmp_path, monkeypatch):
    """lra.train's Trainer pins batches on a GPU (LRADataModule.on_gpu); the benchmark's loader has no Trainer and says
    so itself, or its copies would come from pageable memory, which the Trainer's do not."""
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    cfg = bench.task_config("listops", torch.device("cpu"))
    made = []
    monkeypatch.setattr(bench, "LRADataModule", lambda *args, **kwargs: made.append(LRADataModule(*args, **kwargs)) or made[-1])
    for device in ("cpu", "cuda"):
        with bench.loaded_batches(cfg, 32, 2, 3, torch.device(device)):  # nothing is moved until a batch is taken
            assert made[-1].train_dataloader().pin_memory is (device == "cuda")


def test_rows_of_another_device_are_kept_as_their_own_cells_with_their_own_ratios(tmp_path, monkeypatch):
    """A GPU's rows merged into a file that holds another GPU's: nothing replaced across devices, no ratio across them."""
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none", "softmax", "--seq-len", "64", "--batch", "2", *QUICK]
    assert bench.main([*argv, "--quiet", "--out", str(out)]) == 0
    path = out / "step_cpu.csv"
    here = read_rows(path)
    other = [dict(row, device="Another GPU", step_ms=str(float(row["step_ms"]) * 10)) for row in here]
    with open(path, "w", newline="") as f:  # the other device's rows first, as an earlier run left them
        writer = csv.DictWriter(f, fieldnames=bench.FIELDS)
        writer.writeheader()
        writer.writerows(other)

    assert bench.main([*argv, "--quiet", "--out", str(out)]) == 0
    merged = read_rows(path)
    assert [row["device"] for row in merged] == ["Another GPU"] * len(other) + [here[0]["device"]] * len(here)
    assert merged[: len(other)] == other  # kept as they were, their ratios too
    floor = next(r for r in merged[len(other) :] if r["attention"] == "none" and r["data_loading"] == "False")
    softmax = next(r for r in merged[len(other) :] if r["attention"] == "softmax")
    assert float(softmax["ratio_to_none"]) == pytest.approx(float(softmax["step_ms"]) / float(floor["step_ms"]), abs=1e-3)
    first = store.read_rows(path, bench.TYPES)[0]
    assert bench.label(first, with_device=True) == "none (Another GPU)"  # the figure tells them apart


def test_a_failed_cell_records_the_innermost_cause_of_a_wrapped_error():
    def compile_fails():
        try:
            raise RuntimeError("Expected all tensors to be on the same device\n(more lines)")
        except RuntimeError as cause:
            wrapper = Exception("backend='inductor' raised:\nRuntimeError: Expected all tensors ...")
            wrapper.inner_exception = cause  # as torch._dynamo's BackendCompilerFailed carries it, raised from None
            raise wrapper from None

    with pytest.raises(Exception) as caught:
        compile_fails()
    assert bench.error_line(caught.value) == (
        "Exception: backend='inductor' raised: RuntimeError: Expected all tensors to be on the same device"
    )
    try:
        raise ValueError("a plain error\nsecond line") from KeyError("missing")
    except ValueError as error:
        assert bench.error_line(error) == "ValueError: a plain error KeyError: 'missing'"
    assert bench.error_line(RuntimeError("one line")) == "RuntimeError: one line"
