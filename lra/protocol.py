"""A run's optimisation protocol (``task.protocol``, ``pretrain.protocol``): its fields, their ranges, and how it
is fitted to a run shortened on the command line.

Kept apart from :mod:`lra.config` and :mod:`lra.module` so that both read one rule without importing Lightning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import attention_zoo

WARMUP_SHARE_WHEN_SHORTENED = 0.1  # the warmup of a run shortened below its warmup: a tenth of its steps


def schedule_problem(warmup_steps: int, max_steps: int, section: str = "task") -> str | None:
    """What is wrong with a warmup for the learning-rate schedule (``OneCycleLR``), or None: it must be 0 or at
    least 2 (OneCycleLR divides by warmup_steps - 1), and below max_steps."""
    if 0 <= warmup_steps < max_steps and warmup_steps != 1:
        return None
    return (
        f"{section}.protocol.warmup_steps={warmup_steps} does not fit the learning-rate schedule: it takes 0 (no warmup) "
        f"or 2 to max_steps - 1 = {max_steps - 1} steps (OneCycleLR divides by warmup_steps - 1)"
    )


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The protocol's fields and their types: anything else in a protocol is an error, not ignored."""

    name: str
    batch_size: int
    max_steps: int
    warmup_steps: int
    val_check_interval: int
    limit_val_batches: int
    lr: float
    weight_decay: float
    # Skip a step whose loss or gradients are not finite (no update; counted in the record), as mixed-precision
    # scalers do, instead of stopping the run as diverged (lra.module). Off unless a protocol opts in.
    skip_non_finite_steps: bool = False

    def __post_init__(self) -> None:
        for key in ("batch_size", "max_steps", "val_check_interval", "limit_val_batches"):
            if getattr(self, key) < 1:
                raise ValueError(f"task.protocol.{key} must be at least 1, got {getattr(self, key)}")
        for key, bad, need in (
            ("warmup_steps", self.warmup_steps < 0, "at least 0"),
            ("lr", self.lr <= 0, "positive"),
            ("weight_decay", self.weight_decay < 0, "at least 0"),
        ):
            if bad:
                raise ValueError(f"task.protocol.{key} must be {need}, got {getattr(self, key)}")
        if self.warmup_steps == 1:
            raise ValueError(schedule_problem(1, self.max_steps))

    @classmethod
    def checked(cls, values: dict[str, Any]) -> Protocol:
        """The protocol of a config section, its fields checked (one message naming a bad or unknown field)."""
        fields = attention_zoo.check_fields(
            cls,
            values,
            unknown=lambda keys: f"unknown task.protocol field(s) {keys}; the protocol has {', '.join(PROTOCOL_FIELDS)}",
            invalid=lambda key, kind, value: f"task.protocol.{key} must be {kind}, got {value!r}",
        )
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in fields and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"task.protocol lacks {', '.join(missing)}")
        return cls(**fields)

    def fitted(self) -> dict[str, dict[str, Any]]:
        """The settings a run shortened with ``max_steps=N`` alone must change, ``{key: {from, to, why}}``.

        It keeps the experiment's warmup and evaluation interval, which may not fit: a warmup of at least N steps
        becomes a tenth of N (0 below 20 steps, since the schedule needs 0 or at least 2), an evaluation interval
        above N becomes N, so the run is evaluated.
        """
        adjusted = {}
        steps = self.max_steps
        if self.warmup_steps >= steps:
            tenth = int(WARMUP_SHARE_WHEN_SHORTENED * steps)
            why = f"must be below max_steps={steps}; a tenth of it"
            if tenth < 2:  # the schedule takes no warmup or at least 2 steps (schedule_problem)
                why += f" is {tenth}, below the schedule's smallest warmup of 2, so none"
            adjusted["warmup_steps"] = {"from": self.warmup_steps, "to": tenth if tenth >= 2 else 0, "why": why}
        if self.val_check_interval > steps:
            adjusted["val_check_interval"] = {
                "from": self.val_check_interval,
                "to": steps,
                "why": f"must not exceed max_steps={steps}, so the run is evaluated",
            }
        return adjusted


PROTOCOL_FIELDS = [field.name for field in dataclasses.fields(Protocol)]
