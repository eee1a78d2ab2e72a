"""The space a search builds (autofit.search._build_space) for a function that batches by tokens keeps the
decorator's `global_tokens`. White-box: the space is built as the search builds it, without a search."""

from __future__ import annotations

from autofit.planner import SearchSpace


def test_the_decorators_global_tokens_is_kept_by_a_space_by_tokens_only():
    """`@autofit(global_tokens=N)` reaches the space the study stores, for the best-config file to state."""
    from autofit.options import SearchOptions
    from autofit.probing import WorkerInfo
    from autofit.search import SearchSettings
    from autofit.knobs import Offers
    from autofit.search._build_space import build_space, search_options

    info = WorkerInfo(function="train", options=SearchOptions(global_tokens=65536).__dict__,
                      device={"type": "cpu"}, precisions=["fp32"], default_precisions=["fp32"], baseline_bytes=0,
                      memory_limit=None, versions={}, load_s=0.0, pid=0)
    settings = SearchSettings(script="train.py")
    options = search_options(info, settings)
    space = build_space(settings, options, info, Offers.from_dict({"longest_sample": 300, "batches": True}))
    assert space.tokens and space.global_tokens == 65536
    assert SearchSpace.from_dict(space.to_dict()) == space
    by_samples = build_space(settings, options, info, Offers.from_dict({"batches": True}))
    assert not by_samples.tokens and by_samples.global_tokens is None and "global_tokens" not in by_samples.to_dict()
