"""``python -m lra.bench step``: the full training step per task and attention, its rows, ratios and data-loading line."""

import csv
import functools
import itertools
import time

import pytest
import torch

from lra import config
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


def test_writes_a_row_per_task_and_attention_with_ratios_and_a_data_loading_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))  # no data here: ListOps is generated, Retrieval skipped
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "retrieval", "--attentions", "yoso_32", "none", "--seq-len", "64", "--batch", "2"]
    assert bench.main([*argv, "--steps", "1", "--warmup", "0", "--quiet", "--out", str(out)]) == 0

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
    assert {(r["compiled"], r["precision"], r["steps"], r["threads"]) for r in rows} == {
        ("False", "32", "1", str(torch.get_num_threads()))
    }

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
        assert 0 < float(row["padding"]) < 1  # ListOps and Retrieval inputs are zero-padded

    loading, skipped = rows[2], rows[5]
    assert loading["status"] == "ok" and loading["data_source"].startswith("generated here")
    assert skipped["status"] == "skipped" and skipped["ratio_to_none"] == "" and skipped["step_ms"] == ""

    # A part of the grid in another precision goes into the same file: the earlier rows stay, its ratios are its own.
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "64", "--batch", "2", "--precision", "bf16-mixed"]
    assert bench.main([*argv, "--steps", "1", "--warmup", "0", "--quiet", "--out", str(out)]) == 0
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


# --- noise: a cell whose timed steps spread too much is measured again, and marked if it stays noisy ---------------


def test_the_steadiest_attempt_is_kept_and_noise_is_judged_by_the_stated_bound():
    bound = bench.SPREAD_BOUND
    assert bench.relative_spread([100.0, 100.0 * (1 + bound), 100.0]) == pytest.approx(bound)
    assert bench.relative_spread([42.0]) == 0.0
    steady, wide = [100.0, 104.0, 102.0], [100.0, 160.0, 101.0]
    assert bench.steadiest([wide, steady]) == (1, False)
    assert bench.steadiest([wide, [200.0, 400.0, 200.0]]) == (0, True), "the least spread wins, and is still too wide"
    assert bench.steadiest([[12.0, 12.5], [10.0, 10.4]]) == (1, False), "equal spreads: the faster median"


def scripted(attempts):
    """A measurement that returns the next attempt's step times, and how often it was called."""
    calls = iter(attempts)
    return lambda: {"times": next(calls), "step_ms": 0.0}


def test_a_cell_is_repeated_while_its_steps_spread_over_the_bound_and_marked_noisy_if_they_still_do():
    # The case: a first `none` at 1235 ms, 124 ms when measured again; spread over the bound is repeated.
    first, second = [1100.0, 1235.0, 1400.0], [124.0, 125.0, 123.0]
    result = bench.measure_until_steady(scripted([first, second, AssertionError]))
    assert (result["times"], result["attempts"], result["noisy"]) == (second, 2, False)
    assert result["spread"] == pytest.approx((125 - 123) / 124, abs=1e-3)

    steady = bench.measure_until_steady(scripted([[50.0, 51.0, 50.5]]))
    assert (steady["attempts"], steady["noisy"]) == (1, False), "a steady cell is measured once"

    noisy = [[100.0, 180.0, 100.0], [100.0, 140.0, 100.0], [100.0, 200.0, 100.0]]
    result = bench.measure_until_steady(scripted(noisy))
    assert (result["times"], result["attempts"], result["noisy"]) == (noisy[1], bench.MAX_ATTEMPTS, True)


def test_the_cli_takes_comma_lists_repeats_noisy_cells_and_marks_them_in_csv_output_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    # Step times by cell, in the grid's order: none (noisy, then steady), yoso_32 (noisy throughout), none + data loading.
    attempts = iter([[10.0, 15.0, 10.0], [10.0, 10.2, 10.1]] + [[20.0, 40.0, 20.0]] * bench.MAX_ATTEMPTS + [[12.0, 12.1, 12.0]])
    calls = itertools.count()  # each attempt times its training steps, then its evaluation batches (steady, 1 ms)
    monkeypatch.setattr(bench, "time_calls", lambda run, device, repeats: [1.0] * 3 if next(calls) % 2 else next(attempts))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none,yoso_32", "--seq-len", "64", "--batch", "2", "--steps", "3"]
    assert bench.main([*argv, "--warmup", "0", "--out", str(out)]) == 0

    rows = read_rows(out / "step_cpu.csv")
    assert [(r["attention"], r["data_loading"], r["attempts"], r["noisy"]) for r in rows] == [
        ("none", "False", "2", "False"),
        ("yoso_32", "False", str(bench.MAX_ATTEMPTS), "True"),
        ("none", "True", "1", "False"),
    ]
    assert float(rows[0]["step_ms"]) == 10.1 and float(rows[1]["spread"]) == 1.0
    assert float(rows[1]["ratio_to_none"]) == pytest.approx(20.0 / 10.1, abs=1e-3)
    printed = capsys.readouterr().out
    (noisy_line,) = [line for line in printed.splitlines() if "NOISY" in line]
    assert "yoso_32" in noisy_line and f"> {bench.SPREAD_BOUND:.0%} in all {bench.MAX_ATTEMPTS} attempts" in noisy_line
    assert (out / "step_cpu.png").stat().st_size > 0
    assert bench.read_rows(out / "step_cpu.csv")[1]["noisy"] is True


