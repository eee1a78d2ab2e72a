"""The benchmark's replay machinery on tiny synthetic landscapes (no probes, no torch work)."""

from __future__ import annotations

import sys

import pytest

from tests.support import REPO

if REPO not in sys.path:
    sys.path.insert(0, REPO)

from autofit.config import Config  # noqa: E402
from autofit.planner import SearchSpace  # noqa: E402
from benchmarks.landscape import Landscape, synthetic  # noqa: E402
from benchmarks.strategies import run_strategy  # noqa: E402

MiB = 2**20


def tiny() -> Landscape:
    """Batches 1..16 in fp32 and bf16; usable 180 MiB of 200 MiB.

    fp32: peak 100 + 10b MiB -> fits up to 8, OOM from 12. bf16: 100 + 6b -> fits up to 12,
    16 runs at 196 MiB, inside the headroom (infeasible). Best: bf16 b=12 (9 samples/s)."""
    space = SearchSpace.build(batch_range=(1, 16), precision=("fp32", "bf16"))
    assert space.batch_sizes == (1, 2, 3, 4, 6, 8, 12, 16)
    return synthetic(
        "tiny", space, 200 * MiB, 0.1,
        peak=lambda c: (100 + (10 if c.precision == "fp32" else 6) * c.batch_size) * MiB,
        rate=lambda c: (10 if c.precision == "fp32" else 12) * c.batch_size / (c.batch_size + 4),
        wall=lambda c: float(c.batch_size),
        sigma=0.2,
    )


def test_tiny_landscape_truth() -> None:
    land = tiny()
    assert land.best_config() == Config(batch_size=12, precision="bf16")
    assert land.best_throughput() == pytest.approx(9.0)
    assert not land.feasible(Config(batch_size=16, precision="bf16"))  # ran, but inside the headroom
    assert land.entries[Config(batch_size=12, precision="fp32")].status == "oom"
    assert land.grid_seconds() == 2 * sum(land.space.batch_sizes)
    assert Landscape.from_dict(land.to_dict()).entries == land.entries


def test_noise_is_seeded_and_repeats_differ() -> None:
    land = tiny()
    c = Config(batch_size=8, precision="fp32")
    a = land.probe(c, noise=1.0, seed=3, repeat=0).rate
    assert a == land.probe(c, noise=1.0, seed=3, repeat=0).rate
    assert a != land.probe(c, noise=1.0, seed=3, repeat=1).rate
    assert land.probe(c, noise=0.0).rate == pytest.approx(10 * 8 / 12)


def test_grid_probes_everything_and_finds_the_best() -> None:
    r = run_strategy("grid", tiny(), seed=0, noise=0.0)
    assert r.probes == 16
    assert r.seconds == 2 * sum((1, 2, 3, 4, 6, 8, 12, 16))
    assert r.oom_probes == 3  # fp32 12 and 16 (oom), bf16 16 (inside the headroom)
    assert r.pick == Config(batch_size=12, precision="bf16")
    assert r.ratio == pytest.approx(1.0)
    # fp32 probes come first: the pick reaches 97% only at bf16 b=12, the 15th probe.
    assert r.probes_to_target == 15


def test_power_doubles_from_two_in_fp32_until_oom() -> None:
    r = run_strategy("lightning-power", tiny(), seed=0, noise=0.0)
    assert (r.probes, r.oom_probes, r.pick) == (4, 1, Config(batch_size=8, precision="fp32"))  # 2, 4, 8 fit; 16 OOM
    assert r.seconds == 2 + 4 + 8 + 16
    assert r.ratio == pytest.approx((10 * 8 / 12) / 9.0)
    assert r.probes_to_target == float("inf")


def test_binsearch_bisects_between_last_fit_and_failure() -> None:
    r = run_strategy("lightning-binsearch", tiny(), seed=0, noise=0.0)
    assert (r.probes, r.oom_probes, r.pick) == (5, 2, Config(batch_size=8, precision="fp32"))  # ... 16 OOM, 12 OOM


def test_accelerate_walks_down_from_128() -> None:
    r = run_strategy("accelerate", tiny(), seed=0, noise=0.0)
    assert (r.probes, r.oom_probes, r.pick) == (3, 2, Config(batch_size=8, precision="fp32"))  # 16, 12 (0.9x snapped), 8


# --- autofit's planner ----------------------------------------------------------------------------


def linear_landscape() -> Landscape:
    """GPT-like: memory linear in batch, less in bf16/fp16 and with more checkpointed blocks;
    throughput saturating in batch, bf16 fastest, checkpointing slower."""
    space = SearchSpace.build(batch_range=(1, 512), precision=("fp32", "bf16", "fp16"), checkpoint_segments=(0, 1, 2, 4))

    def peak(c: Config) -> float:
        per = (6.0 if c.precision == "fp32" else 3.6) * (1 - 0.15 * c.checkpoint_segments)
        return (300 + per * c.batch_size) * MiB

    def rate(c: Config) -> float:
        top = {"fp32": 100.0, "bf16": 150.0, "fp16": 90.0}[c.precision] / (1 + 0.1 * c.checkpoint_segments)
        return top * c.batch_size / (c.batch_size + 24)

    return synthetic("linear", space, 1536 * MiB, 0.1, peak, rate,
                     wall=lambda c: 2 + 0.05 * c.batch_size, sigma=0.05, baseline_bytes=250 * MiB)


