"""A config's memory before any probe spends it: the user's function run for two steps on fake
tensors in a process of its own (autofit._estimate_process), the peak split into parameters,
gradients, optimizer state, activations and temporaries. Tensor bytes only: the device adds its
baseline (on CPU the process's own memory, reported with the estimate; on CUDA the context and
workspaces) and its allocator's rounding and caching, which a calibration from measured probes
must add before an estimate is compared with a limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from autofit.config import Config

PARTS = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak tensor bytes of one config, by part (not measured)."""

    config: Config
    breakdown: dict[str, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown.values())


@dataclass
class Estimates:
    """What one estimator process found: an estimate per config that had one, why the others did not."""

    estimates: dict[Config, MemoryEstimate] = field(default_factory=dict)
    unavailable: dict[Config, str] = field(default_factory=dict)
    baseline_bytes: int | None = None
    """The estimator process's own memory before any step (Python, torch, the user's module)."""
    error: str | None = None
    """Why the estimator gave nothing at all (it crashed, or timed out)."""
    knobs: dict | None = None
    """What the function used (run.checkpoint's blocks, autocast), from its first estimate."""
    options: dict | None = None
    """The decorator's search options (global batch, batch range, precisions)."""


def estimate_memory(script: str, configs: list[Config], *, function: str | None = None, device: str = "cpu",
                    index: int = 0, timeout: float = 300.0) -> Estimates:
    """Estimates of `configs` for the @autofit function in `script`; never raises for what the
    user's code or the fake tensors do: a config without an estimate says why."""
    out = Estimates()
    with tempfile.TemporaryDirectory(prefix="autofit-estimate-") as tmp:
        request = os.path.join(tmp, "request.json")
        with open(request, "w") as handle:
            json.dump({"script": os.path.abspath(script), "function": function, "device": device, "index": index,
                       "configs": [c.to_dict() for c in configs]}, handle)
        try:
            done = subprocess.run([sys.executable, "-m", "autofit._estimate_process", request],
                                  capture_output=True, text=True, timeout=timeout)
            failure = None if done.returncode == 0 else (
                f"the estimator exited with status {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        except subprocess.TimeoutExpired:
            failure = f"the estimator did not finish within {timeout:.0f}s"
        try:
            with open(request + ".out") as handle:
                reply = json.load(handle)
        except (OSError, ValueError):
            reply = {"estimates": []}
    out.baseline_bytes = reply.get("baseline_bytes")
    out.options = reply.get("options")
    out.knobs = next((found["knobs"] for found in reply["estimates"] if found["ok"]), None)
    for config, found in zip(configs, reply["estimates"]):
        if found["ok"]:
            out.estimates[config] = MemoryEstimate(config, {part: int(found["breakdown"].get(part, 0)) for part in PARTS})
        else:
            out.unavailable[config] = found["error"]
    missing = configs[len(reply["estimates"]):]
    for config in missing:
        out.unavailable[config] = failure or "the estimator stopped before this config"
    out.error = failure if missing or not out.estimates else None  # all answered: a slow exit is no failure
    return out
