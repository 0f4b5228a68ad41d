"""The LRA encoder's pooling and masking, and the original optimiser schedule."""

import re
from unittest.mock import PropertyMock, patch

import pytest
import torch

import lra.model
from lra.data.tasks import get_spec
from lra.model import (
    AttentionConfig,
    LRAClassifier,
    LRADualClassifier,
    LRAEncoder,
    ModelConfig,
    add_positions,
    build_classifier,
    dropout_add,
    masked_mean,
)
from lra.module import LRAClassificationModule, classification_loss
from yoso_cuda import ops, reference
from yoso_cuda.softmax import SEED_RANGE

NO_DROPOUT = ModelConfig(dropout=0.0)


def test_mean_pooling_sums_real_tokens_over_the_padded_length():
    torch.manual_seed(0)
    encoder = LRAEncoder(10, 12, NO_DROPOUT).eval()
    ids = torch.randint(1, 10, (2, 12))
    ids[1, 5:] = 0
    pooled = encoder(ids)

    # Recompute by hand: the encoder's features at real positions, summed, divided by 12.
    mask = ids != 0
    x = encoder.token_embedding(ids) + encoder.position_embedding(torch.arange(12))
    for block in encoder.blocks:
        x = block(x, mask)
    features = encoder.final_norm(x)
    expected = torch.stack([features[0].sum(0) / 12, features[1, :5].sum(0) / 12])
    torch.testing.assert_close(pooled, expected)


def test_padding_does_not_change_real_tokens_features():
    """A sequence padded to the model length pools to the same features whatever other rows hold."""
    torch.manual_seed(0)
    encoder = LRAEncoder(10, 16, NO_DROPOUT).eval()
    row = torch.randint(1, 10, (1, 16))
    row[0, 9:] = 0
    alone = encoder(row)
    batch = torch.cat([row, torch.randint(1, 10, (3, 16))])
    torch.testing.assert_close(encoder(batch)[:1], alone, rtol=1e-5, atol=1e-6)


def test_dual_encoder_head_reads_u_v_product_and_difference():
    torch.manual_seed(0)
    model = LRADualClassifier(2, LRAEncoder(10, 12, NO_DROPOUT)).eval()
    first, second = torch.randint(1, 10, (3, 12)), torch.randint(1, 10, (3, 12))
    second[:, 7:] = 0
    u, v = model.encoder(first), model.encoder(second)  # each document encoded alone
    expected = model.head(torch.cat([u, v, u * v, u - v], dim=-1))
    torch.testing.assert_close(model(first, second), expected)
    assert model.head[0].in_features == 4 * 64
    # The pair is ordered: swapping the documents changes u - v and so the logits.
    assert not torch.allclose(model(second, first), expected)
    with pytest.raises(ValueError, match="same \\(batch, seq\\) shape"):
        model(first, second[:, :6])


def module(task="retrieval", seq_len=8, **protocol):
    return LRAClassificationModule(
        task,
        seq_len,
        {"dropout": 0.0},
        {"name": "softmax", "hparams": {"dropout": 0.0}},
        **{"warmup_steps": 0, "max_steps": 10, **protocol},
    )


def test_module_feeds_every_input_of_the_batch():
    torch.manual_seed(0)
    lightning_module = module().eval()
    model = lightning_module.model
    assert isinstance(model, LRADualClassifier)
    batch = {
        "input_ids_0": torch.randint(1, 10, (4, 8)),
        "input_ids_1": torch.randint(1, 10, (4, 8)),
        "label": torch.tensor([0, 1, 1, 0]),
    }
    loss = lightning_module.training_step(batch, 0)
    expected = torch.nn.functional.cross_entropy(model(batch["input_ids_0"], batch["input_ids_1"]), batch["label"])
    torch.testing.assert_close(loss, expected)


def test_input_longer_than_the_model_is_an_error():
    encoder = LRAEncoder(10, 8)
    with pytest.raises(ValueError, match="seq <= 8"):
        encoder(torch.ones(1, 9, dtype=torch.long))


