"""Time and peak memory of a training step against sequence length, for every attention.

The YOSO paper's efficiency profile ("Efficiency considerations relative to baselines"): the
6-layer, width-256, FFN-1024, 4-head encoder (``conf/model/efficiency.yaml``) with a 10-class head,
a training step (forward, cross-entropy, backward; no optimiser step, as the original script) on
random tokens without padding, for each sequence length and each attention::

    python -m lra.bench efficiency [--device cpu|cuda] [--lengths 512 1024 ...] [--attentions softmax yoso_32 ...]
        [--precision 32|bf16-mixed] [--batch N] [--min-run-time S] [--out results]

Attentions are the options of the ``attention`` config group, one per ``conf/attention/<row>.yaml``
(the rows of Table 3 and any preset a user adds), composed through Hydra, plus every registered
attention no option uses (with its defaults), so a new attention appears without code changes.
YOSO's tau is log2 n, as in the paper's profile (its presets leave ``hash_bits`` unset).

Batch: on a GPU, the largest power of two that fits (doubling from 1 until out of memory, capped at
``--max-batch-tokens`` tokens), as the original ``profile_seq_len_max_batch.py``; on a CPU, a fixed ``--batch``. Time
is ``torch.utils.benchmark.Timer``'s: its ``blocked_autorange`` times steps for at least ``--min-run-time`` seconds
after a warm-up step (:mod:`lra.bench.timing`), and the median per step is divided by the batch (per instance;
``repeats``: the steps timed, ``time_ms_std``: the standard deviation of Timer's blocks). Memory is the peak of one
further step (untimed: on a CPU the meter slows what it watches) above what was in use before the model was built
(weights, gradients, activations, temporaries), divided by the batch: CUDA's ``max_memory_allocated`` on a GPU, the
process's peak resident set (``VmHWM``, reset before each cell) on a CPU. A CPU cell runs under an address-space limit
(``--memory-limit-mb``, default 90% of the memory available at start), so running out of memory is an error recorded
in the results, not the OS killing the benchmark.

A cell that runs out of memory is recorded as ``out_of_memory`` and the attention's longer lengths
are skipped (recorded the same way); a cell that fails otherwise is recorded as ``failed`` with its
error; the grid goes on. Rows go to ``<out>/efficiency_<device type>.csv`` (rewritten after every
cell, so an interrupted run keeps what it measured) and a log-log figure of time and memory beside it.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm import tqdm

import attention_zoo
from lra import config
from lra.bench.memory import MemoryMeter, proc_status_mb, proc_value_mb
from lra.bench.output import RESULTS
from lra.bench.timing import calls_timed, milliseconds, synchronize, timer
from lra.data.tasks import TaskSpec
from lra.devices import device_name
from lra.model import AttentionConfig, LRAClassifier, ModelConfig, build_classifier
from lra.rows import merge_rows, pyplot, read_rows, save_figure, write_rows

# The original profile's random tokens: a 512-token vocabulary, 10 classes, one input, no data files.
PROFILE = TaskSpec("efficiency_profile", vocab_size=512, num_classes=10)
FIELDS = [
    "attention",
    "attention_name",
    "seq_len",
    "batch",
    "time_ms",
    "time_ms_std",
    "memory_mb",
    "status",
    "error",
    "device",
    "torch",
    "dtype",
    "threads",
    "repeats",
]


@dataclass(frozen=True)
class Entry:
    """One line of the profile: a Table 3 row (preset) or a registered attention with its defaults."""

    row: str
    name: str
    hparams: dict[str, Any] = field(default_factory=dict)


def entries() -> list[Entry]:
    """Every option of the ``attention`` config group, then every registered attention that no option builds."""
    found = []
    for row in config.attention_rows():
        attention = config.compose([f"attention={row}"]).attention
        found.append(Entry(row, attention.name, OmegaConf.to_container(attention.hparams, resolve=True)))
    covered = {entry.name for entry in found}
    found += [Entry(name, name) for name in attention_zoo.available() if name not in covered]
    return found


def profile_model() -> ModelConfig:
    """The paper's profiling model, ``conf/model/efficiency.yaml``."""
    return ModelConfig.from_dict(OmegaConf.to_container(config.compose(["model=efficiency"]).model, resolve=True))


def build_model(entry: Entry, seq_len: int, model: ModelConfig) -> LRAClassifier:
    return build_classifier(PROFILE, seq_len, model, AttentionConfig(entry.name, entry.hparams))


