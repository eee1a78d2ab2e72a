"""Rule 11: a knob that changes speed and not what fits (channels-last memory format, declared with the order
"compute") is tried on the fastest config where the function offers it, kept where faster, and never probed
where the function does not offer it. A simulated script: memory a + m x batch, samples/s rising with the
batch and saturating, channels-last a fixed factor faster (or slower)."""

from __future__ import annotations

from autofit import Config
from autofit.planner import Observation, Planner, SearchSpace

MiB = 2**20
USABLE = 1000 * MiB


def _measure(config: Config, factor: float) -> Observation:
    peak = 200 * MiB + 20 * MiB * config.batch_size
    if peak > USABLE * 1.2:
        return Observation(config, "oom")
    rate = 1000.0 * config.batch_size / (config.batch_size + 8) * (factor if config.channels_last else 1.0)
    return Observation(config, "ok", peak_bytes=peak, rate=rate, spread=0.01)


def _search(space: SearchSpace, factor: float) -> tuple[list[Observation], Config]:
    planner, seen = Planner(space, USABLE, check_noise=False), []
    for _ in range(60):
        config = planner.next(seen)
        if config is None:
            return seen, planner.best(seen)
        seen.append(_measure(config, factor))
    raise AssertionError("the planner never stopped")


def _space(*variants: str) -> SearchSpace:
    return SearchSpace.build(batch_range=(1, 64), precision=("fp32",), variants=variants)


def test_a_faster_channels_last_is_probed_on_the_leader_and_wins():
    seen, best = _search(_space("channels_last"), factor=1.3)
    tried = [o.config for o in seen if o.config.channels_last]
    plain = max((o for o in seen if not o.config.channels_last and o.fits(USABLE)), key=lambda o: o.rate)
    assert tried == [Config(batch_size=plain.config.batch_size, channels_last=True)]  # once, on the leader
    assert best == tried[0] and best.label() == f"fp32 b={best.batch_size} channels-last"


def test_a_slower_channels_last_is_probed_once_and_left():
    seen, best = _search(_space("channels_last"), factor=0.9)
    assert len([o for o in seen if o.config.channels_last]) == 1 and not best.channels_last


def test_a_function_that_offers_no_channels_last_is_searched_as_before():
    with_offer, _ = _search(_space("channels_last"), factor=1.3)
    without, best = _search(_space(), factor=1.3)
    assert not [o for o in without if o.config.channels_last] and not best.channels_last
    assert [o.config for o in without] == [o.config for o in with_offer if not o.config.channels_last]


def test_the_space_keeps_its_variants_and_offers_their_trial_param():
    space = _space("channels_last")
    assert SearchSpace.from_dict(space.to_dict()) == space and "channels_last" in space.offered
    assert "variants" not in _space().to_dict()  # other studies keep their form


def test_a_variant_that_runs_out_of_memory_rules_out_none_of_the_plain_configs():
    """Its peak is no answer for its strategy: the plain b=16 may still climb past a channels-last b=16 OOM."""
    planner = Planner(_space("channels_last"), USABLE, check_noise=False)
    seen = [_measure(Config(batch_size=16), 1.0), Observation(Config(batch_size=16, channels_last=True), "oom")]
    assert planner.leader_can_climb(seen) and planner.best(seen) == Config(batch_size=16)


def test_a_kernel_is_tried_among_those_the_function_offers_and_the_device_runs():
    """The attention kernel: the values a probe found to run the function's calls (the offer names them), those
    the device has; a pad multiple where the function reads it; nothing where it offers neither."""
    from autofit.knobs import Offers
    from autofit.options import SearchOptions
    from autofit.planner import Asked, compute_variants

    def variants(offers: Offers, device: str = "cpu") -> tuple:
        return compute_variants(Asked(offers, SearchOptions(), device))

    assert variants(Offers(sdpa_backends=["math"])) == (("sdpa_backend", ("math",)),)
    assert variants(Offers(sdpa_backends=["efficient", "cudnn"])) == ()  # no such kernel on a CPU
    assert variants(Offers(sdpa_backends=["efficient", "cudnn"]), "cuda") == (("sdpa_backend", ("efficient", "cudnn")),)
    assert variants(Offers(pad_multiple=True)) == (("pad_multiple", (8, 64)),)
    assert variants(Offers()) == ()
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",), variants=variants(Offers(sdpa_backends=["math"])))
    planner, seen = Planner(space, USABLE, check_noise=False), []
    for _ in range(60):
        config = planner.next(seen)
        if config is None:
            break
        seen.append(_measure(config, 1.0))
    assert [o.config.sdpa_backend for o in seen if o.config.sdpa_backend] == ["math"]
    assert SearchSpace.from_dict(space.to_dict()) == space and "sdpa_backends" in space.offered


def test_a_space_stored_with_its_variants_by_name_reads_every_value_of_each():
    """A study stored before the values were kept named its variants alone."""
    stored = {**_space().to_dict(), "variants": ["channels_last"]}
    assert SearchSpace.from_dict(stored).variants == (("channels_last", (True,)),)
