"""Performer / FAVOR+ (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021).

Softmax attention is a kernel: exp(q.k / sqrt(d)) = exp(q'.k') with q' = q d^-1/4, k' = k d^-1/4.
FAVOR+ replaces the kernel by a dot product of positive random features (Lemma 1 of the paper),

    exp(x.y) = E_w[ exp(w.x - |x|^2/2) exp(w.y - |y|^2/2) ],   w ~ N(0, I_d),

so with m draws w_1..w_m, phi(x) = m^-1/2 exp(W x - |x|^2/2) gives phi(q').phi(k') as an unbiased
estimate of exp(q.k / sqrt(d)), and attention becomes linear in the sequence length n:

    out = phi(Q) (phi(K)^T V) / (phi(Q) (phi(K)^T 1))          # never forms the n x n matrix

Step by step, per forward call:

1. In training, every ``redraw_interval`` calls, draw a new projection W (m, d) from torch's global
   RNG: ceil(m/d) blocks of d orthonormal rows (QR of a Gaussian matrix), the last block cut to the
   remaining rows, each row then scaled to the length of an independent d-dim Gaussian vector
   (chi_d), so every row is exactly N(0, I_d) while rows of a block are orthogonal (the "O" in
   FAVOR+: orthogonal features lower the estimator's variance). ``feature_norms="sqrt_d"`` gives
   every row length sqrt(d) instead: the paper's regularized softmax kernel (SMREG), biased for
   exp(q.k). W is a buffer, so checkpoints hold it; in eval mode it is never redrawn.
2. In float32: scale q and k by d^-1/4, compute the logits W x and the positive features
   phi(x) = m^-1/2 (exp(W x - |x|^2/2 - c) + eps), where the stabiliser c is, as in the authors'
   code, the max of W x over the features of each query row, and over all (real) keys and features
   of each (batch, head) for the keys. A constant c cancels between numerator and denominator (up to
   the eps term) and keeps every exponent <= 0, so nothing overflows.
3. Padded keys get phi = 0, so they drop out of both sums; padded query rows are set to zero. On the
   CPU each sequence is computed alone up to its last real position, skipping the padding after it.
4. out = phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1), with the authors' guard that adds 2 eps to a
   normaliser of size <= eps (a sequence whose every key is padded has normaliser 0). The guard
   fires far more often than on empty rows: the key stabiliser is a max over every key and feature,
   so most keys' features are tiny and many normalisers fall below eps, and a guarded row comes out
   scaled by normaliser / (normaliser + 2 eps) <= 1/3. Share of query rows guarded with the default
   config (256 features, eps 1e-6; q, k with i.i.d. N(0, 1) entries, batch 4 x 2 heads, no padding;
   mean over seeds 0-4 and range; ``pytest -s tests/attention_zoo/test_performer.py -k guard``,
   2-core CPU): head dim 32: 9.2% (4.6-15.3%) at n = 256, 5.3% (2.3-7.0%) at n = 1024; head dim
   64: 86% (83-90%) at n = 256, 70% (66-73%) at n = 1024. The Table 3 preset (eps 1e-4, kernel
   exp(q.k / d)) guarded no row at head dim 64, n = 1024.

Choices where the sources differ or are silent:

* Redrawing. The authors' JAX code (``make_fast_softmax_attention``, ``redraw_features=True``)
  draws new features at every call, in training and evaluation alike, seeded from the sum of the
  queries; lucidrains' performer-pytorch redraws every 1000 training calls. Here the default
  ``redraw_interval=1`` redraws at every training call like the authors, but from torch's global
  RNG (a seed taken from the data would make padded values change the features) and never in eval.
  A draw serves exactly ``redraw_interval`` training calls; the call counter is saved in checkpoints.
* QR signs. ``torch.linalg.qr`` (like the ``jnp.linalg.qr`` of the authors' code) returns an R whose
  diagonal signs depend on the data; that biases row j of each block along e_j (a mean of about
  +-0.4 in coordinate j for d = 4) and with it the kernel estimate. Each column of Q is multiplied
  by the sign of R's diagonal entry, which makes the blocks exactly Haar-distributed (Mezzadri,
  2007), so every row is exactly N(0, I_d) and the estimate unbiased.
* Large norms. Like the authors' code, c leaves out |x|^2/2, so for inputs with a large
  |q|^2 / (2 sqrt(d)) the exponentials can fall below eps and the estimate flattens towards an
  average of the values: the variance of positive features grows like exp(|q' + k'|^2) anyway.
* eps defaults to 1e-6, the ``numerical_stabilizer`` of the authors' softmax FAVOR+ (lucidrains
  uses 1e-4). The stabiliser's max is differentiated through, as in the authors' JAX code (lucidrains
  detaches it); it matters only through eps.

The Nystromformer/YOSO LRA tables (the YOSO paper's Table 3 row "performer", the preset
``performer_lra``) ran lucidrains' ``FastAttention(nb_features=256)``: the FAVOR+ softmax kernel
despite its "relu" label, with features drawn once and never redrawn (``redraw_interval=None``),
q and k pre-scaled by d^-1/4 before FAVOR+ scales them again, an effective kernel exp(q.k / d)
(``double_qk_scaling=True``), and eps = 1e-4. That wrapper also zeroed padded keys instead of
removing them, so their features still entered the normaliser; here padded keys never contribute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from .registry import Attention, register, register_preset


@dataclass
class PerformerConfig:
    num_features: int = 256  # m, random features per head (the paper's setting and the authors' code default)
    feature_norms: Literal["chi", "sqrt_d"] = "chi"  # row lengths: chi_d (unbiased) or sqrt(d) (regularized SMREG)
    redraw_interval: int | None = 1  # draw new features every this many training calls; None = fixed (the LRA table)
    double_qk_scaling: bool = False  # scale q, k by d^-1/4 twice (kernel exp(q.k/d)), as the NF/YOSO LRA wrapper did
    eps: float = 1e-6  # added to every feature so all stay positive; also the normaliser guard

    def __post_init__(self) -> None:
        if self.num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {self.num_features}")
        if self.redraw_interval is not None and self.redraw_interval < 1:
            raise ValueError(
                f"redraw_interval must be >= 1 training calls, or None for fixed features; got {self.redraw_interval}"
            )
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0 (it keeps every feature positive), got {self.eps}")


def gaussian_orthogonal_random_matrix(
    num_rows: int, dim: int, norms: Literal["chi", "sqrt_d"] = "chi", device: torch.device | None = None
) -> torch.Tensor:
    """A (num_rows, dim) projection of stacked blocks of ``dim`` orthogonal rows, drawn from torch's global RNG.

    With ``norms="chi"`` every row is marginally N(0, I_dim); with ``"sqrt_d"`` every row has length sqrt(dim).
    """
    num_blocks = math.ceil(num_rows / dim)
    q, r = torch.linalg.qr(torch.randn(num_blocks, dim, dim, device=device))  # (blocks, d, d) each
    # Fix the signs QR leaves to the data, so each block is Haar-distributed (see the module docstring).
    q = q * torch.diagonal(r, dim1=-2, dim2=-1).sign().unsqueeze(-2)  # column j times sign(R_jj)
    rows = q.transpose(-2, -1).reshape(num_blocks * dim, dim)[:num_rows]  # (m, d), orthonormal within a block
    if norms == "chi":
        lengths = torch.randn(num_rows, dim, device=device).norm(dim=-1)  # (m,), chi_d distributed
    else:
        lengths = torch.full((num_rows,), math.sqrt(dim), device=device)  # (m,)
    return rows * lengths[:, None]  # (m, d)


def positive_random_features(
    x: torch.Tensor, projection: torch.Tensor, *, is_query: bool, eps: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """FAVOR+ features m^-1/2 (exp(W x - |x|^2/2 - c) + eps) of ``x`` (b, h, n, d), already scaled by d^-1/4.

    ``c`` is the max of ``W x`` over the features of each row for queries, and over the real keys and
    features of each (batch, head) for keys. ``mask`` (b, 1, n, 1), keys only: padded keys get zero
    features. Returns (b, h, n, m), float32 like ``x``.
    """
    logits = x @ projection.T  # (b, h, n, m): w_i . x
    half_sq_norm = x.square().sum(dim=-1, keepdim=True) / 2  # (b, h, n, 1)
    if is_query:
        stabiliser = logits.amax(dim=-1, keepdim=True)  # (b, h, n, 1)
    else:
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))  # padded keys: exp(-inf) = 0 and no part in the max
        # A sequence with every key padded has max -inf; 0 keeps its (all -inf) exponents NaN-free.
        stabiliser = logits.amax(dim=(-2, -1), keepdim=True).nan_to_num(neginf=0.0)  # (b, h, 1, 1)
    features = (torch.exp(logits - half_sq_norm - stabiliser) + eps) / math.sqrt(projection.shape[0])
    return features if mask is None else features.masked_fill(~mask, 0.0)  # padded keys lose their eps too


def _stabilised_exponentials(
    x: torch.Tensor,
    projection: torch.Tensor,
    key_mask: torch.Tensor | None,
    is_query: bool,
    with_directions: bool,
    real_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(E, directions)`` for ``x`` (b, h, n, d), already scaled: E = exp(W x - |x|^2/2 - c) (b, h, n, m), the
    features of :func:`positive_random_features` before their eps and m^-1/2, with the same stabiliser c; and, if
    ``with_directions`` (for the backward; else None), where c's gradient goes: per row, the mean of the projection
    rows w_j at which the logits reach c (b, h, n, d), the max's gradient split evenly among ties as ``amax``'s is
    (for keys, over every key and feature of a (batch, head)).

    One (b, h, n, m) tensor is made: the logits, turned into the exponentials in place. ``real_rows`` (b, 1, n, 1), for
    queries: padded rows get no direction (their gradient is dropped anyway), since a padded query is zero and ties at
    every feature, which the gather below would otherwise hold m times per row.
    """
    logits = x @ projection.T  # (b, h, n, m): w_j . x
    if key_mask is not None:
        logits.masked_fill_(~key_mask, float("-inf"))  # padded keys: exp(-inf) = 0 and no part in the max
    stabiliser = logits.amax(dim=-1 if is_query else (-2, -1), keepdim=True)  # (b, h, n, 1) or (b, h, 1, 1)
    if not is_query:
        stabiliser = stabiliser.nan_to_num(neginf=0.0)  # every key padded: the (all -inf) exponents stay NaN-free
    half_sq_norm = x.square().sum(dim=-1, keepdim=True) / 2  # (b, h, n, 1)
    if not with_directions:
        return logits.sub_(half_sq_norm + stabiliser).exp_(), None
    # Per row, the sum of w_j and the count over the positions j at the max: [logit == c] @ [W, 1].
    at_max = logits == stabiliser  # (b, h, n, m) bool
    if real_rows is not None:
        at_max &= real_rows
    with_ones = torch.cat([projection, projection.new_ones(projection.shape[0], 1)], dim=1)  # (m, d + 1)
    if torch.compiler.is_compiling():  # one graph, no data-dependent shapes; Inductor fuses the cast
        hits = at_max.to(x.dtype) @ with_ones  # (b, h, n, d + 1)
    else:  # about one position per row: gather those instead of multiplying a (b, h, n, m) matrix of zeros
        *row, feature = at_max.nonzero(as_tuple=True)
        hits = x.new_zeros(*at_max.shape[:-1], with_ones.shape[1]).index_put_(tuple(row), with_ones[feature], accumulate=True)
    ties = hits[..., -1:] if is_query else hits[..., -1:].sum(dim=-2, keepdim=True)  # (b, h, n, 1) or (b, h, 1, 1)
    directions = hits[..., :-1] / ties.clamp(min=1)  # (b, h, n, d); no ties (every key padded): zero
    return logits.sub_(half_sq_norm + stabiliser).exp_(), directions


