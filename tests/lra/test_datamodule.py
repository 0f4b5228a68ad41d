"""LRADataModule's batches: seeded, and the same samples whether one process or several read them."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from lra.datamodule import LRADataModule

SAMPLES = 40


def datamodule(batch_size, rank=None, world_size=None, seed=3):
    module = LRADataModule("listops", 16, {}, batch_size=batch_size, seed=seed)
    module.task_data = SimpleNamespace(splits={split: list(range(SAMPLES)) for split in ("train", "val", "test")})
    if world_size is not None:
        cpu = SimpleNamespace(root_device=torch.device("cpu"))
        module.trainer = SimpleNamespace(global_rank=rank, world_size=world_size, strategy=cpu)  # what Lightning attaches
    return module


def epochs(loader, count=2):
    """The batches of ``count`` passes over ``loader``, as lists of sample indices."""
    return [[batch.tolist() for batch in loader] for _ in range(count)]


@pytest.mark.parametrize("split", ["train", "val"])
def test_one_process_reads_torchs_seeded_shuffle(split):
    single = datamodule(batch_size=8)
    loader = single.train_dataloader() if split == "train" else single.val_dataloader()
    offset = {"train": 0, "val": 1}[split]
    reference = DataLoader(
        list(range(SAMPLES)), batch_size=8, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(3 * 3 + offset)
    )
    assert epochs(loader) == epochs(reference)
    assert epochs(datamodule(batch_size=8, seed=4).train_dataloader()) != epochs(datamodule(batch_size=8).train_dataloader())


@pytest.mark.parametrize("split", ["train", "val"])
def test_processes_read_their_share_of_the_single_process_batches(split):
    def loader(module):
        return module.train_dataloader() if split == "train" else module.val_dataloader()

    single = epochs(loader(datamodule(batch_size=12)))
    shares = [epochs(loader(datamodule(batch_size=4, rank=rank, world_size=3))) for rank in range(3)]
    for epoch, batches in enumerate(single):
        assert len(batches) == SAMPLES // 12
        for step, batch in enumerate(batches):
            assert shares[0][epoch][step] + shares[1][epoch][step] + shares[2][epoch][step] == batch


def test_the_test_set_is_read_whole_and_in_order_by_each_process():
    for rank in range(2):
        batches = [batch.tolist() for batch in datamodule(batch_size=16, rank=rank, world_size=2).test_dataloader()]
        assert batches == [list(range(0, 16)), list(range(16, 32)), list(range(32, 40))]
