"""Every command in the ```bash blocks of the README and of docs/ runs, so neither can drift from the code.

The README is read at test time, so a command added later is covered too. Each command (a line of
a bash block, continuation lines joined, comments dropped, ``&&`` chains split) is matched by the
first rule in RULES, which says how it runs here:

* ``run``: as written, in one scratch folder shared by the commands in README order (so
  ``lra.table --collect`` finds the runs made before it), optionally with a tiny form: text
  substitutions, then options or overrides appended (a later Hydra override or argparse option wins);
* a multirun sweep (``lra.train -m``) runs once with ``-m`` dropped, every comma list cut to its
  first value and ``--cfg job`` appended (Hydra cannot combine ``-m`` and ``--cfg``), and every
  value of every list is composed with Hydra's compose API;
* ``not run``: skipped with the reason, which pytest reports (``-rs``): nothing is left out silently.

A command that no rule matches fails ``test_every_readme_command_has_a_rule``: add a rule for it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lra"))
from tiny_listops import TINY  # noqa: E402

from lra.config import run_name  # noqa: E402

TINY_DATA = [
    o
    for o in TINY
    if not o.startswith(("task.protocol.max_steps", "task.protocol.warmup_steps", "task.protocol.val_check_interval"))
]
CFG_JOB = ("--cfg", "job")
# The folder the quick start's tiny form runs in (the docs name the plain form's, outputs/listops/softmax/default):
# Hydra's override dirname, the overrides sorted without the trainer's (lra/conf/config.yaml's exclude_keys).
QUICK_START_FOLDER = "outputs/listops/softmax/" + run_name(",".join(sorted(o for o in TINY if not o.startswith("trainer."))))


@dataclass(frozen=True)
class Rule:
    pattern: str  # a regular expression searched in the command
    append: tuple[str, ...] = ()  # options or overrides appended to the command
    substitute: tuple[tuple[str, str], ...] = ()  # (old, new) text replacements, before appending
    not_run: str = ""  # the reason a command is not run here
    why: str = ""  # why the command runs in this form rather than as written
    check: Callable[[Path], None] | None = None  # that it did what the README says, given the scratch folder


def records(workspace: Path) -> list[dict]:
    """Every results.json under the scratch folder's outputs."""
    return [json.loads(path.read_text()) for path in sorted((workspace / "outputs").rglob("results.json"))]


def quick_start_run(workspace: Path) -> tuple[dict, int]:
    """The quick start's run (softmax, seed 0, 6 steps): its record and how many earlier runs it archived."""
    (path,) = [
        path
        for path in sorted((workspace / "outputs").rglob("results.json"))
        if "history" not in path.parts and (record := json.loads(path.read_text()))["attention"] == "softmax"
        if record["seed"] == 0 and record["protocol"]["max_steps"] == 6 and record.get("precision", "32-true") == "32-true"
    ]
    return json.loads(path.read_text()), len(list(path.parent.glob("history/*/record.json")))


def check_quick_start(workspace: Path) -> None:
    record, archived = quick_start_run(workspace)
    assert record["status"] == "finished" and record["steps"] == 6 and archived == 0


def check_rerun(archived: int, **expected) -> Callable[[Path], None]:
    """The quick-start run ran again with ``expected`` in its record, the earlier runs archived under history/."""

    def check(workspace: Path) -> None:
        record, found = quick_start_run(workspace)
        assert record["status"] == "finished" and found == archived
        assert {key: record[key] for key in expected} == expected

    return check


def check_bf16(workspace: Path) -> None:
    """The quick start in bf16: a run of its own, in a folder of its own; the float32 run is left as it was."""
    (bf16,) = [r for r in records(workspace) if r.get("precision") == "bf16-mixed"]
    assert bf16["status"] == "finished" and bf16["steps"] == 6
    assert Path(bf16["best_checkpoint"]).parents[1].name.startswith("precision=bf16-mixed,")
    check_rerun(1, precision="32-true", compiled=True)(workspace)


def check_tensorboard(workspace: Path) -> None:
    check_rerun(2)(workspace)
    record, _ = quick_start_run(workspace)
    folder = Path(record["best_checkpoint"]).parents[1]
    assert list(folder.rglob("events.out.tfevents.*")), "TensorBoard event files in the run's folder"


