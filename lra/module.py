"""LightningModules: the LRA classifier with its loss and accuracy, on the paper's optimiser and schedule.

A module saves the settings that define its model (task, sequence length, model and attention
configs) as hyperparameters, so ``LRAClassificationModule.load_from_checkpoint(path)`` rebuilds the
classifier from a checkpoint alone. :class:`LRAModule` holds what every objective over the LRA
encoder shares (those settings and the optimisation); a new objective subclasses it.

:func:`compile_model` compiles a module's training and evaluation steps with ``torch.compile`` in place
(``trainer.compile``), so its parameters and checkpoints keep their names.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn

from . import checkpoints
from .data.tasks import get_spec
from .model import AttentionConfig, ModelConfig, build_classifier, build_encoder
from .protocol import schedule_problem
from .results import model_and_hparams_with_current_names
from .steps import metrics_row_due, something_due_after

IGNORED = -100  # the label of a position the masked-prediction loss does not count (cross_entropy's ignore_index)
# The settings a pretrained encoder must share with the model it starts.
MODEL_DEFINING = ("task", "seq_len", "model", "attention")
DEFAULT_COMPILE_BACKEND = "inductor"  # what trainer.compile=true compiles with
#: What ``trainer.compile=auto`` compiles, per accelerator: the rows whose Table 3 ListOps cell under the paper's protocol
#: (5000 training steps of batch 32 at n = 2048 and 100 evaluations of 62 batches) was measured more than 10% faster
#: compiled. CPU: the 2-core EPYC, torch 2.13, every row eager and compiled in one run (results/step_cpu_compiled/,
#: results/README.md), hours per cell eager -> compiled: YOSO-E 43.3 -> 10.1, Reformer 7.9 -> 5.0; none's two
#: measurements disagreed (its cell 25% faster compiled on random batches, 2% with the data loader's); Nystromformer,
#: YOSO-32, YOSO-C-16 and *YOSO-C-16 were 12-53% slower compiled, the rest within 10%. Longformer was 15.0 -> 13.2
#: before it ran on the fused kernel; on it, 2.10 s a step eager against 2.34 compiled (results/step_cpu_longformer/),
#: so it stays eager. Nothing is measured on a GPU yet, so there every row stays eager.
FASTER_COMPILED = {"cpu": frozenset({"reformer", "yoso_e"})}
# trainer.compile_mode: Inductor's modes (torch.compile's mode); reduce-overhead replays the compiled graphs as CUDA graphs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class Diverged(RuntimeError):
    """Training's loss or gradients became non-finite: the run stops there and is recorded as diverged, never as a
    result."""

    def __init__(self, step: int, last_finite_loss: float | None) -> None:
        last = f"the last finite loss {last_finite_loss:.4g}" if last_finite_loss is not None else "no finite loss before it"
        super().__init__(
            f"training diverged: the loss or its gradients are not finite from step {step} ({last}); no checkpoint holds "
            "a state from "
            "after it. Try a lower task.protocol.lr or a longer task.protocol.warmup_steps, or trainer.precision=32 if "
            "it ran in bf16"
        )
        self.step = step


class EvaluationNotFinite(Diverged):
    """An evaluation's loss is not finite (the model's outputs are not, though training's loss is): its accuracy
    would be an argmax over NaN, not a result. The run stops and is recorded as diverged."""

    def __init__(self, split: str, loss: float, step: int) -> None:
        RuntimeError.__init__(
            self,
            f"the {'validation' if split == 'val' else split} loss is not finite ({loss}) after step {step}: the model's "
            "outputs are not, so no accuracy of it is a result. Try trainer.precision=32 if it ran in bf16, or a lower "
            "task.protocol.lr",
        )
        self.step = step


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
        skip_non_finite_steps: bool = False,
    ) -> None:
        super().__init__()
        if problem := schedule_problem(warmup_steps, max_steps):
            raise ValueError(problem)
        self.save_hyperparameters(
            "task", "seq_len", "model", "attention", "lr", "warmup_steps", "max_steps", "weight_decay", "eps",
            "skip_non_finite_steps",
        )  # fmt: skip
        self.spec = get_spec(task)
        self.model_config = ModelConfig.from_dict(model)
        self.attention_config = AttentionConfig(**attention)
        # Kept on the device, so that watching for a non-finite loss costs no wait for it at every step: the first
        # step whose loss was not finite (-1: none yet) and the latest finite loss; read where the host waits anyway.
        self._first_nonfinite_step: torch.Tensor | None = None
        self._last_finite_loss: torch.Tensor | None = None
        # With skip_non_finite_steps: the steps skipped so far (kept in checkpoints) and the loss of the step under way.
        self.skipped_steps = 0
        self._step_loss: torch.Tensor | None = None
        self._test_correct: list[torch.Tensor] = []  # per test batch, where records_test_samples: (b,) bools

    # Whether a test notes which samples the model classified correctly (test_correct): a classifier's, one label a sample.
    records_test_samples = False

    # Set by compile_model when the steps replay CUDA graphs: each step then marks its start for them.
    marks_cuda_graph_steps = False

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> LRAModule:
        """Lightning's, the checkpoint read through :mod:`lra.checkpoints` (its recorded digest checked, then unpickled
        with ``weights_only=True``)."""
        data = checkpoints.read_bytes(Path(checkpoint_path))
        kwargs.setdefault("map_location", "cpu")
        return super().load_from_checkpoint(io.BytesIO(data), *args, weights_only=True, **kwargs)

    def configure_optimizers(self):
        hp = self.hparams
        parameters = list(self.parameters())
        optimizer = torch.optim.AdamW(
            parameters,
            lr=hp.lr,
            betas=(0.9, 0.999),
            eps=hp.eps,
            weight_decay=hp.weight_decay,
            **adamw_implementation(parameters),
        )
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=hp.lr,
            total_steps=hp.max_steps,
            pct_start=hp.warmup_steps / hp.max_steps,
            anneal_strategy="linear",
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def add_accuracies(self, num_classes: int, ignore_index: int | None = None) -> None:
        """The evaluations' accuracy metrics (``val_acc``, ``test_acc``), accumulated on the device over an evaluation.

        A training step's accuracy is its batch's alone (:func:`batch_accuracy`), the same number torchmetrics' forward
        gave, without the metric's state kept, reset and merged around it (some forty small operations a step).
        """
        self.accuracy_ignore_index = ignore_index
        for split in ("val", "test"):
            accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes, ignore_index=ignore_index)
            setattr(self, f"{split}_acc", accuracy)

    def loss_and_predictions(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The objective: ``(loss, logits, targets)`` of a batch, logits and targets as the accuracy reads them."""
        raise NotImplementedError

    def network(self) -> nn.Module:
        """The module whose call is the model's forward pass: this one's ``forward``."""
        return self

    def training_outputs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, accuracy)`` of a training batch: the forward pass, the loss and the batch's accuracy, which
        :func:`compile_model` compiles into one graph (with the backward through AOTAutograd)."""
        loss, logits, targets = self.loss_and_predictions(batch)
        return loss, batch_accuracy(logits.detach(), targets, self.accuracy_ignore_index)

    def evaluation_outputs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, logits, targets)`` of an evaluation batch, which :func:`compile_model` compiles into one graph of its
        own (no autograd, no dropout)."""
        return self.loss_and_predictions(batch)

    def training_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A training step's computation: ``(loss, accuracy)`` of the batch, both tensors on the device (nothing waits
        for it: see ``training_step``). ``lra.bench step`` times this step."""
        if self.marks_cuda_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        return self.training_outputs(batch)

    def evaluation_loss(self, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        """An evaluation batch's loss, its predictions added to the split's accuracy (on the device, read at the end)."""
        if self.marks_cuda_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        loss, logits, targets = self.evaluation_outputs(batch)
        getattr(self, f"{split}_acc").update(logits, targets)
        if split == "test" and self.records_test_samples:
            self._test_correct.append(logits.argmax(-1) == targets)  # (b,): the accuracy's argmax, kept on the device
        return loss

    def test_correct(self) -> str | None:
        """Which samples the latest test classified correctly, in the test set's order: ``"1"`` correct, ``"0"`` not
        (the run record's ``test_correct``); None for a module whose test does not note them."""
        if not self.records_test_samples or not self._test_correct:
            return None
        return "".join("1" if correct else "0" for correct in torch.cat(self._test_correct).tolist())

    def training_step(self, batch, batch_idx):
        loss, accuracy = self.training_loss(batch)
        if self.hparams.skip_non_finite_steps:
            self._step_loss = loss.detach()  # checked with the gradients, before the update (on_before_optimizer_step)
        else:
            self.watch_for_divergence(loss, self.global_step)
        # Logged only at the steps that write a metrics row (trainer.log_every_n_steps), where the logger reads them (a
        # wait for the device). Not as prog_bar values, which Lightning reads at every batch's end while they are
        # current: lra.callbacks.StepProgressBar shows them, read at those same steps.
        if metrics_row_due(self._trainer):
            self.log("train/loss", loss, on_step=True, on_epoch=False)
            self.log("train/acc", accuracy, on_step=True, on_epoch=False)
        return loss

    def watch_for_divergence(self, loss: torch.Tensor, step: int) -> None:
        """Note, on the device, the first step whose loss is not finite and the latest finite loss."""
        if self._first_nonfinite_step is None or self._first_nonfinite_step.device != loss.device:
            self._first_nonfinite_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._last_finite_loss = torch.full((), math.nan, device=loss.device)
        finite = torch.isfinite(loss.detach())
        self.note_non_finite(finite, step)
        self._last_finite_loss = torch.where(finite, loss.detach().float(), self._last_finite_loss)

    def note_non_finite(self, finite: torch.Tensor, step: int) -> None:
        """Note ``step`` on the device as the first non-finite one unless ``finite`` or an earlier step was."""
        first_time = ~finite & (self._first_nonfinite_step < 0)
        self._first_nonfinite_step = torch.where(first_time, step, self._first_nonfinite_step)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients that are not finite where the loss is (an overflow in the backward) diverge the run at this step
        as a non-finite loss does: noted on the device, checked where the host waits anyway.

        With ``skip_non_finite_steps`` (a protocol's opt-in), the update of a step whose loss or gradients are not
        finite is dropped and counted instead, as mixed-precision scalers do: every gradient is set to None, and AdamW
        leaves each parameter and its moments as they were. A wait for the device at every step, paid only by a
        protocol that opts in."""
        gradients = [parameter.grad for parameter in self.parameters() if parameter.grad is not None]
        if not self.hparams.skip_non_finite_steps:
            # Under float16's loss scaling an inf gradient is the scaler's to handle (it skips the step, lowers the scale).
            scaled = getattr(getattr(self._trainer, "precision_plugin", None), "scaler", None) is not None
            if gradients and self._first_nonfinite_step is not None and not scaled:
                self.note_non_finite(torch.isfinite(largest_magnitude(gradients)), self.global_step)
            return
        if not bool(torch.stack([torch.isfinite(t).all() for t in (self._step_loss, *gradients)]).all()):
            optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["skipped_non_finite_steps"] = self.skipped_steps  # a resumed run goes on counting

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = checkpoint.get("skipped_non_finite_steps", 0)

    def check_divergence(self) -> None:
        """Raise :class:`Diverged` if a step's loss or gradients were not finite (a wait for the device: call it where one
        is due)."""
        if self._first_nonfinite_step is None or (step := int(self._first_nonfinite_step)) < 0:
            return
        last = float(self._last_finite_loss)
        raise Diverged(step, None if math.isnan(last) else last)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Before anything that reads the state (an evaluation, its checkpoints, a metrics row), and so never into
        # a checkpoint; at the other steps the device is not waited for.
        if self._trainer is None or something_due_after(self._trainer):
            self.check_divergence()

    def on_train_end(self) -> None:
        self.check_divergence()  # the steps after the last check: the run ends without a result

    def on_validation_epoch_end(self) -> None:
        self.check_evaluation("val")

    def on_test_epoch_start(self) -> None:
        self._test_correct = []

    def on_test_epoch_end(self) -> None:
        self.check_evaluation("test")

    def check_evaluation(self, split: str) -> None:
        """Raise :class:`EvaluationNotFinite` where the evaluation just ended has a loss that is not finite."""
        loss = self._trainer.callback_metrics.get(f"{split}/loss") if self._trainer is not None else None
        if loss is not None and not torch.isfinite(loss).all():
            raise EvaluationNotFinite(split, float(loss), self.global_step)

    def _evaluation_step(self, batch: dict[str, torch.Tensor], split: str) -> None:
        loss = self.evaluation_loss(batch, split)
        # Averaged over the evaluation's batches on the device, and over the processes of a distributed run.
        self.log(f"{split}/loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log(f"{split}/acc", getattr(self, f"{split}_acc"), on_step=False, on_epoch=True, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        self._evaluation_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluation_step(batch, "test")


class LRAClassificationModule(LRAModule):
    """Cross-entropy training of the task's classifier (:func:`lra.model.build_classifier`), with accuracy."""

    records_test_samples = True

    def __init__(self, task: str, seq_len: int, model: dict[str, Any], attention: dict[str, Any], **optimisation: Any):
        super().__init__(task, seq_len, model, attention, **optimisation)
        self.model = build_classifier(self.spec, seq_len, self.model_config, self.attention_config)
        self.add_accuracies(self.spec.num_classes)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**inputs)

    def network(self) -> nn.Module:
        return self.model

    def loss_and_predictions(self, batch):
        # Every key but the label is a model input: input_ids, or input_ids_0 and input_ids_1.
        logits = self(**{name: value for name, value in batch.items() if name != "label"})  # (b, classes)
        return classification_loss(logits, batch["label"]), logits, batch["label"]


