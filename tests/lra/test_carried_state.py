"""Carried state that nothing can corrupt, lose or run code through: a campaign's archive is checked whole before it
touches anything, packing and unpacking are atomic, and no record becomes a result that disagrees with its run.

Each case as an attacker or bad luck would make it, on a campaign of two cells made by hand on "machine A" (a
finished cell with its curve, an interrupted one with its checkpoints), packed, and unpacked on "machine B" (another
folder, another output folder).
"""

from __future__ import annotations

import errno
import io
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import hold_at_step
import pytest
import torch
from test_campaign import holding
from test_table import SMOKE, hashed, record
from tiny_listops import TINY

from lra import campaign, checkpoints, run_lock, table
from lra.campaign import archive, restore
from lra.campaign.plan import Cell, Plan
from lra.results import RunRecord

FINISHED = "listops/softmax/seed=0"
INTERRUPTED = "listops/none/seed=0"


class RunsCodeWhenUnpickled:
    """What a malicious checkpoint can carry: unpickling it calls ``Path.touch(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def metrics(points: list[tuple[int, float]], test_acc: float | None) -> bytes:
    lines = ["epoch,step,test/acc,test/loss,val/acc,val/loss"]
    lines += [f"0,{step},,,{accuracy},2.0" for step, accuracy in points]
    lines += [f"1,{points[-1][0]},{test_acc},1.9,,"] if test_acc is not None else []
    return ("\n".join(lines) + "\n").encode()


def machine_a(tmp_path: Path, test_acc: float = 0.1875) -> tuple[Path, Plan]:
    """A campaign's folder and plan with a finished cell (its record and curve) and an interrupted one (its last.ckpt at
    step 12, its best at 8, its metrics and record), as the harness leaves them."""
    outputs = tmp_path / "a" / "outputs"
    finished = hashed(record("softmax", "listops", 0, test_acc, protocol=SMOKE, test_loss=1.9))
    (outputs / FINISHED / "metrics").mkdir(parents=True)
    finished.write(outputs / FINISHED / "results.json")
    (outputs / FINISHED / "metrics" / "metrics.csv").write_bytes(metrics([(50, 0.2), (100, 0.25)], test_acc))
    interrupted = hashed(record("none", "listops", 0, None, status="interrupted", protocol=SMOKE, error="interrupted"))
    folder = outputs / INTERRUPTED
    identity = {"callbacks": {checkpoints.IDENTITY: {"config_hash": interrupted.config_hash, "seed": 0}}}
    for name, step in (("last.ckpt", 12), ("best-step8.ckpt", 8)):
        contents = {"global_step": step, "state_dict": {"w": torch.full((4,), float(step))}, **identity}
        checkpoints.write(folder / "checkpoints" / name, {**contents, "optimizer_states": [{"m": torch.zeros(4)}]})
    (folder / "metrics").mkdir()
    (folder / "metrics" / "metrics.csv").write_bytes(metrics([(8, 0.2)], None))
    interrupted.write(folder / "results.json")
    cells = [
        Cell(0, "listops / softmax / seed 0", [], str(outputs / FINISHED), finished.config_hash, "listops", 400, 0),
        Cell(1, "listops / none / seed 0", [], str(folder), interrupted.config_hash, "listops", 400, 0),
    ]
    runs = tmp_path / "a" / "results" / "runs"
    plan = Plan(["attention=softmax,none"], 1, 2, 1, 2, str(tmp_path / "a"), str(outputs), str(runs), "2026-12", "a", [], cells)
    (tmp_path / "a" / "campaign").mkdir()
    plan.write(tmp_path / "a" / "campaign")
    return tmp_path / "a" / "campaign", plan


def pack(tmp_path: Path, part_size_mib: float = 1.0, **changes) -> tuple[list[Path], str]:
    folder, plan = machine_a(tmp_path, **changes)
    out = tmp_path / "a" / "carry" / "campaign.tar.gz"
    said = campaign.write_pack(folder, plan, out, part_size_mib)
    return archive.files_of(out), said  # its parts, then its manifest


@pytest.fixture
def machine_b(tmp_path, monkeypatch):
    """Machine B: its checkout (the current folder) and its output folder."""
    home = tmp_path / "b"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(home / "outputs"))
    return home


def unpack_in(home: Path, archive_path: Path, capsys, *options: str) -> tuple[int, str]:
    """``python -m lra.campaign unpack`` in machine B's checkout (``home``): its exit status and what it said (stdout,
    then stderr)."""
    status = campaign.main(["unpack", str(archive_path), *options])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes: what a refused unpack must leave as it was."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_campaign_packed_on_one_machine_unpacks_whole_on_another(tmp_path, machine_b, capsys):
    files, said = pack(tmp_path)
    assert [p.name for p in files] == ["campaign.tar.gz", "campaign.tar.gz.manifest.json"]
    assert "1 finished runs of 2 cells (with their curves), and the state of 1 unfinished cell" in said
    status, err = unpack_in(machine_b, files[0], capsys, "--remove")
    assert status == 0, err
    runs = machine_b / "results" / "runs"
    [committed] = runs.glob("*.json")
    assert RunRecord.read(committed).test_acc == 0.1875
    assert (runs / "curves" / committed.name.replace(".json", ".csv")).read_bytes() == metrics([(50, 0.2), (100, 0.25)], 0.1875)
    restored = machine_b / "outputs" / INTERRUPTED
    assert checkpoints.step(restored / "checkpoints" / "last.ckpt") == 12
    assert "optimizer_states" not in checkpoints.read(restored / "checkpoints" / "best-step8.ckpt")
    assert not list((tmp_path / "a" / "carry").iterdir()), "--remove removes what it checked and used"


@pytest.mark.parametrize("seed", range(24))
def test_any_single_flipped_bit_is_refused_and_nothing_changes(tmp_path, machine_b, capsys, seed):
    """Of 400 random single-bit flips in a 9-part pack none was refused, 340 were accepted with changed bytes. Here a
    bit anywhere in any part or in the manifest is one line, exit status 1, nothing written."""
    files, _ = pack(tmp_path, part_size_mib=0.001)
    assert len(files) >= 4, "several parts, and the manifest"
    chance = random.Random(seed)
    victim = chance.choice(files)
    data = bytearray(victim.read_bytes())
    position = chance.randrange(len(data) * 8)
    data[position // 8] ^= 1 << (position % 8)
    victim.write_bytes(bytes(data))
    status, err = unpack_in(machine_b, files[0], capsys)
    assert status == 1 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith("nothing unpacked") and tree(machine_b) == {}


@pytest.mark.parametrize(
    "name",
    [
        "campaign//abs/path",  # an empty component: Path(x) / "/abs" is absolute
        "state//abs/path/checkpoints/last.ckpt",
        "results/runs/../../x.json",
        "/results/runs/x.json",
        "state/listops/./softmax/seed=0/results.json",
        "results/runs/curves/x.sh",
        "state/x/checkpoints/evil.py",
    ],
)
def test_a_member_outside_the_grammar_is_refused_before_anything_is_written(tmp_path, machine_b, capsys, name):
    out = tmp_path / "carry" / "bad.tar.gz"
    archive.write({name: b"x", "campaign/status.txt": b"ok\n"}, out, 2**20)
    status, err = unpack_in(machine_b, out, capsys)
    assert status == 1 and "which is not part of a campaign archive; nothing unpacked" in err and tree(machine_b) == {}


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_link_members_are_refused(tmp_path, machine_b, capsys, monkeypatch, kind):
    def with_a_link(members):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo("results/runs/x.json")
            info.type, info.linkname = kind, "/etc/passwd"
            tar.addfile(info)
        return buffer.getvalue()

    monkeypatch.setattr(archive, "tar_gz", with_a_link)
    out = tmp_path / "carry" / "linked.tar.gz"
    archive.write({"results/runs/x.json": b""}, out, 2**20)
    monkeypatch.undo()
    status, err = unpack_in(machine_b, out, capsys)
    assert status == 1 and "'results/runs/x.json', which is not part of a campaign archive" in err and tree(machine_b) == {}


def test_a_carried_checkpoint_that_would_run_code_is_refused_and_nothing_runs(tmp_path, machine_b, capsys):
    folder, plan = machine_a(tmp_path)
    marker = tmp_path / "code-ran"
    members = campaign.unfinished_state(campaign.plan_states(folder, plan)[1], Path(plan.output_dir))
    best = f"state/{INTERRUPTED}/checkpoints/best-step8.ckpt"
    members[best] = checkpoints.to_bytes({"global_step": 8, "payload": RunsCodeWhenUnpickled(marker)})
    out = tmp_path / "carry" / "evil.tar.gz"
    archive.write(members, out, 2**20)
    status, err = unpack_in(machine_b, out, capsys)
    assert status == 1 and "refused to load the checkpoint" in err and "nothing unpacked" in err
    assert not marker.exists() and tree(machine_b) == {}


def test_a_local_checkpoint_that_would_run_code_is_left_out_of_the_pack_and_nothing_runs(tmp_path):
    """A best checkpoint pickling os.system ran it during the next start --pack (read with weights_only=False)."""
    folder, plan = machine_a(tmp_path)
    marker = tmp_path / "code-ran"
    best = Path(plan.output_dir) / INTERRUPTED / "checkpoints" / "best-step8.ckpt"
    torch.save({"global_step": 8, "payload": RunsCodeWhenUnpickled(marker)}, best)
    checkpoints.digest_file(best).unlink()  # as whoever wrote it would leave it
    said = campaign.write_pack(folder, plan, tmp_path / "carry" / "c.tar.gz", 1.0)
    assert "left out listops / none / seed 0 (refused to load the checkpoint" in said and not marker.exists()
    assert "the state of 0 unfinished cells" in said


def test_a_pack_killed_or_out_of_disk_midway_leaves_the_older_archive_whole(tmp_path, machine_b, capsys, monkeypatch):
    """A pack killed after its 4th of 9 parts over an older pack, and a full disk during a pack, lost the older one."""
    files, _ = pack(tmp_path, part_size_mib=0.001)
    older = {p.name: p.read_bytes() for p in files}
    out = files[0].with_name("campaign.tar.gz")
    bigger = {f"campaign/failed/{n}.log": os.urandom(5000) for n in range(4)}
    writes = []
    real = archive.write_atomically

    def killed_at_the_fourth(path, data):
        writes.append(path.name)
        if len(writes) == 4:
            raise KeyboardInterrupt("the job's end")
        real(path, data)

    monkeypatch.setattr(archive, "write_atomically", killed_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        archive.write(bigger, out, 2048)
    monkeypatch.setattr(archive, "write_atomically", real)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == older, "the older archive untouched, nothing beside it"

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as disk:
        disk.setattr(os, "fsync", full_disk)
        with pytest.raises(campaign.CampaignError, match=r"no space left .*; the older archive at .* is whole"):
            archive.write(bigger, out, 2048)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == older
    status, err = unpack_in(machine_b, out, capsys)
    assert status == 0, err


def test_a_pack_killed_while_its_files_move_into_place_is_finished_by_the_next_read(tmp_path, monkeypatch):
    out = tmp_path / "carry" / "c.tar.gz"
    archive.write({"campaign/status.txt": os.urandom(6000)}, out, 2048)
    newer = {"campaign/status.txt": os.urandom(9000)}
    moves = []
    real = pathlib.Path.replace

    def killed_at_the_third_move(self, target):
        moves.append(self.name)
        if len(moves) == 3:
            raise KeyboardInterrupt("the job's end")
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "replace", killed_at_the_third_move)
    with pytest.raises(KeyboardInterrupt):
        archive.write(newer, out, 2048)
    monkeypatch.setattr(pathlib.Path, "replace", real)
    assert archive.read(out, campaign.is_member) == newer, "finished from the staging folder, its manifest written last"
    assert not archive.staging_of(out).exists()
    names = {p.name for p in out.parent.iterdir()}
    assert names == {f"c.tar.gz.part{i:03d}" for i in range(len(names) - 1)} | {"c.tar.gz.manifest.json"}


def test_a_cut_or_swapped_part_and_a_missing_manifest_are_one_line_naming_them(tmp_path, machine_b, capsys):
    files, _ = pack(tmp_path, part_size_mib=0.001)
    parts = files[:-1]
    saved = {p: p.read_bytes() for p in files}
    parts[1].write_bytes(saved[parts[1]][:-10])
    status, err = unpack_in(machine_b, parts[0], capsys)
    assert status == 1 and err.startswith(f"error: {parts[1].name} holds ") and "cut, changed or swapped" in err
    parts[1].write_bytes(saved[parts[1]])
    parts[0].write_bytes(saved[parts[1]]), parts[1].write_bytes(saved[parts[0]])  # two parts of one size, swapped
    status, err = unpack_in(machine_b, parts[0], capsys)
    assert status == 1 and f"{parts[0].name} holds other bytes than the manifest's" in err and len(err.splitlines()) == 1
    for p, data in saved.items():
        p.write_bytes(data)
    files[-1].unlink()
    status, err = unpack_in(machine_b, parts[0], capsys)
    assert status == 1 and "campaign.tar.gz has no manifest (campaign.tar.gz.manifest.json, written last by pack)" in err
    assert tree(machine_b) == {}


def test_a_record_that_disagrees_with_its_run_is_refused_at_unpack(tmp_path, machine_b, capsys):
    """A hand-edited test_acc (0.9 where metrics.csv says 0.1875), a configuration edited after the run (its hash no
    longer its own), a test loss that is not finite: never a committed number, whoever rewrote the manifest to match."""
    files, _ = pack(tmp_path)
    members = archive.read(files[0], campaign.is_member)
    [name] = [name for name in members if name.startswith("results/runs/") and name.endswith(".json")]
    original = json.loads(members[name])
    for edit, message in (
        ({"test_acc": 0.9}, "its test accuracy 0.9 is not the one its run logged in its metrics.csv (0.1875)"),
        ({"protocol": {**SMOKE, "max_steps": 200}}, "but the configuration it holds hashes to"),
        ({"test_loss": None, "non_finite": {"test_loss": "nan"}}, "its test_loss (nan) is not finite"),
    ):
        forged = tmp_path / "carry" / "forged.tar.gz"
        archive.write({**members, name: json.dumps({**original, **edit}).encode()}, forged, 2**20)
        status, said = unpack_in(machine_b, forged, capsys)
        assert status == 1 and message in said and said.rstrip().endswith("nothing unpacked"), said
        assert tree(machine_b) == {}


def committed_beside(machine_b: Path, **changes) -> Path:
    """Machine B's committed record of the finished cell's configuration, with ``changes``."""
    ours = RunRecord.read(machine_b.parent / "a" / "outputs" / FINISHED / "results.json")
    path = machine_b / "results" / "runs" / table.run_file_name(ours)
    path.parent.mkdir(parents=True, exist_ok=True)
    RunRecord.from_dict({**ours.to_dict(committed=True), **changes}).write(path, committed=True)
    return path


def test_a_committed_record_is_never_replaced_by_an_older_one_and_a_conflict_changes_nothing(tmp_path, machine_b, capsys):
    """unpack replaced a committed record with an older one (newer 0.25 -> older 0.50): the table then showed 50.00."""
    files, _ = pack(tmp_path)
    newer = committed_beside(machine_b, test_acc=0.25, finished_at="2027-01-01T00:00:00")
    before = newer.read_bytes()
    status, said = unpack_in(machine_b, files[0], capsys)
    assert status == 0 and newer.read_bytes() == before
    assert f"{newer.name}: a newer run of its configuration is committed; it stays" in said
    conflict = committed_beside(machine_b, test_acc=0.5)  # same finished_at, other results
    before = tree(machine_b)
    status, err = unpack_in(machine_b, files[0], capsys)
    assert status == 1 and f"{conflict.name}: a conflict: the committed record finished at the same time" in err
    assert tree(machine_b) == before
    older = committed_beside(machine_b, test_acc=0.5, finished_at="2025-01-01T00:00:00")
    status, err = unpack_in(machine_b, files[0], capsys)
    assert status == 0 and RunRecord.read(older).test_acc == 0.1875, "the newer replaces the older"


def test_collect_commits_by_the_same_rule(tmp_path, capsys):
    folder, plan = machine_a(tmp_path)
    found = table.find_record_files([Path(plan.output_dir)])
    runs = tmp_path / "runs"
    assert table.collect(found, runs) == 1
    [path] = runs.glob("*.json")
    assert (runs / "curves" / path.name.replace(".json", ".csv")).is_file(), "its curve beside it"
    newer = RunRecord.from_dict({**json.loads(path.read_text()), "test_acc": 0.5, "finished_at": "2027-01-01T00:00:00"})
    newer.write(path, committed=True)
    assert table.collect(found, runs) == 0 and RunRecord.read(path).test_acc == 0.5
    assert "a newer run of its configuration is committed; it stays" in capsys.readouterr().out
    RunRecord.from_dict({**json.loads(path.read_text()), "finished_at": found[1][1].finished_at}).write(path, committed=True)
    with pytest.raises(SystemExit, match="a conflict"):
        table.collect(found, runs)
    record_path = Path(plan.output_dir) / FINISHED / "results.json"
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "test_acc": 0.9}))
    with pytest.raises(SystemExit, match=r"its test accuracy 0\.9 is not the one its run logged"):
        table.check_hashes(table.find_record_files([Path(plan.output_dir)]))


def test_the_table_lists_a_record_that_disagrees_with_its_run_and_never_makes_it_a_cell(tmp_path):
    folder, plan = machine_a(tmp_path)
    record_path = Path(plan.output_dir) / FINISHED / "results.json"
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "test_acc": 0.9}))
    found = table.find_record_files([Path(plan.output_dir)])
    result = table.build([r for _, r in found], rows=table.ALL_ROWS, curves=table.find_curves(found))
    assert not result.sections
    text = table.markdown(result, "test records")
    assert "refused: its test accuracy 0.9 is not the one its run logged in its metrics.csv (0.1875)" in text


def test_state_of_another_configuration_is_refused_at_unpack(tmp_path, machine_b, capsys):
    files, _ = pack(tmp_path)
    other = hashed(record("none", "listops", 0, None, status="interrupted", protocol={**SMOKE, "lr": 0.5}, error="x"))
    (machine_b / "outputs" / INTERRUPTED).mkdir(parents=True)
    other.write(machine_b / "outputs" / INTERRUPTED / "results.json")
    before = tree(machine_b)
    status, err = unpack_in(machine_b, files[0], capsys)
    assert status == 1 and f"but {machine_b / 'outputs' / INTERRUPTED} holds a run of {other.config_hash}" in err
    assert tree(machine_b) == before


def test_a_carried_last_checkpoint_of_another_run_than_its_record_is_refused(tmp_path, machine_b, capsys):
    folder, plan = machine_a(tmp_path)
    last = Path(plan.output_dir) / INTERRUPTED / "checkpoints" / "last.ckpt"
    contents = checkpoints.read(last)
    contents["callbacks"][checkpoints.IDENTITY]["config_hash"] = "0123456789abcdef"
    checkpoints.write(last, contents)
    out = tmp_path / "carry" / "c.tar.gz"
    campaign.write_pack(folder, plan, out, 1.0)
    status, err = unpack_in(machine_b, out, capsys)
    assert status == 1 and "last.ckpt is of configuration 0123456789abcdef (seed 0), not of the record beside it" in err


def test_a_checkpoint_changed_after_it_was_written_is_refused_and_a_write_cut_short_leaves_one_that_reads(tmp_path, monkeypatch):
    """Weights edited after an unpack were resumed silently; a flipped bit in a checkpoint was tested."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    checkpoints.write(path, {"global_step": 3, "state_dict": {"w": torch.zeros(4)}})
    flipped = bytearray(path.read_bytes())
    flipped[len(flipped) // 2] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(checkpoints.CheckpointRefused, match=r"is not the checkpoint that was written there"):
        checkpoints.step(path)
    checkpoints.write(path, {"global_step": 3, "state_dict": {"w": torch.zeros(4)}})
    real = checkpoints.write_atomically
    for killed_at in (2, 3):  # before the new checkpoint is in place, and after it but before its digest alone is
        writes = []

        def killed(target, data, killed_at=killed_at, writes=writes):
            writes.append(target)
            if len(writes) == killed_at:
                raise KeyboardInterrupt
            real(target, data)

        monkeypatch.setattr(checkpoints, "write_atomically", killed)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.write(path, {"global_step": 4 + killed_at, "state_dict": {"w": torch.ones(4)}})
        monkeypatch.setattr(checkpoints, "write_atomically", real)
        assert checkpoints.step(path) == (3 if killed_at == 2 else 4 + killed_at), "the file there reads, whichever it is"
        checkpoints.write(path, {"global_step": 3, "state_dict": {"w": torch.zeros(4)}})


def test_an_unpack_killed_midway_leaves_each_cell_old_or_new_and_the_next_unpack_finishes(
    tmp_path, machine_b, capsys, monkeypatch
):
    """A kill during unpack deleted the local, older last.ckpt, and the next run restarted at step 0 without a word."""
    files, _ = pack(tmp_path)
    local = machine_b / "outputs" / INTERRUPTED
    machine_a(tmp_path / "older")  # an older attempt of the same cell, at step 12 too: made older below
    shutil.copytree(tmp_path / "older" / "a" / "outputs" / INTERRUPTED, local)
    contents = checkpoints.read(local / "checkpoints" / "last.ckpt")
    checkpoints.write(local / "checkpoints" / "last.ckpt", {**contents, "global_step": 5})
    real = os.replace
    for kill in ("before the swap", "between the renames"):

        def cut(source, target, kill=kill):
            if (kill == "before the swap" and str(target).endswith(restore.REPLACED)) or (
                kill == "between the renames" and str(source).endswith(restore.RESTORING)
            ):
                raise KeyboardInterrupt("the job's end")
            real(source, target)

        monkeypatch.setattr(os, "replace", cut)
        with pytest.raises(KeyboardInterrupt):
            campaign.main(["unpack", str(files[0])])
        monkeypatch.setattr(os, "replace", real)
        readable = local if local.exists() else local.with_name(local.name + restore.REPLACED)
        assert checkpoints.step(readable / "checkpoints" / "last.ckpt") == 5, f"killed {kill}: the older state is whole"
        status, said = unpack_in(machine_b, files[0], capsys)
        assert status == 0, said
        assert checkpoints.step(local / "checkpoints" / "last.ckpt") == 12
        assert sorted(p.name for p in local.parent.iterdir()) == ["seed=0"], "nothing left beside it"
        checkpoints.write(local / "checkpoints" / "last.ckpt", {**contents, "global_step": 5})


def test_unpack_beside_a_running_cell_and_a_full_disk_are_one_line(tmp_path, machine_b, capsys, monkeypatch):
    files, _ = pack(tmp_path)
    holder = holding(machine_b / "outputs" / INTERRUPTED)
    try:
        before = tree(machine_b)
        status, err = unpack_in(machine_b, files[0], capsys)
        assert status == 1 and f"is in use by a run (pid {holder.pid} on" in err and len(err.splitlines()) == 1
        assert tree(machine_b) == before
    finally:
        holder.kill()
        holder.wait()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as disk:
        disk.setattr(os, "fsync", full_disk)
        status, err = unpack_in(machine_b, files[0], capsys)
    assert status == 1 and err.startswith("error: no space left") and len(err.splitlines()) == 1


def test_pack_names_the_running_cells_it_left_out_and_the_runs_without_a_curve(tmp_path):
    folder, plan = machine_a(tmp_path)
    (Path(plan.output_dir) / FINISHED / "metrics" / "metrics.csv").unlink()
    holder = holding(Path(plan.output_dir) / INTERRUPTED)
    try:
        said = campaign.write_pack(folder, plan, tmp_path / "carry" / "c.tar.gz", 1.0)
    finally:
        holder.kill()
    assert "1 finished runs of 2 cells (0 with their curves), and the state of 0 unfinished cells" in said
    assert "left out listops / none / seed 0 (running: stop the campaign first, stop --wait, to carry it)" in said
    status = archive.read(tmp_path / "carry" / "c.tar.gz", campaign.is_member)["campaign/status.txt"].decode()
    assert "Campaign process: packed at " in status and "the archive carries no process" in status


@pytest.mark.slow
def test_the_cells_of_a_campaign_that_is_killed_end_with_it(tmp_path):
    """SIGKILL of a campaign left its cells running (a new start's cell then said "in use"). Its cell, held at step 3
    until it is told to stop, ends with it: it saves its state as a stopped run does."""
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    env.update(hold_at_step.environment(3))
    command = [sys.executable, "-m", "lra.campaign", "start", "attention=none", *TINY, hold_at_step.OVERRIDE]
    started = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=True)
    daemon = int(started.stdout.split("in the background (pid ")[1].split(")")[0])
    [cell] = json.loads((tmp_path / "outputs" / "campaign" / campaign.PLAN_FILE).read_text())["cells"]
    folder = Path(cell["folder"])
    deadline = time.monotonic() + 300
    while not (run_lock.holder(folder) and (folder / "checkpoints").is_dir()) and time.monotonic() < deadline:
        time.sleep(0.5)  # training (the evaluation of step 2 wrote its checkpoints), held at step 3
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while run_lock.holder(folder) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not run_lock.holder(folder), "the cell ended with its campaign"
    assert RunRecord.read(folder / "results.json").status == "interrupted", "it saved its state as a stopped run does"


def test_every_torch_load_reads_weights_only():
    """Nothing is unpickled that can run code: every torch.load in the project's code and tests says weights_only=True."""
    root = Path(__file__).resolve().parents[2]
    calls = []
    for path in [
        *root.glob("lra/**/*.py"),
        *root.glob("attention_zoo/*.py"),
        *root.glob("yoso_cuda/**/*.py"),
        *root.glob("tests/**/*.py"),
    ]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # This file and the mutants' list name the call as text: a mutant is what the rule catches.
            if "torch.load(" in line and "weights_only=True" not in line and path.name not in (Path(__file__).name, "mutants.py"):
                calls.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not calls, "\n".join(calls)
