"""`RunData`: the data knobs of a run (`run.sampler`, `run.loader`, `run.token_batches`): each builds the
user's data under the run's config, and notes that the function offers it, so a search chooses for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from autofit.config import Config
from autofit.runtime._tokens import TokenBatchSampler, TokenLoader, accumulate_tokens, config_for_tokens

if TYPE_CHECKING:
    from autofit.runtime._control import RunControl


class RunData:
    """The data a run hands its function: its sampler, its DataLoader, its batches by tokens."""

    config: Config
    control: RunControl

    def sampler(self, dataset: Any, *, shuffle: bool = True, seed: int = 0) -> torch.utils.data.Sampler:
        """The sampler for your DataLoader: this rank's shard of `dataset` under torchrun, the whole of
        it in one process; a DistributedSampler either way, so call `.set_epoch(epoch)` on it each
        epoch to reshuffle (the same script runs with and without torchrun)."""
        return self.control.panel.sampler(dataset, shuffle=shuffle, seed=seed)

    def loader(self, dataset: Any, *, shuffle: bool = True, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A DataLoader over `dataset` with this run's micro-batch and sampler (`run.sampler`; none for an
        IterableDataset), `drop_last=True` unless given. `num_workers`, `pin_memory` and `prefetch_factor`
        come from the config where it sets them, else from `kwargs` (what the script declares), else
        DataLoader's defaults: offering the loader here lets a search choose them."""
        return self.control.panel.loader(self.config, dataset, shuffle=shuffle, declared=kwargs)

    def token_batches(self, dataset: Any, lengths: Sequence[int], *, collate_fn: Callable | None = None,
                      shuffle: bool = True, seed: int = 0) -> TokenLoader:
        """A DataLoader of micro-batches whose padded size (samples x the longest in the batch) stays within
        the config's `max_tokens`, length-bucketed so padding stays small (`lengths`: each sample's tokens;
        `collate_fn` pads a batch). Give it to `run.batches`: it counts real tokens, and under
        `@autofit(global_tokens=N)` accumulates about N tokens per optimizer step and weighs each micro-batch's
        loss (a mean over its real tokens) by them. Under torchrun every rank gets as many micro-batches.
        Call `.set_epoch(epoch)` each epoch; `.skip(n)` resumes an epoch after n batches (the order is the
        seed's). A search climbs `max_tokens` for a function that batches here."""
        control = self.control
        control.reads.add("max_tokens")
        loader = control.panel.token_batches(self.config, dataset, lengths, collate_fn=collate_fn,
                                             shuffle=shuffle, seed=seed)
        control.token_loader = loader
        control.set_config(accumulate_tokens(loader, self.config, control.settings.global_tokens,
                                             control.ranks.world_size, control.notes))
        control.probe_over(loader.batch_sampler)
        return loader

    def token_sampler(self, lengths: Sequence[int], *, shuffle: bool = True, seed: int = 0) -> TokenBatchSampler:
        """The batch sampler `run.token_batches` cuts its micro-batches with, for a framework that builds its
        own DataLoader (`batch_sampler=`; autofit.integrations): the same batches, the same search over
        `max_tokens`, and under `@autofit(global_tokens=N)` the accumulation that holds about N tokens per
        step. The framework counts the real tokens of its steps (`run.control.step_taken`)."""
        self.control.reads.add("max_tokens")
        sampler = self.control.panel.token_sampler(self.config, lengths, shuffle=shuffle, seed=seed)
        control = self.control
        control.set_config(config_for_tokens(sampler, self.config, control.settings.global_tokens,
                                             control.ranks.world_size, control.notes))
        control.probe_over(sampler)
        return sampler
