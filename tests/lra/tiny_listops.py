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


def outermost_operators_and_labels(folder, split: str) -> list[tuple[str, int]]:
    """Each row of ``folder``'s ``basic_<split>.tsv`` read as text: the first bracketed word of its source (``MAX``) and
    its label."""
    rows = (folder / f"basic_{split}.tsv").read_text().splitlines()[1:]  # past the header
    pairs = []
    for row in rows:
        source, label = row.split("\t")
        pairs.append((next(word for word in source.split() if word.startswith("[")).removeprefix("["), int(label)))
    return pairs


def operator_rule_from_text(folder) -> tuple[dict[str, int], int]:
    """The outermost-operator rule of ``folder``'s training split, from its text: each operator's most common label
    (the smaller of a tie), and the most common label overall for the operators never outermost there."""

    def most_common(labels: list[int]) -> int:
        return max(sorted(set(labels)), key=labels.count)

    train = outermost_operators_and_labels(folder, "train")
    answers = {name: most_common([label for top, label in train if top == name]) for name in sorted({top for top, _ in train})}
    return answers, most_common([label for _, label in train])
