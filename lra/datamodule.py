"""LightningDataModule for the LRA tasks."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler

from .data.tasks import TaskData, load_task, prepare_task

SPLIT_OFFSET = {"train": 0, "val": 1, "test": 2}


class GlobalBatchShard(Sampler[list[int]]):
    """One process's share of each global batch: process ``rank`` of ``world_size`` takes the
    ``rank``-th contiguous slice of every batch that ``global_batches`` yields.

    With the global batches drawn exactly as one process draws its batches, a DDP run trains on the
    same samples in the same order as the single-process run of the same seed, and (gradients being
    averaged over processes) takes the same steps; its evaluations see the same samples too. (A
    DistributedSampler would shuffle with its own seed and deal samples round-robin.)
    """

    def __init__(self, global_batches: BatchSampler, rank: int, world_size: int):
        if global_batches.batch_size % world_size:
            raise ValueError(f"a global batch of {global_batches.batch_size} does not split over {world_size} processes")
        if world_size > 1 and not global_batches.drop_last:
            raise ValueError("a last partial batch does not split evenly over processes: drop it, or read with one process")
        self.global_batches = global_batches
        self.rank = rank
        self.world_size = world_size

    def __iter__(self):
        for batch in self.global_batches:
            share = len(batch) // self.world_size
            yield batch[self.rank * share : (self.rank + 1) * share]

    def __len__(self) -> int:
        return len(self.global_batches)


class SeededPasses(Sampler[int]):
    """A split's samples in a new shuffled order each pass, pass ``p`` in the order of a generator seeded from
    ``seed`` and ``p``: any pass can be drawn on its own, as a run resumed elsewhere must draw the pass it stopped in (a
    generator carried from pass to pass would have to be replayed). The next pass can start ``skip`` samples in,
    where the resumed run's epoch stood, so that no sample of it is seen twice."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.passes = 0  # passes started
        self.skip = 0  # samples the next pass leaves out at its start

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        # The CPU generator keeps 32 bits of a seed: the split's seed is spread over them (by the golden ratio's
        # multiplier, so nearby seeds are far apart), and the pass added.
        generator = torch.Generator().manual_seed((self.seed * 0x9E3779B1 + self.passes) % 2**32)
        start, self.skip = self.skip, 0
        self.passes += 1
        yield from torch.randperm(self.size, generator=generator)[start:].tolist()


class LRADataModule(pl.LightningDataModule):
    """Train, validation and test loaders of one LRA task.

    As in the original protocol, training and validation draw shuffled batches and drop the last
    partial one (each evaluation then sees a fresh random subset of validation batches); the test
    set is read once, in order and in full.

    ``pin_memory``: whether batches come in page-locked memory; by default (``None``) when the attached Trainer
    computes on a CUDA device (:meth:`on_gpu`). A loop without a Trainer that copies batches to a GPU says ``True``.

    Its state in a checkpoint (:meth:`state_dict`) is where the shuffled passes stood and torch's random number
    generators (dropout's, and the pretraining masks'): a run resumed from it, in any folder or process, draws the
    batches and the random numbers the uninterrupted run draws after that step.
    """

    def __init__(
        self,
        task: str,
        seq_len: int,
        data: dict[str, Any],
        batch_size: int,
        num_workers: int = 0,
        seed: int = 0,
        pin_memory: bool | None = None,
    ):
        super().__init__()
        self.task = task
        self.seq_len = seq_len
        self.data = data
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.pin_memory = pin_memory
        self.task_data: TaskData | None = None
        self.orders: dict[str, SeededPasses] = {}  # the shuffled splits' samplers, once their loaders are made
        self.resume_from: dict[str, Any] | None = None  # a checkpoint's state, for the loaders still to be made

    def prepare_data(self) -> None:
        # Once per node (Lightning calls it on one process): generate if needed, then prepare or
        # verify the cache; setup() on every process only memory-maps it.
        prepare_task(self.task, self.data)

    def setup(self, stage: str | None = None) -> None:
        if self.task_data is None:
            self.task_data = load_task(self.task, self.seq_len, self.data)

    def _loader(self, split: str, shuffle: bool, drop_last: bool) -> DataLoader:
        assert self.task_data is not None, "call setup() first"
        dataset = self.task_data.splits[split]
        # One stream per split and seed, so a seed reproduces the order of batches; the loader's own generator
        # (a seed for its workers at each pass) keeps it from drawing on torch's global one, which dropout uses.
        seed = self.seed * 3 + SPLIT_OFFSET[split]
        generator = torch.Generator().manual_seed(seed)
        # batch_size is one process's share; the test set is read by one process alone.
        trainer = self.trainer if split != "test" else None
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if drop_last and len(dataset) < self.batch_size * world_size:
            raise ValueError(
                f"the {split} split has {len(dataset)} samples, fewer than a batch ({self.batch_size * world_size}): "
                f"{split} batches drop the last partial one, so there would be none; lower the batch size or give more data"
            )
        order: Sampler[int] = SequentialSampler(dataset)
        if shuffle:
            order = self.orders[split] = SeededPasses(len(dataset), seed)
            if self.resume_from is not None:
                order.passes = self.resume_from.get(f"{split}_passes", 0)
                order.skip = self.resume_from.get(f"{split}_batches", 0) * self.batch_size * world_size
        batches = GlobalBatchShard(BatchSampler(order, self.batch_size * world_size, drop_last), rank, world_size)
        return DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=self.num_workers,
            generator=generator,
            persistent_workers=self.num_workers > 0,
            # Batches in page-locked memory for a GPU: Lightning's copy to the device (non_blocking) is then truly
            # asynchronous, where a copy from pageable memory waits for the host to stage it.
            pin_memory=self.on_gpu() if self.pin_memory is None else self.pin_memory,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the shuffled passes stand after the step a checkpoint is saved at, and torch's generators."""
        if self.trainer is None or "train" not in self.orders:
            return {}
        state: dict[str, Any] = {"torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        # The training pass under way (one a Lightning epoch) and the batches of it trained, by Lightning's count (the
        # loader itself draws ahead of the training loop): processed, which counts the step whose on_train_batch_end
        # an interrupt stops in, as well as every step before a checkpoint taken at an evaluation.
        state["train_passes"] = max(self.orders["train"].passes - 1, 0)
        state["train_batches"] = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if "val" in self.orders:
            state["val_passes"] = self.orders["val"].passes
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint of an earlier version: it resumes, with the passes from their start
            return
        self.resume_from = state
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        for split, order in self.orders.items():  # loaders already made: they go on from the checkpoint too
            order.passes = state.get(f"{split}_passes", order.passes)

    def on_gpu(self) -> bool:
        """Whether the attached Trainer computes on a CUDA device."""
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=True, drop_last=True)

    def test_dataloader(self) -> DataLoader:
        return self.in_order("test")

    def in_order(self, split: str) -> DataLoader:
        """All of ``split``, once, in its order (how the test set is read; ``python -m lra.evaluate`` reads any split so)."""
        return self._loader(split, shuffle=False, drop_last=False)
