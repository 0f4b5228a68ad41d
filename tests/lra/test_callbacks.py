"""``lra.callbacks``: TrainingSpeed counts training batches only, loading between them included, evaluations
excluded; StepProgressBar is one bar over the run's steps that a resume continues."""

import pytorch_lightning as pl
import torch

from lra import callbacks


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Module:
    device = torch.device("cpu")

    def __init__(self):
        self.logged = {}

    def log(self, name, value, **options):
        self.logged[name] = (value, options)


def test_the_rate_counts_training_batches_and_the_loading_between_them_but_no_evaluation(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks.time, "perf_counter", clock)
    speed, module = callbacks.TrainingSpeed(), Module()
    assert callbacks.steps_per_second([speed]) is None  # no step yet

    def batch(loading, step):
        clock.now += loading  # the loader, before the batch starts
        speed.on_train_batch_start(None, module, None, 0)
        clock.now += step
        speed.on_train_batch_end(None, module, None, None, 0)

    batch(loading=100.0, step=1.0)  # start-up: only the step counts
    batch(loading=1.0, step=1.0)  # 2 s: its loading counts
    speed.on_validation_start(None, module)
    clock.now += 50.0  # the evaluation and its checkpoint
    batch(loading=0.5, step=1.5)  # from its own start: 1.5 s
    assert (speed.steps, speed.seconds) == (3, 4.5)
    assert callbacks.steps_per_second([object(), speed]) == round(3 / 4.5, 4)
    value, options = module.logged["train/steps_per_s"]
    assert value == 3 / 4.5 and options == {"prog_bar": True, "logger": False}


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
        return torch.utils.data.DataLoader(data, batch_size=4)  # 3 steps an epoch


def fit(max_steps, root, resume_from=None):
    bar = callbacks.StepProgressBar()
    trainer = pl.Trainer(
        max_steps=max_steps, callbacks=[bar], logger=False, default_root_dir=root, enable_model_summary=False, accelerator="cpu"
    )
    trainer.fit(Regression(), ckpt_path=resume_from)
    return trainer, bar.train_progress_bar


def test_the_progress_bar_counts_the_runs_steps_across_epochs_and_a_resume_continues_it(tmp_path):
    trainer, bar = fit(7, tmp_path)
    assert (bar.initial, bar.n, bar.total, bar.unit) == (0, 7, 7, "step"), "one bar over 7 steps (3 epochs), not one per epoch"
    checkpoint = tmp_path / "at7.ckpt"
    trainer.save_checkpoint(checkpoint)
    trainer, bar = fit(12, tmp_path, resume_from=checkpoint)
    # tqdm's rate and time left are (n - initial) / elapsed: the 5 steps of this process only
    assert (bar.initial, bar.n, bar.total) == (7, 12, 12)
