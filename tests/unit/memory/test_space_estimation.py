"""The order in which a search's estimator answers (autofit.memory.SpaceEstimation): the pilot's
strategy's line first, so that the first answers of a short search predict what it climbs first."""
from __future__ import annotations

from autofit.config import Config
from autofit.memory import PARTS, Estimates, MemoryEstimate, SpaceEstimation
from autofit.planner import SearchSpace


class _Estimator:
    """Answers every config at once (1 MiB a sample), and remembers the order it was asked in."""

    def __init__(self) -> None:
        self.asked: list[Config] = []

    def estimate(self, configs: list[Config], timeout: float, traced: bool = False) -> Estimates:
        self.asked += configs
        out = Estimates(baseline_bytes=0, context_bytes=0)
        for config in configs:
            parts = {**dict.fromkeys(PARTS, 0), "activations": config.batch_size * 2**20}
            out.estimates[config] = MemoryEstimate(config, parts)
        return out

    def kill(self) -> None:
        pass


def _estimated(first: Config | None) -> list[tuple[str, int, int]]:
    estimator = _Estimator()
    space = SearchSpace((1, 8, 16, 32, 64), {"precision": ("fp32", "bf16"), "checkpoint_segments": (0, 2)})
    estimation = SpaceEstimation(estimator, space, memory_limit=2**40, first=first)
    estimation.run()  # in this thread
    assert estimation.curve.is_set() and estimation.finished.is_set()
    assert len(estimator.asked) == len(set(estimator.asked))  # no config twice
    return [(c.precision, c.checkpoint_segments, c.batch_size) for c in estimator.asked]


def test_the_pilots_strategy_is_estimated_first_at_its_two_smallest_batches():
    asked = _estimated(first=Config(batch_size=16, precision="bf16"))
    assert asked[:2] == [("bf16", 0, 1), ("bf16", 0, 8)]  # its line, before any other strategy
    assert sorted(asked) == sorted(_estimated(first=None))  # then everything it would have asked


def test_without_a_pilot_the_eager_curves_go_first_smallest_batches_of_each_first():
    asked = _estimated(first=None)
    assert asked[:2] == [("fp32", 0, 1), ("bf16", 0, 1)]
    assert all(segments == 0 for _, segments, _ in asked[:len(asked) // 2])
