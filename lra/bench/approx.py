"""How far YOSO-m's output is from YOSO-E's, against sequence length: the YOSO paper's approximation figure.

The YOSO paper (ICML 2021, "Averaged radian between outputs of YOSO-E and YOSO-m for m = 8, 16, 32,
64, 128 for sequence length from 64 to 4096") takes Q, K, V from a trained model and measures the
angle between the outputs of YOSO-E (the exact expectation) and YOSO-m (m hashes). YOSO's outputs
are unit vectors, so only their direction matters: the error of one query is the angle (radians)
between its two output rows. The claim under test: the error grows only logarithmically with n::

    python -m lra.bench approx [--run RUN_DIR | --checkpoint CKPT] [--lengths 64 128 ... 4096]
        [--hashes 8 16 32 64 128] [--seeds 3] [--samples 4] [--hash-bits TAU] [--device cpu|cuda]
        [--out results]

Where Q, K, V come from:

* ``--run DIR`` (a finished ``python -m lra.train`` folder): the classifier is rebuilt from its
  best checkpoint alone (``LRAClassificationModule.load_from_checkpoint``; ``DIR/checkpoints/best-*.ckpt``,
  else the path ``results.json`` records), and test-split samples of the run's data cache (which
  ``results.json`` names) go through it, in order, with a hook capturing each layer's core-attention inputs. ``--checkpoint CKPT``
  does the same with that checkpoint file; the run folder is the one holding its ``checkpoints/``.
  Any attention's model works (only its q, k, v are used); a YOSO model is the paper's setting.
  Per (layer, head), the real (unpadded) tokens of consecutive samples are concatenated into one
  long stream, so sequences longer than the model's are built from several samples' tokens (each
  token keeps the position embedding of its own sample). ``--samples`` disjoint windows of
  ``max(--lengths)`` tokens are cut from that stream; length n uses the first n tokens of each
  window. Retrieval's dual encoder reads its first documents only (``input_ids_0``). The capture
  runs under ``torch.manual_seed(0)``, since a YOSO-m model's own hashes shape its later layers.
* no ``--run``/``--checkpoint``: random stand-ins, q, k, v i.i.d. normalised Gaussian vectors
  (2 layers x 2 heads, d = 32). Every row and the plot title say ``random_unit_vectors``: this is
  not the paper's setting.

tau (``hash_bits``) is the same for every n: ``--hash-bits`` if given, else the trained YOSO
model's own (read from its built attention), else 8 (random vectors, or a model whose attention is
not YOSO). Hashes
use YOSO's default fast Hadamard rotation; ``torch.manual_seed(seed)`` precedes every YOSO-m call
(seeds 0 .. ``--seeds``-1).

For each n, layer, m and seed, YOSO-E and YOSO-m run on the same q, k, v (every token is real, no
mask); per head and window, the angle ``arccos(cos(out_m, out_E))`` is averaged over the n query
rows. A YOSO-m row whose query collided with no key is a zero vector: it counts as orthogonal
(pi/2), part of the error, and ``zero_row_fraction`` reports how often that happened.

``<out>/approx_error.csv`` holds one row per (n, m): source (``checkpoint:<path>`` or
``random_unit_vectors``), task, attention (the trained model's, with its table row when they
differ), seq_len, num_hashes, hash_bits, mean_angle_rad (over layers, heads, windows and seeds),
std_angle_rad (population std over those layer x head x window x seed units), zero_row_fraction,
colliding_angle_rad (the mean angle over the rows that had a collision, which tells the two kinds
of error apart), layers, heads, samples, seeds, device, torch. ``<out>/approx_error.png`` plots
the mean angle, the colliding rows' angle and the zero-row fraction against n (log x), one line per m.
The summary printed per m gives, for the mean angle and for the colliding rows' angle, the
least-squares slope on log2 n (radians per doubling of n) and the growth angle(n_max)/angle(n_min)
beside n_max/n_min, and the zero-row fractions at both ends.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import attention_zoo
from attention_zoo.yoso import MAX_HASH_BITS, YosoAttention
from lra.bench.output import RESULTS
from lra.data import cache
from lra.data.tasks import TokenDataset, get_spec
from lra.devices import device_name
from lra.model import LRAEncoder
from lra.module import LRAClassificationModule
from lra.results import RESULTS_FILE, RunRecord
from lra.rows import pyplot, save_figure, write_rows

FIELDS = [
    "source",
    "task",
    "attention",
    "seq_len",
    "num_hashes",
    "hash_bits",
    "mean_angle_rad",
    "std_angle_rad",
    "zero_row_fraction",
    "colliding_angle_rad",
    "layers",
    "heads",
    "samples",
    "seeds",
    "device",
    "torch",
]
RANDOM_SOURCE = "random_unit_vectors"
RANDOM_LAYERS, RANDOM_HEADS, RANDOM_HEAD_DIM = 2, 2, 32
DEFAULT_HASH_BITS = 8  # tau for random vectors and for models whose attention is not YOSO
FORWARD_BATCH = 8  # test samples per forward pass while capturing


class UnusableRun(ValueError):
    """The run cannot give the Q, K, V asked for; the message says why and what to do."""


class NotEnoughTokens(UnusableRun):
    """The run's test split holds fewer real tokens than the requested windows need."""


