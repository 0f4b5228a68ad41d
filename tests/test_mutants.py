"""The mutation check's list (tests/mutants.py) stays runnable: each mutant's snippet occurs exactly once in its
module, changes it, and names test files that exist. The check itself runs outside CI: ``python tests/mutants.py``."""

import mutants
import pytest


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda mutant: mutant.name)
def test_every_mutant_applies_to_exactly_one_place(mutant):
    source = (mutants.ROOT / mutant.path).read_text()
    assert source.count(mutant.original) == 1, f"{mutant.name}: update its snippet in tests/mutants.py"
    assert mutants.mutate(source, mutant) != source
    compile(mutants.mutate(source, mutant), mutant.path, "exec")  # the mutant is a bug, not a syntax error
    assert mutant.tests and all((mutants.ROOT / test).is_file() for test in mutant.tests)
    assert mutant.path.split("/")[0] in mutants.COPIED, "the module is in the copy the tests run against"


def test_mutant_names_are_unique_and_listed():
    names = [mutant.name for mutant in mutants.MUTANTS]
    assert len(names) == len(set(names))
    assert 15 <= len(names) <= 30