RULES = [
    Rule(r"^pip install", not_run="installs packages from the network; .ci/run installs the project in a fresh environment"),
    Rule(r"^pytest", not_run="the test suite itself, which this test is part of"),
    Rule(r"^ruff ", not_run="lints the checkout; .ci/run runs it before the tests"),
    Rule(r"^CUDA_HOME=", not_run="compiles the CUDA kernels (minutes); .ci/run does it where nvcc is installed"),
    Rule(r"^python -m lra\.train$", append=tuple(TINY), why="the quick start on the tiny ListOps", check=check_quick_start),
    Rule(
        r"^python -m lra\.train task\.protocol\.max_steps=\d+$",
        append=tuple(TINY_DATA),
        why="the shortened run on the tiny ListOps, its protocol as written",
        check=lambda workspace: any(r["steps"] == 20 and r["status"] == "finished" for r in records(workspace)),
    ),
    Rule(
        r"^python -m lra\.train attention=none seed=1$",
        append=tuple(TINY),
        why="another run on the tiny ListOps",
        check=lambda workspace: any(r["attention"] == "none" and r["seed"] == 1 for r in records(workspace)),
    ),
    Rule(
        r"^python -m lra\.train trainer\.compile=true rerun=true$",
        append=tuple(TINY),
        why="the quick start's run again, compiled",
        check=check_rerun(1, compiled=True, compile_backend="inductor"),
    ),
    Rule(
        r"^python -m lra\.train trainer\.precision=bf16-mixed$",
        append=tuple(TINY),
        why="the quick start in bf16 mixed precision, a run of its own",
        check=check_bf16,
    ),
    Rule(
        r"^python -m lra\.train logger=tensorboard rerun=true$",
        append=tuple(TINY),
        why="the quick start's run again, logged for TensorBoard (tensorboardX, a dev dependency, writes the events)",
        check=check_tensorboard,
    ),
    Rule(
        r"^python -m lra\.train logger=wandb ",
        append=CFG_JOB,
        why="needs the wandb package, which is not a dependency: its config only",
    ),
    Rule(r"^python -m lra\.train .*--cfg", why="composes the config only"),
    Rule(r"^python -m lra\.train --help$", why="the choices and the common command lines"),
    Rule(
        r"\bmy_attention\b",
        not_run="the README's example attention exists only in the copy of the project that "
        "tests/test_add_an_attention.py makes, which runs this command",
    ),
    Rule(r"^python -m lra\.train -m ", append=CFG_JOB, why="a sweep: its first cell's config, every value composed"),
    Rule(
        r"^python -m lra\.train\b",
        append=CFG_JOB,
        why="trains for minutes to days or needs a GPU or official data: its config only",
    ),
    Rule(
        r"^python -m lra\.data generate listops",
        append=("--num-train", "20", "--num-val", "5", "--num-test", "5", "--min-length", "5", "--max-length", "40"),
        why="a tiny ListOps",
    ),
    Rule(
        r"^python -m lra\.data generate pathfinder", substitute=(("--num-samples 200000", "--num-samples 20"),), why="20 images"
    ),
    Rule(r"^python -m lra\.data prepare pathfinder --source data/pathfinder32$", why="prepares the 20 generated images"),
    Rule(r"^python -m lra\.data info", why="lists what the commands before it prepared"),
    Rule(r"^python -m lra\.data \w+", append=("--help",), why="needs the official files or the network: its help"),
    Rule(
        r"^python -m lra\.table .*--protocol spt_short",
        append=("--help",),
        why="needs the spt_short runs (tests/lra/test_table.py makes results/spt.* from the committed records): its help",
    ),
    Rule(r"^python -m lra\.table", why="the table of the runs made before it"),
    Rule(
        r"^python -m lra\.evaluate outputs/listops/softmax/default ",
        substitute=(("outputs/listops/softmax/default", QUICK_START_FOLDER),),
        why="the quick start's run, in the folder its tiny form ran in",
    ),
    Rule(
        r"^python -m lra\.bench kernels",
        append=(
            "--lengths",
            "256",
            "--head-dims",
            "16",
            "--dtypes",
            "float32",
            "--min-run-time",
            "0.01",
            "--reference-max-length",
            "256",
            "--out",
            "bench",
        ),
        why="one small length",
    ),
    Rule(
        r"^python -m lra\.bench efficiency",
        append=("--lengths", "64", "--attentions", "softmax", "yoso_32", "--min-run-time", "0.01", "--quiet", "--out", "bench"),
        why="two attentions at one small length",
    ),
    Rule(
        r"^python -m lra\.bench approx --run .*<run>",
        append=("--help",),
        why="needs a trained YOSO run (tests/lra/test_bench_approx.py runs it on one): its help",
    ),
    Rule(
        r"^python -m lra\.bench step",
        append=("--tasks", "listops", "--attentions", "none", "yoso_32", "--seq-len", "64", "--batch", "2")
        + ("--max-run-time", "0.2", "--warmup", "0", "--quiet", "--out", "bench"),
        why="two attentions on a small ListOps (the full grid takes an hour)",
    ),
    Rule(r"^python -m lra\.bench gpu", append=("--help",), why="needs a GPU: its help"),
    Rule(r"^ncu ", not_run="Nsight Compute profiles kernels on an NVIDIA GPU"),
    Rule(
        r"^python -m lra\.bench authors",
        not_run="needs checkouts of the authors' code (mlpen/Nystromformer, lucidrains/performer-pytorch), never part of this "
        "project; tests/lra/test_bench_authors.py runs it on a stand-in",
    ),
    Rule(
        r"^python -m lra\.campaign (start|measure) ",
        append=("--dry-run",),
        why="trains for hours on a GPU: every cell composed and listed, what would run",
    ),
    Rule(r"^python -m lra\.campaign stop( |$)", why="no campaign runs here: says so"),
    Rule(
        r"^python -m lra\.campaign resume ",
        not_run="starts a campaign's latest plan, in its folder or unpacked here; tests/lra/test_campaign.py resumes one in "
        "its folder and after unpack",
    ),
    Rule(
        r"^python -m lra\.campaign pack ",
        not_run="packs a campaign's folder; tests/lra/test_campaign.py packs one and unpacks it in a fresh folder",
    ),
    Rule(
        r"^python -m lra\.campaign (status|unpack)",
        not_run="reads a campaign or the archive of one; tests/lra/test_campaign.py starts one, polls it, packs and unpacks it",
    ),
    Rule(
        r"^python -m lra\.bench pathfinder_cnn",
        append=("--contour-lengths", "6", "--num-images", "100", "--steps", "4", "--eval-every", "2", "--batch-size", "16")
        + ("--generated-dir", "generated", "--quiet", "--out", "bench"),
        why="100 generated images of contour length 6, four steps (the three lengths take half an hour)",
    ),
    Rule(r"^python -m lra\.bench", why="as written"),
    Rule(r"^python -m yoso_cuda$", why="loads the kernels built before the tests (.ci/run builds them)"),
    Rule(r"^python -m yoso_cuda --check$", why="every compiled op against the reference on this machine's devices"),
    Rule(
        r"^python tests/mutants\.py( --kind \w+)?$",
        substitute=(("tests/mutants.py", str(REPO / "tests" / "mutants.py")),),
        append=("--list",),
        why="runs the tests against every mutant (a build of the emulator for each CUDA one, minutes each): its list",
    ),
    Rule(r"^python -c ", why="as written"),
    Rule(r"^sudo apt-get install ", not_run="installs system packages; .ci/run installs the SLURM test cluster's"),
    Rule(
        r"^sudo python3 tests/lra/slurm_cluster\.py$",
        not_run="a SLURM cluster that runs until Ctrl-C; tests/lra/test_slurm.py starts the same one",
    ),
    Rule(r"^export SLURM_CONF=", not_run="points at the cluster started above"),
    Rule(r"^sacct ", not_run="reads the cluster started above"),
]