@dataclass
class Vectors:
    """Core-attention inputs pooled into long sequences, and what they were taken from."""

    queries: torch.Tensor  # (layers, samples, heads, tokens, d)
    keys: torch.Tensor  # (layers, samples, heads, tokens, d)
    values: torch.Tensor  # (layers, samples, heads, tokens, d)
    source: str  # checkpoint:<path> or random_unit_vectors
    task: str
    attention: str
    model_hash_bits: int | None  # the trained YOSO model's tau; None when the model is not YOSO


def random_vectors(num_tokens: int, samples: int) -> Vectors:
    generator = torch.Generator().manual_seed(0)
    shape = (RANDOM_LAYERS, samples, RANDOM_HEADS, num_tokens, RANDOM_HEAD_DIM)
    queries, keys, values = (F.normalize(torch.randn(shape, generator=generator), dim=-1) for _ in range(3))
    return Vectors(queries, keys, values, RANDOM_SOURCE, task="none", attention="none", model_hash_bits=None)


def display_path(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it, else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_run(run_dir: Path) -> RunRecord:
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run folder {run_dir} does not exist: pass a folder written by `python -m lra.train` "
            "(e.g. outputs/listops/yoso_32/<run>), or leave out --run for random unit vectors"
        )
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {run_dir} is not a training run folder (`python -m lra.train` writes one)")
    return RunRecord.read(path)


def best_checkpoint(run_dir: Path, record: RunRecord) -> Path:
    """The run's best checkpoint: the local ``checkpoints/best-*.ckpt`` (the folder may have moved since
    training recorded its absolute path), else that recorded path."""
    recorded = Path(record.best_checkpoint) if record.best_checkpoint else None
    local = sorted((run_dir / "checkpoints").glob("best-*.ckpt"))
    if recorded is not None and (run_dir / "checkpoints" / recorded.name) in local:
        return run_dir / "checkpoints" / recorded.name
    if len(local) == 1:
        return local[0]
    if len(local) > 1:
        raise FileNotFoundError(
            f"{run_dir / 'checkpoints'} holds several best checkpoints ({', '.join(p.name for p in local)}) "
            "and results.json names none of them: pick one with --checkpoint"
        )
    if recorded is not None and recorded.is_file():
        return recorded
    raise FileNotFoundError(
        f"no best checkpoint in {run_dir / 'checkpoints'} (run status: {record.status or 'unknown'}); "
        "wait for the run to finish, or pass a checkpoint file with --checkpoint"
    )


def data_cache_folder(run_dir: Path, record: RunRecord) -> Path:
    """The run's prepared data: ``data_folder`` is relative to the folder training started in."""
    folder = Path(record.data_folder)
    if (folder / cache.MANIFEST).is_file():
        return folder
    raise FileNotFoundError(
        f"the data cache of {run_dir} ({folder}) was not found from {Path.cwd()}: run this from the folder "
        f"training started in, or prepare the {record.task} data again (`python -m lra.data prepare`)"
    )


