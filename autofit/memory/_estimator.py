"""A config's memory before any probe spends it: the user's function run for two steps on fake
tensors in a process of its own (autofit.memory._estimate_process), the peak split into parameters,
gradients, optimizer state, activations and temporaries. Tensor bytes only: the device adds its
baseline (on CPU the process's own memory, reported with the estimate; on CUDA the context and
workspaces) and its allocator's rounding and caching, which a calibration from measured probes
must add before an estimate is compared with a limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from autofit.config import Config
from autofit.knobs import Offers
from autofit.probing import LoadRequest, start_child

PARTS = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")
#: Prior for what a CUDA device holds before any tensor: the context, cuBLAS/cuDNN workspaces (an
#: H100 worker held 708 MiB at its start, benchmarks/gpu.md 2026-11-22; nanoGPT's small corpus script
#: peaked at 854 MiB there with 20 MiB of tensors, 2026-11-25).
CUDA_CONTEXT_BYTES = 768 * 2**20


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak tensor bytes of one config, by part (not measured)."""

    config: Config
    breakdown: dict[str, int]
    missing: tuple[str, ...] = ()
    """Parts not predicted (their bytes are 0 in `breakdown`): the fake tensors could not follow a
    step, so only what the optimizers hold is known (`why_missing` says what stopped them)."""
    notes: tuple[str, ...] = ()
    """What the estimate guessed (a data-dependent size taken at its upper bound, and the like)."""
    why_missing: str | None = None
    token_envelope: dict[str, int] | None = None
    """By tokens: the micro-batches the estimate ran, as a TokenEnvelope's fields (`longest_sample`,
    `padded_tokens`, `padded_squares`); one batch, the cap's worst. None for batches by samples."""
    traced: bool = False
    """Arithmetic over its program's two traces (autofit.memory._traced_space), not a run of its own."""

    @property
    def worst_batch(self) -> tuple[int, int] | None:
        """By tokens: the estimated micro-batch as (samples, padded length); None for batches by samples."""
        if not self.token_envelope:
            return None
        longest = self.token_envelope["longest_sample"]
        return self.token_envelope["padded_tokens"] // longest, longest

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown.values())

    @property
    def complete(self) -> bool:
        return not self.missing

    def summary(self) -> str | None:
        """One line on what was not predicted, or guessed; None for a complete estimate without guesses."""
        if self.missing:
            named = {"optimizer": "optimizer state"}
            known = [named.get(p, p) for p in ("parameters", "gradients", "optimizer") if p not in self.missing]
            missing = [named.get(p, p) for p in self.missing if p != "temporaries"]
            return (f"memory estimator: {_listed(missing)} not predicted ({self.why_missing}); "
                    f"{_listed(known)} predicted")
        if self.notes:
            return "memory estimator: " + "; ".join(self.notes)
        return None


def _listed(names: list[str]) -> str:
    return " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass
class Estimates:
    """What one estimator process found: an estimate per config that had one, why the others did not."""

    estimates: dict[Config, MemoryEstimate] = field(default_factory=dict)
    unavailable: dict[Config, str] = field(default_factory=dict)
    baseline_bytes: int | None = None
    """The estimator process's own memory before any step (Python, torch, the user's module), as a
    worker's: measured before the fake tensors' machinery loads."""
    context_bytes: int | None = None
    """What the first training steps of a process cost beyond their tensors, measured (on the CPU;
    see `runtime_context_bytes`)."""
    error: str | None = None
    """Why the estimator gave nothing at all (it crashed, or timed out)."""
    offers: Offers | None = None
    """What the function offers (run.checkpoint's blocks, autocast), from its first estimate."""
    options: dict | None = None
    """The decorator's search options (global batch, batch range, precisions)."""


