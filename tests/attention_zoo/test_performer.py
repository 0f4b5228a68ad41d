"""Performer / FAVOR+: the random-feature kernel estimate, its convergence to softmax, and the feature schedule."""

import math

import pytest
import torch
from zoo_inputs import random_qkv

import attention_zoo
from attention_zoo.performer import gaussian_orthogonal_random_matrix, positive_random_features


def build(head_dim=8, heads=2, **hparams):
    return attention_zoo.build("performer", seq_len=64, num_heads=heads, head_dim=head_dim, **hparams)


def qkv(batch, heads, seq_len, head_dim, seed=0, qk_scale=0.5):
    """Small-norm queries and keys: the estimator's variance grows like exp(|q + k|^2 / sqrt(d))."""
    return random_qkv(batch, seq_len, seed=seed, heads=heads, head_dim=head_dim, qk_scale=qk_scale)


def softmax_attention(q, k, v, scale, mask=None):
    scores = q.double() @ k.double().transpose(-1, -2) * scale  # (b, h, n, n)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = scores.softmax(-1) @ v.double()  # (b, h, n, d)
    return out if mask is None else out * mask[:, None, :, None]


def test_positive_features_are_an_unbiased_estimate_of_the_softmax_kernel():
    d, m, draws = 4, 8, 4000
    q, k, _ = qkv(1, 1, 3, d, qk_scale=0.6)  # (1, 1, 3, d)
    scaled_q, scaled_k = q * d**-0.25, k * d**-0.25
    exact = torch.exp(q[0, 0] @ k[0, 0].T / math.sqrt(d))  # (3, 3)
    torch.manual_seed(0)
    # Independent draws of m rows stacked: blocks are independent, so this is `draws` projections at once.
    w = gaussian_orthogonal_random_matrix(draws * m, d)  # (draws * m, d)
    phi_q = positive_random_features(scaled_q, w, is_query=True, eps=0.0)[0, 0]  # (3, draws * m)
    phi_k = positive_random_features(scaled_k, w, is_query=False, eps=0.0)[0, 0]  # (3, draws * m)
    # Undo the documented stabilisers: the max of W x per query row, and over all keys and features.
    shift_q = (scaled_q[0, 0] @ w.T).amax(-1, keepdim=True)  # (3, 1)
    shift_k = (scaled_k[0, 0] @ w.T).amax()
    products = phi_q[:, None, :] * phi_k[None, :, :] * torch.exp(shift_q + shift_k)[..., None]  # (3, 3, draws * m)
    estimates = draws * products.view(3, 3, draws, m).sum(-1)  # (3, 3, draws): one m-feature estimate per draw
    mean, standard_error = estimates.mean(-1), estimates.std(-1) / math.sqrt(draws)
    assert ((mean - exact).abs() < 4 * standard_error).all(), (mean - exact) / standard_error
    torch.testing.assert_close(mean, exact, rtol=0.03, atol=0)
    # One estimate from the first 4096 features (relative std about 0.97 / sqrt(512) for the worst pair).
    first = products[..., :4096].sum(-1) * (draws * m / 4096)  # (3, 3): phi's 1/(draws m) rescaled to 1/4096
    torch.testing.assert_close(first, exact, rtol=0.15, atol=0)


def test_feature_blocks_are_orthogonal_with_chi_or_sqrt_d_norms():
    d, m = 16, 40  # two full blocks and a block cut to 8 rows
    torch.manual_seed(0)
    for norms in ("chi", "sqrt_d"):
        w = gaussian_orthogonal_random_matrix(m, d, norms).double()
        assert w.shape == (m, d)
        for block in (w[:16], w[16:32], w[32:]):
            gram = block @ block.T
            torch.testing.assert_close(gram, torch.diag(block.square().sum(-1)), rtol=0, atol=1e-5 * d)
        assert (w[:16] @ w[16:32].T).abs().max() > 0.1, "different blocks are independent, not orthogonal"
    torch.testing.assert_close(w.norm(dim=-1), torch.full((m,), math.sqrt(d), dtype=torch.float64), rtol=1e-6, atol=0)
    rows = gaussian_orthogonal_random_matrix(4 * 4000, 4)  # 4000 blocks of 4 rows, chi norms
    # Each row is N(0, I): squared length chi^2_4 with mean 4, and mean zero in every coordinate,
    # which needs QR's sign fix (without it row j of a block averages about +-0.75 in coordinate j).
    assert abs(rows.square().sum(-1).mean().item() - 4) < 0.15
    assert rows.view(4000, 4, 4).mean(0).abs().max() < 0.08


