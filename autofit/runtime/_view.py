"""`RunView`: a run's settings as the train function reads them (`run.batch_size`, `run.world_size`)."""

from __future__ import annotations

import torch

from autofit.config import Config
from autofit.runtime._distributed import Ranks
from autofit.runtime._settings import RunSettings


class RunView:
    """What a train function reads of its run: the config it trains with now, where it stands among
    the ranks, its device and whether it is a probe."""

    config: Config
    """The config the run trains with now (lowered after an OOM; a framework's own where it stands)."""
    ranks: Ranks
    """Where this process stands in a distributed (torchrun) run; rank 0 of 1 otherwise."""
    settings: RunSettings
    _device: torch.device

    @property
    def batch_size(self) -> int:
        """Micro-batch size: give it to your DataLoader."""
        return self.config.batch_size

    @property
    def accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        return self.config.global_batch * self.ranks.world_size

    @property
    def precision(self) -> str:
        return self.config.precision

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
