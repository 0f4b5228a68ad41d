"""The Hydra configuration without running anything: presets, protocol checks (fast, the compose API)."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import attention_zoo
from lra import config, paper
from lra.config import checked
from lra.protocol import Protocol
from lra.results import CLASSIFICATION
from lra.run import pretraining_stage

PRESETS = config.attention_rows()


def composed(*overrides):
    return config.compose(overrides)


def yaml_value(value):
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_lists_every_hyperparameter_so_each_can_be_overridden(preset):
    """A preset is a table row's whole definition: every hyperparameter of its attention, so a changed
    library default cannot change a row, and ``attention.hparams.<key>=...`` works without ``+``."""
    cfg = composed(f"attention={preset}")
    fields = [field.name for field in dataclasses.fields(attention_zoo.get_class(cfg.attention.name).Config)]
    assert sorted(cfg.attention.hparams) == sorted(fields)
    attention_zoo.make_config(cfg.attention.name, **OmegaConf.to_container(cfg.attention.hparams))
    overrides = [f"attention.hparams.{key}={yaml_value(value)}" for key, value in cfg.attention.hparams.items()]
    again = composed(f"attention={preset}", *overrides)
    assert again.attention.hparams == cfg.attention.hparams


def test_a_runs_table_row_is_its_attention_and_its_changes_to_it_in_any_order():
    overrides = ["seed=1", "attention.hparams.num_hash=8", "task=listops", "+attention.hparams.extra=1"]
    expected = "yoso_32 +attention.hparams.extra=1 attention.hparams.num_hash=8"
    assert config.row_name("yoso_32", overrides) == config.row_name("yoso_32", overrides[::-1]) == expected
    assert config.row_name("softmax", ["seed=1"]) == "softmax"


def test_the_readme_override_of_softmax_dropout():
    assert composed("attention.hparams.dropout=0.0").attention.hparams.dropout == 0.0


def protocol(**changes):
    cfg = composed("task.protocol.name=test")  # the smoke protocol: 400 steps, warmup 40, evaluation every 50
    return {**OmegaConf.to_container(cfg.task.protocol), **changes}


def test_a_shortened_run_gets_a_warmup_and_an_evaluation_that_fit_in_a_new_config():
    cfg = composed("task.protocol.name=test", "task.protocol.max_steps=20", "pretrain=mlm")
    fitted, adjusted = checked(cfg, CLASSIFICATION)
    assert (fitted.task.protocol.warmup_steps, fitted.task.protocol.val_check_interval) == (2, 20)
    assert (cfg.task.protocol.warmup_steps, cfg.task.protocol.val_check_interval) == (40, 50), "the composed config is kept"
    assert {key: (change["from"], change["to"]) for key, change in adjusted.items()} == {
        "warmup_steps": (40, 2),
        "val_check_interval": (50, 20),
    }
    # The pretraining protocol defaults to the task's, so it has the fitted values and nothing of its own to fit.
    assert (fitted.pretrain.protocol.warmup_steps, fitted.pretrain.protocol.val_check_interval) == (2, 20)
    assert Protocol.checked(protocol(max_steps=10)).fitted()["warmup_steps"]["to"] == 0, "OneCycleLR cannot warm up one step"
    assert Protocol.checked(protocol(max_steps=10)).fitted()["warmup_steps"]["why"] == (
        "must be below max_steps=10; a tenth of it is 1, below the schedule's smallest warmup of 2, so none"
    )
    assert Protocol.checked(protocol(max_steps=30)).fitted()["warmup_steps"]["why"] == "must be below max_steps=30; a tenth of it"
    assert Protocol.checked(protocol()).fitted() == {}, "a protocol that fits is left alone"


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(max_steps="ten"), TypeError, "task.protocol.max_steps must be int, got 'ten'"),
        (dict(lr=True), TypeError, "task.protocol.lr must be float"),
        (dict(batch_size=0), ValueError, "task.protocol.batch_size must be at least 1"),
        (dict(warmup_steps=1), ValueError, "task.protocol.warmup_steps=1 does not fit the learning-rate schedule"),
        (dict(lr=-1.0), ValueError, "task.protocol.lr must be positive, got -1.0"),
        (dict(max_step=20), ValueError, "unknown task.protocol field(s) ['max_step']"),
    ],
)
def test_a_bad_protocol_names_the_field(changes, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Protocol.checked(protocol(**changes))


def test_an_unknown_protocol_field_in_the_config_is_an_error_not_ignored():
    cfg = composed("+task.protocol.max_step=20")
    with pytest.raises(ValueError, match=r"unknown task.protocol field\(s\) \['max_step'\]"):
        checked(cfg, CLASSIFICATION)


def test_the_pretraining_stage_writes_every_checkpoint_in_its_own_folder():
    """Its last.ckpt on an interrupt too: in the fine-tuning run's folder, the fine-tuning run would resume from it."""
    cfg = composed("pretrain=mlm", "paths.output_dir=/runs")
    pretraining, folder = pretraining_stage(cfg, "softmax")
    assert folder.parent == Path("/runs/pretrain/listops")
    dirpaths = {name: node.dirpath for name, node in pretraining.callbacks.items() if "dirpath" in node}
    assert dirpaths == dict.fromkeys(("checkpoint", "latest", "on_interrupt"), str(folder / "checkpoints"))
    assert pretraining.task.protocol == cfg.pretrain.protocol
    assert OmegaConf.to_container(cfg.callbacks) != OmegaConf.to_container(pretraining.callbacks), "cfg is kept as composed"


