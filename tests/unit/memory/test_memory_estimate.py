"""The memory estimator: the user's function on fake tensors in its own process, the peak split by
part. Real runs of the bundled MLP (no allocation of its ~0.3-0.5 GiB of tensors happens)."""
from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.memory import CUDA_CONTEXT_BYTES, PARTS, estimate_memory
from tests.support import STUDIES, script


@pytest.mark.slow  # 12 s: the default tier stays near 5 minutes
def test_the_bundled_mlp_is_estimated_by_part_and_grows_with_the_batch():
    configs = [Config(batch_size=256), Config(batch_size=1024), Config(batch_size=4096)]
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


@pytest.mark.slow  # a real probe or estimate of 7-9 s: the default tier stays under 5 minutes
def test_a_step_the_fake_tensors_cannot_follow_still_gives_what_the_optimizer_holds():
    configs = [Config(batch_size=8), Config(batch_size=16)]
    found = estimate_memory(script("class_balanced.py"), configs)  # torch.bincount of the labels
    assert not found.unavailable and set(found.estimates) == set(configs), found.unavailable
    params = (512 * 2048 + 2048) + (2048 * 2048 + 2048) + (2048 * 10 + 10)
    for estimate in found.estimates.values():
        assert not estimate.complete and estimate.missing == ("activations", "temporaries")
        assert estimate.breakdown["parameters"] == estimate.breakdown["gradients"] == 4 * params
        assert estimate.breakdown["optimizer"] >= 2 * 4 * params  # Adam's two moments, made by a fake step
        assert estimate.breakdown["activations"] == estimate.breakdown["temporaries"] == 0
        assert estimate.summary() == ("memory estimator: activations not predicted (`bincount` has a "
                                      "data-dependent size); parameters, gradients and optimizer state predicted")


def test_an_estimator_that_dies_is_reported_not_raised(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(7)\n")
    found = estimate_memory(str(broken), [Config(batch_size=8)])
    assert found.error and "status" in found.error and Config(batch_size=8) in found.unavailable


@pytest.mark.slow
def test_estimate_answers_each_card_size_and_more_memory_never_answers_worse(tmp_path):
    import json

    from tests.support import autofit_cli

    done = autofit_cli("estimate", f"{STUDIES}/mlp.py", "--memory", "512MiB,1280MiB,2GiB,8GiB", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["predicted"] is True and answer["device"] == "gpu"
    fits = answer["fits"]
    assert [f["memory_bytes"] for f in fits] == [512 * 2**20, 1280 * 2**20, 2 * 2**30, 8 * 2**30]
    assert fits[0]["config"] is None  # 512 MiB: the CUDA context's prior alone exceeds it
    fits = fits[1:]
    configs = [Config.from_dict(f["config"]) for f in fits]
    preference = ["bf16", "fp16", "tf32", "fp32"]
    for smaller, larger in zip(configs, configs[1:]):
        assert preference.index(larger.precision) <= preference.index(smaller.precision)
        assert larger.batch_size >= smaller.batch_size
    assert configs[-1].batch_size > configs[0].batch_size
    for fit in fits:
        tensors = sum(fit["breakdown_bytes"].values())
        assert fit["predicted_peak_bytes"] == int(CUDA_CONTEXT_BYTES + tensors * 1.1)  # the stated priors
        assert fit["predicted_peak_bytes"] <= fit["usable_bytes"]


@pytest.mark.slow  # a real probe or estimate of 7-9 s: the default tier stays under 5 minutes
def test_estimate_of_a_step_fake_tensors_cannot_follow_answers_with_the_known_parts(tmp_path):
    from tests.support import autofit_cli

    done = autofit_cli("estimate", script("class_balanced.py"), "--memory-limit", "1GiB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PARTIAL" in done.stdout and "activations not predicted (`bincount` has a data-dependent size); " \
                                       "parameters, gradients and optimizer state predicted" in done.stdout
    assert "parameters" in done.stdout and "20.09 MiB" in done.stdout and "needs at least" in done.stdout


def test_estimate_of_a_function_the_estimator_cannot_run_is_one_clear_line(tmp_path):
    from tests.support import autofit_cli

    done = autofit_cli("estimate", script("crashes_under_fake_tensors.py"), "--memory-limit", "1GiB", cwd=tmp_path)
    assert done.returncode == 1
    assert "No memory estimate of" in done.stderr and "autofit probe" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_table_says_why_a_peak_without_accumulation_holds_no_gradients():
    from types import SimpleNamespace

    from autofit.memory import Fit, MemoryEstimate
    from autofit.report import describe_fits

    def fit(config: Config, gradients: int) -> Fit:
        parts = {**dict.fromkeys(PARTS, 0), "parameters": 40 * 2**20, "gradients": gradients,
                 "activations": 900 * 2**20}
        return Fit(2**30, 2**30, config, MemoryEstimate(config, parts), 2**30)

    fits = SimpleNamespace(on_gpu=False, notes=[], baseline=0, data_bound=lambda config: False)
    line = "grads near 0 (acc=1): the peak comes at the forward's end or the backward's start"
    assert line in describe_fits(fits, [fit(Config(batch_size=16), 0)], "train.py")
    assert line not in describe_fits(fits, [fit(Config(batch_size=8, accumulation_steps=2), 40 * 2**20)], "train.py")
    assert line not in describe_fits(fits, [fit(Config(batch_size=16), 40 * 2**20)], "train.py")  # held at the peak


@pytest.mark.slow  # the default tier stays under 5 minutes on 2 cores
def test_estimate_considers_selective_checkpointing_which_keeps_less_than_none_and_more_than_full():
    """`autofit estimate` tries selective checkpointing before full at as many blocks, its estimate run
    under the selective policy: the activations kept are the matmul and attention outputs, between none
    and full; where no checkpointing does not fit and selective does, selective is the answer."""
    from autofit.memory import WhatFits
    from autofit.planner import Strategy
    from autofit.report import describe_fits, fits_json

    fits = WhatFits(f"{STUDIES}/gpt.py", None, on_gpu=False, batch_range=(64, 64), precisions=("fp32",))
    try:
        level = fits.values["checkpoint_segments"][1]  # the fewest blocks checkpointed (of gpt.py's 4)
        none, selective, full = (Strategy(precision="fp32", checkpoint_segments=k, checkpoint_policy=q)
                                 for k, q in ((0, "full"), (level, "selective"), (level, "full")))
        assert fits.strategies()[:3] == [none, selective, full]
        configs = [fits.config(s, 64) for s in (none, selective, full)]
        assert configs[1].label() == f"fp32 b=64 ckpt={level} selective"
        fits.fill(configs)
        kept = [fits.estimates[c].breakdown["activations"] for c in configs]
        assert kept[0] > kept[1] > kept[2] > 0, kept
        usable = (fits.peak(fits.estimates[configs[0]]) + fits.peak(fits.estimates[configs[1]])) // 2
        predicted = fits.predict_all([int(usable / 0.9) + 1], 0.1)
    finally:
        fits.close()
    assert predicted[0].config == configs[1]
    assert f"ckpt={level} selective" in describe_fits(fits, predicted, "gpt.py")
    assert fits_json(fits, predicted, "gpt.py")["fits"][0]["config"]["checkpoint_policy"] == "selective"