@contextmanager
def address_space_limit(limit_mb: float | None):
    """Cap this process's address space at its current size plus ``limit_mb`` (Linux; no-op elsewhere).

    A CPU allocation beyond the cap fails with a RuntimeError that the grid records, instead of the
    kernel's OOM killer ending the whole benchmark."""
    in_use = proc_status_mb("VmSize")
    if limit_mb is None or math.isnan(in_use):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = int((in_use + limit_mb) * 2**20)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def add_memory_limit_argument(parser: argparse.ArgumentParser) -> None:
    """``--memory-limit-mb``: what a CPU cell may add under :func:`address_space_limit` (default: 90% of what is available)."""
    parser.add_argument(
        "--memory-limit-mb",
        type=float,
        default=None,
        help="CPU: memory a cell may add (default: 90%% of what is available at start)",
    )


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and ("can't allocate memory" in message or "not enough memory" in message)


def training_step(model: LRAClassifier, batch: int, seq_len: int, device: torch.device, precision: str) -> None:
    tokens = torch.randint(1, PROFILE.vocab_size, (batch, seq_len), device=device)  # (b, n), no padding
    labels = torch.randint(0, PROFILE.num_classes, (batch,), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else nullcontext()
    model.zero_grad(set_to_none=True)
    with autocast:
        logits = model(tokens)
    F.cross_entropy(logits.float(), labels).backward()


def largest_batch(model, seq_len: int, device: torch.device, precision: str, max_batch: int) -> int:
    """The largest power-of-two batch (<= max_batch) whose training step fits; 0 if not even 1 fits."""
    fits = 0
    batch = 1
    while batch <= max_batch:
        try:
            training_step(model, batch, seq_len, device, precision)
            synchronize(device)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            break
        finally:
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        fits, batch = batch, batch * 2
    return fits


def measure_cell(entry: Entry, seq_len: int, args, model_config: ModelConfig) -> dict[str, Any]:
    """Build the model for ``entry`` at ``seq_len`` and time its training step; the CSV row's measured part."""
    device = torch.device(args.device)
    meter = MemoryMeter(device)
    model = build_model(entry, seq_len, model_config).to(device).train()
    if device.type == "cuda":
        batch = largest_batch(model, seq_len, device, args.precision, max(1, args.max_batch_tokens // seq_len))
        if batch == 0:
            raise torch.OutOfMemoryError(f"a batch of 1 at n={seq_len} does not fit")
    else:
        batch = args.batch
    training_step(model, batch, seq_len, device, args.precision)  # warm-up
    synchronize(device)
    meter.reset_peak()
    training_step(model, batch, seq_len, device, args.precision)  # the memory's run: the CPU's meter slows it
    synchronize(device)
    memory = meter.peak_above_baseline() / batch
    step = timer(lambda: training_step(model, batch, seq_len, device, args.precision), device)
    measured = step.blocked_autorange(min_run_time=args.min_run_time)
    blocks = measured.times
    return {
        "batch": batch,
        "time_ms": round(milliseconds(measured) / batch, 4),
        "time_ms_std": round(statistics.stdev(blocks) * 1e3 / batch, 4) if len(blocks) > 1 else 0.0,
        "memory_mb": round(memory, 3),
        "repeats": calls_timed(measured),
    }


CELL = ("attention", "seq_len", "device", "dtype")  # a row's key: a later measurement of it replaces the earlier
ROW_TYPES = {"seq_len": int, "time_ms": float, "time_ms_std": float, "memory_mb": float}


def run_grid(args) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    model_config = profile_model()
    selected = entries()
    if args.attentions:
        known = {entry.row for entry in selected}
        unknown = sorted(set(args.attentions) - known)
        if unknown:
            raise SystemExit(f"unknown attention(s) {unknown}; available: {', '.join(sorted(known))}")
        selected = [entry for entry in selected if entry.row in args.attentions]
    common = {
        "device": device_name(device),
        "torch": torch.__version__,
        "dtype": "bfloat16 autocast (attention in float32)" if args.precision == "bf16-mixed" else "float32",
        "threads": torch.get_num_threads() if device.type == "cpu" else "",
    }
    path = args.out / f"efficiency_{device.type}.csv"
    earlier = read_rows(path, ROW_TYPES)  # a run of some attentions keeps the file's other rows
    rows: list[dict[str, Any]] = []
    grid = [(entry, n) for entry in selected for n in sorted(args.lengths)]
    out_of_memory_at: dict[str, int] = {}
    progress = tqdm(grid, desc="efficiency", unit="cell", disable=args.quiet)
    for entry, seq_len in progress:
        progress.set_postfix_str(f"{entry.row} n={seq_len}")
        row = {
            "attention": entry.row,
            "attention_name": entry.name,
            "seq_len": seq_len,
            "batch": "",
            "time_ms": math.nan,
            "time_ms_std": math.nan,
            "memory_mb": math.nan,
            "status": "ok",
            "error": "",
            "repeats": "",
            **common,
        }
        if entry.row in out_of_memory_at:
            row.update(status="out_of_memory", error=f"skipped: out of memory at n={out_of_memory_at[entry.row]}")
        else:
            limit = args.memory_limit_mb if device.type == "cpu" else None
            try:
                with address_space_limit(limit):
                    row.update(measure_cell(entry, seq_len, args, model_config))
            except Exception as error:
                oom = is_out_of_memory(error)
                error_line = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                row.update(status="out_of_memory" if oom else "failed", error=error_line)
                if oom:
                    out_of_memory_at[entry.row] = seq_len
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        rows.append(row)
        if not args.quiet:
            progress.write(
                f"{entry.row:<16} n={seq_len:<6} batch={row['batch']!s:<5} {row['time_ms']:10.3f} ms/inst "
                f"{row['memory_mb']:10.2f} MB/inst {row['status']} {row['error']}"
            )
        write_rows(merge_rows(earlier, rows, CELL), path, FIELDS)
    shown = [
        row for row in merge_rows(earlier, rows, CELL) if (row["device"], row["dtype"]) == (common["device"], common["dtype"])
    ]
    versions = ", ".join(sorted({str(row["torch"]) for row in shown}))
    plot(
        shown,
        path.with_suffix(".png"),
        f"{common['device']}, torch {versions}, {common['dtype']}, "
        + ("largest batch that fits" if device.type == "cuda" else f"batch {args.batch}"),
    )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return rows


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.get_cmap("tab20").colors  # 20 distinct colours: the default cycle repeats after 10 lines
    for index, attention in enumerate(dict.fromkeys(row["attention"] for row in rows)):
        measured = [row for row in rows if row["attention"] == attention and row["status"] == "ok"]
        if not measured:
            continue
        lengths = [row["seq_len"] for row in measured]
        style = {
            "marker": "o",
            "linestyle": "--" if attention == "none" else "-",
            "label": attention,
            "color": colors[(2 * index) % 20 + (2 * index) // 20 % 2],
        }
        time_axis.plot(lengths, [row["time_ms"] for row in measured], **style)
        memory_axis.plot(lengths, [row["memory_mb"] for row in measured], **style)
    for axis, label in ((time_axis, "time per instance (ms)"), (memory_axis, "peak memory per instance (MB)")):
        axis.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=label)
        axis.set_xscale("log", base=2)
        axis.grid(True, which="both", alpha=0.3)
    memory_axis.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"Training step (forward + backward), 6 layers, width 256\n{title}", fontsize=9)
    figure.tight_layout()
    save_figure(figure, path)


def available_memory_mb() -> float:
    return proc_value_mb(Path("/proc/meminfo"), "MemAvailable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lra.bench efficiency", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when a GPU is present)",
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=None, help="default: 512..16384 on a GPU, 512..8192 on a CPU (powers of two)"
    )
    parser.add_argument("--attentions", nargs="+", default=None, help="rows to run (default: all); see --list")
    parser.add_argument("--list", action="store_true", help="print the attentions the grid would run and exit")
    parser.add_argument(
        "--precision", choices=["32", "bf16-mixed"], default=None, help="default: bf16-mixed on a GPU, 32 on a CPU"
    )
    parser.add_argument("--batch", type=int, default=1, help="the batch on a CPU (a GPU uses the largest that fits)")
    parser.add_argument("--max-batch-tokens", type=int, default=2**20, help="GPU: cap on batch x sequence length")
    parser.add_argument(
        "--min-run-time",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds of timed steps per cell, after one warm-up step (Timer.blocked_autorange; default: 1)",
    )
    add_memory_limit_argument(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="folder for efficiency_<device>.csv and .png (default: results/ in the current folder)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-cell lines")
    args = parser.parse_args(argv)
    if args.list:
        for entry in entries():
            print(f"{entry.row:<16} {entry.name:<14} {entry.hparams}")
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if args.min_run_time <= 0 or args.batch < 1:
        parser.error(f"--min-run-time must be positive seconds and --batch >= 1, got {args.min_run_time:g} and {args.batch}")
    args.lengths = args.lengths or [2**p for p in range(9, 15 if device.type == "cuda" else 14)]
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be positive, got {args.lengths}")
    args.precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32")
    if device.type == "cpu" and args.memory_limit_mb is None:
        args.memory_limit_mb = 0.9 * available_memory_mb()
    print(f"torch {torch.__version__} on {device_name(device)}, precision {args.precision}, lengths {args.lengths}")
    run_grid(args)
    return 0
