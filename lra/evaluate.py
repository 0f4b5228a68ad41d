"""Test a run's checkpoint again, on any split: ``python -m lra.evaluate RUN_FOLDER``.

    python -m lra.evaluate outputs/listops/none/experiment=table3,seed=1
    python -m lra.evaluate RUN_FOLDER --checkpoint last --split val --answers answers.csv
    python -m lra.evaluate RUN_FOLDER --data generator.seed=1 generator.num_train=1 generator.num_val=1

``RUN_FOLDER`` is a classification run's output folder (``lra.train``'s, with its ``results.json``, its Hydra
configuration in ``.hydra/`` and its ``checkpoints/``). The checkpoint (by default the best-validation one the run
tested) is read as the run reads its own: its recorded digest checked and its run identity matched
(:mod:`lra.checkpoints`). Its predictions on the whole split, in the split's order, are counted against the labels:
the accuracy with its binomial standard error (beside the run's recorded test accuracy), which answers the model
gives how often, and the labels' own counts, so that a model answering one class is seen as such. ``--answers``
writes each sample's label and answer as CSV (on ListOps with its outermost operator). ``--data KEY=VALUE ...``
changes the run's ``task.data`` (a generated split drawn anew: ``--data generator.seed=1``), to test the checkpoint on
data the run never saw. What the model
draws as it answers (YOSO's hashes) comes from ``--seed`` (0), so an evaluation repeats; ``--summary FILE.csv``
appends a row per evaluation, to gather a loop of them in one table.

On ListOps it also counts the answers by each sequence's outermost operator, beside what answering with that
operator's most common label in the run's training split scores (:class:`lra.data.listops.OperatorRule`): a model at
that rule's accuracy, answering 9 to every MAX and 0 to every MIN, has learned the outermost operator and nothing below.

It evaluates in the run's precision (float32, or the autocast of a mixed-precision run, as Lightning's precision plugin
applies it), on the GPU where there is one: on the device the run tested on, its answers are the run's own.
"""

from __future__ import annotations

import argparse
import collections
import csv
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, flag_override
from omegaconf.errors import ConfigKeyError
from pytorch_lightning.plugins.precision import MixedPrecision, Precision

from . import checkpoints, config
from .data.listops import OPERATORS, VOCAB, OperatorRule, outermost_operators
from .data.tasks import resolve
from .datamodule import LRADataModule
from .devices import device_name
from .module import LRAClassificationModule
from .results import FLOAT32, PRETRAINING, RunRecord

SPLITS = ("test", "val", "train")
RECORD, CONFIG, CHECKPOINTS = "results.json", Path(".hydra") / "config.yaml", "checkpoints"


class CannotEvaluate(ValueError):
    """A run folder or checkpoint that cannot be evaluated, in one message naming what is wrong and what to do."""


@dataclass
class Evaluation:
    """A checkpoint's answers on one split: ``labels[i]`` and ``answers[i]`` of its i-th sample."""

    split: str
    labels: list[int]
    answers: list[int]

    @property
    def accuracy(self) -> float:
        return sum(a == b for a, b in zip(self.labels, self.answers)) / len(self.labels)

    @property
    def standard_error(self) -> float:
        """The binomial sqrt(p (1 - p) / n) of the accuracy on this split's n samples."""
        return math.sqrt(self.accuracy * (1 - self.accuracy) / len(self.labels))


def run_folder(folder: Path) -> tuple[RunRecord, DictConfig]:
    """A classification run's record and its configuration (Hydra's ``.hydra/config.yaml``, unresolved)."""
    if not (folder / RECORD).is_file():
        raise CannotEvaluate(f"{folder} has no {RECORD}: give the output folder of a run of python -m lra.train")
    try:
        record = RunRecord.read(folder / RECORD)
    except (OSError, ValueError, TypeError) as error:
        raise CannotEvaluate(f"{folder / RECORD} cannot be read ({error}): it is damaged; run the cell again") from None
    if record.stage == PRETRAINING:
        raise CannotEvaluate(
            f"{folder} is a pretraining run (masked prediction, no classes to answer): evaluate the run fine-tuned from it"
        )
    if not (folder / CONFIG).is_file():
        raise CannotEvaluate(f"{folder} has no {CONFIG}, the configuration the run composed: it is not a run's whole folder")
    config.register()  # the project's resolvers, which the saved configuration may name
    return record, OmegaConf.load(folder / CONFIG)


