"""Widely used PyTorch attentions inside the authors' LRA model, for ``lra.bench authors``' rows their code lacks.

mlpen/Nystromformer's ``LRA/code/attention.py`` builds softmax, none, linformer, reformer, nystrom, performer and linear
only. For the other baselines of the LRA tables, an adapter here puts a public implementation in the ``attn`` of each of
their ``attention.Attention`` layers, after their ``model_wrapper.ModelForSC`` is built, so that their model around the
attention (embeddings, W_q/W_k/W_v, output projection, feed-forward, pooling) is the one every other row uses:

- ``bigbird``: Hugging Face transformers' ``BigBirdBlockSparseAttention.bigbird_block_sparse_attention`` (ITC: first and
  last blocks global, a 3-block window, random blocks), given their Q, K, V (batch, heads, n, head_dim) and HF's block
  masks (``BigBirdModel.create_masks_for_block_sparse_attn``) of their mask; the layer's own q/k/v Linears are dropped.
- ``longformer``: HF ``LongformerSelfAttention`` (sliding window, global tokens). It projects the hidden states itself,
  so it takes their Attention's ``longformer*`` branch, ``attn(X, mask)`` (as their Reformer does), with all six of its
  projections (query, key, value and the global ones) tied to their W_q, W_k, W_v: the same linear maps as the other
  rows, and ours's tied global projections. The mask goes in as HF's model makes it (-10000 padding, 0 local, +10000
  global: the first ``num_global_tokens`` real tokens).
- ``sinkhorn``: lucidrains' sinkhorn-transformer ``SinkhornAttention`` (the non-causal module its
  ``SinkhornSelfAttention`` calls with (batch, heads, n, head_dim) q, k, v and boolean masks), Sinkhorn balancing
  (``non_permutative=False``) with the learned sort net (``use_simple_sort_net=True``, as the paper and ours).

Each takes our row's hyperparameters (``conf/attention/<row>.yaml``). Sequences are padded to the implementation's
multiple (block, window) with masked positions, and the output cropped back, as their models' own padding does. The
packages are imported when a row is built, from wherever the user installed them (``--extra-path``); nothing here is
copied from them. Where their semantics differ from ours: :data:`DIFFERENCES`.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Our row -> the implementation the adapter runs (the distribution whose version the CSV records, and the class).
IMPLEMENTATIONS = {
    "bigbird": ("transformers", "transformers.models.big_bird.modeling_big_bird.BigBirdBlockSparseAttention"),
    "longformer": ("transformers", "transformers.models.longformer.modeling_longformer.LongformerSelfAttention"),
    "sinkhorn": ("sinkhorn-transformer", "sinkhorn_transformer.sinkhorn_transformer.SinkhornAttention"),
}

#: Our row -> where the implementation's semantics differ from our row's (the CSV's ``differences`` column).
DIFFERENCES = {
    "reformer": (
        "their LSHSelfAttention (HF): 2 hashes, chunks of 64, 64 buckets (HF's rule, as ours), 1 chunk before, "
        "no dropout, as ours; their query_key/value have no bias (their W_q/W_v weights only, W_k unused), ours has"
    ),
    "bigbird": (
        "HF draws its random blocks from the whole sequence at n=2048 (its plan; last_idx=1024 only for n in "
        "1024/3072/4096), reseeding numpy with the layer index each training call; ours from the first 1024 tokens, "
        "fixed per layer at build; HF masks with an additive -10000, ours exactly (zero weight)"
    ),
    "longformer": (
        "HF projects the global rows' keys/values over every token (tied here, so the same values); "
        "HF chunks of 512 overlapping by 256 (about 2 n w scores), ours blocks of 256 (1.5 n w): the same band"
    ),
    "sinkhorn": (
        "lucidrains: one softmax over [sorted block, own block] (ours: two softmaxes added, as LRA), Gumbel noise in "
        "the sorting (ours none), sort net relu(W [sum q; sum k]) then log (ours W sum k), the sorted blocks' values "
        "are the sorted keys (its b_v_r = b_k_r), padded keys in the block sums; ours none of these"
    ),
}


def _attribute(path: str) -> Any:
    """``package.module.Name`` imported now (from their sys.path)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def pad_to(multiple: int, *tensors: torch.Tensor, dim: int, mask: torch.Tensor) -> tuple[int, list[torch.Tensor], torch.Tensor]:
    """``(pad, tensors, mask)``: each tensor zero-padded along ``dim`` to a multiple of ``multiple``, the (b, n) mask
    with zeros (padding)."""
    n = mask.shape[1]
    pad = -n % multiple
    if not pad:
        return 0, list(tensors), mask
    padded = [F.pad(t, (0, 0) * (t.dim() - 1 - dim % t.dim()) + (0, pad)) for t in tensors]
    return pad, padded, F.pad(mask, (0, pad))


