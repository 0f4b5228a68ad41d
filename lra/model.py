"""The LRA encoder of the Nystromformer and YOSO papers' Long Range Arena experiments.

Token and learned absolute position embeddings (both N(0, 0.02)), dropout, then pre-LayerNorm
blocks ``x + Dropout(Attention(LN(x)))`` and ``x + MLP(LN(x))`` with a GELU MLP, a final LayerNorm
whose output is zeroed at padded positions, mean pooling, and a two-layer ReLU classifier head.
The paper's sizes are the defaults: 2 layers, width 64, 2 heads of 32, FFN 128, dropout 0.1.
``positions="rotary"`` replaces the learned position embedding by rotary positions on every
layer's queries and keys (:mod:`attention_zoo.rotary`), before the core attention.

Mean pooling follows the original code: the sum over real tokens divided by the padded length
(``mean`` over every position after padded positions were zeroed), not a masked mean.

The step's operators (issue 42): on a CPU every large operator is a parallel region of both threads, and on a loaded
machine each region waits for a scheduler slice, so a step's time follows their number. There, dropout and the residual
sum after it are one operator each way (:func:`dropout_add`: a fused kernel, or the same draws and numbers as
``nn.Dropout`` and ``+``) and the position table's gradient is a serial matrix-vector product (:func:`add_positions`);
everywhere, the pooling is one batched product (:func:`masked_mean`) and the position table is added whole at full
length.

Retrieval uses the paper's dual encoder: both documents go through the same encoder separately (no
attention between them) and the head reads ``[u, v, u * v, u - v]`` of their pooled features u, v.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

import yoso_cuda
from attention_zoo import MultiHeadAttention, check_fields
from yoso_cuda import has_kernel

from .data.tasks import TaskSpec

POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class ModelConfig:
    """The encoder's and the head's sizes (``conf/model/<name>.yaml``); the defaults are the paper's LRA model."""

    dim: int = 64
    depth: int = 2
    num_heads: int = 2
    head_dim: int = 32
    ffn_dim: int = 128
    dropout: float = 0.1
    head_hidden_dim: int = 128
    attention_in_float32: bool = True  # every attention in float32 under mixed precision, as the original code
    positions: str = "learned"  # learned absolute embeddings (the paper's), or rotary on queries and keys
    RENAMED: ClassVar[dict[str, str]] = {"attention_in_fp32": "attention_in_float32"}  # one name for the float32 policy

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"model.positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """The config of ``values`` (a ``model`` section), checked by the rule of every config (``check_fields``)."""
        fields = ", ".join(field.name for field in dataclasses.fields(cls))
        return cls(
            **check_fields(
                cls,
                values,
                unknown=lambda keys: f"unknown model setting(s) {keys}; the model has {fields}",
                invalid=lambda key, kind, value: f"model.{key} must be {kind}, got {value!r}",
                renamed=lambda old, new: f"model.{old} is now called model.{new}; use model.{new}",
            )
        )


@dataclass(frozen=True)
class AttentionConfig:
    """The core attention of every layer: a registered attention or preset and its hyperparameters (``attention``)."""

    name: str = "softmax"
    hparams: dict[str, Any] = dataclasses.field(default_factory=dict)


class EncoderBlock(nn.Module):
    def __init__(self, seq_len: int, model: ModelConfig, attention: AttentionConfig) -> None:
        super().__init__()
        dim, dropout = model.dim, model.dropout
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = MultiHeadAttention(
            dim,
            model.num_heads,
            attention.name,
            seq_len=seq_len,
            head_dim=model.head_dim,
            attention_in_float32=model.attention_in_float32,
            rotary=model.positions == "rotary",
            **attention.hparams,
        )
        self.attention_dropout = nn.Dropout(dropout)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, model.ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(model.ffn_dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = dropout_add(self.attention_dropout, self.attention(self.attention_norm(x), mask), x)
        # self.mlp, its layers called one by one so that its last dropout and the residual sum are one operator.
        linear_in, activation, inner_dropout, linear_out, outer_dropout = self.mlp
        hidden = dropout_add(inner_dropout, activation(linear_in(self.mlp_norm(x))))
        return dropout_add(outer_dropout, linear_out(hidden), x)


class LRAEncoder(nn.Module):
    """Token ids ``(batch, seq)`` -> pooled features ``(batch, dim)``; id 0 is padding.

    :meth:`token_features` gives the features of every position before pooling, for a head that reads
    tokens (a pretraining objective over the same encoder).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        model: ModelConfig = ModelConfig(),
        attention: AttentionConfig = AttentionConfig(),
    ) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.dim = model.dim
        self.token_embedding = nn.Embedding(vocab_size, model.dim)
        # Rotary positions live in the attention layers instead.
        self.position_embedding = nn.Embedding(seq_len, model.dim) if model.positions == "learned" else None
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.position_embedding is not None:
            nn.init.normal_(self.position_embedding.weight, std=0.02)
        self.embedding_dropout = nn.Dropout(model.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(seq_len, model, attention) for _ in range(model.depth))
        self.final_norm = nn.LayerNorm(model.dim)

    def normed_features(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features, mask)``: ``(batch, seq, dim)`` features after the final LayerNorm at every position (padded
        ones too, where they hold anything), and ``(batch, seq)``, True at real tokens."""
        if input_ids.dim() != 2 or input_ids.shape[1] > self.seq_len:
            raise ValueError(f"input_ids must be (batch, seq) with seq <= {self.seq_len}, got shape {tuple(input_ids.shape)}")
        mask = input_ids != 0  # (b, n)
        x = self.token_embedding(input_ids)  # (b, n, dim)
        if self.position_embedding is not None:
            # The table's first n rows: what position_embedding(arange(n)) gathers, to the bit, without building the
            # index tensor each step or the gather's backward (a sort and a scatter on a GPU); the whole table at full
            # length, where a slice's backward would write a zero table and copy the gradient into it.
            table = self.position_embedding.weight
            x = add_positions(x, table if input_ids.shape[1] == table.shape[0] else table[: input_ids.shape[1]])
        x = dropout_add(self.embedding_dropout, x)
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x), mask

    def token_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, dim)`` features after the final LayerNorm, zero at padded positions (selected, so that whatever
        a padded position held, a NaN included, is not kept)."""
        features, mask = self.normed_features(input_ids)
        return features.masked_fill(~mask[..., None], 0.0)  # (b, n, dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return masked_mean(*self.normed_features(input_ids))  # (b, dim)


