"""The five LRA tasks: where each one's data comes from, and how it reaches the model.

A task config's ``data`` section (``conf/task/<task>.yaml``) says::

    source: auto | official | generated
    source_dir: the official files (an LRA release folder, aclImdb, cifar-10-batches-py)
    cache_dir: where prepared arrays live (lra.data.cache)
    max_length: tokens kept per sequence (per document for retrieval)
    options: reader options that change the arrays (Pathfinder's split_seed)
    generator: ListOps / Pathfinder generator parameters (source=generated)
    generated_dir: where generated raw files are written
    pixel_zero_is_padding: image / pathfinder only (see below)

``official`` reads ``source_dir`` (or, when it is gone, a cache prepared from it earlier with
``python -m lra.data prepare``); ``generated`` runs the task's generator (ListOps, Pathfinder) into
``generated_dir`` and prepares that; ``auto`` is ``official`` when its files or cache exist and
``generated`` otherwise. Tasks without a generator never get stand-in data: a missing source is an
error that says where the data is published and how to prepare it.

Image and Pathfinder use pixel intensities 0..255 as token ids and, like the original code, treat
id 0 (a black pixel) as padding. ``pixel_zero_is_padding: false`` shifts every pixel to id + 1
(vocabulary 257), so no pixel is masked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from . import cache, image, listops, pathfinder, pathfinder_generator, records, retrieval, text
from .formats import SPLITS, Prepared


@dataclass(frozen=True)
class TaskSpec:
    """What the harness needs to know about one task: its constants, its reader, its generator."""

    name: str
    vocab_size: int  # token ids 0 (padding) .. vocab_size - 1
    num_classes: int
    inputs: tuple[str, ...] = ("input_ids",)  # the token arrays of a sample; two for the dual encoder
    reader: Callable[..., Prepared] | None = None  # read(source, *, max_length, **options); None: no data files
    missing_message: Callable[[Path], str] | None = None  # what a missing source folder should hold, how to get it
    official_source: str = ""  # data_source label of the official files: lra_release, imdb, cifar10
    generate: Callable[[Path, dict[str, Any]], Path] | None = None  # (generated_dir, task.data.generator) -> folder
    pixels: bool = False  # tokens are pixel intensities (pixel_zero_is_padding applies)

    @property
    def dual_encoder(self) -> bool:
        """Two documents per sample, each encoded separately (retrieval)."""
        return len(self.inputs) == 2

    def token_offset(self, data: dict[str, Any]) -> int:
        """What is added to every stored token: 1 for pixels when pixel 0 is not padding (``task.data``)."""
        return 1 if self.pixels and not data.get("pixel_zero_is_padding", True) else 0


def generate_listops(generated_dir: Path, params: dict[str, Any]) -> Path:
    return listops.ensure_generated(generated_dir, listops.GeneratorConfig(**params))


def generate_pathfinder(generated_dir: Path, params: dict[str, Any]) -> Path:
    params = dict(params)
    num_samples, seed = params.pop("num_samples"), params.pop("seed")
    config = pathfinder_generator.PathfinderConfig.lra(**params)
    return pathfinder_generator.ensure_generated(generated_dir, config, num_samples, seed)


PATHFINDER = dict(
    vocab_size=pathfinder.VOCAB_SIZE,
    num_classes=pathfinder.NUM_CLASSES,
    reader=pathfinder.read,
    missing_message=pathfinder.missing_data_message,
    official_source="lra_release",
    generate=generate_pathfinder,
    pixels=True,
)
TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "listops",
            listops.VOCAB_SIZE,
            listops.NUM_CLASSES,
            reader=listops.read,
            missing_message=listops.missing_data_message,
            official_source="lra_release",
            generate=generate_listops,
        ),
        TaskSpec(
            "text",
            text.VOCAB_SIZE,
            text.NUM_CLASSES,
            reader=text.read,
            missing_message=text.missing_data_message,
            official_source="imdb",
        ),
        TaskSpec(
            "retrieval",
            retrieval.VOCAB_SIZE,
            retrieval.NUM_CLASSES,
            inputs=("input_ids_0", "input_ids_1"),
            reader=retrieval.read,
            missing_message=retrieval.missing_data_message,
            official_source="lra_release",
        ),
        TaskSpec(
            "image",
            image.VOCAB_SIZE,
            image.NUM_CLASSES,
            reader=image.read,
            missing_message=image.missing_data_message,
            official_source="cifar10",
            pixels=True,
        ),
        TaskSpec("pathfinder", **PATHFINDER),
        TaskSpec("pathx", **PATHFINDER),
    )
}
log = logging.getLogger(__name__)
SOURCES = ("auto", "official", "generated")


def get_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(TASKS)}")
    return TASKS[name]


def cache_key(spec: TaskSpec, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """What the cached arrays depend on. The source folder's path is not part of it, so a cache
    prepared from a download keeps working after the download is moved or deleted."""
    key = {"kind": kind, "max_length": data["max_length"], "options": dict(data.get("options") or {})}
    if kind == "generated":
        key["generator"] = dict(data["generator"])
    return key


@dataclass
class Resolved:
    """Where a task's data comes from in this run."""

    kind: str  # official | generated
    data_source: str  # the label results.json records: lra_release, imdb, cifar10, generated
    folder: Path  # its cache folder
    key: dict[str, Any]