def _exponentials_backward(
    grad: torch.Tensor,
    exponentials: torch.Tensor,
    x: torch.Tensor,
    projection: torch.Tensor,
    directions: torch.Tensor,
    is_query: bool,
) -> torch.Tensor:
    """The gradient for ``x`` of E = exp(x W^T - |x|^2/2 - c(x W^T)) given ``grad`` for E, which is overwritten."""
    grad_logits = grad.mul_(exponentials)  # (b, h, n, m): at a fixed stabiliser
    row_sums = grad_logits.sum(dim=-1, keepdim=True)  # (b, h, n, 1): minus the gradient for |x|^2/2
    through_max = row_sums if is_query else row_sums.sum(dim=-2, keepdim=True)  # minus the gradient for c
    return grad_logits @ projection - x * row_sums - through_max * directions  # (b, h, n, d)


def _favor_forward(q, k, values, projection, key_mask, eps):
    """``(out, context)`` of :class:`_Favor`'s forward on one batch: out (b, h, n, dv + 1), context (b, h, m, dv + 1)."""
    exp_k, _ = _stabilised_exponentials(k, projection, key_mask, is_query=False, with_directions=False)  # (b, h, n, m)
    real_values = values if key_mask is None else values.masked_fill(~key_mask, 0.0)  # (b, h, n, dv + 1)
    num_features = projection.shape[0]
    context = (exp_k.transpose(-2, -1) @ values + eps * real_values.sum(dim=-2, keepdim=True)) / num_features
    del exp_k  # (0 at padded keys) made again in the backward
    exp_q, _ = _stabilised_exponentials(q, projection, None, is_query=True, with_directions=False)  # (b, h, n, m)
    return exp_q @ context + eps * context.sum(dim=-2, keepdim=True), context  # (b, h, n, dv + 1)


