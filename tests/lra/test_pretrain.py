"""Self-pretraining (pretrain=mlm): masking, its loss, starting a classifier from it, and the run end to end."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from lra import results, run_lock
from lra.data.cache import file_sha256
from lra.module import (
    IGNORED,
    LRAClassificationModule,
    LRAMaskedLMModule,
    load_pretrained_encoder,
    mask_tokens,
    masked_prediction_loss,
)

MODEL = dict(dim=16, depth=1, num_heads=2, head_dim=8, ffn_dim=32, dropout=0.0, head_hidden_dim=16)
SOFTMAX = {"name": "softmax", "hparams": {"dropout": 0.0}}


def padded_batch(seed: int) -> torch.Tensor:
    """ListOps-like ids 1..15 with a random amount of padding (0) at the end of each row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 16, (64, 200), generator=generator)
    lengths = torch.randint(0, 201, (64,), generator=generator)
    return ids * (torch.arange(200)[None, :] < lengths[:, None])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rate", [0.15, 0.9])
def test_masking_never_touches_padding_and_masks_real_tokens_at_the_rate(seed, rate):
    ids = padded_batch(seed)
    masked, labels = mask_tokens(ids, rate, mask_token=16, generator=torch.Generator().manual_seed(seed + 10))
    padding, chosen = ids == 0, masked == 16
    assert torch.equal(masked[padding], ids[padding])  # padding stays padding
    assert (labels[padding] == IGNORED).all()  # and is never a target
    assert torch.equal(labels[chosen], ids[chosen])  # a masked token's target is its original id
    assert torch.equal(masked[~chosen], ids[~chosen]) and (labels[~chosen] == IGNORED).all()
    real = int((~padding).sum())
    # Binomial: within 5 standard deviations of the rate (about 6000 real tokens).
    assert abs(int(chosen.sum()) / real - rate) < 5 * math.sqrt(rate * (1 - rate) / real)


def test_the_loss_is_the_mean_cross_entropy_over_masked_real_tokens_only():
    logits = torch.tensor(
        [
            [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [9.0, -9.0, 3.0], [0.0, 1.0, 2.0]],
            [[1.0, 1.0, 1.0], [-2.0, 3.0, 0.0], [4.0, 4.0, -4.0], [7.0, 0.0, 0.0]],
        ]
    )
    # Targets at (0, 1) -> 0, (0, 3) -> 2, (1, 1) -> 1; the rest unmasked or padding.
    labels = torch.full((2, 4), IGNORED)
    labels[0, 1], labels[0, 3], labels[1, 1] = 0, 2, 1

    def nll(row, target):
        return -(row[target] - math.log(sum(math.exp(v) for v in row)))

    expected = (nll([0.5, 0.5, 0.0], 0) + nll([0.0, 1.0, 2.0], 2) + nll([-2.0, 3.0, 0.0], 1)) / 3
    assert masked_prediction_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    none_masked = masked_prediction_loss(logits, torch.full((2, 4), IGNORED))
    assert none_masked.item() == 0.0  # not NaN


def test_the_pretraining_step_predicts_masked_tokens_of_real_positions():
    torch.manual_seed(0)
    module = LRAMaskedLMModule("listops", 32, MODEL, SOFTMAX, mask_rate=0.5)
    assert module.encoder.token_embedding.num_embeddings == module.spec.vocab_size + 1  # the mask token
    ids = padded_batch(3)[:4, :32]
    ids[0, 5:] = 0
    logits = module(ids)
    assert logits.shape == (4, 32, module.spec.vocab_size)
    module.eval()  # no dropout: the step's logits are the module's on the same masked input
    torch.manual_seed(1)
    loss, _, targets = module.loss_and_predictions({"input_ids": ids, "label": torch.zeros(4, dtype=torch.long)})
    torch.manual_seed(1)
    masked_ids, labels = mask_tokens(ids, 0.5, module.mask_token)
    assert torch.equal(targets, labels.flatten())
    assert (targets[ids.flatten() == 0] == IGNORED).all() and (targets != IGNORED).any()
    torch.testing.assert_close(loss, masked_prediction_loss(module(masked_ids), labels))


def save_like_lightning(module, path: Path) -> Path:
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}, path)
    return path


def assert_encoder_is_the_pretrained_one(classifier, pretrained) -> None:
    """Every encoder weight equals the pretrained one; the pretraining's vocabulary has the [MASK] token past the task's."""
    encoder = classifier.model.encoder.state_dict()
    for key, value in pretrained.encoder.state_dict().items():
        expected = value[: classifier.spec.vocab_size] if key == "token_embedding.weight" else value
        assert torch.equal(encoder[key], expected), key


def test_a_classifier_starts_from_the_pretrained_encoder_with_a_fresh_head(tmp_path):
    torch.manual_seed(0)
    pretrained = LRAMaskedLMModule("listops", 32, MODEL, SOFTMAX)
    checkpoint = save_like_lightning(pretrained, tmp_path / "mlm.ckpt")
    torch.manual_seed(1)
    classifier = LRAClassificationModule("listops", 32, MODEL, SOFTMAX)
    head_before = {k: v.clone() for k, v in classifier.model.head.state_dict().items()}
    load_pretrained_encoder(classifier, checkpoint)
    assert_encoder_is_the_pretrained_one(classifier, pretrained)
    for key, value in classifier.model.head.state_dict().items():
        assert torch.equal(value, head_before[key]), key


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (dict(attention={"name": "linformer", "hparams": {"dropout": 0.0, "k": 8}}), "attention"),
        (dict(model={**MODEL, "positions": "rotary"}), "model"),
        (dict(seq_len=64), "seq_len"),
    ],
)
def test_a_checkpoint_of_another_model_is_one_clear_error(tmp_path, other, named):
    settings = dict(task="listops", seq_len=32, model=MODEL, attention=SOFTMAX) | other
    checkpoint = save_like_lightning(LRAMaskedLMModule(**settings), tmp_path / "other.ckpt")
    classifier = LRAClassificationModule("listops", 32, MODEL, SOFTMAX)
    with pytest.raises(ValueError, match=rf"is of another model \({named}: checkpoint .*pretrain this configuration"):
        load_pretrained_encoder(classifier, checkpoint)


