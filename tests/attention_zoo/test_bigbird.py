"""BigBird against a dense float64 reference built from the definition, and its attended sets."""

import pytest
import torch
from zoo_inputs import HEAD_DIM, HEADS, attend64, builder, ragged_mask, random_qkv, softmax_reference

build = builder("bigbird")


def allowed_pairs(attn, n):
    """(h, n, n) bool from the definition: j is in a global block, in i's window, or in i's random blocks."""
    block = attn.config.block_size
    num_blocks = -(-n // block)
    bi, bj = (torch.arange(n) // block)[:, None], (torch.arange(n) // block)[None, :]
    is_global = lambda b: (b == 0) | (b == num_blocks - 1)  # noqa: E731
    base = is_global(bi) | is_global(bj) | ((bi - bj).abs() <= 1)  # (n, n)
    allowed = base.expand(HEADS, n, n).clone()
    random = attn.random_blocks(num_blocks)  # (h, c - 2, r): the blocks the module drew
    for head in range(HEADS):
        for query_block in range(1, num_blocks - 1):
            for key_block in random[head, query_block - 1].tolist():
                if key_block >= 0:
                    allowed[head] |= (bi == query_block) & (bj == key_block)
    return allowed


CASES = [
    # (n, block_size, num_random_blocks, random_within): multiples of the block and not, one block,
    # two blocks (all global), pools smaller than r, the 1024-token cap and none.
    (1, 4, 3, 1024),
    (7, 4, 3, 1024),
    (16, 4, 2, 1024),
    (37, 4, 3, 1024),
    (61, 4, 3, 1024),
    (61, 4, 3, 16),
    (61, 4, 1, None),
    (50, 16, 3, 1024),
    (23, 4, 0, 1024),
]


@pytest.mark.parametrize(("n", "block", "r", "within"), CASES)
def test_equals_dense_attention_over_the_definition_in_float64(n, block, r, within):
    attn = build(n, block_size=block, num_random_blocks=r, random_within=within)
    q, k, v = random_qkv(4, n, dtype=torch.float64, value_dim=2 * HEAD_DIM)
    allowed = allowed_pairs(attn, n)
    for mask in (ragged_mask(n, row3=max(n // 3, 1)), None):
        expected = softmax_reference(q, k, v, mask, allowed)
        torch.testing.assert_close(attend64(attn, q, k, v, mask), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(attn(q.float(), k.float(), v.float(), mask).double(), expected, rtol=1e-5, atol=1e-5)


def test_random_blocks_are_distinct_outside_the_window_and_the_globals_and_within_the_cap():
    block = 4
    for within, n in ((1024, 400), (40, 400), (None, 400)):
        attn = build(n, block_size=block, num_random_blocks=3, random_within=within)
        num_blocks = n // block
        top = num_blocks - 2 if within is None else min(num_blocks - 2, within // block - 1)
        random = attn.random_blocks(num_blocks)  # (h, c - 2, r)
        assert random.shape == (HEADS, num_blocks - 2, 3)
        for head in range(HEADS):
            for query_block in range(1, num_blocks - 1):
                chosen = random[head, query_block - 1]
                pool = {b for b in range(1, top + 1) if abs(b - query_block) > 1}
                assert len(set(chosen.tolist())) == 3
                assert set(chosen.tolist()) <= pool if len(pool) >= 3 else set(chosen.tolist()) == pool | {-1}


def test_random_blocks_are_fixed_per_layer_and_differ_between_heads_and_layers():
    attn, other = build(1024), build(1024)
    first = attn.random_blocks(16)
    torch.manual_seed(123)
    assert torch.equal(attn.random_blocks(16), first), "the blocks do not change between calls"
    assert not torch.equal(first[0], first[1]), "each head draws its own blocks"
    assert not torch.equal(other.random_blocks(16), first), "each layer draws its own blocks"
    torch.manual_seed(0)
    again = build(1024).random_blocks(16)
    torch.manual_seed(0)
    assert torch.equal(build(1024).random_blocks(16), again), "the seed at build time fixes them"


def test_an_input_longer_than_seq_len_is_rejected():
    attn = build(64, block_size=4)
    q, k, v = random_qkv(1, 65)
    with pytest.raises(ValueError, match="seq_len=64"):
        attn(q, k, v)


def test_a_query_attends_to_exactly_global_window_and_random_keys():
    """Perturbing a key outside a query's set leaves its output unchanged; perturbing one inside changes it."""
    n, block = 48, 4
    attn = build(n, block_size=block, num_random_blocks=2)
    q, k, v = random_qkv(1, n, dtype=torch.float64)
    allowed = allowed_pairs(attn, n)
    reference = attend64(attn, q, k, v, None)
    query = 6 * block + 1  # a middle block: its window is blocks 5..7
    changed_out = 0
    for key in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, key] += 3.0
        v2[:, :, key] += 3.0
        out = attend64(attn, q, k2, v2, None)[0, :, query]  # (h, dv)
        for head in range(HEADS):
            moved = not torch.allclose(out[head], reference[0, head, query], rtol=0, atol=1e-12)
            assert moved == bool(allowed[head, query, key]), f"head {head}, key {key}"
            changed_out += moved
    assert 0 < changed_out < HEADS * n
    # The global rows see every key.
    assert allowed[:, :block].all() and allowed[:, -block:].all()
