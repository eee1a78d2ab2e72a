"""One probe: run the user's function under one config for a few steps, measure, clean up."""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

from autofit.config import Config
from autofit.devices import DeviceBackend
from autofit.probing._bootstrap import user_traceback
from autofit.probing._record import ProbeResult
from autofit.runtime import ProbeFinished, Ranks, Run, RunSettings, breaks_the_device, is_oom

#: A probe measures at least this long (unless its steps reach _MAX_EXTENSION x the asked number).
MIN_MEASURE_S = 0.5
_MAX_EXTENSION = 50
#: A probe that measured this many steps is a measurement even when the function returned before
#: the longer run it was asked for (a confirmation of a script whose loop ends sooner).
ENOUGH_MEASURED_STEPS = 5


def run_probe(
    fn: Callable[[Run], Any],
    config: Config,
    backend: DeviceBackend,
    *,
    warmup_steps: int = 2,
    measured_steps: int = 5,
    min_measure_s: float = MIN_MEASURE_S,
    ranks: Ranks | None = None,
) -> ProbeResult:
    """Run `fn` for warm-up + measured optimizer steps under `config` on `backend`.

    The measured part goes on past `measured_steps` (up to 50x) until `min_measure_s` is measured,
    so that fast steps are timed over a span a clock can resolve.
    Never raises for anything the user's code does: every outcome is a status in the result.
    """
    backend.release()
    baseline = backend.used_bytes()
    backend.reset_peak()
    started = time.perf_counter()
    run = Run(RunSettings(
        config, backend.torch_device(), probing=True, warmup_steps=warmup_steps,
        measured_steps=measured_steps, synchronize=backend.synchronize, min_measure_s=min_measure_s,
        max_measured_steps=measured_steps * _MAX_EXTENSION, ranks=ranks, count_flops=True,
        energy=backend.energy_joules, global_tokens=getattr(getattr(fn, "options", None), "global_tokens", None)))
    result = ProbeResult(status="ok", config=config, warmup_steps=warmup_steps, memory_limit=backend.memory_limit)
    try:
        with run.active():
            fn(run)
        run.finish()
        _check_length(result, run, measured_steps)
    except ProbeFinished:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure of user code becomes a status
        if isinstance(exc, KeyboardInterrupt):
            raise
        _record_failure(result, exc)
        traceback.clear_frames(exc.__traceback__)  # frames hold the user's tensors
        del exc
    result.wall_s = time.perf_counter() - started
    result.knobs = run.knobs.to_dict()
    result.warmup_steps = run.clock.warmup_steps
    result.notes.extend(run.notes)
    result.baseline_bytes = baseline
    if result.restart_worker:
        return result  # the device answers nothing more in this process: no peak, no clean-up
    if result.status == "ok":
        backend.synchronize()
        result.wall_s = time.perf_counter() - started
    result.peak_bytes = backend.peak_bytes()
    result.allocator = backend.allocator_stats()
    if result.status == "ok":
        _fill_timing(result, run)
        _fill_work(result, run, backend)
        _check_finite(result, run)
    del run  # the user's model and tensors go before the memory left behind is read
    backend.release()
    result.memory_after_bytes = backend.used_bytes()
    return result


def _check_length(result: ProbeResult, run: Run, measured_steps: int) -> None:
    """A function that returned before its probe's steps: too short to measure, or (a long run whose
    own loop ended first) measured as far as it ran."""
    warmup_steps = run.clock.warmup_steps  # longer where a loader's prefetch queue had to drain
    needed = warmup_steps + min(measured_steps, ENOUGH_MEASURED_STEPS)
    if needed <= run.clock.steps_done < warmup_steps + measured_steps:
        # A long run (the confirmation) of a function whose own loop ended first (its data, its
        # max_train_steps): what ran is measured; the function's length is a fact, not a fault.
        result.notes.append(f"the function returned after {run.clock.steps_done} optimizer steps of the "
                            f"{warmup_steps + measured_steps} asked: measured what ran")
    elif run.clock.steps_done < needed:
        result.status = "error"
        result.error_type = "ProbeTooShort"
        result.error_message = (
            f"The function returned after {run.clock.steps_done} optimizer steps, but a probe needs "
            f"{warmup_steps + measured_steps}: loop over the data while run.probing, "
            f"and iterate run.batches()."
        )


def _record_failure(result: ProbeResult, exc: BaseException) -> None:
    """What the user's code raised, as the result's status: an OOM or an error, with its traceback."""
    result.status = "oom" if is_oom(exc) else "error"
    if result.status == "error" and breaks_the_device(exc):
        result.restart_worker = True
        result.notes.append(f"{type(exc).__name__} leaves the CUDA context unusable; the worker was replaced")
    result.error_type = type(exc).__name__
    result.error_message = str(exc).strip()[:2000]
    result.traceback = user_traceback(exc)


def _check_finite(result: ProbeResult, run: Run) -> None:
    if not run.losses_finite():
        result.status = "diverged"
        result.error_type = "NonFiniteLoss"
        result.error_message = (
            f"The loss became NaN or inf under {result.config.label()}: this config is unusable "
            f"(fp16 overflow or too large a step)."
        )


def _fill_timing(result: ProbeResult, run: Run) -> None:
    times, samples, tokens = run.clock.measured()
    result.measured_steps = run.clock.steps_measured
    if not times:
        return
    total = run.clock.measured_time_s
    result.samples_per_s = samples / total if total > 0 else None
    result.tokens_per_s = tokens / total if tokens and total > 0 else None
    result.step_time_median_s = statistics.median(times)
    result.warmup_s = run.clock.warmup_time_s
    result.data_wait_s, result.data_wait_share = run.clock.data_wait_s, run.clock.data_wait_share
    if result.config.compile and result.warmup_s is not None:
        result.compile_s = max(0.0, result.warmup_s - result.warmup_steps * result.step_time_median_s)
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        result.step_time_iqr_s = q[2] - q[0]
    else:
        result.step_time_iqr_s = max(times) - min(times)


def _fill_work(result: ProbeResult, run: Run, backend: DeviceBackend) -> None:
    """FLOPs per sample, FLOP/s and MFU, and joules per sample, where they can be known."""
    if run.flops is not None and run.flops.failure:
        result.notes.append(run.flops.failure)
    if run.flops is not None and run.flops.per_sample is not None:
        result.set_flops(run.flops.per_sample, backend.peak_flops_per_s(result.config.precision),
                         run.flops.per_token)
    energy, samples = run.clock.measured_energy_j, run.clock.measured_samples
    if energy is not None and energy >= 0 and samples:
        result.joules_per_sample = energy / samples
