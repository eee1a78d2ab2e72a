"""`StepClock`: when a run's steps begin and end, what the steps after warm-up did, and how long
they waited for their data."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autofit.runtime._accumulation import InnerSpans


class ProbeFinished(BaseException):
    """Raised out of `run.batches()` once a probe has its steps.

    A BaseException, so that a user's `except Exception` around the loop does not swallow it.
    """


#: Step times a run keeps for its median and spread; older ones only count in the totals.
_RECENT_STEPS = 256
#: A probe whose measured steps spread so widely that the mean step's standard error is above this share of it
#: measures on (a few slow steps among five: a Lightning probe read 0.59-0.83 of its normal run, whose rate its
#: median step said) ...
SETTLED_SE = 0.025
#: ... up to this many times the time it would have measured otherwise; ...
SPREAD_EXTENSION = 4.0
#: ... and where its mean step is still uncertain by more than this share then, so is its figure (and it says so).
UNCERTAIN_SE = 0.05


@dataclass
class StepClock:
    """Step boundaries and what the steps after warm-up did, in constant memory.

    The device is synchronised only where a time must be exact: when measuring starts (end of
    warm-up) and when it ends. Steps in between run as they would in the user's own loop (on a GPU
    the CPU keeps queueing work), so their individual times are approximate while their sum is exact.
    A probe measures `measured_steps` steps and then goes on, up to `max_measured_steps`, until at
    least `min_measure_s` has been measured: five 3 ms steps are too short to time; and on, up to
    `SPREAD_EXTENSION` times that, while its steps spread so widely that their mean is not settled (its
    standard error above `SETTLED_SE` of it: `unsettled` says how far it was when it stopped); with no
    `min_measure_s`, exactly the steps it was asked for.
    A normal run (measured_steps None) never synchronises and only keeps totals and recent steps.
    The ranks of a distributed probe must stop at the same step (one left in a collective waits for
    ever): with `agree`, each rank works out after its first measured step how many steps reach
    `min_measure_s`, and all ranks measure the largest count any of them needs.
    """

    warmup_steps: int
    measured_steps: int | None  # None: no probe, train until the function returns
    synchronize: Callable[[], None]
    min_measure_s: float = 0.0
    max_measured_steps: int | None = None
    agree: Callable[[int], int] | None = None
    counters: dict[str, Callable[[], float | None]] = field(default_factory=dict)
    """The device's counters by name (NVML's energy in joules "energy_j", the allocator's "alloc_retries"), read
    where measuring starts (after warm-up) and where a probe's measuring ends: `counted` holds their growth."""
    steps_done: int = 0
    measured_time_s: float = 0.0
    measured_samples: int = 0
    measured_tokens: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=_RECENT_STEPS))
    warmup_time_s: float | None = None
    """From the start to the end of warm-up (compilation and first-use costs land here)."""
    counted: dict[str, float] = field(default_factory=dict)
    """Each counter's growth over a probe's measured steps (`counters`; a normal run: `counts_so_far`)."""
    _counted_from: dict[str, float] = field(default_factory=dict)
    timing: Callable[[bool], None] | None = None
    """Told True where a probe's measuring starts and False where it ends (the device's `timing`: the CPU's memory
    sampler sleeps between, so the measured steps are the normal run's, which runs no sampler)."""
    data_wait_s: float | None = None
    """Host time the measured steps spent waiting for their data (inside `next()` on the user's
    iterable); None where autofit does not see the data (a framework's trainer drives the loop). On a
    GPU the wait can overlap kernels queued before it, so it bounds the device's idle time from above."""
    _waiting_s: float = 0.0  # data wait since the last step boundary: counts only if that step is measured
    _started: float | None = None
    _last: float | None = None
    _agreed_steps: int | None = None
    complete: bool = False
    inner: InnerSpans | None = None
    """A probe that prices a longer accumulation than it runs times its steps' inner micro-batches here."""
    progress: Callable[[int, int], None] | None = None
    """Told (micro-batches done, optimizer steps done) at every backward pass and step: a probe's sign of
    life to the process that may kill it (throttled by the listener)."""
    micro_batches_done: int = 0
    """Backward passes returned so far (each micro-batch's), in warm-up or not."""
    first_micro_at: float | None = None
    """When the first backward pass returned (`time.perf_counter`): the run's set-up ended there."""
    fewest_per_step: int | None = None
    """The fewest backward passes a closed step held (None before one held any)."""
    unsettled: float | None = None
    """A probe that stopped with its mean step still unsettled: the mean's standard error, as a share of it."""
    _enough_at_s: float | None = None  # measured time when a probe had its steps and min_measure_s
    _micro_at_step: int = 0  # micro_batches_done when the last step closed

    @property
    def total_steps(self) -> int | None:
        """Warm-up plus the steps a probe measures at least (None for a normal run)."""
        if self.measured_steps is None:
            return None
        return self.warmup_steps + self.measured_steps

    @property
    def steps_measured(self) -> int:
        return max(0, self.steps_done - self.warmup_steps)

    def _stamp(self, exact: bool) -> float:
        if exact:
            self.synchronize()  # a CPU-GPU sync point: the queued kernels must be done
        return time.perf_counter()

    def start(self) -> None:
        exact = self.warmup_steps == 0 and self.measured_steps is not None
        if exact:
            self._timing(True)
        self._last = self._started = self._stamp(exact=exact)
        self._waiting_s = 0.0  # the first fetch came before the clock started
        if exact:
            self._count_from()

    @property
    def measured_energy_j(self) -> float | None:
        """Energy the device drew over the measured steps (probes on a device with an energy counter)."""
        return self.counted.get("energy_j")

    def _timing(self, timed: bool) -> None:
        """Tell the device a probe's timed steps begin or end (before the first stamp, after the last)."""
        if self.timing is not None:
            self.timing(timed)

    def _count_from(self) -> None:
        self._counted_from = {name: value for name, read in self.counters.items() if (value := read()) is not None}

    def counts_so_far(self) -> dict[str, float]:
        """Each counter's growth since measuring started (nothing before it started)."""
        return {name: end - start for name, start in self._counted_from.items()
                if (end := self.counters[name]()) is not None}

    def data_waited(self, seconds: float) -> None:
        """A fetch of the data took `seconds` (it counts for the step it falls in, if that step is measured)."""
        self.data_wait_s = self.data_wait_s or 0.0
        self._waiting_s += seconds

    @property
    def measuring(self) -> bool:
        """A probe's measured step is running now."""
        return self.measured_steps is not None and self.steps_done >= self.warmup_steps and not self.complete

    def backward_done(self) -> None:
        """A backward pass returned (a micro-batch's, or one of several in it)."""
        self.micro_batches_done += 1
        if self.first_micro_at is None:
            self.first_micro_at = time.perf_counter()
        if self.inner is not None:
            self.inner.backward_done(self.measuring)
        if self.progress is not None:
            self.progress(self.micro_batches_done, self.steps_done)

    @property
    def open_micro_batches(self) -> int:
        """Backward passes returned since the last optimizer step closed."""
        return self.micro_batches_done - self._micro_at_step

    def step_done(self, samples: int, tokens: int) -> None:
        held, self._micro_at_step = self.open_micro_batches, self.micro_batches_done
        if held > 0:
            self.fewest_per_step = held if self.fewest_per_step is None else min(self.fewest_per_step, held)
        if self.inner is not None:
            self.inner.step_done()
        self._step_done(samples, tokens)
        if self.progress is not None:
            self.progress(self.micro_batches_done, self.steps_done)

    def _step_done(self, samples: int, tokens: int) -> None:
        self.steps_done += 1
        waited, self._waiting_s = self._waiting_s, 0.0
        if self.data_wait_s is not None and self.steps_done > self.warmup_steps:
            self.data_wait_s += waited
        probing = self.measured_steps is not None
        if self.steps_done <= self.warmup_steps:
            if probing and self.steps_done == self.warmup_steps:
                self._timing(True)
            self._last = self._stamp(exact=probing and self.steps_done == self.warmup_steps)
            if self.steps_done == self.warmup_steps and self._started is not None:
                self.warmup_time_s = self._last - self._started
            if self.steps_done == self.warmup_steps:
                self._count_from()
            return
        now = self._stamp(exact=False)
        if probing and self.agree is not None and self.steps_measured == 1:
            self._agreed_steps = self.agree(self._steps_needed(now - self._last))
        if probing and self._enough(self.measured_time_s + now - self._last, now - self._last):
            now = self._stamp(exact=True)
            self.complete = True
            self.counted = self.counts_so_far()
            self._timing(False)
        self.step_times.append(now - self._last)
        self.measured_time_s += now - self._last
        self.measured_samples += samples
        self.measured_tokens += tokens
        self._last = now

    def _steps_needed(self, first_step_s: float) -> int:
        """Measured steps that take `min_measure_s` at the first measured step's pace, within bounds."""
        needed = math.ceil(self.min_measure_s / max(first_step_s, 1e-9))
        needed = max(needed, self.measured_steps or 0)
        return min(needed, self.max_measured_steps) if self.max_measured_steps is not None else needed

    def _enough(self, measured_s: float, step_s: float) -> bool:
        if self._agreed_steps is not None:  # ranks stop at one step count, whatever their spread
            return self.steps_measured >= self._agreed_steps
        if self.steps_measured < (self.measured_steps or 0):
            return False
        at_most = self.max_measured_steps is not None and self.steps_measured >= self.max_measured_steps
        if measured_s < self.min_measure_s:
            return at_most
        if self.min_measure_s <= 0:  # no time to measure asked for: exactly the steps asked for
            return True
        self._enough_at_s = self._enough_at_s or measured_s
        spread = _mean_error([*self.step_times, step_s])
        if spread <= SETTLED_SE:
            return True
        if at_most or measured_s >= SPREAD_EXTENSION * self._enough_at_s:
            self.unsettled = spread
            return True
        return False

    @property
    def uncertain(self) -> float | None:
        """The mean step's standard error, as a share of it, where a probe stopped with it above `UNCERTAIN_SE`."""
        return self.unsettled if self.unsettled is not None and self.unsettled > UNCERTAIN_SE else None

    @property
    def data_wait_share(self) -> float | None:
        """The measured time's share spent waiting for data (None: not seen, or nothing measured)."""
        if self.data_wait_s is None or self.measured_time_s <= 0:
            return None
        return min(1.0, self.data_wait_s / self.measured_time_s)

    def measured(self) -> tuple[list[float], int, int]:
        """Recent step times after warm-up, and the samples and tokens of all measured steps."""
        return list(self.step_times), self.measured_samples, self.measured_tokens


def _mean_error(times: list[float]) -> float:
    """The standard error of the mean step of `times`, as a share of it, by batch means: the steps in
    `_BLOCKS` runs of consecutive ones (each step its own for fewer), so that a GPU's step times, which are
    the host's (a step that waits for the queue holds the time of the quick ones before it), count by their
    sums. 0.0 for fewer than two."""
    blocks = min(_BLOCKS, len(times))
    if blocks < 2:
        return 0.0
    bounds = [round(i * len(times) / blocks) for i in range(blocks + 1)]
    means = [statistics.fmean(times[a:b]) for a, b in zip(bounds, bounds[1:])]
    mean = statistics.fmean(times)
    return statistics.stdev(means) / math.sqrt(blocks) / mean if mean > 0 else 0.0


#: Runs of consecutive steps whose means judge whether a probe's mean step is settled.
_BLOCKS = 5
