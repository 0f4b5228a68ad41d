"""YOSO's real CUDA kernels (csrc/cuda/yoso_cuda.cu), executed on the CPU by yoso_cuda.emulator.

Every op against the pure-PyTorch reference over a grid that reaches every path of the kernels
(n = 1, 7, 4097; an all-padded batch row; nq != nk; buckets of more than 256 keys; head and value
dims above 128; more than 32 hashes; several chunks of hashes; fp32, fp16, bf16), each under the
emulator's three schedules, whose results must be bitwise identical (the kernels use no atomics).
``YOSO_EMULATOR_SANITIZE=1`` (in a process preloading ``emulator.sanitizer_preload()``) runs the
same tests on the build with AddressSanitizer and UndefinedBehaviorSanitizer, as
``test_sanitized_build`` does; ``YOSO_EMULATOR_SOURCE`` points them at another copy of the kernels
(``python tests/mutants.py --kind cuda`` does, to show that injected bugs fail them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from yoso_cuda import emulator, ops, reference

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="the emulator compiles the kernels with a C++ compiler")

SANITIZE = os.environ.get("YOSO_EMULATOR_SANITIZE") == "1"
SOURCE = Path(os.environ.get("YOSO_EMULATOR_SOURCE", emulator.CUDA_SOURCE))  # another copy: the mutants script
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# The sanitizers look for out-of-bounds accesses and undefined behaviour, which the indices a thread
# computes decide, not the order threads run in; the plain build runs every schedule (and compares
# them), the sanitized build one, which keeps it within CI's time.
SCHEDULES = emulator.SCHEDULES[:1] if SANITIZE else emulator.SCHEDULES


@pytest.fixture(scope="module")
def emulated():
    return emulator.build(SOURCE, sanitize=SANITIZE)


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    num_queries: int
    num_keys: int
    dim: int  # queries' and keys' vectors and weights
    channels: int  # values
    hash_bits: int
    num_hashes: int
    chunk_bytes: int | None = None  # YOSO_CUDA_CHUNK_BYTES: small enough to split the hashes into chunks
    unpadded_first_row: bool = False  # batch row 0 without padding: sorted rounds that end on a real row
    dtypes: tuple = (torch.float32, torch.float16, torch.bfloat16)

    def __str__(self) -> str:
        return self.name


CASES = [
    Case("n1", batch=2, num_queries=1, num_keys=1, dim=16, channels=16, hash_bits=8, num_hashes=4),
    Case("n7_two_buckets", batch=2, num_queries=7, num_keys=7, dim=32, channels=32, hash_bits=1, num_hashes=4),
    Case(
        "n4097",
        batch=1,
        num_queries=4097,
        num_keys=4097,
        dim=32,
        channels=32,
        hash_bits=12,
        num_hashes=2,
        dtypes=(torch.float32,),
    ),
    # tau = 1: two buckets of ~350 keys, past the 256-key staging of the heavy-bucket tables and the
    # 64-key pieces of the bucket sums; more queries than keys would not reach them, so nq < nk.
    Case("crowded_nq_ne_nk", batch=2, num_queries=64, num_keys=700, dim=16, channels=24, hash_bits=1, num_hashes=2),
    # Widths past the 128-column register tiles, 33 hashes (the first-collision scan spans two warps'
    # worth of hashes), and a chunk budget that fits few hashes at a time.
    Case(
        "wide_33_hashes_chunked",
        batch=2,
        num_queries=40,
        num_keys=33,
        dim=160,
        channels=136,
        hash_bits=5,
        num_hashes=33,
        chunk_bytes=20_000,
    ),
    # bucket_index_kernel sorts 2048 rows at a time: buckets of ~470 keys that span two rounds, the
    # first round all real keys (few queries, so that the collided gradient's pairs stay few).
    Case(
        "crowded_rounds",
        batch=2,
        num_queries=64,
        num_keys=2200,
        dim=16,
        channels=8,
        hash_bits=2,
        num_hashes=2,
        dtypes=(torch.float32,),
        unpadded_first_row=True,
    ),
    # The transposed direction's heavy buckets: buckets of ~350 queries, which the keys look up in
    # lsh_weighted_cumulation_both.
    Case(
        "crowded_queries",
        batch=2,
        num_queries=700,
        num_keys=64,
        dim=16,
        channels=24,
        hash_bits=1,
        num_hashes=2,
        dtypes=(torch.float32,),
    ),
]


def make_inputs(case: Case, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Codes from real hashing of correlated queries and keys; the last batch row is all padding."""
    generator = torch.Generator().manual_seed(seed)
    b, nq, nk, d = case.batch, case.num_queries, case.num_keys, case.dim
    anchor = torch.randn(b, max(nq, nk), d, generator=generator)
    queries = torch.nn.functional.normalize(anchor[:, :nq], dim=-1)
    keys = torch.nn.functional.normalize(anchor[:, :nk] + 0.7 * torch.randn(b, nk, d, generator=generator), dim=-1)
    torch.manual_seed(seed)
    signs = reference.random_signs(b, d, case.num_hashes, case.hash_bits)
    query_mask = torch.rand(b, nq, generator=generator) < 0.85
    key_mask = torch.rand(b, nk, generator=generator) < 0.85
    if b > 1:
        query_mask[-1], key_mask[-1] = False, False
    if case.unpadded_first_row:
        query_mask[0], key_mask[0] = True, True
    floats = lambda *shape: torch.randn(*shape, generator=generator).to(dtype)  # noqa: E731
    return dict(
        queries=queries.to(dtype),
        keys=keys.to(dtype),
        signs=signs,
        query_codes=reference.hash_codes(queries, signs, case.num_hashes, case.hash_bits),
        key_codes=reference.hash_codes(keys, signs, case.num_hashes, case.hash_bits),
        query_mask=query_mask,
        key_mask=key_mask,
        query_weights=floats(b, nq, d),
        key_weights=floats(b, nk, d),
        query_values=floats(b, nq, case.channels),
        key_values=floats(b, nk, case.channels),
    )


