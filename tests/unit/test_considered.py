"""The lists of values a search considers for a knob that takes one (autofit.config.CONSIDERED: the shardings,
the checkpoint policies): declared once on the knob, taken by @autofit, SearchOptions, SearchSettings and the
command line alike, and checked in one place, with the messages users have met."""

from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner

from autofit import autofit
from autofit.cli import cli
from autofit.config import CONSIDERED
from autofit.errors import UsageError
from autofit.options import SearchOptions, search_options
from autofit.search import SearchSettings


def test_the_considered_knobs_are_the_shardings_and_the_checkpoint_policies():
    assert [k.name for k in CONSIDERED] == ["checkpoint_policy", "sharding"]


def test_the_decorator_takes_each_as_a_list_or_one_value_and_names_it_in_its_signature():
    assert {"sharding", "checkpoint_policy"} <= set(inspect.signature(autofit).parameters)
    declared = search_options(checkpoint_policy="full", sharding=["ddp", "fsdp"])
    assert declared.consider == {"checkpoint_policy": ("full",), "sharding": ("ddp", "fsdp")}
    with pytest.raises(TypeError, match="unexpected keyword argument 'shardings'"):
        search_options(shardings=("ddp",))


def test_a_search_considers_the_declared_values_the_device_runs_else_all():
    options = SearchOptions(consider={"sharding": ("fsdp", "ddp")})
    assert options.considered("sharding", "cpu") == ("fsdp", "ddp")
    assert SearchOptions().considered("sharding", "cpu") == ("ddp", "fsdp")
    assert SearchOptions().considered("sharding", "cuda") == ("ddp", "fsdp", "fsdp-offload")
    assert SearchOptions().considered("checkpoint_policy", "cpu") == ("full", "selective")


def test_the_command_line_wins_over_the_decorator_knob_by_knob():
    declared = search_options(checkpoint_policy="full", sharding="fsdp")
    merged = declared.merged(consider={"checkpoint_policy": ("selective",)})
    assert merged.consider == {"checkpoint_policy": ("selective",), "sharding": ("fsdp",)}


@pytest.mark.parametrize("settings,message", [
    ({"consider": {"sharding": ("fsdp",)}}, "--sharding is for distributed probes, but got --sharding fsdp without "
                                            "--nproc-per-node: add --nproc-per-node N (N ranks per probe)."),
    ({"consider": {"sharding": ("fsdp-offload",)}, "nproc_per_node": 2},
     "The sharding must be one the device supports (ddp, fsdp), but got fsdp-offload: FSDP2's offload keeps the "
     "model in pinned host memory for an accelerator; on the CPU there is nothing to offload to."),
    ({"consider": {"checkpoint_policy": ()}}, "The checkpoint policy list must not be empty."),
    ({"consider": {"checkpoint_policy": ("some",)}}, "The checkpoint policy must be one of full, selective, but got 'some'."),
    ({"consider": {"precision": ("fp32",)}}, "A search considers lists of checkpoint_policy, sharding, but got one of "
                                             "'precision'."),
])
def test_a_list_a_search_cannot_consider_is_one_line_naming_what_to_change(settings, message):
    with pytest.raises(UsageError) as raised:
        SearchSettings(script="train.py", **settings)
    assert str(raised.value) == message


def test_search_and_estimate_take_the_lists_as_flags_estimate_none_for_several_ranks():
    search = CliRunner().invoke(cli, ["search", "--help"], terminal_width=200).output
    estimate = CliRunner().invoke(cli, ["estimate", "--help"], terminal_width=200).output
    assert "--sharding" in search and "--checkpoint-policy" in search
    assert "--checkpoint-policy" in estimate and "--sharding" not in estimate
    bad = CliRunner().invoke(cli, ["search", "train.py", "--checkpoint-policy", "some"])
    assert bad.exit_code == 2 and "The checkpoint policy must be one of full, selective, but got 'some'." in bad.output
