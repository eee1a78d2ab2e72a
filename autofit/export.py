"""The best-config JSON: a stable, versioned file users read, commit and diff.

Schema "autofit.best-config", version 1 (documented in the README). Readers refuse other versions
and corrupt files with a clear error: a silent default could cost a whole training run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autofit.config import Config
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


def write_best(path: str, document: dict[str, Any]) -> str:
    """Write atomically (a crash never leaves half a file) and return the path."""
    document = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                "created": datetime.now(UTC).isoformat(timespec="seconds"), **document}
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


@dataclass(frozen=True, kw_only=True)
class BestConfig:
    """A best-config file, read and validated (`read_best`): what a run reads of it, by name. `document` is
    the whole file, for the reports that show it."""

    path: str
    config: Config
    document: dict[str, Any]

    @property
    def device(self) -> dict[str, Any]:
        """The device searched on, as `autofit devices` describes it (`type`, `name`)."""
        return self.document["device"]

    @property
    def partial(self) -> bool:
        return bool(self.document.get("partial"))

    @property
    def memory(self) -> MemoryBudget:
        """The memory the search probed against."""
        return MemoryBudget.from_dict(self.document.get("memory"))

    @property
    def world_size(self) -> int:
        """Ranks each probe ran on (the config's micro-batch and accumulation are per rank)."""
        return int(self.document.get("world_size") or 1)

    @property
    def global_batch(self) -> int | None:
        """Samples per optimizer step, all ranks together (None by tokens)."""
        return (self.document.get("config") or {}).get("global_batch")

    @property
    def measured(self) -> dict[str, Any]:
        """The winner's measured figures (rates, peak, the A/B that confirmed it, its token envelope)."""
        return self.document.get("measured") or {}

    @property
    def allocator(self) -> dict[str, Any] | None:
        """The allocator settings the probes ran under (None: not recorded)."""
        return self.document.get("allocator")

    @property
    def threads(self) -> int | None:
        """The intra-op threads the winner's probes ran on (None: not recorded)."""
        return (self.document.get("measured") or {}).get("threads")

    @property
    def script_sha256(self) -> str | None:
        """The script as the search measured it (None for files written before the hash was kept)."""
        return (self.document.get("script") or {}).get("sha256")

    @property
    def script_args(self) -> list[str]:
        """The script's own arguments the search ran it with, redacted."""
        return list((self.document.get("script") or {}).get("args") or [])


def read_best(path: str) -> BestConfig:
    """Read and validate; ConfigFileError with one line saying what is wrong."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except FileNotFoundError:
        raise ConfigFileError(f"The best-config file must exist, but {path} does not.") from None
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
        config = Config.from_dict(document["config"])
    except Exception as exc:  # noqa: BLE001
        raise ConfigFileError(f"The config in {path} must be valid, but: {exc}") from None
    return BestConfig(path=path, config=config, document=document)


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
