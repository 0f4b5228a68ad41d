"""What a campaign carries from one machine to the next: its archive (``pack``) and its unpacking (``unpack``).

``pack`` writes the finished cells' records in their committed form (``results/runs/<name>.json``, as ``lra.table
--collect`` writes them) with each one's learning curve (``results/runs/curves/<name>.csv``, its ``metrics.csv``),
every unfinished cell's state (``state/<its folder under the output folder>/``: its ``last.ckpt``, its best
checkpoint's weights, its metrics and record), the campaign's status and log, into one tar.gz, cut into parts where
it is larger than a part's size. ``unpack`` puts the records and curves into ``results/`` of the current folder and
each unfinished cell's files into its run folder under this machine's output folder.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from .. import config, run_lock
from .plan import LOG_FILE, PLAN_FILE, CampaignError, Plan, plural
from .state import CellState, plan_states, status_text
from .throughput import curve_path

CURVES = "curves"  # results/runs/curves/<run file name>.csv: a packed cell's metrics.csv
STATE = "state"  # an archive's unfinished cells: state/<cell folder under the output folder>/<file>


def write_pack(campaign: Path, plan: Plan, out: Path, part_size_mib: float) -> str:
    """Write the campaign's archive to ``out`` (in parts where it is larger than ``part_size_mib``); what it holds."""
    from ..results import RunRecord
    from ..table import run_file_name

    states = plan_states(campaign, plan)
    members: dict[str, bytes] = {}
    for state in states:
        if state.status != "finished" or state.record is None:
            continue
        record = RunRecord.read(state.record)
        name = run_file_name(record)
        members[f"results/runs/{name}"] = (
            json.dumps(record.to_dict(committed=True), indent=2, sort_keys=True, default=str) + "\n"
        ).encode()
        metrics = state.record.parent / "metrics" / "metrics.csv"
        if metrics.is_file():
            members[f"results/runs/{CURVES}/{name.removesuffix('.json')}.csv"] = metrics.read_bytes()
    unfinished = 0
    for state in states:
        carried = unfinished_state(state, Path(plan.output_dir))
        unfinished += bool(carried)
        members.update(carried)
    for state in states:  # what went wrong, to read back home: the end of each failed cell's train.log
        train_log = Path(state.cell.folder) / "train.log"
        if state.status in ("failed", "diverged", "interrupted") and train_log.is_file():
            members[f"campaign/failed/{state.cell.index}.log"] = "\n".join(
                train_log.read_text(errors="replace").splitlines()[-200:]
            ).encode()
    curve = curve_path(Path(plan.runs_dir).parent, plan.device)
    if curve.is_file():  # what --parallel auto chooses K from, measured so far
        members[f"results/{curve.name}"] = curve.read_bytes()
    members["campaign/status.txt"] = (status_text(campaign, plan) + "\n").encode()
    members[f"campaign/{PLAN_FILE}"] = (campaign / PLAN_FILE).read_bytes()
    if (campaign / LOG_FILE).is_file():
        members[f"campaign/{LOG_FILE}"] = (campaign / LOG_FILE).read_bytes()[-2_000_000:]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            archive.addfile(info, io.BytesIO(data))
    files = write_parts(buffer.getvalue(), out, int(part_size_mib * 2**20))
    runs = sum(name.endswith(".json") and name.startswith("results/runs/") for name in members)
    size = sum(path.stat().st_size for path in files)
    where = str(out) if files == [out] else f"{len(files)} parts {files[0].name} .. {files[-1].name} in {out.parent}"
    return (
        f"{where}: {runs} finished runs of {len(states)} cells with their curves, and the state of "
        f"{plural(unfinished, 'unfinished cell')} ({size / 2**20:.1f} MiB)"
    )


