"""`RunView`: a run's settings as the train function reads them (`run.batch_size`, `run.world_size`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autofit.config import Config

if TYPE_CHECKING:
    from autofit.runtime._control import RunControl


class RunView:
    """What a train function reads of its run: the config it trains with now, where it stands among
    the ranks, its device and whether it is a probe."""

    control: RunControl

    @property
    def config(self) -> Config:
        """The config the run trains with now (lowered after an OOM; a framework's own where it stands).
        In a probe of a config that accumulates more than `RunSettings.probe_accumulation`, that many
        micro-batches a step (`run.control.priced_config` is the config its figures are for)."""
        return self.control.config

    @property
    def batch_size(self) -> int:
        """Micro-batch size: give it to your DataLoader."""
        self.control.reads.add("batch_size")
        return self.config.batch_size
    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (per rank). In a probe, at most PROBE_ACCUMULATION: the step of
        the config's own is priced from them (`global_batch` says the same)."""
        self.control.reads.add("accumulation_steps")
        return self.config.accumulation_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        self.control.reads.add("global_batch")
        return self.config.global_batch * self.control.ranks.world_size

    @property
    def precision(self) -> str:
        """"fp32", "tf32", "bf16" or "fp16"."""
        self.control.reads.add("precision")
        return self.config.precision

    @property
    def dtype(self) -> torch.dtype:
        """The precision as the dtype an autocast region computes in (torch.float32 for fp32 and tf32):
        for a loop that keeps its own `torch.autocast(..., dtype=...)` and GradScaler."""
        from autofit.runtime._precision import MODES

        self.control.reads.add("precision")
        return MODES[self.config.precision].autocast_dtype or torch.float32

    @property
    def pad_multiple(self) -> int:
        """The multiple your collate pads a batch's length up to (1: to its longest): reading it lets a search
        try a few, so that an epoch of variable lengths meets a handful of shapes, not one per batch.
        `run.token_batches` counts the padded length against the token cap."""
        self.control.knobs.pad_multiple = True
        return self.config.pad_multiple or 1

    @property
    def checkpoint_segments(self) -> int:
        return self.config.checkpoint_segments

    @property
    def device(self) -> torch.device:
        return self.control.device

    @property
    def probing(self) -> bool:
        """True inside a probe: skip evaluation, saving and logging that a probe does not need."""
        return self.control.settings.probing

    @property
    def rank(self) -> int:
        return self.control.ranks.rank

    @property
    def world_size(self) -> int:
        """Processes training together (torchrun's ranks); the global batch is micro-batch x
        accumulation x world size."""
        return self.control.ranks.world_size

    @property
    def is_main(self) -> bool:
        """True on the rank that logs, saves and reports (rank 0; always, in a single process)."""
        return self.control.ranks.is_main
