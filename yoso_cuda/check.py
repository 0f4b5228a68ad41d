"""``python -m yoso_cuda --check``: every compiled op against the reference on every available device.

For each device with a GPU-or-CPU kernel library (``cpu`` always, ``cuda`` when a GPU is visible),
each compiled op (``torch.ops.yoso.*`` and the differentiable ``yoso::lsh_attention``, forward and
both backward estimators) runs on small random inputs and is compared with the pure-PyTorch
reference under the tests' tolerances (:mod:`yoso_cuda.tolerances`):

* shapes ``(queries, keys, head dim, tau)`` in :data:`CASES`: one token, an odd length, more
  queries than keys with an odd head dim, tau = 1 (half of all keys in one bucket);
* a batch of three rows: random padding, the second half padded, and a fully padded row;
* float32, float16 and bfloat16 inputs.

One verdict per op and device (PASS or FAIL with the largest error), and a FAIL for a device whose
kernels are missing or a wanted library that did not build. The exit status is 1 on any FAIL.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import reference
from .attention import BACKWARD_ESTIMATORS, lsh_attention
from .build import BuildReport
from .tolerances import HASH_CODE_AGREEMENT, TOLERANCE, excess_error

CASES = [(1, 1, 16, 8), (7, 7, 32, 3), (33, 20, 33, 5), (40, 40, 24, 1)]  # (queries, keys, head dim, tau)
NUM_HASHES = 4
RAW_OPS = (
    "lsh_cumulation",
    "lsh_weighted_cumulation",
    "lsh_weighted_cumulation_both",
    "lsh_collided_gradient",
    "lsh_lower_bound_gradients",
)


@dataclass
class Verdict:
    device: str
    op: str
    comparisons: int = 0
    max_error: float = 0.0
    differing_codes: int = 0  # hash_codes only: codes that differ from the reference's
    total_codes: int = 0
    failure: str | None = None  # the first failing comparison, or why the op could not be checked

    @property
    def passed(self) -> bool:
        if self.total_codes:
            return self.failure is None and self.differing_codes <= (1 - HASH_CODE_AGREEMENT) * self.total_codes
        return self.failure is None and self.comparisons > 0

    def compare(self, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, where: str) -> None:
        error, excess = excess_error(actual, expected, dtype)
        self.comparisons += 1
        self.max_error = max(self.max_error, error)
        if excess > 0 and self.failure is None:
            self.failure = f"{where}: max |error| {error:.3g} beyond the {dtype} tolerance {TOLERANCE[dtype]:g}"

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        if self.total_codes:
            detail = (
                f"{self.differing_codes} of {self.total_codes} codes differ "
                f"(at most {1 - HASH_CODE_AGREEMENT:.1%} may, by rounding)"
            )
        elif self.comparisons:
            detail = f"max |error| {self.max_error:.2e} over {self.comparisons} comparisons"
        else:
            detail = "nothing compared"
        if self.failure:
            detail += f"; {self.failure}"
        return f"{self.device:<5} {self.op:<42} {verdict}  {detail}"


def make_inputs(num_queries: int, num_keys: int, dim: int, tau: int, dtype: torch.dtype, device: str, seed: int = 0):
    """Unit queries and keys (keys near the first queries, so buckets are shared), their codes under
    random Hadamard hashes, masks (random padding, a padded half, a fully padded row), weights, values."""
    generator = torch.Generator().manual_seed(seed)
    batch = 3
    queries = F.normalize(torch.randn(batch, num_queries, dim, generator=generator), dim=-1)
    near = queries[:, torch.arange(num_keys) % num_queries]  # (B, nk, d)
    keys = F.normalize(near + 0.7 * torch.randn(batch, num_keys, dim, generator=generator), dim=-1)
    signs = (
        torch.randint(
            0, 2, (batch, 3, reference.num_rotations(dim, NUM_HASHES, tau), reference.padded_dim(dim, tau)), generator=generator
        )
        * 2
        - 1
    ).float()
    masks = []
    for n in (num_queries, num_keys):
        mask = torch.rand(batch, n, generator=generator) < 0.85
        mask[1, n // 2 + 1 :] = False
        mask[2] = False
        masks.append(mask)
    tensors = {
        "queries": queries,
        "keys": keys,
        "signs": signs,
        "query_codes": reference.hash_codes(queries, signs, NUM_HASHES, tau),
        "key_codes": reference.hash_codes(keys, signs, NUM_HASHES, tau),
        "query_mask": masks[0],
        "key_mask": masks[1],
        "query_weights": torch.randn(batch, num_queries, dim, generator=generator),
        "key_weights": torch.randn(batch, num_keys, dim, generator=generator),
        "values": torch.randn(batch, num_keys, dim, generator=generator),
        "grad": torch.randn(batch, num_queries, dim, generator=generator),
    }
    # Every float input in the dtype under test; the signs (+-1) stay float32 as hash_codes requires.
    return {
        name: t.to(device=device, dtype=dtype) if t.is_floating_point() and name != "signs" else t.to(device)
        for name, t in tensors.items()
    }


def raw_op_calls(c: dict, tau: int) -> dict[str, tuple]:
    """The arguments of each op in :data:`RAW_OPS` (besides ``hash_codes``)."""
    q, k = (c["query_codes"], c["query_mask"]), (c["key_codes"], c["key_mask"])
    return {
        "lsh_cumulation": (*q, *k, c["values"], tau),
        "lsh_weighted_cumulation": (*q, c["query_weights"], *k, c["key_weights"], c["values"], tau),
        "lsh_weighted_cumulation_both": (*q, c["query_weights"], c["queries"], *k, c["key_weights"], c["values"], tau),
        "lsh_collided_gradient": (*q, c["queries"], c["query_weights"], *k, c["keys"], c["key_weights"], tau),
        "lsh_lower_bound_gradients": (*q, c["queries"], c["grad"], *k, c["keys"], c["values"], tau),
    }


@contextmanager
def failures_recorded(verdict: Verdict, where: str):
    """An op that raises fails its verdict (with the error) and the check goes on."""
    try:
        yield
    except Exception as error:  # a kernel's error is a verdict here, not the end of the check
        if verdict.failure is None:
            verdict.failure = f"{where}: raised {type(error).__name__}: {str(error).splitlines()[0][:300]}"


def check_device(device: str) -> list[Verdict]:
    names = ["hash_codes", *RAW_OPS, "lsh_attention (forward)"]
    names += [f"lsh_attention (backward, {estimator})" for estimator in BACKWARD_ESTIMATORS]
    verdicts = {name: Verdict(device, name) for name in names}
    for dtype in TOLERANCE:
        for num_queries, num_keys, dim, tau in CASES:
            where = f"{str(dtype).removeprefix('torch.')}, nq={num_queries}, nk={num_keys}, d={dim}, tau={tau}"
            c = make_inputs(num_queries, num_keys, dim, tau, dtype, device)
            with failures_recorded(verdicts["hash_codes"], where):
                check_hash_codes(c, tau, where, verdicts["hash_codes"])
            for name, args in raw_op_calls(c, tau).items():
                with failures_recorded(verdicts[name], where):
                    outputs, expected = getattr(torch.ops.yoso, name)(*args), getattr(reference, name)(*args)
                    if isinstance(outputs, tuple):  # one output per side, and lsh_lower_bound_gradients' grad V
                        for side, (out, want) in zip(("queries", "keys", "values"), zip(outputs, expected, strict=True)):
                            verdicts[name].compare(out, want, dtype, f"{where}, {side}' output")
                    else:
                        verdicts[name].compare(outputs, expected, dtype, where)
            if num_queries == num_keys:
                check_attention(c, tau, dtype, where, verdicts)
    return list(verdicts.values())


def check_hash_codes(c: dict, tau: int, where: str, verdict: Verdict) -> None:
    """Codes on the device against the reference's on the CPU, counting the codes that differ."""
    codes = torch.ops.yoso.hash_codes(c["queries"], c["signs"], NUM_HASHES, tau).cpu()
    expected = reference.hash_codes(c["queries"].cpu(), c["signs"].cpu(), NUM_HASHES, tau)
    if codes.shape != expected.shape or codes.dtype != torch.int32:
        raise ValueError(f"codes {codes.dtype} {tuple(codes.shape)}, expected int32 {tuple(expected.shape)}")
    verdict.differing_codes += int((codes != expected).sum())
    verdict.total_codes += codes.numel()