def test_list_options_take_spaces_commas_or_both_and_name_an_unknown_item(capsys):
    assert bench.listed(["none,softmax", "yoso_32", "none"]) == ["none", "softmax", "yoso_32"]
    help_text = bench.build_parser().format_help()
    assert f"spread more than {bench.SPREAD_BOUND:.0%} of their median" in help_text.replace("\n", " ")
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
    """``--attentions table3 --compile``, as a GPU runs it; here each cell's steps compiled with aot_eager (Dynamo and
    AOTAutograd without Inductor's code generation) at 32 tokens and one step. Every cell compiles its own two graphs:
    none runs eagerly past Dynamo's limit of compilations per function (8), as the ninth row on did before each cell
    compiled afresh."""
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    monkeypatch.setattr("lra.module.compile_model", functools.partial(compile_model, backend=recording))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "table3", "--compile", "--seq-len", "32", "--batch", "2"]
    assert bench.main([*argv, "--steps", "1", "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    rows = read_rows(out / "step_cpu.csv")
    assert [(row["attention"], row["data_loading"]) for row in rows] == [
        *((preset, "False") for preset in TABLE3.presets),
        ("none", "True"),
    ]
    assert {(row["status"], row["compiled"]) for row in rows} == {("ok", "True")}, [row["error"] for row in rows]
    assert all(float(row["compile_s"]) > 0 and float(row["step_ms"]) > 0 and float(row["eval_ms"]) > 0 for row in rows)
    assert len(graphs) == 2 * len(rows)  # each cell measured once (one step cannot spread): training and evaluation


def test_profile_writes_each_phase_of_the_step_and_the_row_times_an_evaluation_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "32", "--batch", "2", "--steps", "2", "--warmup", "0"]
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


def test_back_to_back_waits_for_the_device_once_after_all_calls_and_gives_the_time_per_call(monkeypatch):
    from lra.bench import measure

    events = []
    monkeypatch.setattr(measure, "synchronize", lambda device: events.append("synchronize"))

    def run():
        events.append("call")
        time.sleep(0.005)

    per_call = measure.back_to_back(run, torch.device("cpu"), 4)
    assert events == ["synchronize", "call", "call", "call", "call", "synchronize"]  # time_calls waits after each call
    assert per_call >= 5.0  # milliseconds per call, not for the four


def test_rows_of_another_device_are_kept_as_their_own_cells_with_their_own_ratios(tmp_path, monkeypatch):
    """A GPU's rows merged into a file that holds another GPU's: nothing replaced across devices, no ratio across them."""
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "--attentions", "none", "softmax", "--seq-len", "64", "--batch", "2", "--steps", "1"]
    assert bench.main([*argv, "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    path = out / "step_cpu.csv"
    here = read_rows(path)
    other = [dict(row, device="Another GPU", step_ms=str(float(row["step_ms"]) * 10)) for row in here]
    with open(path, "w", newline="") as f:  # the other device's rows first, as an earlier run left them
        writer = csv.DictWriter(f, fieldnames=bench.FIELDS)
        writer.writeheader()
        writer.writerows(other)

    assert bench.main([*argv, "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    merged = read_rows(path)
    assert [row["device"] for row in merged] == ["Another GPU"] * len(other) + [here[0]["device"]] * len(here)
    assert merged[: len(other)] == other  # kept as they were, their ratios too
    floor = next(r for r in merged[len(other) :] if r["attention"] == "none" and r["data_loading"] == "False")
    softmax = next(r for r in merged[len(other) :] if r["attention"] == "softmax")
    assert float(softmax["ratio_to_none"]) == pytest.approx(float(softmax["step_ms"]) / float(floor["step_ms"]), abs=1e-3)
    assert bench.label(bench.read_rows(path)[0], with_device=True) == "none (Another GPU)"  # the figure tells them apart


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
