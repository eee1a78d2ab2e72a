"""A request's configs estimated from traces, in the estimator's process: each config's program (`program_of`:
the precision as its bytes go, whether gradients live through a forward) traced at two micro-batches once
(autofit.memory._step_trace), and every config of it, whatever its micro-batch, checkpointed blocks and policy
or offload, answered by arithmetic over the two traces (autofit.memory._traced_peaks). What the arithmetic
cannot describe (blocks that run inside each other, a program whose two traces ran different ops, a trace that
a function refuses) is estimated by a run of its own (`estimate_for`), as every config was before.

What changes the traced program, and so has traces of its own:
- the precision, as its bytes go: bf16 and fp16 hold the same bytes (fp16's loss scaler is a few scalars), as
  do fp32 and tf32 (TF32 changes the matmul unit): one program each pair (`same_bytes`);
- whether gradients live through a forward (accumulation above one): traced at two micro-batches a step, the
  same bytes as any more (each further micro-batch repeats the second);
- batches by tokens: the same program, sized by the samples of each cap's worst batch (the data's longest
  samples, as many as the cap holds: memory grows with them at one padded length), so a cap's config is the
  traced program at those samples.
Sharding is not estimated (a search across ranks runs without the estimator) and compilation is estimated as
the eager model, as before: neither makes a program of its own here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from autofit.config import Config
from autofit.memory._traced_peaks import TracedPeaks, apart
from autofit.planner import STRATEGY_KNOBS, holds_gradients

#: The micro-batches a program is traced at: small (a trace's time hardly depends on it), above 1 (a batch
#: norm refuses a batch of one sample), and the smaller pair where the data holds too few samples for them.
TRACED_SAMPLES = ((2, 4), (1, 2))


def same_bytes(precision: str) -> str:
    """The precision whose tensors hold the same bytes: fp16 as bf16, tf32 as fp32 (one estimate for both)."""
    return {"tf32": "fp32", "fp16": "bf16"}.get(precision, precision)


def program_of(config: Config) -> tuple:
    """What a config's traced program is (see the module's docstring)."""
    return same_bytes(config.precision), holds_gradients(config), config.max_tokens is not None


class TracedPrograms:
    """The traces of one estimator process, per program, made on first use and kept for every later request."""

    def __init__(self, estimate: Callable[..., dict]) -> None:
        """`estimate(config, traced=...)`: one run of the function (autofit.memory._estimate_process's
        `estimate_for` over the loaded function and device)."""
        self._estimate = estimate
        self._programs: dict[tuple, _Program] = {}

    def estimate(self, config: Config) -> dict:
        """`config`'s estimate, as a run of its own answers it (the answer's "traced": whether arithmetic gave it)."""
        key = program_of(config)
        if key not in self._programs:
            self._programs[key] = _Program.traced(self._estimate, config)
        return self._programs[key].estimate(config, self._estimate)


@dataclasses.dataclass
class _Program:
    """One program's two traces (or why it has none), and the answers that follow from them."""

    peaks: TracedPeaks | None
    first: dict | None
    """The first trace's answer (its knobs, notes), or where it could not run, a run of its own's (a failed or
    partial one stands for every config of the program); None: each config is run on its own."""
    longest: int | None = None
    """By tokens: the data's longest sample."""
    data_samples: int | None = None
    why_not: str | None = None
    """Why configs of this program are not answered by arithmetic (each is then run on its own)."""

    @classmethod
    def traced(cls, estimate: Callable[..., dict], config: Config) -> _Program:
        """Its two traces, from `config` (the first config of it asked): at TRACED_SAMPLES, or by tokens at
        `config`'s cap and at a cap of twice the samples of its worst batch."""
        from autofit.runtime import DataTooSmall  # torch: not for a process that reads answers alone

        tokens = config.max_tokens is not None
        first: dict | None = None
        for small, large in [(config.max_tokens, 0)] if tokens else TRACED_SAMPLES:
            try:
                first = estimate(_traced_config(config, small), traced=True)
                if not first["ok"] or first.get("missing"):
                    break
                if tokens:
                    samples, data = first["trace"].size, first.get("data_samples")
                    if data is not None and samples >= data:  # one batch, the whole data, whatever the cap
                        return cls(TracedPeaks.flat(first["trace"]), first, _longest(first), data)
                    large = 2 * samples * _longest(first)
                second = estimate(_traced_config(config, large), traced=True)
            except DataTooSmall as exc:
                if tokens or small == TRACED_SAMPLES[-1][0]:
                    return cls(None, None, why_not=f"DataTooSmall: {exc}")
                first = None
                continue  # the smaller pair
            if not second["ok"] or second.get("missing"):
                return cls(None, first, why_not=second.get("error") or "partial")
            why_not = apart(first["trace"], second["trace"])
            if why_not is not None:  # the two sizes ran different ops: no arithmetic between them
                return cls(None, first, why_not=why_not)
            peaks = TracedPeaks(first["trace"], second["trace"])
            return cls(peaks, first, _longest(first) if tokens else None, first.get("data_samples"))
        alone = estimate(config)  # no trace: a run of its own says whether the trace or the function failed
        return cls(None, alone, why_not=f"the trace failed ({(first or {}).get('error')})")

    def estimate(self, config: Config, estimate: Callable[..., dict]) -> dict:
        """`config`'s estimate: by arithmetic where the traces describe it, else by a run of its own."""
        if self.peaks is None:
            if self.first is not None and (not self.first["ok"] or self.first.get("missing")):
                return _answer(self.first)  # the same program: its failure, or its known parts, stand for all
            return estimate(config)
        layout = self.peaks.layout(config)
        if self.peaks.describes(layout) is not None:
            return estimate(config)
        samples = self._samples(config)
        if samples is None:
            return {"ok": False, "error": f"DataTooSmall: the data holds {self.data_samples} samples, fewer than a "
                                          f"micro-batch of {config.batch_size}"}
        knobs = dict(self.first["knobs"])
        if self.longest:
            from autofit.runtime import TokenEnvelope
  # its cap's worst batch, as a run of its own would have run
            knobs["token_envelope"] = TokenEnvelope.of_batch(samples, self.longest).to_dict()
        return {**_answer(self.first), "breakdown": self.peaks.breakdown(layout, samples), "knobs": knobs,
                "traced": True}

    def _samples(self, config: Config) -> int | None:
        """The samples of `config`'s micro-batch (by tokens: its cap's worst batch); None where the data cannot
        feed one."""
        if self.longest:
            whole = self.data_samples or config.max_tokens
            return max(1, min(config.max_tokens // self.longest, whole))
        if self.data_samples is not None and config.batch_size > self.data_samples:
            return None
        return config.batch_size


def _traced_config(config: Config, size: int) -> Config:
    """The program's config that a trace runs: `size` samples (by tokens: a cap of `size` tokens), every other
    knob of a strategy at its default (no block checkpointed or offloaded, eager) but the precision, two
    micro-batches a step where gradients live through a forward; the rest of `config` as it is."""
    tokens = config.max_tokens is not None
    defaults = {k.name: k.default for k in STRATEGY_KNOBS}
    return dataclasses.replace(config, **{**defaults, "precision": same_bytes(config.precision),
                                          "accumulation_steps": 2 if holds_gradients(config) else 1},
                               batch_size=size, max_tokens=size if tokens else None, max_squares=None)


def _longest(found: dict) -> int:
    envelope = (found.get("knobs") or {}).get("token_envelope") or {}
    return int(envelope.get("longest_sample") or 1)


def _answer(found: dict) -> dict[str, Any]:
    """An answer as the channel carries it (no trace)."""
    return {k: v for k, v in found.items() if k not in ("trace", "data_samples")}
