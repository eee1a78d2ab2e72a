"""Small fitted models the planner reasons with: memory linear in batch, step time linear in batch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """y = intercept + slope * x, with the worst relative residual of the fit."""

    intercept: float
    slope: float
    max_rel_residual: float = 0.0
    points: int = 0

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x

    def solve(self, y: float) -> float:
        """x where the line reaches y (inf when it never does)."""
        if self.slope <= 0:
            return float("inf")
        return (y - self.intercept) / self.slope


def fit_line(points: list[tuple[float, float]]) -> Line | None:
    """Least squares through (x, y) points with at least two distinct x; None otherwise."""
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    residual = max(abs(intercept + slope * x - y) / max(abs(y), 1e-12) for x, y in points)
    return Line(intercept, slope, residual, n)


@dataclass(frozen=True)
class ThroughputModel:
    """Time per micro-batch = fixed + per_sample * batch, so samples/s = b / (fixed + per_sample b).

    Rises with batch and saturates at 1 / per_sample: the shape of nearly every training step. By tokens
    the same with the token cap for b and real tokens/s for samples/s: a micro-batch's real tokens grow
    with its cap (a constant share of it, the padding aside), and only the constants change.
    """

    line: Line

    def __call__(self, batch: float) -> float:
        time = self.line(batch)
        return batch / time if time > 0 else float("inf")

    @property
    def ceiling(self) -> float:
        return 1.0 / self.line.slope if self.line.slope > 0 else float("inf")


def fit_throughput(points: list[tuple[int, float]]) -> ThroughputModel | None:
    """From (size, rate) points (batch and samples/s, or cap and tokens/s); None with fewer than two sizes."""
    line = fit_line([(b, b / t) for b, t in points if t and t > 0])
    return ThroughputModel(line) if line is not None else None
