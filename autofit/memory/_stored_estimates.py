"""The memory estimator's answers as kept on a study (autofit.study keeps the raw attribute): a resumed
search, `autofit show`, the report and `autofit export` read them from there, and turn them into the
planner's predictions with the device's peak factors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autofit.config import Config
from autofit.memory._estimator import CUDA_CONTEXT_BYTES, PARTS
from autofit.memory._peak_factors import peak_factors
from autofit.planner import MemoryPrediction

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class StoredEstimates:
    """What the estimator answered for a search, as kept on the study."""

    breakdowns: dict[Config, dict[str, int]]
    baseline_bytes: int | None
    seconds: float
    error: str | None
    asked: int
    known_bytes: int | None = None
    """Where the fake tensors could not follow a step: the tensor bytes still known (parameters,
    gradients, optimizer state), a floor under every config's peak."""
    note: str | None = None
    """What the estimator could not predict or guessed, one line."""
    context_bytes: int | None = None
    """What a process's first training steps cost beyond their tensors (the CPU's context), measured."""

    def to_dict(self) -> dict:
        return {"configs": [{"config": c.to_dict(), "breakdown": b} for c, b in self.breakdowns.items()],
                "baseline_bytes": self.baseline_bytes, "seconds": round(self.seconds, 1), "error": self.error,
                "asked": self.asked, "known_bytes": self.known_bytes, "note": self.note,
                "context_bytes": self.context_bytes}

    @classmethod
    def from_dict(cls, data: dict) -> StoredEstimates:
        return cls({Config.from_dict(e["config"]): {p: int(v) for p, v in e["breakdown"].items()}
                    for e in data.get("configs", [])},
                   data.get("baseline_bytes"), float(data.get("seconds", 0.0)), data.get("error"),
                   int(data.get("asked", 0)), data.get("known_bytes"), data.get("note"), data.get("context_bytes"))

    def prediction(self, device: str) -> MemoryPrediction | None:
        """The planner's predictions; None when nothing was estimated (nor any part known)."""
        if not self.breakdowns and not self.known_bytes:
            return None
        return MemoryPrediction.from_estimates(
            {c: sum(b.values()) for c, b in self.breakdowns.items()},
            device_bytes=CUDA_CONTEXT_BYTES if device == "cuda" else self.device_bytes,
            floor_bytes=self.known_bytes, **peak_factors(device))

    @property
    def device_bytes(self) -> int:
        """On the CPU, what a process holds beside its tensors at a step's peak: Python, torch and the
        script, and the runtime's context."""
        return (self.baseline_bytes or 0) + (self.context_bytes or 0)

    def breakdown(self, config: Config) -> dict[str, float] | None:
        """Predicted tensor bytes of `config` by part, interpolated along the batch like the totals."""
        parts = {}
        for part in PARTS:
            one = MemoryPrediction.from_estimates({c: b.get(part, 0) for c, b in self.breakdowns.items()},
                                                  device_bytes=0, **peak_factors("cpu"))
            value = one.tensor_bytes(config)
            if value is None:
                return None
            parts[part] = value
        return parts

    def where_memory_goes(self, config: Config, measured_peak: float | None) -> dict[str, float] | None:
        """The peak split into the estimator's parts (predicted) and, when a probe measured the peak,
        the rest of it ("device": the process or CUDA context, the allocator's caching, workspaces).
        None when the config's strategy was not estimated."""
        parts = self.breakdown(config)
        if parts is None:
            return None
        if measured_peak is not None:
            parts["device"] = max(0.0, measured_peak - sum(parts.values()))
        return parts

    def summary(self) -> str:
        if self.note and not self.breakdowns:
            return f"{self.note}; the planner rules out what they alone do not fit, and learns the rest from probes"
        done = f"memory estimator: {len(self.breakdowns)} of {self.asked} configs estimated in {self.seconds:.0f}s"
        if self.error:
            return f"{done} ({self.error}); the planner predicts with those it has" if self.breakdowns else (
                f"memory estimator: no estimate ({self.error}); memory is learnt from probes alone")
        return f"{done} ({self.note.removeprefix('memory estimator: ')})" if self.note else done


def stored_estimates(study: optuna.Study) -> StoredEstimates | None:
    """The estimates the study kept (None: its search ran without, or had none)."""
    # imported here: the estimator's own process imports autofit.memory, and must not import optuna
    from autofit.study import kept_estimates

    data = kept_estimates(study)
    return StoredEstimates.from_dict(data) if data else None
