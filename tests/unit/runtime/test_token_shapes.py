"""Variable lengths and the shapes they make (issue 53): a batch padded to a multiple (`run.pad_multiple`) counts
its padded length against the token cap and meets fewer shapes; a probe's window meets new shapes as often as
its epoch does (those of its other batches paid ahead in the warm-up), within one epoch; on the CPU the
libraries' per-shape caches are bounded in probes and runs alike and recorded."""

from __future__ import annotations

import math
import os

import pytest
import torch

from autofit import Config
from autofit.runtime import Run, TokenBatchSampler
from tests.support.sequences import Sequences, collate


def _lengths(n: int = 1500, seed: int = 0) -> list[int]:
    """Log-normal lengths (median 90, sigma 0.9) up to 1024: issue 53's H200 model."""
    generator = torch.Generator().manual_seed(seed)
    return [int(v) for v in torch.exp(math.log(90) + 0.9 * torch.randn(n, generator=generator)).clamp(8, 1024)]


def _new_share(order: list[list[int]], start: int, size: int, sampler: TokenBatchSampler) -> float:
    """The share of `order[start:start + size]` whose shape no batch before it had."""
    seen = {sampler.shape(b) for b in order[:start]}
    new = 0
    for batch in order[start:start + size]:
        new += sampler.shape(batch) not in seen
        seen.add(sampler.shape(batch))
    return new / size


def test_a_pad_multiple_counts_the_padded_length_against_the_cap_and_leaves_fewer_shapes():
    lengths = _lengths()
    plain, padded = TokenBatchSampler(lengths, 4096), TokenBatchSampler(lengths, 4096, pad_multiple=64)
    for batch in padded:
        width = -(-max(lengths[i] for i in batch) // 64) * 64
        assert len(batch) * width <= 4096 and padded.shape(batch) == (len(batch), width)
    assert sorted(i for b in padded for i in b) == list(range(len(lengths)))
    shapes = {name: len({s.shape(b) for b in s}) for name, s in (("plain", plain), ("padded", padded))}
    assert shapes["padded"] * 3 < shapes["plain"], shapes
    assert padded.stats().padded_tokens > plain.stats().padded_tokens  # padding is work


@pytest.mark.parametrize("multiple", [None, 8, 64])
@pytest.mark.parametrize("cap", [2048, 8192])
def test_a_probes_window_meets_new_shapes_as_often_as_its_epoch(multiple, cap):
    """Unpadded, almost every batch of an epoch is a new shape, and so is the probe's; padded, an epoch meets a
    few, and its probe pays the rest of its window's shapes ahead. Without that its window reads mostly new."""
    window = 10
    sampler = TokenBatchSampler(_lengths(), cap, worst_first=True, pad_multiple=multiple, window=window)
    epoch = TokenBatchSampler(_lengths(), cap, pad_multiple=multiple)
    batches = list(epoch)
    rate = len({epoch.shape(b) for b in batches}) / len(batches)
    order, warm = sampler.all_batches(), sampler.warm_batches()
    start = warm or 2  # nothing paid ahead: the warm-up is the probe's own (two steps)
    assert abs(_new_share(order, start, window, sampler) - rate) <= 1.5 / window, (rate, warm)
    if multiple == 64:
        blind = TokenBatchSampler(_lengths(), cap, worst_first=True, pad_multiple=multiple)
        assert _new_share(blind.all_batches(), 2, window, blind) >= rate + 0.25  # what the search read before


def test_a_probe_measures_within_one_epoch_of_token_batches():
    """A second pass meets every shape again, faster than the epoch a run trains: the probe stops at its first
    epoch's end (on an H200 a probe read 1.27x its whole epoch, 28 batches measured past it)."""
    lengths = [16] * 40 + [8] * 40
    run = Run(Config(batch_size=64, max_tokens=64), "cpu", probing=True, warmup_steps=2, measured_steps=3,
              min_measure_s=60.0, max_measured_steps=150)
    loader = run.token_batches(Sequences(lengths), lengths, collate_fn=collate)
    epoch = len(loader.batch_sampler)
    assert run.control.clock.max_measured_steps == epoch - 2
    short = Run(Config(batch_size=64, max_tokens=64), "cpu", probing=True, warmup_steps=2, measured_steps=100,
                min_measure_s=60.0, max_measured_steps=5000)
    short.token_batches(Sequences(lengths), lengths, collate_fn=collate)
    assert short.control.clock.max_measured_steps == 5000  # shorter than the least a probe measures: as before


def test_run_pad_multiple_is_the_configs_and_offers_the_knob():
    run = Run(Config(batch_size=8), "cpu", probing=True)
    assert not run.control.knobs.pad_multiple
    assert run.pad_multiple == 1 and run.control.knobs.pad_multiple
    assert Run(Config(batch_size=8, pad_multiple=64), "cpu").pad_multiple == 64
    assert run.control.knobs.to_dict()["pad_multiple"] is True


def _attend(run: Run) -> torch.Tensor:
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    with run.control.active():
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_a_probe_notes_the_kernels_its_attention_runs_and_puts_the_function_back():
    original = torch.nn.functional.scaled_dot_product_attention
    probe = Run(Config(batch_size=8), "cpu", probing=True)
    _attend(probe)
    assert probe.control.knobs.sdpa_backends == ["math"]  # a CPU picks flash; math runs it too
    assert torch.nn.functional.scaled_dot_product_attention is original
    normal = Run(Config(batch_size=8), "cpu")
    with normal.control.active():
        assert torch.nn.functional.scaled_dot_product_attention is original  # nothing of it in a normal run
    assert normal.control.knobs.sdpa_backends is None
    silent = Run(Config(batch_size=8), "cpu", probing=True)
    with silent.control.active():
        pass
    assert silent.control.knobs.to_dict()["sdpa_backends"] is None  # no attention: no knob


def test_the_configs_kernel_holds_for_the_run_and_is_put_back():
    q = torch.randn(2, 4, 16, 8)
    assert int(torch._fused_sdp_choice(q, q, q, is_causal=True)) != 0  # PyTorch's own pick: flash
    run = Run(Config(batch_size=8, sdpa_backend="math"), "cpu")
    with run.control.active():
        assert int(torch._fused_sdp_choice(q, q, q, is_causal=True)) == 0  # math
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()


def test_a_cpu_runs_token_batches_bound_the_per_shape_caches_and_record_them(monkeypatch):
    lengths = [16] * 10
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "50")  # the user's own stands
    run = Run(Config(batch_size=64, max_tokens=64), "cpu", probing=True)
    with run.control.active():
        loader = run.token_batches(Sequences(lengths), lengths, collate_fn=collate)
        bounded = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
        for _ in run.batches(loader):
            run.control.knobs.ran_tokens(4, 16)
            break
    assert bounded is not None and "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ  # set for the run only
    caches = run.control.knobs.to_dict()["token_envelope"]["caches"]
    assert caches == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": int(bounded), "LRU_CACHE_CAPACITY": 50}
    from autofit.runtime import TokenEnvelope

    envelope = TokenEnvelope.from_dict(run.control.knobs.to_dict()["token_envelope"])
    assert envelope.caches == caches and TokenEnvelope.from_dict(envelope.to_dict()) == envelope
    again = Run(Config(batch_size=64, max_tokens=64), "cpu", token_envelope=TokenEnvelope(16, 64, 1024, (),
                {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 7, "LRU_CACHE_CAPACITY": 3}))
    monkeypatch.delenv("LRU_CACHE_CAPACITY")
    with again.control.active():
        again.token_batches(Sequences(lengths), lengths, collate_fn=collate)
        assert (os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], os.environ["LRU_CACHE_CAPACITY"]) == ("7", "3")


