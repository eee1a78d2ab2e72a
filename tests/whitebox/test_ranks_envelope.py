"""A multi-rank probe by tokens: each rank draws its own share of the epoch's batches, so the envelope the
best-config file keeps (what the probes ran, which a normal run's token guard checks against) is every rank's,
not rank 0's alone: a batch only rank 1 drew ran too, and must not be split in the real run."""

from __future__ import annotations

from autofit import Config
from autofit.probing import ProbeResult
from autofit.probing._torchrun import combine

CONFIG = Config(batch_size=4096, max_tokens=4096)


def _rank(longest: int, tokens: int, squares: int) -> ProbeResult:
    envelope = {"longest_sample": longest, "padded_tokens": tokens, "padded_squares": squares}
    return ProbeResult(status="ok", config=CONFIG, samples_per_s=10.0, tokens_per_s=100.0, measured_steps=5,
                       knobs={"batches": True, "longest_sample": 512, "token_envelope": envelope})


def test_the_combined_envelope_is_every_rank_s_widest():
    results = {0: _rank(256, 4096, 4096 * 256), 1: _rank(512, 3584, 7 * 512**2)}
    combined = combine(CONFIG, results, 2, 1.0, 0, False, 60.0, None, None)
    assert combined.ok and combined.tokens_per_s == 200.0
    assert combined.knobs["token_envelope"] == {"longest_sample": 512, "padded_tokens": 4096,
                                                "padded_squares": 7 * 512**2}
    assert combined.knobs["longest_sample"] == 512 and combined.knobs["batches"]


def test_ranks_by_samples_keep_their_knobs_as_they_are():
    plain = ProbeResult(status="ok", config=Config(batch_size=8), samples_per_s=10.0, measured_steps=5, knobs={"batches": True})
    combined = combine(Config(batch_size=8), {0: plain, 1: plain}, 2, 1.0, 0, False, 60.0, None, None)
    assert combined.knobs == {"batches": True}


def test_flops_by_tokens_come_from_tokens_per_second_and_flops_per_token():
    """By tokens a micro-batch's samples vary with the lengths drawn: FLOP/s from samples/s x the counted
    step's FLOPs per sample would follow that one step's batch; per token they follow the work."""
    by_tokens = ProbeResult(status="ok", config=CONFIG, samples_per_s=10.0, tokens_per_s=1000.0)
    by_tokens.set_flops(5e6, 1e9, flops_per_token=2e4)
    assert by_tokens.flops_per_s == 1000.0 * 2e4 and by_tokens.mfu == 1000.0 * 2e4 / 1e9
    by_samples = ProbeResult(status="ok", config=Config(batch_size=8), samples_per_s=10.0)
    by_samples.set_flops(5e6, None)
    assert by_samples.flops_per_s == 10.0 * 5e6 and by_samples.flops_per_token is None