def op_arguments(op: str, x: dict, hash_bits: int) -> tuple:
    qc, qm, kc, km = x["query_codes"], x["query_mask"], x["key_codes"], x["key_mask"]
    return {
        "lsh_cumulation": (qc, qm, kc, km, x["key_values"], hash_bits),
        "lsh_weighted_cumulation": (qc, qm, x["query_weights"], kc, km, x["key_weights"], x["key_values"], hash_bits),
        "lsh_weighted_cumulation_both": (
            qc,
            qm,
            x["query_weights"],
            x["query_values"],
            kc,
            km,
            x["key_weights"],
            x["key_values"],
            hash_bits,
        ),
        "lsh_collided_gradient": (qc, qm, x["queries"], x["query_weights"], kc, km, x["keys"], x["key_weights"], hash_bits),
        # the output's gradient and the values: widths c, unlike the vectors' d
        "lsh_lower_bound_gradients": (qc, qm, x["queries"], x["query_values"], kc, km, x["keys"], x["key_values"], hash_bits),
    }[op]


def run_every_schedule(emulated, op: str, args: tuple):
    """The op's outputs under each schedule, after checking they are bitwise identical."""
    results = []
    for order, seed in SCHEDULES:
        with emulated.schedule(order, seed):
            out = getattr(emulated.ops, op)(*args)
        results.append(out if isinstance(out, tuple) else (out,))
    for (order, _), outputs in zip(SCHEDULES[1:], results[1:]):
        for first, other in zip(results[0], outputs):
            assert torch.equal(first, other), f"{op}: the {order} schedule changed the result (a race or an uninitialised read)"
    return results[0]


CUMULATIONS = [
    "lsh_cumulation",
    "lsh_weighted_cumulation",
    "lsh_weighted_cumulation_both",
    "lsh_collided_gradient",
    "lsh_lower_bound_gradients",
]
# The sanitized build runs float32 only, and leaves the half-precision dtypes to the plain build: the kernels have no
# dtype-specific code (one template, dispatched), index every tensor by element alike whatever its dtype, and keep their
# shared memory in float32, so an access out of bounds in half precision is one in float32 too.
GRID = [(case, dtype) for case in CASES for dtype in case.dtypes if not SANITIZE or dtype == torch.float32]


