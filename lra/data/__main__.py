"""Download, prepare, list and generate LRA data: ``python -m lra.data {download,prepare,info,generate} ...``.

    python -m lra.data download text image listops      # or: all
    python -m lra.data prepare text --source ~/datasets/aclImdb
    python -m lra.data info [--verify]
    python -m lra.data generate listops --out data/listops --seed 0
    python -m lra.data generate pathfinder --out data/pathfinder32 --num-samples 200000 --seed 0

``download`` fetches a task's official archive, verifies it, unpacks what the task needs into the
folder training looks in and prepares it (:mod:`lra.data.download`). ``prepare`` reads the official
files into the cache that training memory-maps (the settings not given on the command line are the
task's, from ``conf/task/<task>.yaml``, so training finds the cache without further flags).
``generate`` writes the official on-disk layout, which ``prepare`` (or training with
``task.data.source_dir=DIR``) then reads like the real release.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import cache, listops
from .download import BASE_URL_ENV, DownloadError, download_tasks, human_bytes
from .tasks import TASKS, prepare_task


def task_config(task: str, data_dir: Path | None = None) -> dict[str, Any]:
    """The ``task`` and ``paths`` sections training composes for ``task`` under the paper's protocol,
    resolved, with ``paths.data_dir`` set to ``data_dir`` when given (as ``LRA_DATA_DIR=DIR`` would)."""
    from omegaconf import OmegaConf

    from .. import config

    cfg = config.compose([f"task={task}", "experiment=paper"])
    if data_dir is not None:
        cfg.paths.data_dir = str(data_dir)
    return {part: OmegaConf.to_container(cfg[part], resolve=True) for part in ("task", "paths")}


def task_data_config(task: str, data_dir: Path | None = None) -> dict[str, Any]:
    """The ``task.data`` section training uses for ``task`` under the paper's protocol."""
    return task_config(task, data_dir)["task"]["data"]


def prepare(args: argparse.Namespace) -> None:
    data = task_data_config(args.task)
    data.update(source="official", source_dir=str(args.source))
    if args.cache is not None:
        data["cache_dir"] = str(args.cache)
    if args.max_length is not None:
        data["max_length"] = args.max_length
    if not args.source.is_dir():
        raise SystemExit(f"error: --source {args.source} is not a folder")
    resolved = prepare_task(args.task, data, force=args.force)
    print(f"{args.task}: ready in {resolved.folder}")


def download(args: argparse.Namespace) -> None:
    tasks = list(TASKS) if "all" in args.tasks else list(dict.fromkeys(args.tasks))
    configs = {task: task_config(task, args.dest) for task in tasks}
    data_dir = Path(configs[tasks[0]]["paths"]["data_dir"])
    prepared, errors = download_tasks(
        {task: config["task"]["data"] for task, config in configs.items()},
        data_dir / "downloads",
        base_url=args.base_url,
        sha256=args.sha256,
        md5=args.md5,
    )
    train = "python -m lra.train" if args.dest is None else f"LRA_DATA_DIR={args.dest} python -m lra.train"
    for task, resolved in prepared.items():
        print(f"{task}: ready in {resolved.folder} (`{train} experiment=paper task={task}` uses it)")
    if errors:
        raise SystemExit("\n".join(f"error: {error}" for error in errors))


def hex_digest(length: int) -> Callable[[str], str]:
    """An argparse type: ``length`` hexadecimal digits, lower-cased."""

    def parse(value: str) -> str:
        if not re.fullmatch(f"[0-9a-fA-F]{{{length}}}", value):
            raise argparse.ArgumentTypeError(f"expected {length} hexadecimal digits, got {value!r}")
        return value.lower()

    return parse


def info(args: argparse.Namespace) -> None:
    cache_dir = args.cache or Path(task_data_config("listops")["cache_dir"])
    found = cache.list_prepared(cache_dir)
    if not found:
        print(f"nothing prepared under {cache_dir}")
        return
    problems = 0
    for folder, manifest, problem in found:
        if manifest is not None and not problem:
            try:
                if args.verify:
                    cache.verify(folder, manifest, checksums=True)
                majority = majority_classes(folder)  # reads the labels: a corrupt label file is named here
            except cache.CacheError as error:
                problem = str(error)
        if problem:
            problems += 1
            print(f"{folder}\n  CORRUPT: {problem}\n  fix: delete the folder and prepare again")
            continue
        key = manifest["key"]
        sizes = " / ".join(f"{split} {entry['num_samples']}" for split, entry in manifest["splits"].items())
        disk = sum(entry["num_bytes"] for entry in cache.stored_files(manifest))
        print(f"{folder}")
        print(f"  {manifest['task']} ({key['kind']}), max_length {key['max_length']}, {sizes}, {human_bytes(disk)}")
        print(f"  from {manifest['source']['path']} ({manifest['source']['num_files']} files), prepared {manifest['created_at']}")
        if key.get("options"):
            print(f"  options: {key['options']}")
        if key.get("generator"):
            print(f"  generator: {key['generator']}")
        if "download" in manifest:
            record = manifest["download"]
            print(f"  downloaded: {record['file']} from {record['url']}, SHA-256 {record['sha256']}")
            print(f"    verified: {record['verified']}")
        for note, value in manifest.get("notes", {}).items():
            print(f"  {note}: {value}")
        print(f"  majority class: {majority} (the accuracy of always answering it)")
        if manifest["task"] == "listops":
            print(f"  outermost-operator rule: {operator_rule_scores(folder)}")
        if args.verify:
            print("  checksums: ok")
    if problems:
        sys.exit(1)


