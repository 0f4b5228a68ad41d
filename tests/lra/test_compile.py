"""``trainer.compile``: the LRA model under ``torch.compile``.

Every registered attention and every row of ``conf/attention`` is traced by Dynamo
(``torch._dynamo.explain``: tracing only, no code generation, so it is cheap) on a padded batch and
must give one graph, YOSO's custom ops included; one tiny run through ``python -m lra.train``
compiles (with ``aot_eager``, which differentiates the graphs without generating code) and must not
recompile for padding.
"""

import json
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo
from omegaconf import OmegaConf, open_dict

import attention_zoo
from lra import config, results
from lra.module import FASTER_COMPILED, LRAClassificationModule, LRAMaskedLMModule, compile_backend, compile_model
from lra.results import defining_config

SEQ_LEN, BATCH = 64, 2
MODEL = {"depth": 1}  # graph breaks are per layer: one shows them all


def attention_cases():
    """Every registered attention with its defaults, and every row of conf/attention that differs from those."""
    cases = {name: {"name": name, "hparams": {}} for name in attention_zoo.available()}
    for row in config.attention_rows():
        attention = OmegaConf.to_container(config.compose([f"attention={row}"]).attention, resolve=True)
        if attention_zoo.make_config(attention["name"], **attention["hparams"]) != attention_zoo.make_config(attention["name"]):
            cases[f"attention={row}"] = attention
    return [pytest.param(attention, id=case) for case, attention in cases.items()]


