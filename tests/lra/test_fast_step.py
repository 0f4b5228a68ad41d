"""The training step does not wait for the device where nothing is due, and computes what the step before it did.

On a GPU a step of the small LRA model is mostly the host launching work: a step that reads a value back from the
device (``.item()``, ``float(tensor)``, ``if tensor``, ``torch.cuda.synchronize``) or copies a Python number to it waits
for everything queued, and the device then idles while the host prepares the next. These tests find such reads on the
CPU, where the same code runs: a ``TorchFunctionMode`` sees every tensor call of a real ``lra.fit`` training run.
"""

import sys
import traceback
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torchmetrics
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from tiny_listops import TINY
from torch.overrides import TorchFunctionMode

from lra import callbacks, config, fit, module
from lra.datamodule import LRADataModule
from lra.module import LRAClassificationModule, adamw_implementation, batch_accuracy

# Calls that read a tensor's value on the host: on a GPU each waits for the device to finish all queued work.
READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "unique"}
READS |= {"masked_select", "bincount", "repeat_interleave"}
CREATES = {"tensor", "as_tensor", "scalar_tensor"}  # with a device: a copy of a host number to the device
# Host-side tensors a GPU run keeps on the host too: the loader's (worker processes on a GPU) and torch.optim's step
# counts (CPU tensors for CUDA parameters unless capturable or fused).
HOST_SIDE = ("torch/utils/data/", "torch/optim/", "lightning/pytorch/loops/fetchers", "pytorch_lightning/loops/fetchers")


