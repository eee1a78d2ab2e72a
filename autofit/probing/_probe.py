"""One probe: run the user's function under one config for a few steps, measure, clean up."""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from autofit.config import PROBE_ACCUMULATION, Config
from autofit.devices import DeviceBackend, available_memory_bytes
from autofit.probing._bootstrap import user_traceback
from autofit.probing._record import ProbeResult
from autofit.probing._script import ScriptEntry
from autofit.probing._wire import MIN_MEASURE_S
from autofit.runtime import (
    CompileTimer,
    NoStepClosed,
    ProbeFinished,
    Ranks,
    Run,
    RunSettings,
    SPREAD_EXTENSION,
    breaks_the_device,
    is_oom,
    normal_run_recovers,
    price_steps,
)
from autofit.units import format_size

_MAX_EXTENSION = 50
#: The error of a probe whose function allocated nothing on its device (`_check_on_device`).
NOTHING_ON_DEVICE = "NothingOnDevice"
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
    progress: Callable[[int, int], None] | None = None,
    open_step_s: float | None = None,
) -> ProbeResult:
    """Run `fn` for warm-up optimizer steps, then steps holding at least `measured_steps` micro-batches
    (`Config.probe_steps`), under `config` on `backend`.

    The measured part goes on past them (up to 50x) until `min_measure_s` is measured,
    so that fast steps are timed over a span a clock can resolve. A config that accumulates more than
    PROBE_ACCUMULATION micro-batches runs that many a step, and its own step is priced from them
    (autofit.runtime._accumulation). `progress` is told (micro-batches, steps) as they finish. `open_step_s`: how
    long a finite loop is followed to a step past the micro-batches a probe allows without one (None: not at all).
    Never raises for anything the user's code does: every outcome is a status in the result.
    """
    measured_steps = config.probe_steps(measured_steps)
    backend.release()
    baseline, tensors = backend.used_bytes(), backend.tensor_bytes()
    backend.reset_peak()
    started = time.perf_counter()
    run = Run(RunSettings(
        config, backend.torch_device(), probing=True, warmup_steps=warmup_steps,
        measured_steps=measured_steps, synchronize=backend.synchronize, min_measure_s=min_measure_s,
        max_measured_steps=measured_steps * _MAX_EXTENSION, ranks=ranks, count_flops=True, progress=progress,
        energy=backend.energy_joules, alloc_retries=backend.alloc_retries, timing=backend.timing,
        host_memory=available_memory_bytes, global_tokens=getattr(getattr(fn, "options", None), "global_tokens", None),
        probe_accumulation=PROBE_ACCUMULATION, open_step_s=open_step_s, holds_saved=_normal_run_recovers(fn, ranks)))
    result = ProbeResult(status="ok", config=config, warmup_steps=warmup_steps, memory_limit=backend.memory_limit)
    clock = run.control.clock
    compiling = CompileTimer(before=lambda: clock.first_micro_at is None)
    try:
        with compiling, run.control.active():
            fn(run)
        run.finish()
        _check_length(result, run, measured_steps, isinstance(fn, ScriptEntry))
    except ProbeFinished:
        pass
    except NoStepClosed as exc:
        _record_no_step(result, exc)
    except BaseException as exc:  # noqa: BLE001 - every failure of user code becomes a status
        if isinstance(exc, KeyboardInterrupt):
            raise
        _record_failure(result, exc)
        traceback.clear_frames(exc.__traceback__)  # frames hold the user's tensors
        del exc
    _fill_result(result, run, backend, started, compiling)
    result.baseline_bytes = baseline
    result.allocator.update({} if tensors is None else {"tensors_at_start_bytes": tensors})
    if result.restart_worker:
        return result  # the device answers nothing more in this process: no clean-up
    del run  # the user's model and tensors go before the memory left behind is read
    read_memory_after(result, backend)
    return result


def _normal_run_recovers(fn: Callable[[Run], Any], ranks: Ranks | None) -> bool:
    """Whether `fn`'s normal run recovers from OOMs, and so saves its forwards' tensors through hooks the probe
    must run too: the decorator's rule (`recover_oom`, $AUTOFIT_OOM_RECOVERY, one process); never for a script
    that calls autofit.start (its loop is its own: an OOM runs it again)."""
    if isinstance(fn, ScriptEntry):
        return False
    return normal_run_recovers(getattr(getattr(fn, "options", None), "recover_oom", True), ranks.world_size if ranks else 1)


def read_memory_after(result: ProbeResult, backend: DeviceBackend) -> None:
    """What the probe's process holds once all it can give back went (`DeviceBackend.release`): its
    memory, and of it the tensors still alive where the device tells them apart."""
    backend.release()
    result.memory_after_bytes = backend.used_bytes()
    tensors = backend.tensor_bytes()
    if tensors is not None:
        result.allocator["tensors_after_bytes"] = tensors