def test_the_table3_sweeps_run_the_papers_rows_in_its_order():
    for experiment in ("table3", "table3_short", "table3_cpu"):
        cfg = config.compose([f"experiment={experiment}"], return_hydra_config=True)
        assert cfg.hydra.sweeper.params.attention == ",".join(paper.TABLE3.presets)
    assert set(paper.TABLE3.presets) <= set(PRESETS)


def test_the_lra_table_sweeps_run_its_rows_and_its_cpu_protocol_is_table3_cpus():
    for experiment in ("lra_table1", "lra_table1_cpu"):
        cfg = config.compose([f"experiment={experiment}"], return_hydra_config=True)
        assert cfg.hydra.sweeper.params.attention == ",".join(paper.LRA_TABLE1.presets)
    assert set(paper.LRA_TABLE1.presets) <= set(PRESETS)
    # The same configurations as table3_cpu, so a row of both tables runs once and fills both.
    for task in ("listops", "pathfinder"):
        for row in ("softmax", "local"):
            ours, table3 = (
                config.compose([f"experiment={e}", f"task={task}", f"attention={row}"]) for e in ("lra_table1_cpu", "table3_cpu")
            )
            assert OmegaConf.to_container(ours) == OmegaConf.to_container(table3), (task, row)
    with pytest.raises(Exception, match="no published table 'table2'"):
        OmegaConf.to_container(OmegaConf.create({"rows": "${lra_paper_rows:table2}"}), resolve=True)


def test_the_task_constants_are_the_codes_and_not_repeated_in_the_config():
    for task in ("listops", "text", "retrieval", "image", "pathfinder", "pathx"):
        cfg = composed(f"task={task}")
        assert not {"vocab_size", "num_classes"} & set(cfg.task), task


def test_a_row_selects_a_preset_and_may_override_some_of_its_values(tmp_path):
    """A user's conf/attention/<row>.yaml: the preset's every hyperparameter, its own values on top."""
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "yoso_64.yaml").write_text(
        "defaults:\n  - /attention_zoo@_here_: yoso_32\nhparams:\n  num_hashes: 64\n"
    )
    cfg = composed(f"hydra.searchpath=[file://{tmp_path}]", "attention=yoso_64")
    expected = dict(attention_zoo.presets()["yoso_32"].hparams, num_hashes=64)
    assert cfg.attention.name == "yoso" and OmegaConf.to_container(cfg.attention.hparams) == expected