class BigBirdAdapter(nn.Module):
    """HF's block-sparse BigBird on their (b, h, n, d) Q, K, V and float mask; returns (b, h, n, d)."""

    def __init__(self, config: dict[str, Any], hparams: dict[str, Any], layer: int) -> None:
        super().__init__()
        module = importlib.import_module("transformers.models.big_bird.modeling_big_bird")
        self.block_size, self.num_random_blocks = hparams["block_size"], hparams["num_random_blocks"]
        self.num_head, self.head_dim = config["num_head"], config["head_dim"]
        hf_config = module.BigBirdConfig(
            hidden_size=self.num_head * self.head_dim,
            num_attention_heads=self.num_head,
            attention_type="block_sparse",
            block_size=self.block_size,
            num_random_blocks=self.num_random_blocks,
            max_position_embeddings=config["max_seq_len"],
        )
        self.sparse = module.BigBirdBlockSparseAttention(hf_config, seed=layer)  # HF's BigBirdAttention: seed = layer
        self.sparse.query = self.sparse.key = self.sparse.value = None  # their W_q/W_k/W_v project instead
        self.create_masks = module.BigBirdModel.create_masks_for_block_sparse_attn

    def forward(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, _, n, _ = Q.shape
        pad, (Q, K, V), mask = pad_to(self.block_size, Q, K, V, dim=2, mask=mask)
        length = n + pad
        if length <= (5 + 2 * self.num_random_blocks) * self.block_size:  # HF's own model falls back to full attention
            raise ValueError(f"HF block-sparse BigBird needs more than {(5 + 2 * self.num_random_blocks)} blocks, got {length}")
        blocked, band, from_mask, to_mask = self.create_masks(mask, self.block_size)
        context, _ = self.sparse.bigbird_block_sparse_attention(
            Q, K, V, band, from_mask, to_mask, blocked, blocked, self.num_head, self.num_random_blocks, self.head_dim,
            self.block_size, self.block_size, batch, length, length,
            seed=self.sparse.seed, plan_from_length=None, plan_num_rand_blocks=None,
        )  # fmt: skip
        return context.transpose(1, 2)[:, :, :n]  # HF's (b, n, h, d) -> (b, h, n, d)

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, num_random_blocks={self.num_random_blocks}, seed={self.sparse.seed}"


class LongformerAdapter(nn.Module):
    """HF's LongformerSelfAttention on their hidden states X (b, n, dim) and float mask, its projections tied to their
    W_q, W_k, W_v; returns (b, n, heads * head_dim) for their output projection."""

    def __init__(self, attention: nn.Module, config: dict[str, Any], hparams: dict[str, Any], layer: int) -> None:
        super().__init__()
        module = importlib.import_module("transformers.models.longformer.modeling_longformer")
        if config["num_head"] * config["head_dim"] != config["transformer_dim"]:
            raise ValueError("HF LongformerSelfAttention needs heads * head_dim == transformer_dim")
        self.window, self.num_global = hparams["window"], hparams["num_global_tokens"]
        hf_config = module.LongformerConfig(
            hidden_size=config["transformer_dim"],
            num_attention_heads=config["num_head"],
            attention_window=[self.window] * config["num_layers"],
            attention_probs_dropout_prob=hparams["dropout"],
        )
        self.hf = module.LongformerSelfAttention(hf_config, layer_id=layer)
        for ours, theirs in (("query", "W_q"), ("key", "W_k"), ("value", "W_v")):
            for name in (ours, f"{ours}_global"):
                projection = getattr(self.hf, name)
                projection.weight, projection.bias = getattr(attention, theirs).weight, getattr(attention, theirs).bias

    def forward(self, X: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        _, (X,), mask = pad_to(self.window, X, dim=1, mask=mask)
        real = mask > 0
        is_global = torch.zeros_like(real)
        is_global[:, : self.num_global] = True
        is_global &= real  # padding beats "global"
        hf_mask = torch.where(real, torch.where(is_global, 10000.0, 0.0), -10000.0).to(X.dtype)  # LongformerModel's
        out = self.hf(
            X, attention_mask=hf_mask, is_index_masked=~real, is_index_global_attn=is_global, is_global_attn=bool(is_global.any())
        )[0]
        return out[:, :n]

    def extra_repr(self) -> str:
        return f"window={self.window}, num_global_tokens={self.num_global}"


class SinkhornAdapter(nn.Module):
    """lucidrains' SinkhornAttention on their (b, h, n, d) Q, K, V and float mask; returns (b, h, n, d)."""

    def __init__(self, config: dict[str, Any], hparams: dict[str, Any], layer: int) -> None:
        super().__init__()
        attention = _attribute(IMPLEMENTATIONS["sinkhorn"][1])
        self.block_size = hparams["block_size"]
        padded = -(-config["max_seq_len"] // self.block_size) * self.block_size  # its sort net: one output per block
        self.sinkhorn = attention(
            bucket_size=self.block_size,
            dim=config["num_head"] * config["head_dim"],
            dim_heads=config["head_dim"],
            heads=config["num_head"],
            max_seq_len=padded,
            temperature=hparams["temperature"],
            non_permutative=False,
            sinkhorn_iter=hparams["sinkhorn_iterations"],
            n_sortcut=0,
            dropout=hparams["dropout"],
            use_simple_sort_net=True,
        )

    def forward(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = Q.shape[2]
        _, (Q, K, V), mask = pad_to(self.block_size, Q, K, V, dim=2, mask=mask)
        real = mask > 0
        return self.sinkhorn(Q, K, V, q_mask=real, kv_mask=real)[:, :, :n]

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"


def install(row: str, model: nn.Module, attention_class: type, config: dict[str, Any], hparams: dict[str, Any]) -> int:
    """Put ``row``'s adapter in the ``attn`` of every ``attention_class`` layer of ``model`` (their model, just built),
    in layer order; returns how many."""
    layers = [module for module in model.modules() if isinstance(module, attention_class)]
    for index, layer in enumerate(layers):
        if row == "longformer":
            layer.attn = LongformerAdapter(layer, config, hparams, index)
        elif row == "bigbird":
            layer.attn = BigBirdAdapter(config, hparams, index)
        elif row == "sinkhorn":
            layer.attn = SinkhornAdapter(config, hparams, index)
        else:
            raise KeyError(f"no adapter for row {row!r}; adapters: {', '.join(IMPLEMENTATIONS)}")
    return len(layers)
