"""The full training step beside the authors' PyTorch LRA code, side by side in one process, alternating rounds.

For each row, the authors' model (mlpen/Nystromformer's ``LRA/code``: ``model_wrapper.ModelForSC`` built from its
``lra_config.config["listops"]`` with the row's ``extra_attn_config``, as its ``run_tasks.py`` does; its Performer
row calls lucidrains' performer-pytorch ``FastAttention``) and this project's (``lra.bench step``'s module and
:class:`~lra.bench.step.TrainingStep`, the row of ``conf/attention``) take the same ListOps batch and the same full
training step in float32::

    python -m lra.bench authors --authors-code PATH/Nystromformer/LRA/code [--performer-pytorch PATH/performer-pytorch]
        [--extra-path DIR ...] [--rows none softmax nystromformer linformer performer] [--rounds 5] [--batch 32]
        [--seq-len 2048] [--device cpu|cuda] [--out results]

Nothing is fetched: the paths name checkouts made beforehand (never part of this project), imported as they are.
``--extra-path DIR`` (repeatable) puts a folder first on ``sys.path`` while their code is imported, for packages
installed outside this project's environment (e.g. ``pip install --target DIR transformers sinkhorn-transformer``).
Their ``attention_reformer.py`` imports ``transformers.modeling_reformer``, transformers 3.x's layout (whose pins
have no Python 3.11 wheels); where no module of that name exists, an import hook (:class:`AliasFinder`, ``ALIASES``)
makes that name the module a current transformers has, ``transformers.models.reformer.modeling_reformer``, whose
``LSHSelfAttention`` / ``ReformerConfig`` their file uses unchanged. The rows their code lacks (``bigbird``,
``longformer``, ``sinkhorn``) run a widely used implementation (HF transformers' BigBird and Longformer attentions,
lucidrains' sinkhorn-transformer) inside their model through :mod:`lra.bench.authors_adapters`, with our row's
hyperparameters; the CSV's ``implementation`` and ``differences`` columns say what ran and where it differs from ours.
Their ``run_tasks.py`` step: ``zero_grad``, the loss's mean, ``backward``, AdamW (their betas and eps) and OneCycleLR;
theirs runs without mixed precision here (``mixed_precision: False``: float32, like ours on a CPU). Where an import of
theirs needs a package that is not installed and plays no part in the step (performer-pytorch's ``local_attention``,
``axial_positional_embedding``; ``einops``, of which ``FastAttention`` uses one ``repeat``), a stand-in module is put
in ``sys.modules`` at run time; their files are never edited.

Batch: ``lra.bench step``'s random ListOps batch (:func:`~lra.bench.step.random_batch`: real lengths 501..1999 of
2048, about 41% padding), the same tokens for both; theirs gets its float mask ``ids != 0`` as its dataset makes it.

Time: per row, both models are built (seeded alike), then ``--rounds`` rounds each time their step, then ours, with
``torch.utils.benchmark.Timer`` (:mod:`lra.bench.timing`: each step waited for): ``blocked_autorange`` times one block
of a side's steps after the steps it sizes the block with (a step a block from about 10 ms a step, as on a CPU; more
on a GPU, so that reading the clock costs nothing beside them), and the round's figure is its time per step.
``ratio`` is the median over rounds of theirs / ours (> 1: ours is faster); alternating keeps a load that comes and
goes on a shared machine out of the ratio, which is why only ratios, never a single run's seconds, are to be compared
across runs. Memory: as ``lra.bench step``,
each side's peak during one step (after one warm-up step) above what was in use before its model was built
(weights, gradients, AdamW's state, activations; on a CPU the resident set, :class:`~lra.bench.memory.MemoryMeter`),
measured before the timed rounds.

Rows go to ``<out>/authors_<device type>.csv`` (replaced per row, others kept) with the commits of their code (from
``git rev-parse`` in the given folders, or ``--authors-commit`` / ``--performer-commit``), the third-party package's
version (``implementation``), the machine and the date.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import statistics
import subprocess
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lra.bench import authors_adapters as adapters
from lra.bench.efficiency import entries
from lra.bench.memory import MemoryMeter
from lra.bench.output import RESULTS
from lra.bench.step import TrainingStep, build_module, padding_share, random_batch, task_config
from lra.bench.timing import synchronize, timer
from lra.devices import device_name
from lra.rows import merge_rows, read_rows, write_rows

TASK = "listops"
#: Our row of conf/attention -> the authors' ``attn_type`` (a key of their ``extra_attn_config``, but ``none``).
THEIR_ROWS = {
    "none": "none",
    "softmax": "softmax",
    "nystromformer": "nystrom-64",
    "linformer": "linformer-256",
    "performer": "performer-256",
    "linear_transformer": "linear",
    "reformer": "reformer-2",
    # Not in their code: a public implementation in their model through lra.bench.authors_adapters. The names are
    # ours; "longformer*" takes their Attention's (X, mask) branch, the others its (Q, K, V, mask) one.
    "bigbird": "bigbird-64",
    "longformer": "longformer-512",
    "sinkhorn": "sinkhorn-50",
}
DEFAULT_ROWS = ["none", "softmax", "nystromformer", "linformer", "performer"]
# Imported by their files (or performer-pytorch's, sinkhorn-transformer's) but unused by the step: a stand-in where
# not installed.
UNUSED_IMPORTS = {
    "local_attention": ["LocalAttention"],
    "axial_positional_embedding": ["AxialPositionalEmbedding"],
    "product_key_memory": ["PKM"],
}
# Old module name their files import -> where the installed package has it now (an alias put in place at import).
ALIASES = {"transformers.modeling_reformer": "transformers.models.reformer.modeling_reformer"}
# Their attention file per attn_type prefix (the CSV's implementation column).
THEIR_FILES = {
    "nystrom": "attention_nystrom.py",
    "linformer": "attention_linformer.py",
    "performer": "attention_performer.py + performer-pytorch FastAttention",
    "linear": "attention_linear.py",
    "reformer": "attention_reformer.py + transformers {transformers} LSHSelfAttention",
}
FIELDS = [
    "task",
    "seq_len",
    "batch",
    "padding",
    "row",
    "their_attention",
    "our_attention",
    "their_s",
    "our_s",
    "ratio",
    "their_rounds_s",
    "our_rounds_s",
    "their_memory_mb",
    "our_memory_mb",
    "status",
    "error",
    "authors_commit",
    "performer_pytorch_commit",
    "device",
    "threads",
    "torch",
    "date",
    "rounds",
    "implementation",
    "differences",
]


def einops_stand_in() -> types.ModuleType:
    """``einops.repeat`` for the one pattern ``FastAttention`` uses (a view, as einops makes it); ``rearrange`` fails."""
    module = types.ModuleType("einops")

    def repeat(tensor: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
        if pattern.split() != ["j", "d", "->", "b", "h", "j", "d"]:
            raise NotImplementedError(f"the einops stand-in of lra.bench authors knows 'j d -> b h j d' only, not {pattern!r}")
        return tensor.expand(sizes["b"], sizes["h"], *tensor.shape)

    def rearrange(*args, **kwargs):
        raise NotImplementedError("the einops stand-in of lra.bench authors has no rearrange: install einops")

    module.repeat, module.rearrange = repeat, rearrange
    return module


def stand_ins() -> dict[str, types.ModuleType]:
    """Stand-in modules for the imports their code makes that are not installed here (see the module's docstring)."""
    made = {}
    for name, attributes in UNUSED_IMPORTS.items():
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            for attribute in attributes:
                setattr(module, attribute, type(attribute, (), {"__init__": _unused}))
            made[name] = module
    if importlib.util.find_spec("einops") is None:
        made["einops"] = einops_stand_in()
    return made


def _unused(self, *args, **kwargs):
    raise NotImplementedError(f"{type(self).__name__} is a stand-in of lra.bench authors: the LRA step never builds it")


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name (``ALIASES``) as the module now holding it, where nothing else finds the old name
    (it sits last on ``sys.meta_path``): ``sys.modules[old]`` is then the new module itself, nothing is copied."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in self.aliases else None

    def create_module(self, spec):
        return importlib.import_module(self.aliases[spec.name])

    def exec_module(self, module) -> None:
        pass


@contextlib.contextmanager
def their_imports(
    authors_code: Path, performer_pytorch: Path | None, extra_path: list[Path] | None = None
) -> Iterator[dict[str, types.ModuleType]]:
    """Their folders (and ``extra_path``) first on ``sys.path``, their top-level module names fresh, the stand-ins in
    ``sys.modules``, the :data:`ALIASES` importable: ``{"model_wrapper": ..., "lra_config": ...}``; all undone
    afterwards."""
    folders = [str(authors_code)] + ([str(performer_pytorch)] if performer_pytorch else [])
    folders += [str(folder) for folder in extra_path or []]
    names = {path.stem for path in authors_code.glob("*.py")} | {"performer_pytorch"}
    saved_path, saved_modules, saved_filters = list(sys.path), dict(sys.modules), list(warnings.filters)
    for name in list(sys.modules):
        if name.split(".")[0] in names:
            del sys.modules[name]
    sys.path[:0] = folders
    sys.modules.update(stand_ins())
    finder = AliasFinder(ALIASES)
    sys.meta_path.append(finder)
    try:
        warnings.filterwarnings("ignore", message=r"`torch\.cuda\.amp\.autocast", category=FutureWarning)  # theirs, each call
        yield {name: importlib.import_module(name) for name in ("model_wrapper", "lra_config")}
    finally:
        sys.meta_path.remove(finder)
        warnings.filters[:] = saved_filters
        sys.path[:] = saved_path
        for name in list(sys.modules):
            if name not in saved_modules:
                del sys.modules[name]
        sys.modules.update(saved_modules)


def their_config(lra_config: types.ModuleType, attn_type: str, seq_len: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model config, training config)`` as their ``run_tasks.py`` makes them, in float32; and ``seq_len``, the
    length of the batches, which their Nystrom attention reads but ``run_tasks.py`` never sets (a KeyError as published)."""
    task = lra_config.config[TASK]
    model = dict(task["model"])
    model.update(task["extra_attn_config"].get(attn_type, {"attention_grad_checkpointing": False}))
    model.update(mixed_precision=False, attn_type=attn_type)
    model["max_seq_len"] = 2 ** (model["max_seq_len"] - 1).bit_length()  # their int(2 ** ceil(log2(max_seq_len)))
    if seq_len > model["max_seq_len"]:
        raise ValueError(f"their model's positions reach {model['max_seq_len']}, fewer than --seq-len {seq_len}")
    model["seq_len"] = seq_len
    return model, dict(task["training"])


class TheirStep:
    """One training step of their ``run_tasks.py`` (one accumulation step: batch 32, their gpu_memory 32)."""

    def __init__(self, model: torch.nn.Module, training: dict[str, Any]) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=training["learning_rate"], betas=(0.9, 0.999), eps=1e-6, weight_decay=training["weight_decay"]
        )
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer=self.optimizer,
            max_lr=training["learning_rate"],
            pct_start=training["warmup"] / training["num_train_steps"],
            anneal_strategy=training["lr_decay"],
            total_steps=training["num_train_steps"],
        )

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = self.model(**batch)["loss"].mean()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss


def commit_of(folder: Path | None, given: str | None) -> str:
    """``given``, else the HEAD of the git checkout holding ``folder``, else ``unknown``."""
    if given or folder is None:
        return given or ""
    try:
        found = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except OSError:
        return "unknown"
    return found.stdout.strip() if found.returncode == 0 else "unknown"


def memory_of(build: Callable[[], Callable[[], object]], device: torch.device) -> tuple[Callable[[], object], float]:
    """``(step, MB)``: the step ``build()`` makes, and its peak during one step after a warm-up step, above what was in
    use before the build (as ``lra.bench step``)."""
    meter = MemoryMeter(device)
    step = build()
    step()
    synchronize(device)
    meter.reset_peak()
    step()
    synchronize(device)
    return step, round(meter.peak_above_baseline(), 1)


def compare_row(row: str, args, modules: dict[str, types.ModuleType], batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Build both sides of ``row`` and measure them: the row's measured columns."""
    device = torch.device(args.device)
    attn_type = THEIR_ROWS[row]
    model_config, training = their_config(modules["lra_config"], attn_type, args.seq_len)
    if modules["lra_config"].config[TASK]["model"]["vocab_size"] <= int(batch["input_ids"].max()):
        raise ValueError("the batch's token ids exceed their vocabulary")
    their_batch = {
        "input_ids_0": batch["input_ids"],
        "mask_0": (batch["input_ids"] != 0).float(),
        "label": batch["label"],
    }
    entry, cfg = args.entries[row], args.cfg

    def build_theirs() -> Callable[[], object]:
        linformer = sys.modules.get("attention_linformer")
        if linformer is not None:  # their Linformer shares one projection through a class attribute: a fresh model's
            linformer.LinformerAttention.projection_matrix = None
        torch.manual_seed(0)
        model = modules["model_wrapper"].ModelForSC(model_config)
        if row in adapters.IMPLEMENTATIONS:  # not in their code: the adapter in each of their attention layers
            adapters.install(row, model, importlib.import_module("attention").Attention, model_config, entry.hparams)
        model = model.to(device).train()
        step = TheirStep(model, training)
        return lambda: step(their_batch)

    def build_ours() -> Callable[[], object]:
        torch.manual_seed(0)
        module = build_module(cfg, entry, args.seq_len).to(device).train()
        step = TrainingStep(module, "32")
        return lambda: step(batch)

    theirs, their_memory = memory_of(build_theirs, device)
    ours, our_memory = memory_of(build_ours, device)
    their_timer, our_timer = timer(theirs, device), timer(ours, device)
    their_times, our_times = [], []
    for _ in range(args.rounds):
        their_times.append(their_timer.blocked_autorange(min_run_time=0).median)
        our_times.append(our_timer.blocked_autorange(min_run_time=0).median)
    ratios = [their / our for their, our in zip(their_times, our_times, strict=True)]
    return {
        "their_attention": attn_type,
        "our_attention": f"{entry.name} {entry.hparams}" if entry.hparams else entry.name,
        "their_s": float(f"{statistics.median(their_times):.4g}"),
        "our_s": float(f"{statistics.median(our_times):.4g}"),
        "ratio": round(statistics.median(ratios), 3),
        "their_rounds_s": " ".join(f"{t:.4g}" for t in their_times),
        "our_rounds_s": " ".join(f"{t:.4g}" for t in our_times),
        "their_memory_mb": their_memory,
        "our_memory_mb": our_memory,
    }


def version_of(distribution: str) -> str:
    """The installed version of ``distribution`` (found on the current ``sys.path``), or ``?``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def implementation_of(row: str) -> str:
    """The code their side of ``row`` runs, with the third-party package's version (call inside :func:`their_imports`)."""
    if row in adapters.IMPLEMENTATIONS:
        distribution, path = adapters.IMPLEMENTATIONS[row]
        return f"{distribution} {version_of(distribution)} {path.rpartition('.')[2]} in their model (lra.bench adapter)"
    attn_type = THEIR_ROWS[row]
    for prefix, file in THEIR_FILES.items():
        if attn_type.startswith(prefix):
            return "their " + file.format(transformers=version_of("transformers"))
    return "their attention.py"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lra.bench authors",
        description=__doc__.split("\n\n")[0],
        epilog="Rows and their code's names: " + ", ".join(f"{ours} = {theirs}" for ours, theirs in THEIR_ROWS.items()),
    )
    parser.add_argument(
        "--authors-code", type=Path, required=True, help="a checkout of mlpen/Nystromformer's LRA/code (model_wrapper.py)"
    )
    parser.add_argument(
        "--performer-pytorch", type=Path, default=None, help="a checkout of lucidrains/performer-pytorch (for the performer row)"
    )
    parser.add_argument(
        "--rows", nargs="+", default=DEFAULT_ROWS, help=f"rows to compare (default: {' '.join(DEFAULT_ROWS)}); lists take commas"
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds, one step of each side per round (default 5)")
    parser.add_argument("--batch", type=int, default=32, help="batch (default 32, ListOps' protocol)")
    parser.add_argument("--seq-len", type=int, default=2048, help="sequence length (default 2048, ListOps')")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda (default: cuda when present)"
    )
    parser.add_argument("--authors-commit", default=None, help="their commit, where --authors-code is no git checkout")
    parser.add_argument(
        "--performer-commit", default=None, help="performer-pytorch's commit, where its folder is no git checkout"
    )
    parser.add_argument(
        "--extra-path",
        type=Path,
        action="append",
        default=[],
        help="a folder put first on sys.path for their imports (e.g. one made with pip install --target: transformers, "
        "sinkhorn-transformer); repeatable",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for authors_<device>.csv (default: results/ here)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.rows = list(dict.fromkeys(item for value in args.rows for item in value.split(",") if item))
    unknown = [row for row in args.rows if row not in THEIR_ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; available: {', '.join(THEIR_ROWS)}")
    if not (args.authors_code / "model_wrapper.py").is_file():
        parser.error(f"--authors-code {args.authors_code}: no model_wrapper.py (mlpen/Nystromformer's LRA/code)")
    if args.rounds < 1 or args.batch < 1 or args.seq_len < 2:
        parser.error("--rounds and --batch must be >= 1, --seq-len >= 2")
    device = torch.device(args.device)
    common = {
        "task": TASK,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "authors_commit": commit_of(args.authors_code, args.authors_commit),
        "performer_pytorch_commit": commit_of(args.performer_pytorch, args.performer_commit),
        "device": device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else "",
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds,
    }
    cfg = args.cfg = task_config(TASK, device)
    args.entries = {entry.row: entry for entry in entries() if entry.row in args.rows}
    batch = {
        name: value.to(device)
        for name, value in random_batch(cfg, args.seq_len, args.batch, torch.Generator().manual_seed(cfg.seed)).items()
    }
    path = args.out / f"authors_{device.type}.csv"
    rows = read_rows(path)  # a row measured again is replaced, the others are kept
    with their_imports(args.authors_code, args.performer_pytorch, args.extra_path) as modules:
        for name in args.rows:
            row = {field: "" for field in FIELDS} | common | {"row": name, "padding": round(padding_share(batch), 3)}
            row.update(implementation=implementation_of(name), differences=adapters.DIFFERENCES.get(name, ""))
            try:
                row.update(compare_row(name, args, modules, batch), status="ok")
            except Exception as error:  # a row whose code cannot run here (a missing package): recorded, the rest go on
                row.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
            rows = merge_rows(rows, [row], ["row"])
            print(
                f"{name:<20} theirs {row['their_s']!s:>7} s  ours {row['our_s']!s:>7} s  theirs/ours {row['ratio']!s:>6}  "
                f"memory {row['their_memory_mb']!s:>7} / {row['our_memory_mb']!s:>7} MB  {row['status']} {row['error']}",
                flush=True,
            )
            write_rows(rows, path, FIELDS)
    print(f"wrote {path}")
    return 0