@pytest.mark.parametrize("name", [*attention_zoo.available(), *attention_zoo.presets()])
def test_every_registered_attention_and_preset_is_an_attention_choice(name):
    """Issue 36: ``attention=<name>`` for every name attention_zoo lists, with or without a YAML of its own; without
    one, the attention (or preset) with every hyperparameter at its default (or the preset's value)."""
    cfg = composed(f"attention={name}")
    if name in PRESETS:
        return  # the YAML is the option (test_a_yaml_of_the_same_name_is_the_option)
    assert cfg.attention.name == attention_zoo.get_class(name).name
    assert OmegaConf.to_container(cfg.attention.hparams) == dataclasses.asdict(attention_zoo.make_config(name))


def test_a_yaml_of_the_same_name_is_the_option():
    """conf/attention/performer.yaml selects the paper's preset performer_lra: the YAML wins over the registered
    attention of the same name."""
    assert composed("attention=performer").attention.hparams == composed("attention=performer_lra").attention.hparams
    assert composed("attention=performer").attention.hparams != OmegaConf.create(
        dataclasses.asdict(attention_zoo.make_config("performer"))
    )
    assert "performer" in config.attention_rows() and "performer_lra" not in config.attention_rows()
    assert {"performer_lra", "yoso", "yoso_32"} <= set(config.attention_choices())


def test_an_unknown_attention_names_the_closest_choice_and_every_choice():
    problem = config.unknown_option(["task=listops", "attention=softmx"])
    assert problem.startswith("attention=softmx is not an attention; did you mean softmax? The choices: ")
    assert "yoso_32" in problem and "performer_lra" in problem
    assert config.unknown_option(["attention=softmax,yoso"]) is None
    assert config.unknown_option(["attention=none,yoso_33"]).startswith("attention=yoso_33 is not an attention; did")
    assert config.unknown_option(["attention.hparams.dropout=0.0", "experiment=table3"]) is None


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("task=listopz", "task=listopz is not an option of task; did you mean listops? The choices: image, listops, "),
        ("experiment=tabel3", "experiment=tabel3 is not an option of experiment; did you mean table3? The choices: "),
        ("trainer=gpus", "trainer=gpus is not an option of trainer; did you mean gpu? The choices: "),
        ("+logger=tensorbord", "logger=tensorbord is not an option of logger; did you mean tensorboard? The choices: "),
        ("hydra/launcher=submitit_slrum", "hydra/launcher=submitit_slrum is not an option of hydra/launcher; did you "),
    ],
)
def test_every_config_group_names_the_closest_choice_of_an_unknown_option(override, expected):
    assert config.unknown_option(["seed=0,1", override]).startswith(expected)
    assert config.unknown_option(["task=listops,text", "trainer=cpu", "logger=csv", "hydra/launcher=joblib"]) is None


def test_help_lists_the_choices_and_the_common_command_lines():
    """Issue 40: ``python -m lra.train --help`` orients: the groups a user chooses from with their options, and the
    command lines most runs are; not Hydra's generic page with the whole composed config."""
    process = subprocess.run([sys.executable, "-m", "lra.train", "--help"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    text = process.stdout
    for group in config.HELP_GROUPS:
        assert f"\n  {group}=  " in text
    options = " ".join(text.split("== Choices (GROUP=OPTION) ==")[1].split("== Common command lines ==")[0].split())
    for option in ("listops,", "yoso_32,", "performer_lra,", "table3_cpu,", "gpu", "tensorboard,", "mlm,"):
        assert option in options, option
    assert "python -m lra.train -m attention=softmax,yoso_32 seed=0,1,2" in text and "attention=my_attention" in text
    assert "== Config ==" not in text and "is powered by Hydra" not in text


def test_a_run_in_another_precision_has_a_folder_of_its_own():
    """Issue 37: precision is part of a run's identity, so a bf16 run (trainer=gpu or trainer.precision=...) never
    writes into the folder of the float32 run of the same overrides; the precision leads, so a long name keeps it."""
    assert config.run_name("seed=1", "32-true") == "seed=1" and config.run_name("", 32) == "default"
    assert config.run_name("", "bf16-mixed") == "precision=bf16-mixed"
    assert config.run_name("seed=1", "bf16") == "precision=bf16-mixed,seed=1"
    long = config.run_name("x" * 300, "bf16-mixed")
    assert long.startswith("precision=bf16-mixed,") and len(long) == config.MAX_RUN_NAME
