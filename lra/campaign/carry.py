"""What a campaign carries from one machine to the next, packed into one archive (:mod:`lra.campaign.archive`).

The archive's members, each of one kind (:func:`is_member`, the grammar ``unpack`` checks every name against):

* ``results/runs/<name>.json``: a finished cell's record in its committed form (no machine paths), and
  ``results/runs/curves/<name>.csv`` its learning curve (its ``metrics.csv``);
* ``results/cells_per_hour_<device>.csv``: the curve ``--parallel auto`` chooses K from, measured so far;
* ``state/<its folder under the output folder>/...``: an unfinished cell's ``checkpoints/last.ckpt``, its best
  checkpoint's weights (``checkpoints/best-step<N>.ckpt``), its ``metrics/metrics.csv`` and its ``results.json``,
  each checkpoint checked against the digest recorded when it was written; a diverged cell's record alone;
* ``campaign/``: its ``status.txt``, ``campaign.json``, ``campaign.log`` and the end of each failed cell's train.log
  (``failed/<n>.log``), to read back home.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import checkpoints
from ..finished import CURVES, run_file_name
from ..results import RunRecord
from . import archive
from .plan import LOG_FILE, PLAN_FILE, Plan, plural
from .state import CellState, plan_states, status_text
from .throughput import curve_path

STATE = "state"  # an archive's unfinished cells: state/<cell folder under the output folder>/<file>
NAME = r"[\w.,+=@-]+"
RUN_MEMBER = re.compile(rf"results/runs/{NAME}\.json")
CURVE_MEMBER = re.compile(rf"results/runs/{CURVES}/{NAME}\.csv")
THROUGHPUT_MEMBER = re.compile(r"results/cells_per_hour_\w+\.csv")
CAMPAIGN_MEMBER = re.compile(rf"campaign/(status\.txt|{re.escape(PLAN_FILE)}|{re.escape(LOG_FILE)}|failed/\d+\.log)")
STATE_FILES = r"checkpoints/last\.ckpt|checkpoints/best-step\d+\.ckpt|metrics/metrics\.csv|results\.json"
STATE_MEMBER = re.compile(rf"{STATE}/(?P<folder>{NAME}(?:/{NAME})*?)/(?P<file>{STATE_FILES})")
MEMBERS = (RUN_MEMBER, CURVE_MEMBER, THROUGHPUT_MEMBER, CAMPAIGN_MEMBER, STATE_MEMBER)
LOG_TAIL = 2_000_000  # the campaign's log packed: its last bytes
FAILED_TAIL_LINES = 200  # a failed cell's train.log packed: its last lines


def is_member(name: str) -> bool:
    """Whether ``name`` is one of the kinds of member a campaign archive holds."""
    return any(pattern.fullmatch(name) for pattern in MEMBERS)


@dataclass
class Packed:
    """What a pack holds, for its one line: the finished runs and how many carry their curve, the unfinished cells
    carried, and the cells left out (running, or a checkpoint that is not the one written)."""

    members: dict[str, bytes] = field(default_factory=dict)
    runs: int = 0
    curves: int = 0
    unfinished: int = 0
    left_out: list[str] = field(default_factory=list)


def write_pack(campaign: Path, plan: Plan, out: Path, part_size_mib: float) -> str:
    """Write the campaign's archive to ``out`` (in parts where it is larger than ``part_size_mib``); what it holds, in
    one line, with the cells it left out."""
    states = plan_states(campaign, plan)
    packed = Packed()
    for state in states:
        if state.status == "finished" and state.record is not None:
            add_finished(packed, state.record)
        elif state.status == "running":
            packed.left_out.append(f"{state.cell.name} (running: stop the campaign first, stop --wait, to carry it)")
        else:
            add_unfinished(packed, state, Path(plan.output_dir))
    add_campaign(packed, campaign, plan, states)
    files = archive.write(packed.members, out, int(part_size_mib * 2**20))
    data = files[:-1]
    size = sum(path.stat().st_size for path in data)
    where = str(data[0]) if len(data) == 1 else f"{len(data)} parts {data[0].name} .. {data[-1].name} in {out.parent}"
    curves = "with their curves" if packed.curves == packed.runs else f"{packed.curves} with their curves"
    said = (
        f"{where} and its manifest: {packed.runs} finished runs of {len(states)} cells ({curves}), and the state of "
        f"{plural(packed.unfinished, 'unfinished cell')} ({size / 2**20:.1f} MiB)"
    )
    return said + "".join(f"; left out {why}" for why in packed.left_out)


def add_finished(packed: Packed, record_path: Path) -> None:
    """A finished cell's record in its committed form, and its curve where its run has one."""
    record = RunRecord.read(record_path)
    name = run_file_name(record)
    text = json.dumps(record.to_dict(committed=True), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n"
    packed.members[f"results/runs/{name}"] = text.encode()
    packed.runs += 1
    metrics = record_path.parent / "metrics" / "metrics.csv"
    if metrics.is_file():
        packed.members[f"results/runs/{CURVES}/{name.removesuffix('.json')}.csv"] = metrics.read_bytes()
        packed.curves += 1


def add_unfinished(packed: Packed, state: CellState, output_dir: Path) -> None:
    """An unfinished cell's state (:func:`unfinished_state`); a cell whose checkpoint is not the one written is left
    out, and said."""
    try:
        carried = unfinished_state(state, output_dir)
    except checkpoints.CheckpointRefused as refused:
        packed.left_out.append(f"{state.cell.name} ({refused})")
        return
    packed.unfinished += any(name.endswith("last.ckpt") for name in carried)
    packed.members.update(carried)


def unfinished_state(state: CellState, output_dir: Path) -> dict[str, bytes]:
    """What a cell that has not finished needs to go on elsewhere from the step it reached, as archive members
    (``state/<its folder under the output folder>/...``): its last.ckpt, the weights of its best checkpoint (the
    best is only ever tested, so its optimizer state stays behind), its metrics.csv and its record; each checkpoint
    checked against its recorded digest (:class:`lra.checkpoints.CheckpointRefused` where it is not the one written).
    Nothing for a cell without a last.ckpt (it starts afresh anyway) or a running one (its files are being written)."""
    folder = Path(state.cell.folder)
    last = folder / "checkpoints" / "last.ckpt"
    prefix = f"{STATE}/{folder.relative_to(output_dir).as_posix()}"
    if state.status == "diverged":  # its verdict travels, so that no later job trains it again
        names = [name for name in ("results.json", "metrics/metrics.csv") if (folder / name).is_file()]
        return {f"{prefix}/{name}": (folder / name).read_bytes() for name in names}
    if state.status not in ("failed", "interrupted", "pending") or not last.is_file():
        return {}
    members = {f"{prefix}/checkpoints/last.ckpt": checkpoints.read_bytes(last)}
    for best in folder.glob("checkpoints/best-step*.ckpt"):
        members[f"{prefix}/checkpoints/{best.name}"] = checkpoints.weights(best)
    for name in ("metrics/metrics.csv", "results.json"):
        if (folder / name).is_file():
            members[f"{prefix}/{name}"] = (folder / name).read_bytes()
    return members


def add_campaign(packed: Packed, campaign: Path, plan: Plan, states: list[CellState]) -> None:
    """What to read back home: the end of each failed cell's train.log, the throughput curve, the status (as the
    archive has it: the campaign's process is not carried), the plan and the log."""
    for state in states:
        train_log = Path(state.cell.folder) / "train.log"
        if state.status in ("failed", "diverged", "interrupted") and train_log.is_file():
            tail = train_log.read_text(errors="replace").splitlines()[-FAILED_TAIL_LINES:]
            packed.members[f"campaign/failed/{state.cell.index}.log"] = "\n".join(tail).encode()
    curve = curve_path(Path(plan.runs_dir).parent, plan.device)
    if curve.is_file():  # what --parallel auto chooses K from, measured so far
        packed.members[f"results/{curve.name}"] = curve.read_bytes()
    packed.members["campaign/status.txt"] = (status_text(campaign, plan, packed=True) + "\n").encode()
    packed.members[f"campaign/{PLAN_FILE}"] = (campaign / PLAN_FILE).read_bytes()
    if (campaign / LOG_FILE).is_file():
        packed.members[f"campaign/{LOG_FILE}"] = (campaign / LOG_FILE).read_bytes()[-LOG_TAIL:]
