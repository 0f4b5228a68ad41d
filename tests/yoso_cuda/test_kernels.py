"""The compiled ops against the pure-PyTorch reference: values, dtypes, masks, limits, opcheck.

CPU kernels are built wherever a C++ compiler exists (CI builds them); CUDA tests are marked
``cuda`` and need a GPU.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import yoso_cuda
from yoso_cuda import ops, reference
from yoso_cuda.tolerances import HASH_CODE_AGREEMENT, TOLERANCE

KERNELS = ops.kernels()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def test_cpu_kernels_are_built_where_a_compiler_exists():
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert KERNELS.cpu.loaded, KERNELS.cpu.reason


def require(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU on this machine")
    if not ops.has_kernel(torch.device(device)):
        pytest.skip(f"{device} kernels not built: {getattr(KERNELS, device).reason}")


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
        queries=floats(queries),
        keys=floats(keys),
        signs=to(signs),
        query_codes=to(query_codes),
        key_codes=to(key_codes),
        mask=to(mask),
        weights=floats(weights),
        values=floats(values),
    )


# (length, dim, tau): on a GPU, (4097, 100, 16) takes the radix path (2^16 buckets exceed the counting
# sort's table) and the others the counting sort; (1000, 16, 1) crowds two buckets of ~400 rows, past
# the weighted cumulations' heavy threshold (63 rows at w = c = 16), so their tables are used;
# (3000, 16, 2) indexes its buckets of ~600 rows in two rounds of 2048 rows.
GRID = [(1, 16, 8), (7, 32, 1), (1000, 64, 12), (4097, 100, 16), (300, 32, 3), (1000, 16, 1), (3000, 16, 2)]


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_weighted_cumulation_both_matches_the_reference(device, dtype, length, dim, tau):
    require(device)
    c = case(length, dim, tau, dtype, device)
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
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("length, dim, tau", GRID)
def test_lsh_lower_bound_gradients_match_the_reference(device, dtype, length, dim, tau):
    require(device)
    c = case(length, dim, tau, dtype, device)
    args = (c["query_codes"], c["mask"], c["queries"], c["weights"], c["key_codes"], c["mask"], c["keys"], c["values"], tau)
    outputs = torch.ops.yoso.lsh_lower_bound_gradients(*args)
    for out, expected in zip(outputs, reference.lsh_lower_bound_gradients(*args), strict=True):
        assert_matches(out, expected, dtype)


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
    assert (codes.cpu() == expected).float().mean() > HASH_CODE_AGREEMENT


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_are_deterministic(device):
    require(device)
    c = case(2000, 32, 4, torch.float32, device)
    args = (c["query_codes"], c["mask"], c["weights"], c["key_codes"], c["mask"], c["values"], c["keys"], 4)
    first = torch.ops.yoso.lsh_weighted_cumulation(*args)
    assert torch.equal(first, torch.ops.yoso.lsh_weighted_cumulation(*args))


def test_cpu_kernels_give_the_same_bits_on_any_number_of_threads(assert_thread_count_changes_no_bit):
    """The CPU kernels split batch rows (hashing: blocks of rows) across torch's intra-op threads."""
    require("cpu")
    c = case(700, 32, 5, torch.float32, "cpu", num_hashes=6)
    c["mask"][0, :3] = False  # padded rows at the start of a batch row
    assert_thread_count_changes_no_bit(
        lambda: [
            torch.ops.yoso.hash_codes(c["queries"], c["signs"], 6, 5),
            torch.ops.yoso.lsh_cumulation(c["query_codes"], c["mask"], c["key_codes"], c["mask"], c["values"], 5),
            *torch.ops.yoso.lsh_weighted_cumulation_both(
                c["query_codes"], c["mask"], c["weights"], c["queries"], c["key_codes"], c["mask"], c["values"], c["keys"], 5
            ),
        ]
    )


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


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def differentiable(c):
    """The case's float tensors as fresh leaves that require grad."""
    return {name: t.detach().clone().requires_grad_() if t.is_floating_point() else t for name, t in c.items()}


