"""``unpack``: a campaign's archive put in place on this machine, everything checked before the first file changes.

The archive is read whole and checked (:func:`lra.campaign.archive.read`); then every record it carries must be a
result (:func:`lra.finished.record_problem`, against its carried curve) and is committed by the one rule
(:func:`lra.finished.plan_commit`: never over a newer record, a conflict stops it); then every unfinished cell's state
is checked: its checkpoints hold tensors and plain data only, its last.ckpt is the run its record names, the folder
it goes to is inside the output folder, no run is training there, and what the folder holds is of the same
configuration. Any refusal is one line, exit status 1, and nothing written. Only then are the records, curves and
logs written (each whole) and each cell restored (:func:`restore_cell`): built beside its folder and swapped in by
renames, so that a kill leaves the old state or the new one, never neither (:func:`settle_cell` finishes a swap
that was cut short).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import checkpoints, config, run_lock
from ..files import DiskFull, write_atomically
from ..finished import CURVES, Commit, commit, plan_commit, record_problem
from ..results import RESULTS_FILE, RunRecord, read
from . import archive
from .carry import CURVE_MEMBER, RUN_MEMBER, STATE_MEMBER, is_member
from .plan import UNPACKED, CampaignError

RESTORING = ".restoring"  # <folder>.restoring: a cell's restored folder, built before it is swapped in
REPLACED = ".replaced"  # <folder>.replaced: the folder it replaced, until the swap is done
COMPLETE = ".complete"  # written last into a restored folder: it is whole


@dataclass
class CellRestore:
    """A carried cell, checked: the folder it goes to, its carried files, the step its last.ckpt is at (None: a
    diverged cell's record alone), and whether it is restored or why not."""

    folder: Path
    files: dict[str, bytes]
    step: int | None
    restore: bool
    why: str


def unpack(path: Path, remove: bool = False) -> None:
    """Check the archive at ``path`` and everything it carries, then put it in place (see the module's docstring),
    saying what it did; with ``remove``, delete its files (all of them checked and used) at the end."""
    output_dir = config.output_dir()
    members = archive.read(path, is_member)
    files = archive.files_of(path)
    commits = planned_commits(members, Path.cwd() / "results" / "runs")
    cells = [checked_cell(output_dir, folder, carried) for folder, carried in cells_of(members).items()]
    try:
        for decision in commits:
            commit(decision)
        for name, data in members.items():
            if name.startswith("results/") and not (RUN_MEMBER.fullmatch(name) or CURVE_MEMBER.fullmatch(name)):
                (Path.cwd() / name).parent.mkdir(parents=True, exist_ok=True)
                write_atomically(Path.cwd() / name, data)  # the throughput curve
        logs = output_dir / UNPACKED / archive.base_of(path).name.split(".")[0]
        for name, data in members.items():
            if name.startswith("campaign/"):
                (logs / name.removeprefix("campaign/")).parent.mkdir(parents=True, exist_ok=True)
                write_atomically(logs / name.removeprefix("campaign/"), data)
        for cell in cells:
            if cell.restore:
                restore_cell(cell)
    except DiskFull as error:
        raise CampaignError(f"{error}; unpack again once there is space: what it wrote is whole", 1) from None
    except run_lock.RunFolderBusy as busy:  # a run that started in a cell's folder after it was checked
        raise CampaignError(f"{busy}; unpack again once it has stopped: what it wrote is whole", 1) from None
    report(commits, cells, logs)
    if remove:  # the folder that carried them to this job is emptied once they are in place
        for file in files:
            file.unlink()
        print(f"Removed {', '.join(file.name for file in files)}")


def planned_commits(members: dict[str, bytes], runs_dir: Path) -> list[Commit]:
    """How each carried record is committed, every one a result and none a conflict; else one refusal."""
    decisions = []
    for name, data in sorted(members.items()):
        if not RUN_MEMBER.fullmatch(name):
            continue
        try:
            record = RunRecord.from_dict(json.loads(data))
        except (ValueError, TypeError) as error:
            raise CampaignError(f"{name} is not a run record ({error}); nothing unpacked", 1) from None
        curve = members.get(f"results/runs/{CURVES}/{Path(name).stem}.csv")
        if problem := record_problem(record, curve):
            raise CampaignError(f"{name}: {problem}; nothing unpacked", 1)
        decisions.append(plan_commit(record, runs_dir, curve))
    if conflicts := [decision for decision in decisions if decision.action == "conflict"]:
        raise CampaignError("; ".join(map(str, conflicts)) + "; nothing unpacked", 1)
    return decisions


def cells_of(members: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    cells: dict[str, dict[str, bytes]] = {}
    for name, data in members.items():
        if found := STATE_MEMBER.fullmatch(name):
            cells.setdefault(found["folder"], {})[found["file"]] = data
    return cells


def checked_cell(output_dir: Path, relative: str, files: dict[str, bytes]) -> CellRestore:
    """A carried cell checked against this machine (see the module's docstring), and whether it is restored: unless
    its folder holds a finished run or a last.ckpt as far along."""
    folder = (output_dir / relative).absolute()
    if not folder.resolve().is_relative_to(output_dir.resolve()):
        raise CampaignError(f"state/{relative} would go outside the output folder {output_dir}; nothing unpacked", 1)
    settle_cell(folder)
    if holder := run_lock.holder(folder):
        raise CampaignError(f"{folder} is in use by a run ({holder}): stop it before unpacking; nothing unpacked", 1)
    carried = read_carried_record(relative, files)
    here = read(folder / RESULTS_FILE)
    if here is not None and carried is not None and here.config_hash != carried.config_hash:
        raise CampaignError(
            f"state/{relative} is of configuration {carried.config_hash} but {folder} holds a run of {here.config_hash}: "
            "move that folder away to restore it; nothing unpacked",
            1,
        )
    if "checkpoints/last.ckpt" not in files:
        if carried is None or carried.status != "diverged":
            return CellRestore(folder, files, None, False, "not restored, the archive holds no last.ckpt for it")
        return CellRestore(folder, files, None, here is None, "diverged (its record restored; start leaves it)")
    step = carried_step(relative, files, carried)
    if here is not None and here.status == "finished":
        return CellRestore(folder, files, step, False, "not restored, it holds a finished run")
    try:
        existing = checkpoints.step(folder / "checkpoints" / "last.ckpt")
    except checkpoints.UNREADABLE:  # none yet, or one cut short: the carried one is further along
        existing = None
    if existing is not None and existing >= step:
        return CellRestore(
            folder, files, step, False, f"not restored, its own last.ckpt is at step {existing}, the archive's at {step}"
        )
    return CellRestore(folder, files, step, True, f"restored at step {step}; start resumes it there")


def read_carried_record(relative: str, files: dict[str, bytes]) -> RunRecord | None:
    if "results.json" not in files:
        return None
    try:
        return RunRecord.from_dict(json.loads(files["results.json"]))
    except (ValueError, TypeError) as error:
        raise CampaignError(f"state/{relative}/results.json is not a run record ({error}); nothing unpacked", 1) from None


def carried_step(relative: str, files: dict[str, bytes], carried: RunRecord | None) -> int:
    """The step of a carried cell's last.ckpt, every carried checkpoint read as a resumed run reads one (tensors and
    plain data only) and its last.ckpt of the run its record names."""
    contents = {}
    for name, data in files.items():
        if name.endswith(".ckpt"):
            try:
                contents[name] = checkpoints.load(data, Path(f"state/{relative}/{name}"))
            except checkpoints.CheckpointRefused as refused:
                raise CampaignError(f"{refused}; nothing unpacked", 1) from None
            except Exception as error:
                raise CampaignError(f"state/{relative}/{name} cannot be read ({error}); nothing unpacked", 1) from None
    last = contents["checkpoints/last.ckpt"]
    stamped = checkpoints.identity(last)
    if (
        carried is not None
        and stamped is not None
        and (stamped.get("config_hash"), stamped.get("seed"))
        != (
            carried.config_hash,
            carried.seed,
        )
    ):
        raise CampaignError(
            f"state/{relative}/checkpoints/last.ckpt is of configuration {stamped.get('config_hash')} (seed "
            f"{stamped.get('seed')}), not of the record beside it ({carried.config_hash}, seed {carried.seed}); nothing "
            "unpacked",
            1,
        )
    return int(last["global_step"])


def restore_cell(cell: CellRestore) -> None:
    """Put a carried cell in its folder: the folder's other files (its train.log, Hydra's record of its configuration)
    and the carried ones built into ``<folder>.restoring``, marked complete, then swapped in by two renames while the
    folder's lock is held; what it replaced is removed last. Its checkpoints are written with their digests
    (:func:`lra.checkpoints.write_bytes`)."""
    folder = cell.folder
    restoring, replaced = folder.with_name(folder.name + RESTORING), folder.with_name(folder.name + REPLACED)
    shutil.rmtree(restoring, ignore_errors=True)
    with run_lock.held(folder) if folder.is_dir() else contextlib.nullcontext():
        if folder.is_dir():  # its checkpoints are the carried ones only: an older attempt's best is not this run's
            shutil.copytree(
                folder, restoring, ignore=shutil.ignore_patterns("checkpoints", run_lock.LOCK_FILE), copy_function=link
            )
        restoring.mkdir(parents=True, exist_ok=True)
        for name, data in sorted(cell.files.items(), key=lambda item: item[0] == "results.json"):  # the record last
            (restoring / name).parent.mkdir(parents=True, exist_ok=True)
            (checkpoints.write_bytes if name.endswith(".ckpt") else write_atomically)(restoring / name, data)
        write_atomically(restoring / COMPLETE, b"")
        if folder.is_dir():
            os.replace(folder, replaced)
        os.replace(restoring, folder)
    (folder / COMPLETE).unlink()
    shutil.rmtree(replaced, ignore_errors=True)


def link(source: str, target: str) -> None:
    """A file of the folder a restore replaces, in the restored one: a hard link where the filesystem has them (the
    replaced folder is removed after), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def settle_cell(folder: Path) -> None:
    """Finish a restore of ``folder`` that was cut short: a complete restored folder is swapped in, an incomplete one
    removed, and the folder it replaced put back where nothing took its place."""
    restoring, replaced = folder.with_name(folder.name + RESTORING), folder.with_name(folder.name + REPLACED)
    if not folder.exists() and (restoring / COMPLETE).is_file():
        os.replace(restoring, folder)
        (folder / COMPLETE).unlink()
    if not folder.exists() and replaced.is_dir():
        os.replace(replaced, folder)
    shutil.rmtree(restoring, ignore_errors=True)
    if folder.exists():
        shutil.rmtree(replaced, ignore_errors=True)


def report(commits: list[Commit], cells: list[CellRestore], logs: Path) -> None:
    new = sum(decision.action == "new" for decision in commits)
    runs = Path.cwd() / "results" / "runs"
    print(f"{len(commits)} finished run records ({new} new) into {runs}, their curves into {runs / CURVES}")
    for decision in commits:
        if decision.action in ("replaces", "kept"):
            print(f"  {decision}")
    for cell in cells:
        print(f"  {cell.folder}: {cell.why}")
    print(f"The campaign's status and log: {logs}")
