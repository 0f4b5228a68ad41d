"""The run's Lightning loggers (``conf/logger/``)."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import CSVLogger as LightningCSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.loggers.logger import rank_zero_experiment

from .files import write_atomically


class AtomicExperimentWriter(ExperimentWriter):
    """Lightning's metrics.csv writer, each save written whole (:func:`lra.files.write_atomically`): Lightning
    appends the new rows in place, where a kill or a full disk could leave half a row for the resumed run to read."""

    def save(self) -> None:
        if not self.metrics:
            return
        self._record_new_keys()
        self.write_rows(self.saved_rows() + self.metrics, self.metrics_keys)
        self.metrics = []

    def saved_rows(self) -> list[dict[str, str]]:
        if not os.path.isfile(self.metrics_file_path):
            return []
        with open(self.metrics_file_path, newline="") as file:
            return list(csv.DictReader(file))

    def write_rows(self, rows: list[dict[str, Any]], keys: list[str]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
        write_atomically(Path(self.metrics_file_path), text.getvalue().encode())


class ResumedExperimentWriter(AtomicExperimentWriter):
    """The metrics.csv writer that continues the file of an interrupted run.

    Lightning deletes an existing metrics.csv when a writer opens it. This writer keeps its rows of
    the steps before ``resume_step`` (the global step of the checkpoint the run resumes from) and
    drops the later ones, which the resumed run logs again; new rows are added after them.
    """

    def __init__(self, log_dir: str, resume_step: int) -> None:
        self.resume_step = resume_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as file:
            reader = csv.DictReader(file)
            keys = list(reader.fieldnames or [])
            # A checkpoint at global step s follows the rows of steps <= s (rows count steps done: CSVLogger).
            rows = [row for row in reader if int(float(row["step"])) <= self.resume_step]
        self.write_rows(rows, keys)
        self.metrics_keys = keys


def steps_done(metrics: dict[str, Any], step: int) -> int:
    """The steps done when ``metrics`` were logged, from Lightning's ``step``: during training Lightning passes the
    0-based index of the step in progress (a step's loss and learning rate, and the evaluation after it, so the
    evaluation after 50 steps came at 49), after it the number of steps done (the test). metrics.csv numbers every
    row as train.log and the progress bar do: by the steps done."""
    return step if any(key.startswith("test/") for key in metrics) else step + 1


class CSVLogger(LightningCSVLogger):
    """Lightning's CSVLogger, its rows numbered by the steps done (:func:`steps_done`); with ``resume_step`` it
    continues the metrics.csv of an interrupted run."""

    def __init__(self, *args: Any, resume_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics(metrics, None if step is None else steps_done(metrics, step))

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            if self.resume_step is None:
                self._experiment = AtomicExperimentWriter(self.log_dir)
            else:
                self._experiment = ResumedExperimentWriter(self.log_dir, self.resume_step)
        return self._experiment
