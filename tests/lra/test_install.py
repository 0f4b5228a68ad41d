"""A non-editable install runs the main job from an empty folder: the configuration and the kernel sources ship."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_listops import TINY

REPO = Path(__file__).resolve().parents[2]


def tracked(*patterns):
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", *patterns], capture_output=True, text=True, check=True)
    return listed.stdout.split()


@pytest.mark.slow
def test_an_installed_copy_trains_from_an_empty_folder_and_writes_only_there(tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # Everything the code reads at run time: the Hydra configuration and YOSO's kernel sources, compiled on first use.
    shipped = tracked("lra/conf/*.yaml", "yoso_cuda/csrc/*", "yoso_cuda/emulator/*.h", "yoso_cuda/emulator/*.cpp")
    assert len(shipped) > 30
    assert [name for name in shipped if not (site / name).is_file()] == []
    installed = sorted(path for path in site.rglob("*") if "__pycache__" not in path.parts)

    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("LRA_")}
    env["PYTHONPATH"] = str(site)  # the installed copy, not the checkout
    where = subprocess.run(
        [sys.executable, "-c", "import lra; print(lra.__file__)"], cwd=empty, env=env, capture_output=True, text=True, check=True
    )
    assert Path(where.stdout.strip()).is_relative_to(site)
    for command in ([sys.executable, "-m", "lra.train"], [str(site / "bin" / "lra-train"), "attention=none"]):
        process = subprocess.run([*command, *TINY], cwd=empty, env=env, capture_output=True, text=True, timeout=300)
        assert process.returncode == 0, process.stderr[-3000:]
    results = sorted(path.relative_to(empty).parts[:3] for path in empty.rglob("results.json"))
    assert results == [("outputs", "listops", "none"), ("outputs", "listops", "softmax")]
    assert (empty / "data" / "generated").is_dir()
    assert sorted(path for path in site.rglob("*") if "__pycache__" not in path.parts) == installed, "wrote into the install"
