"""A decorated function called normally: what it trains with (the exported best config, or defaults),
and what it says when it is done (`report_run`)."""

from __future__ import annotations

import inspect
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from autofit.config import TOKENS, Config
from autofit.devices import apply_allocator_settings, default_device
from autofit.export import BestConfig, default_best_path, device_tag, read_best
from autofit.options import SearchOptions
from autofit.redaction import redacted_args
from autofit.units import input_bound_text

if TYPE_CHECKING:
    from autofit.runtime import Run, TokenEnvelope

#: Where a normal run writes its summary as JSON, when set.
RUN_REPORT_ENV = "AUTOFIT_RUN_REPORT"


class Decorated(Protocol):
    """What a normal run needs of a decorated function (autofit.decorator.AutofitFunction): no import of
    the decorator module, which imports this one."""

    fn: Callable[..., Any]
    options: SearchOptions


def _default_device() -> tuple[str, str]:
    """Where a normal run trains when the call names no device, as torch names it, and why: where a search
    probes when none is named (autofit.devices.default_device), asked after torch is imported, so that a GPU
    NVML sees and this torch cannot use is no default (the why then says what to install)."""
    import torch  # noqa: F401 - the run trains with it; imported first, default_device asks it

    kind, index, why = default_device()
    return (kind if kind == "cpu" else f"{kind}:{index}"), why


def _device_tag(device: str) -> str:
    """The tag of the device this run trains on, as the search named its file."""
    kind = device.split(":")[0]
    if kind != "cuda":
        return device_tag(kind)
    import torch

    index = int(device.split(":")[1]) if ":" in device else 0
    return device_tag("cuda", torch.cuda.get_device_name(index))


def _script_of(fn: Decorated) -> str:
    """The script the function is in; a script that calls `autofit.start` is its own (`script_path`)."""
    return getattr(fn, "script_path", None) or inspect.getsourcefile(fn.fn) or ""


def _name_of(fn: Decorated) -> str | None:
    """The function's name in studies and files: None for a script without one (they say `train`)."""
    return None if getattr(fn, "script_path", None) else fn.fn.__name__


def _candidate_paths(fn: Decorated, device: str) -> list[str]:
    """Where a search leaves its answer: this device's own file first, then an untagged one
    (`--out`, or a file written before device tags), in studies/, beside the script's studies/,
    then beside the script."""
    script, name = _script_of(fn), _name_of(fn)
    tag = _device_tag(device)
    directories = ("studies", os.path.join(os.path.dirname(script), "studies"), os.path.dirname(script))
    return [default_best_path(script, name, d, t) for d in directories for t in (tag, None)]


class RunPlan(NamedTuple):
    """What a normal call trains with, and where that came from."""

    config: Config
    device: str
    message: str
    path: str | None
    """The best-config file read, or None when running with defaults."""
    record_path: str
    """Where the run records a lowered config (beside the file it read, or where a search would write)."""
    searched_memory_limit: int | None
    """The memory limit the config was searched under ($AUTOFIT_MEMORY_LIMIT=json applies it)."""
    searched_world: int = 1
    """Ranks each probe ran on (the config's micro-batch and accumulation are per rank)."""
    token_envelope: TokenEnvelope | None = None
    """The micro-batches by tokens the search's probes ran (`measured.token_envelope`): the run splits
    one beyond them (TokenGuard)."""
    searched_threads: int | None = None
    """The intra-op threads a CPU search's probes ran on (`measured.threads`): `report_run` compares the run's."""


def resolve_run_config(fn: Decorated, path: str | os.PathLike | None, device: str | None,
                       say: bool = True) -> RunPlan:
    """The config, device and message for a normal run, said as its first line where `say` (the device and
    why, then the config and where it came from), before any warning about the file read. An explicit path or
    AUTOFIT_CONFIG must exist and be valid."""
    device, where = (device, "as the call names it") if device else _default_device()
    plan, best = _plan(fn, path, device)
    plan = plan._replace(message=f"on {device} ({where}), {plan.message}")
    if say and os.environ.get("RANK", "0") == "0":  # under torchrun, the main rank speaks for all
        print(f"autofit: {plan.message}", file=sys.stderr)
    if best is not None and say:  # a script started again after an OOM said these already
        _warn_if_stale(fn, best, device)
        _say_if_other_args(fn, best)
    return plan


