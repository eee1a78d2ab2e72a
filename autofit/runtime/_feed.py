"""`StepFeed`: the optimizer steps a run's own loop builds, micro-batch by micro-batch, a micro-batch by
tokens beyond the probes' envelope run in pieces (TokenGuard), and the step fed again after an
out-of-memory."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from autofit.config import Config
from autofit.errors import UsageError
from autofit.runtime._batch import count_samples, mark_shape_dynamic, to_device
from autofit.runtime._dataloader import count_prefetch_as_warmup
from autofit.runtime._envelope import TokenEnvelope, TokenGuard
from autofit.runtime._micro import MicroBatch
from autofit.runtime._precision import make_grad_scaler
from autofit.runtime._redo import drop_graph
from autofit.runtime._saved import SavedTensors
from autofit.runtime._tokens import TokenLoader

if TYPE_CHECKING:
    from autofit.runtime._core import RunCore


class DataTooSmall(RuntimeError):
    """A pass over the data yielded no batch at this batch size: it cannot be probed."""


_END = object()  # the data ran out
_REAL_TOKENS = object()  # count each micro-batch's real tokens (run.token_batches' lengths)


class StepFeed:
    """Micro-batches handed out by `batches`, their losses through `backward` (accumulation, fp16 loss
    scaling, the optimizer step at each step's end), and a step that ran out of memory fed again at
    the lowered micro-batch (`LoopRedo` decides). The run's config, clock and step count are its control's."""

    def __init__(self, control: RunCore, envelope: TokenEnvelope | None = None) -> None:
        self._control = control
        self._clock, self._panel, self._redo = control.clock, control.panel, control.loop_redo
        self.scaler = make_grad_scaler(control.config.precision, control.device)
        self._micro_batches = 0  # handed out by batches()
        self.micro_in_step = 0  # of the optimizer step being fed (a micro-batch run in pieces counts once)
        self.handed_in_step = 0  # batches handed out in the optimizer step being fed (each piece counts)
        self._last_piece = True  # the batch handed out last ends its micro-batch (it was not cut by the guard)
        self._piece_share = 1.0  # of its micro-batch's real tokens (samples where unknown)
        self._backwards_in_step = 0  # run.backward() calls in the optimizer step being fed
        self._step_samples = 0
        self._step_tokens = 0
        self._micro_tokens = 0  # of the micro-batch handed out last (the one whose loss comes next)
        self._token_cap: int | None = None  # of the TokenLoader being fed (run.token_batches)
        self.guard = TokenGuard(envelope)
        """Splits a micro-batch by tokens beyond `envelope`, what the search's probes ran (a normal run's)."""
        self.weight_by_tokens = False
        """Each micro-batch's loss counts by its tokens (`run.batches(..., weight_by_tokens=True)`)."""
        self._optimizer: torch.optim.Optimizer | None = None
        # Whether every loss so far was finite, kept as one device flag updated in place (no sync,
        # no list): keeping each step's detached loss alive pinned glibc heap chunks between the
        # activations and made a probe's memory grow step by step (~3 MiB per step, measured).
        self._all_finite: torch.Tensor | None = None
        self.checked_losses = 0
        self.saved = SavedTensors()
        """What a real run's forward passes save for backward, let go after an OOM (`OomGuard`, `caught`)."""

    # --- the data -------------------------------------------------------------------------------
    def batches(self, iterable: Iterable[Any], tokens: int | Callable[[Any], int] | None,
                weight_by_tokens: bool = False) -> Iterator[Any]:
        """Yield micro-batches moved to the device; count samples, tokens and optimizer steps."""
        loader = iterable if isinstance(iterable, TokenLoader) else None
        self._token_cap = loader.batch_sampler.max_tokens if loader is not None else None
        tokens, self.weight_by_tokens = _token_count(loader, tokens, weight_by_tokens)
        control = self._control
        if not control.knobs.batches:
            self._panel.training_data(iterable)
            self._drain_prefetch(iterable)
        control.knobs.batches = True
        with control.hooks.data_context():
            source = iter(iterable)
        pending: deque[MicroBatch] = deque()  # micro-batches taken from the data and not yet handed out
        this_step: list[MicroBatch] = []  # micro-batches of the step being fed (kept only to redo it after an OOM)
        yielded, largest = 0, 0
        try:
            while True:
                if self._redo.redoing:  # the step ran out of memory: feed it again, cut to the new micro-batch
                    pending = self._begin_redo([*this_step, *pending])
                    this_step = []
                if not pending:
                    batch = self._fetch(source)
                    if batch is _END:
                        break
                    largest = max(largest, count_samples(batch))
                    fed = MicroBatch.of_tokens(batch, loader.batch_lengths, loader.batch_width) if loader is not None else MicroBatch(batch)
                    # After a lowering the loader still gives the batch it was built with: cut it.
                    pending.extend(self._cut(fed) if control.redo.lowerings else (fed,))
                fed = pending.popleft()
                pieces = self.guard.pieces(fed, may_split=self._panel.may_split_alone())
                for index, piece in enumerate(pieces):
                    if index and self._redo.redoing:
                        break  # an earlier piece ran out of memory: its step is fed again
                    yielded += 1
                    if self._hand_out(piece, tokens, fed, first=index == 0, last=index == len(pieces) - 1):
                        this_step = []
                    if index == 0 and self._redo.recovering:
                        this_step.append(fed)
                    if len(pieces) > 1:  # DDP: only a micro-batch's last piece synchronises the gradients
                        self._panel.gradient_sync(index == len(pieces) - 1)
                    yield _shaped(to_device(piece.batch, control.device), piece, self._panel.compiled)
        finally:
            self._panel.gradient_sync(True)
        self.finish()  # the data ran out: the last step's work is done
        if control.settings.probing:
            with control.hooks.data_context():  # the sampler's draws (TokenLoader.stats) are real data, not fake tensors
                _check_the_pass(control, iterable, yielded, largest)

    def _fetch(self, source: Iterator[Any]) -> Any:
        """The next batch from the user's data (`_END` at its end), its wait on the clock."""
        try:
            with self._control.hooks.data_context():
                fetch_started = time.perf_counter()
                try:
                    return next(source)
                finally:
                    self._clock.data_waited(time.perf_counter() - fetch_started)
        except StopIteration:
            return _END

    def _hand_out(self, piece: MicroBatch, tokens: Any, whole: MicroBatch, *, first: bool, last: bool) -> bool:
        """Count `piece` of the micro-batch `whole` (itself when not cut by the guard) into the step
        being fed; True when it begins a new optimizer step."""
        closed = False
        if first:  # the pieces of one micro-batch are one micro-step of the accumulation
            if self._micro_batches == 0:
                self._clock.start()  # the first step begins
            elif self.micro_in_step >= self._control.config.accumulation_steps and self._step_samples:
                self._finish_step()  # (not already closed at the end of the data)
                closed = True
            self.micro_in_step += 1
        self._micro_batches += 1
        self.handed_in_step += 1
        self._step_samples += piece.samples
        self._micro_tokens = _count_tokens(piece, tokens)
        self._step_tokens += self._micro_tokens
        self._last_piece, self._piece_share = last, piece.share_of(whole)
        if piece.real_tokens is not None and piece.width:  # what ran: a probe's envelope
            self._control.knobs.ran_tokens(piece.samples, piece.width)
        return closed

    def _cut(self, fed: MicroBatch) -> list[MicroBatch]:
        """`fed` cut to the micro-batch an OOM lowered the run to (counted where it is cut)."""
        pieces = fed.cut(_lowered_piece(fed.samples, self._control.config, self._token_cap))
        if len(pieces) > 1:
            self._redo.redo.split_batches += 1
        return pieces

    def _drain_prefetch(self, iterable: Iterable[Any]) -> None:
        """Count the optimizer steps that empty the loader's prefetch queue as warm-up too."""
        count_prefetch_as_warmup(iterable, self._control.config.accumulation_steps, self._clock, self._control.notes)

    def finish(self) -> None:
        """Close the step being fed if all its micro-batches were handed out."""
        if self.micro_in_step >= self._control.config.accumulation_steps and self._step_samples:
            self._finish_step()

    def _finish_step(self) -> None:
        samples, tokens = self._step_samples, self._step_tokens
        self._step_samples = self._step_tokens = 0
        self.micro_in_step = self.handed_in_step = 0
        self._control.step_taken(samples, tokens)

    # --- the losses -----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None) -> None:
        """Backward of one micro-batch's share of the step's loss; the optimizer steps at the step's end."""
        control = self._control
        control.hooks.before_backward(optimizer)
        control.knobs.backward = True
        if self._redo.redoing:
            return  # the loss of a micro-batch whose step ran out of memory: the step is redone
        self._optimizer = optimizer
        where = "backward"
        try:
            self._accumulate(loss)
            if self._backwards_in_step >= control.config.accumulation_steps:
                where = "optimizer step"
                self._optimizer_step(optimizer, clip_grad_norm)
                self._backwards_in_step = 0
                if control.settings.probing:
                    self._check_finite(loss)
        except Exception as exc:
            if not self.caught(exc, where, loss):
                raise

    def _accumulate(self, loss: torch.Tensor) -> None:
        # By tokens: the loss (a mean over its micro-batch's tokens) times its tokens, and the step's
        # gradients divided by all of its tokens before the optimizer steps (`_by_the_steps_tokens`):
        # one big batch's token mean, however the tokens fall into micro-batches. A piece the guard cut
        # (a mean over its own tokens) counts by its share of its micro-batch's tokens.
        accumulation = self._control.config.accumulation_steps
        scaled = loss * self._micro_tokens if self.weight_by_tokens else loss * self._piece_share / accumulation
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        last = self._last_piece and self._backwards_in_step + 1 >= accumulation
        if self._panel.sharded is not None:  # FSDP2: reduce-scatter the gradients once per step
            self._panel.sharded.set_requires_gradient_sync(last)
        if self._panel.data_parallel is not None and not last:
            with self._panel.data_parallel.no_sync():  # gradients are averaged across ranks once per step
                scaled.backward()
        else:
            scaled.backward()
        del scaled
        if self._last_piece:
            self._backwards_in_step += 1

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None) -> None:
        if self.weight_by_tokens:
            self._by_the_steps_tokens(optimizer)
        if clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _by_the_steps_tokens(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the step's gradients by its tokens, all ranks' together (data parallel averages the
        gradients over the ranks, so each divides by the mean count: the sum over all tokens results)."""
        total = torch.tensor(float(self._step_tokens), device=self._control.device)
        if self._panel.data_parallel is not None or self._panel.sharded is not None:
            import torch.distributed as dist

            dist.all_reduce(total)
            total /= dist.get_world_size()
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.div_(total.clamp(min=1.0))

    def _check_finite(self, loss: torch.Tensor) -> None:
        finite = torch.isfinite(loss.detach()).all()
        if self._all_finite is None:
            self._all_finite = finite.clone()
        else:
            torch.logical_and(self._all_finite, finite, out=self._all_finite)
        self.checked_losses += 1

    def losses_finite(self) -> bool:
        """Whether every optimizer step's loss was finite (reads the device flag: one sync)."""
        return self._all_finite is None or bool(self._all_finite.item())

    # --- the redo -------------------------------------------------------------------------------
    def caught(self, exc: BaseException, where: str, loss: torch.Tensor | None = None) -> bool:
        """An exception in the step: True when it is an OOM this run recovers from in place (the step
        will be fed again at the lowered config), False to let it propagate."""
        control = self._control
        config = self._redo.caught(control.config, exc, where, steps_done=self._clock.steps_done,
                                   can_feed_again=control.knobs.batches)
        if config is None:
            return False
        self.saved.release()  # the failed step's activations, whatever of the loop still holds its graph
        if loss is not None:
            drop_graph(loss)  # now: the user's `loss` would hold the failed graph to the redo
        control.set_config(config)
        if self.scaler is not None:  # a step may have stopped after unscaling: start its state afresh
            self.scaler = torch.amp.GradScaler(control.device.type, init_scale=self.scaler.get_scale())
        return True

    def _begin_redo(self, micro_batches: list[MicroBatch]) -> deque[MicroBatch]:
        """Forget the failed step (its gradients, its counters, the memory it held); its micro-batches
        and those not yet handed out, cut to the lowered micro-batch."""
        self._redo.redoing = False
        pending = deque(piece for item in micro_batches for piece in self._cut(item))
        if self._optimizer is not None:
            self._optimizer.zero_grad(set_to_none=True)
        self.micro_in_step = self.handed_in_step = self._backwards_in_step = 0
        self._last_piece, self._piece_share = True, 1.0
        self._step_samples = self._step_tokens = 0
        self._redo.redo.free()
        return pending


class OomGuard:
    """The forward pass's precision context, which also turns an OOM inside it into a redone step: a
    training forward's only (gradients on). An evaluation under `torch.no_grad()` is no step to redo:
    its OOM goes to the user's code, as it would without autofit."""

    def __init__(self, feed: StepFeed, inner: Any, where: str) -> None:
        self._feed, self._inner, self._where = feed, inner, where
        self._training = True
        self._hooks: Any = None

    def __enter__(self) -> Any:
        self._training = torch.is_grad_enabled()
        if self._training:  # its saved tensors held where an OOM's redo can let them go (SavedTensors)
            self._hooks = self._feed.saved.hooks()
            self._hooks.__enter__()
        return self._inner.__enter__()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            if self._inner.__exit__(kind, exc, tb):
                return True
        finally:
            if self._hooks is not None:
                self._hooks.__exit__(None, None, None)
                self._hooks = None
        return (self._training and exc is not None and isinstance(exc, Exception)
                and self._feed.caught(exc, self._where))


def _check_the_pass(control: RunCore, iterable: Iterable[Any], yielded: int, largest: int) -> None:
    """A probe's pass over the data that no larger config could change: DataTooSmall."""
    config, lowered = control.config, bool(control.redo.lowerings)
    if not yielded:
        # A loader with drop_last yields nothing for a batch larger than the dataset: a probe
        # looping over epochs would spin forever.
        raise DataTooSmall(
            f"The data yields no batch of {config.batch_size}: the batch is larger than the "
            f"data can feed (a DataLoader with drop_last=True over fewer samples, say).")
    if _capped_by_the_data(iterable, config.batch_size, largest) and not lowered:
        # The loader's batches hold the whole data and no more: a larger micro-batch would run the
        # same batches, and be exported as a batch the user's run never takes.
        raise DataTooSmall(
            f"A pass over the data gives batches of {largest} samples at most, fewer than the micro-batch "
            f"of {config.batch_size}: the data is the ceiling (a larger micro-batch runs the same batches).")
    if isinstance(iterable, TokenLoader) and iterable.capped_by_the_data() and not lowered:
        raise DataTooSmall(f"A pass over the data is one batch of {iterable.stats().padded_tokens} padded tokens, "
                           f"half the cap of {iterable.batch_sampler.max_tokens} at most: the data is the ceiling "
                           f"(a smaller cap runs the same batch).")


def _lowered_piece(samples: int, config: Config, token_cap: int | None) -> int:
    """Samples per piece of a batch of `samples` after a lowering: the micro-batch, or for batches by tokens
    as many fewer samples as the cap is lower than the loader's."""
    if config.max_tokens is None or token_cap is None:
        return config.batch_size
    return max(1, samples * config.max_tokens // token_cap)


def _capped_by_the_data(iterable: Any, batch_size: int, largest: int) -> bool:
    """A DataLoader built with this micro-batch whose whole pass held less than one batch (with
    drop_last False it yields the whole data as one short batch)."""
    return (isinstance(iterable, torch.utils.data.DataLoader) and iterable.batch_size == batch_size
            and 0 < largest < batch_size)


def _shaped(batch: Any, piece: MicroBatch, compiled: bool) -> Any:
    """A batch by tokens for a model the run compiled: its samples and length marked dynamic (one graph, compiled at
    the first batch, for every shape the epoch meets)."""
    if compiled and piece.lengths is not None:
        return mark_shape_dynamic(batch, len(piece.lengths), piece.width)
    return batch


def _token_count(loader: TokenLoader | None, tokens: Any, weight_by_tokens: bool) -> tuple[Any, bool]:
    """How `run.batches` counts tokens, and whether it weighs each micro-batch's loss by them: a
    TokenLoader's real tokens unless told otherwise (weighted under `global_tokens`)."""
    if tokens is None and loader is not None:
        tokens, weight_by_tokens = _REAL_TOKENS, weight_by_tokens or loader.weight_by_tokens
    if weight_by_tokens and tokens is None:
        raise UsageError("run.batches(..., weight_by_tokens=True) needs tokens= (per sample, or a function "
                         "of the batch): the weights are each micro-batch's tokens.")
    return tokens, weight_by_tokens


def _count_tokens(fed: MicroBatch, tokens: Any) -> int:
    """The tokens of a micro-batch: its real ones (run.token_batches), the function's count of them, or
    `tokens` per sample."""
    if tokens is None:
        return 0
    if tokens is _REAL_TOKENS:
        return fed.real_tokens or 0
    if callable(tokens):
        return int(tokens(fed.batch))
    return int(tokens) * count_samples(fed.batch)