def test_a_cpu_run_of_fixed_batches_bounds_the_per_shape_caches_too(monkeypatch):
    """Fixed batches padded to each one's longest meet a new shape at almost every batch as token batches do (a
    bf16 batch of one over 250 lengths held 1.8 GiB of oneDNN's caches): every CPU run bounds them as it begins,
    for the run only; a GPU run sets nothing."""
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    run = Run(Config(batch_size=4), "cpu", probing=True)
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ  # not before the run begins
    with run.control.active():
        during = {name: os.environ.get(name) for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    assert all(value and value.isdigit() for value in during.values())
    assert run.control.knobs.shape_caches == {name: int(value) for name, value in during.items()}
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ and "LRU_CACHE_CAPACITY" not in os.environ


def test_a_model_compiled_by_the_run_compiles_one_graph_for_every_shape_of_its_token_batches():
    """torch.compile over variable lengths compiles a graph at the first shape and a dynamic one at the second
    (Dynamo's automatic dynamic shapes: never one per batch, padded or not); the run marks its token batches'
    samples and length dynamic, so that one graph, compiled at the first batch, takes them all."""
    from torch._dynamo.utils import counters

    lengths = [5, 9, 13, 17, 21, 25] * 4

    def graphs(compiled_by_the_run: bool) -> tuple[int, int]:
        torch._dynamo.reset()
        counters.clear()
        run = Run(Config(batch_size=64, max_tokens=64, compile=True), "cpu")
        model = torch.nn.Embedding(8, 4)
        model = run.compile(model, backend="eager") if compiled_by_the_run else torch.compile(model, backend="eager")
        shapes = set()
        for x, _ in run.batches(run.token_batches(Sequences(lengths), lengths, collate_fn=collate)):
            model(x).sum()
            shapes.add(tuple(x.shape))
        return len(shapes), counters["stats"]["unique_graphs"]

    assert graphs(True) == (graphs(True)[0], 1) and graphs(True)[0] >= 4
    assert graphs(False)[1] == 2