class DeviceReads(TorchFunctionMode):
    """Every read of a tensor's value and every tensor made on a device from host data, by training step."""

    def __init__(self):
        super().__init__()
        self.phase = "start"
        self.calls: dict[object, list[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or (name in CREATES and kwargs.get("device") is not None):
            stack = traceback.extract_stack()[:-1]
            if not any(part in frame.filename for frame in stack for part in HOST_SIDE):
                where = next((f for f in reversed(stack) if "/torch/" not in f.filename), stack[-1])
                self.calls.setdefault(self.phase, []).append(f"{name} at {Path(where.filename).name}:{where.lineno}")
        return func(*args, **kwargs)


def tiny_cfg(tmp_path, *overrides):
    cfg = config.compose([*TINY, *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")
        cfg.task.data.generated_dir = str(tmp_path / "generated")
        cfg.task.data.cache_dir = str(tmp_path / "cache")
    HydraConfig.instance().set_config(cfg)
    return cfg


def lra_trainer(cfg, tmp_path, *extra_callbacks):
    """The module, data and Trainer of ``lra.fit`` for ``cfg``, as ``fit_and_test`` builds them."""
    arguments, compile_with, mode = fit.trainer_arguments(cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = fit.build_datamodule(cfg, 1)
    lra_module = fit.build_module(cfg, "classification", None)
    if compile_with is not None:
        module.compile_model(lra_module, compile_with, mode)
    trainer = fit.build_trainer(cfg, tmp_path / "run", None, arguments)
    trainer.callbacks[:0] = list(extra_callbacks)
    return lra_module, datamodule, trainer


def test_a_training_step_with_nothing_due_never_waits_for_the_device(tmp_path, monkeypatch):
    """Steps 1-5 and 7-11 of 12 (a metrics row and an evaluation every 6, one epoch of 16 batches) read nothing back;
    the row steps read the logged values, which shows the count sees what it looks for."""
    cfg = tiny_cfg(
        tmp_path,
        "task.data.generator.num_train=256",
        "task.protocol.max_steps=12",
        "task.protocol.val_check_interval=6",
        "trainer.enable_progress_bar=true",
    )
    reads = DeviceReads()
    waits = []
    monkeypatch.setattr(callbacks, "wait_for_device", lambda device: waits.append(reads.phase))

    class Phases(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            reads.phase = trainer.global_step + 1  # this step, until the next one starts

        def on_validation_start(self, trainer, pl_module):
            reads.phase = "evaluation"

    lra_module, datamodule, trainer = lra_trainer(cfg, tmp_path, Phases())
    assert trainer.log_every_n_steps == 6
    with fit.without_known_warnings(), reads:
        trainer.fit(lra_module, datamodule=datamodule)
    assert trainer.global_step == 12
    quiet = [step for step in range(1, 13) if step % 6]
    assert {step: reads.calls[step] for step in quiet if step in reads.calls} == {}
    assert [step for step in waits if step in quiet] == [1]  # the first window's start only
    assert any(call.startswith("item") for call in reads.calls[6]), reads.calls  # the metrics row's reads


def test_200_lightning_steps_compute_the_losses_of_a_plain_loop_of_the_step_to_the_bit(tmp_path):
    """The whole step as lra.train takes it (Lightning, the callbacks, logging every 50 steps) against a plain loop of
    the module's step (its training_loss, AdamW and OneCycleLR) on the same batches and seed: the same 200 losses, bit
    for bit, and the accuracies torchmetrics gives. (That step against the formula of the step before issue 42: the
    training tests of tests/lra/test_model_and_module.py.)"""
    cfg = tiny_cfg(
        tmp_path, "task.protocol.max_steps=200", "task.protocol.warmup_steps=20", "task.protocol.val_check_interval=100"
    )
    losses, batches = [], []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].detach().clone())
            batches.append({name: value.clone() for name, value in batch.items()})

    lra_module, datamodule, trainer = lra_trainer(cfg, tmp_path, Record())
    with fit.without_known_warnings():
        trainer.fit(lra_module, datamodule=datamodule)
    assert len(losses) == 200

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    reference = fit.build_module(cfg, "classification", None)
    protocol = cfg.task.protocol
    optimizer = torch.optim.AdamW(reference.parameters(), lr=protocol.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=protocol.lr, total_steps=200, pct_start=20 / 200, anneal_strategy="linear"
    )
    expected = []
    reference.train()
    for batch in batches:  # the batches Lightning trained on, in its order
        optimizer.zero_grad(set_to_none=True)
        loss, _ = reference.training_loss(batch)
        loss.backward()
        optimizer.step()
        schedule.step()
        expected.append(loss.detach())
    assert torch.equal(torch.stack(losses), torch.stack(expected))
    assert torch.stack(losses)[-20:].mean() < torch.stack(losses)[:20].mean()  # it learns: the comparison means something
    # batch_accuracy is torchmetrics' micro accuracy of the batch (checked here on the trained model's batches)
    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=10)
    for batch in batches[:3]:
        logits = lra_module(input_ids=batch["input_ids"])
        assert batch_accuracy(logits, batch["label"]) == accuracy(logits, batch["label"])


def test_the_accuracy_of_masked_prediction_counts_only_the_masked_tokens():
    logits = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    targets = torch.tensor([1, 1, -100, -100])
    assert batch_accuracy(logits, targets, ignore_index=-100) == 0.5
    assert batch_accuracy(logits, torch.full((4,), -100), ignore_index=-100) == 0.0
    metric = torchmetrics.Accuracy(task="multiclass", num_classes=2, ignore_index=-100)
    assert batch_accuracy(logits, targets, ignore_index=-100) == metric(logits, targets)


class FakeParameter:
    def __init__(self, device, floating=True):
        self.device = torch.device(device)
        self.floating = floating

    def is_floating_point(self):
        return self.floating


def test_adamw_is_fused_where_every_parameter_is_a_floating_cuda_tensor_and_torchs_default_elsewhere():
    assert adamw_implementation([FakeParameter("cuda:0"), FakeParameter("cuda:0")]) == {"fused": True}
    assert adamw_implementation([FakeParameter("cuda:0"), FakeParameter("cpu")]) == {}
    assert adamw_implementation([FakeParameter("cuda:0", floating=False)]) == {}
    lra_module = LRAClassificationModule("listops", 16, {"depth": 1}, {"name": "none"})
    optimizer = lra_module.configure_optimizers()["optimizer"]
    assert not optimizer.defaults["fused"]  # on the CPU: the per-parameter loop of every earlier CPU run


def run_steps(lra_module, steps, seed=0):
    """``steps`` training steps of the bench's TrainingStep (the module's own optimisation) on random ListOps batches."""
    from lra.bench.step import TrainingStep

    step = TrainingStep(lra_module, "32")
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        batch = {
            "input_ids": torch.randint(1, 10, (4, 16), generator=generator),
            "label": torch.randint(0, 10, (4,), generator=generator),
        }
        losses.append(step(batch).detach())
    return torch.stack(losses)


def test_fused_adamw_takes_the_default_steps_to_float_rounding_over_200_steps(monkeypatch):
    """What fused=True changes on a GPU, checked where torch has it too (its CPU kernel): the losses agree to rounding."""
    model = {"depth": 1, "dropout": 0.0}
    torch.manual_seed(0)
    default = run_steps(
        LRAClassificationModule("listops", 16, model, {"name": "none"}, lr=1e-3, warmup_steps=20, max_steps=200), 200
    )
    monkeypatch.setattr(module, "adamw_implementation", lambda parameters: {"fused": True})
    torch.manual_seed(0)
    fused_module = LRAClassificationModule("listops", 16, model, {"name": "none"}, lr=1e-3, warmup_steps=20, max_steps=200)
    fused = run_steps(fused_module, 200)
    assert fused_module.configure_optimizers()["optimizer"].defaults["fused"]
    torch.testing.assert_close(fused, default, rtol=1e-4, atol=1e-5)
    assert default[-20:].mean() < default[:20].mean()


def test_the_compile_mode_setting():
    assert module.compile_mode(None, None) is None
    assert module.compile_mode("reduce-overhead", "inductor") == "reduce-overhead"
    with pytest.raises(ValueError, match=r"trainer.compile_mode must be one of default, reduce-overhead"):
        module.compile_mode("fast", "inductor")
    with pytest.raises(ValueError, match=r"a mode of Inductor: it needs trainer.compile=true .*not 'aot_eager'"):
        module.compile_mode("reduce-overhead", "aot_eager")
    with pytest.raises(ValueError, match=r"it needs trainer.compile=true \(or inductor\), not no compilation"):
        module.compile_mode("reduce-overhead", None)
    cfg = config.compose(["trainer.compile=true", "trainer.compile_mode=reduce-overhead"])
    arguments, backend, mode = fit.trainer_arguments(cfg)
    assert (backend, mode) == ("inductor", "reduce-overhead")
    assert "compile_mode" not in arguments and "compile" not in arguments  # not Trainer arguments


@pytest.mark.slow
def test_a_reduce_overhead_compiled_step_computes_the_eager_losses_to_rounding_over_200_steps():
    """trainer.compile_mode=reduce-overhead: on a GPU Inductor's graphs replayed as CUDA graphs; on the CPU the same
    Inductor code without them. Without dropout (Inductor draws its own), 200 steps give the eager losses to rounding,
    and each step marks its start for the CUDA graphs."""
    model = {"depth": 2, "dropout": 0.0}
    settings = dict(lr=1e-3, warmup_steps=20, max_steps=200)
    torch.manual_seed(0)
    eager = run_steps(LRAClassificationModule("listops", 16, model, {"name": "none"}, **settings), 200)
    torch.manual_seed(0)
    compiled_module = LRAClassificationModule("listops", 16, model, {"name": "none"}, **settings)
    module.compile_model(compiled_module, "inductor", "reduce-overhead")
    assert compiled_module.marks_cuda_graph_steps
    compiled = run_steps(compiled_module, 200)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("device", "pinned"), [("cuda", True), ("cpu", False)])
def test_batches_are_pinned_for_a_gpu(device, pinned):
    data = LRADataModule("listops", 16, {}, 4)
    data.trainer = type("Trainer", (), {"strategy": type("Strategy", (), {"root_device": torch.device(device)})()})()
    assert data.on_gpu() is pinned


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