class Estimator:
    """One estimator process for many requests: it loads torch and the user's script once (seconds),
    then answers each request in the time its configs take. It speaks the channel every persistent
    child of autofit speaks (autofit.probing's wire format; the user's prints go to a log, never into
    it), sends each estimate as soon as it is known, and exits when the channel closes. Never raises
    for what the user's code or the fake tensors do."""

    def __init__(self, script: str, function: str | None = None, *, device: str = "cpu", index: int = 0,
                 target: str = "cpu", beside_probes: bool = True) -> None:
        """`target`: the device type whose kernels' memory the estimates count ("cuda" on a machine
        without a GPU too: autofit.memory._target_kernels); the fake tensors are the CPU's either way.
        The process loads the script at idle priority, and stays there with `beside_probes`; without,
        it answers at normal priority (it runs only in the time the caller gives it)."""
        self._log = tempfile.TemporaryFile("w+", prefix="autofit-estimate-")  # noqa: SIM115 - closed in close()
        self._process: subprocess.Popen | None
        self._process, self._channel = start_child("autofit.memory._estimate_process", output=self._log)
        # Loading starts now, while the caller does other work (the search starts its workers).
        self._channel.send({"op": "load", "request": LoadRequest(os.path.abspath(script), function, device=device,
                                                                  index=index).to_wire(),
                            "target": target, "beside_probes": beside_probes})
        self._loaded: dict | None = None
        self.gone: str | None = None
        """Why the process can answer no more (it died, or was stopped at a time limit)."""
        self.timed_out = False

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Block until the process has loaded the script (False: it died or took too long)."""
        return self._wait_loaded(time.monotonic() + timeout, timeout)

    @property
    def options(self) -> dict:
        """What the function declared to @autofit (its load reply's; empty until loaded)."""
        return (self._loaded or {}).get("options") or {}

    def estimate(self, configs: list[Config], timeout: float = 300.0, *, traced: bool = False) -> Estimates:
        """Estimates of `configs`; what the process answered before it died or ran out of time
        is kept, and every other config says why it has none. `traced`: each config's program traced once
        (at two micro-batches, kept for later requests) and the config's peak arithmetic over the traces
        (autofit.memory._traced_space); without, each config is a run of its own."""
        deadline = time.monotonic() + timeout
        found: list[dict] = []
        failure = None
        if self._wait_loaded(deadline, timeout):
            try:
                self._channel.send({"op": "estimate", "configs": [c.to_dict() for c in configs], "traced": traced})
            except OSError:
                pass  # it died: the next receive says how
            while (reply := self._receive(deadline, timeout)) is not None:
                if not reply["ok"]:
                    failure = f"the estimator failed: {reply['message']}"
                    break
                if reply.get("done"):
                    break
                found.append(reply["estimate"])
        return _parse(configs, {**(self._loaded or {}), "estimates": found}, self.gone or failure)

    def _wait_loaded(self, deadline: float, timeout: float) -> bool:
        if self._loaded is None and self.gone is None:
            reply = self._receive(deadline, timeout)
            if reply is not None:
                self._loaded = {key: reply.get(key) for key in ("baseline_bytes", "context_bytes", "options",
                                                                 "function")}
        return self._loaded is not None

    def _receive(self, deadline: float, timeout: float) -> dict | None:
        """The process's next message; None, with `gone` saying why, when it died or ran past the
        deadline (`timeout` seconds from the request)."""
        if self.gone is not None:
            return None
        reply = self._channel.receive(max(0.0, deadline - time.monotonic()))
        if reply is not None:
            return reply
        if self._channel.timed_out:
            self.gone = f"the estimator did not finish within {timeout:.0f}s"
            self.timed_out = True
            self._process.kill()
            self._process.wait()
        else:
            try:
                status = self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                status = self._process.wait()
            self.gone = f"the estimator exited with status {status}: {self._last_log_line()}"
        return None

    def _last_log_line(self) -> str:
        self._log.flush()
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "no output"

    def pause(self) -> None:
        """Stop the process where it is (SIGSTOP): nothing of it runs while a probe is timed."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                os.kill(self._process.pid, number)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Stop the process now, from any thread: an `estimate` waiting for it returns what it had."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def close(self) -> None:
        """Stop the process (idempotent)."""
        if self._log.closed:
            return
        if self._process is not None:
            self.resume()  # a paused process could not see its channel end
            self._channel.close()  # the process ends at the end of its channel
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        self._log.close()

    def __enter__(self) -> Estimator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def estimate_memory(script: str, configs: list[Config], *, function: str | None = None, device: str = "cpu",
                    index: int = 0, timeout: float = 300.0, target: str = "cpu") -> Estimates:
    """Estimates of `configs` for the @autofit function in `script`, from a process of their own,
    counting `target`'s kernels."""
    with Estimator(script, function, device=device, index=index, target=target) as estimator:
        started = time.monotonic()
        estimator.wait_ready(timeout)
        return estimator.estimate(configs, max(1.0, timeout - (time.monotonic() - started)))


def _parse(configs: list[Config], reply: dict, failure: str | None) -> Estimates:
    out = Estimates()
    out.baseline_bytes = reply.get("baseline_bytes")
    out.context_bytes = reply.get("context_bytes")
    out.options = reply.get("options")
    answered = [found for found in reply["estimates"] if found["ok"]]  # a complete estimate's knobs first
    out.offers = Offers.from_dict(next((found["knobs"] for found in sorted(answered, key=lambda f: bool(f.get("missing")))),
                                       None))
    for config, found in zip(configs, reply["estimates"]):
        if found["ok"]:
            breakdown = {part: int(found["breakdown"].get(part, 0)) for part in PARTS}
            out.estimates[config] = MemoryEstimate(config, breakdown, tuple(found.get("missing", ())),
                                                   tuple(found.get("notes", ())), found.get("error"),
                                                   Offers.from_dict(found.get("knobs") or {}).token_envelope,
                                                   bool(found.get("traced")))
        else:
            out.unavailable[config] = found["error"]
    missing = configs[len(reply["estimates"]):]
    for config in missing:
        out.unavailable[config] = failure or "the estimator stopped before this config"
    out.error = (failure or "no answer") if missing else None
    return out