def implied_infeasible(config: Config, observations, usable: float) -> bool:
    """Too big by monotonicity: an earlier failure to fit in the same precision at a batch <= this
    one, with as many or more checkpointed blocks."""
    return any(
        o.too_big(usable) and o.config.precision == config.precision
        and o.config.accumulation_steps == config.accumulation_steps
        and config.batch_size >= o.config.batch_size
        and config.checkpoint_segments <= o.config.checkpoint_segments
        for o in observations
    )


@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_planner_never_probes_implied_infeasible_and_finds_the_best(noise: float) -> None:
    """Noise-free it must reach 97% of the best; with noise (5% per probe) it must stay sound."""
    from autofit.planner import Planner

    land = linear_landscape()
    planner = Planner(land.space, land.usable_bytes)
    observations = []
    for _ in range(len(land.configs())):
        config = planner.next(observations)
        if config is None:
            break
        assert not implied_infeasible(config, observations, land.usable_bytes), config.label()
        repeat = sum(o.config == config for o in observations)
        observations.append(land.probe(config, noise=noise, seed=7, repeat=repeat))
    else:
        pytest.fail("the planner did not finish within one probe per config")
    assert len(observations) < len(land.configs()) / 4
    if noise == 0.0:
        assert land.true_throughput(planner.best(observations)) >= 0.97 * land.best_throughput()


def test_repeated_runs_aggregate_to_the_fastest_and_noise_follows_their_spread() -> None:
    from benchmarks.record_landscape import _entry

    def run(rate: float | None, status: str = "ok", peak: int = 100) -> dict:
        return {"status": status, "samples_per_s": rate, "peak_bytes": peak, "step_time_median_s": 1.0,
                "step_time_iqr_s": 0.1, "wall_s": 2.0}

    e = _entry(Config(batch_size=8), [run(40.0, peak=120), run(50.0)])
    assert (e.status, e.samples_per_s, e.peak_bytes) == ("ok", 50.0, 120)
    assert _entry(Config(batch_size=8), [run(50.0), run(None, "oom")]).status == "oom"

    land = tiny()
    for c, e in land.entries.items():
        if e.status == "ok":
            e.runs = [run(10.0), run(10.0 * 1.1)]
    assert land.between_run_sigma == pytest.approx(abs(__import__("math").log(1.1)) / (0.6745 * 2**0.5))


def test_deepspeed_extrapolates_from_the_profile_and_tries_around_the_prediction() -> None:
    # Model states 100 MiB, 10 MiB per sample: (180 - 100) / 10 = 8 -> tries 8 (1.05x, 1x) and 6 (0.95x).
    r = run_strategy("deepspeed", tiny(), seed=0, noise=0.0)
    assert (r.probes, r.oom_probes, r.pick) == (3, 0, Config(batch_size=8, precision="fp32"))


def test_the_grid_records_selective_checkpointing_unless_told_not_to(monkeypatch) -> None:
    """record_landscape probes selective checkpointing as a strategy of its own where a level
    checkpoints (as a search tries it); --no-selective records full only, as the bundled landscapes."""
    import benchmarks.record_landscape as recorder

    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(recorder, "record", lambda *a, **k: asked.append(k["checkpoint_policies"]))
    argv = ["--study", "studies/gpt.py", "--memory-limit", "512MiB", "--batch", "8:16"]
    recorder.main(argv)
    recorder.main([*argv, "--no-selective"])
    assert asked == [("full", "selective"), ("full",)]


def test_a_landscape_with_selective_checkpointing_round_trips_and_its_grid_best_may_be_selective() -> None:
    """Selective keeps the matmul outputs: more memory than full, less recompute. Here it is the best."""
    space = SearchSpace.build(batch_range=(8, 32), precision=("fp32",), checkpoint_segments=(0, 1, 2),
                              checkpoint_policy=("full", "selective"))
    saved = {"full": 0.4, "selective": 0.2}  # of the activations, per checkpointed level
    slower = {"full": 0.3, "selective": 0.05}  # recompute, per checkpointed level
    land = synthetic(
        "selective", space, 400 * MiB, 0.1,
        peak=lambda c: (100 + 10 * c.batch_size * (1 - saved[c.checkpoint_policy] * c.checkpoint_segments)) * MiB,
        rate=lambda c: c.batch_size / (1 + slower[c.checkpoint_policy] * c.checkpoint_segments))
    assert {c.checkpoint_policy for c in land.configs() if c.checkpoint_segments} == {"full", "selective"}
    assert all(c.checkpoint_policy == "full" for c in land.configs() if not c.checkpoint_segments)
    assert Landscape.from_dict(land.to_dict()).entries == land.entries
    # b=32 fits the usable 360 MiB with one level checkpointed selectively (356 MiB), not unchecked (420).
    assert land.best_config() == Config(batch_size=32, precision="fp32", checkpoint_segments=1, checkpoint_policy="selective")
    assert run_strategy("grid", land, seed=0, noise=0.0).pick == land.best_config()
    # A landscape recorded before the axis (no checkpoint_policies in its space) loads as full only.
    old = land.to_dict()
    old["space"].pop("checkpoint_policy")
    old["configs"] = [e for e in old["configs"] if e["config"].get("checkpoint_policy", "full") == "full"]
    assert Landscape.from_dict(old).space.values_of("checkpoint_policy") == ("full",)
