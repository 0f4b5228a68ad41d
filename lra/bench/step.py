"""Time, throughput and peak memory of the LRA model's full training step, per task and attention, as ``lra.train`` runs it.

For each option of the ``attention`` config group (the rows of Table 3, :func:`lra.config.attention_rows`) and each
task's paper model and length (``python -m lra.train task=<task> experiment=paper``'s configuration: the task's
``conf/task/<task>.yaml`` with ``conf/model/lra.yaml``; ListOps 2048, Text 4096, Retrieval 2 x 4096 (two documents
of 4000 bytes, each through the shared encoder), Image 1024, Pathfinder 1024, each at its protocol's batch, learning
rate and schedule), or at the lengths ``--seq-len`` gives::

    python -m lra.bench step [--tasks listops text ...] [--attentions none,softmax,yoso_32 ... | table3]
        [--seq-len paper 8192 ...] [--max-run-time 10] [--warmup 1] [--precision 32|bf16-mixed]
        [--compile [--compile-mode reduce-overhead] [--eager-too]] [--profile] [--batch N] [--device cpu|cuda]
        [--out results]

``--attentions table3`` names the twelve rows of the YOSO paper's Table 3 at once (``lra_table1``: the eleven of the
LRA paper's Table 1; :data:`lra.paper.TABLES`), beside or instead of single rows.

The step (:class:`TrainingStep`) is Lightning's automatic optimisation of ``lra.train``'s module: the
:class:`~lra.module.LRAClassificationModule` built with the settings ``lra.fit`` gives it, its
``configure_optimizers()`` (AdamW, fused on a GPU, OneCycleLR), and per step ``zero_grad``, the module's
``training_loss`` (the loss and the batch's accuracy, under bf16 autocast with ``--precision bf16-mixed``, as
Lightning's; the attention stays in float32 where ``model.attention_in_float32`` says so), ``backward``,
``optimizer.step`` and ``scheduler.step``. What the Trainer adds around it (logging, the progress bar) is not part of
it. ``eval_ms`` is an evaluation batch's time, as validation takes it (``evaluation_loss`` under ``no_grad``: the
loss and the accuracy's update). ``--compile`` compiles the module's training and evaluation steps whole first
with :func:`lra.module.compile_model`, as ``trainer.compile=true`` does, in Inductor's ``--compile-mode`` as
``trainer.compile_mode`` (``reduce-overhead``: CUDA graphs); the compilation (the call and the first step, where
``torch.compile`` compiles) is timed on its own (``compile_s``), never in the step. ``--eager-too`` then measures
the same grid eagerly into the same file: compiled first, so a time limit that stops the command cuts the eager
grid.

``--profile``: after a cell's timing, :data:`PROFILED_STEPS` more steps under ``torch.profiler``, written to
``<out>/step_<device type>_profile/<task>_n<n>_<attention>[_data_loading]_<variant>.txt``: per phase of the step
(zero_grad, forward, backward, optimizer, schedule) the host's milliseconds and, on a GPU, the kernels launched and
their device milliseconds, then the profiler's table of operators. The row gets ``device_ms`` (the device's busy
time per step, kernels and copies) and ``kernels`` (launched per step): a step far longer than its ``device_ms``
waits on the host.

Batches, data loading excluded: one random batch per cell in the shape of the task's batches (``input_ids``, or
``input_ids_0`` and ``input_ids_1``, and ``label``), already on the device (:func:`random_batch`).

Data loading included: one more line per task, at its first length, with the ``none`` attention (the floor, where
loading weighs most; the first selected attention when ``none`` is not), whose every step first takes the next batch
of the task's real :class:`~lra.datamodule.LRADataModule` (``num_workers`` of ``conf/trainer``) and moves it to the
device (``non_blocking``, from page-locked memory on a GPU), as the Trainer does. It reads the task's data where it
is present (official files, or a cache prepared or generated before) at the task's own length; otherwise ListOps is
generated, small (:data:`GENERATED_BATCHES` batches, read pass after pass), in a temporary folder, with the
generator's lengths scaled to n; any other task's line is recorded as ``skipped``, with the reason. Nothing is
downloaded.

Time: ``torch.utils.benchmark.Timer`` (:mod:`lra.bench.timing`), after ``--warmup`` warm-up steps and one untimed
step for memory. ``step_ms`` is the median time of a step waited for (the device synchronised after each), from
Timer's ``adaptive_autorange``: blocks of steps (a step a block from about 10 ms a step) are timed until their
interquartile range is under :data:`SPREAD_BOUND` of their median (at least four blocks) or ``--max-run-time`` seconds
are spent; ``step_ms_std`` is the blocks' standard deviation, ``steps`` the steps they hold and ``attempts`` the blocks.
Samples per second = batch / step time; ``eval_ms``, an evaluation batch, is timed the same way. ``loop_ms`` and
``eval_loop_ms``: as many steps and evaluation batches again, run back to back with the device synchronised once after
them (``Timer.timeit``), per step, as ``lra.train``'s loop runs them (it waits for the device only where it writes a
metrics row): the host's work on one step overlaps the device's on the step before, so where ``step_ms`` is the host's
and the device's time in sequence, ``loop_ms`` is nearer the larger of the two, and a run's length is its steps times
``loop_ms``. Noise, honestly reported: ``spread`` is the blocks' IQR / median when Timer stopped, and ``noisy`` is True
when it is still over the bound (the time ran out first), which the printed line and the figure show too. A load that
slows every step of a cell alike does not spread them, so it is not caught: compare reruns for that. (Rows measured
before the Timer, up to 2026-12-05, timed ``--steps`` steps one by one, measured a cell up to three times while the
steps spread over 10% in (max - min) / median, and kept the steadiest attempt: ``attempts`` counted those.)

Memory: the peak of the untimed step above what was in use before the module
was built (weights, gradients, AdamW's state, activations, temporaries; on a CPU the process's resident set, measured
apart from the timed steps because the meter slows them, :class:`~lra.bench.memory.MemoryMeter`), under an
address-space limit on a CPU as ``lra.bench efficiency``. ``ratio_to_none``: a row's step time over the ``none`` row's
(no token mixing: the step's floor) of the same task and length without data loading.

A cell that runs out of memory or fails is recorded as ``out_of_memory`` or ``failed`` with its error, and the grid
goes on. Rows go to ``<out>/step_<device type>.csv`` (rewritten after every cell, so an interrupted run keeps what it
measured) with a figure of step time and memory beside it. A run replaces the rows of the cells it measures (task,
length, attention, data loading, precision, compilation) and keeps the file's other rows, so a part of the grid, or
another precision or ``--compile``, is measured into the same file; ratios are to ``none`` of the same variant.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.benchmark import Measurement
from tqdm import tqdm

from lra import config
from lra.bench.efficiency import (
    Entry,
    add_memory_limit_argument,
    address_space_limit,
    available_memory_mb,
    entries,
    is_out_of_memory,
)
from lra.bench.memory import MemoryMeter
from lra.bench.output import RESULTS
from lra.bench.timing import back_to_back, calls_timed, milliseconds, relative_spread, synchronize, timer
from lra.data import cache
from lra.data.tasks import get_spec, resolve
from lra.datamodule import LRADataModule
from lra.devices import device_name
from lra.module import COMPILE_MODES, LRAClassificationModule
from lra.paper import TABLES
from lra.rows import merge_rows, pyplot, read_rows, save_figure, write_rows

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
PAPER = "paper"  # --seq-len's word for a task's own length
FLOOR = "none"  # the row without token mixing: the ratios' denominator
PROTOCOL_SETTINGS = ("lr", "warmup_steps", "max_steps", "weight_decay")  # what lra.fit gives the module of task.protocol
# Black pixels (id 0) are padding where task.data.pixel_zero_is_padding. Pathfinder's images are mostly black
# background: 47-61%, 54% on average, in 200 images of lra.data.pathfinder_generator with LRA's parameters (seed 0).
# CIFAR-10's grey levels are drawn uniformly, so 1 pixel in 256 is black.
BLACK_PIXEL_SHARE = {"pathfinder": 0.54}
PIXEL_LEVELS = 256
FIELDS = [
    "task",
    "seq_len",
    "inputs",
    "attention",
    "attention_name",
    "data_loading",
    "data_source",
    "batch",
    "padding",
    "step_ms",
    "step_ms_std",
    "spread",
    "attempts",
    "noisy",
    "samples_per_s",
    "ratio_to_none",
    "eval_ms",
    "loop_ms",
    "eval_loop_ms",
    "device_ms",
    "kernels",
    "memory_mb",
    "compiled",
    "compile_mode",
    "compile_s",
    "status",
    "error",
    "device",
    "threads",
    "torch",
    "precision",
    "steps",
    "warmup",
    "measured_at",  # UTC, when the cell was measured: a run's figures are its own rows, not the file's earlier ones
]


# A row's identity: a later run of the same cell replaces it, every other row of the file is kept.
VARIANT = ("precision", "compiled", "compile_mode")
CELL = ("device", "task", "seq_len", "attention", "data_loading", *VARIANT)  # another GPU's row is another cell
NUMBERS = (
    "seq_len",
    "inputs",
    "batch",
    "padding",
    "step_ms",
    "step_ms_std",
    "spread",
    "attempts",
    "samples_per_s",
    "eval_ms",
    "loop_ms",
    "eval_loop_ms",
    "device_ms",
    "kernels",
    "memory_mb",
    "compile_s",
)
FLAGS = ("data_loading", "compiled", "noisy")
# How the file's text reads back: numbers and flags typed as a run's rows hold them, every other column as text (a
# column an older file lacks reads as "", not measured; compile_mode "": the default).
TYPES = {
    **dict.fromkeys(FIELDS, str),
    **dict.fromkeys(NUMBERS, lambda text: int(text) if text.lstrip("-").isdigit() else float(text)),
    **dict.fromkeys(FLAGS, lambda text: text == "True"),
}
#: Timer's adaptive_autorange times a cell's steps until their blocks' IQR / median is under this bound (or
#: --max-run-time runs out: the row is then marked noisy).
SPREAD_BOUND = 0.10
GENERATED_BATCHES = 64  # a data-loading line's generated ListOps, read pass after pass as the Trainer reads epochs


def timed_columns(measured: Measurement, batch: int) -> dict[str, Any]:
    """A row's columns of Timer's measurement of its steps: the median step and the noise around it."""
    step_ms = round(milliseconds(measured), 2)  # samples_per_s derives from the written figure so a row agrees with itself
    blocks = measured.times
    return {
        "step_ms": step_ms,
        "step_ms_std": round(statistics.stdev(blocks) * 1e3, 2) if len(blocks) > 1 else 0.0,
        "samples_per_s": round(batch / step_ms * 1e3, 3),
        "spread": round(relative_spread(measured), 3),
        "attempts": len(blocks),
        "steps": calls_timed(measured),
        "noisy": not measured.meets_confidence(SPREAD_BOUND),
    }


class Unavailable(Exception):
    """The data a data-loading line needs is not here (and is not cheap to make)."""


def task_config(task: str, device: torch.device) -> DictConfig:
    """The configuration of ``python -m lra.train task=<task> experiment=paper`` with the device's trainer."""
    return config.compose([f"task={task}", "experiment=paper", f"trainer={'gpu' if device.type == 'cuda' else 'cpu'}"])