def checkpoint_path(folder: Path, record: RunRecord, choice: str) -> Path:
    """``best``: the checkpoint the run tested (the latest step's ``best-step*.ckpt`` of a run not finished); ``last``: the one
    it resumes from; else a path."""
    if choice not in ("best", "last"):
        return Path(choice)
    if choice == "last":
        return folder / CHECKPOINTS / "last.ckpt"
    if record.best_checkpoint:  # written where the run ran: the file of that name in this folder
        return folder / CHECKPOINTS / Path(record.best_checkpoint).name
    bests = sorted((folder / CHECKPOINTS).glob("best-step*.ckpt"), key=lambda path: int(re.search(r"\d+", path.name)[0]))
    if not bests:
        raise CannotEvaluate(f"{folder / CHECKPOINTS} holds no best-step*.ckpt: the run has not evaluated yet")
    return bests[-1]


def load_model(path: Path, record: RunRecord) -> tuple[LRAClassificationModule, int]:
    """The classifier saved in the checkpoint ``path`` of ``record``'s run, and the step it was saved at."""
    if not path.is_file():
        raise CannotEvaluate(f"{path} does not exist: name a checkpoint of the run (best, last or a path)")
    fix = "name a checkpoint this run wrote"
    contents = checkpoints.read_own(path, record.config_hash, record.seed, fix)
    module = LRAClassificationModule(**contents["hyper_parameters"])
    module.load_state_dict(contents["state_dict"])
    return module, int(contents["global_step"])


def precision_of(record: RunRecord, device: torch.device) -> Precision:
    """Lightning's precision plugin for the run's precision on ``device``: its forward context is the autocast the run
    tested under."""
    if record.precision in (None, FLOAT32):
        return Precision()
    if record.precision.endswith("-mixed"):
        return MixedPrecision(record.precision, device.type)
    raise CannotEvaluate(f"the run trained in {record.precision}: lra.evaluate tests float32 and mixed-precision runs")


def task_data(cfg: DictConfig, changes: list[str]) -> dict:
    """The run's ``task.data``, with ``changes`` (``KEY=VALUE``, a key of it, e.g. ``generator.seed=1``) applied."""
    data = cfg.task.data
    if changes:
        malformed = [change for change in changes if "=" not in change]
        if malformed:
            raise CannotEvaluate(f"--data {malformed[0]}: give KEY=VALUE, a key of the run's task.data (generator.seed=1)")
        try:
            with flag_override(data, "struct", True):  # a key the run's data does not have is refused, not added
                data = OmegaConf.merge(data, OmegaConf.from_dotlist(changes))
        except ConfigKeyError as error:
            key = error.full_key.removeprefix("task.data.")
            parent = key.rpartition(".")[0]
            known = OmegaConf.select(cfg.task.data, parent) if parent else cfg.task.data
            raise CannotEvaluate(
                f"--data: the run's task.data has no {key} ({parent or 'its'} keys: {', '.join(known)})"
            ) from None
    return OmegaConf.to_container(data, resolve=True)


def data_of(cfg: DictConfig, batch_size: int, changes: list[str]) -> LRADataModule:
    """The run's task data, with ``changes``, ready to read: generated or prepared here where missing, as training
    would."""
    data = task_data(cfg, changes)
    try:
        source = resolve(cfg.task.name, data).data_source  # decided without reading or generating
    except ValueError as error:  # a changed task.data.source the task does not have
        raise CannotEvaluate(f"--data {' '.join(changes)}: {error}") from None
    if source != "generated" and any(change.startswith("generator.") for change in changes):
        raise CannotEvaluate(
            f"--data {' '.join(changes)}: the data read is {source}'s, which the generator's settings do not change; "
            "add source=generated to draw it from the generator"
        )
    datamodule = LRADataModule(cfg.task.name, cfg.task.seq_len, data, batch_size)
    datamodule.prepare_data()
    datamodule.setup()
    return datamodule


@torch.no_grad()
def evaluate(
    module: LRAClassificationModule, datamodule: LRADataModule, split: str, device: torch.device, precision: Precision
) -> Evaluation:
    """``module``'s answers on all of ``split``, in its order, under ``precision``, in evaluation mode (no dropout)."""
    module.to(device).eval()
    labels, answers = [], []
    for batch in datamodule.in_order(split):
        batch = {key: value.to(device) for key, value in batch.items()}
        with precision.forward_context():
            _, logits, targets = module.evaluation_outputs(batch)  # (b, classes), (b,)
        labels += targets.tolist()
        answers += logits.argmax(-1).tolist()
    return Evaluation(split, labels, answers)


