"""Every attention that claims linear memory allocates nothing of size n x n, forward and backward.

A TorchDispatchMode sees every tensor an operator returns, in the forward and in the backward pass
(which runs on this thread for CPU tensors), and records the largest storage among them (views
share their base's storage, so an ``expand`` to n x n costs nothing and counts nothing). Linear
memory means: doubling n at most about doubles the largest allocation, and at n = 16384 it stays far
below n * n elements.
"""

import pytest
import torch
from zoo_inputs import LargestAllocation, forward_backward_allocation

import attention_zoo

HEADS, HEAD_DIM = 2, 32
SIZES = (8192, 16384)
QUADRATIC_FIX = (
    ". If the attention's memory grows as n^2 by design (an n x n score matrix, like softmax), declare it in its class: "
    "`linear_memory = False` (attention_zoo/registry.py, Attention). This test then leaves it out; nothing else changes "
    "(it trains and is benchmarked as before, and the efficiency benchmark records where it runs out of memory)."
)


def largest_allocation(name: str, hparams: dict, seq_len: int) -> tuple[int, str]:
    torch.manual_seed(0)
    attn = attention_zoo.build(name, seq_len=seq_len, num_heads=HEADS, head_dim=HEAD_DIM, **hparams).train()
    q, k, v = (torch.randn(1, HEADS, seq_len, HEAD_DIM, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, seq_len, dtype=torch.bool)
    mask[0, -seq_len // 3 :] = False
    return forward_backward_allocation(attn, q, k, v, mask)


def linear_cases() -> dict[str, tuple[str, dict]]:
    """Every registered attention with its defaults and every registered preset, if linear."""
    cases = {name: (name, {}) for name in [*attention_zoo.available(), *attention_zoo.presets()]}
    return {
        case: (name, hparams)
        for case, (name, hparams) in cases.items()
        if attention_zoo.build(name, seq_len=8, num_heads=1, head_dim=4, **hparams).linear_memory
    }


CASES = linear_cases()


def test_the_recorder_sees_quadratic_forward_and_backward_allocations():
    x = torch.randn(64, 8, requires_grad=True)
    with LargestAllocation() as record:
        scores = (x @ x.T).softmax(-1).sum()
    assert record.largest == 64 * 64
    with LargestAllocation() as record:
        scores.backward()  # only the backward pass is recorded here
    assert record.largest == 64 * 64
    with LargestAllocation() as record:
        torch.randn(64, 1).expand(64, 64).sum()
    assert record.largest == 64, "a view allocates nothing"


def assert_linear_memory(case: str, name: str, hparams: dict, sizes: tuple[int, int] = SIZES) -> None:
    (small, _), (large, operator) = (largest_allocation(name, hparams, n) for n in sizes)
    n = sizes[-1]
    assert large < n * n / 4, f"{case}: {operator} allocated {large} elements at n={n} (n*n = {n * n}){QUADRATIC_FIX}"
    assert large <= 2.2 * small, f"{case}: largest allocation grew {large / small:.2f}x from n={sizes[0]} to n={n}{QUADRATIC_FIX}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_memory_is_linear_in_the_sequence_length(case):
    assert_linear_memory(case, *CASES[case])


def test_a_quadratic_attention_that_does_not_say_so_is_told_how_to_declare_it():
    """The failure a new attention's author meets names the fix (issue 36)."""

    @attention_zoo.register("dense_scores_for_the_test")
    class DenseScores(attention_zoo.Attention):
        def attend(self, q, k, v, mask):
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v  # (b, h, n, n) scores

    try:
        with pytest.raises(AssertionError, match=r"declare it in its class: `linear_memory = False`"):
            assert_linear_memory("dense_scores_for_the_test", "dense_scores_for_the_test", {}, sizes=(256, 512))
    finally:
        attention_zoo.unregister("dense_scores_for_the_test")
