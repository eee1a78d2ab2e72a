"""Rule 12: where memory binds the micro-batch, the memory levers climb at the next micro-batch, guided by the memory
prediction, before any probe goes to the plain edge; and a lever is probed only where memory binds (issue 51). A
GPU-like landscape of a Llama-style decoder of about 1B parameters at 4,096 tokens under a cap, bf16: the weights,
gradients and optimizer state take half the usable memory, the 16 blocks' activations most of the rest, so plain fits
only at micro-batch 1-2; a step's fixed part (launches, the optimizer) is large beside a sample's, so the larger
micro-batches that checkpointing lets fit win, and activation offload, whose copies do not overlap, does not."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.memory import peak_factors
from autofit.planner import MemoryPrediction, Observation, Planner, SearchSpace

GiB = 2**30
USABLE = 36 * GiB
FIXED = 18 * GiB  # fp32 weights, gradients and AdamW state of 1.1B parameters, the CUDA context
HEAD = 0.8  # GiB a sample: the logits the loss holds, outside the blocks (no lever saves them)
BLOCK = 0.45  # GiB a sample a block saves for backward
BLOCK_INPUT = 0.03  # GiB a sample: what a checkpointed block keeps (its input)
BLOCK_SELECTIVE = 0.25  # GiB a sample a block keeps under selective checkpointing (the matmuls' outputs)
BLOCKS = 16
STEP_S, SAMPLE_S = 0.2, 0.05  # a micro-batch's fixed part; a sample's, without recompute
RECOMPUTE = {"full": 0.3, "selective": 0.05}  # a sample's time more with every block checkpointed
OFFLOAD_KEPT, OFFLOAD_COST = 0.1, 1.8  # offload keeps a tenth of the blocks' on the device; its copies are serial


def _per_sample(config: Config) -> float:
    """GiB a sample at peak: the loss head, the blocks' saved tensors, one block recomputed where checkpointed."""
    k = config.checkpoint_segments
    kept = BLOCK_SELECTIVE if config.checkpoint_policy == "selective" else BLOCK_INPUT
    blocks = (BLOCKS - k) * BLOCK + k * kept + (BLOCK if k else 0.0)
    return HEAD + blocks * (OFFLOAD_KEPT if config.offload_activations else 1.0)


def _peak(config: Config) -> float:
    return FIXED + config.batch_size * _per_sample(config) * GiB


def _rate(config: Config) -> float:
    sample = SAMPLE_S * (1 + RECOMPUTE[config.checkpoint_policy] * config.checkpoint_segments / BLOCKS)
    sample *= OFFLOAD_COST if config.offload_activations else 1.0
    return config.batch_size / (STEP_S + config.batch_size * sample)


def _probe(config: Config) -> Observation:
    if _peak(config) > USABLE * 1.1:
        return Observation(config, "oom", wall_s=10.0)
    return Observation(config, "ok", peak_bytes=int(_peak(config)), rate=_rate(config), wall_s=10.0, spread=0.02)


def _space(**given) -> SearchSpace:
    return SearchSpace.build(**{"batch_range": (1, 2048), "precision": ("bf16",), "checkpoint_segments": (0, 4, 8, 16),
                                "checkpoint_policy": ("full", "selective"), "offload_activations": (False, True),
                                **given})


def _prediction(space: SearchSpace) -> MemoryPrediction:
    """The estimator's answer for every curve (tensor bytes at two micro-batches), as the one-trace estimate gives it."""
    factors = peak_factors("cuda")
    typical = factors["typical_factor"]
    estimates = {space.config(s, b): (_peak(space.config(s, b)) - GiB) / typical
                 for s in space.strategies() for b in (1, 8)}
    return MemoryPrediction.from_estimates(estimates, device_bytes=GiB, **factors)


def _search(space: SearchSpace, prediction: MemoryPrediction | None = None) -> tuple[Planner, list[Observation]]:
    planner = Planner(space, USABLE, check_noise=False, prediction=prediction)
    seen: list[Observation] = []
    while (config := planner.next(seen)) is not None:
        assert len(seen) < 40, "the planner did not finish"
        seen.append(_probe(config))
    return planner, seen


def _levers(seen: list[Observation]) -> list[Observation]:
    return [o for o in seen if o.config.checkpoint_segments or o.config.offload_activations]