def input_ids(datamodule: LRADataModule, split: str):
    """``split``'s token ids ``(n, length)``, memory-mapped, in the order :meth:`LRADataModule.in_order` reads them."""
    return datamodule.task_data.splits[split].split.arrays["input_ids"]


def operator_rule(cfg: DictConfig, datamodule: LRADataModule, data_changes: list[str]) -> OperatorRule:
    """The outermost-operator rule of the run's own training split: the evaluated data's where the run's is unchanged,
    else the run's data read (or generated) again, since a changed draw's training split is not what the model
    learned from (and is often one sequence)."""
    trained_on = data_of(cfg, datamodule.batch_size, []) if data_changes else datamodule
    return OperatorRule.fit(input_ids(trained_on, "train"), trained_on.task_data.splits["train"].split.labels)


def rule_accuracy(rule: OperatorRule, split_ids, labels: list[int]) -> float:
    """The share of the split (``split_ids``: its token ids, in order) that ``rule`` answers right."""
    return sum(answer == label for answer, label in zip(rule.predict(split_ids).tolist(), labels)) / len(labels)


#: An outermost operator's token id -> its name (MAX), as the report and the answers file write it.
OPERATOR_NAMES = {VOCAB[operator]: operator.removeprefix("[") for operator in OPERATORS}


def by_outermost_operator(evaluation: Evaluation, operators: list[str], rule: OperatorRule, rule_score: float) -> list[str]:
    """The report's ListOps lines: the outermost-operator rule's accuracy on the evaluated split (``rule_score``), and
    the model's answers to the sequences under each outermost operator (``operators``: each sequence's, in order)."""
    lines = [
        f"answering the most common training label of the outermost operator ({rule.describe()}) scores {100 * rule_score:.2f}%",
        "its answers by the outermost operator:",
    ]
    for operator in sorted(set(operators)):
        under = [i for i, top in enumerate(operators) if top == operator]
        picked = [evaluation.answers[i] for i in under]
        right = sum(evaluation.answers[i] == evaluation.labels[i] for i in under)
        share = f"{100 * right / len(under):.2f}%"
        lines.append(f"  {operator:<4}{len(under)} sequences, {share} right: {counts(picked)}")
    return lines


def counts(values: list[int]) -> str:
    """``class: count (share)``, the most common first."""
    return "  ".join(f"{value}: {n} ({100 * n / len(values):.2f}%)" for value, n in collections.Counter(values).most_common())


def report(
    evaluation: Evaluation,
    record: RunRecord,
    checkpoint: Path,
    step: int,
    device: torch.device,
    data_source: str,
    data_changes: list[str],
) -> str:
    precision = "float32" if record.precision in (None, FLOAT32) else record.precision
    data = f"the run's {data_source} data"
    if data_changes:
        data = f"{data_source} data, the run's changed by {' '.join(data_changes)}: not what the run trained and tested on"
    lines = [
        f"{record.task} / {record.row or record.attention} / seed {record.seed}: {checkpoint.name} (step {step}) on the "
        f"{evaluation.split} split, {len(evaluation.labels)} samples, {precision} on {device.type}",
        f"data: {data}",
        f"accuracy {100 * evaluation.accuracy:.2f}% ± {100 * evaluation.standard_error:.2f} (binomial standard error)",
    ]
    tested_by_the_run = (
        evaluation.split == "test"
        and not data_changes
        and record.test_acc is not None
        and record.best_checkpoint
        and Path(record.best_checkpoint).name == checkpoint.name
    )
    if tested_by_the_run:
        lines[-1] += f"; the run tested it at {100 * record.test_acc:.2f}% on {record.device}"
    labels = collections.Counter(evaluation.labels)
    majority, n = labels.most_common(1)[0]
    lines += [
        f"its answers: {counts(evaluation.answers)}",
        f"the labels:  {counts(evaluation.labels)}",
        f"always answering the most common label ({majority}) scores {100 * n / len(evaluation.labels):.2f}%",
    ]
    return "\n".join(lines)


def write_answers(evaluation: Evaluation, path: Path, operators: list[str] | None = None) -> None:
    """One row per sample, in the split's order: its index, label, the model's answer, whether they match and, on
    ListOps (``operators``), its outermost operator."""
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["sample", "label", "answer", "correct", *(["outermost_operator"] if operators else [])])
        for index, (label, answer) in enumerate(zip(evaluation.labels, evaluation.answers)):
            writer.writerow([index, label, answer, int(label == answer), *([operators[index]] if operators else [])])


