"""Is generated Pathfinder learnable? A small CNN's validation accuracy vs step, per contour length.

A control for the transformer runs on Pathfinder: every attention of Table 3 sits at chance on the
generated data, so this trains a known learner (a small convolutional network, not the LRA model) on
the same images, read by the same reader as the harness (:func:`lra.data.pathfinder.read`: the
seeded 80/10/10 split, pixels 0..255), one contour length after the other. The images come from
:func:`lra.data.pathfinder_generator.ensure_generated` with LRA's 32 px parameters
(:meth:`PathfinderConfig.lra`) into ``--generated-dir`` (reused when already there).

The network: two 3x3 convolutions at 32x32 (16, 32 channels), 2x2 max pooling, two at 16x16 (32),
pooling, one at 8x8 (64), pooling, then a 1024 -> 128 -> 2 MLP; batch normalisation after every
convolution, ReLU everywhere, 173,426 parameters. Input: pixel / 255. Adam, constant learning
rate, cross-entropy. Every ``--eval-every`` steps the whole validation split is scored; at the end
the test split.

Writes ``results/pathfinder_cnn.csv`` (one row per evaluation: contour length, images, step,
images seen, epoch, mean training loss since the last evaluation, validation accuracy, wall
seconds) and ``results/pathfinder_cnn.png`` (validation accuracy vs step); the final test accuracies
are rows with ``split = test``.

Measured on the 2-core AMD EPYC VM (one torch thread, the machine shared with another training run),
40,000 images per length (32,000 train, 4,000 validation, 4,000 test), batch 64, Adam 1e-3, seed 0,
one run per length (``--contour-lengths L --num-images 40000 --steps S --minutes M`` with
(L, S, M) = (6, 4000, 9), (14, 5000, 12), (9, 7000, 12)): the network sits at chance (loss 0.693)
and then leaves it after about 1,000 steps (64,000 images seen) at length 6, 2,000 at length 9 and
4,000 at length 14. Test accuracy: length 6 0.788 after 2,812 steps (the 9-minute limit, 546 s),
length 9 0.820 after 7,000 steps (657 s), length 14 0.525 after 5,000 steps (646 s), still rising.
Generating the 40,000 images with one worker took 162 s (length 6), 414 s (9) and 822 s (14) of
wall time on the shared machine (91, 146 and 362 s of CPU).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data import pathfinder, pathfinder_generator
from ..rows import pyplot, save_figure, write_rows
from .output import RESULTS

FIELDS = [
    "contour_length",
    "num_images",
    "num_train",
    "split",
    "step",
    "images_seen",
    "epoch",
    "train_loss",
    "accuracy",
    "wall_s",
    "batch_size",
    "lr",
    "seed",
]

log = logging.getLogger(__name__)


class SmallCNN(nn.Module):
    """(batch, 1, 32, 32) pixels in [0, 1] -> (batch, 2) logits."""

    def __init__(self, side: int = 32):
        super().__init__()

        def conv(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *conv(1, 16),
            *conv(16, 32),
            nn.MaxPool2d(2),
            *conv(32, 32),
            *conv(32, 32),
            nn.MaxPool2d(2),
            *conv(32, 64),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * (side // 8) ** 2, 128), nn.ReLU(inplace=True), nn.Linear(128, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def images(split, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A reader split's pixel tokens as float images (n, 1, side, side) in [0, 1] and labels (n,)."""
    pixels = torch.from_numpy(np.asarray(split.arrays["input_ids"])).reshape(-1, 1, side, side)
    return pixels.float() / 255.0, torch.from_numpy(np.asarray(split.labels)).long()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 500) -> float:
    model.eval()
    correct = sum(
        int((model(x[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum()) for i in range(0, len(x), batch_size)
    )
    model.train()
    return correct / len(x)


def train_one(args: argparse.Namespace, contour_length: int) -> list[dict]:
    """Generate (or reuse) the images of one contour length, train the CNN on them, return the curve."""
    config = pathfinder_generator.PathfinderConfig.lra(32, contour_length)
    start = time.perf_counter()
    folder = pathfinder_generator.ensure_generated(
        args.generated_dir, config, args.num_images, args.data_seed, workers=args.workers, progress=not args.quiet
    )
    prepared = pathfinder.read(folder, max_length=32 * 32, split_seed=0, workers=args.workers)
    log.info("contour length %d: %s ready in %.0f s", contour_length, folder.name, time.perf_counter() - start)
    x_train, y_train = images(prepared.splits["train"], 32)
    x_val, y_val = images(prepared.splits["val"], 32)
    x_test, y_test = images(prepared.splits["test"], 32)

    torch.manual_seed(args.seed)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed)
    common = dict(
        contour_length=contour_length,
        num_images=args.num_images,
        num_train=len(x_train),
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    rows = [
        dict(
            common,
            split="val",
            step=0,
            images_seen=0,
            epoch=0.0,
            train_loss="",
            accuracy=round(accuracy(model, x_val, y_val), 4),
            wall_s=0.0,
        )
    ]
    steps_per_epoch = len(x_train) // args.batch_size
    order, losses, began = torch.empty(0, dtype=torch.long), [], time.perf_counter()
    for step in range(1, args.steps + 1):
        position = (step - 1) % steps_per_epoch
        if position == 0:
            order = torch.randperm(len(x_train), generator=generator)
        rows_of_batch = order[position * args.batch_size : (position + 1) * args.batch_size]
        loss = loss_fn(model(x_train[rows_of_batch]), y_train[rows_of_batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        out_of_time = args.minutes is not None and time.perf_counter() - began > 60 * args.minutes
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            row = dict(
                common,
                split="val",
                step=step,
                images_seen=step * args.batch_size,
                epoch=round(step / steps_per_epoch, 3),
                train_loss=round(float(np.mean(losses)), 4),
                accuracy=round(accuracy(model, x_val, y_val), 4),
                wall_s=round(time.perf_counter() - began, 1),
            )
            losses = []
            rows.append(row)
            if not args.quiet:
                print(
                    f"length {contour_length} step {step} epoch {row['epoch']:.2f} loss {row['train_loss']:.4f} "
                    f"val {row['accuracy']:.4f} ({row['wall_s']:.0f} s)",
                    flush=True,
                )
            if out_of_time:
                break
    last = rows[-1]
    test = round(accuracy(model, x_test, y_test), 4)
    rows.append(dict(last, split="test", accuracy=test, train_loss=""))
    if not args.quiet:
        print(f"length {contour_length}: test accuracy {test:.4f} after {last['step']} steps", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for length in sorted({r["contour_length"] for r in rows}):
        curve = [r for r in rows if r["contour_length"] == length and r["split"] == "val"]
        n = curve[0]["num_train"]
        ax.plot(
            [r["step"] for r in curve], [r["accuracy"] for r in curve], marker=".", label=f"contour length {length} ({n} train)"
        )
    ax.axhline(0.5, color="gray", linestyle=":", label="chance")
    batch = rows[0]["batch_size"]
    ax.set(
        xlabel=f"step (batch {batch})",
        ylabel="validation accuracy",
        title="Small CNN on generated Pathfinder-32",
        ylim=(0.4, 1.0),
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lra.bench pathfinder_cnn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--contour-lengths", type=int, nargs="+", default=[6, 9, 14], help="difficulties, in this order")
    parser.add_argument("--num-images", type=int, default=40_000, help="images generated per contour length (80%% train)")
    parser.add_argument("--data-seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--generated-dir", type=Path, default=Path("data/generated"), help="where images are generated/reused")
    parser.add_argument("--steps", type=int, default=3000, help="training steps per contour length")
    parser.add_argument("--minutes", type=float, default=None, help="also stop a contour length after this many minutes")
    parser.add_argument("--batch-size", type=int, default=64, help="training images per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    parser.add_argument("--eval-every", type=int, default=250, help="steps between scorings of the validation split")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch order")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--workers", type=int, default=1, help="processes that generate and decode images")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of pathfinder_cnn.csv and .png")
    parser.add_argument("--quiet", action="store_true", help="no generation progress and no line per evaluation or test")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.num_images * 8 // 10 < args.batch_size or args.steps < 1 or args.eval_every < 1:
        raise SystemExit("need --num-images whose 80% train split holds a batch, --steps >= 1 and --eval-every >= 1")
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for length in args.contour_lengths:
        rows += train_one(args, length)
        write_rows(rows, args.out / "pathfinder_cnn.csv", FIELDS)  # after each length: a partial run keeps its curves
        plot(rows, args.out / "pathfinder_cnn.png")
    return 0
