"""``python -m lra.bench approx``: the angle between YOSO-m's and YOSO-E's outputs, and where Q, K, V come from."""

import csv
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lra.bench import approx
from lra.data import cache
from lra.data.tasks import prepare_task
from lra.module import LRAClassificationModule

SEQ_LEN = 32  # the tiny model's length: its YOSO tau is ceil(log2 32) = 5
MODEL = dict(dim=16, depth=2, num_heads=2, head_dim=8, ffn_dim=32, dropout=0.1, head_hidden_dim=16, attention_in_float32=True)
HPARAMS = dict(
    num_hashes=8, hash_bits=None, backward="lower_bound", conv_window=None, expectation=True, hash_projection="hadamard"
)


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def trained_run(tmp_path, monkeypatch):
    """A run folder laid out as ``python -m lra.train`` leaves it, started from ``tmp_path``: results.json,
    a Lightning checkpoint of a small YOSO-E classifier (its weights and hyperparameters, all that
    ``load_from_checkpoint`` reads), and a ListOps cache prepared by the project's own generator and
    cache writer (``data_folder`` relative to the starting folder)."""
    monkeypatch.chdir(tmp_path)
    data = {
        "source": "generated",
        "source_dir": "data/release",
        "cache_dir": "data/cache",
        "max_length": SEQ_LEN,
        "options": {},
        "generated_dir": "data/generated",
        "generator": {"num_train": 1, "num_val": 1, "num_test": 30, "min_length": 8, "max_length": 30, "seed": 0},
    }
    data_folder = prepare_task("listops", data).folder
    torch.manual_seed(0)
    module = LRAClassificationModule(
        "listops", SEQ_LEN, MODEL, {"name": "yoso", "hparams": HPARAMS}, warmup_steps=0, max_steps=10
    )
    classifier = module.model.eval()
    run = tmp_path / "outputs" / "listops" / "yoso_e" / "seed=0"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = {
        "global_step": 4,
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "pytorch-lightning_version": "2.4.0",
    }
    torch.save(checkpoint, run / "checkpoints" / "best-step4.ckpt")
    record = {
        "task": "listops",
        "attention": "yoso",
        "row": "yoso_e",
        "attention_hparams": HPARAMS,
        "model": MODEL,
        "data_folder": str(data_folder),
        "status": "finished",
        # Recorded where training ran; the folder has moved since, so the local copy must be found.
        "best_checkpoint": "/elsewhere/outputs/listops/yoso_e/seed=0/checkpoints/best-step4.ckpt",
    }
    (run / "results.json").write_text(json.dumps(record))
    return run, classifier, data_folder


def test_row_angles_match_known_angles_and_zero_rows_are_orthogonal():
    exact = torch.eye(3)[[0, 1, 2, 0]]  # (4, 3) unit rows
    approximate = torch.tensor(
        [
            [math.cos(0.3), math.sin(0.3), 0.0],
            [0.0, 2 * math.cos(2.0), 2 * math.sin(2.0)],  # the length does not matter, only the direction
            [0.0, 0.0, -1.0],
            [0.0, 0.0, 0.0],  # no collision: YOSO-m's zero row
        ]
    )
    expected = torch.tensor([0.3, 2.0, math.pi, math.pi / 2], dtype=torch.float64)
    torch.testing.assert_close(approx.row_angles(approximate, exact), expected)