# The README, then the docs it links, in the order a reader follows them: their commands share one scratch folder,
# so a later page's command may use what an earlier one made (docs/training.md's reruns, the quick start's run).
DOCUMENTS = [
    "README.md",
    "docs/training.md",
    "docs/tasks.md",
    "docs/protocols.md",
    "docs/attentions.md",
    "docs/self-pretraining.md",
    "docs/scale-out.md",
    "docs/kernels.md",
    "docs/benchmarks.md",
]


def readme_commands(documents: list[str] = DOCUMENTS) -> list[str]:
    """Every command of the bash blocks of the README and the docs, in order, each once: a command repeated on another
    page (the campaign's start, lra.table's) runs where it first appears."""
    commands = []
    text = "\n".join((REPO / document).read_text() for document in documents)
    for body in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment: "  # what it does"
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return list(dict.fromkeys(re.sub(r"\s+", " ", command) for command in commands))


def rule_for(command: str) -> Rule | None:
    return next((rule for rule in RULES if re.search(rule.pattern, command)), None)


COMMANDS = readme_commands()


def test_every_page_of_the_docs_is_read_for_its_commands():
    assert sorted(f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")) == sorted(DOCUMENTS[1:])


def test_every_readme_command_has_a_rule():
    assert COMMANDS, "no bash blocks found in README.md"
    unmatched = [command for command in COMMANDS if rule_for(command) is None]
    assert not unmatched, f"add a rule to tests/test_readme.py for: {unmatched}"


def sweep_lists(args: list[str]) -> tuple[list[str], list[list[str]]]:
    """The overrides of a multirun with its comma lists cut to their first value, and the sets of
    overrides (zip of the lists, the last value repeated) that together use every value once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [arg for arg in args if arg != "-m"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    values = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    first = [options[0] for options in values]
    longest = max(len(options) for options in values)
    every = [[options[min(i, len(options) - 1)] for options in values] for i in range(longest)]
    return first, every


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command, workspace):
    rule = rule_for(command)
    assert rule is not None, f"no rule for {command!r}"
    if rule.not_run:
        pytest.skip(f"not run: {rule.not_run}")
    for old, new in rule.substitute:
        assert old in command, f"the rule for {command!r} substitutes {old!r}, which the command no longer has"
        command = command.replace(old, new)
    args = shlex.split(command)
    if args[:3] == ["python", "-m", "lra.train"] and "-m" in args[3:]:
        first, every = sweep_lists(args[3:])
        for overrides in every:
            compose_config(overrides)
        args = args[:3] + first
    args += rule.append
    args[0] = sys.executable if args[0] == "python" else args[0]
    env = {key: value for key, value in os.environ.items() if not key.startswith("LRA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    process = subprocess.run(args, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)
    assert process.returncode == 0, f"{command} ({rule.why}) failed:\n{process.stdout[-2000:]}\n{process.stderr[-3000:]}"
    if rule.check is not None:
        assert rule.check(workspace) is not False, f"{command} ({rule.why}) did not do what the README says"


def compose_config(overrides: list[str]) -> None:
    """Compose ``overrides`` as ``python -m lra.train`` would, hydra's own settings included."""
    from lra import config

    config.compose(overrides, return_hydra_config=True)


def test_a_slurm_sweep_on_gpus_asks_slurm_for_them_and_for_more_than_the_default_hour():
    """submitit's defaults are no GPU and 60 minutes: a GPU sweep that kept them would train on no GPU, or be killed
    long before a cell of the paper's protocol ends (an interrupted cell resumes, but every hour restarts it)."""
    slurm = [command for command in COMMANDS if "hydra/launcher=submitit_slurm" in command and "trainer=" in command]
    assert slurm, "the README and the docs show a SLURM sweep on GPUs"
    for command in slurm:
        first, _ = sweep_lists(shlex.split(command)[4:])
        from lra import config

        cfg = config.compose(first, return_hydra_config=True)
        devices = cfg.trainer.get("devices", 1)
        devices = devices if isinstance(devices, int) else 1
        assert cfg.hydra.launcher.gpus_per_node and cfg.hydra.launcher.gpus_per_node >= devices, command
        assert cfg.hydra.launcher.timeout_min > 60, command


def test_sweep_lists_cover_every_value():
    first, every = sweep_lists(["-m", "task=listops,pathfinder", "attention=softmax,yoso_32", "seed=0,1,2", "trainer=gpu"])
    assert first == ["task=listops", "attention=softmax", "seed=0", "trainer=gpu"]
    assert every == [
        ["task=listops", "attention=softmax", "seed=0", "trainer=gpu"],
        ["task=pathfinder", "attention=yoso_32", "seed=1", "trainer=gpu"],
        ["task=pathfinder", "attention=yoso_32", "seed=2", "trainer=gpu"],
    ]
