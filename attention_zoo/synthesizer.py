"""Synthesizer: attention weights synthesised without (or besides) query-key dot products.

Yi Tay, Dara Bahri, Donald Metzler, Da-Cheng Juan, Zhe Zhao and Che Zheng, "Synthesizer: Rethinking
Self-Attention in Transformer Models", ICML 2021. Instead of Q K^T, the logits B of the (n, N)
attention matrix, N = ``seq_len`` the longest sequence the module is built for, come from:

* ``dense``: a two-layer MLP of each query token alone, B_i = W2 relu(W1 x_i + b1) + b2, with
  W1: (d, d) and W2: (d, N), so row i depends on token i and not on any other token;
* ``random``: a learned (N, N) matrix R per head, the same for every input;
* ``factorized_random``: R = R1 R2 with R1: (N, k) and R2: (k, N) per head, a rank-k random matrix.

With ``dot_product=True`` the vanilla logits Q K^T / sqrt(d) are added to the synthetic ones (the
paper's "+ V" mixtures, e.g. Random + Vanilla). Then, for a sequence of n <= N tokens:

1. Take the first n columns (and, for R, the first n rows) of the synthetic logits, so a
   right-padded sequence gives exactly the output of the same sequence unpadded; n > N is an error.
2. Add the dot-product logits if asked for.
3. Mask the padded keys, softmax over the n real key positions, dropout, and weight the values.
4. Attention.forward zeroes the rows of padded queries.

The attention matrix is n x N per head, so memory is quadratic: ``linear_memory = False``.

The LRA row (preset ``synthesizer_lra``, selected by ``lra/conf/attention/synthesizer.yaml``): LRA's
``SynthesizerEncoder`` defaults, ``synthesizer_mode='random'`` and ``ignore_dot_product=False``, are
what every task ran (its text-classification config sets ``factorized_random`` and
``ignore_dot_product`` at the top level of the config, where the trainer never reads them), so the
row is Random + Vanilla: softmax(Q K^T / sqrt(d) + R), attention dropout 0.1, R initialised as flax's
``xavier_uniform`` initialises the (h, N, N) tensor.

Choices, and where they differ from the originals:

- **The dense MLP acts on q.** A core attention here receives q, k, v already projected; the MLP
  of the ``dense`` variant reads each head's query vector q_i (the paper reads the layer input x_i,
  LRA's code the layer input projected per head). Since q_i = x_i W_q + b_q is linear in x_i, W1 q_i
  is a per-head linear map of x_i, as LRA's first layer is. Each head has its own W1, b1, W2, b2,
  initialised Xavier-uniform (weights) and zero (biases); LRA's code has no biases, shares W2 across
  heads, and reshapes its (batch, n, heads, N) output to (batch, heads, n, N) without transposing,
  mixing tokens and heads; that is not reproduced.
- **Sum, no mixture weights.** The paper mixes synthetic and vanilla logits with learned weights
  alpha; LRA's code, and this module, add them.
- **Unused projections.** The ``dense`` variant never reads k, the ``random`` ones neither q nor k
  (unless ``dot_product``): the surrounding model's key (and query) projections then get no gradient.
- **Init of R.** flax's ``xavier_uniform`` counts the head axis of an (h, N, N) tensor as a receptive
  field, so R ~ U(+-sqrt(6 / (h (N + N)))), and likewise R1, R2 ~ U(+-sqrt(6 / (h (N + k)))); kept.
- **Factorised dense** (the paper's two MLPs of sizes a and b with a * b = N, tiled) is not
  implemented; factorised random is, as in LRA's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_dropout
from .registry import Attention, register, register_preset


@dataclass
class SynthesizerConfig:
    variant: Literal["dense", "random", "factorized_random"] = "dense"  # how the logits are synthesised
    dot_product: bool = False  # add the vanilla Q K^T / sqrt(d) logits (the paper's "+ V" mixtures)
    k: int = 32  # rank of factorized_random (LRA's k); unused by the other variants
    dropout: float = 0.1  # attention-probability dropout, training only (LRA's attention_dropout_rate)

    def __post_init__(self) -> None:
        if self.variant not in ("dense", "random", "factorized_random"):
            raise ValueError(f"variant must be 'dense', 'random' or 'factorized_random', got {self.variant!r}")
        if self.k < 1:
            raise ValueError(f"k (the rank of factorized_random) must be at least 1, got {self.k}")
        check_dropout(self.dropout)


def _xavier(*shape: int, fan_in: int, fan_out: int) -> nn.Parameter:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return nn.Parameter(nn.init.uniform_(torch.empty(shape), -bound, bound))


@register("synthesizer")
class SynthesizerAttention(Attention):
    Config = SynthesizerConfig
    linear_memory = False  # an n x N attention matrix per head
    sized_by_seq_len = "the Synthesizer's (.., N) weights"

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: SynthesizerConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        h, d, N = num_heads, head_dim, seq_len
        if config.variant == "dense":
            self.w1 = _xavier(h, d, d, fan_in=d, fan_out=d)  # (h, d, d)
            self.b1 = nn.Parameter(torch.zeros(h, 1, d))  # (h, 1, d)
            self.w2 = _xavier(h, d, N, fan_in=d, fan_out=N)  # (h, d, N)
            self.b2 = nn.Parameter(torch.zeros(h, 1, N))  # (h, 1, N)
        elif config.variant == "random":
            self.random = _xavier(h, N, N, fan_in=h * N, fan_out=h * N)  # (h, N, N)
        else:
            self.random1 = _xavier(h, N, config.k, fan_in=h * N, fan_out=h * config.k)  # (h, N, k)
            self.random2 = _xavier(h, config.k, N, fan_in=h * config.k, fan_out=h * N)  # (h, k, N)

    def synthetic_logits(self, q: torch.Tensor) -> torch.Tensor:
        """The synthetic logits of n = q.shape[2] tokens over the first n key positions: (b, h, n, n) or (1, h, n, n)."""
        n = q.shape[2]
        variant = self.config.variant
        if variant == "dense":
            hidden = torch.relu(q @ self.w1.to(q.dtype) + self.b1.to(q.dtype))  # (b, h, n, d)
            return hidden @ self.w2[..., :n].to(q.dtype) + self.b2[..., :n].to(q.dtype)  # (b, h, n, n)
        if variant == "random":
            return self.random[None, :, :n, :n].to(q.dtype)  # (1, h, n, n)
        return (self.random1[:, :n].to(q.dtype) @ self.random2[..., :n].to(q.dtype))[None]  # (1, h, n, n)

    def attend(self, q, k, v, mask):
        # Batch-wide so that dropout draws its own mask per sequence, as LRA's (broadcast_dropout=False).
        logits = self.synthetic_logits(q).expand(q.shape[0], -1, -1, -1)  # (b, h, n, n)
        if self.config.dot_product:
            logits = logits + q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, n, n)
        if mask is not None:
            # The dtype's most negative finite value, not -inf: a fully padded row stays NaN-free.
            logits = logits.masked_fill(~mask[:, None, None, :], torch.finfo(logits.dtype).min)  # (b, h, n, n)
        dropout = self.config.dropout if self.training else 0.0
        probs = F.dropout(logits.softmax(dim=-1), dropout)  # (b, h, n, n)
        return probs @ v  # (b, h, n, dv)


register_preset(
    "synthesizer_lra",
    "synthesizer",
    "the LRA row: Random + Vanilla, softmax(Q K^T / sqrt(d) + R) with a learned (N, N) R per head (LRA's "
    "SynthesizerEncoder defaults, which every LRA task ran), attention dropout 0.1",
    variant="random",
    dot_product=True,
    dropout=0.1,
)

register_preset(
    "synthesizer_dense",
    "synthesizer",
    "the paper's Dense Synthesizer: a two-layer MLP of each query gives its logits over the N positions",
    variant="dense",
    dot_product=False,
)

register_preset(
    "synthesizer_random",
    "synthesizer",
    "the paper's Random Synthesizer: a learned (N, N) matrix per head, independent of the input",
    variant="random",
    dot_product=False,
)

register_preset(
    "synthesizer_factorized_random",
    "synthesizer",
    "the paper's Factorised Random Synthesizer: R = R1 R2 of rank k = 32 per head (LRA's k)",
    variant="factorized_random",
    dot_product=False,
    k=32,
)
