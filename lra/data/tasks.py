"""Load a task's train/val/test splits from its configured source into in-memory datasets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from . import listops


class TokenDataset(Dataset):
    """Fixed-length token ids and labels; a sample is ``{"input_ids": (seq_len,) int64, "label": int64}``."""

    def __init__(self, input_ids: np.ndarray, labels: np.ndarray) -> None:
        if input_ids.ndim != 2 or len(input_ids) != len(labels):
            raise ValueError(f"need input_ids (num, seq_len) and labels (num,), got {input_ids.shape}, {labels.shape}")
        self.input_ids = torch.from_numpy(input_ids)
        self.labels = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "label": self.labels[index]}


@dataclass
class TaskData:
    splits: dict[str, TokenDataset]
    source: str  # where the data came from: "lra_release" or "generated"
    folder: Path


TASKS = ("listops",)


def prepare_task(name: str, data: dict[str, Any]) -> Path:
    """Return the folder holding task ``name``'s files, generating them first if the source says so."""
    if name not in TASKS:
        raise ValueError(f"task {name!r} has no data loader yet; available tasks: {', '.join(TASKS)}")
    source = data["source"]
    if source == "generated":
        return listops.ensure_generated(Path(data["generated_dir"]), listops.GeneratorConfig(**data["generator"]))
    if source == "lra_release":
        return Path(data["release_dir"])
    raise ValueError(f"unknown data source {source!r} for {name}; use 'lra_release' or 'generated'")


def load_task(name: str, seq_len: int, data: dict[str, Any]) -> TaskData:
    """Load the splits of task ``name`` as described by the task config's ``data`` section."""
    source = data["source"]
    folder = prepare_task(name, data)
    splits = {split: TokenDataset(*listops.read_split(folder, split, seq_len)) for split in listops.SPLITS}
    return TaskData(splits=splits, source=source, folder=folder)
