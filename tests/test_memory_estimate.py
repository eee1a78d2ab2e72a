"""The memory estimator: the user's function on fake tensors in its own process, the peak split by
part. Real runs of the bundled MLP (no allocation of its ~0.3-0.5 GiB of tensors happens)."""
from __future__ import annotations

from autofit.config import Config
from autofit.memory_estimate import PARTS, estimate_memory
from tests.conftest import STUDIES, script


def test_the_bundled_mlp_is_estimated_by_part_and_grows_with_the_batch():
    configs = [Config(256), Config(1024), Config(4096)]
    found = estimate_memory(f"{STUDIES}/mlp.py", configs)
    assert found.error is None and not found.unavailable, found.unavailable
    small, medium, large = (found.estimates[c] for c in configs)
    for estimate in (small, medium, large):
        assert set(estimate.breakdown) == set(PARTS)
        assert estimate.total_bytes == sum(estimate.breakdown.values())
        # The MLP's ~17M parameters: 66 MiB of fp32 weights, whatever the batch.
        assert 60 * 2**20 < estimate.breakdown["parameters"] < 72 * 2**20
    assert small.total_bytes <= medium.total_bytes < large.total_bytes
    assert large.breakdown["activations"] > 3 * medium.breakdown["activations"] > 0  # ~linear in the batch
    assert found.baseline_bytes and found.baseline_bytes > 50 * 2**20  # the process's own memory, kept apart


def test_a_function_the_fake_tensors_cannot_run_says_why_and_costs_nothing_else():
    configs = [Config(8), Config(16)]
    found = estimate_memory(script("reads_loss_value.py"), configs)
    assert not found.estimates and set(found.unavailable) == set(configs)
    assert all("item" in why or "data-dependent" in why.lower() or "DataDependent" in why
               for why in found.unavailable.values()), found.unavailable


def test_an_estimator_that_dies_is_reported_not_raised(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(7)\n")
    found = estimate_memory(str(broken), [Config(8)])
    assert found.error and "status" in found.error and Config(8) in found.unavailable