def _favor_backward(grad_out, q, k, values, projection, key_mask, context, eps):
    """The gradients for ``q``, ``k`` and ``values`` of :func:`_favor_forward`'s ``out``, given ``grad_out`` for it."""
    num_features = projection.shape[0]
    exp_q, directions_q = _stabilised_exponentials(q, projection, None, True, True, real_rows=key_mask)
    grad_context = exp_q.transpose(-2, -1) @ grad_out + eps * grad_out.sum(dim=-2, keepdim=True)  # (b, h, m, dv + 1)
    grad_q = _exponentials_backward(grad_out @ context.transpose(-2, -1), exp_q, q, projection, directions_q, True)
    del exp_q
    exp_k, directions_k = _stabilised_exponentials(k, projection, key_mask, is_query=False, with_directions=True)
    grad_sums = grad_context / num_features  # (b, h, m, dv + 1): for E_K^T [V, 1] + eps sum_real [V, 1]
    eps_part = eps * grad_sums.sum(dim=-2, keepdim=True)  # (b, h, 1, dv + 1)
    if key_mask is not None:
        eps_part = torch.where(key_mask, eps_part, 0.0)  # (b, h, n, dv + 1): real keys only
    grad_values = exp_k @ grad_sums + eps_part  # (b, h, n, dv + 1)
    grad_k = _exponentials_backward(values @ grad_sums.transpose(-2, -1), exp_k, k, projection, directions_k, False)
    return grad_q, grad_k, grad_values


