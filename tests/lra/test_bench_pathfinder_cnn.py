"""Generated Pathfinder reaches a learner intact: the datamodule's tokens and labels are the generator's
images and labels, and ``python -m lra.bench pathfinder_cnn`` trains and records its curve."""

import csv

import numpy as np
import pytest
import torch

from lra.bench import __main__ as bench
from lra.bench import pathfinder_cnn
from lra.data import pathfinder, pathfinder_generator
from lra.datamodule import LRADataModule

NUM_IMAGES, SEED = 120, 5


@pytest.fixture(scope="module")
def truth():
    """Every generated image's pixels (as bytes) -> its label, straight from the generator."""
    config = pathfinder_generator.PathfinderConfig.lra(32, 6)
    samples = [pathfinder_generator.generate_sample(config, SEED, g) for g in range(NUM_IMAGES)]
    return {s.image.tobytes(): s.label for s in samples}


@pytest.mark.parametrize("zero_is_padding", [True, False])
def test_generated_images_reach_the_model_unchanged_with_their_labels(tmp_path, truth, zero_is_padding):
    data = dict(
        source="generated",
        source_dir=str(tmp_path / "absent"),
        cache_dir=str(tmp_path / "cache"),
        max_length=1024,
        options=dict(split_seed=0),
        pixel_zero_is_padding=zero_is_padding,
        generated_dir=str(tmp_path / "generated"),
        generator=dict(resolution=32, contour_length=6, num_samples=NUM_IMAGES, seed=SEED),
    )
    module = LRADataModule("pathfinder", 1024, data, batch_size=8, seed=0)
    module.prepare_data()
    module.setup()
    offset = 0 if zero_is_padding else 1
    seen = []
    for split in ("train", "val", "test"):
        dataset = module.task_data.splits[split]
        for index in range(len(dataset)):
            sample = dataset[index]
            tokens = sample["input_ids"].numpy()
            assert tokens.shape == (1024,) and tokens.min() >= offset and tokens.max() <= 255 + offset
            image = (tokens - offset).astype(np.uint8).reshape(32, 32)
            assert image.tobytes() in truth, f"{split}[{index}] is not a generated image"
            assert int(sample["label"]) == truth[image.tobytes()], f"{split}[{index}] carries the wrong label"
            seen.append(image.tobytes())
    assert sorted(seen) == sorted(truth)  # every image exactly once
    batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape == (8, 1024) and batch["label"].shape == (8,)


def test_the_cnn_input_is_the_image(tmp_path, truth):
    config = pathfinder_generator.PathfinderConfig.lra(32, 6)
    folder = pathfinder_generator.ensure_generated(tmp_path, config, NUM_IMAGES, SEED, workers=1, progress=False)
    prepared = pathfinder.read(folder, split_seed=0, workers=1)
    x, y = pathfinder_cnn.images(prepared.splits["train"], 32)
    assert x.shape == (len(y), 1, 32, 32) and x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    for image, label in zip(x, y):
        pixels = torch.round(image[0] * 255).to(torch.uint8).numpy()
        assert truth[pixels.tobytes()] == int(label)


def test_the_cnn_maps_a_batch_to_two_logits():
    model = pathfinder_cnn.SmallCNN()
    assert model(torch.rand(3, 1, 32, 32)).shape == (3, 2)


def test_the_benchmark_records_a_curve_per_contour_length(tmp_path):
    out = tmp_path / "results"
    options = ["--contour-lengths", "6", "9", "--num-images", "100", "--steps", "6", "--eval-every", "3"]
    options += ["--batch-size", "16", "--generated-dir", str(tmp_path / "gen"), "--out", str(out), "--quiet"]
    assert bench.main(["pathfinder_cnn", *options]) == 0
    rows = list(csv.DictReader(open(out / "pathfinder_cnn.csv")))
    assert [(r["contour_length"], r["split"], r["step"]) for r in rows] == [
        (length, split, step)
        for length in ("6", "9")
        for split, step in (("val", "0"), ("val", "3"), ("val", "6"), ("test", "6"))
    ]
    for row in rows:
        assert 0 <= float(row["accuracy"]) <= 1 and row["num_train"] == "80"
    assert [r["images_seen"] for r in rows[:3]] == ["0", "48", "96"]
    assert (out / "pathfinder_cnn.png").stat().st_size > 0
