"""Nystromformer against float64 references: exact softmax in its limits, the pseudo-inverse, the landmarks."""

import math

import pytest
import torch

import attention_zoo
from attention_zoo.nystromformer import iterative_pinv, segment_means, softmax_kernel


def build(seq_len, heads=2, head_dim=8, **hparams):
    return attention_zoo.build("nystromformer", seq_len=seq_len, num_heads=heads, head_dim=head_dim, **hparams).eval()


def softmax_reference(q, k, v, mask):
    """softmax(Q K^T / sqrt(d)) V in float64 with padded keys dropped and padded query rows zero."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, n, n)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v
    return out if mask is None else out * mask[:, None, :, None]


def conv_reference(v, weight):
    """Depthwise convolution along the sequence, zero padded: out[t] = sum_j w[h, j] v[t + j - size // 2]."""
    size = weight.shape[2]
    out = torch.zeros_like(v)
    for j in range(size):
        shift = j - size // 2
        shifted = torch.zeros_like(v)
        if shift >= 0:
            shifted[:, :, : v.shape[2] - shift] = v[:, :, shift:]
        else:
            shifted[:, :, -shift:] = v[:, :, :shift]
        out += weight[:, 0, j, 0].double()[None, :, None, None] * shifted
    return out


def nystrom_reference(q, k, v, mask, m, conv_weight=None, iterations=6, init="per_matrix"):
    """The algorithm written out in float64: explicit segment boundaries, the paper's iteration."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, n, d = q.shape
    keep = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
    q, k, v = (t * keep[:, None, :, None] for t in (q, k, v))
    q = q / math.sqrt(d)
    size, longer = divmod(n, m)
    bounds = [0]
    for j in range(m):
        bounds.append(bounds[-1] + size + (j < longer))
    q_l = torch.stack([q[:, :, s:e].mean(2) for s, e in zip(bounds, bounds[1:])], dim=2)  # (b, h, m, d)
    k_l = torch.stack([k[:, :, s:e].mean(2) for s, e in zip(bounds, bounds[1:])], dim=2)  # (b, h, m, d)
    f = (q @ k_l.transpose(-1, -2)).softmax(-1)
    a = (q_l @ k_l.transpose(-1, -2)).softmax(-1)
    b_kernel = (q_l @ k.transpose(-1, -2) - 1e9 * ~keep[:, None, None, :]).softmax(-1)  # the authors' -1e9
    norms = a.sum(-2).amax(-1) * a.sum(-1).amax(-1)  # ||A||_1 ||A||_inf per matrix, (b, h)
    if init == "batch_max":
        norms = a.sum(-2).amax() * a.sum(-1).amax()
        norms = norms.expand(b, h)
    z = a.transpose(-1, -2) / norms[..., None, None]
    eye = torch.eye(m, dtype=torch.float64)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    out = f @ z @ b_kernel @ v
    if conv_weight is not None:
        out = out + conv_reference(v, conv_weight)
    return out * keep[:, None, :, None]


def random_qkv(batch, heads, n, d, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(scale * torch.randn(batch, heads, n, d, generator=generator) for _ in range(3))


def varied_mask(batch, n):
    """Row 0 unpadded, row 1 padded from the middle, row 2 a single real token, row 3 fully padded."""
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[1, n // 2 :] = False
    mask[2, 1:] = False
    mask[3] = False
    return mask


def test_config_validation():
    for bad, match in (
        ({"num_landmarks": 0}, "num_landmarks"),
        ({"pinv_iterations": 0}, "pinv_iterations"),
        ({"conv_window": 32}, "conv_window must be a positive odd"),
        ({"conv_window": -1}, "conv_window must be a positive odd"),
        ({"conv_kernel_size": 33}, "'conv_kernel_size' of attention 'nystromformer' is now called 'conv_window'"),
    ):
        with pytest.raises(ValueError, match=match):
            build(16, **bad)
    with pytest.raises(TypeError, match="pinv_init"):
        build(16, pinv_init="global")
    assert list(build(16, conv_window=None).parameters()) == []
    assert build(16).conv.weight.shape == (2, 1, 33, 1), "one 33-tap kernel per head by default"


def test_segment_means_handle_any_length():
    x = torch.randn(2, 3, 23, 4)
    sizes = [5, 5, 5, 4, 4]  # 23 tokens in 5 segments: the first 23 mod 5 = 3 hold one token more
    expected = torch.stack([chunk.mean(2) for chunk in x.split(sizes, dim=2)], dim=2)
    torch.testing.assert_close(segment_means(x, 5), expected)
    # n divisible by m: the authors' reshape-and-mean
    torch.testing.assert_close(segment_means(x[:, :, :20], 5), x[:, :, :20].reshape(2, 3, 5, 4, 4).mean(3))
    torch.testing.assert_close(segment_means(x, 23), x)
    torch.testing.assert_close(segment_means(x, 1), x.mean(2, keepdim=True))


def test_iterative_pinv_approaches_linalg_pinv():
    x = random_qkv(3, 2, 8, 16)[0].double()
    a = softmax_kernel(x / 4, x)  # (3, 2, 8, 8) kernel of 8 tokens against themselves, condition < 10
    exact = torch.linalg.pinv(a)
    errors = [((iterative_pinv(a, i) - exact).norm() / exact.norm()).item() for i in range(1, 7)]
    assert all(later <= earlier for earlier, later in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-9, "6 iterations reach A^+ on a well conditioned kernel"
    torch.testing.assert_close(iterative_pinv(a.float()), exact.float(), rtol=1e-4, atol=1e-4)

    # Independent queries and keys give a worse conditioned kernel (condition ~ 50): 6 iterations are
    # still an approximation there, but the same iteration converges to A^+ with more.
    q, k, _ = random_qkv(1, 1, 8, 16)
    hard = softmax_kernel(q.double() / 4, k.double())
    assert torch.linalg.cond(hard).item() > 20
    exact = torch.linalg.pinv(hard)
    errors = [((iterative_pinv(hard, i) - exact).norm() / exact.norm()).item() for i in (2, 6, 10, 20)]
    assert errors[0] > errors[1] > 0.1 > 1e-9 > errors[2] and errors[3] < 1e-12, errors
    z = iterative_pinv(hard, 20)
    torch.testing.assert_close(hard @ z @ hard, hard)  # Penrose: A Z A = A and Z A Z = Z
    torch.testing.assert_close(z @ hard @ z, z)


def paper_pinv(a, iterations, init):
    """The paper's iteration as written, Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))), through autograd,
    from the start as iterative_pinv takes it (the maxima in the same order: a softmax's row sums tie at 1, and amax
    splits its gradient among ties per reduction)."""
    max_column_sum = a.abs().sum(-2).amax(-1, keepdim=True)[..., None]  # (b, h, 1, 1)
    max_row_sum = a.abs().sum(-1).amax(-1, keepdim=True)[..., None]
    if init == "batch_max":
        max_column_sum, max_row_sum = max_column_sum.amax(), max_row_sum.amax()
    z = a.transpose(-1, -2) / (max_column_sum * max_row_sum)
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@pytest.mark.parametrize("init", ["per_matrix", "batch_max"])
def test_iterative_pinv_and_its_written_out_backward_equal_the_papers_formula(init):
    """The iteration on -Z with its own backward: the same values and gradient as autograd through the formula
    (float64), and a gradient that finite differences confirm (gradcheck)."""
    q, k, _ = random_qkv(2, 3, 7, 5, seed=11)
    a = softmax_kernel(q.double() / 2, k.double()).requires_grad_()  # (2, 3, 7, 7)
    grad = torch.randn(2, 3, 7, 7, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    for iterations in (1, 6):
        z = iterative_pinv(a, iterations, init)
        (ours,) = torch.autograd.grad(z, a, grad)
        expected = paper_pinv(a, iterations, init)
        (reference,) = torch.autograd.grad(expected, a, grad)
        torch.testing.assert_close(z, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-10)
    small = a.detach()[:1, :2, :4, :4].clone().requires_grad_()  # any square matrices, not only kernels
    assert torch.autograd.gradcheck(lambda x: iterative_pinv(x, 3, init), (small,))
    assert torch.autograd.gradcheck(lambda x: iterative_pinv(x, 2, init), (small[0, 0].detach().clone().requires_grad_(),))


def test_pinv_initialisation_is_the_papers():
    a = softmax_kernel(*random_qkv(2, 3, 6, 4)[:2]).double()  # (2, 3, 6, 6)
    max_col, max_row = a.sum(-2).amax(-1), a.sum(-1).amax(-1)  # ||A||_1, ||A||_inf: (2, 3)
    torch.testing.assert_close(iterative_pinv(a, 0), a.transpose(-1, -2) / (max_col * max_row)[..., None, None])
    torch.testing.assert_close(iterative_pinv(a, 0, "batch_max"), a.transpose(-1, -2) / (max_col.max() * max_row.max()))
    # A fully padded sequence makes A uniform (rank one); the iteration keeps its exact pinv, itself.
    uniform = torch.full((1, 1, 5, 5), 0.2, dtype=torch.float64)
    for init in ("per_matrix", "batch_max"):
        torch.testing.assert_close(iterative_pinv(uniform, 6, init), torch.linalg.pinv(uniform))


@pytest.mark.parametrize("n", [1, 6, 13])
def test_as_many_landmarks_as_tokens_is_exact_softmax(n):
    q, k, v = random_qkv(4, 2, n, 8)
    mask = varied_mask(4, n)
    expected = softmax_reference(q, k, v, mask)
    for landmarks in (n, n + 5):  # more landmarks than tokens are clamped to n
        attn = build(n, num_landmarks=landmarks, conv_window=None)
        torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)
    attn = build(n, num_landmarks=n, conv_window=3)
    with_conv = softmax_reference(q, k, v, None) + conv_reference(v.double(), attn.conv.weight.detach())
    torch.testing.assert_close(attn(q, k, v).double(), with_conv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n, m", [(24, 6), (23, 5)])
def test_exact_on_tokens_constant_within_each_segment(n, m):
    """If Q and K are constant over each landmark segment, the attention matrix has rank m and
    F A^+ B = softmax(Q K^T) exactly: the Nystrom path itself meets softmax in its exact limit."""
    sizes = [n // m + (j < n % m) for j in range(m)]
    base = random_qkv(2, 2, m, 8, seed=1, scale=1.5)[0]  # keys = queries keep A well conditioned for 6 iterations
    q = k = base.repeat_interleave(torch.tensor(sizes), dim=2)  # (2, 2, n, 8)
    v = torch.randn(2, 2, n, 8)
    attn = build(n, num_landmarks=m, conv_window=None)
    torch.testing.assert_close(attn(q, k, v).double(), softmax_reference(q, k, v, None), rtol=1e-4, atol=1e-5)
    # Padding a whole segment gives a zero landmark, which F and A share: still exact on the real tokens.
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - sizes[-1] :] = False
    torch.testing.assert_close(attn(q, k, v, mask).double(), softmax_reference(q, k, v, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("init", ["per_matrix", "batch_max"])
@pytest.mark.parametrize("n, m", [(32, 8), (30, 7)])
@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_equals_the_written_out_algorithm(n, m, init, value_dim):
    """Landmarks (divisible or not), the three kernels, 6 pinv iterations, the conv residual, masks."""
    q, k, _ = random_qkv(4, 2, n, 8, seed=2)
    v = torch.randn(4, 2, n, value_dim, generator=torch.Generator().manual_seed(3))
    mask = varied_mask(4, n)
    torch.manual_seed(0)
    attn = build(n, num_landmarks=m, conv_window=5, pinv_init=init)
    expected = nystrom_reference(q, k, v, mask, m, attn.conv.weight.detach(), init=init)
    out = attn(q, k, v, mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    assert (out[3] == 0).all() and (out[1, :, n // 2 :] == 0).all()


def test_batch_max_couples_the_batch_and_per_matrix_does_not():
    q, k, v = random_qkv(2, 2, 30, 8, seed=3)
    q[1] *= 10  # a sharper second example raises the batch-wide max column sum of A
    for init, coupled in (("per_matrix", False), ("batch_max", True)):
        attn = build(30, num_landmarks=6, conv_window=None, pinv_init=init)
        alone, together = attn(q[:1], k[:1], v[:1]), attn(q, k, v)[:1]
        assert torch.allclose(alone, together, rtol=1e-5, atol=1e-6) != coupled, init


def test_float32_math_under_autocast_and_half_inputs():
    q, k, v = random_qkv(2, 2, 40, 8, seed=4)
    attn = build(40, num_landmarks=8)
    reference = attn(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(attn(q, k, v), reference)
    out = attn.half()(q.half(), k.half(), v.half())  # half weights and inputs: the math still runs in float32
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), reference, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_gradients_through_the_landmark_path(dtype):
    """The contract tests' gradient check runs at n = 64 = the default landmarks (the exact path)."""
    q, k, v = (t.to(dtype).requires_grad_() for t in random_qkv(4, 2, 50, 8, seed=5))
    attn = build(50, num_landmarks=8).train()
    attn(q, k, v, varied_mask(4, 50)).float().square().sum().backward()
    for tensor in (q, k, v, attn.conv.weight):
        assert torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0
    assert (q.grad[3] == 0).all() and (v.grad[3] == 0).all(), "a fully padded sequence gets no gradient"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_landmark_path_compiles_under_bfloat16_autocast(backend):
    """torch.compile traces a backward under the autocast its forward ran in (torch's default), so the pseudo-inverse's
    written-out backward sees bfloat16 products; it runs them in float32, as its forward did, instead of failing on
    the in-place products' mixed dtypes. The other products of the backward are then bfloat16's (close to eager's);
    with that autocast off, as lra.module compiles a step, every value is eager's."""
    q, k, v = (t.requires_grad_() for t in random_qkv(4, 2, 50, 8, seed=6))
    mask = varied_mask(4, 50)
    attn = build(50, num_landmarks=8)
    grad = torch.randn(4, 2, 50, 8, generator=torch.Generator().manual_seed(7))

    def step(attention):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attention(q, k, v, mask)
        return out, *torch.autograd.grad(out, (q, k, v), grad)

    expected = step(attn)
    torch._dynamo.reset()
    traced_in_bfloat16 = step(torch.compile(attn, backend=backend, fullgraph=True))
    for ours, reference in zip(traced_in_bfloat16, expected):
        torch.testing.assert_close(ours, reference, rtol=0.05, atol=0.05)
    if hasattr(torch._functorch.config, "backward_pass_autocast"):
        torch._dynamo.reset()
        with torch._functorch.config.patch(backward_pass_autocast="off"):
            as_eager = step(torch.compile(attn, backend=backend, fullgraph=True))
        for ours, reference in zip(as_eager, expected):
            torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
