"""The knobs a train function offers through its run (checkpoint, compile, loader, distribute): each
applies the run's config to the user's model or data, and is noted as used so that a search spends
probes only on the knobs the function offers."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofit.config import Config
from autofit.errors import UsageError
from autofit.knobs import Offers
from autofit.runtime._checkpoint import apply_checkpoint, offload_block, remove_checkpoint
from autofit.runtime._dataloader import build_loader
from autofit.runtime._distributed import Ranks
from autofit.runtime._envelope import TokenEnvelope
from autofit.runtime._offload import ActivationOffload, end_offload, start_offload
from autofit.runtime._shape_caches import bound_shape_caches
from autofit.runtime._tokens import TokenBatchSampler, TokenLoader, build_token_loader, token_sampler


class Knobs(Offers):
    """Which settings the function actually used (autofit.knobs' `Offers`, noted here as the run goes), so
    the search spends no probes on the others."""

    token_envelope: TokenEnvelope | None = None
    shape_caches: dict[str, int] | None = None
    """The capacities of the libraries' per-shape caches the run runs under (`bound_shape_caches`; None off the CPU)."""

    def ran_tokens(self, samples: int, longest: int) -> None:
        """A micro-batch of `samples` samples padded to `longest` tokens ran: widen `token_envelope`."""
        self.token_envelope = TokenEnvelope.of_batch(samples, longest, self.shape_caches).widened(self.token_envelope)


def block_plan(config: Config, blocks: int) -> list[tuple[str | None, bool]]:
    """What `config` does to each of `blocks` offered to run.checkpoint(), in order: the checkpoint policy of
    its first `checkpoint_segments` (None: not checkpointed), and whether each keeps what it saves for backward
    in host memory (all of them where the config offloads activations). The memory estimator's arithmetic
    reads the same plan (autofit.memory._traced_peaks)."""
    offloaded = bool(config.offload_activations)
    return [(config.checkpoint_policy if index < config.checkpoint_segments else None, offloaded)
            for index in range(blocks)]


class KnobPanel:
    """The model and data knobs of one run, applied under the config each call is given (a run's
    config changes after an OOM or when a framework's own settings stand), and noted in `used`."""

    def __init__(self, device: torch.device, ranks: Ranks, *, probing: bool, worst_token_batches: bool = False,
                 host_memory: Callable[[], int | None] | None = None, window_steps: int = 0,
                 shape_caches: dict[str, int] | None = None) -> None:
        self.used = Knobs()
        self._host_memory = host_memory
        self._recorded_caches = shape_caches  # the probes' (a normal run's best-config file), where recorded
        self._set_in_environment: list[str] = []  # variables bound_shape_caches set: out again at the end
        self._device, self._ranks, self._probing = device, ranks, probing
        self._worst_token_batches = worst_token_batches
        self._window_steps = window_steps  # a probe's measured steps at least: its token batches' window
        self.compile_enabled = True
        """False where the model must stay eager (the memory estimator's fake tensors)."""
        self.compiled = False
        """A model offered to compile() was compiled (its batches by tokens are marked dynamic: StepFeed)."""
        self._declared_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """The workers the script declared to each loader built here (which one trains, `training_data` says)."""
        self._wrapped_blocks: weakref.WeakSet = weakref.WeakSet()
        """Blocks checkpointed here: unwrapped when the run ends, so a model that outlives the run
        (built at import, met again by the next probe in one process or by a second call) is the
        user's own again."""
        self._channels_last: weakref.WeakSet = weakref.WeakSet()
        """Models put in channels-last format here: back in the contiguous format when the run ends."""
        self.training_loader: torch.utils.data.DataLoader | None = None
        """The first loader built here (the training one: an evaluation loader comes after it)."""
        self.training_source: Any = None
        """What the steps took their first batches from (run.batches' iterable)."""
        self.offload: ActivationOffload | None = None
        """The activation offload of the blocks offered here, where the config offloads (closed at the end)."""
        self.data_parallel: torch.nn.parallel.DistributedDataParallel | None = None
        self.sharded: Any = None  # an FSDP2 module (distribute with shard=)

    def checkpoint(self, config: Config, blocks: Sequence[torch.nn.Module]) -> Sequence[torch.nn.Module]:
        """Checkpointing on the first `config.checkpoint_segments` of `blocks` under its policy, and on
        none of the others (a model built once meets several configs in one process); what every one of
        them saves for backward in host memory where the config offloads activations. All of them, not the
        others alone: a checkpointed block saves only its inputs, and they leave the device too."""
        if config.offload_activations and self._device.type == "cpu":
            raise UsageError(f"Activation offload moves what the blocks save for backward off an accelerator into "
                             f"host memory, but the device is {self._device}, whose memory is the host's: set "
                             f"offload_activations to false (a search there never tries it).")
        blocks = list(blocks) if not isinstance(blocks, torch.nn.ModuleList) else blocks
        self.used.checkpoint_blocks = len(blocks)
        if config.offload_activations and self.offload is None:
            self.offload = start_offload(self._device, self._host_memory() if self._host_memory else None)
        for block, (policy, offloaded) in zip(blocks, block_plan(config, len(blocks))):
            if policy is not None:
                apply_checkpoint(block, policy=policy)
            else:
                remove_checkpoint(block)
            offload_block(block, self._device.type if offloaded else None)
            if policy is not None or offloaded:
                self._wrapped_blocks.add(block)
        return blocks

    def bound_caches(self) -> None:
        """What libraries keep per shape bounded on the CPU (`bound_shape_caches`), as the run begins, before its
        first step makes a primitive: batches by tokens meet a new shape at almost every batch, and so do fixed
        batches padded to each one's longest (bf16 b=1 over 250 lengths held 1.8 GiB of caches, issue 53)."""
        self.used.shape_caches = bound_shape_caches(self._device, self._recorded_caches, self._set_in_environment)

    def restore_models(self) -> None:
        """Give the user's modules back as they came: the checkpointing and offload put on here off its
        blocks, the models put in channels-last format back in the contiguous one; and the environment
        (the per-shape caches' capacities set here: the libraries read them when the run began)."""
        for name in self._set_in_environment:
            os.environ.pop(name, None)
        self._set_in_environment.clear()
        for block in list(self._wrapped_blocks):
            offload_block(remove_checkpoint(block), None)
        self._wrapped_blocks.clear()
        end_offload(self.offload)  # the run's streams and the forward's device bytes go; copies die with the graph
        self.offload = None
        for model in list(self._channels_last):
            model.to(memory_format=torch.contiguous_format)
        self._channels_last.clear()

    def channels_last(self, config: Config, model: torch.nn.Module) -> torch.nn.Module:
        """`model` in channels-last memory format where the config says so, else as it came (parameters
        converted in place: an optimizer built on them keeps them)."""
        self.used.channels_last = True
        if config.channels_last and model not in self._channels_last:
            model.to(memory_format=torch.channels_last)
            self._channels_last.add(model)
        return model

    def compile(self, config: Config, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """`torch.compile(model, **kwargs)` where the config says so and compiling is enabled."""
        self.used.compile = True
        if not config.compile or not self.compile_enabled:
            return model
        self.compiled = True
        return torch.compile(model, **kwargs)

    def sampler(self, dataset: Any, *, shuffle: bool = True, seed: int = 0) -> torch.utils.data.Sampler:
        """This rank's shard of `dataset` (all of it in one process), as a DistributedSampler."""
        from autofit.runtime._distributed import data_sampler

        return data_sampler(dataset, self._ranks, shuffle=shuffle, seed=seed)

    def loader(self, config: Config, dataset: Any, *, shuffle: bool, declared: dict[str, Any]) -> torch.utils.data.DataLoader:
        """A DataLoader at the config's micro-batch, its loader fields over those `declared`."""
        workers = int(declared.get("num_workers", 0) or 0)
        if not self.used.loader:  # the first is the training loader (an evaluation one comes after it)
            self.used.declared_workers = workers
        self.used.loader = True
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)  # it yields in its own order: no sampler
        sampler = None if iterable else self.sampler(dataset, shuffle=shuffle)
        loader = build_loader(dataset, config, config.batch_size, sampler, declared, probing=self._probing)
        self._declared_workers[loader] = workers
        if self.training_loader is None:
            self.training_loader = loader
        return loader

    def token_batches(self, config: Config, dataset: Any, lengths: Sequence[int], *, collate_fn: Any,
                      shuffle: bool, seed: int) -> TokenLoader:
        """A TokenLoader at the config's token cap over this rank's share of the batches."""
        loader = build_token_loader(dataset, lengths, config, collate_fn=collate_fn, shuffle=shuffle, seed=seed,
                                    rank=self._ranks.rank, world_size=self._ranks.world_size,
                                    probing=self._probing, worst_only=self._worst_token_batches,
                                    window=self._window_steps * config.accumulation_steps)
        self.used.longest_sample = max(loader.batch_sampler.lengths, default=0)
        self.used.loader = True
        if self.training_loader is None:
            self.training_loader = loader
        self._declared_workers[loader] = 0
        return loader

    def token_sampler(self, config: Config, lengths: Sequence[int], *, shuffle: bool, seed: int) -> TokenBatchSampler:
        """The batch sampler of `token_batches` for a framework's own DataLoader, over this rank's share."""
        sampler = token_sampler(lengths, config, shuffle=shuffle, seed=seed, rank=self._ranks.rank,
                                world_size=self._ranks.world_size, probing=self._probing,
                                worst_only=self._worst_token_batches, window=self._window_steps * config.accumulation_steps)
        self.used.longest_sample = max(sampler.lengths, default=0)
        return sampler

    def may_split_alone(self) -> bool:
        """Whether this rank may run more forward passes in a micro-step than the others (the token
        guard's pieces): alone, or under the DDP built here, whose pieces but the last run under its
        no_sync (`gradient_sync`), so that each rank synchronises once per micro-batch as before. FSDP2
        gathers the parameters from all ranks in every forward, and a model wrapped elsewhere is unknown."""
        return self._ranks.world_size <= 1 or (self.data_parallel is not None and self.sharded is None)

    def gradient_sync(self, on: bool) -> None:
        """DDP's `no_sync` from one hand-out of a micro-batch to the next (the forward and backward between):
        off for a piece that is not its micro-batch's last."""
        if self.data_parallel is not None:
            self.data_parallel.require_backward_grad_sync = on

    def training_data(self, iterable: Any) -> None:
        """The steps take their batches from `iterable` (kept: the memory estimator reads how many samples it
        holds); a loader built here declared the training workers."""
        self.training_source = iterable
        if isinstance(iterable, torch.utils.data.DataLoader) and iterable in self._declared_workers:
            self.used.declared_workers = self._declared_workers[iterable]

    def distribute(self, config: Config, model: torch.nn.Module, *, blocks: Sequence[torch.nn.Module] | None,
                   shard: Sequence[torch.nn.Module] | None, offload: bool) -> torch.nn.Module:
        """`model` on the device; across ranks, DDP or FSDP2 as the config (or `shard`) says."""
        if blocks is not None:
            blocks = list(blocks)
            self.used.shard_blocks = len(blocks)
        if self._ranks.world_size <= 1:
            return model.to(self._device)
        from autofit.runtime._distributed import check_same_config, data_parallel, ensure_process_group, fully_sharded

        ensure_process_group(self._device)
        check_same_config(config)
        if shard is None and blocks is not None and config.sharding != "ddp":
            shard, offload = blocks, config.sharding == "fsdp-offload"
        if shard is not None:
            self.sharded = fully_sharded(model, list(shard), self._device, offload=offload)
            return self.sharded
        self.data_parallel = data_parallel(model, self._device)
        return self.data_parallel
