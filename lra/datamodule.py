"""LightningDataModule for the LRA tasks."""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from .data.tasks import TaskData, load_task, prepare_task

SPLIT_OFFSET = {"train": 0, "val": 1, "test": 2}
log = logging.getLogger(__name__)


class LRADataModule(pl.LightningDataModule):
    """Train, validation and test loaders of one LRA task.

    As in the original protocol, training and validation draw shuffled batches and drop the last
    partial one (each evaluation then sees a fresh random subset of validation batches); the test
    set is read once, in order and in full.
    """

    def __init__(self, task: str, seq_len: int, data: dict[str, Any], batch_size: int, num_workers: int = 0, seed: int = 0):
        super().__init__()
        self.task = task
        self.seq_len = seq_len
        self.data = data
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.task_data: TaskData | None = None

    def prepare_data(self) -> None:
        # Once per node (Lightning calls it on one process): generate if needed, then prepare or
        # verify the cache; setup() on every process only memory-maps it.
        prepare_task(self.task, self.data, log=log.info)

    def setup(self, stage: str | None = None) -> None:
        if self.task_data is None:
            self.task_data = load_task(self.task, self.seq_len, self.data)
            too_small = {s: len(d) for s, d in self.task_data.splits.items() if s != "test" and len(d) < self.batch_size}
            if too_small:
                raise ValueError(
                    f"split sizes {too_small} are smaller than batch_size={self.batch_size}; "
                    "training and validation drop the last partial batch, so they would be empty"
                )

    def _loader(self, split: str, shuffle: bool, drop_last: bool) -> DataLoader:
        assert self.task_data is not None, "call setup() first"
        # One fixed stream per split, so a seed reproduces the order of batches.
        generator = torch.Generator().manual_seed(self.seed * 3 + SPLIT_OFFSET[split]) if shuffle else None
        return DataLoader(
            self.task_data.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=self.num_workers,
            generator=generator,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=True, drop_last=True)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False, drop_last=False)
