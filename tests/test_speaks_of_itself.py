"""The project speaks of itself and its users: no machine it was built on, no path outside the checkout.

A GPU run is described by its date, device, versions and command; a short GPU job as a user meets one (a queue's
time limit, a preemptible instance). Words about how its developers reach machines, and absolute paths of those
machines, mean nothing to a reader of a fresh checkout, so no tracked file may hold them.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each with what to write instead.
OUTSIDE_WORDS = {
    r"\blent\b": "a GPU machine, a GPU job",
    r"\b(?:gpu|device|job) windows?\b": "a GPU job with a time limit",
    r"\bsessions?\b": "a run, a GPU job, a campaign (and `setsid` for a detached process)",
    r"\.\./shared|\.parent\s*/\s*[\"']shared[\"']|device-wheels": "a path inside the repository, or what a user installs",
    r"/work/|\.mirror\b": "a path relative to the checkout",
}


def tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [ROOT / name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # an exported tree without git: every file under it
        paths = [path for path in ROOT.rglob("*") if path.is_file() and ".git" not in path.parts]
    here = Path(__file__).resolve()
    return [path for path in paths if path.is_file() and path.resolve() != here and b"\0" not in path.read_bytes()[:8192]]


@pytest.mark.parametrize("pattern", OUTSIDE_WORDS)
def test_no_tracked_file_speaks_of_the_machines_it_was_built_on(pattern):
    found = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(pattern, line, flags=re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, f"write {OUTSIDE_WORDS[pattern]!r} instead:\n" + "\n".join(found)


def test_the_check_finds_such_a_word():
    """The patterns match what they are meant to (a pattern that matches nothing would pass anything)."""
    samples = ["on the lent H200", "a GPU window of 15 minutes", "the first session's", "../shared/x", "/work/main/x"]
    for sample, pattern in zip(samples, OUTSIDE_WORDS, strict=True):
        assert re.search(pattern, sample, flags=re.IGNORECASE), (pattern, sample)
    assert re.search(list(OUTSIDE_WORDS)[3], 'REPO.parent / "shared" / "x.tex"'), "the same path, built in Python"
    assert not any(re.search(p, "a sliding window of 512 keys", flags=re.IGNORECASE) for p in OUTSIDE_WORDS)