def compile_backend(setting: bool | str, row: str | None = None, accelerator: str | None = None) -> str | None:
    """The ``torch.compile`` backend that a ``trainer.compile`` setting asks for, None for no compilation.

    ``true`` is :data:`DEFAULT_COMPILE_BACKEND`; a string names a backend (``aot_eager`` traces and
    differentiates without generating code: a cheap check that a model compiles); ``auto`` is
    :data:`DEFAULT_COMPILE_BACKEND` for the table ``row`` where it was measured faster on ``accelerator``
    (:data:`FASTER_COMPILED`), else no compilation.
    """
    if isinstance(setting, bool):
        return DEFAULT_COMPILE_BACKEND if setting else None
    if setting == "auto":
        return DEFAULT_COMPILE_BACKEND if row in FASTER_COMPILED.get(str(accelerator), ()) else None
    backends = torch.compiler.list_backends(exclude_tags=())
    if isinstance(setting, str) and setting in backends:
        return setting
    raise ValueError(
        f"trainer.compile must be true (torch.compile with {DEFAULT_COMPILE_BACKEND}), false, auto (where measured "
        "faster: lra.module.FASTER_COMPILED), or the name of a "
        f"torch.compile backend (inductor, aot_eager, eager, ...: torch.compiler.list_backends(exclude_tags=()) "
        f"lists them); got {setting!r}"
    )