def masked_mean(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(batch, dim)``: the mean over every position of ``features`` (batch, seq, dim) zeroed where ``mask`` (batch, seq)
    is False, i.e. the sum over real tokens divided by the padded length, as ``(features * mask[..., None]).mean(1)``
    to float rounding on finite features. The padded positions are selected out, not multiplied by zero, so nothing
    they hold (0 * NaN is NaN) reaches the mean. The sum is one batched product (batch, 1, seq) @ (batch, seq, dim)
    each way, in the features' dtype (autocast off: under bf16 autocast the product would round the float32 features
    to bfloat16)."""
    with torch.autocast(features.device.type, enabled=False):
        real_features = features.masked_fill(~mask[..., None], 0.0)  # (b, n, dim)
        ones = features.new_ones(features.shape[0], 1, features.shape[1])  # (b, 1, n)
        return torch.bmm(ones, real_features).squeeze(1) / features.shape[1]  # (b, dim)


class _AddPositions(torch.autograd.Function):
    """``x + positions``, ``x`` (batch, seq, dim), ``positions`` (seq, dim); the positions' gradient, the sum over the
    batch, as one matrix-vector product (serial in MKL, where ``sum(0)`` over a (32, 2048, 64) batch is two parallel
    regions of both threads, and 2.5 times as long idle)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + positions

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_positions = None
        if ctx.needs_input_grad[1]:
            grad_positions = (grad.new_ones(1, grad.shape[0]) @ grad.reshape(grad.shape[0], -1)).view(grad.shape[1:])
        return grad if ctx.needs_input_grad[0] else None, grad_positions


def add_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x + positions`` (broadcast over the batch); on a CPU in float32, with :class:`_AddPositions`' backward."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or positions.dtype != torch.float32:
        return x + positions
    return _AddPositions.apply(x, positions)