def _plan(fn: Decorated, path: str | os.PathLike | None, device: str) -> tuple[RunPlan, BestConfig | None]:
    """`resolve_run_config`'s plan on `device`, and the best-config file it read (None: defaults)."""
    from autofit.runtime import TokenEnvelope, lowered_path

    explicit = path or os.environ.get("AUTOFIT_CONFIG")
    if explicit:
        best = read_best(str(explicit))  # ConfigFileError if missing or corrupt: never a silent default
    else:
        candidates = _candidate_paths(fn, device)
        found = next((p for p in candidates if os.path.exists(p)), None)
        if found is None:
            return _unsearched_plan(fn, device, f"no best config found for {_what(fn)} (looked for {candidates[0]})",
                                    lowered_path(candidates[0])), None
        best = read_best(found)
        other = _other_global_batch(fn, best)
        if other is not None:  # the file answers another question than the one this script asks
            return _unsearched_plan(fn, device, f"the best config in {found} keeps a global batch of {other}, not "
                                                f"the {fn.options.global_batch} {_what(fn)} declares (search again)",
                                    lowered_path(found)), None
    partial = " (partial search)" if best.partial else ""
    message = f"running {_what(fn)} with the best config from {best.path}{partial}: {best.config.label()}"
    measured = best.measured
    if measured.confirmed is False:
        why = measured.unconfirmed or "the search ended before a longer run could measure it; its figure is a short probe's"
        message += f" (unconfirmed: {why})"
    return RunPlan(best.config, device, message, best.path, lowered_path(best.path), best.memory.limit_bytes,
                   best.world_size, TokenEnvelope.from_dict(measured.token_envelope),
                   measured.threads if best.device_type == "cpu" else None), best


def _unsearched_plan(fn: Decorated, device: str, why_not: str, record_path: str) -> RunPlan:
    """What a normal call trains with when no best-config file answers it: what the script declared, under
    autofit's allocator settings where the user set none (`apply_allocator_settings`)."""
    apply_allocator_settings(None, device.split(":")[0])
    config, why = fn.options.unsearched_config()
    if device.split(":")[0] == "cpu" and config.precision == "fp16":  # nanoGPT's dtype off a GPU
        config = replace(config, precision="fp32")
        why += " (fp16 is emulated on the CPU: fp32)"
    return RunPlan(config, device, message=f"{why_not}; running with defaults: {config.label()}{why}. Run `autofit "
                                           f"search` to find a faster one.", path=None, record_path=record_path,
                   searched_memory_limit=None)


def _other_global_batch(fn: Decorated, best: BestConfig) -> int | None:
    """The global batch of a best-config file found beside the script, where the script declares another (a
    search resumed with other options, or the declaration changed since); None where they agree or either
    holds none (by tokens, or nothing declared). An explicit file (`autofit_config=`, $AUTOFIT_CONFIG) is the
    user's own choice and is not second-guessed."""
    declared = fn.options.global_batch
    written = best.global_batch
    return written if declared is not None and written is not None and written != declared else None


def _warn_if_stale(fn: Decorated, best: BestConfig, device: str) -> None:
    searched = best.device_type
    if searched and searched != device.split(":")[0]:
        _warn(f"autofit: the best config was searched on {searched} ({best.device_name}) but this "
              f"run uses {device}; search again on this device for a config that fits it.")
    elif searched == "cuda":
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        if name and name != best.device_name:
            _warn(f"autofit: the best config was searched on {best.device_name} but this GPU is "
                  f"{name}; search again for a config that fits it.")
    allocator = apply_allocator_settings(best.allocator, device.split(":")[0])
    if allocator:
        _warn(f"autofit: the allocator settings differ from the search's ({allocator}); the config's "
              f"memory and speed may differ. Run with the search's settings, or search again.")
    from autofit.probing import ScriptVersion

    script = _script_of(fn)
    entry = best.script
    changed = ScriptVersion.of(script).changes(entry.sha256, entry.code_sha256, entry.modules) if script else []
    if changed:
        _warn(f"autofit: the training script changed since the search ({', '.join(changed)}); its memory and speed "
              f"may differ. Run `autofit search` again to be sure the config still fits.")