def scaled(tokens: int, seq_len: int, task: DictConfig) -> int:
    """A length of ``task`` at its own ``seq_len``, in proportion at ``seq_len``: at least 1."""
    return max(1, round(tokens * seq_len / task.seq_len))


def random_batch(cfg: DictConfig, seq_len: int, batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tokens in the shape of the task's batches at ``seq_len``, with the task's padding (id 0).

    Text-like tasks: tokens uniform over the vocabulary's real ids, each input's real length uniform between the
    task's bounds scaled to ``seq_len`` (ListOps: its generator's, 501..1999 of 2048; Text and Retrieval, whose
    lengths only their data knows: 1..``data.max_length``, 4000 of 4096), zeros after it. Pixel tasks:
    grey levels uniform, black with :data:`BLACK_PIXEL_SHARE` (padding where ``pixel_zero_is_padding``; with
    ``false`` every pixel is shifted to id + 1 and nothing is padded). Labels uniform over the classes.
    """
    task = cfg.task
    spec = get_spec(task.name)
    shape = (batch, seq_len)
    inputs = {}
    for name in spec.inputs:
        if spec.pixels:
            tokens = torch.randint(1, PIXEL_LEVELS, shape, generator=generator)
            black = torch.rand(shape, generator=generator) < BLACK_PIXEL_SHARE.get(task.name, 1 / PIXEL_LEVELS)
            tokens = tokens.masked_fill(black, 0) + spec.token_offset(task.data)
        else:
            generated = task.data.get("generator")
            shortest, longest = (generated.min_length + 1, generated.max_length - 1) if generated else (1, task.data.max_length)
            low, high = scaled(shortest, seq_len, task), min(seq_len, scaled(longest, seq_len, task))
            lengths = torch.randint(low, high + 1, (batch, 1), generator=generator)
            tokens = torch.randint(1, spec.vocab_size, shape, generator=generator)
            tokens = tokens.masked_fill(torch.arange(seq_len) >= lengths, 0)  # (b, n)
        inputs[name] = tokens
    return {**inputs, "label": torch.randint(0, spec.num_classes, (batch,), generator=generator)}


def padding_share(batch: dict[str, torch.Tensor]) -> float:
    """The share of padded positions (id 0) over a batch's token arrays."""
    tokens = [value for name, value in batch.items() if name != "label"]
    return sum(int((ids == 0).sum()) for ids in tokens) / sum(ids.numel() for ids in tokens)


