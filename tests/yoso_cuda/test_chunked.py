"""Reformer's fused CPU chunk attention (``yoso::chunked_attention``) against a float64 oracle written query by query:
values, log-sum-exps and gradients, padding, thread count, opcheck, bad inputs; and attention_zoo's reformer on it
against its dense path, gradients included."""

import pytest
import torch

import attention_zoo
from attention_zoo import reformer
from yoso_cuda import ops

KERNELS = ops.kernels()
pytestmark = pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
fused = torch.ops.yoso.chunked_attention


def inputs(batch, rounds, length, chunk, dim, value_dim, padding, seed):
    """Sorted chunks as reformer makes them: each head row is ``rounds`` permutations of positions 0..length-1, cut
    into chunks, so that a token's copy from another round can be in reach. ``padding``: None (every token real),
    "last" (each row's padded positions sorted after its real ones, as reformer sorts them; one row without a real
    token) or "anywhere" (positions real with probability 0.6)."""
    generator = torch.Generator().manual_seed(seed)
    chunks = rounds * length // chunk
    q, k = (torch.randn(batch, chunks, chunk, dim, generator=generator) for _ in range(2))
    v = torch.randn(batch, chunks, chunk, value_dim, generator=generator)
    real_positions = torch.ones(batch, length, dtype=torch.bool)
    if padding == "anywhere":
        real_positions = torch.rand(batch, length, generator=generator) < 0.6
    elif padding == "last":
        lengths = torch.randint(1, length + 1, (batch,), generator=generator)
        lengths[-1] = 0
        real_positions = torch.arange(length) < lengths[:, None]
    rows = []
    for b in range(batch):
        order = [torch.randperm(length, generator=generator) for _ in range(rounds)]
        if padding == "last":
            order = [o[torch.argsort((~real_positions[b, o]).to(torch.int8), stable=True)] for o in order]
        rows.append(torch.cat(order))
    position = torch.stack(rows).view(batch, chunks, chunk)  # (batch, chunks, chunk)
    real = real_positions.gather(1, position.flatten(1)).view_as(position)
    return q, k, v, position, real


def oracle(q, k, v, position, real):
    """float64, query by query: each real query against the real keys of the previous chunk (circularly) and of its
    own, its own token's score -1e5 (a constant, as a masked_fill makes it); zero rows for padded queries."""
    batch, chunks, chunk, _ = q.shape
    out = torch.zeros(*v.shape, dtype=torch.float64)
    lse = torch.zeros(*real.shape, dtype=torch.float64)
    for b in range(batch):
        for t in range(chunks):
            keys = [(s, j) for s in ((t - 1) % chunks, t) for j in range(chunk) if real[b, s, j]]
            for i in range(chunk):
                if not real[b, t, i]:
                    continue
                scores = torch.stack([q[b, t, i] @ k[b, s, j] for s, j in keys])
                own = torch.tensor([bool(position[b, s, j] == position[b, t, i]) for s, j in keys])
                scores = torch.where(own, torch.full_like(scores, -1e5), scores)
                out[b, t, i] = scores.softmax(0) @ torch.stack([v[b, s, j] for s, j in keys])
                lse[b, t, i] = scores.logsumexp(0)
    return out, lse


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "batch, rounds, length, chunk, dim, value_dim, padding",
    [
        (2, 2, 24, 8, 5, 3, "anywhere"),  # d and c not multiples of 8
        (3, 2, 20, 4, 8, 8, "last"),  # rows of every length, one with no real token
        (2, 1, 8, 8, 4, 6, None),  # one chunk, which looks back at itself: each key twice
        (2, 3, 12, 12, 4, 4, "last"),  # a round per chunk: the look-back reaches the previous round's copies
        (1, 2, 5, 1, 3, 2, "anywhere"),  # chunks of one token
        (2, 2, 64, 16, 16, 16, None),  # more keys in reach than a vector's multiple would need
    ],
)
def test_values_and_gradients_equal_the_float64_oracle(batch, rounds, length, chunk, dim, value_dim, padding, seed):
    q, k, v, position, real = inputs(batch, rounds, length, chunk, dim, value_dim, padding, seed)
    generator = torch.Generator().manual_seed(seed + 100)
    grad_out = torch.randn(v.shape, generator=generator)
    grad_lse = torch.randn(real.shape, generator=generator)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = fused(*leaves, position, real)
    grads = torch.autograd.grad((out * grad_out).sum() + (lse * grad_lse).sum(), leaves)
    # The oracle takes the float32 inputs exactly, so the comparison measures the kernel's arithmetic.
    exact_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    exact_out, exact_lse = oracle(*exact_leaves, position, real)
    exact_grads = torch.autograd.grad(
        (exact_out * grad_out.double()).sum() + (exact_lse * grad_lse.double()).sum(), exact_leaves, allow_unused=True
    )
    exact_grads = [torch.zeros_like(x) if g is None else g for x, g in zip(exact_leaves, exact_grads)]
    named = zip(["out", "lse", "grad q", "grad k", "grad v"], (out, lse, *grads), (exact_out, exact_lse, *exact_grads))
    for name, ours, theirs in named:
        torch.testing.assert_close(
            ours.double(), theirs, rtol=1e-5, atol=1e-6 + 2e-6 * theirs.abs().max().item(), msg=lambda m, n=name: f"{n}: {m}"
        )
    assert (out[~real] == 0).all() and (lse[~real] == 0).all(), "a padded query's rows are zero"


