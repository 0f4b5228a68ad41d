"""Every registered attention trains in the LRA encoder, and every preset in conf/attention runs."""

import json
from pathlib import Path

import pytest
import torch
import yaml

import attention_zoo
from lra.data import listops
from lra.model import LRAClassifier, LRAEncoder

PRESETS = sorted((Path(__file__).resolve().parents[2] / "conf" / "attention").glob("*.yaml"))


def load_preset(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def listops_batch():
    """One batch of 16 generated ListOps sequences of fewer than 60 tokens, padded to 64."""
    config = listops.GeneratorConfig(num_train=16, num_val=1, num_test=1, min_length=5, max_length=60, seed=0)
    rows = listops.generate(config)["train"]
    ids = torch.zeros(16, 64, dtype=torch.long)
    for i, (source, _) in enumerate(rows):
        tokens = [listops.VOCAB[t] for t in listops.tokenize(source)]
        ids[i, : len(tokens)] = torch.tensor(tokens)
    return ids, torch.tensor([label for _, label in rows])


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_a_few_steps_reduce_the_loss(path, listops_batch):
    ids, labels = listops_batch
    preset = load_preset(path)
    name = path.stem
    torch.manual_seed(0)
    encoder = LRAEncoder(
        vocab_size=listops.VOCAB_SIZE, seq_len=64, attention=preset["name"], attention_hparams=preset["hparams"], dropout=0.0
    )
    model = LRAClassifier(listops.NUM_CLASSES, encoder).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0], f"{name}: loss {losses[0]:.3f} -> {losses[-3:]}"


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_names_a_registered_attention_with_valid_hyperparameters(path):
    preset = load_preset(path)
    assert set(preset) == {"name", "hparams"}, f"{path.name}: a preset holds 'name' and 'hparams'"
    attention_zoo.make_config(preset["name"], **preset["hparams"])


def test_every_registered_attention_has_a_preset():
    named = {load_preset(path)["name"] for path in PRESETS}
    assert set(attention_zoo.available()) <= named


@pytest.mark.slow
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_training_from_the_command_line(path, tmp_path, run_train):
    run_train(f"attention={path.stem}")
    (results,) = (tmp_path / "outputs").rglob("results.json")
    record = json.loads(results.read_text())
    assert record["status"] == "finished" and record["attention"] == load_preset(path)["name"]
    assert 0.0 <= record["test_acc"] <= 1.0
