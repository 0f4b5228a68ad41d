"""Every registered attention trains in the LRA encoder, and every preset in conf/attention runs."""

import json
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from tiny_listops import TINY

import attention_zoo
from lra import config
from lra.data import listops
from lra.data.tasks import get_spec
from lra.model import AttentionConfig, ModelConfig, build_classifier
from lra.module import LRAClassificationModule

PRESETS = config.attention_rows()


def load_preset(row: str) -> dict:
    """The ``attention`` section that ``attention=<row>`` composes."""
    return OmegaConf.to_container(config.compose([f"attention={row}"]).attention, resolve=True)


@pytest.fixture(scope="module")
def listops_batch():
    """One batch of 16 generated ListOps sequences of fewer than 60 tokens, padded to 64."""
    config = listops.GeneratorConfig(num_train=16, num_val=1, num_test=1, min_length=5, max_length=60, seed=0)
    rows = listops.generate(config)["train"]
    ids = torch.zeros(16, 64, dtype=torch.long)
    for i, (source, _) in enumerate(rows):
        tokens = [listops.VOCAB[t] for t in listops.tokenize(source)]
        ids[i, : len(tokens)] = torch.tensor(tokens)
    return ids, torch.tensor([label for _, label in rows])


@pytest.mark.parametrize("name", PRESETS)
def test_a_few_steps_reduce_the_loss(name, listops_batch):
    ids, labels = listops_batch
    torch.manual_seed(0)
    model = build_classifier(get_spec("listops"), 64, ModelConfig(dropout=0.0), AttentionConfig(**load_preset(name))).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0], f"{name}: loss {losses[0]:.3f} -> {losses[-3:]}"


class StepRecorder(pl.Callback):
    """The loss, the gradients before the optimiser step, and the dtypes of a projection's output
    and of what the core attention receives during the step."""

    def __init__(self, attention_layer: torch.nn.Module) -> None:
        self.dtypes: dict[str, torch.dtype] = {}

        def record_projection(module, args, out) -> None:
            self.dtypes["projection"] = out.dtype

        def record_attention_input(module, args) -> None:  # inside the float32 policy: what the algorithm gets
            self.dtypes["attention"] = args[0].dtype

        attention_layer.query.register_forward_hook(record_projection)
        core = attention_layer.attention
        original_attend = core.attend

        def attend(*args):
            record_attention_input(core, args)
            return original_attend(*args)

        core.attend = attend

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.loss = outputs["loss"].detach()

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.gradients = {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}


def reads_queries_and_keys(core: attention_zoo.Attention) -> bool:
    """Whether the core attention's output depends on its queries and keys at all (autograd reaches them)."""
    q, k, v = (torch.randn(1, core.num_heads, 8, core.head_dim, requires_grad=True) for _ in range(3))
    grads = torch.autograd.grad(core(q, k, v).sum(), (q, k), allow_unused=True)
    return all(grad is not None for grad in grads)


@pytest.mark.parametrize("name", PRESETS)
def test_a_training_step_under_bf16_mixed_precision(name, listops_batch):
    """The GPU trainer's path (conf/trainer/gpu.yaml: Lightning's bf16-mixed) on the CPU: the
    projections run in bfloat16, the core attention in float32, loss and gradients are finite."""
    ids, labels = listops_batch
    preset = load_preset(name)
    torch.manual_seed(0)
    module = LRAClassificationModule("listops", 64, {}, preset, warmup_steps=0, max_steps=1)
    recorder = StepRecorder(module.model.encoder.blocks[0].attention)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    batches = torch.utils.data.DataLoader([{"input_ids": i, "label": y} for i, y in zip(ids, labels)], batch_size=16)
    trainer.fit(module, train_dataloaders=batches)
    assert recorder.dtypes == {"projection": torch.bfloat16, "attention": torch.float32}
    assert torch.isfinite(recorder.loss)
    trained = {name for name, p in module.named_parameters() if p.requires_grad}
    if not reads_queries_and_keys(module.model.encoder.blocks[0].attention.attention):  # e.g. "none": nothing to train there
        trained = {name for name in trained if ".attention.query." not in name and ".attention.key." not in name}
    assert set(recorder.gradients) == trained, f"no gradient for {trained - set(recorder.gradients)}"
    for name, gradient in recorder.gradients.items():
        assert torch.isfinite(gradient).all(), name
    assert all(gradient.abs().sum() > 0 for name, gradient in recorder.gradients.items() if name.endswith("weight"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_names_a_registered_attention_with_valid_hyperparameters(name):
    preset = load_preset(name)
    assert set(preset) == {"name", "hparams"}, f"{name}: a preset holds 'name' and 'hparams'"
    attention_zoo.make_config(preset["name"], **preset["hparams"])


def test_every_registered_attention_has_a_preset():
    named = {load_preset(name)["name"] for name in PRESETS}
    assert set(attention_zoo.available()) <= named


@pytest.fixture(scope="module")
def command_line_sweep(command_line_presets, tmp_path_factory):
    """``python -m lra.train -m attention=<every preset>`` on the tiny ListOps: one process for the sweep, as a user runs
    it (a process per preset spends most of its time starting torch and Lightning); its output and every run's record,
    by row. Only the presets whose test runs are swept: ``-k my_attention`` (the add-an-attention contract run) trains
    that one, not all 21."""
    folder = tmp_path_factory.mktemp("every-preset")
    env = {**os.environ, "LRA_DATA_DIR": str(folder / "data"), "LRA_OUTPUT_DIR": str(folder / "outputs")}
    process = subprocess.run(
        [sys.executable, "-m", "lra.train", "-m", f"attention={','.join(command_line_presets)}", *TINY],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    records = [json.loads(path.read_text()) for path in (folder / "outputs").rglob("results.json")]
    return process.stdout[-3000:] + process.stderr[-3000:], {record["row"]: record for record in records}


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_training_from_the_command_line(name, command_line_sweep):
    output, records = command_line_sweep
    assert name in records, f"attention={name} left no record in the sweep:\n{output}"
    record = records[name]
    assert record["status"] == "finished" and record["attention"] == load_preset(name)["name"]
    assert 0.0 <= record["test_acc"] <= 1.0
