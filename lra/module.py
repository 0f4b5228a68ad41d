"""LightningModules: the LRA classifier with its loss and accuracy, on the paper's optimiser and schedule.

A module saves the settings that define its model (task, sequence length, model and attention
configs) as hyperparameters, so ``LRAClassificationModule.load_from_checkpoint(path)`` rebuilds the
classifier from a checkpoint alone. :class:`LRAModule` holds what every objective over the LRA
encoder shares (those settings and the optimisation); a new objective subclasses it.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchmetrics

from .data.tasks import get_spec
from .model import AttentionConfig, ModelConfig, build_classifier


class LRAModule(pl.LightningModule):
    """The settings of an LRA model and the protocol's optimisation, for any training objective.

    The optimiser and schedule are the original code's: ``AdamW(lr, betas=(0.9, 0.999), eps=1e-6,
    weight_decay=0)`` and ``OneCycleLR(max_lr=lr, pct_start=warmup/max_steps,
    anneal_strategy="linear")`` stepped every update. Its PyTorch defaults are part of the
    protocol: the rate starts at lr/25, peaks at ``warmup_steps`` and decays linearly to lr/25e4,
    and ``cycle_momentum=True`` cycles Adam's beta1 0.95 -> 0.85 -> 0.95.

    Args:
        task: the LRA task (``lra.data.tasks.TASKS``): its vocabulary, classes and inputs.
        seq_len: the longest input, the length of the position embedding.
        model: a ``model`` config section (:class:`lra.model.ModelConfig`'s fields).
        attention: an ``attention`` config section, ``{"name": ..., "hparams": {...}}``.
    """

    def __init__(
        self,
        task: str,
        seq_len: int,
        model: dict[str, Any],
        attention: dict[str, Any],
        lr: float = 1e-4,
        warmup_steps: int = 1000,
        max_steps: int = 5000,
        weight_decay: float = 0.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if not 0 <= warmup_steps < max_steps or warmup_steps == 1:
            raise ValueError(
                f"need warmup_steps = 0 or 2 <= warmup_steps < max_steps (OneCycleLR divides by warmup_steps - 1), "
                f"got warmup_steps={warmup_steps}, max_steps={max_steps}"
            )
        self.save_hyperparameters(
            "task", "seq_len", "model", "attention", "lr", "warmup_steps", "max_steps", "weight_decay", "eps"
        )
        self.spec = get_spec(task)
        self.model_config = ModelConfig.from_dict(model)
        self.attention_config = AttentionConfig(**attention)

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = torch.optim.AdamW(self.parameters(), lr=hp.lr, betas=(0.9, 0.999), eps=hp.eps, weight_decay=hp.weight_decay)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=hp.lr,
            total_steps=hp.max_steps,
            pct_start=hp.warmup_steps / hp.max_steps,
            anneal_strategy="linear",
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class LRAClassificationModule(LRAModule):
    """Cross-entropy training of the task's classifier (:func:`lra.model.build_classifier`), with accuracy."""

    def __init__(self, task: str, seq_len: int, model: dict[str, Any], attention: dict[str, Any], **optimisation: Any):
        super().__init__(task, seq_len, model, attention, **optimisation)
        self.model = build_classifier(self.spec, seq_len, self.model_config, self.attention_config)
        num_classes = self.spec.num_classes
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**inputs)

    def _step(self, batch: dict[str, torch.Tensor], stage: str, accuracy: torchmetrics.Metric) -> torch.Tensor:
        # Every key but the label is a model input: input_ids, or input_ids_0 and input_ids_1.
        logits = self(**{name: value for name, value in batch.items() if name != "label"})
        loss = F.cross_entropy(logits.float(), batch["label"])
        accuracy(logits, batch["label"])
        on_step = stage == "train"
        # Epoch-level values are averaged over the processes of a distributed run.
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=not on_step, prog_bar=True, sync_dist=not on_step)
        self.log(f"{stage}/acc", accuracy, on_step=on_step, on_epoch=not on_step, prog_bar=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx):
        self._step(batch, "test", self.test_acc)
