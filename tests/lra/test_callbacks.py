"""``lra.callbacks.TrainingSpeed``: training batches only, loading between them included, evaluations excluded."""

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
