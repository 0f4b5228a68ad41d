"""LRADataModule's batches: seeded, and the same samples whether one process or several read them."""

from types import SimpleNamespace

import pytest
import torch

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
def test_each_pass_is_a_shuffle_seeded_by_the_seed_the_split_and_the_pass(split):
    single = datamodule(batch_size=8)
    loader = single.train_dataloader() if split == "train" else single.val_dataloader()
    base = 3 * 3 + {"train": 0, "val": 1}[split]

    def reference(p):
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed((base * 0x9E3779B1 + p) % 2**32)).tolist()
        return [order[i : i + 8] for i in range(0, SAMPLES - 7, 8)]

    assert epochs(loader, 3) == [reference(0), reference(1), reference(2)]
    assert reference(0) != reference(1)
    assert epochs(datamodule(batch_size=8, seed=4).train_dataloader()) != epochs(datamodule(batch_size=8).train_dataloader())


def test_a_module_given_a_checkpoints_state_draws_what_the_uninterrupted_one_draws_next():
    """A run resumed in another process goes on with the batches and the random numbers of the one it continues."""
    first = datamodule(batch_size=8)
    train, val = first.train_dataloader(), first.val_dataloader()
    passes = iter(train)
    [next(passes) for _ in range(5)]  # pass 0 whole: 5 batches
    list(val)  # an evaluation
    within = iter(train)
    trained = [next(within) for _ in range(3)]  # 3 batches into pass 1 (the loader may have drawn ahead: not counted)
    progress = SimpleNamespace(current=SimpleNamespace(processed=2))  # Lightning: 2 of them trained
    first.trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    state = first.state_dict()
    assert (state["train_passes"], state["train_batches"], state["val_passes"]) == (1, 2, 1)
    dropout_after = torch.rand(4)

    second = datamodule(batch_size=8)
    torch.rand(100)  # whatever the new process drew before: the state replaces it
    second.load_state_dict(state)
    assert torch.equal(torch.rand(4), dropout_after)
    again = second.train_dataloader()
    resumed = [[batch.tolist() for batch in again] for _ in range(2)]
    expected = [trained[2].tolist()] + [batch.tolist() for batch in within]
    assert resumed == [expected, [batch.tolist() for batch in train]]  # the rest of pass 1, then pass 2
    assert [b.tolist() for b in second.val_dataloader()] == [b.tolist() for b in val]  # the next evaluation's pass
    assert datamodule(batch_size=8).state_dict() == {}  # nothing trained: no state


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


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_smaller_than_a_batch_is_refused_where_its_batches_drop_the_last_but_read_in_order(split):
    """Training and validation drop the last partial batch: a split smaller than one (here the processes' global
    batch of 2 x 24) would give none, and says so; read whole and in order (lra.evaluate's reading), it is all read."""
    module = datamodule(batch_size=24, rank=0, world_size=2)
    with pytest.raises(ValueError, match=rf"the {split} split has 40 samples, fewer than a batch \(48\)"):
        module.train_dataloader() if split == "train" else module.val_dataloader()
    alone = datamodule(batch_size=48)
    assert [batch.tolist() for batch in alone.in_order(split)] == [list(range(40))]
