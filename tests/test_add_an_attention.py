"""The README's "Add an attention" section, followed literally: its two blocks, written where their first
lines say, into a copy of the project, and every contract test run on the attention they add.

The example is a mean-pool mixer: a hyperparameter, a preset, no matrix product and no float32 need,
so a contract test that checks how today's attentions compute rather than what every attention owes
fails here. A contract test is one parametrized over every built-in attention; each must also have
run, and passed, on the new one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lra"))
from tiny_listops import TINY  # noqa: E402

CONTRACT = [
    "tests/attention_zoo",
    "tests/lra/test_every_attention_trains.py",
    "tests/lra/test_compile.py",
    "tests/lra/test_config.py",
]
NEW = "my_attention"


def readme_commands(section: str) -> list[str]:
    """The commands of a README section's bash blocks, in order."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def readme_blocks(section: str) -> dict[str, str]:
    """The code blocks of a README section by the path their first line names (``# path`` or ``# path: ...``)."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", body, flags=re.S):
        path = re.match(r"# ([\w/.]+)", block).group(1)
        blocks[path] = block
    return blocks


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "LRA_DATA_DIR": str(cwd / "data"), "LRA_OUTPUT_DIR": str(cwd / "outputs")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_example_names_the_two_files_it_adds():
    assert sorted(readme_blocks("Add an attention")) == [f"attention_zoo/{NEW}.py", f"lra/conf/attention/{NEW}.yaml"]


@pytest.mark.slow
def test_an_attention_added_as_the_readme_says_passes_every_contract_test(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("attention_zoo", "lra", "tests"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path)  # pytest's markers and options
    for path, block in readme_blocks("Add an attention").items():
        (tmp_path / path).write_text(block)

    # The copy is what the subprocesses import: PYTHONPATH comes before the editable install.
    listed = run(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *CONTRACT], tmp_path)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    cases = defaultdict(set)  # test function -> the words of its parameter ids
    for node in re.findall(r"^(\S+::\S+?)\[(.*)\]$", listed.stdout, flags=re.M):
        cases[node[0]] |= set(re.split(r"[-=\[\]]", node[1]))
    registered = run(["-c", "import attention_zoo; print(*attention_zoo.available())"], tmp_path)
    assert NEW in registered.stdout.split(), registered.stdout + registered.stderr
    built_in = set(registered.stdout.split()) - {NEW}
    contract = sorted(test for test, words in cases.items() if built_in <= words)
    assert len(contract) >= 10, f"too few contract tests found: {contract}"
    assert [test for test in contract if NEW not in cases[test]] == [], "contract tests that do not cover the new attention"

    report = tmp_path / "report.xml"
    tested = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", NEW, f"--junitxml={report}", *CONTRACT], tmp_path)
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-3000:]
    passed, not_passed = defaultdict(int), []
    for case in ET.parse(report).iter("testcase"):
        test = case.get("classname").replace(".", "/") + ".py::" + case.get("name").split("[")[0]
        if len(case) == 0:  # no failure, error or skipped element
            passed[test] += 1
        else:
            not_passed.append(case.get("name"))
    assert not_passed == [], "skipped for the new attention"
    assert [test for test in contract if not passed[test]] == [], "contract tests with no passing case for the new attention"


def test_the_readmes_contract_test_command_runs_every_contract_test_on_the_new_attention():
    (command,) = [command for command in readme_commands("Add an attention") if command.startswith("pytest")]
    args = command.split()
    assert args[args.index("-k") + 1] == NEW and [arg for arg in args if arg.startswith("tests/")] == CONTRACT


@pytest.mark.slow
def test_an_attention_added_as_the_readme_says_trains_into_the_comparison_table(tmp_path):
    """Issue 36: the README's example attention, added and trained as the section says (on a tiny ListOps), is a
    row of ``python -m lra.table``'s table with a number, and the table leaves the committed results alone."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("attention_zoo", "lra", "results"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=ignore)
    for path, block in readme_blocks("Add an attention").items():
        (tmp_path / path).write_text(block)
    committed = {path: path.read_bytes() for path in (tmp_path / "results").rglob("*") if path.is_file()}

    commands = [command for command in readme_commands("Add an attention") if command.startswith("python -m")]
    assert [command.split()[2] for command in commands] == ["lra.train", "lra.table"]
    for command in commands:
        args = command.split()[1:] + (TINY if "lra.train" in command else [])
        process = run(args, tmp_path)
        assert process.returncode == 0, f"{command}:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}"

    text = (tmp_path / "outputs" / "comparison.md").read_text()
    for row in (NEW, f"{NEW}_pooled", "softmax", "yoso-32"):
        assert re.search(rf"^\| {row} \| (\*\*)?\d+\.\d\d ± \d+\.\d\d", text, flags=re.M), f"no row {row} with a number"
    assert "Not in the table" not in text, "every run that finished is a row"
    assert {path: path.read_bytes() for path in (tmp_path / "results").rglob("*") if path.is_file()} == committed