class _KeptScaledSum(torch.autograd.Function):
    """``residual + y * keep * scale`` (no ``residual``: 0), ``keep`` 0 or 1: one operator forward, one backward."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, keep: torch.Tensor, scale: float, residual: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.addcmul(y.new_zeros(()) if residual is None else residual, y, keep, value=scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        grad_y = torch.addcmul(grad.new_zeros(()), grad, keep, value=ctx.scale) if ctx.needs_input_grad[0] else None
        return grad_y, None, None, grad if ctx.needs_input_grad[3] else None


def dropout_add(dropout: nn.Dropout, y: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(y)``, plus ``residual`` where given, in one operator each way on a CPU in float32 (there ``F.dropout``
    takes two forward, the noise's division and the product, and the sum a third).

    Where YOSO's CPU kernels are built, ``yoso_cuda.dropout_add``: the mask from a counter-based hash, made again in
    the backward, at a twentieth of the time of ``F.dropout``'s ``bernoulli_`` draw (results/step_cpu_dropout/);
    dropout's distribution, not its random stream. Otherwise what ``nn.Dropout`` and ``+`` compute from the same
    draws: ``F.dropout`` on a CPU draws
    ``keep = bernoulli(1 - p)`` into a tensor like ``y``, divides it by ``1 - p`` and multiplies; here the same draw is
    scaled inside the product, ``y * keep * (1 / (1 - p))`` (float32 rounds that reciprocal to the noise's value, so
    the product is the same number), and the residual is added in the same pass. Elsewhere the plain modules: without
    dropout (evaluation, p = 0), at p = 1, outside float32 (under bf16 autocast the noise is a bf16 number), and on a
    GPU, where ``F.dropout`` is one fused kernel with its own random stream.
    """
    p = dropout.p
    if not dropout.training or p == 0:
        return y if residual is None else residual + y
    float32 = y.dtype == torch.float32 and (residual is None or residual.dtype == torch.float32)
    if not (0 < p < 1 and float32 and y.device.type == "cpu"):
        dropped = dropout(y)
        return dropped if residual is None else residual + dropped
    if has_kernel(y.device):
        return yoso_cuda.dropout_add(y, residual, p)
    keep = torch.empty_like(y).bernoulli_(1 - p)  # F.dropout's draw: same generator, same order
    return _KeptScaledSum.apply(y, keep, 1 / (1 - p), residual)


class LRAClassifier(nn.Module):
    """The encoder with the two-layer classifier head: token ids -> class logits."""

    def __init__(self, num_classes: int, encoder: LRAEncoder, hidden_dim: int = 128) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(nn.Linear(encoder.dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_classes))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids))  # (b, num_classes)


class LRADualClassifier(nn.Module):
    """Two documents -> class logits: one shared encoder, the head on ``[u, v, u * v, u - v]``."""

    def __init__(self, num_classes: int, encoder: LRAEncoder, hidden_dim: int = 128) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(nn.Linear(4 * encoder.dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, num_classes))

    def forward(self, input_ids_0: torch.Tensor, input_ids_1: torch.Tensor) -> torch.Tensor:
        if input_ids_0.shape != input_ids_1.shape:
            raise ValueError(
                f"both documents must have the same (batch, seq) shape, got {tuple(input_ids_0.shape)} "
                f"and {tuple(input_ids_1.shape)}"
            )
        # Two passes, as the original: stacking both documents into one batch would change
        # attentions whose statistics span the batch (the table's Nystromformer pinv init).
        u, v = self.encoder(input_ids_0), self.encoder(input_ids_1)  # (b, dim) each
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))  # (b, num_classes)


def build_encoder(
    spec: TaskSpec, seq_len: int, model: ModelConfig, attention: AttentionConfig, extra_tokens: int = 0
) -> LRAEncoder:
    """The encoder of ``spec``'s tokens at length ``seq_len``; what every model of a task shares.

    ``extra_tokens`` ids after the task's vocabulary are for a pretraining objective (a mask token).
    """
    return LRAEncoder(spec.vocab_size + extra_tokens, seq_len, model, attention)


def build_classifier(
    spec: TaskSpec, seq_len: int, model: ModelConfig, attention: AttentionConfig
) -> LRAClassifier | LRADualClassifier:
    """The classifier of ``spec``: the dual encoder for a task of document pairs (retrieval), else the single one.

    The one place a model is built: training (:mod:`lra.module`), both benchmarks and
    ``load_from_checkpoint`` go through it.
    """
    classifier = LRADualClassifier if spec.dual_encoder else LRAClassifier
    return classifier(spec.num_classes, build_encoder(spec, seq_len, model, attention), hidden_dim=model.head_hidden_dim)