def resolve(name: str, data: dict[str, Any]) -> Resolved:
    """Decide between the official files and the generator, without reading or generating."""
    spec = get_spec(name)
    source = data["source"]
    if source not in SOURCES:
        raise ValueError(f"unknown task.data.source {source!r} for {name}; use one of {', '.join(SOURCES)}")
    if source == "generated" and spec.generate is None:
        raise ValueError(
            f"{name} has no generator (only listops and pathfinder do); use task.data.source=official with the official files"
        )
    cache_dir = Path(data["cache_dir"])
    if source in ("auto", "official"):
        key = cache_key(spec, "official", data)
        folder = cache.cache_folder(cache_dir, name, key)
        if Path(data["source_dir"]).is_dir() or (folder / cache.MANIFEST).is_file():
            return Resolved("official", spec.official_source, folder, key)
        if source == "official" or spec.generate is None:
            raise FileNotFoundError(spec.missing_message(Path(data["source_dir"])))
    key = cache_key(spec, "generated", data)
    return Resolved("generated", "generated", cache.cache_folder(cache_dir, name, key), key)


def prepare_task(name: str, data: dict[str, Any], *, force: bool = False) -> Resolved:
    """Make sure the task's cache is present, current and intact (generating data first if needed)."""
    spec = get_spec(name)
    resolved = resolve(name, data)
    if resolved.kind == "official":
        source_dir = Path(data["source_dir"])
        if not source_dir.is_dir():  # prepared earlier from a folder that is gone: use the cache as is
            cache.verify(resolved.folder, cache.read_manifest(resolved.folder), checksums=True)
            return resolved
    else:
        if data["source"] == "auto":  # a mistyped task.data.source_dir falls back to the generator: said
            log.info(
                "%s: no official files at %s (task.data.source=auto): the generated data trains; "
                "task.data.source=official requires the official files",
                name,
                data["source_dir"],
            )
        source_dir = spec.generate(Path(data["generated_dir"]), data["generator"])  # checked, or generated again
    options = dict(data.get("options") or {})

    def read() -> Prepared:
        if resolved.kind == "official":
            check_official(source_dir)
        return spec.reader(source_dir, max_length=data["max_length"], **options)

    cache.prepare(resolved.folder, name, resolved.key, source_dir, read, force=force)
    return resolved


#: The records an official folder may hold of its files: ``python -m lra.data download``'s, or (a folder written by
#: ``python -m lra.data generate`` and given as ``source_dir``) the generator's.
OFFICIAL_RECORDS = (cache.DOWNLOAD_RECORD, listops.GENERATOR_JSON)


def check_official(source_dir: Path) -> None:
    """Before official data is read: raise :class:`~lra.data.records.DamagedData` naming the first file that differs
    from the record written with the folder (a folder without one has nothing to check but its reader's checks).

    Official data is never regenerated or downloaded over: what to do with it is the user's decision.
    """
    for record_name in OFFICIAL_RECORDS:
        path = Path(source_dir) / record_name
        if not path.is_file():
            continue
        try:
            files = json.loads(path.read_text()).get("files")
        except (OSError, ValueError) as error:
            raise records.DamagedData(f"{path} cannot be read ({error}): the record of {source_dir} is damaged") from None
        problem = records.difference(source_dir, files, record_name) if files else None
        if problem:
            raise records.DamagedData(
                f"{source_dir} is damaged: {problem}. It is not regenerated or downloaded over: restore the file, or delete "
                f"{source_dir} and run `python -m lra.data download <task>` (or generate) again"
            )


class TokenDataset(Dataset):
    """One split of a prepared task, read row by row from the memory-mapped cache.

    A sample is ``{"input_ids": (seq_len,) int64, "label": int64}`` (retrieval: ``input_ids_0`` and
    ``input_ids_1``), right-padded with zeros from the cached ``max_length`` to the model's
    ``seq_len``; ``token_offset`` is added to every stored token first.
    """

    def __init__(self, split: cache.CachedSplit, seq_len: int, token_offset: int = 0) -> None:
        for name, array in split.arrays.items():
            if array.shape[1] > seq_len:
                raise ValueError(
                    f"the cached {name} rows hold {array.shape[1]} tokens but task.seq_len={seq_len}; "
                    "raise seq_len (the model's length) or prepare with a smaller data.max_length"
                )
        self.split = split
        self.seq_len = seq_len
        self.token_offset = token_offset

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = {}
        for name, array in self.split.arrays.items():
            row = np.zeros(self.seq_len, dtype=np.int64)
            row[: array.shape[1]] = array[index]
            row[: array.shape[1]] += self.token_offset
            sample[name] = torch.from_numpy(row)
        sample["label"] = torch.tensor(int(self.split.labels[index]))
        return sample


@dataclass
class TaskData:
    splits: dict[str, TokenDataset]
    data_source: str  # lra_release, imdb, cifar10 or generated
    folder: Path  # the cache folder
    manifest: dict[str, Any]


def load_task(name: str, seq_len: int, data: dict[str, Any]) -> TaskData:
    """The task's splits from its cache, preparing the cache first if it is not there yet."""
    spec = get_spec(name)
    resolved = resolve(name, data)
    if not (resolved.folder / cache.MANIFEST).is_file():
        resolved = prepare_task(name, data)
    splits, manifest = cache.load(resolved.folder)
    datasets = {split: TokenDataset(splits[split], seq_len, spec.token_offset(data)) for split in SPLITS}
    return TaskData(datasets, resolved.data_source, resolved.folder, manifest)
