"""YOSO attention: "You Only Sample (Almost) Once" (Zeng, Xiong, Ravi, Acharya, Fung, Singh; ICML 2021).

YOSO replaces the softmax weights by Bernoulli variables whose success probability is the collision
probability of angular LSH, ``B_ij ~ Bernoulli((1 - arccos(q_i . k_j)/pi)^tau)`` for unit q, k,
and samples all of them at once with one hash per sample:

1. l2-normalise queries and keys;
2. draw ``m`` hash functions of ``tau`` bits (the fast Hadamard rotation ``H D3 H D2 H D1`` by
   default, independent Gaussian hyperplanes with ``hash_projection: gaussian``, see "Hash family"
   below), fresh on every call from torch's RNG;
3. YOSO-m: for each hash, add every real key's value to its bucket and read each query's bucket:
   ``Y_i = (1/m) sum_h sum_j [h(q_i) = h(k_j)] v_j``, an unbiased estimate of ``E V`` with
   ``E_ij = (1 - arccos(q_i . k_j)/pi)^tau``; the table holds value sums only;
4. the output rows are l2-normalised (the paper's N-YOSO, which replaces softmax's row sums);
5. YOSO-C adds a per-head depthwise convolution of the masked values along the sequence.

Backward (``backward``), with the same hash codes as the forward:

* ``grad V = B^T G`` estimated by the same cumulation with queries and keys swapped;
* ``lower_bound`` (the paper's YOSO): the derivative of the collision probability,
  ``f'(x) = tau p^(tau-1) / (pi sqrt(1 - x^2))``, is unbounded as x -> 1; it is replaced by the lower
  bound ``(tau/2) p^tau = (tau/2) E_ij`` (ratio ``(pi - theta) sin(theta) / 2 <= 0.91``), so that
  ``grad q_i = (tau/2) (1/m) sum_h sum_j [collide] (g_i . v_j) k_j`` is again an LSH cumulation
  (weighted). Its expectation is exactly the dense surrogate ``[(G V^T) * (tau/2) E] K``;
* ``exact`` (the paper's *YOSO; appendix not public, so this follows the official yoso_v2 kernels):
  ``grad q_i = sum_{j in U(i)} (g_i . v_j) f'(0.99 q_i . k_j) k_j`` where U(i) is the set of keys
  colliding with q_i in at least one of the m hashes, each counted once (no 1/m). Its expectation
  is ``sum_j [1 - (1 - E_ij)^m] (g_i . v_j) f'(0.99 x_ij) k_j``: the true derivative of ``E V``
  (with x shrunk by 0.99 to keep f' <= 7.1 tau), restricted to pairs in proportion to their chance
  of colliding at least once. It is biased towards zero for pairs that rarely collide, where f'
  itself is small. Time is proportional to the number of colliding pairs.

Which estimator is closer to the true gradient of ``E V`` depends on how closely queries and keys
align: ``exact`` has the lower error where keys are close copies of their queries; from looser
alignments on, the lower bound points closer to the true gradient, though well under its norm.

Hash family. The tau bits of one Hadamard hash are tau orthogonal directions of one pseudo-random
rotation, not independent hyperplanes, and such a hash collides less often than ``(1 - theta/pi)^tau``,
the more so the wider the angle. So Hadamard YOSO-m estimates a slightly different ``E`` and its
error against ``E V`` levels off as m grows, while with ``hash_projection: gaussian`` (independent
Gaussian hyperplanes, the unbiased option) it keeps falling like 1/sqrt(m). At few hashes (m = 32,
the yoso-32 preset) the rotation's orthogonal bits give the lower variance and the lower error, and
one rotation, O(d log d), yields d / tau hashes where Gaussian hyperplanes cost O(d tau) per hash:
Hadamard, the official code's family, stays the default.

The measurements behind both paragraphs: results/README.md#yosos-gradient-estimators-and-hash-families.

YOSO-E (``expectation: true``) computes ``normalise(E V)``, O(n^2): with ``backward: exact``
its gradient is autograd's true gradient (x clamped to 1 - 1e-6 so it stays finite), with
``lower_bound`` the (tau/2) E surrogate, as the official yoso_v1 YOSO-E. ``lower_bound`` runs on a CPU in float32 on
``yoso_cuda.expectation_attention``, fused block by block of queries without the padding's work, where the kernels
are built (and ``backend`` is not ``reference``); everything else computes the (b h, n, n) weights densely.

``yoso_e_flex`` (its own attention, with YOSO-E's hyperparameters only) computes the same on FlexAttention's fused
kernels, without the n x n weights in memory and without the padding's work. Softmax's row sums
cancel in the l2 normalisation that follows, so ``normalise(E V) = normalise(softmax(S) V)`` with
scores ``S = tau log(1 - arccos(x)/pi)``, ``x = q . k`` at scale 1, and padded keys and queries as a
block mask: blocks of 128 x 128 pairs where every query or every key is padded are skipped. The
gradients are YOSO-E's too. The same cancellation turns softmax's gradient into
``dL/dS_ij = E_ij (g_i . v_j)`` (g, the gradient at ``E V``, is orthogonal to it through the
normalisation), so ``exact`` differentiates S itself, and ``lower_bound`` gives S the derivative
tau/2 (a straight-through score: ``(tau/2) x`` plus the detached difference), which makes
``dL/dx_ij = (tau/2) E_ij (g_i . v_j)``, the surrogate. FlexAttention runs backward on CUDA only, so
elsewhere (and in PyTorch before 2.5, which has no FlexAttention) ``yoso_e_flex`` computes ``yoso_e``'s dense path.

tau (``hash_bits``) defaults to the paper's LRA rule, log2 of the padded length (11 for ListOps'
2048). Masks: padded keys never enter a bucket (nor E), padded queries give zero rows. Hashing and
the cumulations with their gradient estimators are ``yoso_cuda``'s (``hash_queries_and_keys``, the
differentiable op ``lsh_attention``); ``backend`` runs them on its compiled kernels where they are
built (``auto``), on the kernels or an error (``compiled``), or on its pure-PyTorch reference.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

import yoso_cuda

from ._conv import SequenceConv
from .registry import Attention, register, register_preset

MAX_HASH_BITS = 30  # codes are int32


@dataclass
class YosoConfig:
    num_hashes: int = 32  # m, hashes (Bernoulli samples) averaged per output
    hash_bits: int | None = None  # tau, bits per hash code; None: ceil(log2(seq_len)), the paper's LRA rule
    backward: Literal["lower_bound", "exact"] = "lower_bound"  # YOSO's (tau/2)-surrogate, or *YOSO's derivative
    conv_window: int | None = None  # YOSO-C: width of the per-head depthwise convolution of V (odd)
    expectation: bool = False  # YOSO-E: the exact expectation, O(n^2), instead of m hashes
    hash_projection: Literal["hadamard", "gaussian"] = "hadamard"  # fast rotation, or Gaussian hyperplanes (unbiased)
    backend: yoso_cuda.ops.Backend = "auto"  # yoso_cuda's kernels where built ("auto"), or "compiled" or "reference"

    def __post_init__(self) -> None:
        if self.num_hashes < 1:
            raise ValueError(f"num_hashes must be >= 1, got {self.num_hashes}")
        if self.hash_bits is not None and not 1 <= self.hash_bits <= MAX_HASH_BITS:
            raise ValueError(f"hash_bits must be in [1, {MAX_HASH_BITS}] (int32 codes), got {self.hash_bits}")
        SequenceConv.check_width(self.conv_window, "conv_window")


class ExpectationLowerBound(torch.autograd.Function):
    """YOSO-E's ``E V`` with the dense (tau/2) E surrogate gradient of the official yoso_v1."""

    @staticmethod
    def forward(ctx, queries, keys, values, pair_mask, hash_bits):
        weights = yoso_cuda.expected_collisions(queries, keys, hash_bits) * pair_mask  # (B, n, n)
        ctx.save_for_backward(queries, keys, values, weights)
        ctx.hash_bits = hash_bits
        return weights @ values

    @staticmethod
    def backward(ctx, grad):
        queries, keys, values, weights = ctx.saved_tensors
        surrogate = (grad @ values.transpose(-1, -2)) * weights * (ctx.hash_bits / 2)  # (B, n, n)
        return surrogate @ keys, surrogate.transpose(-1, -2) @ queries, weights.transpose(-1, -2) @ grad, None, None


