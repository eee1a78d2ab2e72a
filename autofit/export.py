"""The best-config JSON: a stable, versioned file users read, commit and diff.

Schema "autofit.best-config", version 1 (docs/reference/best-config.md). This module owns it both ways: the
file is written from a `BestConfig` and read back as one, and no other module reads its keys
(tests/test_layout.py). Readers refuse other versions and corrupt files with a clear error: a silent default
could cost a whole training run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from autofit.config import RATES, SAMPLES, Config, Rate
from autofit.errors import ConfigFileError

SCHEMA = "autofit.best-config"
SCHEMA_VERSION = 1
_REQUIRED = ("schema", "schema_version", "config", "measured", "memory", "device", "versions", "script")


#: The study user attribute a search keeps its settings under (autofit.study's StudyMeta, which owns it); named
#: here, below the probing layer, whose other nodes read the memory budget from it.
STUDY_ATTR = "autofit"


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """The memory a search probes against: the device's limit, the share kept free, and what is left to a
    config (a probe over `usable_bytes` does not fit). The best-config file's "memory", and part of a
    study's settings, in this form: {"limit_bytes", "headroom", "usable_bytes"}."""

    limit_bytes: int | None
    headroom: float = 0.0
    usable_bytes: float | None = None
    """The limit less the headroom, unrounded as the search compared peaks with it (the file rounds it)."""

    @classmethod
    def of(cls, limit_bytes: int, headroom: float) -> MemoryBudget:
        return cls(limit_bytes=limit_bytes, headroom=headroom, usable_bytes=limit_bytes * (1 - headroom))

    def to_dict(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes, "headroom": self.headroom, "usable_bytes": self.usable_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MemoryBudget:
        """From a file's or a study's dict (an older study may lack the headroom; a probe study the limit)."""
        data = data or {}
        usable = data.get("usable_bytes")
        limit = data.get("limit_bytes")
        return cls(limit_bytes=None if limit is None else int(limit), headroom=float(data.get("headroom") or 0.0),
                   usable_bytes=None if usable is None else float(usable))


def script_sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def versions(torch_version: str | None = None, cuda_version: str | None = None) -> dict[str, Any]:
    from autofit._version import __version__

    return {"autofit": __version__, "torch": torch_version, "cuda": cuda_version,
            "python": platform.python_version()}


def config_entry(config: Config, world_size: int = 1, global_tokens: int | None = None) -> dict[str, Any]:
    """A config as the best-config file holds it: every field `Config.to_dict()` writes (so a field
    added to Config cannot be dropped on its way to the file), and the size of an optimizer step, all
    ranks together: the global batch; by tokens, `global_tokens`, the real tokens per step the run keeps
    (`@autofit(global_tokens=N)`, None: not held, a step is the config's accumulation), and a global batch
    of None: `batch_size` there only caps a micro-batch's samples, so it counts nothing a step holds. In a
    distributed search's file `batch_size` is each rank's micro-batch: `ranks` says how many, and
    `sharding` is always written."""
    fields = config.to_dict()
    step = ({"global_batch": None, "global_tokens": global_tokens} if config.max_tokens is not None
            else {"global_batch": config.global_batch * world_size})
    entry: dict[str, Any] = {
        "batch_size": fields.pop("batch_size"),
        "accumulation_steps": fields.pop("accumulation_steps"),
        **({"ranks": world_size} if world_size > 1 else {}),
        **step,
        "precision": fields.pop("precision"),
        "checkpoint_segments": fields.pop("checkpoint_segments"),
    }
    if world_size > 1:
        entry["sharding"] = config.sharding
    return {**entry, **fields}


@dataclass(frozen=True, kw_only=True)
class ABEntrant:
    """A config of the A/B: its label, its rounds' rates (at the ranked rate) in the order they ran, their
    median and spread ((max - min) / median)."""

    label: str
    rounds: tuple[float, ...]
    median: float | None = None
    spread: float | None = None


@dataclass(frozen=True, kw_only=True)
class ABRecord:
    """The A/B that confirmed the winner (`measured.ab`): its entrants, best first; the widest of their
    spreads; the label of the config that ranked first on the short probes."""

    entrants: tuple[ABEntrant, ...]
    spread: float | None = None
    led_before: str | None = None

    def to_dict(self, rate: Rate) -> dict[str, Any]:
        """The rounds under the name of the rate they are (`rate`: the file's `measured.ranked_by`)."""
        return {"entrants": [{"label": e.label, rate.name: list(e.rounds), "median": e.median, "spread": e.spread}
                             for e in self.entrants],
                "spread": self.spread, "led_before": self.led_before}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, rate: Rate) -> ABRecord | None:
        if not data:
            return None
        entrants = tuple(ABEntrant(label=str(e.get("label")), rounds=tuple(e.get(rate.name) or ()),
                                   median=e.get("median"), spread=e.get("spread")) for e in data.get("entrants") or ())
        return cls(entrants=entrants, spread=data.get("spread"), led_before=data.get("led_before"))


