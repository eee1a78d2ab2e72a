"""OOM resilience for the real run: a step that runs out of memory is redone with a smaller
micro-batch and more accumulation, so the global batch and the optimizer's view stay the same.

A probe meets only the shapes it was given; a real run later meets a longer sequence, a bigger
image or a fragmented allocator. Crashing there loses hours; silently changing the global batch
(what the batch-size finders do) changes the training. This module owns the one redo path
(`StepRedo`), whoever drives the step: `Run.batches`, a framework's trainer (autofit.integrations)
or the decorator starting the function again. It decides which smaller config keeps the global
batch, hands back the memory of the failed step, and tells and records the change.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from autofit.config import Config
from autofit.runtime._oom import is_oom
from autofit.units import format_size

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

#: Set to 0 to let a real run's OOM propagate as it would without autofit.
RECOVERY_ENV = "AUTOFIT_OOM_RECOVERY"


class OutOfMemoryAtBatchOne(RuntimeError):
    """A step ran out of memory at micro-batch 1, or again at a smaller one holding what the larger failed
    with: no smaller micro-batch can keep this run alive."""


#: A step redone after an OOM must start holding less than this share of what its failed attempt had taken on
#: top of what the run held between steps, or that attempt's memory did not come back (a smaller micro-batch
#: cannot help then).
_CAME_BACK = 0.9
#: A failed attempt that took less than this share of what it held on top of the run's between-steps memory
#: says nothing about memory coming back: it failed asking for more than was free, not after growing.
_GREW = 0.05
#: What a run holds between its steps grew with them when it holds this share more than at its first reading:
#: memory kept per shape (a library's cache), where a variable of the loop holds one step's graph at a time.
_GREW_BETWEEN = 0.25
#: How often (seconds) a real run reads what it holds between optimizer steps: on CUDA a reading asks NVML,
#: too slow for every step of a small model.
_BETWEEN_STEPS_EVERY = 5.0


def recovery_enabled(default: bool = True) -> bool:
    """The decorator's choice, unless $AUTOFIT_OOM_RECOVERY says otherwise (0/false/no/off)."""
    value = os.environ.get(RECOVERY_ENV)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def normal_run_recovers(recover_oom: bool, world_size: int) -> bool:
    """Whether a normal run survives an out-of-memory step: its own choice (`recover_oom`) unless
    $AUTOFIT_OOM_RECOVERY says otherwise, and never across ranks (a rank that lowered its micro-batch alone would
    leave the others waiting in a collective). A probe asks too: it saves its tensors as that run will."""
    return world_size == 1 and recovery_enabled(recover_oom)


