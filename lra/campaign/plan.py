"""A campaign's plan: a sweep's cells, composed as ``python -m lra.train -m`` composes them, and how they run.

:func:`make_plan` turns a sweep's overrides into its :class:`Cell` s (the experiment's ``hydra.sweeper.params``
crossed with the command line's lists, as Hydra's basic sweeper crosses them, whole seeds first) and the data they
train on; :class:`Plan` is what ``start`` decided, written into the campaign's folder as ``campaign.json``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from .. import config
from ..files import write_atomically
from ..run import checked_and_hashed

PLAN_FILE = "campaign.json"
LOG_FILE = "campaign.log"
START_LOCK_FILE = "start.lock"  # held by a start from its plan's writing until its campaign's process holds the folder
CELLS = "cells"  # <dir>/cells/<n>.log: a launched cell's console output; <n>.exit: its exit status
UNPACKED = "unpacked"  # <output folder>/unpacked/<archive's name>/: what unpack read back (the carried plan, its log)
MEASURE_WINDOW_S = 120.0  # --parallel auto: the seconds of training over which a job measures each K it runs
PART_SIZE_MIB = 16.0  # pack: an archive larger than this is cut into parts of at most this size
DEADLINE_MARGIN_S = 90.0  # --deadline: the cells stop this long before it, to save their state and be packed


class CampaignError(Exception):
    """Bad input or a state the command cannot act on: one message, exit status 2 (1 for a campaign's own state)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Cell:
    index: int
    name: str  # "task / row / seed N"
    overrides: list[str]  # what `python -m lra.train` runs it with
    folder: str  # its run folder, absolute
    config_hash: str  # its run's (lra.run.checked_and_hashed): how a finished or committed run of it is recognised
    task: str
    max_steps: int
    num_workers: int  # the configuration's; a campaign gives a cell at most this many


@dataclass
class Plan:
    """What ``start`` decided, as ``campaign.json`` holds it: the sweep's cells and how the campaign runs them."""

    overrides: list[str]
    parallel: int  # K: cells at once
    threads_per_cell: int
    workers_per_cell: int
    cores: int
    cwd: str  # where the cells run
    output_dir: str  # the output folder (absolute): the cells' folders are under it
    runs_dir: str  # the committed records (absolute): a cell committed there is skipped
    planned_at: str
    host: str
    datasets: list[dict[str, Any]]  # each distinct data set of the cells, prepared before the first cell
    cells: list[Cell]
    parallel_auto: bool = False  # --parallel auto: K measured and doubled within the job (lra.campaign.throughput.Ramp)
    measure_window_s: float = MEASURE_WINDOW_S
    mps_setting: str = "auto"  # --mps
    mps: bool = False  # whether the cells run under CUDA MPS
    mps_reason: str = ""
    device: str = "cpu"  # for file names: cpu, cuda_h200
    nice: int = 0  # the campaign's and its cells' niceness
    stop_after_s: float | None = None
    stop_at: float | None = None  # --deadline less its margin, as a Unix time
    pack: str | None = None  # --pack: the archive written when the campaign ends
    part_size_mib: float = PART_SIZE_MIB
    margin_s: float = DEADLINE_MARGIN_S
    dir: str | None = None  # the campaign's folder (relative to cwd where inside it): whose cells a carried plan holds
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # keys of a later version, kept as they were

    @classmethod
    def read(cls, campaign: Path) -> Plan:
        path = campaign / PLAN_FILE
        if not path.is_file():
            raise CampaignError(
                f"no campaign in {campaign} ({PLAN_FILE} is missing); start one with python -m lra.campaign start", 1
            )
        values = json.loads(path.read_text())
        known = {f.name for f in fields(cls)} - {"extra"}
        plan = cls(**{key: value for key, value in values.items() if key in known})
        plan.cells = [Cell(**cell) for cell in values["cells"]]
        plan.extra = {key: value for key, value in values.items() if key not in known}
        return plan

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        return {**values.pop("extra"), **values}

    def write(self, campaign: Path) -> None:
        write_atomically(campaign / PLAN_FILE, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    def describe(self) -> str:
        nice = f", at nice {self.nice}" if self.nice else ""
        mps = f"; MPS {'on' if self.mps else 'off'}: {self.mps_reason}" if self.mps_reason else ""  # none before --mps
        return (
            f"Campaign {' '.join(self.overrides)}: {len(self.cells)} cells, {self.parallel} at a time on {self.cores} cores "
            f"({plural(self.threads_per_cell, 'thread')} and at most {plural(self.workers_per_cell, 'data-loader worker')} "
            f"each{nice}){mps}"
        )


def campaign_name(campaign: Path) -> str:
    """The campaign folder as a plan names it: relative to the working directory where it is inside it, so that a
    plan carried to a checkout at another path names the same folder."""
    campaign = campaign.absolute()
    return campaign.relative_to(Path.cwd()).as_posix() if campaign.is_relative_to(Path.cwd()) else str(campaign)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def default_dir() -> Path:
    return config.output_dir() / "campaign"


def experiments() -> list[str]:
    folder = resources.files(config.CONFIG_MODULE) / "experiment"
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def check_overrides(overrides: list[str]) -> None:
    """One message for what Hydra would refuse in its own words: an unknown experiment or attention, a sweep flag."""
    for override in overrides:
        if override in ("-m", "--multirun"):
            raise CampaignError("a campaign is a sweep already: leave out -m")
        key, _, value = override.partition("=")
        if key.lstrip("+") == "experiment":
            unknown = [name for name in value.split(",") if name not in experiments()]
            if unknown:
                raise CampaignError(f"experiment={unknown[0]} is not an experiment; the choices: {', '.join(experiments())}")
            if "," in value:
                raise CampaignError("a campaign runs one experiment; start one campaign per experiment")
    if problem := config.unknown_option(overrides):
        raise CampaignError(problem)


def sweep_cells(overrides: list[str]) -> list[list[str]]:
    """The overrides of each cell of ``python -m lra.train -m OVERRIDES``: the experiment's ``hydra.sweeper.params``
    first, then the command line's overrides (a key given on both: the command line's, in the params' place), crossed
    as Hydra's basic sweeper crosses them; then ordered by seed, the sweep's order within a seed.

    Hydra parses the overrides (its public ``OverridesParser``); the crossing is written here, as the basic sweeper
    does it, because Hydra offers it only in its private ``hydra._internal``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    plain = [o.input_line for o in parser.parse_overrides(overrides) if not o.is_sweep_override()]
    master = compose(plain)
    params = master.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=True) if params else {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(overrides)
    choices: dict[str, list[str]] = {}  # each key's settings, in the order its key first appears; a later one replaces
    for override in parser.parse_overrides(arguments):
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise CampaignError(f"{override.input_line}: a campaign sweeps lists and ranges, not intervals; list the values")
    cells = [list(cell) for cell in itertools.product(*choices.values())]
    return sorted(cells, key=seed_of)  # stable: every row of the first seed, then the next seed's


def seed_of(overrides: list[str]) -> tuple[int, str]:
    """A cell's seed, for ordering (a campaign cut short by its time then has whole seeds): 0 for none given."""
    text = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "0")
    return (int(text), "") if text.lstrip("-").isdigit() else (0, text)


def compose(overrides: list[str]):
    try:
        return config.compose(overrides, return_hydra_config=True)
    except Exception as error:  # Hydra's composition errors: one line, not a traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CampaignError(f"the overrides {' '.join(overrides)} do not compose: {first}") from None


def plan_cell(index: int, overrides: list[str]) -> tuple[Cell, dict[str, Any]]:
    """The cell and its resolved ``task.data`` (for preparing its data once), composed as ``lra.train`` composes it."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    cfg = compose(overrides)
    HydraConfig.instance().set_config(cfg)  # the run folder's ${hydra:...} interpolations
    folder = Path(str(cfg.hydra.run.dir)).absolute()
    choices = cfg.hydra.runtime.choices
    row = config.row_name(choices["attention"], cfg.hydra.overrides.task)
    try:
        checked, digest = checked_and_hashed(cfg)
    except ValueError as error:
        raise CampaignError(f"cell {' '.join(overrides)}: {error}") from None
    cell = Cell(
        index=index,
        name=f"{cfg.task.name} / {row} / seed {cfg.seed}",
        overrides=list(overrides),
        folder=str(folder),
        config_hash=digest,
        task=str(cfg.task.name),
        max_steps=int(checked.task.protocol.max_steps),
        num_workers=int(cfg.num_workers),
    )
    return cell, {"task": cell.task, "data": OmegaConf.to_container(cfg.task.data, resolve=True)}


def make_plan(overrides: list[str]) -> tuple[list[Cell], list[dict[str, Any]], Any]:
    """Every cell of the sweep, the distinct data they train on, and the first cell's trainer config."""
    check_overrides(overrides)
    cells, datasets = [], []
    for index, cell_overrides in enumerate(sweep_cells(overrides)):
        cell, data = plan_cell(index, cell_overrides)
        cells.append(cell)
        if data not in datasets:
            datasets.append(data)
    folders = [cell.folder for cell in cells]
    if len(set(folders)) < len(folders):
        raise CampaignError(
            "two cells of this sweep would share a run folder; give each setting that differs on the command line"
        )
    trainer = compose(cells[0].overrides).trainer
    return cells, datasets, trainer