def check_attention(c: dict, tau: int, dtype: torch.dtype, where: str, verdicts: dict[str, Verdict]) -> None:
    """The differentiable op's forward and gradients on the kernels against the same op on the reference."""
    mask = c["query_mask"]  # one mask: queries and keys are the same tokens
    forward = verdicts["lsh_attention (forward)"]
    for estimator in BACKWARD_ESTIMATORS:
        backward = verdicts[f"lsh_attention (backward, {estimator})"]
        outputs, gradients = [], []
        for backend in ("compiled", "reference"):
            leaves = [c[name].detach().clone().requires_grad_() for name in ("queries", "keys", "values")]
            with failures_recorded(forward, f"{where}, backend {backend}"):
                out = lsh_attention(*leaves, mask, c["query_codes"], c["key_codes"], tau, estimator, backend)
                outputs.append(out.detach())
                with failures_recorded(backward, f"{where}, backend {backend}"):
                    out.backward(c["grad"].float())
                    gradients.append([leaf.grad for leaf in leaves])
        if len(outputs) == 2:
            forward.compare(*outputs, dtype, where)
        if len(gradients) == 2:
            for name, grad, expected in zip(("queries", "keys", "values"), *gradients):
                backward.compare(grad, expected, dtype, f"{where}, grad {name}")


def run_check(report: BuildReport) -> tuple[list[str], bool]:
    """Verdict lines for every device and whether all passed."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    lines, passed = [], True
    for library in report.missing:
        if library.device not in devices:  # a wanted library for a device not present here (CI compiling CUDA)
            lines.append(f"{library.device:<5} {'kernel library':<42} FAIL  not built: {library.reason}")
            passed = False
    for library in report.unsafe:
        lines.append(f"{library.device:<5} {'kernel library':<42} FAIL  unsafe: {library.unsafe}")
        passed = False
    for device in devices:
        library = getattr(report, device)
        if not library.loaded:
            lines.append(f"{device:<5} {'kernel library':<42} FAIL  not built, nothing to check: {library.reason}")
            passed = False
            continue
        for verdict in check_device(device):
            lines.append(verdict.line())
            passed &= verdict.passed
    return lines, passed
