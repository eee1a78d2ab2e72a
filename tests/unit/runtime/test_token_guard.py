"""The token guard: a micro-batch by tokens beyond what the search's probes ran (a longer longest sample
with more padded squares) runs in pieces that each stay inside, as one micro-step of the accumulation,
each piece's loss weighted by its real tokens: the step equals the unsplit batch's to 1e-5."""

from __future__ import annotations

import torch

from autofit import Config
from autofit.runtime import Run, RunSettings, TokenEnvelope, TokenGuard
from tests.support.sequences import PAD, Sequences, collate

LENGTHS = [3, 40, 5, 9, 17, 2, 33, 8, 12, 6, 25, 4, 19, 7, 11, 30]
# At a cap of 128 the batches are [40, 33, 30], [25, 19, 17, 12, 11] and the eight from 9 down: a probe
# that never drew a sample past 25 tokens ran at most 5 x 25 padded tokens and 5 x 25² padded squares.
ENVELOPE = TokenEnvelope(longest_sample=25, padded_tokens=125, padded_squares=3125)


class CausalLM(torch.nn.Module):
    """Attention across each sample's tokens (causal: the padding after a sample changes none of its
    outputs), the part of a model whose memory grows with the square of the length."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 8)
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = torch.nn.Linear(8, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        return self.head(h + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0])


def test_a_batch_is_beyond_only_when_longer_than_probed_and_past_the_probed_squares():
    assert ENVELOPE.holds(5, 25) and ENVELOPE.holds(8, 9)  # no longer than the probes' longest sample
    assert ENVELOPE.holds(1, 40) and ENVELOPE.holds(3, 32)  # longer, within their squares (1600, 3072)
    assert not ENVELOPE.holds(2, 40) and not ENVELOPE.holds(3, 33)
    assert ENVELOPE.piece_samples(3, 40) == 1  # 3125 // 1600: one sample per piece
    assert ENVELOPE.piece_samples(9, 26) == 3  # 4 fit (4 x 676 <= 3125): 3 pieces, as even as they come
    assert ENVELOPE.piece_samples(2, 60) == 1  # one sample past the squares alone: never cut further
    piece = ENVELOPE.piece_samples(7, 30)
    assert piece * 30**2 <= ENVELOPE.padded_squares and piece * 30 <= ENVELOPE.padded_tokens


def test_the_guard_counts_what_it_splits_and_leaves_a_rank_that_may_not_whole(capsys):
    guard = TokenGuard(ENVELOPE)
    assert guard.piece_samples(5, 25, may_split=True) is None
    assert guard.piece_samples(1, 60, may_split=True) is None  # a sample is never cut
    assert guard.piece_samples(3, 40, may_split=True) == 1 and guard.split_batches == 1
    assert guard.piece_samples(3, 40, may_split=False) is None and guard.split_batches == 1
    assert "runs whole" in capsys.readouterr().err
    assert TokenGuard(None).piece_samples(3, 40, may_split=True) is None


def test_the_envelope_widens_to_what_ran_and_travels_as_a_dict():
    drawn = TokenEnvelope.of_batch(3, 40).widened(TokenEnvelope.of_batch(5, 25))
    assert drawn == TokenEnvelope(40, 125, 4800, ((120, 4800), (125, 3125)))  # neither beats the other in both
    assert TokenEnvelope.from_dict(drawn.to_dict()) == drawn and TokenEnvelope.from_dict(None) is None


def _trained(config: Config, envelope: TokenEnvelope | None, *, global_tokens: int | None = None,
             epochs: int = 1) -> tuple[Run, torch.Tensor, list[int], list[float]]:
    """A tiny causal LM trained over the data; its weights, the width of each batch its loop saw, and
    each optimizer step's loss (the token mean over the step's batches, however they were cut)."""
    torch.manual_seed(3)
    model = CausalLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    run = Run(RunSettings(config, "cpu", global_tokens=global_tokens, token_envelope=envelope))
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=1)
    widths, steps = [], []
    with run.control.active():
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for x, y in run.batches(loader):
                if run.micro_step == 0:
                    steps.append([0.0, 0])
                loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1), ignore_index=PAD)
                tokens = int((y != PAD).sum())
                steps[-1][0] += loss.item() * tokens
                steps[-1][1] += tokens
                widths.append(x.shape[1])
                run.backward(loss, optimizer)
    run.finish()
    return run, torch.cat([p.detach().flatten() for p in model.parameters()]), widths, [s / n for s, n in steps]


def test_a_split_batch_trains_as_the_whole_one():
    for config, global_tokens in ((Config(batch_size=128, max_tokens=128), None),
                                  (Config(batch_size=128, max_tokens=128, accumulation_steps=2), None),
                                  (Config(batch_size=128, max_tokens=128), 70)):
        whole, whole_weights, whole_widths, whole_losses = _trained(config, None, global_tokens=global_tokens, epochs=2)
        split, split_weights, split_widths, split_losses = _trained(config, ENVELOPE, global_tokens=global_tokens,
                                                                    epochs=2)
        assert sorted(whole_widths) == [9, 9, 25, 25, 40, 40]
        assert sorted(split_widths) == [9, 9, 25, 25, *[40] * 6]  # [40, 33, 30] in three pieces, each epoch
        summary = split.control.summary()
        assert (summary["guard_split_batches"], summary["oom_split_batches"]) == (2, 0)
        assert whole.control.summary()["guard_split_batches"] == 0
        assert split.optimizer_steps == whole.optimizer_steps and split.config == whole.config
        assert torch.allclose(split_weights, whole_weights, atol=1e-5, rtol=0), config
        assert len(split_losses) == len(whole_losses)  # micro_step is 0 once per step, pieces or not
        assert torch.allclose(torch.tensor(split_losses), torch.tensor(whole_losses), atol=1e-5, rtol=0)


def test_what_ran_is_recorded_as_the_runs_envelope():
    run, _, _, _ = _trained(Config(batch_size=128, max_tokens=128), None)
    envelope = run.control.knobs.token_envelope
    assert (envelope.longest_sample, envelope.padded_tokens, envelope.padded_squares) == (40, 125, 4800)
    recorded = run.control.knobs.to_dict()["token_envelope"]
    assert recorded == {"longest_sample": 40, "padded_tokens": 125, "padded_squares": 4800,
                        "front": [[120, 4800], [125, 3125]], "caches": recorded["caches"]}
    assert set(recorded["caches"]) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"}  # on the CPU
    guarded, _, _, _ = _trained(Config(batch_size=128, max_tokens=128), ENVELOPE)
    pieces = guarded.control.knobs.token_envelope  # its pieces, one sample each
    assert (pieces.longest_sample, pieces.padded_tokens, pieces.padded_squares) == (40, 125, 3125)


def test_an_oom_in_a_piece_redoes_the_step_from_the_whole_batch_and_both_are_counted():
    from autofit.normal_run import split_text

    torch.manual_seed(3)
    model = CausalLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    run = Run(RunSettings(Config(batch_size=128, max_tokens=128), "cpu", recover_oom=True, token_envelope=ENVELOPE))
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=1)
    widths, failed = [], False
    with run.control.active():
        for epoch in range(2):
            loader.set_epoch(epoch)
            for x, y in run.batches(loader):
                widths.append(x.shape[1])
                with run.autocast():
                    if epoch == 1 and x.shape[1] == 40 and run.micro_step == 1 and not failed:
                        failed = True  # the second piece of [40, 33, 30]
                        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
                    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1),
                                                             ignore_index=PAD)
                run.backward(loss, optimizer)
    run.finish()
    assert failed and run.config == Config(batch_size=64, max_tokens=64, accumulation_steps=2)
    # epoch 2: two pieces (the second failed), then the whole batch again, cut to one sample per micro-batch
    assert widths.count(40) == 3 + 5
    summary = run.control.summary()
    # the OOM fallback cut the failed step's batch and the one after it ([25, 19, 17, 12, 11] in twos)
    assert (summary["guard_split_batches"], summary["oom_split_batches"]) == (2, 2)
    assert split_text(2, 1) == ("micro-batches run in pieces: 2 beyond what the probes ran (token guard), "
                                "1 after an out-of-memory (OOM fallback)")
    assert split_text(0, 0) is None


def test_the_guard_splits_a_batch_no_longer_than_the_probes_longest_but_larger_than_any_they_ran():
    """Issue 37, item 5: probes that ran one sample of 2048 (the cap 3072 holds it once) let a 2 x 1536 batch
    through as "no longer than their longest", though it holds more tokens and more squares than anything
    they ran. The guard now splits by the batches they ran."""
    seen = TokenEnvelope.of_batch(1, 2048)
    assert not seen.holds(2, 1536) and seen.piece_samples(2, 1536) == 1
    assert seen.holds(1, 1536) and seen.holds(2, 1000)  # 2000 tokens, 2M squares: within the 2048 batch
    old = TokenEnvelope(2048, 2048, 2048**2)  # a file written before the front: the measures alone, as then
    assert old.holds(2, 1536)


def test_a_batch_under_the_hull_of_two_probed_batches_is_inside_and_one_above_it_is_not():
    """Issue 43: a cap whose worst batches form a front of more than a probe runs (speech: six of them, a probe
    runs four) had its unprobed ones split in the normal run. A batch under the segment between two probed
    batches needs no more than the worse of them for any memory a x tokens + b x squares (a, b >= 0)."""
    seen = TokenEnvelope(3000, 3000, 2_000_000, ((1000, 2_000_000), (1500, 1_900_000), (2500, 1_450_000),
                                                 (3000, 600_000)))
    # 2100 tokens, 1.47M squares: no probed batch is as large in both (2500 tokens hold 1.45M squares), but the
    # segment from (1500, 1.9M) to (2500, 1.45M) passes above it (1.63M squares at 2100 tokens)
    assert seen.holds(3, 700) and seen.piece_samples(3, 700) >= 1
    assert not seen.holds(2, 1000)  # 2000 tokens, 2M squares: above that segment (1.675M at 2000 tokens)
    assert not seen.holds(1, 3001) and not seen.holds(1, 2001)  # past every probed batch's tokens or squares
    assert seen.holds(4, 500) and seen.holds(1, 1000)  # under one probed batch, as before


def test_a_probe_of_a_long_front_runs_its_corners_so_the_envelope_holds_the_rest():
    """The corners of the worst batches' front (those some linear memory is worst at) are what a probe runs
    first; every other batch of the front is under their hull, so the run's guard splits none of them."""
    from autofit.config import front_corners, pareto_front, under_front

    front = pareto_front([(1000, 2_000_000), (1500, 1_900_000), (2000, 1_500_000), (2500, 1_450_000),
                          (2800, 900_000), (3000, 600_000)])
    corners = front_corners(front)
    assert corners == [(1000, 2_000_000), (1500, 1_900_000), (2500, 1_450_000), (3000, 600_000)]
    assert all(under_front(corners, t, s) for t, s in front)  # the two left out are under the hull
