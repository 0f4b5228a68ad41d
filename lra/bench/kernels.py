"""YOSO's kernels against softmax attention: time and peak memory of one attention call.

``python -m lra.bench kernels [--device cpu|cuda] [--lengths 1024 ...] [--head-dims 32 64]
[--dtypes float32 bfloat16] [--reference-max-length N]`` times the core attention alone
(batch 1, 2 heads, q/k/v given) for:

* ``softmax/<backend>``: ``scaled_dot_product_attention`` with every SDPA backend that runs on the
  device (flash, efficient, cudnn, math on a GPU; the CPU's default);
* ``yoso_32``: YOSO-32 (32 hashes, tau = log2 n, lower-bound backward) on the compiled kernels
  (``backend="compiled"``: missing kernels for the device are an error, not a silent fallback);
* ``yoso_32/reference``: the same on the pure-PyTorch reference (``backend="reference"``, up to
  ``--reference-max-length``);
* ``yoso_32/official`` with ``--official-yoso PATH`` (a checkout of mlpen/YOSO; CUDA only): the official kernels,
  32 hashes, the same tau, as their LRA model calls them (``lra/bench/official_yoso.py``), their commit in the
  ``official_commit`` column.

Each is measured forward and forward+backward, its time by ``torch.utils.benchmark.Timer``'s
``blocked_autorange`` for at least ``--min-run-time`` seconds (:mod:`lra.bench.timing`: each call waited for): the
median per call. ``peak_memory_mb`` is the peak of a run after the warm-up above the memory in use before it (the inputs
excluded; untimed): CUDA's allocations on a GPU, the process's resident set on a CPU (``MemoryMeter`` of
``lra/bench/memory.py``). Rows go to ``results/kernels_<device>.csv`` (method, pass, seq_len,
head_dim, dtype, time_ms, peak_memory_mb, device, torch version) and a log-log plot beside it. A configuration that fails
(out of memory, a backend that refuses the inputs) is recorded with its error and the grid goes on. Rows of the
same device for methods a run does not time (the official kernels, without ``--official-yoso``) stay in the file, so
a run of ours alone does not erase theirs.
"""

from __future__ import annotations

import argparse
import math
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

import attention_zoo
import yoso_cuda
from lra.bench import official_yoso
from lra.bench.memory import MemoryMeter
from lra.bench.output import RESULTS
from lra.bench.timing import milliseconds, synchronize, timer
from lra.devices import device_name
from lra.rows import pyplot, read_rows, save_figure, write_rows

FIELDS = [
    "method",
    "pass",
    "seq_len",
    "head_dim",
    "dtype",
    "time_ms",
    "peak_memory_mb",
    "error",
    "device",
    "torch",
    "official_commit",  # the mlpen/YOSO commit of the yoso_32/official rows (empty in others)
]
TYPES = {"seq_len": int, "head_dim": int, "time_ms": float, "peak_memory_mb": float}  # as a run's own rows hold them


def sdpa_backends(device: torch.device) -> dict[str, object]:
    if device.type != "cuda":
        return {"default": None}
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }


def measure(run, device: torch.device, min_run_time: float) -> tuple[float, float]:
    """Median milliseconds of ``run()`` (Timer's ``blocked_autorange``), and the peak memory (MB) of a run after a
    warm-up above what was in use before it (a run of its own, untimed: the CPU's memory meter slows what it watches)."""
    run()
    synchronize(device)
    meter = MemoryMeter(device)
    meter.reset_peak()
    run()
    synchronize(device)
    peak = meter.peak_above_baseline()
    return milliseconds(timer(run, device).blocked_autorange(min_run_time=min_run_time)), peak


def attention_call(
    method: str,
    length: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    backward: bool,
    official: official_yoso.Official | None = None,
):
    """A closure running one attention call (and its backward) on fresh random q, k, v."""
    if official is not None and method in official.methods:
        return official.call(method, length, head_dim, dtype, device, backward)
    q, k, v = (torch.randn(1, 2, length, head_dim, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
    if method.startswith("softmax"):
        backend = sdpa_backends(device)[method.split("/")[1]]

        def forward():
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v)
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

    else:
        backend = "reference" if method.endswith("reference") else "compiled"
        attn = attention_zoo.build("yoso", seq_len=length, num_heads=2, head_dim=head_dim, num_hashes=32, backend=backend).to(
            device
        )

        def forward():
            return attn(q, k, v)

    def run():
        out = forward()
        if backward:
            out.backward(torch.ones_like(out))

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lra.bench kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when a GPU is present)",
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=None, help="sequence lengths (default: 1K..64K on a GPU, 1K..32K on a CPU)"
    )
    parser.add_argument("--head-dims", type=int, nargs="+", default=[32, 64], help="head dims of q, k, v (default: 32 64)")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=["float32", "float16", "bfloat16"],
        help="input dtypes (default: float32 bfloat16)",
    )
    parser.add_argument(
        "--min-run-time",
        type=float,
        default=0.2,
        metavar="S",
        help="seconds of timed calls per cell, after the warm-up (Timer.blocked_autorange; default: 0.2, its own); "
        "the median per call is kept",
    )
    parser.add_argument(
        "--reference-max-length",
        type=int,
        default=8192,
        help="longest length the slow pure-PyTorch reference runs at (default: 8192)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="folder for kernels_<device>.csv and .png (default: results/ in the current folder)",
    )
    parser.add_argument(
        "--official-yoso",
        type=Path,
        default=None,
        metavar="PATH",
        help="a checkout of mlpen/YOSO: add its kernels as yoso_32/official (CUDA only; lra/bench/official_yoso.py)",
    )
    parser.add_argument(
        "--official-yoso-commit",
        default=None,
        help="its commit, where PATH is not a git checkout (a `git archive`); default: git rev-parse HEAD in PATH",
    )
    parser.add_argument(
        "--official-yoso-version",
        nargs="+",
        default=["v2"],
        choices=sorted(official_yoso.VERSIONS),
        help="their code paths to time: v2 (yoso_32/official, the default), v1 (yoso_32/official-v1)",
    )
    return parser