#: Frames under this directory are autofit's own: a warning names the user's line that started the run.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _warn(message: str) -> None:
    """Warn from the user's line that started the run (the first frame outside autofit: a call of the
    decorated function, `make_run`, or a script's `autofit.start`), however deep inside autofit this is."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def _what(fn: Decorated) -> str:
    """What the run trains, in its messages: the function's name, or the script's file name."""
    return fn.fn.__name__ if _name_of(fn) else os.path.basename(_script_of(fn))


def _say_if_other_args(fn: Decorated, best: BestConfig) -> None:
    """One line where a script runs with other arguments than those its config was searched with (a
    decorated function's script: only where the search recorded some)."""
    searched = best.script.args
    args = getattr(fn, "script_args", None)  # a script's own; a decorated function's script: sys.argv's
    if args is None and searched:
        args = sys.argv[1:]
    if args is not None:
        args = redacted_args(args)  # the file holds them redacted: compared, and printed, as recorded
    if args is not None and args != list(searched):
        print(f"autofit: this run's arguments ({' '.join(args) or 'none'}) are not those searched "
              f"({' '.join(searched) or 'none'}); the config's memory and speed may differ.", file=sys.stderr)


def _say_if_other_threads(run: Run, searched: int | None) -> None:
    """One line where a CPU run trained on other intra-op threads than its search's probes: read at its end,
    so that a script's own `torch.set_num_threads` (at import, in the function, after `autofit.start`) counts,
    as it did in the probes."""
    import torch

    threads = torch.get_num_threads()
    if searched and run.device.type == "cpu" and threads != searched:
        print(f"autofit: the search's probes ran on {searched} intra-op threads and this run on {threads}; on "
              f"the CPU each thread keeps its own buffers, so the config's memory and speed may differ. Run on "
              f"{searched} (OMP_NUM_THREADS={searched}, or the script's own torch.set_num_threads), or search "
              f"again.", file=sys.stderr)


def split_text(guard: int, oom: int) -> str | None:
    """'micro-batches run in pieces: 3 beyond what the probes ran (token guard), 1 after an out-of-memory
    (OOM fallback)'; None when neither split any."""
    parts = [*([f"{guard} beyond what the probes ran (token guard)"] if guard else []),
             *([f"{oom} after an out-of-memory (OOM fallback)"] if oom else [])]
    return f"micro-batches run in pieces: {', '.join(parts)}" if parts else None


def report_run(run: Run, searched_threads: int | None = None) -> None:
    """Say on stderr what a normal run measured, with the verdict a probe gives on its data wait;
    write its summary as JSON to $AUTOFIT_RUN_REPORT if set (the main rank only, in a distributed run).
    `searched_threads`: the intra-op threads a CPU search's probes ran on, said where the run's differ."""
    if not run.is_main:
        return
    _say_if_other_threads(run, searched_threads)
    summary = run.control.summary()
    ranks = f" on each of {run.world_size} ranks" if run.world_size > 1 else ""
    trained = f"autofit: trained {summary['optimizer_steps']} optimizer steps with {run.config.label()}{ranks}"
    if summary["samples_per_s"]:
        waited = input_bound_text(summary["data_wait_share"])
        samples = f"{summary['samples_per_s']:,.1f} samples/s"
        tokens = f"{summary['tokens_per_s']:,.0f} real tokens/s" if summary.get("tokens_per_s") else None
        # by tokens the rate the search ranked by first, as the best-config file has it
        rate = (f"{tokens} ({samples})" if run.config.ranked_by == TOKENS and tokens
                else f"{samples} ({tokens})" if tokens else samples)
        print(f"{trained}: {rate} after {summary['warmup_steps']} "
              f"warm-up steps" + (f" ({waited})" if waited else ""), file=sys.stderr)
    elif summary["optimizer_steps"]:  # the run ended within its warm-up: nothing was timed
        print(f"{trained}: too few to time after {run.control.clock.warmup_steps} warm-up steps", file=sys.stderr)
    if run.token_loader is not None:
        print(f"autofit: token batches: {run.token_loader.stats().describe()}", file=sys.stderr)
    if split := split_text(summary["guard_split_batches"], summary["oom_split_batches"]):
        print(f"autofit: {split}", file=sys.stderr)
    if retries := summary.get("alloc_retries"):
        print(f"autofit: the allocator freed its cache and retried {int(retries)} allocations after warm-up: this run "
              f"is at the edge of the device's memory, and slower for it (a smaller micro-batch, or more "
              f"checkpointing, needs none)", file=sys.stderr)
    path = os.environ.get(RUN_REPORT_ENV)
    if path:
        with open(path, "w") as handle:
            json.dump(summary, handle, indent=2)
