"""The compiled ops against the pure-PyTorch reference: values, dtypes, masks, limits, opcheck.

CPU kernels are built wherever a C++ compiler exists (CI builds them); CUDA tests are marked
``cuda`` and need a GPU.
"""

import shutil

import pytest
import torch

from yoso_cuda import ops, reference

KERNELS = ops.kernels()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def test_cpu_kernels_are_built_where_a_compiler_exists():
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert KERNELS.cpu, KERNELS.error


def require(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU on this machine")
    if not ops.has_kernel(torch.device(device)):
        pytest.skip(f"{device} kernels not built: {KERNELS.error or KERNELS.notes}")


def case(length, dim, tau, dtype, device, num_hashes=4, seed=0):
    """Codes from real hashing of correlated vectors (so buckets are realistic), masks, weights."""
    generator = torch.Generator().manual_seed(seed)
    batch = 2
    x = torch.randn(batch, length, dim, generator=generator)
    queries = torch.nn.functional.normalize(x, dim=-1)
    keys = torch.nn.functional.normalize(x + 0.7 * torch.randn(batch, length, dim, generator=generator), dim=-1)
    torch.manual_seed(seed)
    signs = reference.random_signs(batch, dim, num_hashes, tau)
    query_codes = reference.hash_codes(queries, signs, num_hashes, tau)
    key_codes = reference.hash_codes(keys, signs, num_hashes, tau)
    mask = torch.rand(batch, length, generator=generator) < 0.85
    mask[1, length // 2 :] = False
    weights = torch.randn(batch, length, dim, generator=generator)
    values = torch.randn(batch, length, dim, generator=generator)
    to = lambda t: t.to(device)  # noqa: E731
    floats = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return dict(
        queries=floats(queries), keys=floats(keys), signs=to(signs), query_codes=to(query_codes),
        key_codes=to(key_codes), mask=to(mask), weights=floats(weights), values=floats(values),
    )


GRID = [(1, 16, 8), (7, 32, 1), (1000, 64, 12), (4097, 100, 16), (300, 32, 3)]


def assert_matches(out, expected, dtype):
    tolerance = TOLERANCE[dtype]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_cumulation_matches_the_reference(device, dtype, length, dim, tau):
    require(device)
    c = case(length, dim, tau, dtype, device)
    args = (c["query_codes"], c["mask"], c["key_codes"], c["mask"], c["values"], tau)
    assert_matches(torch.ops.yoso.lsh_cumulation(*args), reference.lsh_cumulation(*args), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_weighted_cumulation_matches_the_reference(device, dtype, length, dim, tau):
    require(device)
    c = case(length, dim, tau, dtype, device)
    args = (c["query_codes"], c["mask"], c["weights"], c["key_codes"], c["mask"], c["values"], c["keys"], tau)
    assert_matches(torch.ops.yoso.lsh_weighted_cumulation(*args), reference.lsh_weighted_cumulation(*args), dtype)


@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_weighted_cumulation_both_matches_the_reference(dtype, length, dim, tau):
    require("cpu")
    c = case(length, dim, tau, dtype, "cpu")
    args = (c["query_codes"], c["mask"], c["weights"], c["queries"], c["key_codes"], c["mask"], c["values"], c["keys"], tau)
    for out, expected in zip(torch.ops.yoso.lsh_weighted_cumulation_both(*args), reference.lsh_weighted_cumulation_both(*args)):
        assert_matches(out, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_collided_gradient_matches_the_reference(device, dtype, length, dim, tau):
    require(device)
    c = case(length, dim, tau, dtype, device)
    args = (c["query_codes"], c["mask"], c["queries"], c["weights"], c["key_codes"], c["mask"], c["keys"], c["values"], tau)
    assert_matches(torch.ops.yoso.lsh_collided_gradient(*args), reference.lsh_collided_gradient(*args), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_hash_codes_match_the_reference(device, length, dim, tau):
    """The butterfly and the reference's Hadamard matmul sum in different orders, so a coordinate
    within rounding of zero may flip a bit; anything beyond a rare flip is a bug."""
    require(device)
    c = case(length, dim, tau, torch.float32, device, num_hashes=9)
    codes = torch.ops.yoso.hash_codes(c["queries"], c["signs"], 9, tau)
    expected = reference.hash_codes(c["queries"].cpu(), c["signs"].cpu(), 9, tau)
    assert codes.dtype == torch.int32 and codes.shape == expected.shape
    assert (codes.cpu() == expected).float().mean() > 0.999


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_are_deterministic(device):
    require(device)
    c = case(2000, 32, 4, torch.float32, device)
    args = (c["query_codes"], c["mask"], c["weights"], c["key_codes"], c["mask"], c["values"], c["keys"], 4)
    first = torch.ops.yoso.lsh_weighted_cumulation(*args)
    assert torch.equal(first, torch.ops.yoso.lsh_weighted_cumulation(*args))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_are_clear_errors(device):
    require(device)
    c = case(10, 16, 4, torch.float32, device)
    with pytest.raises(ValueError, match="hash_bits must be in"):
        torch.ops.yoso.lsh_cumulation(c["query_codes"], c["mask"], c["key_codes"], c["mask"], c["values"], 31)
    with pytest.raises(ValueError, match="int32"):
        torch.ops.yoso.lsh_cumulation(c["query_codes"].long(), c["mask"], c["key_codes"], c["mask"], c["values"], 4)
    with pytest.raises(ValueError, match="bool"):
        torch.ops.yoso.lsh_cumulation(c["query_codes"], c["mask"].float(), c["key_codes"], c["mask"], c["values"], 4)
    with pytest.raises(ValueError, match="signs hold"):
        torch.ops.yoso.hash_codes(c["queries"], c["signs"], 1000, 4)


OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    require(device)
    c = case(33, 16, 5, torch.float32, device)
    calls = {
        "hash_codes": (c["queries"], c["signs"], 4, 5),
        "lsh_cumulation": (c["query_codes"], c["mask"], c["key_codes"], c["mask"], c["values"], 5),
        "lsh_weighted_cumulation": (c["query_codes"], c["mask"], c["weights"], c["key_codes"], c["mask"], c["values"], c["keys"], 5),
        "lsh_collided_gradient": (c["query_codes"], c["mask"], c["queries"], c["weights"], c["key_codes"], c["mask"], c["keys"], c["values"], 5),
    }
    if device == "cpu":
        calls["lsh_weighted_cumulation_both"] = (
            c["query_codes"], c["mask"], c["weights"], c["queries"], c["key_codes"], c["mask"], c["values"], c["keys"], 5
        )
    for name, args in calls.items():
        torch.library.opcheck(getattr(torch.ops.yoso, name), args, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("backward", ["lower_bound", "exact"])
def test_yoso_attention_runs_on_the_kernels_with_the_reference_gradients(backward, monkeypatch):
    require("cpu")
    import attention_zoo

    def run():
        torch.manual_seed(0)
        attn = attention_zoo.build("yoso", seq_len=200, num_heads=2, head_dim=32, num_hashes=8, backward=backward)
        q, k, v = (torch.randn(2, 2, 200, 32, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
        mask = torch.ones(2, 200, dtype=torch.bool)
        mask[1, 150:] = False
        out = attn(q, k, v, mask)
        out.square().sum().backward()
        return out, q.grad, k.grad, v.grad

    compiled = run()
    monkeypatch.setattr(ops, "has_kernel", lambda device: False)
    for kernel_value, reference_value in zip(compiled, run()):
        torch.testing.assert_close(kernel_value, reference_value, rtol=1e-4, atol=1e-4)