def unfinished_state(state: CellState, output_dir: Path) -> dict[str, bytes]:
    """What a cell that has not finished needs to go on elsewhere from the step it reached, as archive members
    (``state/<its folder under the output folder>/...``): its last.ckpt, the weights of its best checkpoint (the
    best is only ever tested, so its optimizer state stays behind), its metrics.csv and its record. Nothing for a
    cell without a last.ckpt (it starts afresh anyway) or a running one (its files are being written)."""
    folder = Path(state.cell.folder)
    last = folder / "checkpoints" / "last.ckpt"
    prefix = f"{STATE}/{folder.relative_to(output_dir).as_posix()}"
    if state.status == "diverged":  # its verdict travels, so that no later job trains it again
        names = [name for name in ("results.json", "metrics/metrics.csv") if (folder / name).is_file()]
        return {f"{prefix}/{name}": (folder / name).read_bytes() for name in names}
    if state.status not in ("failed", "interrupted", "pending") or not last.is_file():
        return {}
    members = {f"{prefix}/checkpoints/last.ckpt": last.read_bytes()}
    for best in folder.glob("checkpoints/best-step*.ckpt"):
        members[f"{prefix}/checkpoints/{best.name}"] = weights_only(best)
    for name in ("metrics/metrics.csv", "results.json"):
        if (folder / name).is_file():
            members[f"{prefix}/{name}"] = (folder / name).read_bytes()
    return members


def weights_only(checkpoint: Path) -> bytes:
    """A Lightning checkpoint without its optimizer and scheduler states: what testing it needs, a third of its size."""
    import torch

    content = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the run's own file
    for key in ("optimizer_states", "lr_schedulers"):
        content.pop(key, None)
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return buffer.getvalue()


PART = re.compile(r"\.part(\d{3})$")


def write_parts(data: bytes, out: Path, part_size: int) -> list[Path]:
    """``data`` as ``out`` where it fits in ``part_size`` bytes, else as ``out.part000``, ``out.part001``, ...
    (``cat`` joins them); each written whole and renamed, and the parts of an earlier, larger archive removed."""
    if part_size < 1:
        raise CampaignError(f"--part-size must be positive, got {part_size / 2**20:g} MiB")
    out.parent.mkdir(parents=True, exist_ok=True)
    pieces = [data] if len(data) <= part_size else [data[i : i + part_size] for i in range(0, len(data), part_size)]
    paths = [out] if len(pieces) == 1 else [out.with_name(f"{out.name}.part{i:03d}") for i in range(len(pieces))]
    for stale in [out, *out.parent.glob(f"{out.name}.part[0-9][0-9][0-9]")]:
        if stale not in paths:
            stale.unlink(missing_ok=True)
    for path, piece in zip(paths, pieces, strict=True):
        staging = path.with_name(path.name + ".partial")
        staging.write_bytes(piece)
        os.replace(staging, path)
    return paths


def archive_exists(path: Path) -> bool:
    """Whether the archive ``path`` (written by :func:`write_parts`: itself, or parts of it) is there, whole or not."""
    base = path.with_name(PART.sub("", path.name))
    return base.is_file() or any(base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]"))