def _real_parts(lengths, key_mask):
    """``(i, index, mask)`` for each sequence i with a real position: ``index`` selects it up to its last real position
    in a (b, h, n, ...) tensor, and ``mask`` is its ``key_mask`` there, or None where every position up to there is
    real (right padding, as in every LRA task), which spares the masking's passes over the (n, m) exponentials."""
    for i, length in enumerate(lengths):
        if length:
            index = (slice(i, i + 1), slice(None), slice(0, length))
            mask = key_mask[index]
            yield i, index, None if bool(mask.all()) else mask


class _Favor(torch.autograd.Function):
    """The linear form of FAVOR+ before its normalisation: phi(Q) phi(K)^T [V, 1], (b, h, n, dv + 1).

    ``q``, ``k`` (b, h, n, d) already scaled, ``values`` (b, h, n, dv + 1) the values and a column of ones,
    ``projection`` (m, d) a fixed matrix (no gradient), ``key_mask`` (b, 1, n, 1) or None. The features
    phi = m^-1/2 (E + eps) are never formed: eps and m^-1/2 go into the small (b, h, m, dv + 1) context,

        phi(K)^T [V, 1] = (E_K^T [V, 1] + eps sum_real_keys [V, 1]) / m      (E_K is 0 at padded keys)
        phi(Q) context  = E_Q context + eps sum_features context,

    the same arithmetic as the written-out form up to float rounding. The backward is written out too, and makes E_Q
    and E_K again from Q and K (kept, like the values: (b, h, n, d)) one at a time, so no (b, h, n, m) tensor lives
    from the forward to the backward, and at most two at once (an E and its gradient), where autograd through the
    written-out form keeps and makes a dozen. Made again from the same inputs by the same operators, they are the
    forward's; the cost is their products and exponentials once more in the backward.

    ``lengths`` (one int per sequence, or None for the whole batch at once): each sequence is computed alone up to
    that position, its last real one plus one, and is zero after it, in the output and in every gradient. A key
    there has zero features and a query there a zero gradient (its output row is masked), so this is the
    whole-batch arithmetic without the products and exponentials of the padding.
    """

    @staticmethod
    def forward(ctx, q, k, values, projection, key_mask, eps, lengths):
        if projection.requires_grad:
            raise ValueError("the FAVOR+ projection is a fixed draw (a buffer), it takes no gradient")
        if lengths is None:
            out, context = _favor_forward(q, k, values, projection, key_mask, eps)
        else:
            (b, h, n, width), m = values.shape, projection.shape[0]
            out, context = values.new_zeros(b, h, n, width), values.new_zeros(b, h, m, width)
            for i, real, mask in _real_parts(lengths, key_mask):
                out[real], context[i : i + 1] = _favor_forward(q[real], k[real], values[real], projection, mask, eps)
        ctx.save_for_backward(q, k, values, projection, key_mask, context)
        ctx.eps, ctx.lengths = eps, lengths
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, values, projection, key_mask, context = ctx.saved_tensors
        eps, lengths = ctx.eps, ctx.lengths
        if lengths is None:
            grads = _favor_backward(grad_out, q, k, values, projection, key_mask, context, eps)
        else:
            grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(values))
            for i, real, mask in _real_parts(lengths, key_mask):
                pieces = _favor_backward(
                    grad_out[real], q[real], k[real], values[real], projection, mask, context[i : i + 1], eps
                )
                for grad, piece in zip(grads, pieces, strict=True):
                    grad[real] = piece
        return *grads, None, None, None, None