def padded_batch():
    """Two ListOps-sized rows of token ids, the first right-padded, as the data module gives them."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 10, (BATCH, SEQ_LEN), generator=generator)
    input_ids[0, SEQ_LEN // 2 :] = 0
    return {"input_ids": input_ids, "label": torch.tensor([1, 2])}


def custom_ops(explanation):
    return {
        str(node.target) for graph in explanation.graphs for node in graph.graph.nodes if str(node.target).startswith("yoso.")
    }


@pytest.mark.parametrize("attention", attention_cases())
def test_the_model_and_its_loss_trace_into_one_graph(attention):
    torch.manual_seed(0)
    module = LRAClassificationModule("listops", SEQ_LEN, MODEL, attention).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda batch: module.loss_and_predictions(batch)[0])(padded_batch())
    reasons = [
        f"{b.reason.splitlines()[0]} at {b.user_stack[-1].filename}:{b.user_stack[-1].lineno}" for b in explanation.break_reasons
    ]
    assert explanation.graph_break_count == 0, reasons
    hparams = attention_zoo.make_config(attention["name"], **attention["hparams"])
    if attention["name"] == "yoso" and not hparams.expectation:
        # YOSO's attention runs inside the graph as its custom op (its fake kernel gives the shapes).
        assert "yoso.lsh_attention.default" in custom_ops(explanation)


def test_the_masked_lm_pretraining_model_traces_into_one_graph():
    module = LRAMaskedLMModule("listops", SEQ_LEN, MODEL, {"name": "yoso", "hparams": {}}).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(module.network())(padded_batch()["input_ids"])
    assert explanation.graph_break_count == 0
    assert "yoso.lsh_attention.default" in custom_ops(explanation)


def test_compiling_keeps_the_checkpoint_keys_and_loads_a_checkpoint_of_either_kind():
    attention = {"name": "yoso", "hparams": {}}
    plain = LRAClassificationModule("listops", SEQ_LEN, MODEL, attention)
    compiled = LRAClassificationModule("listops", SEQ_LEN, MODEL, attention)
    compile_model(compiled, "aot_eager")
    assert list(compiled.state_dict()) == list(plain.state_dict())
    compiled.load_state_dict(plain.state_dict())  # strict, as resuming a run does
    plain.load_state_dict(compiled.state_dict())
    masked_lm = LRAMaskedLMModule("listops", SEQ_LEN, MODEL, attention)
    keys = list(masked_lm.state_dict())
    compile_model(masked_lm, "aot_eager")
    assert list(masked_lm.state_dict()) == keys


def test_a_performer_redrawing_every_few_calls_does_not_recompile_per_call():
    """Its call counter is a Python int, which Dynamo would specialise a graph on: one per value."""
    eager = attention_zoo.build("performer", seq_len=16, num_heads=1, head_dim=8, redraw_interval=3).train()
    compiled = attention_zoo.build("performer", seq_len=16, num_heads=1, head_dim=8, redraw_interval=3).train()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(backend="aot_eager")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters["stats"]
    graphs = []
    for call in range(8):
        q, k, v = torch.randn(3, 1, 1, 16, 8).unbind()
        torch.manual_seed(call)
        expected = eager(q, k, v)
        torch.manual_seed(call)
        torch.testing.assert_close(compiled(q, k, v), expected)  # the same draws at the same calls
        graphs.append(counters["unique_graphs"])
    assert graphs == graphs[:1] * 8, graphs  # compiled at the first call, the one before the first redraw too
    assert compiled.calls_since_redraw == eager.calls_since_redraw == 2


def test_the_compile_setting():
    assert compile_backend(False) is None
    assert compile_backend(True) == "inductor"
    assert compile_backend("aot_eager") == "aot_eager"
    for accelerator, rows in FASTER_COMPILED.items():  # auto: Inductor for the rows measured faster compiled there
        assert all(compile_backend("auto", row, accelerator) == "inductor" for row in rows)
    assert compile_backend("auto", "yoso_e", "cpu") == "inductor"
    assert compile_backend("auto", "yoso_32", "cpu") is None  # measured slower compiled
    assert compile_backend("auto", "yoso_e", "gpu") is None  # nothing measured there yet
    assert compile_backend("auto") is None
    for bad in ("maybe", 1, None):
        with pytest.raises(ValueError, match=r"trainer.compile must be true .*, false, auto .*, or the name of a torch.compile"):
            compile_backend(bad)


@pytest.mark.parametrize(
    "overrides, row, backend",
    [
        (["attention=yoso_e"], "yoso_e", "inductor"),
        (["attention=reformer"], "reformer", "inductor"),
        (["attention=yoso_32"], "yoso_32", None),
        (["attention=none"], "none", None),
        (["attention=yoso_e", "trainer=gpu"], "yoso_e", None),
        (["attention=yoso_e", "trainer.compile=false"], "yoso_e", None),
        (["attention=yoso_32", "trainer.compile=true"], "yoso_32", "inductor"),
        (["attention=yoso_e", "task=pathfinder"], "yoso_e", None),
    ],
    ids=["yoso_e", "reformer", "yoso_32-slower", "none-even", "on-a-gpu", "false-given", "true-given", "pathfinder"],
)
def test_table3s_listops_compiles_the_rows_measured_faster_compiled(overrides, row, backend):
    """experiment=table3 task=listops sets trainer.compile=auto (conf/experiment_per_task/table3/listops.yaml): on a
    CPU, the rows of lra.module.FASTER_COMPILED compile, the others stay eager; the command line decides over it."""
    from lra.fit import trainer_arguments

    cfg = config.compose(["experiment=table3", "task=listops", *overrides])
    assert trainer_arguments(cfg, row)[1] == backend


def test_a_run_decides_trainer_compile_auto_by_its_own_row(tmp_path, monkeypatch):
    """lra.run hands the run's row to the training (lra.fit.fit_and_test), which trainer.compile=auto decides by. The
    run stops where the decision is made, before any data or model is built. Its outputs and committed runs are the
    test's own: the project's may hold this cell finished, which a run skips."""
    from lra import fit, run

    decided = []

    def decide_and_stop(cfg, row=None):
        decided.append((row, fit.compile_backend(cfg.trainer.compile, row, cfg.trainer.accelerator)))
        raise RuntimeError("stopped where trainer.compile=auto is decided")

    monkeypatch.setattr(fit, "trainer_arguments", decide_and_stop)
    cfg = config.compose(
        [
            "experiment=table3",
            "task=listops",
            "attention=reformer",
            f"paths.output_dir={tmp_path}/outputs",
            f"paths.runs_dir={tmp_path}/runs",
            f"callbacks.checkpoint.dirpath={tmp_path}/checkpoints",
        ]
    )
    with pytest.raises(run.RunFailed, match="stopped where trainer.compile=auto is decided"):
        run.train(cfg, tmp_path, row="reformer")
    assert decided == [("reformer", "inductor")]


def test_compiling_changes_neither_the_runs_folder_nor_its_identity():
    def folder_and_hash(*overrides):
        cfg = config.compose(["task.seq_len=64", *overrides], return_hydra_config=True)
        folder = cfg.hydra.job.override_dirname
        with open_dict(cfg):
            for key in ("hydra", "callbacks", "logger"):  # their paths interpolate the running job's folder
                del cfg[key]
        return folder, results.config_hash(defining_config(cfg))

    assert folder_and_hash("trainer.compile=true") == folder_and_hash() == folder_and_hash("trainer.compile=aot_eager")
    assert folder_and_hash()[0] == "task.seq_len=64"


@pytest.mark.slow
def test_a_compiled_run_compiles_once_per_mode_and_once_for_the_last_partial_batch(tmp_path, run_train):
    """Six training steps and three evaluations over batches of different padding, and a test set of 24
    in batches of 16 and 8: one graph for the training step, one for the evaluation step (validation and
    test share it), and the evaluation's once more for the partial batch (with a dynamic batch size).
    ``TORCH_LOGS=recompiles`` logs each recompilation."""
    process = run_train("attention=yoso_32", "trainer.compile=aot_eager", env={"TORCH_LOGS": "recompiles"})
    log = process.stdout + process.stderr
    recompiled = re.findall(r"Recompiling function (\w+) in (\S+)", log)
    # The evaluation step is the one frame compiled again (no graph break, so no other).
    assert [(function, path.rsplit(":", 1)[0].endswith("lra/module.py")) for function, path in recompiled] == [
        ("evaluation_outputs", True)
    ], log[-3000:]
    reasons = re.findall(r"\[__recompiles\]\s+- \d+/\d+: (.*)", log)
    assert [reason.strip() for reason in reasons] == [
        "tensor 'batch['input_ids']' size mismatch at index 0. expected 16, actual 8"
    ], reasons
    (path,) = (tmp_path / "outputs").rglob("results.json")
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["compiled"] is True and record["compile_backend"] == "aot_eager"
    assert "compile" not in path.parent.name
    checkpoint = torch.load(record["best_checkpoint"], map_location="cpu", weights_only=True)
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])
    LRAClassificationModule.load_from_checkpoint(record["best_checkpoint"])  # strict: the keys of an uncompiled model


def test_the_commands_that_do_not_train_import_neither_lightning_nor_dynamo():
    """Dynamo takes 1.4 s to import and Lightning (which imports Dynamo) 2 s more: the commands that read
    configurations, tables and campaigns, every attention, ``python -m lra.bench --help`` and the benchmarks that do not
    train (all but step, approx and authors) import neither; a run imports them where it trains or compiles."""
    probe = (
        "import sys, attention_zoo, yoso_cuda, lra.train, lra.table, lra.campaign\n"
        "from lra.bench import __main__ as bench, kernels, efficiency, gpu, pathfinder_cnn\n"
        "bench.parser()\n"
        "print(sorted(m for m in ('pytorch_lightning', 'torch._dynamo') if m in sys.modules))"
    )
    process = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert process.stdout.strip() == "[]", process.stderr
