"""One trace, every config (autofit.memory._traced_space): a program traced at two micro-batches answers every
config of it by arithmetic (its micro-batch, checkpointed blocks and policy, offload), and those answers meet
what a run of each config on its own (the estimator before them, kept for what the arithmetic cannot describe)
counts, on several scripts."""
from __future__ import annotations

import os

import pytest

from autofit.config import Config
from autofit.memory import Estimator
from autofit.planner import SearchSpace
from tests.support import CORPUS, REPO, STUDIES, script

#: Within what the arithmetic meets a run of each config: without checkpointing or offload it is the same count
#: (the trace holds what autograd held); a checkpointed block's recompute is modelled from its forward, at one
#: moment. The offload's arithmetic follows autofit's offload (autofit.memory._traced_offload), which a run of
#: each config runs for real, its copies sizes (on gpt-cuda they meet exactly).
PLAIN, REST = 0.005, 0.03


def _against_runs(path: str, configs: list[Config], target: str = "cpu") -> dict[Config, tuple[int, int]]:
    """Each config's tensor bytes at its peak from its program's traces, and from a run of its own (one process)."""
    with Estimator(path, target=target, beside_probes=False) as estimator:
        traced = estimator.estimate(configs, timeout=600, traced=True)
        alone = estimator.estimate(configs, timeout=600)
    assert not traced.unavailable and not alone.unavailable, (traced.unavailable, alone.unavailable)
    assert all(e.traced for e in traced.estimates.values()) and not any(e.traced for e in alone.estimates.values())
    return {c: (traced.estimates[c].total_bytes, alone.estimates[c].total_bytes) for c in configs}


def _check(found: dict[Config, tuple[int, int]]) -> None:
    errors = {c.label(): round(t / a - 1, 4) for c, (t, a) in found.items()}
    for config, (traced, alone) in found.items():
        plain = not config.checkpoint_segments and not config.offload_activations
        assert abs(traced / alone - 1) <= (PLAIN if plain else REST), errors


def _layouts(blocks: int, batches: tuple[int, ...], precision: str = "fp32", offload: bool = False) -> list[Config]:
    """Each batch without checkpointing, with half and all of the blocks under each policy, and (for a CUDA
    target) offloaded, alone and with half the blocks checkpointed."""
    layouts = [(0, "full", False)] + [(k, p, False) for k in (blocks // 2, blocks) for p in ("full", "selective")]
    layouts += [(0, "full", True), (blocks // 2, "full", True)] if offload else []
    return [Config(batch_size=b, precision=precision, checkpoint_segments=k, checkpoint_policy=p,
                   offload_activations=o) for b in batches for k, p, o in layouts]


def test_a_blocks_model_traced_twice_meets_a_run_of_each_config_checkpointed_or_not():
    """Eight Llama-style blocks (RMSNorm, attention, SwiGLU) under bf16 autocast: at batches below, between
    and above the traced two (2 and 4), none, half or all of the blocks checkpointed, fully or selectively."""
    configs = [Config(batch_size=b, precision="bf16", checkpoint_segments=k, checkpoint_policy=p)
               for b, k, p in ((1, 0, "full"), (3, 4, "full"), (16, 0, "full"), (16, 8, "full"), (16, 4, "selective"))]
    _check(_against_runs(script("transformer_blocks.py"), configs))


@pytest.mark.slow  # a few scripts, each traced and then run config by config: about a minute on two cores
@pytest.mark.parametrize("path, blocks, precision, target", [
    (os.path.join(STUDIES, "gpt.py"), 4, "bf16", "cuda"),  # a GPT of 4 blocks for a GPU: offload too
    (os.path.join(CORPUS, "late_device.py"), 3, "fp32", "cpu"),  # a ResNet's stages, built before the device
    (os.path.join(CORPUS, "moe.py"), 2, "fp32", "cpu"),  # routed experts: data-dependent sizes guessed
], ids=["gpt-cuda", "late_device", "moe"])
def test_scripts_traced_twice_meet_a_run_of_each_config(path, blocks, precision, target):
    """gpt-cuda's offloaded configs: at b=2 no storage a block saves reaches the offload's 1 MiB (nothing leaves),
    at 8 and 24 the larger ones do, where the traces (at 2 and 4) saw none or fewer: which leave is decided at
    the size asked. Under save_on_cpu's arithmetic (every saved tensor, weights too) they were 21-55% off."""
    _check(_against_runs(path, _layouts(blocks, (2, 8, 24), precision, offload=target == "cuda"), target))


@pytest.mark.slow  # GPT-2 (transformers), traced, then a run of a few configs of its own
def test_every_config_of_gpt2s_space_on_the_cpu_from_one_trace_per_precision(monkeypatch):
    """GPT-2 small's blocks and heads (benchmarks/gpu/gpt124m.py, its 12 blocks and the loss head over a
    vocabulary of 50257) at a context of 64 and a width of 64: the ops a trace follows are GPT-2 small's, and
    a fake tensor's cost does not depend on its size. Every config of the space a CPU search builds (each
    precision, micro-batch 1-1024, 0/3/6/12 blocks checkpointed under either policy) is answered from its
    precision's two traces, but those the data (256 samples) cannot feed, and a few meet a run of their own."""
    pytest.importorskip("transformers")
    for name, value in (("GPT124M_SEQ", "64"), ("GPT124M_WIDTH", "64"), ("GPT124M_SAMPLES", "256")):
        monkeypatch.setenv(name, value)
    path = os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py")
    space = SearchSpace.build(batch_range=(1, 1024), precision=("fp32", "bf16"), checkpoint_segments=(0, 3, 6, 12),
                              checkpoint_policy=("full", "selective"))
    every = list(space.configs())
    with Estimator(path, beside_probes=False) as estimator:
        found = estimator.estimate(every, timeout=900, traced=True)
    data = [c for c in every if c.batch_size > 256]  # the data holds 256 samples: no micro-batch of more
    assert set(found.estimates) == set(every) - set(data) and len(found.estimates) == 14 * 16
    assert data and all("DataTooSmall" in found.unavailable[c] for c in data)
    assert all(e.traced and e.complete for e in found.estimates.values())
    sample = [c for c in every if c.batch_size == 24 and c.checkpoint_segments in (0, 6)]
    _check(_against_runs(path, sample))
