"""Every backend refuses the same bad arguments with the same message: the pure-PyTorch reference,
the compiled CPU kernels and the CUDA kernels' host code (run on the CPU by the emulator, and on a GPU
where there is one).

The reference once computed on what the kernels refuse: codes of another batch size (zero rows),
vectors wider than the signs (their first coordinates hashed only), int64 codes, hash_bits 31.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from yoso_cuda import emulator, ops, reference

BATCH, LENGTH, HASHES, TAU, DIM = 2, 10, 4, 4, 16


def inputs() -> dict[str, torch.Tensor]:
    """Valid arguments: codes of real hashing, masks, and (B, n, DIM) float rows."""
    generator = torch.Generator().manual_seed(0)
    vectors = torch.nn.functional.normalize(torch.randn(BATCH, LENGTH, DIM, generator=generator), dim=-1)
    torch.manual_seed(0)
    signs = reference.random_signs(BATCH, DIM, HASHES, TAU)
    codes = reference.hash_codes(vectors, signs, HASHES, TAU)
    return dict(
        vectors=vectors,
        signs=signs,
        codes=codes,
        mask=torch.ones(BATCH, LENGTH, dtype=torch.bool),
        rows=torch.randn(BATCH, LENGTH, DIM, generator=generator),
    )


def cumulation(x, query_codes=None, query_mask=None, key_codes=None, values=None, hash_bits=TAU):
    query_codes = x["codes"] if query_codes is None else query_codes
    key_codes = x["codes"] if key_codes is None else key_codes
    query_mask = x["mask"] if query_mask is None else query_mask
    return "lsh_cumulation", (query_codes, query_mask, key_codes, x["mask"], x["rows"] if values is None else values, hash_bits)


def weighted(x, key_weights):
    return "lsh_weighted_cumulation", (x["codes"], x["mask"], x["rows"], x["codes"], x["mask"], key_weights, x["rows"], TAU)


def weighted_both(x, key_values):
    rows = x["rows"]
    return "lsh_weighted_cumulation_both", (x["codes"], x["mask"], rows, rows, x["codes"], x["mask"], rows, key_values, TAU)


def pair(op, x, key_vectors):
    rows = x["rows"]
    return op, (x["codes"], x["mask"], rows, rows, x["codes"], x["mask"], key_vectors, rows, TAU)


def hashing(x, vectors=None, signs=None, num_hashes=HASHES, hash_bits=TAU):
    vectors = x["vectors"] if vectors is None else vectors
    return "hash_codes", (vectors, x["signs"] if signs is None else signs, num_hashes, hash_bits)


def out_of_range(codes):
    codes = codes.clone()
    codes[1, 2, 3] = 1 << TAU
    return codes


# (id, the op and its arguments from valid inputs x, the message every backend gives)
BAD_ARGUMENTS = [
    (
        "codes_of_another_batch_size",
        lambda x: cumulation(x, query_codes=x["codes"][:1], query_mask=x["mask"][:1]),
        "query_codes and key_codes must share B and num_hashes, got [1, 10, 4] and [2, 10, 4]",
    ),
    (
        "int64_codes",
        lambda x: cumulation(x, key_codes=x["codes"].long()),
        "key_codes must be an int32 tensor of shape (B, n, num_hashes), got Long [2, 10, 4]",
    ),
    ("hash_bits_31", lambda x: cumulation(x, hash_bits=31), "hash_bits must be in [1, 30] (int32 codes), got 31"),
    ("hash_bits_0", lambda x: cumulation(x, hash_bits=0), "hash_bits must be in [1, 30] (int32 codes), got 0"),
    (
        "no_hash",
        lambda x: cumulation(x, query_codes=x["codes"][..., :0], key_codes=x["codes"][..., :0]),
        "at least one hash is needed, got codes of shape [2, 10, 0]",
    ),
    (
        "float_mask",
        lambda x: cumulation(x, query_mask=x["mask"].float()),
        "query_mask must be a bool tensor of shape (B, n) = [2, 10], got Float [2, 10]",
    ),
    (
        "values_of_other_rows",
        lambda x: cumulation(x, values=x["rows"][:, :7]),
        "values must have shape (B, n, channels) with (B, n) = [2, 10], got [2, 7, 16]",
    ),
    (
        "integer_values",
        lambda x: cumulation(x, values=x["rows"].int()),
        "values must be float32, float16 or bfloat16, got Int",
    ),
    (
        "out_of_range_code",
        lambda x: cumulation(x, key_codes=out_of_range(x["codes"])),
        "key_codes holds hash codes outside [0, 2^4): codes must come from hash_codes with the same hash_bits",
    ),
    (
        "weights_of_different_widths",
        lambda x: weighted(x, x["rows"][..., :8]),
        "query_weights and key_weights must have the same width, got 16 and 8",
    ),
    (
        "both_sides_key_values_of_other_rows",
        lambda x: weighted_both(x, x["rows"][:1]),
        "key_values must have shape (B, n, channels) with (B, n) = [2, 10], got [1, 10, 16]",
    ),
    (
        "collided_vectors_of_different_widths",
        lambda x: pair("lsh_collided_gradient", x, x["rows"][..., :8]),
        "query_vectors and key_vectors must have the same width, got 16 and 8",
    ),
    (
        "lower_bound_vectors_of_different_widths",
        lambda x: pair("lsh_lower_bound_gradients", x, x["rows"][..., :8]),
        "query_vectors and key_vectors must have the same width, got 16 and 8",
    ),
    (
        "vectors_wider_than_the_signs",
        lambda x: hashing(x, vectors=torch.randn(BATCH, LENGTH, 2 * DIM)),
        "signs' width must be a power of two >= max(d, hash_bits) = 32, got 16",
    ),
    (
        "signs_of_another_batch_size",
        lambda x: hashing(x, signs=x["signs"][:1]),
        "signs must be float32 (B, 3, rotations, width) with B = 2, got Float [1, 3, 1, 16]",
    ),
    (
        "float64_signs",
        lambda x: hashing(x, signs=x["signs"].double()),
        "signs must be float32 (B, 3, rotations, width) with B = 2, got Double [2, 3, 1, 16]",
    ),
    (
        "integer_vectors",
        lambda x: hashing(x, vectors=x["codes"]),
        "vectors must be a float tensor (B, n, d), got Int [2, 10, 4]",
    ),
    ("more_hashes_than_the_signs_hold", lambda x: hashing(x, num_hashes=5), "signs hold 4 hashes of 4 bits, 5 requested"),
    ("hash_codes_hash_bits_31", lambda x: hashing(x, hash_bits=31), "hash_bits must be in [1, 30] (int32 codes), got 31"),
]


EMULATED_CUDA, CUDA = "emulated CUDA kernels", "CUDA kernels"


def on_cuda(args: tuple) -> tuple:
    return tuple(arg.cuda() if isinstance(arg, torch.Tensor) else arg for arg in args)


@pytest.fixture(scope="module", params=["reference", "CPU kernels", EMULATED_CUDA, pytest.param(CUDA, marks=pytest.mark.cuda)])
def backend(request):
    """(name, a function running an op by name on that backend)."""
    if request.param == "reference":
        return request.param, lambda op, args: getattr(ops, op)(*args, backend="reference")
    if not ops.kernels().cpu.loaded:
        pytest.skip(f"the CPU kernels are not built here: {ops.kernels().cpu.reason}")
    if request.param == "CPU kernels":
        return request.param, lambda op, args: getattr(ops, op)(*args, backend="compiled")
    if request.param == CUDA:
        if not torch.cuda.is_available() or not ops.kernels().cuda.loaded:
            pytest.skip(f"no GPU with YOSO's CUDA kernels here: {ops.kernels().cuda.reason}")
        return request.param, lambda op, args: getattr(ops, op)(*on_cuda(args), backend="compiled")
    if shutil.which("c++") is None:
        pytest.skip("the emulator compiles the CUDA kernels with a C++ compiler")
    emulated = emulator.build()
    return request.param, lambda op, args: getattr(emulated.ops, op)(*args)


@pytest.mark.parametrize("case, arguments, message", BAD_ARGUMENTS, ids=[case[0] for case in BAD_ARGUMENTS])
def test_every_backend_refuses_a_bad_argument_in_the_same_words(backend, case, arguments, message):
    name, run = backend
    if name in (EMULATED_CUDA, CUDA) and case == "out_of_range_code":
        pytest.skip("the CUDA kernels check codes on the device, with an assertion (test_emulated_cuda.py)")
    op, args = arguments(inputs())
    with pytest.raises(ValueError) as error:
        run(op, args)
    assert str(error.value) == message


def test_the_valid_arguments_of_the_cases_are_accepted(backend):
    """The bad arguments above differ from valid ones in the one named fault."""
    _, run = backend
    x = inputs()
    for op, args in (
        cumulation(x),
        weighted(x, x["rows"]),
        weighted_both(x, x["rows"]),
        pair("lsh_collided_gradient", x, x["rows"]),
        pair("lsh_lower_bound_gradients", x, x["rows"]),
        hashing(x),
    ):
        run(op, args)
