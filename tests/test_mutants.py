"""The mutation check's list (tests/mutants.py) stays runnable: each mutant's snippet, Python or CUDA, occurs
exactly once in its file, changes it, and names test files that exist. The check itself runs outside CI:
``python tests/mutants.py``."""

import importlib.util
import sys
from pathlib import Path

import mutants
import pytest


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda mutant: mutant.name)
def test_every_mutant_applies_to_exactly_one_place(mutant):
    source = (mutants.ROOT / mutant.path).read_text()
    assert source.count(mutant.original) == 1, f"{mutant.name}: update its snippet in tests/mutants.py"
    assert mutants.mutate(source, mutant) != source
    assert mutant.tests and all((mutants.ROOT / test).is_file() for test in mutant.tests)
    assert mutant.kind in mutants.KINDS
    if mutant.kind == "python":
        if mutant.path.endswith(".py"):  # else a file the tests read, such as the README's quoted numbers
            compile(mutants.mutate(source, mutant), mutant.path, "exec")  # the mutant is a bug, not a syntax error
        assert mutant.path.split("/")[0] in mutants.COPIED, "the module is in the copy the tests run against"


def test_a_python_mutant_replaces_its_module_in_the_copy_and_puts_it_back(tmp_path):
    mutant = next(m for m in mutants.MUTANTS if m.kind == "python")
    source = (mutants.ROOT / mutant.path).read_text()
    (tmp_path / mutant.path).parent.mkdir(parents=True)
    (tmp_path / mutant.path).write_text(source)
    with mutants.applied(mutant, mutants.mutate(source, mutant), tmp_path) as variables:
        assert (tmp_path / mutant.path).read_text() == mutants.mutate(source, mutant) and variables == {}
    assert (tmp_path / mutant.path).read_text() == source
    assert mutants.tests_folder(mutants.KINDS[mutant.kind], tmp_path) == tmp_path


def test_a_cuda_mutant_reaches_the_repositorys_emulated_tests_from_a_folder_kept_between_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    mutant = next(m for m in mutants.MUTANTS if m.kind == "cuda")
    kind = mutants.KINDS[mutant.kind]
    text = mutants.mutate((mutants.ROOT / mutant.path).read_text(), mutant)
    with mutants.applied(mutant, text, tmp_path / "copy") as variables:
        (path,) = map(Path, variables.values())
        assert path.parent == tmp_path / "yoso_mutants" / mutant.name and path.read_text() == text
        monkeypatch.setenv(*variables.popitem())
        (test_file,) = mutant.tests
        spec = importlib.util.spec_from_file_location("emulated_tests", mutants.ROOT / test_file)
        emulated_tests = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, emulated_tests)  # its dataclasses look their module up there
        spec.loader.exec_module(emulated_tests)
        assert emulated_tests.SOURCE == path, "the emulated tests build the mutated copy"
    assert path.read_text() == text, "kept for the next run, whose build of it is then reused"
    assert mutants.tests_folder(kind, tmp_path / "copy") == mutants.ROOT, "in place: builds from the repository's paths"
    assert "YOSO_KERNELS" not in dict(kind.environment), "the emulator needs the compiled CPU library for the op schemas"


def test_mutant_names_are_unique_and_listed():
    names = [mutant.name for mutant in mutants.MUTANTS]
    assert len(names) == len(set(names))
    counts = {kind: sum(mutant.kind == kind for mutant in mutants.MUTANTS) for kind in mutants.KINDS}
    assert 15 <= counts["python"] <= 60 and 10 <= counts["cuda"] <= 30, counts
