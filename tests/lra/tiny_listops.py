"""The tiny ListOps the lra tests train on (tests/lra/conftest.py, test_install.py, tests/test_readme.py).

Its own module, not conftest's: ``import conftest`` finds whichever conftest Python met first.
"""

# A ListOps small enough to train in seconds; the rest of the configuration is the real default.
TINY = [
    "task.seq_len=64",
    "task.data.max_length=60",
    "task.data.generator.num_train=64",
    "task.data.generator.num_val=32",
    "task.data.generator.num_test=24",
    "task.data.generator.min_length=5",
    "task.data.generator.max_length=60",
    "task.protocol.batch_size=16",
    "task.protocol.max_steps=6",
    "task.protocol.warmup_steps=2",
    "task.protocol.val_check_interval=3",
    "task.protocol.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
]