def official_kernels(args, device: torch.device) -> official_yoso.Official:
    """mlpen/YOSO's kernels from ``--official-yoso``; an :class:`~lra.bench.official_yoso.OfficialYOSOError` says why
    they cannot run here."""
    if device.type not in official_yoso.DEVICES:
        raise official_yoso.OfficialYOSOError(
            f"mlpen/YOSO's kernels are CUDA-only, they cannot run on {device.type} (use --device cuda)"
        )
    official_yoso.check_checkout(args.official_yoso, args.official_yoso_version)
    commit = official_yoso.checkout_commit(args.official_yoso, args.official_yoso_commit)
    return official_yoso.Official(args.official_yoso, commit, args.official_yoso_version)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_run_time <= 0:
        parser.error(f"--min-run-time must be a positive number of seconds, got {args.min_run_time:g}")
    device = torch.device(args.device)
    official = None
    if args.official_yoso is not None:
        try:
            official = official_kernels(args, device)
        except official_yoso.OfficialYOSOError as error:
            print(f"--official-yoso: {error}")
            return 1
    kernels = yoso_cuda.kernels()
    library = kernels.cuda if device.type == "cuda" else kernels.cpu
    if not yoso_cuda.has_kernel(device):
        print(
            f"YOSO's {device.type} kernels are not built ({library.reason}), so there is nothing to benchmark; "
            "`python -m yoso_cuda` shows the build"
        )
        return 1
    print(f"torch {torch.__version__} on {device_name(device)}; YOSO's {library.describe()}")
    if official:
        print(f"mlpen/YOSO {', '.join(official.versions)} at {official.commit} from {args.official_yoso}")
    methods = [f"softmax/{name}" for name in sdpa_backends(device)] + ["yoso_32", "yoso_32/reference"]
    methods += list(official.methods) if official else []
    path = args.out / f"kernels_{device.type}.csv"
    rows = run_grid(args, device, methods, official) + untimed_rows(path, device_name(device), methods)
    write_rows(rows, path, FIELDS)
    figure = args.out / f"kernels_{device.type}.png"
    plot(rows, figure, f"{device_name(device)}, torch {torch.__version__}")
    print(f"wrote {path} and {figure} ({platform.node()})")
    return 0


def run_grid(args, device: torch.device, methods: list[str], official: official_yoso.Official | None) -> list[dict]:
    """A row per dtype, head dim, length, method and pass, each measured or with its error."""
    lengths = args.lengths or [2**p for p in range(10, 17 if device.type == "cuda" else 16)]
    rows = []
    for dtype_name in args.dtypes:
        for head_dim in args.head_dims:
            for length in lengths:
                for method in methods:
                    if method.endswith("reference") and length > args.reference_max_length:
                        continue
                    for backward in (False, True):
                        row = dict(
                            method=method,
                            seq_len=length,
                            head_dim=head_dim,
                            dtype=dtype_name,
                            device=device_name(device),
                            torch=torch.__version__,
                            error="",
                            official_commit=official.commit if official and method in official.methods else "",
                        )
                        row["pass"] = "forward+backward" if backward else "forward"
                        try:
                            run = attention_call(method, length, head_dim, getattr(torch, dtype_name), device, backward, official)
                            row["time_ms"], row["peak_memory_mb"] = measure(run, device, args.min_run_time)
                        except (RuntimeError, torch.OutOfMemoryError) as error:
                            row["time_ms"] = row["peak_memory_mb"] = math.nan
                            row["error"] = str(error).splitlines()[0][:200]
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                        rows.append(row)
                        print(
                            f"{dtype_name:>8} d={head_dim:<3} n={length:<6} {method:<19} {row['pass']:<16} "
                            f"{row['time_ms']:10.2f} ms {row['peak_memory_mb']:9.1f} MB {row['error']}",
                            flush=True,
                        )
    return rows


def untimed_rows(path: Path, device: str, methods: list[str]) -> list[dict]:
    """The rows of ``path`` measured on ``device`` for methods other than ``methods``, typed as a run's rows."""
    return [row for row in read_rows(path, TYPES) if row["device"] == device and row["method"] not in methods]


def plot(rows: list[dict], path: Path, title: str) -> None:
    plt = pyplot()
    combos = sorted({(r["dtype"], r["head_dim"]) for r in rows})
    figure, axes = plt.subplots(2, len(combos), figsize=(5 * len(combos), 8), squeeze=False)
    for column, (dtype, head_dim) in enumerate(combos):
        for row_index, pass_name in enumerate(("forward", "forward+backward")):
            axis = axes[row_index][column]
            for method in sorted({r["method"] for r in rows}):
                points = [
                    (r["seq_len"], r["time_ms"])
                    for r in rows
                    if r["method"] == method
                    and r["pass"] == pass_name
                    and r["dtype"] == dtype
                    and r["head_dim"] == head_dim
                    and not math.isnan(r["time_ms"])
                ]
                if points:
                    axis.plot(*zip(*points), marker="o", label=method)
            axis.set(
                xscale="log",
                yscale="log",
                xlabel="sequence length",
                ylabel="time (ms)",
                title=f"{pass_name}, {dtype}, head dim {head_dim}",
            )
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    save_figure(figure, path)