@pytest.mark.parametrize("predicted", [False, True], ids=["memory-line", "estimator"])
def test_where_plain_fits_only_at_micro_batch_two_checkpointing_climbs_to_a_larger_one_that_wins(predicted):
    """Plain fits at b=2 at most; every block checkpointed fits b=8, 1.7x as fast. The search reaches a checkpointed
    config within 3% of the best of the whole space, with at most one probe that does not fit (the pilot's, a
    memory-scaled guess), no lever probed at a size plain was measured to fit, and no probe of plain b=3 (the edge).
    With the estimator's answer, whose range at b=2 crosses the usable memory, the levers climb from b=2."""
    space = _space()
    best = max((c for c in space.configs() if _peak(c) <= USABLE), key=_rate)
    assert best.checkpoint_segments == 16 and best.batch_size == 8 and _rate(best) > 1.6 * _rate(Config(
        batch_size=2, precision="bf16"))  # the landscape is the one the docstring says
    planner, seen = _search(space, _prediction(space) if predicted else None)
    pick = planner.best(seen)
    assert pick.checkpoint_segments and _rate(pick) >= 0.97 * _rate(best), [o.config.label() for o in seen]
    assert sum(o.too_big(USABLE) for o in seen) <= 1, [(o.config.label(), o.status) for o in seen]
    plain = max(o.config.batch_size for o in seen if o.fits(USABLE) and not _levers([o]))
    assert all(o.config.batch_size > plain for o in _levers(seen))
    assert Config(batch_size=3, precision="bf16") not in {o.config for o in seen}


def test_the_first_lever_is_probed_at_the_next_micro_batch_and_predicted_to_fit_there():
    """From probes alone: once plain's memory line says b=3 does not fit, the next probe is a lever at b=3 that the
    line, borrowed with its prior, says fits even at its high end; it fits."""
    _, seen = _search(_space())
    first = next(i for i, o in enumerate(seen) if o.config.checkpoint_segments or o.config.offload_activations)
    assert seen[first].config.batch_size == 3 and seen[first].fits(USABLE)
    assert max(o.config.batch_size for o in seen[:first] if o.fits(USABLE)) == 2


@pytest.mark.parametrize("bound", ["range", "global batch"])
def test_no_lever_is_probed_where_the_range_or_the_global_batch_ends_the_climb(bound):
    """Where the batch range (1-2) or the global batch (2: micro-batches 1 and 2) ends plain's climb before memory
    does, no lever is worth a probe: at a size plain fits, a lever only adds work (the H200's HF search spent its last
    probe on offload at b=32, its micro-batch held by the global batch, with 92 GiB free)."""
    space = _space(batch_range=(1, 2)) if bound == "range" else _space(global_batch=2)
    planner, seen = _search(space)
    assert _levers(seen) == []
    assert planner.best(seen).batch_size == 2


def test_a_lever_just_over_the_memory_is_followed_by_one_that_saves_more_at_the_same_micro_batch():
    """Issue 51's CPU search: b=16 with 3 selective segments peaked 0.2 MiB over the usable memory, and the search
    never tried more segments or the full policy, re-measuring plain b=8 instead. Here plain fits up to b=8 and b=12
    with 3 of 12 blocks selective ran just over the usable memory: the next probe is b=12 again, with a lever that
    saves more (more blocks, or the full policy), never a plain config."""
    MiB = 2**20
    usable = 630 * MiB
    space = SearchSpace.build(batch_range=(1, 1024), precision=("fp32",), checkpoint_segments=(0, 3, 6, 12),
                              checkpoint_policy=("full", "selective"))
    seen = [Observation(Config(batch_size=b), "ok", peak_bytes=(440 + 20 * b) * MiB, rate=b / (1 + 0.03 * b),
                        wall_s=10.0, spread=0.02) for b in (4, 6, 8)]
    seen.append(Observation(Config(batch_size=12, checkpoint_segments=3, checkpoint_policy="selective"), "ok",
                            peak_bytes=int(usable + 0.2 * MiB), rate=9.0, wall_s=10.0, spread=0.02))
    planner = Planner(space, usable, check_noise=False)
    after = planner.next(seen)
    assert after.batch_size == 12 and (after.checkpoint_segments > 3 or after.checkpoint_policy == "full"), after