def _fill_result(result: ProbeResult, run: Run, backend: DeviceBackend, started: float,
                 compiling: CompileTimer) -> None:
    """What the run measured, into its result: its times, start and compilation, knobs, peak, work."""
    control = run.control
    result.wall_s = time.perf_counter() - started
    if control.clock.first_micro_at is not None:
        result.start_s = control.clock.first_micro_at - started
    if compiling.timed and compiling.compiles:
        result.compile_s, result.compile_cache_hits = compiling.total_s, compiling.cache_hits
    result.knobs = control.knobs.to_dict()
    result.warmup_steps = control.clock.warmup_steps
    result.notes.extend(control.notes)
    if result.restart_worker:
        return  # the device answers nothing more in this process: no peak
    if result.status == "ok":
        backend.synchronize()
        result.wall_s = time.perf_counter() - started
    result.peak_bytes = backend.peak_bytes()
    result.allocator = backend.allocator_stats()
    result.threads = torch.get_num_threads()  # the user's own, or what the script set at import
    _check_on_device(result, backend)
    if result.status == "ok":
        _fill_timing(result, run)
        _fill_work(result, run, backend)
        _fill_retries(result, run)
        _check_finite(result, run)


def _check_on_device(result: ProbeResult, backend: DeviceBackend) -> None:
    """A probe that allocated nothing on its device measured another device's work (a script that ignores
    run.device, as nanoGPT's `--device=cpu` on a GPU machine): its peak is the process's baseline whatever
    the config, so it is not a fit, and a search must not climb on it."""
    if result.status != "ok" or backend.allocations() != 0:
        return
    result.status = "error"
    result.error_type = NOTHING_ON_DEVICE
    result.error_message = (
        f"The function must train on run.device, but it allocated nothing on {backend.torch_device()} in its probe "
        f"(its peak, {format_size(result.peak_bytes or 0)}, is what the process held before it): does it train on "
        f"run.device? Move its model and batches there (`.to(run.device)`), or drop its own device setting "
        f"(a script's --device=cpu)."
    )


def _check_length(result: ProbeResult, run: Run, measured_steps: int, script: bool = False) -> None:
    """A function that returned before its probe's steps: too short to measure, or (a long run whose
    own loop ended first) measured as far as it ran."""
    control = run.control
    warmup_steps = control.clock.warmup_steps  # longer where a loader's prefetch queue had to drain
    needed = warmup_steps + min(measured_steps, ENOUGH_MEASURED_STEPS)
    if needed <= control.clock.steps_done < warmup_steps + measured_steps:
        # A long run (the confirmation) of a function whose own loop ended first (its data, its
        # max_train_steps): what ran is measured; the function's length is a fact, not a fault.
        result.notes.append(f"the function returned after {control.clock.steps_done} optimizer steps of the "
                            f"{warmup_steps + measured_steps} asked: measured what ran")
    elif control.clock.steps_done < needed:
        result.status = "error"
        result.error_type = "ProbeTooShort"
        what = "script ended" if script else "function returned"
        result.error_message = (f"The {what} after {control.clock.steps_done} optimizer steps, but a probe needs "
                                f"{warmup_steps + measured_steps}: {_too_short_hint(control, script)}.")


def _too_short_hint(control: Any, script: bool) -> str:
    """What to change in a loop that ended before its probe's steps, by the loop it is: its own (followed
    through its optimizer's steps, a script's as a rule), one over run.batches(), or none seen."""
    own = ("its own loop ended first: let it run on while run.probing (more epochs, or `max_iters = 10**9 if "
           "run.probing else max_iters`); autofit counts its optimizer.step() and ends the probe after its steps")
    if control.knobs.followed:
        return own
    if control.knobs.batches:
        return ("its loop over run.batches() ran out first: loop over the data while run.probing (more epochs); "
                "autofit ends the probe after its steps")
    if script and control.clock.steps_done:
        return own
    return ("no training loop was seen: iterate run.batches(), or step an optimizer in a loop of its own "
            "(autofit counts optimizer.step())")


def _record_failure(result: ProbeResult, exc: BaseException) -> None:
    """What the user's code raised, as the result's status: an OOM or an error, with its traceback."""
    result.status = "oom" if is_oom(exc) else "error"
    if result.status == "error" and breaks_the_device(exc):
        result.restart_worker = True
        result.notes.append(f"{type(exc).__name__} leaves the CUDA context unusable; the worker was replaced")
    result.error_type = type(exc).__name__
    result.error_message = str(exc).strip()[:2000]
    result.traceback = user_traceback(exc)


