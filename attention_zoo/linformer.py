"""Linformer: softmax attention over keys and values projected along the sequence to a fixed length k.

Sinong Wang, Belinda Z. Li, Madian Khabsa, Han Fang and Hao Ma, "Linformer: Self-Attention with
Linear Complexity", arXiv:2006.04768, 2020. Official code: fairseq ``examples/linformer``.

Self-attention is approximately low rank, so the n keys and values can be replaced by k learned
linear mixtures of them without losing much. With learned projections E, F of shape (k, N), where
N = ``seq_len`` is the longest sequence the module is built for:

1. The keys and values of padded tokens arrive as zeros (:meth:`Attention.forward` selects them
   out), so they cannot enter any mixture.
2. Project along the sequence: K' = E[:, :n] K and V' = F[:, :n] V, both (k, d). An input shorter
   than N uses the first n columns (as fairseq does), so a right-padded sequence gives exactly the
   output of the same sequence unpadded; an input longer than N is an error.
3. Exact softmax attention of the n queries over the k projected keys: softmax(Q K'^T / sqrt(d)) V'.
   This is n x k, so time and memory are linear in n.
4. Zero the rows of padded queries.

The k projected keys are mixtures, not tokens, so they cannot themselves be masked: the softmax
always spreads over all k of them (a fully padded sequence gets all-zero mixtures and, after step 4,
zero output). With k = n, E = F = I and no padding, Linformer is exactly softmax attention.

Choices, and where they differ from the originals:

- Sharing. The paper's default, and its authors' code, is *headwise* sharing: one E and one F per
  layer, shared by all heads (fairseq projects the layer input before splitting heads). That is the
  default here. ``share_kv`` is the paper's *key-value* sharing (F = E); ``share_heads=False`` gives
  every head its own projection, the paper's unshared form.
- The Nystromformer/YOSO LRA tables (the preset ``linformer_lra``) ran Linformer with one
  (heads, k, N) tensor used for both K and V (``share_heads=False, share_kv=True``), N(0, 0.02) init
  (``init="normal"``), no attention dropout, and shared across *all layers* as a class attribute.
  Layerwise sharing cannot be expressed by a per-module registry (each built module owns its
  projections), so every layer here has its own; that is the one part of that row not reproduced.
- Init. fairseq uses Xavier-uniform with gain 1/sqrt(2) on each (k, N) projection (the default
  ``init="xavier"``), the Nystromformer code N(0, 0.02) (``init="normal"``).
- Projecting K rather than the layer input. fairseq compresses the input x before the key/value
  projection, E (x W) + b; a core attention receives K = x W + b and computes E K, which differs only
  by scaling the bias by E's row sums. The Nystromformer code projects K and V as done here.
- k larger than N. A projection from N positions to k > N mixtures adds no rank, only cost, and
  k = N already contains exact attention (E = I), so k is clamped to ``min(k, seq_len)`` at build
  time (``self.proj_len``). This is what lets the paper's k = 256 run on short inputs.
- Masking. fairseq's Linformer ignores the key padding mask (padding is zeroed only in the
  embeddings); here, as in the Nystromformer code, padded keys and values are zeroed before
  projecting, as the contract requires.
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
class LinformerConfig:
    k: int = 256  # projected length (the paper's k); clamped to seq_len, see the module docstring
    share_heads: bool = True  # one projection for all heads (the paper's headwise sharing) or one per head
    share_kv: bool = False  # the same projection for keys and values (the paper's key-value sharing)
    init: Literal["xavier", "normal"] = "xavier"  # fairseq's Xavier-uniform (gain 1/sqrt 2) or NF's N(0, 0.02)
    dropout: float = 0.1  # dropout on the n x k attention probabilities (fairseq RoBERTa; training only)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k (the projected length) must be at least 1, got {self.k}")
        if self.init not in ("xavier", "normal"):
            raise ValueError(f"init must be 'xavier' or 'normal', got {self.init!r}")
        check_dropout(self.dropout)


@register("linformer")
class LinformerAttention(Attention):
    Config = LinformerConfig
    in_float32 = True  # the sums over n of the projections and the softmax over k
    sized_by_seq_len = "the Linformer projections"

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: LinformerConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        self.proj_len = min(config.k, seq_len)
        # A leading head axis of 1 broadcasts one projection over all heads.
        shape = (1 if config.share_heads else num_heads, self.proj_len, seq_len)  # (h or 1, k, N)
        self.E = nn.Parameter(self._init(torch.empty(shape)))
        self.F = None if config.share_kv else nn.Parameter(self._init(torch.empty(shape)))

    def _init(self, weight: torch.Tensor) -> torch.Tensor:
        if self.config.init == "normal":
            return nn.init.normal_(weight, std=0.02)
        # Xavier-uniform of one (k, N) matrix; nn.init would read the head axis as a fan.
        bound = math.sqrt(6.0 / (self.proj_len + self.seq_len)) / math.sqrt(2.0)
        return nn.init.uniform_(weight, -bound, bound)

    def attend(self, q, k, v, mask):
        n = q.shape[2]
        key_proj = self.E[..., :n].to(k.dtype)  # (h or 1, k, n)
        value_proj = key_proj if self.F is None else self.F[..., :n].to(v.dtype)  # (h or 1, k, n)
        k = torch.einsum("hkn,bhnd->bhkd", key_proj, k)  # (b, h, k, d)
        v = torch.einsum("hkn,bhnd->bhkd", value_proj, v)  # (b, h, k, d)
        dropout = self.config.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)  # (b, h, n, d)


register_preset(
    "linformer_lra",
    "linformer",
    "k = 256 as the Nystromformer/YOSO LRA tables ran it: one per-head projection for K and V, N(0, 0.02), no "
    "attention dropout (layerwise sharing not reproduced)",
    k=256,
    share_heads=False,
    share_kv=True,
    init="normal",
    dropout=0.0,
)