def largest_magnitude(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest ``|x|`` of ``tensors`` together (their inf-norm), on their device, in a few fused kernels where torch
    has them: infinite or NaN exactly where an entry is, never by overflow (a 2-norm squares large finite entries)."""
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(tensors, norm_type=math.inf)
    return torch.stack([torch.linalg.vector_norm(t, ord=math.inf) for t in tensors]).max()


def compile_mode(setting: str | None, backend: str | None) -> str | None:
    """The Inductor mode a ``trainer.compile_mode`` setting asks for (None: torch.compile's default), checked against
    the backend it goes with: a mode is Inductor's, so it needs ``trainer.compile=true`` (or ``inductor``)."""
    if setting is None:
        return None
    if setting not in COMPILE_MODES:
        raise ValueError(f"trainer.compile_mode must be one of {', '.join(COMPILE_MODES)} (or null), got {setting!r}")
    if backend != DEFAULT_COMPILE_BACKEND:
        raise ValueError(
            f"trainer.compile_mode={setting} is a mode of Inductor: it needs trainer.compile=true (or inductor), "
            f"not {'no compilation' if backend is None else repr(backend)}"
        )
    return setting


def compile_model(module: LRAModule, backend: str | Callable = DEFAULT_COMPILE_BACKEND, mode: str | None = None) -> None:
    """Compile ``module``'s steps with ``torch.compile`` in place, with ``backend`` (a name, or a backend function
    as ``torch.compile`` takes it) in Inductor's ``mode``.

    Each step's computation is compiled whole: the training step's forward pass, loss and batch accuracy
    (``training_outputs``, its backward through AOTAutograd) and the evaluation step's forward pass and loss
    (``evaluation_outputs``), each one graph. What stays eager is the accuracy metric's update (torchmetrics'
    state), the optimizer step and Lightning's loop.

    ``mode="reduce-overhead"`` replays the compiled graphs as CUDA graphs on a GPU: one launch each instead of
    one per kernel, which is most of a small model's step (on a CPU it is Inductor's default). Each step then marks
    its start (``torch.compiler.cudagraph_mark_step_begin``) so that a graph's outputs are not taken for the previous
    step's; Lightning keeps copies of a step's loss and logged values, which the next replay does not overwrite.

    The methods are compiled on the instance and the model is not wrapped, so the state dict and
    checkpoints keep their keys (no ``_orig_mod.``) and a checkpoint resumes compiled or not. Dynamo
    compiles one graph for training and one for evaluation (evaluating under ``torch.inference_mode``
    would recompile the latter, so :mod:`lra.fit` then tests under ``no_grad`` as it validates) and, at
    the test set's last partial batch, the evaluation's once more with a dynamic batch size; padding
    never recompiles, as batches have the task's fixed length. The batch size is not marked dynamic
    from the start: every training and validation batch is full (they drop the last partial one), and
    a static size compiles the better kernels for all of them.
    """
    options = {"backend": backend, "mode": compile_mode(mode, backend)}
    module.training_outputs = backward_as_eager(torch.compile(module.training_outputs, **options))
    module.evaluation_outputs = torch.compile(module.evaluation_outputs, **options)  # no backward to trace
    module.marks_cuda_graph_steps = mode in CUDA_GRAPH_MODES


def backward_as_eager(compiled: Callable) -> Callable:
    """``compiled``, tracing its backward without the forward's autocast, as eager runs a backward.

    AOTAutograd traces the backward when the forward first runs, and by default
    (``torch._functorch.config.backward_pass_autocast = "same_as_forward"``) under the autocast the forward ran in.
    A bf16-mixed step enters autocast outside the compiled region, so the backward of an attention the paper protocol
    keeps in float32 (autocast off inside) would run its products in bfloat16: Nystromformer's and Linformer's
    compiled steps then part from eager's (tests/lra/test_compile_rows.py). Where torch has the setting, it is "off"
    while the step runs, which is eager's semantics; a torch without it keeps its own.
    """
    config = torch._functorch.config
    if not hasattr(config, "backward_pass_autocast"):
        return compiled

    @functools.wraps(compiled)
    def step(*args: Any, **kwargs: Any) -> Any:
        with config.patch(backward_pass_autocast="off"):
            return compiled(*args, **kwargs)

    return step


def adamw_implementation(parameters: list[torch.Tensor]) -> dict[str, Any]:
    """AdamW's implementation option for ``parameters``: ``fused=True`` where every one is a floating CUDA tensor (the
    whole update in one kernel launch instead of a dozen foreach launches, the same update to float rounding), else
    torch's default (foreach on a GPU; on a CPU the per-parameter loop every earlier CPU run used, so its numbers stay).
    Not fused on a CPU: torch's CPU kernel opens a parallel region per parameter tensor, 39 a step of the paper's
    ListOps model against the loop's 20 (foreach: 20), each a scheduler slice on a loaded machine (issue 42)."""
    if parameters and all(p.device.type == "cuda" and p.is_floating_point() for p in parameters):
        return {"fused": True}
    return {}


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets)``: the batch's mean cross entropy of ``logits`` (batch, classes) in
    float32. On a CPU as ``logsumexp(logits) - logits[target]``, the same number to float rounding from small serial
    operators: ``log_softmax``, ``nll_loss`` and their backwards are three parallel regions of both threads however small
    the batch, each a scheduler slice on a loaded machine (issue 42). On a GPU, ``F.cross_entropy``'s fewer kernels."""
    logits = logits.float()
    if logits.device.type != "cpu":
        return F.cross_entropy(logits, targets)
    return (logits.logsumexp(-1) - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def batch_accuracy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int | None = None) -> torch.Tensor:
    """The share of ``targets`` that ``logits`` (..., classes) predict (argmax), as a tensor on their device: the
    micro accuracy torchmetrics computes, without its state. Targets equal to ``ignore_index`` are not counted (a batch
    with none counted has accuracy 0)."""
    correct = logits.argmax(dim=-1) == targets
    if ignore_index is None:
        return correct.float().mean()
    counted = targets != ignore_index
    return (correct & counted).sum().float() / counted.sum().clamp(min=1).float()


def mask_tokens(input_ids: torch.Tensor, mask_rate: float, mask_token: int, generator: torch.Generator | None = None):
    """BERT-style masking of real tokens: ``(masked_ids, labels)``, both ``(batch, seq)``.

    Each real token (id != 0) is chosen with probability ``mask_rate`` and replaced by
    ``mask_token``; ``labels`` holds the original id at chosen positions and :data:`IGNORED`
    everywhere else. Padding (id 0) is never chosen, so it is neither masked nor counted.
    """
    real = input_ids != 0  # (b, n)
    draws = torch.rand(input_ids.shape, device=input_ids.device, generator=generator)  # (b, n)
    chosen = real & (draws < mask_rate)
    masked_ids = torch.where(chosen, torch.full_like(input_ids, mask_token), input_ids)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORED))
    return masked_ids, labels


