"""`autofit estimate` for a function that batches by tokens (run.token_batches): the sizes are token caps
from the longest sample up, as a search climbs them, each estimated at its worst micro-batch (the data's
longest samples, as many as the cap holds), and the answer names caps."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autofit.config import Config
from autofit.memory import PARTS, Fit, MemoryEstimate
from tests.support import autofit_cli, script


def _token_fit(memory: int, cap: int, samples: int, longest: int = 256) -> Fit:
    config = Config(batch_size=cap, precision="bf16", max_tokens=cap)
    envelope = {"longest_sample": longest, "padded_tokens": samples * longest, "padded_squares": samples * longest**2}
    estimate = MemoryEstimate(config, {**dict.fromkeys(PARTS, 0), "activations": 2**20}, token_envelope=envelope)
    return Fit(memory, memory, config, estimate, 2**20)


def test_the_answer_names_caps_and_the_worst_batch_each_was_estimated_at():
    from autofit.report import describe_fits, fits_json

    fits = SimpleNamespace(on_gpu=True, notes=[], baseline=0, data_bound=lambda config: False,
                           sizes=SimpleNamespace(tokens=True, longest_sample=256))
    predicted = [_token_fit(2**30, 512, 2), _token_fit(2**32, 4096, 16)]
    text = describe_fits(fits, predicted, "sft.py")
    assert "bf16 max_tokens=512 " in text and "bf16 max_tokens=4096 " in text and " b=" not in text
    assert "each cap estimated at its worst micro-batch, not a random draw" in text
    assert "(max_tokens=512: 2 x 256, max_tokens=4096: 16 x 256)" in text
    assert "at the largest token cap that fits" in text
    answer = json.loads(json.dumps(fits_json(fits, predicted, "sft.py")))
    assert answer["size"] == "max_tokens" and answer["longest_sample"] == 256
    assert [f["max_tokens"] for f in answer["fits"]] == [512, 4096]
    assert answer["fits"][1]["worst_batch"]["samples"] == 16 and answer["fits"][1]["worst_batch"]["longest"] == 256


@pytest.mark.slow  # two estimator processes, ~25 s on 2 cores
def test_estimate_of_a_token_function_answers_caps_each_at_its_worst_batch(tmp_path):
    """tokens_one_long.py: 4000 samples of 6 tokens and one of 24. More memory never gets a smaller cap;
    each cap's estimated batch is one batch padded to the longest sample, as many as the cap holds. At a
    cap of 32 that is the long sample alone (24 padded tokens), where every other batch holds 30: the
    estimate ran only the worst one (a second, random batch would have widened its envelope to 30)."""
    done = autofit_cli("estimate", script("tokens_one_long.py"), "--memory", "884MiB,924MiB,984MiB,1308MiB", "--json",
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["size"] == "max_tokens" and answer["longest_sample"] == 24
    caps = [f["max_tokens"] for f in answer["fits"]]
    assert all(cap is not None for cap in caps) and caps == sorted(caps) and caps[-1] > caps[0], caps
    for fit in answer["fits"]:
        config = Config.from_dict(fit["config"])
        assert config.max_tokens == fit["max_tokens"] and fit["predicted_peak_bytes"] <= fit["usable_bytes"]
        samples, envelope = min(fit["max_tokens"] // 24, 4001), fit["worst_batch"]["token_envelope"]
        assert envelope == {"longest_sample": 24, "padded_tokens": samples * 24, "padded_squares": samples * 24**2,
                                "front": [[samples * 24, samples * 24**2]]}

    done = autofit_cli("estimate", script("tokens_one_long.py"), "--memory", "1GiB", "--token-range", "1:32", "--json",
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [fit] = json.loads(done.stdout)["fits"]
    assert fit["max_tokens"] == 32  # the caps 24 and 32, from the longest sample up
    assert fit["worst_batch"]["token_envelope"] == {"longest_sample": 24, "padded_tokens": 24, "padded_squares": 576,
                                                    "front": [[24, 576]]}