#: Figures of `measured` a file leaves out when they are None (written only where they were measured).
_LEFT_OUT_WHEN_NONE = ("flops_per_token", "data_wait_share", "threads", "token_envelope", "profile", "alloc_retries",
                       "host_pinned_bytes")


@dataclass(frozen=True, kw_only=True)
class MeasuredFigures:
    """The winner's measured figures (the file's `measured`; docs/reference/best-config.md says what each is).
    A field an older (or hand-made) file lacks reads as None; its ranked rate, as samples/s."""

    ranked_by: Rate = SAMPLES
    """The rate the search ranked by (files written before it: samples/s)."""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    peak_bytes: int | None = None
    probes: int | None = None
    confirmed: bool | None = None
    unconfirmed: str | None = None
    ab: ABRecord | None = None
    rate_from: str | None = None
    rate_note: str | None = None
    flops_per_sample: float | None = None
    flops_per_token: float | None = None
    flops_per_s: float | None = None
    mfu: float | None = None
    joules_per_sample: float | None = None
    data_wait_share: float | None = None
    threads: int | None = None
    alloc_retries: int | None = None
    """The allocator's retries in its probes' measured steps (CUDA; the most of them): above 0, it only just fits."""
    host_pinned_bytes: int | None = None
    """Pinned host memory its probes held at their peak (CUDA: an activation offload's copies, pinned batches)."""
    token_envelope: dict[str, Any] | None = None
    """runtime.TokenEnvelope's dict (which reads it)."""
    profile: dict[str, float] | None = None
    """Share of a step's time by kernel class: read by `autofit forecast`, written by no probe yet."""

    @property
    def rate(self) -> float | None:
        """The rate it is ranked by."""
        return getattr(self, self.ranked_by.name)

    def to_dict(self) -> dict[str, Any]:
        """In the file's order: the ranked rate first."""
        rates = sorted(RATES, key=lambda r: r != self.ranked_by)
        tail = ("flops_per_sample", "flops_per_token", "flops_per_s", "mfu", "joules_per_sample", "data_wait_share",
                "threads", "alloc_retries", "host_pinned_bytes", "token_envelope", "profile")
        return {"ranked_by": self.ranked_by.name, **{r.name: getattr(self, r.name) for r in rates},
                "peak_bytes": self.peak_bytes, "probes": self.probes, "confirmed": self.confirmed,
                "unconfirmed": self.unconfirmed, "ab": self.ab.to_dict(self.ranked_by) if self.ab else None,
                "rate_from": self.rate_from, "rate_note": self.rate_note,
                **{name: value for name in tail
                   if (value := getattr(self, name)) is not None or name not in _LEFT_OUT_WHEN_NONE}}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MeasuredFigures:
        data = data or {}
        ranked_by = next((r for r in RATES if r.name == data.get("ranked_by")), SAMPLES)
        plain = [f.name for f in fields(cls) if f.name not in ("ranked_by", "ab")]
        return cls(ranked_by=ranked_by, ab=ABRecord.from_dict(data.get("ab"), ranked_by),
                   **{name: data.get(name) for name in plain})