def lowered(config: Config) -> Config | None:
    """The config with the largest micro-batch at most half of this one that divides it, and the
    accumulation raised to keep the global batch; None at micro-batch 1.

    Halving for even sizes (32 -> 16 x acc 2); an odd size goes to its largest proper divisor
    (24 -> 12, 9 -> 3, 7 -> 1), because a micro-batch that does not divide the loader's batch would
    give micro-batches of unequal size, and averaging their losses would weigh samples unequally.
    A config by tokens halves its `max_tokens` (None at 1).
    """
    if config.max_tokens is not None:  # by tokens: half the cap (the batches are cut by samples, see StepFeed)
        if config.max_tokens < 2:
            return None
        return config.with_size(config.max_tokens // 2, accumulation_steps=config.accumulation_steps * 2)
    size = config.batch_size
    smaller = next((d for d in range(size // 2, 0, -1) if size % d == 0), None)
    if smaller is None:
        return None
    return replace(config, batch_size=smaller, accumulation_steps=config.accumulation_steps * (size // smaller))


@dataclass(frozen=True)
class Lowering:
    """One change of config in a real run: where the OOM surfaced and what the run goes on with."""

    step: int
    """The optimizer step (1-based) that ran out of memory and was redone."""
    where: str
    """"forward" (inside run.autocast()), "backward" or "optimizer step"."""
    before: Config
    after: Config
    memory_bytes: int | None
    """What the process held when the OOM was caught (the limit's way of counting), if known."""
    at: float
    restart: bool = False
    """Before the first optimizer step: the function was started again rather than the step redone."""

    def message(self) -> str:
        action = "starting again" if self.restart else "redoing the step and going on"
        return (f"autofit: out of memory in the {self.where} of step {self.step} with {self.before.label()}; "
                f"{action} with {self.after.label()} (global batch {self.after.global_batch} unchanged). "
                f"Search again to find the fastest config that fits.")

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "where": self.where, "before": self.before.to_dict(),
                "after": self.after.to_dict(), "memory_bytes": self.memory_bytes,
                "restart": self.restart, "at": time.strftime(_AT, time.gmtime(self.at))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lowering:
        """The record `to_dict` wrote (an `autofit.start` script hands its lowerings to its next execution)."""
        import calendar

        return cls(data["step"], data["where"], Config.from_dict(data["before"]), Config.from_dict(data["after"]),
                   data["memory_bytes"], calendar.timegm(time.strptime(data["at"], _AT)), restart=data["restart"])


_AT = "%Y-%m-%dT%H:%M:%SZ"


def announce(lowering: Lowering) -> None:
    """Say on stderr what the run goes on with: a lowered config is slower, and the user should know why."""
    print(lowering.message(), file=sys.stderr, flush=True)


class StepRedo:
    """The one way a real run survives a step that ran out of memory.

    Whoever drives the step uses it in the same three moments:

    1. inside the `except` block, `lower()`: is this an OOM the run recovers from, and with which
       smaller config (OutOfMemoryAtBatchOne at micro-batch 1); `take()` then goes on with it
       (announced on stderr, kept for the lowerings file);
    2. after the `except` block, `free()`: the traceback holds the failed step's frames, and with
       them its activations, until the block is left; only then can their memory go back;
    3. the step again, at the lowered micro-batch.

    `until_it_fits` does all three for a caller that can call its step again (a framework's step
    hook, the decorator starting the function again); `Run.batches` feeds the step again itself.
    One StepRedo may serve several Runs one after another (the decorator's attempts): it keeps the
    lowerings of all of them.
    """

    def __init__(self, *, enabled: bool = True, release_memory: Callable[[], None] | None = None,
                 used_memory: Callable[[], int] | None = None) -> None:
        self.enabled = enabled
        """False in a probe (an OOM is its answer) and where recovery is turned off."""
        self.lowerings: list[Lowering] = []
        self.split_batches = 0
        """Micro-batches cut into pieces of a lowered micro-batch (a run's loop, a framework's step)."""
        self._release_memory = release_memory or (lambda: None)
        self._used_memory = used_memory
        self._after_free: int | None = None
        self._between_steps: int | None = None
        self._between_steps_at = 0.0
        self._first_between: tuple[int, int] | None = None  # (step, bytes): the first reading between steps
        self._steps = 0

    def step_taken(self) -> None:
        """An optimizer step ended: what the run holds now is what its next step starts from (read at most every
        few seconds), the baseline a failed step's growth is measured from."""
        now = time.monotonic()
        self._steps += 1
        if self.enabled and self._used_memory and (self._between_steps is None
                                                   or now - self._between_steps_at >= _BETWEEN_STEPS_EVERY):
            self._between_steps, self._between_steps_at = self._memory_now(), now
            if self._first_between is None and self._between_steps is not None:
                self._first_between = (self._steps, self._between_steps)

    def lower(self, config: Config, exc: BaseException, where: str, step: int, *,
              restart: bool = False) -> Lowering | None:
        """The lowering `exc` calls for, not yet taken; None when it is not an OOM this run recovers
        from (let it propagate). `restart`: before the first optimizer step, where the function is
        started again rather than the step redone. At micro-batch 1, OutOfMemoryAtBatchOne."""
        if not self.enabled or not is_oom(exc):
            return None
        held = self._memory_now()
        self._stop_if_nothing_came_back(config, where, step, held, exc)
        smaller = lowered(config)
        if smaller is None:
            raise OutOfMemoryAtBatchOne(
                f"Out of memory in the {where} of step {step} even at micro-batch 1 "
                f"({config.label()}): the model, its optimizer state and one sample's activations do not "
                f"fit. Turn on checkpointing, use bf16, or train on a device with more memory.") from exc
        return Lowering(step, where, config, smaller, held, time.time(), restart=restart)

    def _stop_if_nothing_came_back(self, config: Config, where: str, step: int, held: int | None,
                                   exc: BaseException) -> None:
        """A step that runs out of memory again at a smaller size after the memory its failed attempt took did not
        come back (the redo started holding about what the failed attempt held when it failed, measured from what
        the run holds between steps): halving on to micro-batch 1 (as a whole-epoch run by tokens once did, eleven
        times in 15 s) cannot help. Say what holds it, and stop. An attempt that failed without growing (it asked
        for more than was free) proves nothing, and the halving goes on."""
        last = self.lowerings[-1] if self.lowerings else None
        if last is None or last.step != step or last.after != config or not last.memory_bytes:
            return
        kept, base = self._after_free, self._between_steps
        if kept is None or base is None:
            return
        grew = last.memory_bytes - base
        if grew <= _GREW * last.memory_bytes or kept - base < _CAME_BACK * grew:
            return

        raise OutOfMemoryAtBatchOne(
            f"Out of memory again in the {where} of step {step} at {config.label()}: after {last.before.label()} "
            f"failed holding {format_size(last.memory_bytes)}, the redo started still holding {format_size(kept)} "
            f"(the run holds {format_size(base)} between steps): "
            f"the failed step's memory did not come back, so a smaller micro-batch cannot help. "
            f"{self._what_holds(base)}") from exc

    def _what_holds(self, base: int) -> str:
        """What holds memory a smaller micro-batch cannot free: memory held between steps that grew with the steps
        (what libraries keep per shape, where lengths vary), else a variable of the loop."""
        first = self._first_between
        if first is not None and base - first[1] > _GREW_BETWEEN * first[1]:
            return (f"What the run holds between steps grew with its steps, from {format_size(first[1])} at step "
                    f"{first[0]} to {format_size(base)}: not your loop's tensors (those go at each step), but what "
                    f"libraries keep for each new shape of its batches (where lengths vary, almost every batch is "
                    f"one): on the CPU oneDNN's primitives and PyTorch's mkldnn cache (bound them with "
                    f"ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY before the run starts, as a search "
                    f"batching by tokens does), and the heap around them; on a GPU cuDNN's and cuBLAS's plans and the "
                    f"allocator's cached blocks. Fewer shapes keep less: pad each batch to a multiple "
                    f"(run.pad_multiple, which a search tries).")
        return ("Something still holds that step's tensors: usually a variable of your loop (its logits or outputs "
                "keep their graph until they are assigned again). Delete them at the end of each iteration "
                "(`del logits`), or keep only `loss.item()`.")

    def take(self, lowering: Lowering) -> Config:
        """Go on with `lowering`: say so, keep it for the lowerings file; its config is returned."""
        self.lowerings.append(lowering)
        announce(lowering)
        return lowering.after

    def free(self) -> None:
        """Hand the memory of a failed step back to the device (call once its exception is gone)."""
        gc.collect()  # the failed step's frames may sit in reference cycles
        self._release_memory()
        self._after_free = self._memory_now()  # what the redo starts with

    def until_it_fits(self, attempt: Callable[[], T],
                      after_oom: Callable[[Exception], Callable[[], T] | None]) -> T:
        """`attempt()`, again after each OOM until it fits. `after_oom(exc)` runs inside the `except`
        block: it lowers (`lower`, `take`) and returns the next attempt, or None to let `exc`
        propagate; the failed attempt's memory is freed once the block is left, before the next."""
        while True:
            try:
                return attempt()
            except Exception as exc:
                following = after_oom(exc)
                if following is None:
                    raise
            attempt = following
            self.free()

    def until_it_starts(self, start: Callable[[Config | None], T],
                        failed: Callable[[], Lowering | None]) -> T:
        """`start(None)`; after an OOM before the first optimizer step, `start(config)` with the lowered
        config, until it fits (the decorator starting the function again in a new Run). `failed()`
        runs inside the `except` block: the restart lowering the failed attempt asks for, or None to
        let the exception propagate; it lets the failed attempt go, so that its memory is freed with
        the traceback's."""

        def after_oom(exc: Exception) -> Callable[[], T] | None:
            lowering = failed()
            if lowering is None:
                return None
            config = self.take(lowering)
            return lambda: start(config)

        return self.until_it_fits(lambda: start(None), after_oom)

    def _memory_now(self) -> int | None:
        try:
            return self._used_memory() if self._used_memory else None
        except Exception:  # noqa: BLE001 - a figure for the record, never a reason to fail
            return None


class LoopRedo:
    """A Run's side of the redo, for the loop it drives itself (`run.batches`, `run.backward`) and for
    a framework's step (`run.control.lower_after_oom`): when an exception there is an OOM the run recovers
    from, the config it goes on with. `redoing` tells `run.batches` to feed the step again."""

    def __init__(self, redo: StepRedo, *, probing: bool) -> None:
        self.redo = redo
        self.recovering = redo.enabled and not probing
        """A real run that survives an out-of-memory step (never a probe: an OOM is its answer)."""
        self.redoing = False
        self.restart_lowering: Lowering | None = None
        """Set when an OOM came before the first optimizer step: start the function again with its
        config (not yet taken: only the normal call knows whether it starts again)."""

    def caught(self, config: Config, exc: BaseException, where: str, *, steps_done: int,
               can_feed_again: bool) -> Config | None:
        """The lowered config the run's own loop redoes the step with, or None to let `exc` propagate:
        not an OOM, none recovered, no data the run can feed again, or no optimizer step taken yet (then
        `restart_lowering` is set for the normal call)."""
        lowering = self._lowering(config, exc, where, steps_done, restart=steps_done == 0)
        if lowering is None:
            return None
        if lowering.restart:  # nothing trained yet: the normal call starts the function again
            self.restart_lowering = lowering
            return None
        if not can_feed_again:
            return None
        self.redoing = True
        return self.redo.take(lowering)

    def step_taken(self) -> None:
        """An optimizer step of a real run that recovers ended (see `StepRedo.step_taken`); nothing in a probe."""
        if self.recovering:
            self.redo.step_taken()

    def escaped(self, config: Config, exc: BaseException, *, steps_done: int) -> None:
        """An exception left a loop the function drives itself (its own optimizer.step()): nothing can
        redo its step, so an OOM starts the function again (`restart_lowering`), whatever step it was."""
        if self.restart_lowering is None:
            self.restart_lowering = self._lowering(config, exc, "loop", steps_done, restart=True)

    def in_place(self, config: Config, exc: BaseException, where: str, *, steps_done: int) -> Config | None:
        """The lowered config a framework's step goes on with (its caller redoes the work), or None."""
        lowering = self._lowering(config, exc, where, steps_done, restart=False)
        return self.redo.take(lowering) if lowering is not None else None

    def _lowering(self, config: Config, exc: BaseException, where: str, steps_done: int, *,
                  restart: bool) -> Lowering | None:
        if not self.recovering:
            return None
        return self.redo.lower(config, exc, where, steps_done + 1, restart=restart)


def drop_graph(loss: torch.Tensor) -> None:
    """Free what a failed step's graph still holds through `loss`, whoever keeps a reference to it."""
    try:
        loss.detach_()
    except RuntimeError:  # a view cannot be detached in place: its graph goes with it
        pass


def lowered_path(config_path: str) -> str:
    """Where a run records the config it lowered to: beside the exported file it started from
    (studies/gpt.train.cpu.best.json -> studies/gpt.train.cpu.lowered.json)."""
    base = config_path[: -len(".best.json")] if config_path.endswith(".best.json") else os.path.splitext(config_path)[0]
    return base + ".lowered.json"


@dataclass(frozen=True, kw_only=True)
class LoweredRun:
    """What a real run lowered to (the "autofit.lowered/1" file beside its best-config file), both ways: the
    config it started with, each lowering in order, and the script it ran."""

    started_with: Config
    lowerings: tuple[Lowering, ...]
    script: str | None = None

    @property
    def ended_with(self) -> Config:
        return self.lowerings[-1].after if self.lowerings else self.started_with

    def to_dict(self) -> dict[str, Any]:
        return {"schema": _LOWERED_SCHEMA, "script": self.script, "started_with": self.started_with.to_dict(),
                "ended_with": self.ended_with.to_dict(), "lowerings": [item.to_dict() for item in self.lowerings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoweredRun:
        return cls(started_with=Config.from_dict(data["started_with"]), script=data.get("script"),
                   lowerings=tuple(Lowering.from_dict(item) for item in data.get("lowerings") or ()))


_LOWERED_SCHEMA = "autofit.lowered/1"


def record_lowerings(path: str, started_with: Config, lowerings: list[Lowering], script: str | None) -> None:
    """Write what the run lowered to, so the next search (and the user) can read it."""
    document = LoweredRun(started_with=started_with, lowerings=tuple(lowerings), script=script).to_dict()
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)


def read_lowerings(path: str) -> LoweredRun | None:
    """What a real run recorded beside a best-config file, or None (no file, or not one of these)."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("schema") != _LOWERED_SCHEMA:
        return None
    try:
        return LoweredRun.from_dict(document)
    except (KeyError, TypeError, ValueError):  # a hand-edited record: nothing to say about it
        return None