def test_the_thread_count_changes_no_bit(assert_thread_count_changes_no_bit):
    q, k, v, position, real = inputs(6, 2, 96, 16, 8, 8, "last", seed=4)
    grad_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(1))

    def compute():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = fused(*leaves, position, real)
        return [out, lse, *torch.autograd.grad((out * grad_out).sum() + lse.sum(), leaves)]

    assert_thread_count_changes_no_bit(compute)


def test_opcheck():
    q, k, v, position, real = inputs(2, 2, 16, 4, 8, 12, "last", seed=5)
    torch.library.opcheck(fused, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), position, real))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "queries": a["queries"][..., :3]}, "queries and keys of one shape"),
        (lambda a: {**a, "values": a["values"][:, :1]}, "queries and keys of one shape"),
        (lambda a: {**a, "keys": a["keys"].double()}, "computes in float32"),
        (lambda a: {**a, "position": a["position"].int()}, "position must be int64"),
        (lambda a: {**a, "real": a["real"][:, :1]}, "real must be bool"),
        (lambda a: {**a, "real": a["real"].float()}, "real must be bool"),
    ],
)
def test_bad_inputs_are_clear_errors(change, message):
    q, k, v, position, real = inputs(1, 2, 8, 4, 4, 4, None, seed=6)
    arguments = dict(queries=q, keys=k, values=v, position=position, real=real)
    with pytest.raises(ValueError, match=message):
        fused(**change(arguments))


@pytest.mark.parametrize(
    "length, chunk, num_hashes, padding",
    [
        (300, 32, 2, "right"),  # rows of 300, 150 and 1 tokens
        (300, 32, 2, "anywhere"),
        (97, 8, 3, None),  # a sequence padded to whole chunks by reformer itself
        (64, 64, 1, "one short"),  # one chunk, which looks back at itself
        (200, 16, 2, "none real"),  # a sequence without a real token
    ],
)
def test_reformer_runs_on_the_op_with_the_dense_paths_values_and_gradients(monkeypatch, length, chunk, num_hashes, padding):
    """attention_zoo's reformer in float32 on a CPU takes the op, and agrees with its dense path, values and
    gradients, at every position (padded rows are zero on both)."""
    generator = torch.Generator().manual_seed(length + chunk)
    q, v, grad = (torch.randn(3, 2, length, 16, generator=generator) for _ in range(3))
    mask = {
        None: None,
        "right": torch.arange(length) < torch.tensor([length, length // 2, 1])[:, None],
        "anywhere": torch.rand(3, length, generator=generator) < 0.6,
        "one short": torch.arange(length) < torch.tensor([length, length - 1, length - 3])[:, None],
        "none real": torch.arange(length) < torch.tensor([length, 0, 77])[:, None],
    }[padding]
    calls = []
    monkeypatch.setattr(reformer, "chunked_attention", lambda *a: calls.append(1) or fused(*a))
    results = []
    for path in ("kernel", "dense"):
        if path == "dense":
            monkeypatch.setattr(reformer, "has_kernel", lambda device: False)
        attention = attention_zoo.build(
            "reformer", seq_len=length, num_heads=2, head_dim=16, chunk_length=chunk, num_hashes=num_hashes
        ).train()
        torch.manual_seed(1)  # the same rotations on both paths
        leaves = [x.clone().requires_grad_() for x in (q, v)]
        out = attention(leaves[0], leaves[0], leaves[1], mask)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    assert calls == [1], "the kernel path takes the op once, the dense path never"
    for name, got, expected in zip(["out", "grad q", "grad v"], *results):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-6, msg=lambda m, n=name: f"{n}: {m}")