def majority_classes(folder: Path) -> str:
    """Each split's most common label and its share of the split, ``train 0 (16.93%), ...``: what a model that always
    answers it scores, the floor a model "at the majority class" sits on."""
    splits, _ = cache.load(folder)
    shares = []
    for name, split in splits.items():
        labels, counts = np.unique(split.labels, return_counts=True)
        shares.append(f"{name} {labels[counts.argmax()]} ({100 * counts.max() / counts.sum():.2f}%)")
    return ", ".join(shares)


def operator_rule_scores(folder: Path) -> str:
    """What answering each ListOps sequence with its outermost operator's most common training label scores on each
    split (:class:`lra.data.listops.OperatorRule`): ``MAX 9, MED 4, MIN 0, SM 7: train 36.20%, ...``."""
    splits, _ = cache.load(folder)
    train = splits["train"]
    rule = listops.OperatorRule.fit(train.arrays["input_ids"], train.labels)
    scores = (
        f"{name} {100 * np.mean(rule.predict(split.arrays['input_ids']) == split.labels):.2f}%" for name, split in splits.items()
    )
    return f"{rule.describe()}: {', '.join(scores)}"


def generate_listops(args: argparse.Namespace) -> None:
    config = listops.GeneratorConfig(
        num_train=args.num_train,
        num_val=args.num_val,
        num_test=args.num_test,
        min_length=args.min_length,
        max_length=args.max_length,
        seed=args.seed,
    )
    if any(listops.split_path(args.out, split).exists() for split in listops.SPLITS):
        raise SystemExit(f"error: {args.out} already holds basic_*.tsv files; choose another --out")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"Generating ListOps ({config.total} samples, seed {config.seed}) into {args.out}", flush=True)
    listops.write_generated(args.out, config, listops.generate(config))  # generator.json records the files
    print(f"wrote {', '.join(str(listops.split_path(args.out, s)) for s in listops.SPLITS)}")


def generate_pathfinder(args: argparse.Namespace) -> None:
    from . import pathfinder_generator

    config = pathfinder_generator.PathfinderConfig.lra(resolution=args.resolution, contour_length=args.contour_length)
    folder = pathfinder_generator.generate(args.out, config, args.num_samples, args.seed, workers=args.workers)
    print(f"wrote {args.num_samples} images and their metadata into {folder}")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m lra.data", description=__doc__.split("\n\n")[0])
    commands = main.add_subparsers(dest="command", required=True)

    p = commands.add_parser(
        "download",
        help="download, verify, unpack and prepare tasks' official data",
        description="Download each task's official archive, verify it, unpack what the task needs into the folder "
        "training reads (task.data.source_dir under --dest) and prepare it; see lra/data/download.py.",
    )
    p.add_argument("tasks", nargs="+", choices=[*TASKS, "all"], metavar="TASK", help=f"{', '.join(TASKS)} or all")
    p.add_argument("--dest", type=Path, help="data folder (default: $LRA_DATA_DIR or data/, where training looks)")
    p.add_argument(
        "--base-url",
        default=os.environ.get(BASE_URL_ENV) or None,
        help=f"a mirror serving the same file names (default: ${BASE_URL_ENV}, else the official hosts)",
    )
    checksum = p.add_mutually_exclusive_group()
    checksum.add_argument("--sha256", type=hex_digest(64), help="accept the file with this SHA-256 (your decision)")
    checksum.add_argument("--md5", type=hex_digest(32), help="accept the file with this MD5 (your decision)")
    p.set_defaults(run=download)

    p = commands.add_parser("prepare", help="read a task's official files into the training cache")
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--source", type=Path, required=True, help="the official folder (see README, 'The five tasks')")
    p.add_argument("--cache", type=Path, help="cache folder (default: the task config's, data/cache)")
    p.add_argument("--max-length", type=int, help="tokens kept per sequence (default: the task config's)")
    p.add_argument("--force", action="store_true", help="prepare again even if the cache is current")
    p.set_defaults(run=prepare)

    p = commands.add_parser("info", help="list what is prepared, with each split's majority class")
    p.add_argument("--cache", type=Path, help="cache folder (default: data/cache or $LRA_DATA_DIR/cache)")
    p.add_argument("--verify", action="store_true", help="re-hash every file against its manifest")
    p.set_defaults(run=info)

    generate = commands.add_parser("generate", help="generate ListOps or Pathfinder in the official layout")
    generators = generate.add_subparsers(dest="generator", required=True)
    p = generators.add_parser("listops", help="basic_{train,val,test}.tsv with the official algorithm")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-train", type=int, default=96_000)
    p.add_argument("--num-val", type=int, default=2_000)
    p.add_argument("--num-test", type=int, default=2_000)
    p.add_argument("--min-length", type=int, default=500, help="exclusive lower bound on the token count")
    p.add_argument("--max-length", type=int, default=2_000, help="exclusive upper bound on the token count")
    p.add_argument("--seed", type=int, required=True)
    p.set_defaults(run=generate_listops)
    p = generators.add_parser("pathfinder", help="imgs/<k>/sample_<i>.png and metadata/<k>.npy")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--num-samples", type=int, default=200_000)
    p.add_argument("--resolution", type=int, choices=(32, 128), default=32, help="32: Pathfinder, 128: Path-X")
    p.add_argument("--contour-length", type=int, default=14, help="14 is LRA's 'hard' level")
    p.add_argument("--workers", type=int, help="processes (default: every core)")
    p.add_argument("--seed", type=int, required=True)
    p.set_defaults(run=generate_pathfinder)
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    # The library's progress lines (downloads, generators, the cache) on stdout, with the results.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        args.run(args)
    except (FileNotFoundError, ValueError, cache.CacheError, DownloadError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