def _record_no_step(result: ProbeResult, exc: NoStepClosed) -> None:
    """A loop whose micro-batches kept coming while no optimizer step closed: diverged where its loss or its
    gradients were NaN or inf (it skipped the step for them, or its GradScaler skipped every step), an error
    otherwise; never a wait for the budget."""
    label = result.config.label()
    if exc.finite is False:
        result.status, result.error_type = "diverged", "NonFiniteLoss"
        skipped = (f"its GradScaler skipped {exc.skipped} steps in a row" if exc.skipped else
                   f"no optimizer step closed in {exc.micro_batches} micro-batches (the loop skips its step for a "
                   f"non-finite loss, or its GradScaler skips every step)")
        result.error_message = (
            f"The loss (or its gradients) was NaN or inf under {label}, and {skipped}: this config is unusable "
            f"(fp16 overflow or too large a step).")
        return
    result.status, result.error_type = "error", "NoOptimizerStep"
    finite = " (its loss and gradients were finite)" if exc.finite else ""
    waited = ""
    if exc.waited_s is not None:
        waited = (f", {exc.waited_s:.0f} s of them followed on, what the probe's limits allow a step (a loop that "
                  f"accumulates more micro-batches than that itself needs a longer --probe-timeout)")
    result.error_message = (
        f"A probe needs optimizer steps, but no optimizer step closed in {exc.micro_batches} micro-batches under "
        f"{label}{finite}{waited}: call optimizer.step() every run.accumulation_steps "
        f"micro-batches (a probe ends after its measured steps), or run.backward(loss, optimizer).")


def _check_finite(result: ProbeResult, run: Run) -> None:
    control = run.control
    if control.skipped_steps:
        result.notes.append(f"{control.skipped_steps} optimizer steps skipped by the loop's GradScaler (inf/NaN "
                            f"gradients, fp16): counted with the step after them")
    if not control.losses_finite():
        result.status = "diverged"
        result.error_type = "NonFiniteLoss"
        result.error_message = (
            f"The loss (or, for a loop autofit follows, its parameters) became NaN or inf under "
            f"{result.config.label()}: this config is unusable (fp16 overflow or too large a step)."
        )


def _fill_timing(result: ProbeResult, run: Run) -> None:
    """The measured steps' figures, for a step of the config's own accumulation: a probe that ran fewer
    micro-batches a step prices its steps (autofit.runtime._accumulation)."""
    control = run.control
    times, samples, tokens = control.clock.measured()
    result.measured_steps = control.clock.steps_measured
    if not times:
        return
    total = control.clock.measured_time_s
    ran, priced = run.config.accumulation_steps, control.priced_config.accumulation_steps
    if control.knobs.followed and not control.knobs.backward:
        priced = ran  # a loop that keeps its own accumulation ran its own steps: nothing to price
    pricing = price_steps(ran, priced, control.clock.inner)
    if priced > ran:
        result.probe_accumulation = ran
        result.inner_micro_s = control.clock.inner.inner_micro_s if control.clock.inner is not None else None
        if pricing.note:
            result.notes.append(pricing.note)
    probe_step = total / max(1, result.measured_steps)
    speed = pricing.scale * probe_step / pricing.step_s(probe_step)  # a priced step's rate over a probe step's
    result.samples_per_s = samples / total * speed if total > 0 else None
    result.tokens_per_s = tokens / total * speed if tokens and total > 0 else None
    median = statistics.median(times)
    result.probe_step_s = median
    result.step_time_median_s = pricing.step_s(median)
    result.warmup_s = control.clock.warmup_time_s
    result.data_wait_s, result.data_wait_share = control.clock.data_wait_s, control.clock.data_wait_share
    if result.compile_s is None and result.config.compile and result.warmup_s is not None:
        # compilation could not be watched: the warm-up beyond its steps at the measured pace
        result.compile_s = max(0.0, result.warmup_s - result.warmup_steps * median)
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = max(times) - min(times)
    result.step_time_iqr_s = iqr * result.step_time_median_s / median if median > 0 else iqr
    if control.clock.uncertain is not None:
        result.notes.append(f"its step times spread widely (IQR {iqr / median:.0%} of the median step): after "
                            f"{result.measured_steps} steps, {SPREAD_EXTENSION:.0f}x as long as a probe measures, "
                            f"the mean step is still uncertain by ±{control.clock.uncertain:.0%}, and so is its "
                            f"figure (a busy machine, or steps that differ: give the probe a quieter machine)")


def _fill_retries(result: ProbeResult, run: Run) -> None:
    """The allocator's retries in the measured steps, said in one line where there were any."""
    clock = run.control.clock
    retries = (clock.counted if clock.complete else clock.counts_so_far()).get("alloc_retries")
    result.alloc_retries = None if retries is None else int(retries)
    if result.alloc_retries:
        result.notes.append(f"the allocator freed its cache and retried {result.alloc_retries} allocations in the "
                            f"measured steps: this config only just fits, and its speed pays for it")


def _fill_work(result: ProbeResult, run: Run, backend: DeviceBackend) -> None:
    """FLOPs per sample, FLOP/s and MFU, and joules per sample, where they can be known."""
    control = run.control
    if control.flops is not None and control.flops.failure:
        result.notes.append(control.flops.failure)
    if control.flops is not None and control.flops.per_sample is not None:
        # the peak of the math that ran: a script that turned TF32 on itself ran its fp32 matmuls in TF32
        math = "tf32" if result.config.precision == "fp32" and control.knobs.forces_tf32 else result.config.precision
        result.set_flops(control.flops.per_sample, backend.peak_flops_per_s(math), control.flops.per_token)
    energy, samples = control.clock.measured_energy_j, control.clock.measured_samples
    if energy is not None and energy >= 0 and samples:
        result.joules_per_sample = energy / samples