EXACT_COSINE_LIMIT = 1 - 1e-6  # backward exact: x kept inside (-limit, limit), where arccos' is finite


def expectation_exact(queries, keys, values, pair_mask, hash_bits):
    """YOSO-E's ``E V`` with autograd's true gradient."""
    cosine = (queries @ keys.transpose(-1, -2)).clamp(-EXACT_COSINE_LIMIT, EXACT_COSINE_LIMIT)  # (B, n, n)
    weights = (1 - torch.arccos(cosine) / math.pi).pow(hash_bits) * pair_mask
    return weights @ values


def fold_heads(q, k, v, real):
    """Heads folded into the batch (B = b h): ``real`` (b, n) as (B, n), unit queries and keys (B, n, d), values
    (B, n, dv)."""
    batch, heads, length, dim = q.shape
    folded = real[:, None, :].expand(batch, heads, length).reshape(batch * heads, length)  # (B, n)
    queries = F.normalize(q, dim=-1).reshape(batch * heads, length, dim)  # (B, n, d)
    keys = F.normalize(k, dim=-1).reshape(batch * heads, length, dim)  # (B, n, d)
    values = v.reshape(batch * heads, length, v.shape[-1])  # (B, n, dv)
    return folded, queries, keys, values


def expectation(q, k, v, real, hash_bits, backward, backend="auto"):
    """YOSO-E's ``E V`` (b, h, n, dv) of ``q, k`` (b, h, n, d), ``v`` (b, h, n, dv) and ``real`` (b, n): fused on a
    CPU in float32 where the kernels are built (``lower_bound``), else densely."""
    batch, heads, length, _ = q.shape
    folded, queries, keys, values = fold_heads(q, k, v, real)
    if backward == "lower_bound" and backend != "reference" and fused_expectation_runs(queries):
        out = yoso_cuda.expectation_attention(queries, keys, values, folded, hash_bits)
        return out.view(batch, heads, length, v.shape[-1])  # (b, h, n, dv)
    pair_mask = (folded[:, :, None] & folded[:, None, :]).float()  # (B, n, n)
    if backward == "exact":
        out = expectation_exact(queries, keys, values, pair_mask, hash_bits)
    else:
        out = ExpectationLowerBound.apply(queries, keys, values, pair_mask, hash_bits)
    return out.view(batch, heads, length, v.shape[-1])  # (b, h, n, dv)