def test_error_against_softmax_falls_as_the_number_of_features_grows():
    n, d, seeds = 64, 16, 6
    errors = {}
    for m in (64, 256, 1024):
        total = 0.0
        for seed in range(seeds):
            q, k, v = qkv(1, 2, n, d, seed=seed)
            torch.manual_seed(seed)
            out = build(head_dim=d, num_features=m).eval()(q, k, v)
            reference = softmax_attention(q, k, v, d**-0.5)
            total += ((out.double() - reference).norm() / reference.norm()).item()
        errors[m] = total / seeds
    assert errors[1024] < errors[256] < errors[64], errors
    assert errors[1024] < 0.5 * errors[64], errors  # about 1/sqrt(m): a factor 4 in theory
    assert errors[1024] < 0.15, errors


@pytest.mark.parametrize("double_qk_scaling, scale, tolerance", [(False, 8**-0.5, 0.03), (True, 1 / 8, 0.01)])
def test_many_features_converge_to_exact_softmax(double_qk_scaling, scale, tolerance):
    """The exact limit m -> infinity: softmax(q.k / sqrt(d)), or softmax(q.k / d) for the LRA table's double scaling."""
    q, k, v = qkv(2, 2, 16, 8)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 11:] = False
    torch.manual_seed(0)
    attn = build(head_dim=8, num_features=2**16, double_qk_scaling=double_qk_scaling).eval()
    out = attn(q, k, v, mask)
    expected = softmax_attention(q, k, v, scale, mask)
    assert (out.double() - expected).abs().max() < tolerance