def masked_prediction_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross entropy averaged over the masked real tokens only: ``logits`` (b, n, vocab), ``labels`` (b, n).

    A batch without a masked token (possible for very short inputs) has loss 0 and a zero gradient. The sum over the
    masked tokens is divided by their count on the device (what ``reduction="mean"`` computes), so no step waits to
    learn whether a batch has any.
    """
    total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORED, reduction="sum")
    return total / (labels != IGNORED).sum().clamp(min=1)


class LRAMaskedLMModule(LRAModule):
    """Self-pretraining by bidirectional masked prediction of the task's own input tokens (MLM).

    The encoder is the task's (:func:`lra.model.build_encoder`) with one more token id, the mask
    token, after the task's vocabulary. Each real token of an input is masked with probability
    ``mask_rate`` (:func:`mask_tokens`); a linear head over every position's features predicts the
    original ids, and the loss is the cross entropy over the masked real tokens only
    (:func:`masked_prediction_loss`). Image and Pathfinder pixels are tokens like any other; each
    document of a retrieval pair is masked and predicted on its own. ``acc`` is the accuracy on
    masked tokens. :func:`load_pretrained_encoder` starts a classifier from this encoder.
    """

    def __init__(
        self, task: str, seq_len: int, model: dict[str, Any], attention: dict[str, Any], mask_rate: float = 0.15, **optimisation
    ):
        super().__init__(task, seq_len, model, attention, **optimisation)
        if not 0 < mask_rate < 1:
            raise ValueError(f"pretrain.mask_rate must be between 0 and 1, got {mask_rate}")
        self.hparams["mask_rate"] = mask_rate
        self.mask_token = self.spec.vocab_size
        self.encoder = build_encoder(self.spec, seq_len, self.model_config, self.attention_config, extra_tokens=1)
        self.head = nn.Linear(self.model_config.dim, self.spec.vocab_size)
        self.add_accuracies(self.spec.vocab_size, ignore_index=IGNORED)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.token_features(input_ids))  # (b, n, vocab)

    def loss_and_predictions(self, batch):
        # The task's token arrays: input_ids, or both documents of a pair, predicted alike.
        documents = [batch[name] for name in self.spec.inputs]
        input_ids = torch.cat(documents) if len(documents) > 1 else documents[0]  # (b * inputs, n)
        masked_ids, labels = mask_tokens(input_ids, self.hparams.mask_rate, self.mask_token)
        logits = self(masked_ids)  # (b * inputs, n, vocab)
        return masked_prediction_loss(logits, labels), logits.flatten(0, 1), labels.flatten()


def load_pretrained_encoder(module: LRAClassificationModule, checkpoint: Path) -> None:
    """Start ``module``'s encoder from a pretraining checkpoint (an :class:`LRAMaskedLMModule`'s); the head stays fresh.

    The checkpoint must come from the same task, length, model and attention; anything else is one
    error naming what differs. The pretraining's mask-token embedding is dropped.
    """
    saved = checkpoints.read(checkpoint)
    pretrained_settings = dict(saved.get("hyper_parameters", {}))
    if "model" in pretrained_settings and "attention" in pretrained_settings:  # a checkpoint of before a rename: today's names
        attention = pretrained_settings["attention"]
        model, hparams = model_and_hparams_with_current_names(
            pretrained_settings["model"], attention.get("name"), attention.get("hparams")
        )
        pretrained_settings.update(model=model, attention={**attention, "hparams": hparams})
    differs = [key for key in MODEL_DEFINING if pretrained_settings.get(key) != module.hparams[key]]
    if differs:
        details = "; ".join(
            f"{key}: checkpoint {pretrained_settings.get(key)!r}, this run {module.hparams[key]!r}" for key in differs
        )
        raise ValueError(
            f"the pretrained checkpoint {checkpoint} is of another model ({details}); "
            "pretrain this configuration (pretrain=mlm with the same task, model and attention) and start from that"
        )
    prefix = "encoder."
    state = {key[len(prefix) :]: value for key, value in saved["state_dict"].items() if key.startswith(prefix)}
    encoder = module.model.encoder
    state["token_embedding.weight"] = state["token_embedding.weight"][: encoder.token_embedding.num_embeddings]
    encoder.load_state_dict(state)