def fused_expectation_runs(queries: torch.Tensor) -> bool:
    return queries.device.type == "cpu" and queries.dtype == torch.float32 and yoso_cuda.has_kernel(queries.device)


FLEX_BLOCK = 128  # FlexAttention's default block of queries and of keys


def flex_attention_available(device: torch.device) -> bool:
    """Whether FlexAttention runs forward and backward here: PyTorch >= 2.5, on CUDA."""
    if device.type != "cuda":
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def padding_block_mask(real: torch.Tensor):
    """FlexAttention's block mask of the pairs of real tokens, ``real`` (b, n) bool, built from per-block token counts
    (static shapes, no host synchronisation): a block whose queries or keys are all padded is skipped, a block whose
    queries and keys are all real is full (no mask evaluated in it), every other block is masked pair by pair."""
    from torch.nn.attention.flex_attention import BlockMask

    b, n = real.shape
    blocks = -(-n // FLEX_BLOCK)
    padded = F.pad(real, (0, blocks * FLEX_BLOCK - n))  # (b, blocks * FLEX_BLOCK); positions past n are padding
    counts = padded.view(b, blocks, FLEX_BLOCK).sum(-1)  # (b, blocks): real tokens per block
    some, every = counts > 0, counts == FLEX_BLOCK
    full = every[:, :, None] & every[:, None, :]  # (b, query blocks, key blocks)
    partial = some[:, :, None] & some[:, None, :] & ~full  # (b, query blocks, key blocks)

    def listed(selected):  # -> (b, 1, query blocks) counts, (b, 1, query blocks, key blocks) indices, selected first
        order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)
        return selected.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    def both_real(batch, head, query, key):
        return padded[batch, query] & padded[batch, key]

    return BlockMask.from_kv_blocks(*listed(partial), *listed(full), FLEX_BLOCK, both_real, seq_lengths=(n, n))