@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_linear_form_equals_the_dense_feature_attention_and_padding_equals_truncation(value_dim):
    d = 8
    torch.manual_seed(0)
    attn = build(head_dim=d, num_features=32).eval()
    q, k, _ = qkv(2, 2, 10, d, qk_scale=1.0)
    v = qkv(2, 2, 10, value_dim, seed=1)[2]
    # Dense reference: A = phi(Q) phi(K)^T, out = A V / A 1.
    phi_q = positive_random_features(q * d**-0.25, attn.projection, is_query=True, eps=attn.config.eps)
    phi_k = positive_random_features(k * d**-0.25, attn.projection, is_query=False, eps=attn.config.eps)
    weights = phi_q.double() @ phi_k.double().transpose(-1, -2)  # (b, h, n, n)
    expected = weights @ v.double() / weights.sum(-1, keepdim=True)  # (b, h, n, dv)
    torch.testing.assert_close(attn(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    # Padded keys leave both sums and the stabiliser: a padded sequence equals its real prefix alone.
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    out = attn(q, k, v, mask)
    torch.testing.assert_close(out[1, :, :6], attn(q[1:, :, :6], k[1:, :, :6], v[1:, :, :6])[0])
    torch.testing.assert_close(out[0], attn(q[:1], k[:1], v[:1])[0])
    assert (out[1, :, 6:] == 0).all()


def test_features_redrawn_every_interval_in_training_and_fixed_in_eval():
    torch.manual_seed(0)
    attn = build(redraw_interval=3)
    q, k, v = qkv(1, 2, 5, 8)
    drawn = [attn.projection]
    for _ in range(7):
        attn(q, k, v)
        drawn.append(attn.projection)
    # Each draw serves exactly 3 training calls: the initial one calls 1-3, the next 4-6, then 7.
    assert all(drawn[i] is drawn[0] for i in range(1, 4))
    assert all(drawn[i] is drawn[4] for i in range(4, 7))
    assert drawn[7] is not drawn[4] and not torch.equal(drawn[7], drawn[4])
    assert not torch.equal(drawn[4], drawn[0])
    attn.eval()
    rng_state = torch.get_rng_state()
    outputs = [attn(q, k, v) for _ in range(5)]
    assert attn.projection is drawn[7] and all(torch.equal(out, outputs[0]) for out in outputs)
    assert torch.equal(torch.get_rng_state(), rng_state), "eval draws nothing from the global RNG"

    fixed = build(redraw_interval=None).train()
    projection = fixed.projection.clone()
    for _ in range(4):
        fixed(q, k, v)
    assert torch.equal(fixed.projection, projection)


def test_redraws_come_from_the_global_rng_and_every_call_by_default():
    attn = build()  # redraw_interval=1: every training call after the first draws new features
    q, k, v = qkv(1, 2, 5, 8)
    attn(q, k, v)
    torch.manual_seed(7)
    attn(q, k, v)
    first = attn.projection
    torch.manual_seed(7)
    attn.redraw_features()
    assert torch.equal(attn.projection, first)
    # Two passes before one backward (the retrieval task's two encoder passes) must not trip autograd.
    q.requires_grad_()
    (attn(q, k, v).sum() + attn(q, k, v).sum()).backward()
    assert torch.isfinite(q.grad).all()


def test_checkpoint_holds_the_features_and_the_redraw_counter():
    torch.manual_seed(0)
    trained = build(redraw_interval=5)
    q, k, v = qkv(1, 2, 6, 8)
    for _ in range(7):
        trained(q, k, v)
    state = trained.state_dict()
    torch.manual_seed(1)
    restored = build(redraw_interval=5)
    assert not torch.equal(restored.projection, trained.projection)
    restored.load_state_dict(state)
    assert torch.equal(restored.projection, trained.projection)
    assert restored.calls_since_redraw == trained.calls_since_redraw == 2
    torch.testing.assert_close(restored.eval()(q, k, v), trained.eval()(q, k, v), rtol=0, atol=0)


def test_math_runs_in_float32_under_autocast():
    torch.manual_seed(0)
    attn = build().eval()
    q, k, v = qkv(2, 2, 9, 8, qk_scale=1.0)
    expected = attn(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_invalid_hyperparameters_name_the_problem():
    with pytest.raises(ValueError, match="num_features"):
        build(num_features=0)
    with pytest.raises(ValueError, match="redraw_interval"):
        build(redraw_interval=0)
    with pytest.raises(ValueError, match="eps"):
        build(eps=0.0)
    with pytest.raises(TypeError, match="feature_norms"):
        build(feature_norms="uniform")


def guard_share(head_dim, seq_len, seed, **hparams):
    """Share of (query row) normalisers phi(q) . sum_j phi(k_j) that are <= eps, where the guard adds 2 eps.

    256 features drawn under ``torch.manual_seed(seed)``; q and k with i.i.d. N(0, 1) entries, batch 4 x 2
    heads, no padding (data seed 100 + seed).
    """
    torch.manual_seed(seed)
    attn = attention_zoo.build("performer", seq_len=seq_len, num_heads=2, head_dim=head_dim, num_features=256, **hparams)
    generator = torch.Generator().manual_seed(100 + seed)
    q, k = (torch.randn(4, 2, seq_len, head_dim, generator=generator) for _ in range(2))
    eps = attn.config.eps
    scale = head_dim ** (-0.5 if attn.config.double_qk_scaling else -0.25)
    phi_q = positive_random_features(q * scale, attn.projection, is_query=True, eps=eps)  # (b, h, n, m)
    phi_k = positive_random_features(k * scale, attn.projection, is_query=False, eps=eps)  # (b, h, n, m)
    normaliser = phi_q @ phi_k.sum(-2).unsqueeze(-1)  # (b, h, n, 1)
    return (normaliser <= eps).double().mean().item()


def test_how_often_the_normaliser_guard_fires():
    """The figures of performer.py's docstring (``pytest -s``): with the key stabiliser a max over every key
    and feature, most keys' features sit far below 1, and at head dim 64 most normalisers fall below eps.
    The Table 3 preset (eps 1e-4, kernel exp(q.k / d)) never reaches its guard at these sizes."""
    print()
    shares = {}
    for head_dim in (32, 64):
        for seq_len in (256, 1024):
            shares[head_dim, seq_len] = [guard_share(head_dim, seq_len, seed) for seed in range(5)]
            values = shares[head_dim, seq_len]
            print(f"d = {head_dim}, n = {seq_len}: {sum(values) / 5:.1%} of rows ({min(values):.1%}-{max(values):.1%})")
    preset = dict(redraw_interval=None, double_qk_scaling=True, eps=1e-4)
    preset_shares = [guard_share(64, 1024, seed, **preset) for seed in range(5)]
    print(f"Table 3 preset, d = 64, n = 1024: {max(preset_shares):.1%} of rows at most")
    assert all(0 < share < 0.2 for seq_len in (256, 1024) for share in shares[32, seq_len])
    assert all(share > 0.5 for seq_len in (256, 1024) for share in shares[64, seq_len])
    assert max(preset_shares) == 0


def written_out_favor(attn, q, k, v, mask):
    """FAVOR+ through autograd over the written-out features: the form ``favor`` computes with its own backward."""
    eps, scale = attn.config.eps, attn.head_dim ** (-0.5 if attn.config.double_qk_scaling else -0.25)
    key_mask = None if mask is None else mask[:, None, :, None]
    phi_q = positive_random_features(q * scale, attn.projection, is_query=True, eps=eps)
    phi_k = positive_random_features(k * scale, attn.projection, is_query=False, eps=eps, mask=key_mask)
    denominator = phi_q @ phi_k.sum(-2).unsqueeze(-1)
    out = phi_q @ (phi_k.transpose(-1, -2) @ v) / (denominator + 2 * eps * (denominator.abs() <= eps))
    return out if mask is None else out.masked_fill(~key_mask, 0.0)


@pytest.mark.parametrize("preset", ["performer", "performer_lra"])
@pytest.mark.parametrize(
    "masked, whole_batch",
    [(False, True), (True, False), (True, True)],
    ids=["no-mask", "masked-per-sequence", "masked-whole-batch"],
)
def test_gradients_equal_autograd_through_the_written_out_features(preset, masked, whole_batch, monkeypatch):
    """``favor``'s own backward (features never formed) against autograd over ``positive_random_features``, in
    float64 (``favor``: the module's forward takes float32 at most): the stabiliser's max differentiated through,
    its gradient split evenly among tied logits (two equal projection rows, the longest, at which a query row and a
    key reach their max), padded keys (a hole, right padding, a sequence with every key padded); and torch's gradient
    check. With a mask on the CPU ``favor`` computes each sequence up to its last real position; the whole batch at
    once is what it runs on a GPU and under torch.compile, here forced by making it believe it is compiling."""
    if whole_batch:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.manual_seed(0)
    attn = attention_zoo.build(preset, seq_len=16, num_heads=2, head_dim=8).double()
    longest = attn.projection[attn.projection.norm(dim=-1).argmax()].clone()
    attn.projection[0] = attn.projection[1] = 1.5 * longest  # logits 0 and 1 always tie
    q, k, v = (torch.randn(3, 2, 16, 8, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(3))
    q[0, 0, 3] = k[1, 1, 5] = longest / longest.norm()  # their max is at the tie
    mask = None
    if masked:
        mask = torch.ones(3, 16, dtype=torch.bool)
        mask[1, 10:] = False
        mask[1, 4] = False  # a hole before the last real position
        mask[2] = False
    weights = torch.linspace(-1, 1, v.numel(), dtype=torch.float64).view_as(v)

    def favor(q, k, v, mask):
        out = attn.favor(q, k, v, mask)
        return out if mask is None else out.masked_fill(~mask[:, None, :, None], 0.0)

    grads = []
    for forward in (favor, lambda *inputs: written_out_favor(attn, *inputs)):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = forward(*inputs, mask)
        (out * weights).sum().backward()
        grads.append([out.detach(), *(t.grad for t in inputs)])
    for ours, expected in zip(*grads, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *qkv: favor(*qkv, mask), inputs, fast_mode=True)