def test_paper_sizes_are_the_defaults():
    model = build_classifier(get_spec("listops"), 2048, ModelConfig(), AttentionConfig())
    assert isinstance(model, LRAClassifier) and model.head[2].out_features == 10
    assert len(model.encoder.blocks) == 2
    attention = model.encoder.blocks[0].attention
    assert (attention.num_heads, attention.head_dim) == (2, 32)
    assert model.encoder.token_embedding.embedding_dim == 64
    assert model.encoder.blocks[0].mlp[0].out_features == 128


def test_one_cycle_schedule_and_beta1_cycling_of_the_original():
    config = module(lr=1e-4, warmup_steps=10, max_steps=100).configure_optimizers()
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert optimizer.defaults["eps"] == 1e-6 and optimizer.defaults["weight_decay"] == 0.0
    lrs, betas = [], []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        betas.append(optimizer.param_groups[0]["betas"][0])
        optimizer.step()
        schedule.step()
    assert lrs[0] == pytest.approx(1e-4 / 25)
    assert max(lrs) == pytest.approx(1e-4) and lrs.index(max(lrs)) == 9
    assert lrs[-1] == pytest.approx(1e-4 / 25 / 1e4, rel=0.5, abs=1e-7)
    assert all(b <= a for a, b in zip(lrs[9:], lrs[10:])), "linear decay after the warmup"
    assert betas[0] == pytest.approx(0.95) and betas[9] == pytest.approx(0.85) and betas[-1] == pytest.approx(0.95, abs=0.002)


def test_warmup_must_be_shorter_than_training():
    for warmup in (100, 1, -1):
        with pytest.raises(ValueError, match="warmup_steps"):
            module(warmup_steps=warmup, max_steps=100)


def test_a_checkpoint_rebuilds_its_model_alone(tmp_path):
    """``load_from_checkpoint(path)`` with no other argument gives the same classifier: same class, same outputs."""
    torch.manual_seed(0)
    trained = LRAClassificationModule(
        "pathfinder",
        16,
        {"dim": 16, "depth": 1, "num_heads": 2, "head_dim": 8, "ffn_dim": 32},
        {"name": "yoso_e", "hparams": {}},
        warmup_steps=0,
        max_steps=10,
    )
    path = tmp_path / "model.ckpt"
    torch.save(
        {"state_dict": trained.state_dict(), "hyper_parameters": dict(trained.hparams), "pytorch-lightning_version": "2.4.0"},
        path,
    )
    rebuilt = LRAClassificationModule.load_from_checkpoint(path).eval()
    ids = torch.randint(0, 257, (3, 16))
    torch.testing.assert_close(rebuilt(input_ids=ids), trained.eval()(input_ids=ids))
    core = rebuilt.model.encoder.blocks[0].attention.attention
    assert core.config.expectation and core.hash_bits == 4 and rebuilt.model.head[2].out_features == 2


def test_an_unknown_model_setting_is_named():
    with pytest.raises(ValueError, match=r"unknown model setting\(s\) \['widht'\]"):
        ModelConfig.from_dict({"widht": 3})


def test_a_renamed_model_setting_names_its_new_name():
    with pytest.raises(ValueError, match=r"^model.attention_in_fp32 is now called model.attention_in_float32"):
        ModelConfig.from_dict({"attention_in_fp32": False})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"dim": "64"}, "model.dim must be int, got '64'"),
        ({"depth": True}, "model.depth must be int, got True"),
        ({"attention_in_float32": 1}, "model.attention_in_float32 must be bool, got 1"),
    ],
)
def test_a_model_setting_of_the_wrong_type_is_named(values, message):
    """The same rule as an attention's hyperparameters (attention_zoo.check_fields): a YAML typo is one clear error,
    not a crash inside torch."""
    with pytest.raises(TypeError, match=re.escape(message)):
        ModelConfig.from_dict(values)