def expectation_flex(queries, keys, values, real, hash_bits, backward):
    """YOSO-E's ``E V / (E 1)`` (b, h, n, dv) on FlexAttention, from unit ``queries, keys`` (b, h, n, d) and ``real``
    (b, n): rows of padded queries are zero. Its l2-normalised rows are YOSO-E's, and so are their gradients
    (``backward`` as in the dense path; module docstring)."""
    from torch.nn.attention.flex_attention import flex_attention

    # Two score functions, with no float in their closures: Dynamo would turn a float that differs between calls
    # (another limit, another tau / 2) into a symbol, which FlexAttention's tracing of the score cannot take.
    def log_collision_probability(score, batch, head, query, key):  # S = tau log(1 - arccos(x)/pi)
        cosine = score.clamp(-EXACT_COSINE_LIMIT, EXACT_COSINE_LIMIT)
        return hash_bits * torch.log1p(-torch.arccos(cosine) / math.pi)

    def with_lower_bound_derivative(score, batch, head, query, key):  # S, with dS/dx = tau / 2
        straight = score * hash_bits / 2
        return straight + (hash_bits * torch.log1p(-torch.arccos(score.clamp(-1, 1)) / math.pi) - straight).detach()

    # Called eagerly, flex_attention computes every score in memory: on CUDA, outside a compiled step, compile it.
    fuse = queries.is_cuda and not torch.compiler.is_compiling()
    attention = _compiled_flex_attention() if fuse else flex_attention
    score = log_collision_probability if backward == "exact" else with_lower_bound_derivative
    return attention(queries, keys, values, score_mod=score, block_mask=padding_block_mask(real), scale=1.0)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@register("yoso")