def capture_vectors(encoder: LRAEncoder, dataset: TokenDataset, input_name: str, num_tokens: int, device: torch.device):
    """Forward ``dataset``'s ``input_name`` rows in order until every layer has ``num_tokens`` real tokens' q, k, v.

    Returns three ``(layers, heads, num_tokens, d)`` tensors: per (layer, head), the real tokens of
    consecutive samples concatenated.
    """
    layers = len(encoder.blocks)
    pooled: list[list[list[torch.Tensor]]] = [[[] for _ in range(layers)] for _ in range(3)]  # [q/k/v][layer]: chunks
    batch_inputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def hook(layer):
        def capture(module, args):
            batch_inputs[layer] = args  # MultiHeadAttention calls core(q, k, v, mask); the encoder always masks

        return capture

    cores = [block.attention.attention for block in encoder.blocks]
    handles = [core.register_forward_pre_hook(hook(layer)) for layer, core in enumerate(cores)]
    collected = 0
    try:
        for start in range(0, len(dataset), FORWARD_BATCH):
            rows = [dataset[i][input_name] for i in range(start, min(start + FORWARD_BATCH, len(dataset)))]
            input_ids = torch.stack(rows)  # (batch, seq_len)
            encoder(input_ids.to(device))
            for layer, (q, k, v, mask) in batch_inputs.items():
                for sample_mask, *tensors in zip(mask, q, k, v):
                    for chunks, tensor in zip(pooled, tensors):
                        chunks[layer].append(tensor[:, sample_mask].float().cpu())  # (h, real tokens, d)
            collected += int((input_ids != 0).sum())  # the encoder's mask: id 0 is padding
            if collected >= num_tokens:
                break
    finally:
        for handle in handles:
            handle.remove()
    if collected < num_tokens:
        raise NotEnoughTokens(
            f"the test split holds {collected} real tokens in its {len(dataset)} samples, fewer than the "
            f"{num_tokens} needed (--samples windows of max(--lengths) tokens); use smaller --lengths or --samples"
        )
    return tuple(
        torch.stack([torch.cat(chunks, dim=1)[:, :num_tokens] for chunks in per_layer])  # (layers, h, tokens, d)
        for per_layer in pooled
    )


def trained_vectors(run_dir: Path, checkpoint: Path | None, num_tokens: int, samples: int, device: torch.device) -> Vectors:
    if checkpoint is not None and not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist; pass a .ckpt file of a training run")
    record = read_run(run_dir)
    if checkpoint is None:
        checkpoint = best_checkpoint(run_dir, record)
    try:
        module = LRAClassificationModule.load_from_checkpoint(checkpoint).eval()
    except TypeError as error:  # no task, length, model or attention among its hyperparameters
        raise UnusableRun(
            f"{checkpoint} does not hold the model's settings ({error}); it was written by an older version of "
            "`python -m lra.train`: train the run again"
        ) from None
    encoder = module.model.encoder.to(device)
    spec = get_spec(module.hparams.task)
    splits, _ = cache.load(data_cache_folder(run_dir, record))
    dataset = TokenDataset(splits["test"], encoder.seq_len, spec.token_offset(record.data or {}))
    # A YOSO-m model hashes at random in its own forward, and later layers' inputs depend on it.
    torch.manual_seed(0)
    with torch.no_grad():
        # Retrieval's dual encoder reads its first documents only.
        streams = capture_vectors(encoder, dataset, spec.inputs[0], num_tokens * samples, device)
    layers, heads, _, dim = streams[0].shape
    queries, keys, values = (
        stream.view(layers, heads, samples, num_tokens, dim).transpose(1, 2)  # (layers, samples, h, n, d)
        for stream in streams
    )
    attention = module.hparams.attention["name"]
    row = record.row
    core = encoder.blocks[0].attention.attention
    model_hash_bits = core.hash_bits if isinstance(core, YosoAttention) else None
    return Vectors(
        queries,
        keys,
        values,
        source=f"checkpoint:{display_path(checkpoint)}",
        task=module.hparams.task,
        attention=attention if not row or row == attention else f"{attention} ({row})",
        model_hash_bits=model_hash_bits,
    )