def test_an_int_model_dropout_is_a_float():
    dropout = ModelConfig.from_dict({"dropout": 0}).dropout
    assert dropout == 0.0 and isinstance(dropout, float)


# The step's operators (issue 42): each piece against the formula it replaces, then a short training against the step
# before it, written out with nn.Dropout, +, (features * mask).mean(1) and F.cross_entropy.


@pytest.fixture
def bernoulli_dropout(monkeypatch):
    """dropout_add without the fused kernel: F.dropout's own draws (where the kernels are not built, and compiled)."""
    monkeypatch.setattr(lra.model, "has_kernel", lambda device: False)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_add_draws_and_computes_what_nn_dropout_and_the_sum_do(p, bernoulli_dropout):
    dropout = torch.nn.Dropout(p).train()
    y = torch.randn(3, 50, 8, requires_grad=True)
    residual = torch.randn(3, 50, 8, requires_grad=True)
    grad = torch.randn(3, 50, 8)
    results = {}
    for name, step in {
        "dropped": lambda: dropout(y),
        "dropout_add": lambda: dropout_add(dropout, y),
        "summed": lambda: residual + dropout(y),
        "dropout_add with residual": lambda: dropout_add(dropout, y, residual),
    }.items():
        torch.manual_seed(1)
        out = step()
        out.backward(grad)
        results[name] = (out.detach(), y.grad, residual.grad)
        y.grad = residual.grad = None
    out, grad_y, _ = results["dropout_add"]
    expected, expected_grad_y, _ = results["dropped"]
    assert torch.equal(out, expected) and torch.equal(grad_y, expected_grad_y)  # the same draws, the same products
    assert 0 < (out == 0).float().mean() < 1
    out, grad_y, grad_residual = results["dropout_add with residual"]
    expected, expected_grad_y, expected_grad_residual = results["summed"]
    torch.testing.assert_close(out, expected)
    assert torch.equal(grad_y, expected_grad_y) and torch.equal(grad_residual, expected_grad_residual)


@pytest.mark.skipif(not ops.kernels().cpu.loaded, reason="CPU kernels not built")
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_add_on_the_kernel_drops_the_reference_mask_of_a_seed_from_torchs_generator(p):
    dropout = torch.nn.Dropout(p).train()
    y, residual, grad = (torch.randn(3, 50, 8, requires_grad=True) for _ in range(3))
    torch.manual_seed(1)
    out = dropout_add(dropout, y, residual)
    out.backward(grad)
    torch.manual_seed(1)
    seed = torch.randint(SEED_RANGE, (1,)).item()
    factor = reference.element_keep(seed, y.numel(), p).view(y.shape) * torch.tensor(1 / (1 - p), dtype=torch.float32)
    torch.testing.assert_close(out, residual.detach() + y.detach() * factor, rtol=1e-6, atol=1e-6)
    assert torch.equal(y.grad, grad * factor) and torch.equal(residual.grad, grad)
    assert 0 < (factor == 0).float().mean() < 1


def test_dropout_add_without_dropout_or_outside_float32_is_the_plain_sum():
    y, residual = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    for dropout in (torch.nn.Dropout(0.1).eval(), torch.nn.Dropout(0.0).train()):
        assert dropout_add(dropout, y) is y
        assert torch.equal(dropout_add(dropout, y, residual), residual + y)
    dropout = torch.nn.Dropout(0.5).train()
    half = y.bfloat16()
    torch.manual_seed(1)
    expected = residual + dropout(half)  # nn.Dropout's bf16 noise
    torch.manual_seed(1)
    assert torch.equal(dropout_add(dropout, half, residual), expected)


