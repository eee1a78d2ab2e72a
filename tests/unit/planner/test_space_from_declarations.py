"""The search space from the knobs' declarations (issue 47): a strategy is one value of each knob of order
"memory", the space their product over the sizes, each knob's values from what the function offers, the
options and the device; a space stored before this form still reads."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from autofit.config import Config
from autofit.errors import UsageError
from autofit.knobs import Offers
from autofit.options import SearchOptions
from autofit.planner import STRATEGY_KNOBS, Asked, SearchSpace, Strategy, knob_values

#: A space as a study stored it before the space was derived from the declarations (plural keys per knob).
OLD_FORM = {"batch_sizes": [8, 12, 16], "precisions": ["fp32", "bf16"], "checkpoint_segments": [0, 2],
            "accumulations": [1, 2], "global_batch": None, "shardings": ["ddp"], "compiles": [False, True],
            "checkpoint_policies": ["full", "selective"]}


def test_a_space_stored_in_the_old_form_reads_as_the_space_built_now():
    built = SearchSpace.build(batch_range=(8, 16), precision=("fp32", "bf16"), checkpoint_segments=(0, 2),
                              accumulation_steps=(1, 2), compile=(False, True), checkpoint_policy=("full", "selective"))
    assert SearchSpace.from_dict(OLD_FORM) == built
    assert SearchSpace.from_dict(json.loads(json.dumps(built.to_dict()))) == built
    # each knob's values under its own name, those at their default alone left out
    assert built.to_dict()["compile"] == [False, True] and "sharding" not in built.to_dict()


def test_the_strategies_are_the_product_of_the_knobs_values_the_policy_only_where_blocks_are_checkpointed():
    space = SearchSpace.from_dict(OLD_FORM)
    strategies = space.strategies()
    # 2 precisions x (no checkpointing + 2 policies at 2 blocks) x 2 accumulations x 2 compiles
    assert len(strategies) == len(set(strategies)) == 2 * 3 * 2 * 2
    assert strategies[0] == Strategy(precision="fp32")  # the pilot's: each knob's first value
    assert {s.checkpoint_policy for s in strategies if not s.checkpoint_segments} == {"full"}
    config = space.config(Strategy(precision="bf16", checkpoint_segments=2, checkpoint_policy="selective",
                                   accumulation_steps=2, compile=True), 12)
    assert config == Config(batch_size=12, precision="bf16", checkpoint_segments=2, checkpoint_policy="selective",
                            accumulation_steps=2, compile=True)
    assert space.strategy_of(config) in strategies and space.admits(config)
    assert not space.admits(config.with_size(12, sharding="fsdp"))


def test_a_strategy_is_a_config_without_its_size():
    strategy = Strategy(precision="bf16", checkpoint_segments=2, checkpoint_policy="selective")
    assert [name for name, _ in strategy.items()] == [k.name for k in STRATEGY_KNOBS]
    assert strategy.label() == "bf16 ckpt=2 selective"
    assert strategy == Strategy(checkpoint_policy="selective", checkpoint_segments=2, precision="bf16")
    assert hash(strategy) == hash(strategy.replaced(compile=False)) and strategy.replaced(compile=True) != strategy
    assert strategy.family == strategy.replaced(checkpoint_segments=0, accumulation_steps=4).family  # rule 1's
    assert strategy.family != strategy.replaced(compile=True).family
    assert pickle.loads(pickle.dumps(strategy)) == strategy == copy.deepcopy(strategy)  # a record, as a dataclass was
    with pytest.raises(TypeError, match="not batch_size"):
        Strategy(batch_size=8)
    with pytest.raises(AttributeError):
        strategy.max_tokens  # noqa: B018: the size is no strategy's


def test_each_knob_takes_its_values_from_what_the_function_offers():
    options = SearchOptions(accumulation=(1, 4))
    nothing = knob_values(Asked(Offers(), options, "cpu", precisions=("fp32", "bf16")))
    assert all(nothing[k.name] == (k.default,) for k in STRATEGY_KNOBS)  # offers nothing: the defaults alone
    offered = Offers(autocast=True, backward=True, checkpoint_blocks=4, compile=True, shard_blocks=4)
    on_one = knob_values(Asked(offered, options, "cpu", precisions=("fp32", "bf16"),
                                default_precisions=("bf16", "fp32")))
    assert on_one == {"precision": ("bf16", "fp32"), "checkpoint_segments": (0, 1, 2, 4),
                      "checkpoint_policy": ("full", "selective"), "accumulation_steps": (1, 4), "sharding": ("ddp",),
                      "compile": (False, True), "offload_activations": (False,)}  # the CPU has no host to offload to
    on_gpu = knob_values(Asked(offered, options, "cuda", precisions=("fp32", "bf16")))
    assert on_gpu["offload_activations"] == (False, True)  # where blocks are offered to run.checkpoint()
    assert knob_values(Asked(Offers(autocast=True), options, "cuda"))["offload_activations"] == (False,)
    on_two = knob_values(Asked(offered, SearchOptions(consider={"sharding": ("fsdp",)}), "cpu", world=2))
    assert on_two["sharding"] == ("fsdp",) and on_two["accumulation_steps"] == (1,)
    offload_on_cpu = knob_values(Asked(offered, SearchOptions(consider={"sharding": ("fsdp-offload",)}), "cpu", world=2))
    assert offload_on_cpu["sharding"] == ("ddp",)  # none of those the CPU runs: the default, as before
    with pytest.raises(UsageError, match="precision must be one the device runs"):
        knob_values(Asked(offered, SearchOptions(precision=("tf32",)), "cpu", precisions=("fp32", "bf16")))