def row_angles(approximate: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Angle (radians) between matching rows of ``(..., n, d)`` tensors; a zero row counts as orthogonal, pi/2."""
    approximate, exact = approximate.double(), exact.double()  # arccos near cosine 1 needs the precision
    norms = approximate.norm(dim=-1) * exact.norm(dim=-1)
    cosine = (approximate * exact).sum(-1) / norms.clamp_min(torch.finfo(torch.float64).tiny)
    cosine = torch.where(norms > 0, cosine, 0.0)
    return torch.arccos(cosine.clamp(-1.0, 1.0))  # (..., n)


@dataclass
class Tally:
    """What one (n, m) configuration measured over layers, seeds and YOSO-m calls."""

    unit_angles: list[torch.Tensor] = field(default_factory=list)  # per call: (samples * h,) mean angles over queries
    zero_rows: int = 0  # YOSO-m rows whose query collided with no key
    rows: int = 0
    colliding_angle_sum: float = 0.0  # summed angles of the other rows

    def colliding_angle(self) -> float:
        """Mean angle of the rows that had a collision: the error apart from queries YOSO-m left empty."""
        colliding = self.rows - self.zero_rows
        return self.colliding_angle_sum / colliding if colliding else math.nan


def measure(vectors: Vectors, lengths: list[int], hashes: list[int], seeds: int, hash_bits: int, device: torch.device):
    """Angles between YOSO-m and YOSO-E outputs of every (n, m) configuration: ``{(n, m): Tally}``."""
    layers, samples, heads, _, dim = vectors.queries.shape
    tallies = {(n, m): Tally() for n in lengths for m in hashes}
    progress = tqdm(total=len(lengths) * layers, desc="(n, layer)")
    for n in lengths:
        shape = dict(seq_len=n, num_heads=heads, head_dim=dim, hash_bits=hash_bits)
        expectation = attention_zoo.build("yoso", **shape, expectation=True).eval()
        approximations = {m: attention_zoo.build("yoso", **shape, num_hashes=m).eval() for m in hashes}
        for layer in range(layers):
            q, k, v = (  # (samples, h, n, d)
                x[layer, :, :, :n].to(device) for x in (vectors.queries, vectors.keys, vectors.values)
            )
            with torch.no_grad():
                # One window at a time: YOSO-E holds (h, n, n) weights.
                exact = torch.cat([expectation(q[s : s + 1], k[s : s + 1], v[s : s + 1]) for s in range(samples)])
                for m, approximation in approximations.items():
                    tally = tallies[(n, m)]
                    for seed in range(seeds):
                        torch.manual_seed(seed)
                        approximate = approximation(q, k, v)  # (samples, h, n, d)
                        angles = row_angles(approximate, exact)  # (samples, h, n)
                        empty = approximate.norm(dim=-1) == 0  # (samples, h, n)
                        tally.unit_angles.append(angles.mean(-1).flatten().cpu())
                        tally.zero_rows += int(empty.sum())
                        tally.rows += empty.numel()
                        tally.colliding_angle_sum += float(angles[~empty].sum())
            progress.update()
    progress.close()
    return tallies


def growth_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per m: the angle's least-squares slope on log2 n and its growth beside n's, then the same for the
    rows that had a collision and the share of rows that had none."""
    lines = []
    for m in sorted({row["num_hashes"] for row in rows}):
        by_length = sorted((row for row in rows if row["num_hashes"] == m), key=lambda row: row["seq_len"])
        lengths = np.array([row["seq_len"] for row in by_length], dtype=float)
        first, last = by_length[0], by_length[-1]
        line = f"m={m:<4}"
        for name, column in (("angle", "mean_angle_rad"), ("colliding rows' angle", "colliding_angle_rad")):
            angles = np.array([row[column] for row in by_length])
            line += f" {name} {angles[0]:.4f}"
            if len(by_length) > 1:
                slope = np.polyfit(np.log2(lengths), angles, 1)[0]
                line += f" -> {angles[-1]:.4f} rad (x{angles[-1] / angles[0]:.2f}, {slope:+.4f} per doubling of n);"
        line += f" rows without collision {first['zero_row_fraction']:.1%}"
        if len(by_length) > 1:
            line += f" -> {last['zero_row_fraction']:.1%}; n {lengths[0]:.0f} -> {lengths[-1]:.0f}"
            line += f" (x{lengths[-1] / lengths[0]:g})"
        lines.append(line)
    return lines


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    panels = (
        ("mean_angle_rad", "mean angle to YOSO-E (radians), all rows"),
        ("colliding_angle_rad", "mean angle (radians), rows with a collision"),
        ("zero_row_fraction", "rows whose query collided with no key"),
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.8))
    for axis, (column, label) in zip(axes, panels):
        for m in sorted({row["num_hashes"] for row in rows}):
            points = sorted((row["seq_len"], row[column]) for row in rows if row["num_hashes"] == m)
            axis.plot(*zip(*points), marker="o", label=f"YOSO-{m}")
        axis.set_xscale("log", base=2)
        axis.set(xlabel="sequence length n", ylabel=label)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    figure.suptitle(textwrap.fill(title, width=150, replace_whitespace=False), fontsize=8)
    figure.tight_layout()
    save_figure(figure, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lra.bench approx", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--run", type=Path, help="a training run folder (results.json, checkpoints/); default: random unit vectors"
    )
    source.add_argument("--checkpoint", type=Path, help="a checkpoint file inside a run's checkpoints/ folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**p for p in range(6, 13)], help="values of n")
    parser.add_argument("--hashes", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="values of m")
    parser.add_argument("--seeds", type=int, default=3, help="hash draws per configuration (seeds 0..N-1)")
    parser.add_argument("--samples", type=int, default=4, help="disjoint token windows of max(--lengths) tokens")
    parser.add_argument("--hash-bits", type=int, default=None, help="tau; default: the trained YOSO model's, else 8")
    parser.add_argument("--device", default="cpu", help="where the model and YOSO run: cpu or cuda (default: cpu)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="folder for approx_error.csv and .png (default: results/ in the current folder)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.lengths) < 2:
        parser.error(f"--lengths must be >= 2, got {args.lengths}")
    if min(args.hashes) < 1:
        parser.error(f"--hashes must be positive, got {args.hashes}")
    if args.seeds < 1 or args.samples < 1:
        parser.error(f"--seeds and --samples must be >= 1, got {args.seeds} and {args.samples}")
    if args.hash_bits is not None and not 1 <= args.hash_bits <= MAX_HASH_BITS:
        parser.error(f"--hash-bits must be in [1, {MAX_HASH_BITS}], got {args.hash_bits}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    lengths, hashes, device = sorted(set(args.lengths)), sorted(set(args.hashes)), torch.device(args.device)
    try:
        if args.run is None and args.checkpoint is None:
            vectors = random_vectors(max(lengths), args.samples)
        else:
            run_dir = args.run if args.run is not None else args.checkpoint.parent
            run_dir = run_dir.parent if run_dir.name == "checkpoints" else run_dir
            vectors = trained_vectors(run_dir, args.checkpoint, max(lengths), args.samples, device)
    except (FileNotFoundError, UnusableRun) as error:
        parser.error(str(error))
    hash_bits = args.hash_bits or vectors.model_hash_bits or DEFAULT_HASH_BITS
    layers, _, heads, _, dim = vectors.queries.shape
    print(
        f"Q, K, V: {vectors.source} (task {vectors.task}, attention {vectors.attention}); {layers} layers x "
        f"{heads} heads, d={dim}; tau={hash_bits}; torch {torch.__version__} on {device_name(device)}"
    )

    tallies = measure(vectors, lengths, hashes, args.seeds, hash_bits, device)
    rows = []
    for (n, m), tally in tallies.items():
        unit_angles = torch.cat(tally.unit_angles)  # (layers * seeds * samples * h,)
        rows.append(
            dict(
                source=vectors.source,
                task=vectors.task,
                attention=vectors.attention,
                seq_len=n,
                num_hashes=m,
                hash_bits=hash_bits,
                mean_angle_rad=unit_angles.mean().item(),
                std_angle_rad=unit_angles.std(correction=0).item(),
                zero_row_fraction=tally.zero_rows / tally.rows,
                colliding_angle_rad=tally.colliding_angle(),
                layers=layers,
                heads=heads,
                samples=args.samples,
                seeds=args.seeds,
                device=device_name(device),
                torch=torch.__version__,
            )
        )
    path = args.out / "approx_error.csv"
    write_rows(rows, path, FIELDS)
    if vectors.source == RANDOM_SOURCE:
        source_label = f"{RANDOM_SOURCE} (stand-ins, not a trained model's Q, K, V)"
    else:
        source_label = f"{vectors.task}, {vectors.attention}, {vectors.source}"
    plot(rows, path.with_suffix(".png"), f"YOSO-m vs YOSO-E, tau={hash_bits}, Q/K/V from {source_label}")
    print("\n".join(growth_summary(rows)))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0