def test_a_nan_in_a_padded_tokens_hidden_state_reaches_neither_the_pooled_output_nor_the_token_features():
    """The padding id's embedding NaN: every padded position's hidden state is NaN in every layer, and each sequence's
    pooled features and real tokens' features are those of a finite padding embedding, to the bit."""
    torch.manual_seed(0)
    encoder = LRAEncoder(10, 12, NO_DROPOUT).eval()
    ids = torch.randint(1, 10, (3, 12))
    ids[1, 5:] = 0
    ids[2, ::3] = 0
    pooled, tokens = encoder(ids), encoder.token_features(ids)
    with torch.no_grad():
        encoder.token_embedding.weight[0] = float("nan")
    assert torch.equal(encoder(ids), pooled)
    assert torch.equal(encoder.token_features(ids), tokens)


def test_masked_mean_is_the_mean_of_the_zeroed_features_in_float64():
    torch.manual_seed(0)
    features = torch.randn(3, 40, 8)
    mask = torch.rand(3, 40) < 0.6
    expected = (features.double() * mask[..., None]).mean(dim=1)
    torch.testing.assert_close(masked_mean(features, mask).double(), expected, rtol=1e-6, atol=1e-7)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the product stays in the features' float32
        assert masked_mean(features, mask).dtype == torch.float32


def test_add_positions_sums_the_gradient_over_the_batch():
    torch.manual_seed(0)
    x = torch.randn(5, 30, 8, requires_grad=True)
    positions = torch.randn(30, 8, requires_grad=True)
    grad = torch.randn(5, 30, 8)
    out = add_positions(x, positions)
    grad_x, grad_positions = torch.autograd.grad(out, (x, positions), grad)
    assert torch.equal(out, x + positions) and torch.equal(grad_x, grad)
    torch.testing.assert_close(grad_positions.double(), grad.double().sum(0), rtol=1e-6, atol=1e-6)


def test_the_classification_loss_is_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(16, 10, requires_grad=True, dtype=torch.float64)
    targets = torch.randint(0, 10, (16,))
    loss = classification_loss(logits.float(), targets)
    (grad,) = torch.autograd.grad(loss, logits)
    expected = torch.nn.functional.cross_entropy(logits, targets)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-8)


def previous_step_loss(lra_module, batch):
    """The step's loss as it was computed before issue 42: nn.Dropout modules and sums, the position embedding
    gathered, the zeroed features' mean, F.cross_entropy."""
    encoder, head = lra_module.model.encoder, lra_module.model.head
    input_ids = batch["input_ids"]
    mask = input_ids != 0
    x = encoder.token_embedding(input_ids) + encoder.position_embedding(torch.arange(input_ids.shape[1]))
    x = encoder.embedding_dropout(x)
    for block in encoder.blocks:
        x = x + block.attention_dropout(block.attention(block.attention_norm(x), mask))
        x = x + block.mlp(block.mlp_norm(x))
    logits = head((encoder.final_norm(x) * mask[..., None]).mean(dim=1))
    return torch.nn.functional.cross_entropy(logits, batch["label"])