def test_queries_without_collisions_count_as_zero_rows_at_a_right_angle():
    # Every key equals u: queries u collide with all of them in every hash, so YOSO-m gives exactly
    # YOSO-E's row (angle 0); queries -u have the complementary codes and never collide (zero rows).
    direction = F.normalize(torch.randn(8, generator=torch.Generator().manual_seed(0)), dim=0)
    n = 16
    signs = torch.tensor([1.0] * (n // 2) + [-1.0] * (n // 2))
    queries = (signs[:, None] * direction).view(1, 1, 1, n, 8)  # (layers, samples, h, n, d)
    keys = direction.expand(1, 1, 1, n, 8)
    values = torch.randn(1, 1, 1, n, 8, generator=torch.Generator().manual_seed(1))
    vectors = approx.Vectors(queries, keys, values, "hand-made", task="none", attention="none", model_hash_bits=None)
    tally = approx.measure(vectors, [n], [4], seeds=1, hash_bits=4, device=torch.device("cpu"))[(n, 4)]
    assert tally.zero_rows / tally.rows == 0.5
    assert tally.colliding_angle() == pytest.approx(0, abs=1e-3)
    torch.testing.assert_close(torch.cat(tally.unit_angles), torch.tensor([math.pi / 4], dtype=torch.float64), atol=1e-3, rtol=0)


def test_more_hashes_approximate_yoso_e_better_on_random_unit_vectors(tmp_path, capsys):
    out = tmp_path / "res"
    assert (
        approx.main(["--lengths", "64", "128", "--hashes", "8", "128", "--seeds", "2", "--samples", "2", "--out", str(out)]) == 0
    )
    assert f"wrote {out / 'approx_error.csv'} and {out / 'approx_error.png'}" in capsys.readouterr().out, "both paths whole"
    rows = read_rows(out / "approx_error.csv")
    assert {row["source"] for row in rows} == {"random_unit_vectors"} and {row["hash_bits"] for row in rows} == {"8"}
    angle = {(int(row["seq_len"]), int(row["num_hashes"])): float(row["mean_angle_rad"]) for row in rows}
    for n in (64, 128):
        assert angle[(n, 128)] < angle[(n, 8)] - 0.2, angle
    assert (out / "approx_error.png").stat().st_size > 0


def test_a_trained_run_gives_one_row_per_length_and_m_with_its_own_tau(trained_run, tmp_path):
    run, _, _ = trained_run
    out = tmp_path / "res"
    assert (
        approx.main(["--run", str(run), "--lengths", "16", "32", "--hashes", "8", "32", "--seeds", "2", "--out", str(out)]) == 0
    )
    rows = read_rows(out / "approx_error.csv")
    assert list(rows[0]) == approx.FIELDS
    assert [(int(row["seq_len"]), int(row["num_hashes"])) for row in rows] == [(16, 8), (16, 32), (32, 8), (32, 32)]
    for row in rows:
        assert row["source"] == "checkpoint:outputs/listops/yoso_e/seed=0/checkpoints/best-step4.ckpt"
        assert (row["task"], row["attention"], row["hash_bits"]) == ("listops", "yoso (yoso_e)", "5")
        assert (row["layers"], row["heads"], row["samples"], row["seeds"]) == ("2", "2", "4", "2")
        assert 0 < float(row["mean_angle_rad"]) < math.pi and 0 <= float(row["zero_row_fraction"]) <= 1
    assert (out / "approx_error.png").stat().st_size > 0


def test_captured_queries_are_the_models_own_projection_of_consecutive_samples(trained_run):
    run, classifier, data_folder = trained_run
    vectors = approx.trained_vectors(run, None, num_tokens=SEQ_LEN, samples=1, device=torch.device("cpu"))
    assert vectors.queries.shape == (2, 1, 2, SEQ_LEN, 8)  # (layers, samples, h, n, d)

    encoder = classifier.encoder
    block = encoder.blocks[0]
    first = 6  # enough samples for SEQ_LEN real tokens
    test_ids = cache.load(data_folder)[0]["test"].arrays["input_ids"][:first]
    input_ids = torch.from_numpy(np.asarray(test_ids, dtype=np.int64))  # (first, n), right-padded with 0
    with torch.no_grad():
        positions = encoder.position_embedding(torch.arange(SEQ_LEN))  # (n, dim)
        embedded = encoder.token_embedding(input_ids) + positions  # (first, n, dim)
        projected = block.attention.query(block.attention_norm(embedded))  # (first, n, h * d)
    real = [projected[i][input_ids[i] != 0] for i in range(first)]  # each (real tokens, h * d)
    assert len(real[0]) < SEQ_LEN <= sum(map(len, real))  # the window spans several samples
    expected = torch.cat(real)[:SEQ_LEN].view(SEQ_LEN, 2, 8).transpose(0, 1)  # (h, n, d)
    torch.testing.assert_close(vectors.queries[0, 0], expected)


def test_a_missing_run_folder_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        approx.main(["--run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "res")])
    assert exit_info.value.code == 2
    assert f"run folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_too_few_test_tokens_for_the_longest_length_is_an_error_with_the_count(trained_run, tmp_path, capsys):
    run, _, _ = trained_run
    with pytest.raises(SystemExit) as exit_info:
        approx.main(["--run", str(run), "--lengths", "64", "4096", "--samples", "1", "--out", str(tmp_path / "res")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "real tokens in its 30 samples, fewer than the 4096 needed" in error and "smaller --lengths" in error
    assert not (tmp_path / "res").exists()


def test_a_checkpoint_without_the_model_settings_is_named(trained_run, tmp_path, capsys):
    run, _, _ = trained_run
    path = run / "checkpoints" / "best-step4.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["hyper_parameters"]
    torch.save(checkpoint, path)
    with pytest.raises(SystemExit) as exit_info:
        approx.main(["--run", str(run), "--lengths", "16", "--out", str(tmp_path / "res")])
    assert exit_info.value.code == 2
    assert "does not hold the model's settings" in capsys.readouterr().err