@pytest.mark.parametrize("op", CUMULATIONS)
@pytest.mark.parametrize("case, dtype", GRID, ids=[f"{case}-{str(dtype)[6:]}" for case, dtype in GRID])
def test_cumulation_matches_the_reference_under_every_schedule(emulated, monkeypatch, op, case, dtype):
    if case.chunk_bytes is not None:
        monkeypatch.setenv("YOSO_CUDA_CHUNK_BYTES", str(case.chunk_bytes))
    args = op_arguments(op, make_inputs(case, dtype), case.hash_bits)
    outputs = run_every_schedule(emulated, op, args)
    expected = getattr(reference, op)(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for out, want in zip(outputs, expected, strict=True):
        assert out.dtype == torch.float32 and out.shape == want.shape
        torch.testing.assert_close(out, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("op", CUMULATIONS)
@pytest.mark.parametrize("case, dtype", GRID, ids=[f"{case}-{str(dtype)[6:]}" for case, dtype in GRID])
def test_the_radix_path_matches_the_reference_under_every_schedule(emulated, monkeypatch, op, case, dtype):
    """Every op's radix-sort path, in chunks of hashes where the case's budget says: a tau too large
    for the counting sort's table of 2^tau buckets takes it, and YOSO_CUDA_CUMULATION=radix forces it
    (the cases above run the counting sort)."""
    monkeypatch.setenv("YOSO_CUDA_CUMULATION", "radix")
    test_cumulation_matches_the_reference_under_every_schedule(emulated, monkeypatch, op, case, dtype)


# Launches of the counting sort at tau = 6, n = 100, codes folded into two buckets of ~42 rows (past
# the weighted ops' heavy threshold, 32 rows at w = 16, c = 8: their tables are built).
COUNTING_LAUNCHES = {
    "lsh_cumulation": 3,  # index, heavy-bucket sums, lookup
    "lsh_weighted_cumulation": 3,  # index, heavy-bucket tables, lookup
    "lsh_weighted_cumulation_both": 3,  # the same, each for both directions at once
    "lsh_collided_gradient": 2,  # index, lookup
    "lsh_lower_bound_gradients": 3,  # as lsh_weighted_cumulation_both, grad V's sums in the key direction's tables
}


@pytest.mark.parametrize("op", CUMULATIONS)
def test_every_op_takes_the_counting_sort_unless_tau_is_too_large(emulated, monkeypatch, op):
    """A few launches and no sort for tau = ceil(log2 n) (the LRA rule); the radix path for a tau
    whose table of 2^tau bucket ends would exceed max(4096, 2 n); a bad setting is an error."""
    counts = {}
    for hash_bits in (6, 14):
        case = Case("choice", batch=2, num_queries=100, num_keys=100, dim=16, channels=8, hash_bits=hash_bits, num_hashes=4)
        x = make_inputs(case, torch.float32)
        x["query_codes"], x["key_codes"] = x["query_codes"] % 2, x["key_codes"] % 2
        args = op_arguments(op, x, hash_bits)
        before = emulated.statistics()
        out = getattr(emulated.ops, op)(*args)
        after = emulated.statistics()
        counts[hash_bits] = (after["launches"] - before["launches"], after["sorts"] - before["sorts"])
        torch.testing.assert_close(out, getattr(reference, op)(*args))
    assert counts[6] == (COUNTING_LAUNCHES[op], 0) and counts[14][1] == 1, counts
    monkeypatch.setenv("YOSO_CUDA_CUMULATION", "bucket")
    with pytest.raises(ValueError, match="YOSO_CUDA_CUMULATION must be 'counting' or 'radix', got 'bucket'"):
        getattr(emulated.ops, op)(*args)


@pytest.mark.parametrize("op", CUMULATIONS)
@pytest.mark.parametrize("path", ["counting", "radix"])
@pytest.mark.parametrize(
    "sizes", [dict(num_queries=0), dict(num_keys=0), dict(channels=0), dict(width=0)], ids=["nq0", "nk0", "c0", "w0"]
)
def test_empty_sizes_match_the_reference(emulated, monkeypatch, op, path, sizes):
    """No query, no key, no value channel or no weight column: the outputs the reference gives (zeros
    or empty), on both paths and from the CPU kernel, without a launch reading past an empty tensor."""
    monkeypatch.setenv("YOSO_CUDA_CUMULATION", path)
    shape = dict(batch=2, num_queries=9, num_keys=11, dim=8, channels=8) | sizes
    width = shape.pop("width", shape["dim"])
    case = Case("empty", **shape, hash_bits=3, num_hashes=3)
    x = make_inputs(case, torch.float32)
    x["query_weights"], x["key_weights"] = x["query_weights"][..., :width], x["key_weights"][..., :width]
    args = op_arguments(op, x, case.hash_bits)
    expected = getattr(reference, op)(*args)
    kernels = [emulated.ops] + ([torch.ops.yoso] if ops.kernels().cpu.loaded else [])
    for outputs in (getattr(namespace, op)(*args) for namespace in kernels):
        for out, want in zip(*(o if isinstance(o, tuple) else (o,) for o in (outputs, expected)), strict=True):
            assert out.shape == want.shape
            torch.testing.assert_close(out, want)


@pytest.mark.parametrize("case", CASES[:2] + CASES[3:], ids=str)
@pytest.mark.parametrize("dim", [16, 64, 100, 160, 600])
def test_hash_codes_match_the_reference_under_every_schedule(emulated, case, dim):
    """Widths 16..1024: in registers with 1, 2, 4 and 8 coordinates a lane (16 lanes a vector at width
    16), in shared memory at 1024. The butterfly and the reference's matmul round differently, so a
    coordinate within rounding of zero may flip a bit: rare flips only."""
    x = make_inputs(
        Case(case.name, case.batch, case.num_queries, case.num_keys, dim, 8, case.hash_bits, case.num_hashes), torch.float32
    )
    args = (x["queries"], x["signs"], case.num_hashes, case.hash_bits)
    (codes,) = run_every_schedule(emulated, "hash_codes", args)
    expected = reference.hash_codes(*args)
    assert codes.dtype == torch.int32 and codes.shape == expected.shape
    assert (codes == expected).float().mean() > 0.999
    if ops.kernels().cpu.loaded:  # the CPU kernel's butterflies round as the CUDA kernel's: the same codes, bit for bit
        assert torch.equal(codes, torch.ops.yoso.hash_codes(*args))


@pytest.mark.parametrize("op", CUMULATIONS)
@pytest.mark.parametrize("bad", [1 << 6, -1], ids=["too_large", "negative"])
@pytest.mark.parametrize("side", ["query_codes", "key_codes"])
def test_out_of_range_codes_are_an_error_on_every_backend(emulated, op, bad, side):
    """The CPU kernel and the reference raise a ValueError; the CUDA kernels, which must not
    synchronise the host to look, fail a device-side assertion naming the same fault."""
    x = make_inputs(CASES[1], torch.float32)
    x[side] = x[side].clone()
    x[side][0, 3, 1] = bad
    args = op_arguments(op, x, 6)
    message = f"{side} holds hash codes outside [0, 2^6): codes must come from hash_codes with the same hash_bits"
    backends = {"reference": getattr(reference, op)}
    if ops.kernels().cpu.loaded:
        backends["CPU kernel"] = getattr(torch.ops.yoso, op)
    for backend, function in backends.items():
        with pytest.raises(ValueError) as error:
            function(*args)
        assert str(error.value).splitlines()[0] == message, backend
    device_message = f"{side} holds hash codes outside [0, 2^hash_bits): codes must come from hash_codes with the same hash_bits"
    with pytest.raises(RuntimeError, match="device-side assertion") as error:
        getattr(emulated.ops, op)(*args)
    assert device_message in str(error.value)


def test_the_rewrite_handles_every_cuda_construct_of_the_source(emulated):
    source = SOURCE.read_text()
    assert emulated.rewrites["launches"] == source.count("<<<")
    assert emulated.rewrites["empty"] == source.count("at::empty(")
    assert emulated.rewrites["dispatch_key"] == 1
    assert set(emulated.op_names) == {"hash_codes", *CUMULATIONS}


def test_schedules_run_threads_in_different_orders(emulated):
    """The schedules really differ: the sort's buffer choice and the launch count move with them."""
    x = make_inputs(CASES[1], torch.float32)
    before = emulated.statistics()
    run_every_schedule(emulated, "lsh_cumulation", op_arguments("lsh_cumulation", x, CASES[1].hash_bits))
    after = emulated.statistics()
    assert after["launches"] > before["launches"] and after["switches"] > before["switches"]
    with pytest.raises(RuntimeError, match="unknown schedule"):
        emulated.ops.emulator_schedule("sideways", 0)


@pytest.mark.slow
@pytest.mark.skipif(SANITIZE, reason="already the sanitized run")
def test_sanitized_build(tmp_path):
    """The same tests (but n = 4097, and under one schedule) on the build with AddressSanitizer and
    UndefinedBehaviorSanitizer."""
    env = {
        **os.environ,
        "YOSO_EMULATOR_SANITIZE": "1",
        "LD_PRELOAD": emulator.sanitizer_preload(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(__file__)),
            "-k",
            "not n4097 and not sanitized and not schedules_run_threads",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
