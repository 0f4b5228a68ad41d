"""The pure-PyTorch YOSO ops against brute-force dense computations from the same hash codes."""

import math

import pytest
import torch

from yoso_cuda import reference


def collision_matrix(query_codes, query_mask, key_codes, key_mask):
    """(B, nq, nk, m) bool: query i and real key j share hash h; padded queries collide with nothing."""
    same = query_codes[:, :, None, :] == key_codes[:, None, :, :]
    return same & query_mask[:, :, None, None] & key_mask[:, None, :, None]


def random_case(tau, seed=0, batch=2, nq=23, nk=31, dim=8):
    generator = torch.Generator().manual_seed(seed)
    num_hashes = 5
    query_codes = torch.randint(0, 2**tau, (batch, nq, num_hashes), generator=generator, dtype=torch.int32)
    key_codes = torch.randint(0, 2**tau, (batch, nk, num_hashes), generator=generator, dtype=torch.int32)
    query_mask = torch.rand(batch, nq, generator=generator) < 0.8
    key_mask = torch.rand(batch, nk, generator=generator) < 0.8
    tensors = {
        name: torch.randn(batch, n, dim, generator=generator)
        for name, n in (("qw", nq), ("qv", nq), ("kw", nk), ("kv", nk), ("v", nk))
    }
    tensors["qv"], tensors["kv"] = (torch.nn.functional.normalize(tensors[k], dim=-1) for k in ("qv", "kv"))
    return query_codes, query_mask, key_codes, key_mask, tensors


# tau = 1 puts about half of all keys in each bucket, so lsh_weighted_cumulation takes the
# bucket-table path for some hashes (2 of 5 here) and pair enumeration for the others; tau = 3 and
# 12 leave buckets small (pair enumeration only).
TAUS = [1, 3, 12]


@pytest.mark.parametrize("tau", TAUS)
def test_lsh_cumulation_equals_the_dense_collision_sum(tau):
    query_codes, query_mask, key_codes, key_mask, t = random_case(tau)
    collide = collision_matrix(query_codes, query_mask, key_codes, key_mask).double()
    expected = torch.einsum("bijh,bjc->bic", collide, t["v"].double()) / query_codes.shape[-1]
    out = reference.lsh_cumulation(query_codes, query_mask, key_codes, key_mask, t["v"], tau)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tau", TAUS)
def test_lsh_weighted_cumulation_equals_the_dense_weighted_sum(tau):
    query_codes, query_mask, key_codes, key_mask, t = random_case(tau)
    collide = collision_matrix(query_codes, query_mask, key_codes, key_mask).double().sum(-1)  # (B, nq, nk)
    weights = t["qw"].double() @ t["kw"].double().transpose(-1, -2)
    expected = (collide * weights) @ t["v"].double() / query_codes.shape[-1]
    out = reference.lsh_weighted_cumulation(query_codes, query_mask, t["qw"], key_codes, key_mask, t["kw"], t["v"], tau)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tau", TAUS)
def test_lsh_collided_gradient_counts_each_colliding_pair_once(tau):
    query_codes, query_mask, key_codes, key_mask, t = random_case(tau)
    collided = collision_matrix(query_codes, query_mask, key_codes, key_mask).any(-1).double()  # union over hashes
    x = (t["qv"].double() @ t["kv"].double().transpose(-1, -2)) * reference.DERIVATIVE_SHRINK
    p = 1 - torch.arccos(x) / math.pi
    derivative = tau * p ** (tau - 1) / (math.pi * torch.sqrt(1 - x * x))
    weights = (t["qw"].double() @ t["kw"].double().transpose(-1, -2)) * derivative * collided
    expected = weights @ t["kv"].double()
    out = reference.lsh_collided_gradient(query_codes, query_mask, t["qv"], t["qw"], key_codes, key_mask, t["kv"], t["kw"], tau)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


def test_pair_enumeration_in_small_chunks_gives_the_same_sum(monkeypatch):
    query_codes, query_mask, key_codes, key_mask, t = random_case(1)
    args = (query_codes, query_mask, t["qv"], t["qw"], key_codes, key_mask, t["kv"], t["kw"], 1)
    whole = reference.lsh_collided_gradient(*args)
    monkeypatch.setattr(reference, "MAX_PAIRS_PER_CHUNK", 7)
    torch.testing.assert_close(reference.lsh_collided_gradient(*args), whole, rtol=1e-6, atol=1e-6)


def test_expected_collisions_is_the_collision_probability():
    q = torch.nn.functional.normalize(torch.randn(1, 4, 6), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, 5, 6), dim=-1)
    theta = torch.arccos((q @ k.transpose(-1, -2)).clamp(-1, 1))
    torch.testing.assert_close(reference.expected_collisions(q, k, 7), (1 - theta / math.pi) ** 7)
