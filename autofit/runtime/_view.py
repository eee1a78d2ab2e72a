"""`RunView`: a run's settings as the train function reads them (`run.batch_size`, `run.world_size`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from autofit.config import Config
from autofit.runtime._clock import StepClock
from autofit.runtime._distributed import Ranks
from autofit.runtime._settings import RunSettings


class RunView:
    """What a train function reads of its run: the config it trains with now, where it stands among
    the ranks, its device and whether it is a probe."""

    ranks: Ranks
    """Where this process stands in a distributed (torchrun) run; rank 0 of 1 otherwise."""
    settings: RunSettings
    _device: torch.device
    reads: set[str]
    """The settings the function read (`run.batch_size`, ...): a loop autofit follows through its
    optimizer's steps uses what it read, and only that is searched."""
    clock: StepClock
    _config: Config
    _priced_accumulation: int

    @property
    def config(self) -> Config:
        """The config the run trains with now (lowered after an OOM; a framework's own where it stands).
        In a probe of a config that accumulates more than `RunSettings.probe_accumulation`, that many
        micro-batches a step: `priced_config` is the config its figures are for."""
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        self._priced_accumulation = config.accumulation_steps
        cap = self.settings.probe_accumulation
        if cap is not None and config.accumulation_steps > cap:
            config = replace(config, accumulation_steps=cap)
        self._config = config
        if self.clock.inner is not None:
            self.clock.inner.per_step = config.accumulation_steps
            self.clock.inner.pricing = self._priced_accumulation > config.accumulation_steps

    @property
    def priced_config(self) -> Config:
        """The config this run's figures are for: `config` with the accumulation it stands for (a probe
        that runs fewer micro-batches a step prices a step of these)."""
        if self._priced_accumulation == self._config.accumulation_steps:
            return self._config
        return replace(self._config, accumulation_steps=self._priced_accumulation)

    @property
    def batch_size(self) -> int:
        """Micro-batch size: give it to your DataLoader."""
        self.reads.add("batch_size")
        return self.config.batch_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (per rank). In a probe, at most PROBE_ACCUMULATION: the step of
        the config's own is priced from them (`global_batch` says the same)."""
        self.reads.add("accumulation_steps")
        return self.config.accumulation_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        self.reads.add("global_batch")
        return self.config.global_batch * self.ranks.world_size

    @property
    def precision(self) -> str:
        """"fp32", "tf32", "bf16" or "fp16"."""
        self.reads.add("precision")
        return self.config.precision

    @property
    def dtype(self) -> torch.dtype:
        """The precision as the dtype an autocast region computes in (torch.float32 for fp32 and tf32):
        for a loop that keeps its own `torch.autocast(..., dtype=...)` and GradScaler."""
        from autofit.runtime._precision import MODES

        self.reads.add("precision")
        return MODES[self.config.precision].autocast_dtype or torch.float32

    @property
    def checkpoint_segments(self) -> int:
        return self.config.checkpoint_segments

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def probing(self) -> bool:
        """True inside a probe: skip evaluation, saving and logging that a probe does not need."""
        return self.settings.probing

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        """Processes training together (torchrun's ranks); the global batch is micro-batch x
        accumulation x world size."""
        return self.ranks.world_size

    @property
    def is_main(self) -> bool:
        """True on the rank that logs, saves and reports (rank 0; always, in a single process)."""
        return self.ranks.is_main