def raw_op_calls(c, tau):
    return {
        "hash_codes": (c["queries"], c["signs"], 4, tau),
        "lsh_cumulation": (c["query_codes"], c["mask"], c["key_codes"], c["mask"], c["values"], tau),
        "lsh_weighted_cumulation": (
            c["query_codes"],
            c["mask"],
            c["weights"],
            c["key_codes"],
            c["mask"],
            c["values"],
            c["keys"],
            tau,
        ),
        "lsh_weighted_cumulation_both": (
            c["query_codes"],
            c["mask"],
            c["weights"],
            c["queries"],
            c["key_codes"],
            c["mask"],
            c["values"],
            c["keys"],
            tau,
        ),
        "lsh_collided_gradient": (
            c["query_codes"],
            c["mask"],
            c["queries"],
            c["weights"],
            c["key_codes"],
            c["mask"],
            c["keys"],
            c["values"],
            tau,
        ),
        "lsh_lower_bound_gradients": (
            c["query_codes"],
            c["mask"],
            c["queries"],
            c["weights"],
            c["key_codes"],
            c["mask"],
            c["keys"],
            c["values"],
            tau,
        ),
    }


# The ops that are gradient estimates themselves (YOSO's backward): no derivative of their own.
ESTIMATORS = ["lsh_collided_gradient", "lsh_lower_bound_gradients"]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_of_the_raw_ops(device):
    require(device)
    c = case(33, 16, 5, torch.float32, device)
    for name, args in raw_op_calls(differentiable(c), 5).items():
        # A double backward through YOSO's estimators is an error, so their gradients are not traced.
        tests = ("test_autograd_registration",) if name in ESTIMATORS else OPCHECK_TESTS
        torch.library.opcheck(getattr(torch.ops.yoso, name), args, test_utils=tests)
    for name in ESTIMATORS:
        plain = raw_op_calls(c, 5)[name]
        torch.library.opcheck(
            getattr(torch.ops.yoso, name), plain, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["lsh_cumulation", "lsh_weighted_cumulation", "lsh_weighted_cumulation_both"])
