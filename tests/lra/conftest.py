import os
import subprocess
import sys

import pytest
from tiny_listops import TINY

# The presets whose test_training_from_the_command_line runs here, after -k and -m: the sweep of
# test_every_attention_trains.py trains those only.
COMMAND_LINE_PRESETS = pytest.StashKey[list]()


@pytest.hookimpl(trylast=True)  # after the deselection by -k and -m
def pytest_collection_modifyitems(config, items):
    config.stash[COMMAND_LINE_PRESETS] = [
        item.callspec.params["name"] for item in items if item.originalname == "test_training_from_the_command_line"
    ]


@pytest.fixture(scope="module")
def command_line_presets(request):
    return request.config.stash[COMMAND_LINE_PRESETS]


@pytest.fixture
def tiny_overrides():
    return list(TINY)


@pytest.fixture
def run_train(tmp_path):
    """Run ``python -m lra.train`` on the tiny ListOps with data and outputs under ``tmp_path``."""

    def run(*extra, flags=(), check=True, overrides=TINY, env=None):
        """``overrides``: the tiny settings (replace them to drop some); ``extra``: the test's own."""
        env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs"), **(env or {})}
        process = subprocess.run(
            [sys.executable, "-m", "lra.train", *flags, *overrides, *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and process.returncode != 0:
            raise AssertionError(f"lra.train failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}")
        return process

    return run


@pytest.fixture
def refuse_train(tmp_path, monkeypatch, capsys):
    """``python -m lra.train`` run in this process as far as its command line's own checks (``lra.train.cli``), which
    refuse a bad override before Hydra starts; its exit status and what it printed on stderr. A command they let
    through fails the test rather than train here. (The commands that reach Hydra run in a process of their own,
    :func:`run_train`; a process per refusal spent 3 s starting.)"""
    from lra import train

    def reached_hydra():
        raise AssertionError("the command line's checks let the command through to Hydra")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(train, "main", reached_hydra)

    def refuse(*extra, flags=()):
        monkeypatch.setattr(sys, "argv", ["lra.train", *flags, *TINY, *extra])
        with pytest.raises(SystemExit) as exited:
            train.cli()
        return exited.value.code, capsys.readouterr().err

    return refuse