@dataclass(frozen=True, kw_only=True)
class RunnerUp:
    """A feasible config behind the winner, with its rate (at its `ranked_by`) and peak."""

    config: Config
    rate: float | None = None
    peak_bytes: int | None = None

    def to_dict(self, world_size: int = 1, global_tokens: int | None = None) -> dict[str, Any]:
        return {**config_entry(self.config, world_size, global_tokens), self.config.ranked_by.name: self.rate,
                "peak_bytes": self.peak_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunnerUp:
        config = Config.from_dict(data)
        return cls(config=config, rate=data.get(config.ranked_by.name), peak_bytes=data.get("peak_bytes"))


@dataclass(frozen=True, kw_only=True)
class ScriptEntry:
    """The script as the search measured it: a later run warns if it changed, naming what changed (its code,
    or a local module's), and says when it runs with other arguments than `args` (redacted). `sha256` is its
    bytes' (None: recorded before the hash was kept); `code_sha256` its code's, a comment aside, and `modules`
    the code of each local module its probes loaded, by path from the project's root (None: a file from before
    they were kept, compared by `sha256` alone)."""

    path: str | None = None
    function: str | None = None
    sha256: str | None = None
    args: tuple[str, ...] = ()
    code_sha256: str | None = None
    modules: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "function": self.function, "sha256": self.sha256,
                **({"args": list(self.args)} if self.args else {}),
                **({"code_sha256": self.code_sha256} if self.code_sha256 is not None else {}),
                **({"modules": dict(self.modules)} if self.modules is not None else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ScriptEntry:
        data = data or {}
        return cls(path=data.get("path"), function=data.get("function"), sha256=data.get("sha256"),
                   args=tuple(data.get("args") or ()), code_sha256=data.get("code_sha256"),
                   modules=data.get("modules"))


@dataclass(frozen=True, kw_only=True)
class StudyEntry:
    """The study the file was exported from, its probes' counts and why the search stopped."""

    name: str
    storage: str | None = None
    probes: int = 0
    oom: int = 0
    failed: int = 0
    stopped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "storage": self.storage, "probes": self.probes, "oom": self.oom,
                "failed": self.failed, "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> StudyEntry | None:
        if not data:
            return None
        return cls(name=str(data.get("name")), storage=data.get("storage"), probes=int(data.get("probes") or 0),
                   oom=int(data.get("oom") or 0), failed=int(data.get("failed") or 0), stopped=data.get("stopped"))


@dataclass(frozen=True, kw_only=True)
class BestConfig:
    """A best-config file as one typed record, both ways: the search writes it (`write_best`), a normal run,
    the reports and the forecast read it (`read_best`, `from_dict`); no other module reads its keys. A file
    written before a field came reads with that field's default (see docs/reference/best-config.md)."""

    config: Config
    partial: bool = False
    """The search was interrupted: the best so far."""
    global_tokens: int | None = None
    """By tokens, the real tokens per optimizer step the run keeps (None: not held)."""
    world_size: int = 1
    """Ranks each probe ran on (the config's micro-batch and accumulation are per rank)."""
    measured: MeasuredFigures = MeasuredFigures()
    memory: MemoryBudget = MemoryBudget(limit_bytes=None)
    """The memory the search probed against."""
    device: dict[str, Any] = field(default_factory=dict)
    """The device searched on, as `autofit devices` describes it (devices.DeviceInfo's dict)."""
    allocator: dict[str, Any] | None = None
    """The allocator settings the probes ran under (None: not recorded)."""
    versions: dict[str, Any] = field(default_factory=dict)
    script: ScriptEntry = ScriptEntry()
    study: StudyEntry | None = None
    why: str = ""
    runner_ups: tuple[RunnerUp, ...] = ()
    created: str | None = field(default=None, compare=False)
    """When it was written (`write_best` stamps it; not compared, as `path`)."""
    path: str | None = field(default=None, compare=False)
    """Where it was read from (not in the file)."""

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step, all ranks together (None by tokens)."""
        return None if self.config.max_tokens is not None else self.config.global_batch * self.world_size

    @property
    def device_type(self) -> str | None:
        return self.device.get("type")

    @property
    def device_name(self) -> str | None:
        return self.device.get("name")

    @property
    def device_memory(self) -> int | None:
        """The searched device's total memory in bytes (None: not recorded)."""
        return self.device.get("total_bytes")

    def to_dict(self) -> dict[str, Any]:
        """The file, in its order (usable bytes rounded)."""
        usable = self.memory.usable_bytes
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **({"created": self.created} if self.created else {}),
                "partial": self.partial, "config": config_entry(self.config, self.world_size, self.global_tokens),
                "measured": self.measured.to_dict(),
                "memory": {**self.memory.to_dict(), "usable_bytes": None if usable is None else int(usable)},
                "device": dict(self.device), "world_size": self.world_size,
                "allocator": None if self.allocator is None else dict(self.allocator),
                "versions": dict(self.versions), "script": self.script.to_dict(),
                **({"study": self.study.to_dict()} if self.study else {}), "why": self.why,
                "runner_ups": [r.to_dict(self.world_size, self.global_tokens) for r in self.runner_ups]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | None = None) -> BestConfig:
        """From a file's dict, of any form schema version 1 has had (validated by `read_best`)."""
        entry = data.get("config") or {}
        return cls(config=Config.from_dict(entry), partial=bool(data.get("partial")),
                   global_tokens=entry.get("global_tokens"), world_size=int(data.get("world_size") or 1),
                   measured=MeasuredFigures.from_dict(data.get("measured")),
                   memory=MemoryBudget.from_dict(data.get("memory")), device=dict(data.get("device") or {}),
                   allocator=data.get("allocator"), versions=dict(data.get("versions") or {}),
                   script=ScriptEntry.from_dict(data.get("script")), study=StudyEntry.from_dict(data.get("study")),
                   why=data.get("why") or "", runner_ups=tuple(RunnerUp.from_dict(e) for e in data.get("runner_ups") or ()),
                   created=data.get("created"), path=path)


def write_best(path: str, best: BestConfig) -> str:
    """Write atomically (a crash never leaves half a file), stamped with the time now; return the path."""
    document = replace(best, created=datetime.now(UTC).isoformat(timespec="seconds")).to_dict()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".best-", suffix=".json")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; a config file is for everyone to read
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def read_best(path: str) -> BestConfig:
    """Read and validate; ConfigFileError with one line saying what is wrong."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except FileNotFoundError:
        raise ConfigFileError(f"The best-config file must exist, but {path} does not.") from None
    except IsADirectoryError:
        raise ConfigFileError(f"The best-config file must be a file, but {path} is a directory.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"The best-config file {path} must be valid JSON, but it is not: {exc}.") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ConfigFileError(f"The file {path} must be an autofit best-config (schema {SCHEMA!r}), but it is not.")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigFileError(
            f"The best-config file {path} must have schema version {SCHEMA_VERSION}, but has {version!r}: "
            f"re-export it with this autofit (autofit export) or use the autofit that wrote it."
        )
    missing = [key for key in _REQUIRED if key not in document]
    if missing:
        raise ConfigFileError(f"The best-config file {path} must have {', '.join(missing)}, but they are missing.")
    try:
        Config.from_dict(document["config"])
    except Exception as exc:  # noqa: BLE001
        raise ConfigFileError(f"The config in {path} must be valid, but: {exc}") from None
    try:
        return BestConfig.from_dict(document, path=path)
    except Exception as exc:  # noqa: BLE001  (a hand-edited runner-up, a figure of the wrong type, ...)
        raise ConfigFileError(f"The best-config file {path} must hold what its schema says, but: {exc!r}; export "
                              f"it again (autofit export).") from None


def default_best_path(script: str, function: str | None, directory: str = "studies",
                      device: str | None = None) -> str:
    """studies/SCRIPT.FUNCTION[.DEVICE].best.json: with a device tag (see `device_tag`), searches
    on two kinds of device never overwrite each other's answer."""
    stem = os.path.splitext(os.path.basename(script))[0]
    tag = f".{device}" if device else ""
    return os.path.join(directory, f"{stem}.{function or 'train'}{tag}.best.json")


def device_tag(device_type: str, name: str | None = None) -> str:
    """A file-name tag for a kind of device: "cpu", or the GPU model ("nvidia-h100-80gb-hbm3")."""
    if device_type == "cpu" or not name:
        return device_type
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