def read_parts(path: Path) -> tuple[bytes, list[Path]]:
    """An archive written by :func:`write_parts`: ``path`` itself, or all its parts given the archive's name or any
    part's; with the files read."""
    base = path.with_name(PART.sub("", path.name))
    parts = sorted(base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]"))
    if not parts:
        if not path.is_file():
            raise CampaignError(f"{path} is not a file (nor are there parts {path.name}.part000, ...)")
        return path.read_bytes(), [path]
    numbers = [int(PART.search(part.name).group(1)) for part in parts]
    if numbers != list(range(len(parts))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise CampaignError(f"{base.name} is missing its part(s) {', '.join(f'part{n:03d}' for n in missing)}; nothing unpacked")
    return b"".join(part.read_bytes() for part in parts), parts


RUN_MEMBER = re.compile(r"results/runs/[\w.,+=@-]+\.json")
CURVE_MEMBER = re.compile(rf"results/runs/{CURVES}/[\w.,+=@-]+\.csv")
CAMPAIGN_MEMBER = re.compile(r"campaign/[\w./-]+")
CURVE_FILE_MEMBER = re.compile(r"results/cells_per_hour_\w+\.csv")
STATE_MEMBER = re.compile(
    rf"{STATE}/(?P<folder>[\w.,+=@/-]+)/(?P<file>checkpoints/last\.ckpt|checkpoints/best-step\d+\.ckpt|"
    r"metrics/metrics\.csv|results\.json)"
)


def unpack(archive: Path, remove: bool = False) -> None:
    """Unpack ``archive`` (:func:`write_pack`'s) into the current folder's ``results/`` and this machine's output
    folder, saying what it did; with ``remove``, delete its files once unpacked."""
    from ..results import RunRecord

    data, files = read_parts(archive)
    root = Path.cwd()
    output_dir = config.output_dir()
    logs = output_dir / "unpacked" / archive.name.split(".")[0]
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = archive.getmembers()
            for member in members:
                patterns = (RUN_MEMBER, CURVE_MEMBER, CAMPAIGN_MEMBER, STATE_MEMBER, CURVE_FILE_MEMBER)
                if not member.isfile() or not any(p.fullmatch(member.name) for p in patterns) or ".." in member.name.split("/"):
                    raise CampaignError(
                        f"{archive} holds {member.name!r}, which is not part of a campaign archive; nothing unpacked"
                    )
            contents = {member.name: archive.extractfile(member).read() for member in members}
    except (tarfile.TarError, OSError, EOFError) as error:
        raise CampaignError(f"{archive} is not a campaign archive ({error}); nothing unpacked") from None
    records = {}
    for name, data in contents.items():
        if RUN_MEMBER.fullmatch(name):
            try:
                record = RunRecord.from_dict(json.loads(data))
            except ValueError as error:
                raise CampaignError(f"{name} in {archive} is not a run record ({error}); nothing unpacked") from None
            if record.status != "finished" or not record.config_hash:
                raise CampaignError(f"{name} in {archive} is not a finished run's record; nothing unpacked")
            records[name] = record
    cells: dict[str, dict[str, bytes]] = {}
    for name, data in contents.items():
        if found := STATE_MEMBER.fullmatch(name):
            cells.setdefault(found["folder"], {})[found["file"]] = data
    new = 0
    for name, data in sorted(contents.items()):
        if STATE_MEMBER.fullmatch(name):
            continue
        target = root / name if name.startswith("results/") else logs / name.removeprefix("campaign/")
        new += name in records and not target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    restored = [restore_cell(output_dir / folder, files_of_cell) for folder, files_of_cell in sorted(cells.items())]
    runs = root / "results" / "runs"
    print(f"{len(records)} finished run records ({new} new) into {runs}, their curves into {runs / CURVES}")
    for line in restored:
        print(line)
    print(f"The campaign's status and log: {logs}")
    if remove:  # the folder that carried them to this job is emptied once they are in place
        for path in files:
            path.unlink()
        print(f"Removed {', '.join(path.name for path in files)}")


def restore_cell(folder: Path, files: dict[str, bytes]) -> str:
    """Put an unfinished cell's carried files into its run folder, where the next ``start`` resumes it; unless the
    folder already holds a run as far along (its last.ckpt at the same step or later, or finished)."""
    from ..results import RESULTS_FILE, RunRecord, read
    from ..run import UNREADABLE_CHECKPOINT, checkpoint_step

    if "checkpoints/last.ckpt" not in files:
        carried = json.loads(files.get("results.json", b"{}"))
        if carried.get("status") != "diverged":
            return f"  {folder}: not restored, the archive holds no last.ckpt for it"
        if read(folder / RESULTS_FILE) is None:  # a diverged cell's record alone: start does not train it again
            folder.mkdir(parents=True, exist_ok=True)
            RunRecord.from_dict(carried).write(folder / RESULTS_FILE)
        return f"  {folder}: diverged (its record restored; start leaves it)"
    with tempfile.TemporaryDirectory() as scratch:  # the carried checkpoint's step, read as a resumed run reads it
        carried = Path(scratch) / "last.ckpt"
        carried.write_bytes(files["checkpoints/last.ckpt"])
        try:
            step = checkpoint_step(carried)
        except UNREADABLE_CHECKPOINT:
            return f"  {folder}: not restored, its carried last.ckpt cannot be read"
    here = read(folder / RESULTS_FILE)
    if here is not None and here.status == "finished":
        return f"  {folder}: not restored, it holds a finished run"
    try:
        existing = checkpoint_step(folder / "checkpoints" / "last.ckpt")
    except UNREADABLE_CHECKPOINT:  # none yet, or one cut short: the carried one is further along
        existing = None
    if existing is not None and existing >= step:
        return f"  {folder}: not restored, its own last.ckpt is at step {existing}, the archive's at {step}"
    with run_lock.held(folder):  # no run writes into it meanwhile
        if (folder / "checkpoints").is_dir():
            shutil.rmtree(folder / "checkpoints")  # an older attempt's: its best checkpoint is not this run's
        for name, data in sorted(files.items(), key=lambda item: item[0] == "results.json"):  # the record last
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(target.name + ".partial")
            staging.write_bytes(data)
            os.replace(staging, target)
    return f"  {folder}: restored at step {step}; start resumes it there"
