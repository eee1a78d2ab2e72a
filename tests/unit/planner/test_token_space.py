"""A function that batches by tokens is searched over token caps (`max_tokens`) from its longest sample up:
its configs carry the cap, the planner climbs it as it climbs a micro-batch (`Config.size`), and a probe
sized by samples (the pilot, before the knobs were known) is no evidence about token caps."""

from __future__ import annotations

from autofit import Config
from autofit.planner import Observation, Planner, SearchSpace

GiB = 2**30
SPACE = SearchSpace.build(batch_range=(1, 2**20), token_range=(300, 2**14), precision=("fp32",))


def _ok(config: Config, peak: float, rate: float) -> Observation:
    return Observation(config, "ok", peak_bytes=int(peak * GiB), rate=rate, spread=0.01)


def test_the_space_climbs_token_caps_from_the_longest_sample():
    assert SPACE.tokens and SPACE.batch_sizes[0] == 300 and SPACE.batch_sizes[-1] == 2**14
    assert 512 in SPACE.batch_sizes and 1024 in SPACE.batch_sizes
    config = SPACE.configs()[0]
    assert config.max_tokens == config.size == 300
    assert SearchSpace.from_dict(SPACE.to_dict()) == SPACE


def test_the_pilot_by_samples_is_set_aside_and_the_climb_is_by_tokens():
    planner = Planner(SPACE, 4 * GiB)
    pilot_by_samples = Observation(Config(batch_size=4), "oom")  # before the knobs said the function batches by tokens
    first = planner.next([pilot_by_samples])
    assert first is not None and first.max_tokens == 300
    seen = [pilot_by_samples, _ok(first, 0.5, 10.0)]
    second = planner.next(seen)
    assert second is not None and second.max_tokens > 300
    assert planner.best(seen) == first


def test_an_oom_at_a_cap_rules_out_the_larger_caps():
    planner = Planner(SPACE, 4 * GiB)
    small, big = SPACE.config(SPACE.strategies()[0], 512), SPACE.config(SPACE.strategies()[0], 4096)
    seen = [_ok(small, 1.0, 10.0), Observation(big, "oom")]
    for _ in range(8):
        proposal = planner.next(seen)
        if proposal is None:
            break
        assert proposal.max_tokens is not None and proposal.max_tokens < 4096
        seen.append(_ok(proposal, 1.0 + proposal.max_tokens / 4096, 10.0 + proposal.max_tokens / 512))
    assert planner.best(seen).max_tokens < 4096


def test_the_estimator_is_asked_for_token_caps_not_micro_batches():
    from autofit.planner import configs_to_estimate

    asked = configs_to_estimate(SPACE.configs())
    assert asked and all(c.max_tokens is not None and c.max_tokens == c.batch_size for c in asked)
    assert asked[0].max_tokens == 300
