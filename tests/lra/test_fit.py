"""``lra.fit.instantiate``: a config's ``_target_`` that cannot be built is one message saying why."""

import pytest
from omegaconf import OmegaConf

from lra.fit import instantiate


def test_a_name_the_module_does_not_have_is_named_with_the_likely_causes():
    node = OmegaConf.create({"_target_": "lra.callbacks.StepProgresBar"})
    with pytest.raises(RuntimeError, match=r"callbacks.progress_bar: lra.callbacks has no 'StepProgresBar' \(a typo"):
        instantiate(node, "callbacks.progress_bar")


def test_a_missing_package_is_named_as_one():
    node = OmegaConf.create({"_target_": "no_such_package_here.Logger"})
    with pytest.raises(RuntimeError, match=r"the logger \(no_such_package_here.Logger\) needs a package that is not installed"):
        instantiate(node, "the logger")


def test_an_error_of_the_constructor_itself_is_not_reworded():
    node = OmegaConf.create({"_target_": "lra.callbacks.CheckpointOnInterrupt", "no_such_argument": 1})
    with pytest.raises(Exception, match="no_such_argument") as error:
        instantiate(node, "callbacks.on_interrupt")
    assert not isinstance(error.value, RuntimeError) or "needs a package" not in str(error.value)