class YosoAttention(Attention):
    Config = YosoConfig
    in_float32 = True  # angles, hashing and the normalisation of the output rows

    def __init__(self, *, seq_len, num_heads, head_dim, config):
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        self.hash_bits = config.hash_bits or max(1, math.ceil(math.log2(seq_len)))
        self.linear_memory = not config.expectation
        self.conv = None if config.conv_window is None else SequenceConv(num_heads, config.conv_window)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.hash_bits}"

    def attend(self, q, k, v, mask):
        batch, heads, length, _ = q.shape
        real = torch.ones(batch, length, dtype=torch.bool, device=q.device) if mask is None else mask
        if self.config.expectation:
            out = expectation(q, k, v, real, self.hash_bits, self.config.backward, self.config.backend)  # (b, h, n, dv)
            return self.finish(out, v)
        folded_mask, queries, keys, values = fold_heads(q, k, v, real)
        query_codes, key_codes = self.hash(queries.detach(), keys.detach())
        out = yoso_cuda.lsh_attention(
            queries,
            keys,
            values,
            folded_mask,
            query_codes,
            key_codes,
            self.hash_bits,
            self.config.backward,
            self.config.backend,
        )
        return self.finish(out.view(batch, heads, length, v.shape[-1]), v)  # (b, h, n, dv)

    def finish(self, out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """N-YOSO's l2-normalised rows of ``out`` (b, h, n, dv), plus YOSO-C's convolution of ``v``."""
        out = F.normalize(out, dim=-1)
        if self.conv is not None:
            out = out + self.conv(v)  # (b, h, n, d); v is zero at padded positions (Attention.forward)
        return out

    def hash(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes ``(B, n, m)`` of queries and keys under the same fresh hash functions."""
        config = self.config
        return yoso_cuda.hash_queries_and_keys(
            queries, keys, config.num_hashes, self.hash_bits, config.hash_projection, config.backend
        )


@dataclass
class YosoExpectationConfig:
    hash_bits: int | None = None  # tau; None: ceil(log2(seq_len)), the paper's LRA rule
    backward: Literal["lower_bound", "exact"] = "lower_bound"  # the (tau/2) E surrogate of yoso_v1, or the true gradient
    conv_window: int | None = None  # a per-head depthwise convolution of V (odd width), as YOSO-C adds
    expectation: ClassVar[bool] = True  # YOSO-E, always: not a hyperparameter
    backend: ClassVar[yoso_cuda.ops.Backend] = "auto"  # yoso_e's fused CPU kernel where FlexAttention does not run

    def __post_init__(self) -> None:
        if self.hash_bits is not None and not 1 <= self.hash_bits <= MAX_HASH_BITS:
            raise ValueError(f"hash_bits must be in [1, {MAX_HASH_BITS}], got {self.hash_bits}")
        SequenceConv.check_width(self.conv_window, "conv_window")


@register("yoso_e_flex")
class FlexYosoExpectation(YosoAttention):
    """YOSO-E on FlexAttention's fused kernels where they run backward (CUDA): ``yoso_e``'s values and gradients
    without the n x n weights in memory and the padding's work; elsewhere ``yoso_e``'s path."""

    Config = YosoExpectationConfig

    def attend(self, q, k, v, mask):
        if not flex_attention_available(q.device):
            return super().attend(q, k, v, mask)
        real = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device) if mask is None else mask
        unit_q, unit_k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # (b, h, n, d)
        out = expectation_flex(unit_q, unit_k, v, real, self.hash_bits, self.config.backward)  # (b, h, n, dv)
        return self.finish(out, v)


# The YOSO rows of the paper's Table 3. tau is log2 of the padded length (hash_bits=None).
_TABLE3 = dict(hash_bits=None, hash_projection="hadamard")
register_preset(
    "yoso_e",
    "yoso",
    "YOSO-E (Table 3 'yoso-e'): the exact expectation, O(n^2), with the (tau/2) E surrogate backward of the "
    "official yoso_v1 YOSO-E",
    num_hashes=32,
    backward="lower_bound",
    conv_window=None,
    expectation=True,
    **_TABLE3,
)
register_preset(
    "yoso_32",
    "yoso",
    "YOSO-32 (Table 3 'yoso-32'): 32 hashes, the (tau/2)-lower-bound backward",
    num_hashes=32,
    backward="lower_bound",
    conv_window=None,
    expectation=False,
    **_TABLE3,
)
register_preset(
    "yoso_c_16",
    "yoso",
    "YOSO-C-16 (Table 3 'yoso-C-16'): 16 hashes plus a 33-wide per-head depthwise convolution of V (the width of "
    "the authors' efficiency scripts; the paper does not state the LRA width)",
    num_hashes=16,
    backward="lower_bound",
    conv_window=33,
    expectation=False,
    **_TABLE3,
)
register_preset(
    "yoso_star_16",
    "yoso",
    "*YOSO-16 (Table 3 '*yoso-16'): 16 hashes, the exact-derivative backward on collided pairs",
    num_hashes=16,
    backward="exact",
    conv_window=None,
    expectation=False,
    **_TABLE3,
)
register_preset(
    "yoso_star_c_16",
    "yoso",
    "*YOSO-C-16 (Table 3 '*yoso-C-16'): 16 hashes, the exact-derivative backward, a 33-wide depthwise convolution of V",
    num_hashes=16,
    backward="exact",
    conv_window=33,
    expectation=False,
    **_TABLE3,
)