def build_module(cfg: DictConfig, entry: Entry, seq_len: int) -> LRAClassificationModule:
    """The module ``lra.fit`` trains for ``cfg`` with ``entry``'s attention, at ``seq_len``."""
    protocol = cfg.task.protocol
    return LRAClassificationModule(
        task=cfg.task.name,
        seq_len=seq_len,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention={"name": entry.name, "hparams": entry.hparams},
        **{key: protocol[key] for key in PROTOCOL_SETTINGS},
    )


PHASES = ("zero_grad", "forward", "backward", "optimizer", "schedule")  # a step's parts, in order (--profile)
PROFILED_STEPS = 5


class TrainingStep:
    """One optimisation step of ``module``, as the Trainer takes it in ``lra.train`` (automatic optimisation).

    ``zero_grad``, the module's ``training_loss`` (the loss and the batch's accuracy, on the device; under bf16
    autocast for ``bf16-mixed``, as Lightning's precision plugin), ``backward``, the optimiser's step and the
    schedule's (``interval: step``). The optimiser and schedule are the module's ``configure_optimizers()``. Each
    phase (:data:`PHASES`) is a ``record_function`` range while ``profiling`` is set, for the profiler's breakdown.
    """

    def __init__(self, module: LRAClassificationModule, precision: str) -> None:
        optimisation = module.configure_optimizers()
        self.module = module
        self.optimizer = optimisation["optimizer"]
        self.scheduler = optimisation["lr_scheduler"]["scheduler"]
        self.bf16 = precision == "bf16-mixed"
        self.profiling = False
        self.accuracy: torch.Tensor | None = None  # the last batch's, on the device, as the Trainer logs it

    def phase(self, name: str):
        return torch.profiler.record_function(f"step/{name}") if self.profiling else nullcontext()

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.phase("zero_grad"):
            self.optimizer.zero_grad(set_to_none=True)
        with self.phase("forward"), torch.autocast(self.module.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss, self.accuracy = self.module.training_loss(batch)
        with self.phase("backward"):
            loss.backward()
        with self.phase("optimizer"):
            self.optimizer.step()
        with self.phase("schedule"):
            self.scheduler.step()
        return loss

    def evaluate(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """An evaluation batch, as validation takes it: the loss and the accuracy's update, without gradients."""
        with torch.no_grad(), torch.autocast(self.module.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module.evaluation_loss(batch, "val")


def profile_steps(
    step: TrainingStep, next_batch: Callable[[], dict[str, torch.Tensor]], device: torch.device, path: Path, title: str
) -> tuple[Any, Any]:
    """Run :data:`PROFILED_STEPS` steps under ``torch.profiler``; write the breakdown to ``path``; ``(device_ms, kernels)``
    per step (device: kernels, copies and sets on a GPU; empty on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step.profiling = True
    try:
        with profile(activities=activities) as profiler:
            for _ in range(PROFILED_STEPS):
                step(next_batch())
            synchronize(device)
    finally:
        step.profiling = False
    events = profiler.events()
    ranges = {name: [e for e in events if e.name == f"step/{name}" and e.device_type.name == "CPU"] for name in PHASES}
    # Each operator that launched work belongs to the phase whose range holds its start (the backward's operators run
    # in autograd's device thread, outside the main thread's range, but within its time).
    launched = {name: [0, 0.0] for name in (*PHASES, "other")}
    for event in events:
        kernels = getattr(event, "kernels", None) or []
        if not kernels or event.device_type.name != "CPU":
            continue
        start = event.time_range.start
        phase = next((n for n in PHASES for r in ranges[n] if r.time_range.start <= start <= r.time_range.end), "other")
        launched[phase][0] += len(kernels)
        launched[phase][1] += sum(kernel.duration for kernel in kernels) / 1e3
    lines = [f"# {title}", f"# per step, the mean over {PROFILED_STEPS} profiled steps", ""]
    lines.append(f"{'phase':<12} {'host ms':>9} {'kernels':>8} {'device ms':>10}")
    for name in (*PHASES, "other"):
        host = sum(r.time_range.elapsed_us() for r in ranges.get(name, [])) / 1e3 / PROFILED_STEPS
        count, busy = launched[name]
        host_text = f"{host:9.3f}" if name != "other" else f"{'':>9}"
        lines.append(f"{name:<12} {host_text} {count / PROFILED_STEPS:8.1f} {busy / PROFILED_STEPS:10.3f}")
    kernels = sum(count for count, _ in launched.values()) / PROFILED_STEPS
    device_ms = sum(busy for _, busy in launched.values()) / PROFILED_STEPS
    lines += ["", f"device busy per step: {device_ms:.3f} ms in {kernels:.1f} kernels" if device.type == "cuda" else "", ""]
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    lines.append(profiler.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=60))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return (round(device_ms, 3), round(kernels, 1)) if device.type == "cuda" else ("", "")


def loading_data(cfg: DictConfig, seq_len: int, batch: int, batches: int, scratch: Path) -> tuple[dict[str, Any], bool]:
    """``(task.data, made here)``: what a data-loading line reads: the task's own data where present, else a ListOps of
    ``batches`` batches generated into ``scratch``.

    Raises :class:`Unavailable` with the reason for any other task without data.
    """
    task = cfg.task
    data = OmegaConf.to_container(task.data, resolve=True)
    if seq_len == task.seq_len:
        try:
            resolved = resolve(task.name, data)
        except FileNotFoundError as error:
            missing = str(error).splitlines()[0]
        else:
            if resolved.kind == "official" or (resolved.folder / cache.MANIFEST).is_file():
                return data, False
            missing = f"no {task.name} data at {data['source_dir']}, and none generated at this configuration"
    else:
        missing = f"the {task.name} data is {task.seq_len} tokens long, not {seq_len}"
    if task.name != "listops":
        raise Unavailable(f"skipped: {missing} (only ListOps is generated here, nothing is downloaded)")
    generator = dict(data["generator"])
    shortest, longest = (scaled(generator[key], seq_len, task) for key in ("min_length", "max_length"))
    generator.update(num_train=batch * batches, num_val=batch, num_test=batch, min_length=shortest, max_length=longest)
    folders = {"generated_dir": str(scratch / "generated"), "cache_dir": str(scratch / "cache")}
    return {**data, **folders, "source": "generated", "max_length": longest, "generator": generator}, True


def endless(loader) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches, pass after pass, as the Trainer reads them across epochs."""
    while True:
        yield from loader


@contextmanager
def loaded_batches(cfg: DictConfig, seq_len: int, batch: int, batches: int, device: torch.device):
    """``(next_batch, data_source)``: ``next_batch()`` takes the next training batch of the task's LRADataModule
    (see :func:`loading_data`) and moves it to ``device``."""
    with tempfile.TemporaryDirectory(prefix="lra-bench-train-") as scratch:
        data, made_here = loading_data(cfg, seq_len, batch, batches, Path(scratch))
        datamodule = LRADataModule(
            cfg.task.name, seq_len, data, batch, num_workers=cfg.num_workers, seed=cfg.seed, pin_memory=device.type == "cuda"
        )  # pinned for a GPU, as lra.train's Trainer has them (a copy from pageable memory waits for the host to stage it)
        datamodule.prepare_data()
        datamodule.setup("fit")
        stream = endless(datamodule.train_dataloader())
        source = datamodule.task_data.data_source + (f" here ({batches} batches)" if made_here else "")
        yield (lambda: {name: value.to(device, non_blocking=True) for name, value in next(stream).items()}), source


def measure_cell(
    cfg: DictConfig,
    entry: Entry,
    seq_len: int,
    batch: int,
    next_batch: Callable[[], dict[str, torch.Tensor]],
    data_loading: bool,
    args,
) -> dict[str, Any]:
    """Build the module for ``entry`` and time its training step on ``next_batch()``'s batches; the row's measured part."""
    device = torch.device(args.device)
    meter = MemoryMeter(device)
    torch.manual_seed(cfg.seed)
    module = build_module(cfg, entry, seq_len).to(device).train()
    step = TrainingStep(module, args.precision)
    compile_s = compile_step(step, next_batch, args.compile_mode) if args.compile else ""
    for _ in range(args.warmup):
        step(next_batch())
    synchronize(device)
    meter.reset_peak()
    step(next_batch())  # the memory's run: the CPU's meter slows it
    synchronize(device)
    memory = meter.peak_above_baseline()

    def until_steady(run: Callable[[], object]):
        return timer(run, device).adaptive_autorange(threshold=SPREAD_BOUND, max_run_time=args.max_run_time)

    measured = until_steady(lambda: step(next_batch()))
    loop = back_to_back(lambda: step(next_batch()), device, calls_timed(measured))
    module.eval()
    evaluation = until_steady(lambda: step.evaluate(next_batch()))
    eval_loop = back_to_back(lambda: step.evaluate(next_batch()), device, calls_timed(evaluation))
    module.train()
    device_ms, kernels = "", ""
    if args.profile:
        variant = "_".join(filter(None, [args.precision, "compiled" if args.compile else "", args.compile_mode or ""]))
        loading = "_data_loading" if data_loading else ""  # apart from the same row without data loading, which it overwrote
        name = f"{cfg.task.name}_n{seq_len}_{entry.row}{loading}_{variant}".replace("-", "_")
        title = f"{cfg.task.name} n={seq_len} {entry.row}{' + data loading' if data_loading else ''}, batch {batch}, "
        title += f"{variant}, on {device_name(device)}"
        path = args.out / f"step_{device.type}_profile" / f"{name}.txt"
        device_ms, kernels = profile_steps(step, next_batch, device, path, title)
    return {
        **timed_columns(measured, batch),
        "eval_ms": round(milliseconds(evaluation), 2),
        "loop_ms": round(milliseconds(loop), 2),
        "eval_loop_ms": round(milliseconds(eval_loop), 2),
        "device_ms": device_ms,
        "kernels": kernels,
        "memory_mb": round(memory, 1),
        "compile_s": compile_s,
    }


def compile_step(step: TrainingStep, next_batch: Callable[[], dict[str, torch.Tensor]], mode: str | None) -> float:
    """Compile ``step``'s module as ``trainer.compile=true`` does and take its first step (where ``torch.compile``
    compiles); the seconds both took."""
    from lra.module import compile_model  # torch.compile support: only where it is asked for

    # Dynamo keeps the earlier cells' graphs of the same functions, and past its limit of compilations per function
    # (torch._dynamo.config.recompile_limit, 8) would run this cell eagerly: each cell compiles afresh.
    torch.compiler.reset()
    start = time.perf_counter()
    compile_model(step.module, mode=mode)
    step(next_batch())
    synchronize(step.module.device)
    return round(time.perf_counter() - start, 2)


def run_cell(row: dict[str, Any], cfg: DictConfig, entry: Entry, args) -> None:
    """Measure one row's cell into ``row``: its batches, then :func:`measure_cell`; a failure is recorded, not raised."""
    device = torch.device(args.device)
    seq_len, batch = row["seq_len"], row["batch"]
    try:
        with ExitStack() as stack:
            stack.enter_context(address_space_limit(args.memory_limit_mb if device.type == "cpu" else None))
            if row["data_loading"]:
                next_batch, row["data_source"] = stack.enter_context(
                    loaded_batches(cfg, seq_len, batch, GENERATED_BATCHES, device)
                )
            else:
                tensors = {
                    name: value.to(device)
                    for name, value in random_batch(cfg, seq_len, batch, torch.Generator().manual_seed(cfg.seed)).items()
                }
                row["data_source"] = "random"
                next_batch = itertools.repeat(tensors).__next__  # the same batch every step
            row["padding"] = round(padding_share(next_batch()), 3)
            row.update(measure_cell(cfg, entry, seq_len, batch, next_batch, row["data_loading"], args))
    except Unavailable as reason:
        row.update(status="skipped", error=str(reason))
    except Exception as error:
        row.update(status="out_of_memory" if is_out_of_memory(error) else "failed", error=error_line(error))
        traceback.print_exc(file=sys.stderr)  # the whole story in the log; the row keeps one line
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def error_line(error: BaseException) -> str:
    """One line for a failed cell: the error and, where it wraps another (a compiler backend's failure), the innermost
    cause, whose first line is the one that names the problem."""
    line = f"{type(error).__name__}: {error}".splitlines()[0]
    cause = error
    while (inner := cause.__cause__ or getattr(cause, "inner_exception", None)) is not None and inner is not cause:
        cause = inner
    if cause is not error:
        line += f" {type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
    return line[:300]


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Set each measured row's ``ratio_to_none``: its step time over the ``none`` row's of its device, task, length,
    precision and compilation."""

    def group(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["device"], row["task"], row["seq_len"], *(row[field] for field in VARIANT)

    floors = {
        group(row): row["step_ms"]
        for row in rows
        if row["attention"] == FLOOR and not row["data_loading"] and row["status"] == "ok"
    }
    for row in rows:
        floor = floors.get(group(row))
        row["ratio_to_none"] = round(row["step_ms"] / floor, 3) if floor and row["status"] == "ok" else ""


def grid(args, selected: list[Entry]) -> Iterator[tuple[DictConfig, Entry, int, bool]]:
    """``(task config, attention, n, data loading)`` per cell: each task's lengths with ``none`` first, then its
    data-loading line at its first length."""
    ordered = sorted(selected, key=lambda entry: entry.row != FLOOR)
    for task in args.tasks:
        cfg = task_config(task, torch.device(args.device))
        lengths = list(dict.fromkeys(cfg.task.seq_len if n == PAPER else int(n) for n in args.seq_len))
        for seq_len in lengths:
            for entry in ordered:
                yield cfg, entry, seq_len, False
        yield cfg, ordered[0], lengths[0], True


def run_grid(args, selected: list[Entry]) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    common = {
        "device": device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else "",
        "torch": torch.__version__,
        "compiled": args.compile,
        "compile_mode": args.compile_mode or "",
        "warmup": args.warmup,
    }
    path = args.out / f"step_{device.type}.csv"
    rows = read_rows(path, TYPES)  # earlier runs' cells stay, those measured again are replaced
    cells = list(grid(args, selected))
    progress = tqdm(cells, desc="train", unit="cell", disable=args.quiet)
    for cfg, entry, seq_len, data_loading in progress:
        label = f"{cfg.task.name} n={seq_len} {entry.row}" + (" + data loading" if data_loading else "")
        progress.set_postfix_str(label)
        bf16 = args.precision == "bf16-mixed"
        row = {
            "task": cfg.task.name,
            "seq_len": seq_len,
            "inputs": len(get_spec(cfg.task.name).inputs),
            "attention": entry.row,
            "attention_name": entry.name,
            "data_loading": data_loading,
            "data_source": "",
            "batch": args.batch or cfg.task.protocol.batch_size,
            "padding": "",
            "step_ms": "",
            "step_ms_std": "",
            "spread": "",
            "attempts": "",
            "steps": "",
            "noisy": "",
            "samples_per_s": "",
            "eval_ms": "",
            "loop_ms": "",
            "eval_loop_ms": "",
            "device_ms": "",
            "kernels": "",
            "memory_mb": "",
            "compile_s": "",
            "status": "ok",
            "error": "",
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "precision": "bf16 autocast (attention in float32)" if bf16 and cfg.model.attention_in_float32 else args.precision,
            **common,
        }
        run_cell(row, cfg, entry, args)
        rows = merge_rows(rows, [row], CELL)
        add_ratios(rows)
        if not args.quiet:
            progress.write(
                f"{label:<44} batch={row['batch']:<4} {row['step_ms']!s:>10} ms/step {row['samples_per_s']!s:>9} samples/s "
                f"x{row['ratio_to_none']!s:<6} {row['memory_mb']!s:>8} MB {row['status']}{noise_note(row)} {row['error']}"
            )
        write_rows(rows, path, FIELDS)
    threads = f", {common['threads']} threads" if common["threads"] else ""
    devices = " and ".join(dict.fromkeys(str(row["device"]) for row in rows))  # earlier rows may be another GPU's
    versions = " and ".join(dict.fromkeys(str(row["torch"]) for row in rows))
    title = f"{devices}{threads}, torch {versions}"
    plot(rows, path.with_suffix(".png"), title)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return rows


def noise_note(row: dict[str, Any]) -> str:
    """What the printed line and the figure say of a row whose steps stayed noisy (empty otherwise)."""
    if row.get("noisy") is not True:
        return ""
    return f" NOISY (steps spread {row['spread']:.0%} > {SPREAD_BOUND:.0%} of their median after {row['steps']} steps)"


def label(row: dict[str, Any], with_device: bool = False) -> str:
    """A row's name in the figure: its attention, how its step differs from the plain float32 eager one, and its
    device where the figure holds several."""
    notes = [
        *(["bf16"] if row["precision"] != "32" else []),
        *(["compiled"] if row["compiled"] else []),
        *([row["compile_mode"]] if row.get("compile_mode") else []),
        *(["+ data loading"] if row["data_loading"] else []),
        *([f"({row['device'].removeprefix('NVIDIA ')})"] if with_device else []),
    ]
    return " ".join([row["attention"], *notes])


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """One pair of panels per task and length: step time (with the ratio to ``none``) and peak memory per line."""
    plt = pyplot()
    groups = list(dict.fromkeys((row["task"], row["seq_len"]) for row in rows))
    heights = [sum(1 for row in rows if (row["task"], row["seq_len"]) == group) for group in groups]
    figure, axes = plt.subplots(
        len(groups), 2, figsize=(13, 1.2 + 0.28 * sum(heights) + 0.6 * len(groups)), squeeze=False, height_ratios=heights
    )
    for (task, seq_len), (time_axis, memory_axis) in zip(groups, axes, strict=True):
        lines = [row for row in rows if (row["task"], row["seq_len"]) == (task, seq_len)]
        labels = [label(row, with_device=len({row["device"] for row in rows}) > 1) for row in lines]
        measured = [row["status"] == "ok" for row in lines]
        times = [row["step_ms"] / 1e3 if ok else 0.0 for row, ok in zip(lines, measured, strict=True)]
        memory = [row["memory_mb"] if ok else 0.0 for row, ok in zip(lines, measured, strict=True)]
        colors = ["tab:gray" if row["attention"] == FLOOR else "tab:blue" for row in lines]
        time_axis.barh(labels, times, color=colors)
        memory_axis.barh(labels, memory, color=colors)
        for index, (row, ok) in enumerate(zip(lines, measured, strict=True)):
            note = f" x{row['ratio_to_none']}" if ok and row["ratio_to_none"] != "" else ("" if ok else f" {row['status']}")
            note += " noisy" if row.get("noisy") is True else ""
            time_axis.text(times[index], index, note, va="center", fontsize=7)
        batch = lines[0]["batch"]
        time_axis.set(xlabel="training step (s)", title=f"{task}, n = {seq_len}, batch {batch}")
        memory_axis.set(xlabel="peak memory (MB)", title=f"{task}, n = {seq_len}, batch {batch}")
        for axis in (time_axis, memory_axis):
            axis.invert_yaxis()
            axis.tick_params(labelsize=7)
            axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(f"Full training step (forward, backward, AdamW, schedule), the LRA model\n{title}", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / figure.get_figheight()))  # half an inch above the panels for the title
    save_figure(figure, path, dpi=110)


def sequence_length(value: str) -> str:
    """``paper`` or a positive integer (kept as text; the grid resolves ``paper`` per task)."""
    if value != PAPER and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"a sequence length is '{PAPER}' (the task's own) or a positive integer, got {value!r}")
    return value


def listed(values: list[str]) -> list[str]:
    """The items of a list option given as ``a b``, ``a,b`` or both (``a,b c``), in order, without repeats."""
    return list(dict.fromkeys(item for value in values for item in value.split(",") if item))


def attention_rows(values: list[str]) -> list[str]:
    """``--attentions``' rows, in order, without repeats: each item a row of ``conf/attention``, or a published table's
    name (:data:`lra.paper.TABLES`: ``table3``, ``lra_table1``) for all its rows."""
    return list(dict.fromkeys(row for item in listed(values) for row in (TABLES[item].presets if item in TABLES else [item])))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lra.bench step",
        description=__doc__.split("\n\n")[0],
        epilog=(
            f"Noise: a cell's steps are timed (torch.utils.benchmark.Timer.adaptive_autorange) until their blocks "
            f"spread less than {SPREAD_BOUND:.0%} of their median (interquartile range / median) or --max-run-time runs "
            "out; a cell still spread more is marked noisy (the CSV's noisy column, the printed line, the figure). "
            "Lists take spaces or commas."
        ),
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"tasks to run: {', '.join(TASKS)} (default: all)")
    parser.add_argument(
        "--attentions",
        nargs="+",
        default=None,
        help=f"rows to run, e.g. none softmax or none,softmax, or a table's rows: {', '.join(TABLES)} (default: all); see --list",
    )
    parser.add_argument(
        "--seq-len",
        nargs="+",
        default=[PAPER],
        help=f"lengths per task: '{PAPER}' (the task's own, the default) and/or any n, e.g. --seq-len {PAPER} 8192",
    )
    parser.add_argument(
        "--max-run-time",
        type=float,
        default=10.0,
        metavar="S",
        help=f"seconds at most of timed steps per cell, and of evaluation batches (default 10): Timer stops sooner once "
        f"they spread under {SPREAD_BOUND:.0%}% (see below)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps before them (default 1)")
    parser.add_argument("--batch", type=int, default=None, help="the batch of every task (default: each task's protocol)")
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when a GPU is present)",
    )
    parser.add_argument(
        "--precision", choices=["32", "bf16-mixed"], default=None, help="default: bf16-mixed on a GPU, 32 on a CPU (conf/trainer)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the steps first (lra.module.compile_model)")
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default=None,
        help="with --compile: Inductor's mode, as trainer.compile_mode (reduce-overhead: CUDA graphs on a GPU)",
    )
    parser.add_argument(
        "--eager-too",
        action="store_true",
        help="with --compile: then the same grid eagerly, into the same file (its own rows)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"profile {PROFILED_STEPS} more steps per cell: <out>/step_<device>_profile/<cell>.txt, device_ms and kernels",
    )
    add_memory_limit_argument(parser)
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="folder for step_<device>.csv and .png (default: results/ here)"
    )
    parser.add_argument("--list", action="store_true", help="print the attentions and the tasks' settings and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-cell lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.tasks = listed(args.tasks)
    unknown_tasks = [task for task in args.tasks if task not in TASKS]
    if unknown_tasks:
        parser.error(f"unknown task(s) {unknown_tasks}; available: {', '.join(TASKS)}")
    try:
        args.seq_len = [sequence_length(value) for value in listed(args.seq_len)]
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument --seq-len: {error}")
    if args.attentions:
        args.attentions = attention_rows(args.attentions)
    rows = set(config.attention_rows())
    selected = [entry for entry in entries() if entry.row in rows]
    if args.list:
        for entry in selected:
            print(f"{entry.row:<16} {entry.name:<14} {entry.hparams}")
        for task in TASKS:
            cfg = task_config(task, torch.device(args.device))
            documents = " x 2 documents" if get_spec(task).dual_encoder else ""
            print(f"{task:<16} n={cfg.task.seq_len}{documents}, batch {cfg.task.protocol.batch_size}")
        return 0
    if args.attentions:
        unknown = sorted(set(args.attentions) - rows)
        if unknown:
            parser.error(f"unknown attention(s) {unknown}; available: {', '.join(sorted(rows))}")
        by_row = {entry.row: entry for entry in selected}
        selected = [by_row[row] for row in args.attentions]  # in the order asked: a table's rows in its order
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if (args.compile_mode or args.eager_too) and not args.compile:
        parser.error("--compile-mode and --eager-too go with --compile: give it too")
    if args.max_run_time <= 0 or args.warmup < 0 or (args.batch is not None and args.batch < 1):
        parser.error("--max-run-time must be a positive number of seconds, --batch >= 1 and --warmup >= 0")
    args.precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32")
    if device.type == "cpu" and args.memory_limit_mb is None:
        args.memory_limit_mb = 0.9 * available_memory_mb()
    print(f"torch {torch.__version__} on {device_name(device)}, precision {args.precision}, tasks {', '.join(args.tasks)}")
    run_grid(args, selected)
    if args.eager_too:  # after the compiled grid: a time limit that stops the command cuts the eager one
        run_grid(argparse.Namespace(**{**vars(args), "compile": False, "compile_mode": None}), selected)
    return 0