def with_old_names(checkpoint: Path) -> Path:
    """``checkpoint`` as it was written before model.attention_in_fp32 and Nystromformer's conv_kernel_size were renamed."""
    saved = torch.load(checkpoint, weights_only=True)
    settings = saved["hyper_parameters"]
    settings["model"]["attention_in_fp32"] = settings["model"].pop("attention_in_float32")
    settings["attention"]["hparams"]["conv_kernel_size"] = settings["attention"]["hparams"].pop("conv_window")
    torch.save(saved, checkpoint)
    return checkpoint


NYSTROM_MODEL = {**MODEL, "attention_in_float32": True}


def nystromformer(conv_window: int) -> dict:
    return {"name": "nystromformer", "hparams": {"num_landmarks": 8, "conv_window": conv_window}}


def test_a_checkpoint_written_before_a_rename_starts_the_classifier_under_todays_names(tmp_path):
    torch.manual_seed(0)
    pretrained = LRAMaskedLMModule("listops", 32, NYSTROM_MODEL, nystromformer(5))
    checkpoint = with_old_names(save_like_lightning(pretrained, tmp_path / "before-rename.ckpt"))
    classifier = LRAClassificationModule("listops", 32, NYSTROM_MODEL, nystromformer(5))
    load_pretrained_encoder(classifier, checkpoint)
    assert_encoder_is_the_pretrained_one(classifier, pretrained)
    # A renamed setting is compared by its value too: another window under the old name is another model.
    other = LRAClassificationModule("listops", 32, NYSTROM_MODEL, nystromformer(3))
    with pytest.raises(ValueError, match=r"is of another model \(attention: checkpoint .*'conv_window': 5"):
        load_pretrained_encoder(other, checkpoint)


def test_todays_default_runs_keep_their_config_hash():
    defining = {"task": {"name": "listops"}, "attention": SOFTMAX, "model": MODEL, "seed": 0}
    explicit = {**defining, "model": {**MODEL, "positions": "learned"}, "pretrain": {"objective": "none"}}
    assert results.config_hash(explicit) == results.config_hash(defining)
    assert results.config_hash({**explicit, "pretrain": {"objective": "mlm"}}) != results.config_hash(defining)
    assert results.config_hash({**defining, "model": {**MODEL, "positions": "rotary"}}) != results.config_hash(defining)


@pytest.mark.slow
def test_pretrain_then_finetune_end_to_end_and_the_pretraining_is_reused(tmp_path, run_train):
    sweep = run_train("pretrain=none,mlm", "attention=softmax", flags=["-m"])
    assert "2 finished" in sweep.stdout + sweep.stderr
    assert "listops / softmax / seed 0 / pretrain mlm" in sweep.stdout + sweep.stderr  # the summary tells the cells apart
    (pretraining,) = (tmp_path / "outputs" / "pretrain" / "listops").glob("softmax-mlm-seed0-*/results.json")
    pre = json.loads(pretraining.read_text())
    assert pre["status"] == "finished" and pre["stage"] == "pretraining" and pre["steps"] == 6
    (finetuned,) = (tmp_path / "outputs" / "listops" / "softmax").glob("*pretrain=mlm*/results.json")
    record = json.loads(finetuned.read_text())
    assert record["status"] == "finished" and record["pretrain"]["objective"] == "mlm"
    assert record["pretrained"]["steps"] == 6
    assert record["pretrained"]["checkpoint_sha256"] == file_sha256(Path(pre["best_checkpoint"]))
    assert record["config_hash"] != pre["config_hash"]
    (scratch,) = (tmp_path / "outputs" / "listops" / "softmax").glob("*pretrain=none*/results.json")
    assert json.loads(scratch.read_text())["pretrain"] == {"objective": "none"}
    # Another fine-tuning seed needs its own pretraining; the same configuration again reuses it.
    again = run_train("pretrain=mlm", "attention=softmax", "task.protocol.lr=0.002", "pretrain.protocol.lr=0.001")
    assert "Skipping" in again.stdout + again.stderr  # the pretraining run, already finished
    assert json.loads(pretraining.read_text())["finished_at"] == pre["finished_at"]


@pytest.mark.slow
def test_a_pretraining_folder_held_by_another_process_stops_a_fine_tuning_that_keeps_its_finished_run(tmp_path, run_train):
    """The pretraining stage's folder has the run folder's rule: one process at a time. A fine-tuning rerun that
    finds it held fails before training a step, so its earlier finished run stays where it was."""
    run_train("pretrain=mlm")
    (pretraining,) = (tmp_path / "outputs" / "pretrain" / "listops").glob("softmax-mlm-seed0-*/results.json")
    (finetuned,) = (tmp_path / "outputs" / "listops" / "softmax").glob("*/results.json")
    finished, pretrained = finetuned.read_text(), pretraining.read_text()
    with run_lock.held(pretraining.parent):
        process = run_train("pretrain=mlm", "rerun=true", check=False)
    assert process.returncode == 1 and "Traceback" not in process.stderr
    assert f"RunFolderBusy: {pretraining.parent} is in use by another run (pid {os.getpid()} on" in process.stderr
    assert finetuned.read_text() == finished and pretraining.read_text() == pretrained
    assert "the earlier finished run is back in" in process.stderr