@register("performer")
class PerformerAttention(Attention):
    Config = PerformerConfig
    in_float32 = True  # the exponentials and the two sums over n

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: PerformerConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        # One projection shared by all heads, as in the authors' code; a buffer, so checkpoints hold it.
        self.register_buffer("projection", self.draw_projection(device=None))  # (m, d)
        self.calls_since_redraw = 0  # training forward calls served by the current projection

    def draw_projection(self, device: torch.device | None) -> torch.Tensor:
        return gaussian_orthogonal_random_matrix(
            self.config.num_features, self.head_dim, self.config.feature_norms, device=device
        )

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Draw a new projection from torch's global RNG on the projection's device."""
        # Rebind instead of copying in place: a graph from an earlier call that has not run its
        # backward yet (the retrieval task's two encoder passes) still needs the old matrix.
        self.projection = self.draw_projection(device=self.projection.device)
        self.calls_since_redraw = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"calls_since_redraw": self.calls_since_redraw}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.calls_since_redraw = state["calls_since_redraw"]

    def attend(self, q, k, v, mask):
        interval = self.config.redraw_interval
        if self.training and interval is not None:
            # torch.compile specialises a graph on the counter's value: at interval 1 there are two
            # (the first call's and every later one's), above it one per call of the interval, so
            # there the count and the draw run outside the graph (a graph break) instead.
            if interval == 1 or not torch.compiler.is_compiling():
                self.count_training_call()
            else:
                torch.compiler.disable(self.count_training_call)()
        return self.favor(q, k, v, mask)

    def count_training_call(self) -> None:
        """Count one training call, first drawing new features if the current ones have served ``redraw_interval``."""
        if self.calls_since_redraw >= self.config.redraw_interval:
            self.redraw_features()
        self.calls_since_redraw += 1

    def favor(self, q, k, v, mask):
        """FAVOR+ on (b, h, n, d) inputs (float32: :meth:`Attention.forward` casts them); padded keys never contribute.

        The features phi = m^-1/2 (E + eps), with E the stabilised exponentials, are never formed: eps and m^-1/2 are
        applied to the small (b, h, m, dv + 1) context instead, phi(K)^T [V, 1] = (E_K^T [V, 1] + eps sum_real [V, 1]) / m
        (E_K is 0 at padded keys), then phi(Q) context = E_Q context + eps sum_m context. Numerator and normaliser come
        out of one product with the values and a column of ones. The same arithmetic as the written-out form
        (:func:`positive_random_features`) up to float rounding, with at most two (b, h, n, m) tensors at a time
        instead of a dozen.

        With a mask, on the CPU and outside torch.compile, each sequence stops at its last real position: the padding
        after it, about 40% of a ListOps batch, costs nothing (the paper-protocol ListOps step 1.8-2.0 s before, 1.0-1.1
        after: results/step_cpu_performer/). Elsewhere the whole batch runs at once, without the host synchronisation
        and the data-dependent shapes that the lengths would take.
        """
        eps = self.config.eps
        scale = self.head_dim ** (-0.5 if self.config.double_qk_scaling else -0.25)
        key_mask = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
        lengths = None
        if mask is not None and mask.device.type == "cpu" and not torch.compiler.is_compiling():
            positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)  # (n,)
            lengths = (mask * positions).amax(dim=-1).tolist()  # per sequence: its last real position + 1, or 0
        w = self.projection.to(q.dtype)  # (m, d), float32 also in a model cast to a lower precision
        values = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # (b, h, n, dv + 1): V and a column of ones
        out = _Favor.apply(q * scale, k * scale, values, w, key_mask, eps, lengths)  # (b, h, n, dv + 1)
        numerator, denominator = out[..., :-1], out[..., -1:]  # phi(Q) phi(K)^T V, phi(Q) phi(K)^T 1
        denominator = denominator + 2 * eps * (denominator.abs() <= eps)  # the authors' guard against 0 / 0
        return numerator / denominator


register_preset(
    "performer_lra",
    "performer",
    "the YOSO paper's Table 3 row (the Nystromformer/YOSO LRA code): the FAVOR+ softmax kernel, 256 features "
    "drawn once, q and k scaled by d^-1/4 twice, lucidrains' eps",
    num_features=256,
    feature_norms="chi",
    redraw_interval=None,
    double_qk_scaling=True,
    eps=1e-4,
)