def test_raw_op_gradients_equal_autograd_through_the_reference(device, name):
    """The registered gradients are exact: they match autograd through the reference's sums."""
    require(device)
    c = differentiable(case(300, 16, 3, torch.float32, device))
    args = raw_op_calls(c, 3)[name]
    inputs = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
    gradients = []
    for function in (getattr(torch.ops.yoso, name), getattr(reference, name)):
        outputs = function(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        weights = [torch.randn(out.shape, generator=torch.Generator().manual_seed(i)).to(device) for i, out in enumerate(outputs)]
        loss = sum((out * weight).sum() for out, weight in zip(outputs, weights))
        gradients.append(torch.autograd.grad(loss, inputs))
    for kernel_grad, reference_grad in zip(*gradients):
        torch.testing.assert_close(kernel_grad, reference_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_the_gradient_estimators_have_no_double_backward(name):
    require("cpu")
    c = differentiable(case(20, 16, 3, torch.float32, "cpu"))
    out = getattr(torch.ops.yoso, name)(*raw_op_calls(c, 3)[name])
    out = out if isinstance(out, tuple) else (out,)
    with pytest.raises(NotImplementedError, match=f"yoso::{name} is .*double backward"):
        sum(o.sum() for o in out).backward()


def attention_args(device, dtype=torch.float32, length=33, tau=5):
    c = differentiable(case(length, 16, tau, dtype, device))
    return c, (c["queries"], c["keys"], c["values"], c["mask"], c["query_codes"], c["key_codes"], tau)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("backward", yoso_cuda.BACKWARD_ESTIMATORS)
def test_opcheck_of_the_differentiable_attention(device, backend, backward):
    require(device)
    _, args = attention_args(device)
    torch.library.opcheck(torch.ops.yoso.lsh_attention, (*args, backward, backend), test_utils=OPCHECK_TESTS)
    c = case(33, 16, 5, torch.float32, device)
    grad = torch.randn(2, 33, 16).to(device)
    backward_args = (
        grad,
        c["queries"],
        c["keys"],
        c["values"],
        c["mask"],
        c["query_codes"],
        c["key_codes"],
        5,
        backward,
        backend,
    )
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")  # its inputs need no gradient
    torch.library.opcheck(torch.ops.yoso.lsh_attention_backward, backward_args, test_utils=tests)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("backward", yoso_cuda.BACKWARD_ESTIMATORS)
def test_differentiable_attention_on_the_kernels_matches_the_reference(device, dtype, backward):
    require(device)
    results = []
    for backend in ("compiled", "reference"):
        c, args = attention_args(device, dtype, length=300, tau=6)
        out = yoso_cuda.lsh_attention(*args, backward, backend)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(device))
        results.append([out, c["queries"].grad, c["keys"].grad, c["values"].grad])
    for name, kernel_value, reference_value in zip(("out", "grad q", "grad k", "grad v"), *results):
        assert kernel_value.dtype == (torch.float32 if name == "out" else dtype), name
        tolerance = TOLERANCE[dtype]
        torch.testing.assert_close(
            kernel_value, reference_value, rtol=tolerance, atol=tolerance, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_backend_compiled_without_kernels_is_a_clear_error():
    code = (
        "import torch, yoso_cuda\n"
        "codes, mask = torch.zeros(1, 4, 2, dtype=torch.int32), torch.ones(1, 4, dtype=torch.bool)\n"
        "values = torch.arange(12.0).view(1, 4, 3)\n"
        "print(yoso_cuda.lsh_cumulation(codes, mask, codes, mask, values, 3, backend='reference').sum().item())\n"
        "for backend in ('compiled', 'fast'):\n"
        "    try:\n"
        "        yoso_cuda.lsh_cumulation(codes, mask, codes, mask, values, 3, backend=backend)\n"
        "    except (RuntimeError, ValueError) as error:\n"
        "        print(type(error).__name__, error)\n"
    )
    env = {**os.environ, "YOSO_KERNELS": "0"}
    process = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr[-2000:]
    lines = process.stdout.splitlines()
    assert float(lines[0]) == 4 * 66, "one bucket: every query sums every value"
    assert lines[1].startswith(
        "RuntimeError backend='compiled', but YOSO's cpu kernels are not built (disabled by YOSO_KERNELS=0)"
    )
    assert lines[2].startswith("ValueError backend must be one of 'auto', 'compiled', 'reference', got 'fast'")


@pytest.mark.parametrize("backward", ["lower_bound", "exact"])
def test_yoso_attention_runs_on_the_kernels_with_the_reference_gradients(backward):
    """Both backends share the Python backward (yoso_cuda/attention.py), so this compares the kernels under it;
    the backward itself is checked against its definition in test_attention_backward.py."""
    require("cpu")
    import attention_zoo

    def run(backend):
        torch.manual_seed(0)
        attn = attention_zoo.build(
            "yoso", seq_len=200, num_heads=2, head_dim=32, num_hashes=8, backward=backward, backend=backend
        )
        q, k, v = (torch.randn(2, 2, 200, 32, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
        mask = torch.ones(2, 200, dtype=torch.bool)
        mask[1, 150:] = False
        out = attn(q, k, v, mask)
        # Not out.square().sum(): YOSO normalises every output row, so that loss is constant and its gradients
        # are rounding noise (issue 41). A fixed random weighting of the outputs depends on q, k and v.
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum().backward()
        return out, q.grad, k.grad, v.grad

    compiled, expected = run("compiled"), run("reference")
    for name, kernel_value, reference_value in zip(("out", "grad q", "grad k", "grad v"), compiled, expected):
        assert reference_value[0].abs().amax() > 1e-2, f"{name}: a real gradient, not rounding noise"
        torch.testing.assert_close(kernel_value, reference_value, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    assert (expected[3][1, :, 150:] == 0).all(), "padded values reach no query"