SUMMARY_COLUMNS = (
    "task", "row", "seed", "checkpoint", "step", "split", "data_changes", "samples", "accuracy", "standard_error",
    "operator_rule_accuracy", "run_test_acc", "evaluation_seed", "device", "torch_version", "evaluated_at",
)  # fmt: skip


def check_summary(path: Path) -> None:
    """A ``--summary`` file that exists must have this version's columns, or its rows would not line up."""
    if path.is_file() and path.stat().st_size:
        with open(path, newline="") as file:
            header = tuple(next(csv.reader(file), ()))
        if header != SUMMARY_COLUMNS:
            raise CannotEvaluate(
                f"--summary {path}: its columns are {', '.join(header)}, not this version's "
                f"({', '.join(SUMMARY_COLUMNS)}); give a new file"
            )


def append_summary(
    path: Path,
    evaluation: Evaluation,
    record: RunRecord,
    checkpoint: Path,
    step: int,
    data_changes: list[str],
    seed: int,
    device: torch.device,
    operator_rule_accuracy: float | None,
) -> None:
    """One row for this evaluation at the end of ``path`` (its header first where the file is new): a loop of
    evaluations, e.g. over test draws, in one table. ``operator_rule_accuracy``: the outermost-operator rule's on the
    same split (ListOps; empty for the other tasks)."""
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as file:
        writer = csv.writer(file)
        if new:
            writer.writerow(SUMMARY_COLUMNS)
        writer.writerow([
            record.task, record.row or record.attention, record.seed, checkpoint.name, step, evaluation.split,
            " ".join(data_changes), len(evaluation.labels), f"{evaluation.accuracy:.6f}", f"{evaluation.standard_error:.6f}",
            "" if operator_rule_accuracy is None else f"{operator_rule_accuracy:.6f}",
            "" if record.test_acc is None else f"{record.test_acc:.6f}", seed, device_name(device), torch.__version__,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ])  # fmt: skip


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lra.evaluate", description="Test a run's checkpoint again, on any split, and count its answers."
    )
    parser.add_argument("run_folder", type=Path, help="a classification run's output folder (with results.json)")
    parser.add_argument("--checkpoint", default="best", help="best (the one the run tested), last, or a checkpoint's path")
    parser.add_argument("--split", choices=SPLITS, default="test", help="which split, read whole and in order (test)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per forward pass (32)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda[:N]")
    parser.add_argument("--answers", type=Path, help="write each sample's label and answer to this CSV file")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="torch's seed for what the model draws as it answers (YOSO's hashes), so an evaluation repeats (0)",
    )
    parser.add_argument("--summary", type=Path, help="append one row for this evaluation to this CSV file")
    parser.add_argument(
        "--data",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="change the run's task.data, e.g. a generated split drawn anew: generator.seed=1 (see docs/training.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.batch_size < 1:
        raise SystemExit(f"error: --batch-size must be at least 1, not {args.batch_size}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {args.device}, but torch sees no CUDA GPU here: use --device cpu")
    try:
        if args.summary is not None:
            check_summary(args.summary)
        record, cfg = run_folder(args.run_folder)
        checkpoint = checkpoint_path(args.run_folder, record, args.checkpoint)
        module, step = load_model(checkpoint, record)
        device = torch.device(args.device)
        datamodule = data_of(cfg, args.batch_size, args.data)
        torch.manual_seed(args.seed)
        evaluation = evaluate(module, datamodule, args.split, device, precision_of(record, device))
    except (CannotEvaluate, checkpoints.CheckpointRefused, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(report(evaluation, record, checkpoint, step, device, datamodule.task_data.data_source, args.data))
    rule_score, operators = None, None
    if record.task == "listops":
        try:
            rule, split_ids = operator_rule(cfg, datamodule, args.data), input_ids(datamodule, args.split)
            rule_score = rule_accuracy(rule, split_ids, evaluation.labels)
            operators = [OPERATOR_NAMES[top] for top in outermost_operators(split_ids).tolist()]
            print("\n".join(by_outermost_operator(evaluation, operators, rule, rule_score)))
        except ValueError as error:  # the run's training data unreadable, or sequences not starting with an operator
            print(f"note: no outermost-operator rule: {error}")
    if args.answers is not None:
        write_answers(evaluation, args.answers, operators)
        print(f"each sample's label and answer: {args.answers}")
    if args.summary is not None:
        append_summary(args.summary, evaluation, record, checkpoint, step, args.data, args.seed, device, rule_score)
        print(f"its row appended to {args.summary}")


if __name__ == "__main__":
    main()