@pytest.mark.parametrize("attention", ["none", "softmax"])
def test_a_short_training_takes_the_losses_of_the_previous_step(attention, bernoulli_dropout):
    """Eight steps with dropout 0.1 from one seed: the module's step and the previous step's formula (above), each
    with the module's AdamW and OneCycleLR, give the same losses to float rounding, from the same dropout draws
    (F.dropout's: the fused kernel draws its own)."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        input_ids = torch.randint(1, 10, (6, 24), generator=generator)
        input_ids[torch.arange(24) >= torch.randint(4, 25, (6, 1), generator=generator)] = 0
        batches.append({"input_ids": input_ids, "label": torch.randint(0, 10, (6,), generator=generator)})
    losses = {}
    for name, step_loss in {"now": lambda m, batch: m.training_loss(batch)[0], "before": previous_step_loss}.items():
        torch.manual_seed(0)
        lra_module = LRAClassificationModule(
            "listops", 24, {"dropout": 0.1}, {"name": attention}, lr=1e-3, warmup_steps=2, max_steps=8
        ).train()
        optimisation = lra_module.configure_optimizers()
        optimizer, schedule = optimisation["optimizer"], optimisation["lr_scheduler"]["scheduler"]
        losses[name] = []
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(lra_module, batch)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses[name].append(loss.detach())
    now, before = torch.stack(losses["now"]), torch.stack(losses["before"])
    torch.testing.assert_close(now, before, rtol=1e-6, atol=0.0)  # they differ by about 1e-7
    assert (now[1:] != now[0]).all()  # the parameters moved: later losses test the updates too


def test_the_first_non_finite_training_loss_is_noted_on_the_device_and_raised_with_its_step_when_checked():
    from lra.module import Diverged

    lra_module = module()
    for step, loss in enumerate([2.5, 2.25, float("nan"), float("inf"), 1.0]):
        lra_module.watch_for_divergence(torch.tensor(loss), step)
        if step == 1:
            lra_module.check_divergence()  # all finite so far: nothing to say
    with pytest.raises(Diverged, match=r"not finite from step 2 \(the last finite loss 1\)") as raised:
        lra_module.check_divergence()
    assert raised.value.step == 2  # the first non-finite step, not a later one; the last finite loss is the latest


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_gradient_under_a_finite_loss_diverges_the_run_at_its_step(bad):
    """An overflow in the backward leaves the loss finite: the gradients are watched too, before the update."""
    from lra.module import Diverged

    lra_module = module()
    parameter = next(lra_module.parameters())
    for step in range(4):
        lra_module.watch_for_divergence(torch.tensor(2.0 - step / 10), step)
        for p in lra_module.parameters():
            p.grad = torch.zeros_like(p)
        if step == 2:
            parameter.grad.view(-1)[0] = bad
        with patch.object(LRAClassificationModule, "global_step", new_callable=PropertyMock, return_value=step):
            lra_module.on_before_optimizer_step(None)
        if step == 1:
            lra_module.check_divergence()  # all finite so far
    with pytest.raises(Diverged, match=r"gradients are not finite from step 2 \(the last finite loss 1\.7\)") as raised:
        lra_module.check_divergence()
    assert raised.value.step == 2


class OutputsNaNWhenEvaluating(LRAClassificationModule):
    """A model whose outputs are finite in training and NaN in evaluation (as a numerics bug of eval mode would be)."""

    def evaluation_loss(self, batch, split):
        loss = super().evaluation_loss(batch, split)
        return loss * float("nan")


@pytest.mark.parametrize("split", ["val", "test"])
def test_an_evaluation_whose_loss_is_not_finite_stops_the_run_as_diverged(tmp_path, split):
    """Evaluation logits that were all NaN gave a finished run, its test 10.94% tabled: an accuracy of argmax over NaN."""
    import pytorch_lightning as pl

    from lra.module import Diverged, EvaluationNotFinite

    generator = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(1, 10, (4, 16), generator=generator)} for _ in range(4)]
    for sample in samples:
        sample["label"] = torch.randint(0, 10, (4,), generator=generator)
    batches = torch.utils.data.DataLoader(samples, batch_size=None)  # each already a batch of 4
    lra_module = (OutputsNaNWhenEvaluating if split == "val" else LRAClassificationModule)(
        "listops", 16, {"dropout": 0.0}, {"name": "none"}, lr=1e-3, warmup_steps=2, max_steps=4
    )
    trainer = pl.Trainer(
        max_steps=4, val_check_interval=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, use_distributed_sampler=False,
    )  # fmt: skip
    if split == "val":
        with pytest.raises(EvaluationNotFinite, match=r"the validation loss is not finite \(nan\) after step 2") as raised:
            trainer.fit(lra_module, train_dataloaders=batches, val_dataloaders=batches)
    else:
        trainer.fit(lra_module, train_dataloaders=batches, val_dataloaders=batches)
        lra_module.__class__ = OutputsNaNWhenEvaluating
        with pytest.raises(EvaluationNotFinite, match=r"the test loss is not finite \(nan\) after step 4") as raised:
            trainer.test(lra_module, dataloaders=batches, verbose=False)
    assert isinstance(raised.value, Diverged), "recorded as diverged (lra.run.recorded), never a result"
