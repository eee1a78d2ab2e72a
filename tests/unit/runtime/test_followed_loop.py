"""A loop the function keeps as it is (its own optimizer.step(), zero_grad, GradScaler, clipping):
autofit follows its optimizer's steps through PyTorch's global step hooks, ends a probe past any
`except Exception`, counts one step per iteration with two optimizers, leaves loops that hand their
steps to run.backward (or a framework) alone, and leaves no hook behind in the process."""

from __future__ import annotations

import pytest
import torch

from autofit import Config, autofit
from autofit.runtime import NoStepClosed, ProbeFinished, Run
from tests.support.runs import accumulates_to_64


def _model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _own_loop(run: Run, steps: int | None = None, swallow: bool = False) -> int:
    """A loop written without autofit, reading only the micro-batch and accumulation from `run`."""
    model, optimizer = _model_and_optimizer()
    batch, accumulation = run.batch_size, run.accumulation_steps
    taken = 0
    while steps is None or taken < steps:
        try:
            for _ in range(accumulation):
                x = torch.randn(batch, 8)
                loss = model(x).pow(2).mean() / accumulation
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            taken += 1
        except Exception:  # noqa: BLE001 - a user's loop that swallows its errors
            if not swallow:
                raise
    return taken


def test_a_probe_of_a_kept_loop_measures_its_steps_and_ends_it_past_except_exception():
    run = Run(Config(batch_size=4, accumulation_steps=2), "cpu", probing=True, warmup_steps=2, measured_steps=3)
    with pytest.raises(ProbeFinished), run.control.active():
        _own_loop(run, swallow=True)
    assert run.control.clock.steps_done == 5 and run.control.clock.steps_measured == 3
    assert run.control.clock.measured_samples == 3 * 4 * 2  # the config's micro-batch x accumulation, per step
    knobs = run.control.knobs.to_dict()
    assert knobs["followed"] and knobs["batches"] and knobs["backward"] and not knobs["autocast"]


def test_the_hooks_go_with_the_run_and_a_second_run_in_the_process_counts_only_its_own_steps():
    first = Run(Config(batch_size=2), "cpu", probing=False)
    with first.control.active():
        _own_loop(first, steps=3)
    assert first.control.clock.steps_done == 3
    _own_loop(Run(Config(batch_size=2), "cpu"), steps=4)  # outside any run: nothing counts these
    second = Run(Config(batch_size=2), "cpu", probing=False)
    with second.control.active():
        _own_loop(second, steps=2)
    assert (first.control.clock.steps_done, second.control.clock.steps_done) == (3, 2)


def test_two_optimizers_step_once_per_iteration_as_the_first_one_steps():
    run = Run(Config(batch_size=4), "cpu", probing=False)
    generator, g_opt = _model_and_optimizer(1)
    critic, c_opt = _model_and_optimizer(2)
    with run.control.active():
        for _ in range(5):
            for model, optimizer in ((critic, c_opt), (generator, g_opt)):
                model(torch.randn(run.batch_size, 8)).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
    assert run.control.clock.steps_done == 5


def test_a_loop_that_hands_its_steps_to_run_backward_is_not_followed():
    run = Run(Config(batch_size=4, accumulation_steps=2), "cpu", probing=False)
    model, optimizer = _model_and_optimizer()
    with run.control.active():
        for x in run.batches([torch.randn(4, 8) for _ in range(6)]):
            run.backward(model(x).pow(2).mean(), optimizer)
    run.finish()
    assert run.control.clock.steps_done == 3 and not run.control.knobs.followed


def test_a_loop_that_reads_the_precision_is_searched_in_every_precision():
    run = Run(Config(batch_size=4, precision="bf16"), "cpu", probing=False)
    model, optimizer = _model_and_optimizer()
    with run.control.active():
        assert run.dtype == torch.bfloat16
        with torch.autocast("cpu", dtype=run.dtype):
            loss = model(torch.randn(run.batch_size, 8)).float().pow(2).mean()
        loss.backward()
        optimizer.step()
    assert run.control.knobs.autocast and run.control.knobs.followed and not run.control.knobs.backward


def test_an_oom_in_a_kept_loop_starts_the_function_again_smaller_with_the_global_batch_kept(tmp_path, monkeypatch,
                                                                                               capsys):
    monkeypatch.chdir(tmp_path)  # no best-config file: the declared global batch stands
    attempts = []

    @autofit(global_batch=16)
    def train(run):
        attempts.append(run.config)
        model, optimizer = _model_and_optimizer()
        for step in range(6):
            if step == 3 and run.batch_size > 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            for _ in range(run.accumulation_steps):
                model(torch.randn(run.batch_size, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return "trained"

    assert train() == "trained"
    assert [(c.batch_size, c.accumulation_steps) for c in attempts] == [(16, 1), (8, 2), (4, 4)]
    err = capsys.readouterr().err
    assert "following your loop's optimizer steps" in err and "starting again with fp32 b=8 acc=2" in err


def test_a_kept_loop_over_run_loader_times_its_wait_for_data():
    data = torch.utils.data.TensorDataset(torch.randn(64, 8))
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ProbeFinished), run.control.active():
        loader = run.loader(data)
        assert isinstance(loader, torch.utils.data.DataLoader)
        while True:
            for (x,) in loader:
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
    assert run.control.knobs.followed and run.control.knobs.loader
    assert run.control.clock.data_wait_s is not None and run.control.clock.data_wait_s > 0


def test_a_loop_over_run_batches_with_its_own_optimizer_step_counts_each_step_once():
    run = Run(Config(batch_size=4), "cpu", probing=False)
    model, optimizer = _model_and_optimizer()
    with run.control.active():
        for x in run.batches([torch.randn(4, 8) for _ in range(5)]):
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    run.finish()
    assert run.control.clock.steps_done == 5 and not run.control.knobs.followed


def test_an_oom_in_an_evaluation_under_run_autocast_reaches_the_script_and_trains_nothing_twice():
    run = Run(Config(batch_size=4), "cpu", probing=False)
    model, optimizer = _model_and_optimizer()
    fed = []
    with run.control.active():
        with pytest.raises(torch.OutOfMemoryError):
            for x in run.batches([torch.full((4, 8), float(i)) for i in range(3)]):
                fed.append(float(x[0, 0]))
                with run.autocast():
                    loss = model(x).pow(2).mean()
                run.backward(loss, optimizer)
                if len(fed) == 2:
                    with torch.no_grad(), run.autocast():
                        raise torch.OutOfMemoryError("CUDA out of memory (the evaluation)")
    assert fed == [0.0, 1.0] and run.lowerings == []


def test_a_loop_that_builds_a_new_optimizer_each_epoch_is_still_followed():
    run = Run(Config(batch_size=4), "cpu", probing=False)
    with run.control.active():
        for _ in range(3):
            model, optimizer = _model_and_optimizer()
            for _ in range(2):
                model(torch.randn(run.batch_size, 8)).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            del model, optimizer  # the epoch's optimizer goes with it
    assert run.control.clock.steps_done == 6


def _kept_loop(run: Run, *, lr: float = 0.01, skip_every: int | None = None) -> None:
    """A kept loop with its own GradScaler: its loss goes to inf on every `skip_every`-th step (the scaler
    then skips the optimizer: no step, no hook), or its learning rate is wild."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=skip_every is not None)
    step = 0
    while True:
        for micro in range(run.accumulation_steps):
            loss = model(torch.randn(run.batch_size, 8)).pow(2).mean() / run.accumulation_steps
            if skip_every is not None and step % skip_every == skip_every - 1 and micro == 0:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1


def test_steps_a_kept_loops_gradscaler_skips_are_counted_with_the_step_after_them():
    """A step the GradScaler skips never calls optimizer.step(): its micro-batches and time went into the
    next counted step as if they were one step's, and the rate read half of what ran."""
    run = Run(Config(batch_size=4, accumulation_steps=2), "cpu", probing=True, warmup_steps=1, measured_steps=6)
    with pytest.raises(ProbeFinished), run.control.active():
        _kept_loop(run, skip_every=3)
    assert run.control.skipped_steps >= 2
    # every step the loop ran is counted: measured samples are the steps it ran (skipped or not) x 4 x 2
    assert run.control.clock.measured_samples % (4 * 2) == 0
    assert run.control.clock.measured_samples // 8 > run.control.clock.steps_measured


def test_a_kept_loop_with_its_own_accumulation_is_counted_as_it_ran():
    """Issue 37, item 3: a loop that reads run.batch_size but keeps its own accumulation (2 micro-batches a
    step) under a declared global batch (the config's acc=8) was counted 4 x 8 samples a step, favouring small
    micro-batches by G/(b x A). Now it counts what ran, and says its global batch is not the one declared."""
    run = Run(Config(batch_size=4, accumulation_steps=8), "cpu", probing=True, warmup_steps=1, measured_steps=3,
              probe_accumulation=4)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ProbeFinished), run.control.active():
        while True:
            for _ in range(2):  # its own accumulation
                model(torch.randn(run.batch_size, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert run.control.clock.measured_samples == run.control.clock.steps_measured * 4 * 2
    assert any("keeps its own accumulation (2 micro-batches a step)" in note and "not the 32 asked" in note
               for note in run.control.notes)


def _steps_only_when(run: Run, stepped, micro_batches: int = 400) -> None:
    """A kept loop of `micro_batches` micro-batches of 1 that steps its optimizer only where `stepped(i, loss)`
    (after the i-th backward pass)."""
    model, optimizer = _model_and_optimizer()
    for i in range(micro_batches):
        loss = model(torch.randn(run.batch_size, 8)).pow(2).mean()
        loss = loss * float("inf") if stepped is None else loss
        loss.backward()
        if stepped is not None and stepped(i, loss):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("stepped", "finite"), [(None, False), (lambda i, loss: False, True)])
def test_a_probe_whose_loop_never_steps_its_optimizer_ends_at_once_saying_whether_its_loss_was_finite(stepped,
                                                                                                    finite):
    """Issue 44, item 2: a kept loop that skips optimizer.step() (for a non-finite loss, or always) ran its
    micro-batches until the search's budget was gone: no step, no end."""
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    with pytest.raises(NoStepClosed) as ended, run.control.active():
        _steps_only_when(run, stepped)
    assert ended.value.finite is finite and ended.value.micro_batches == run.control.open_step.limit + 1
    assert run.control.clock.steps_done == 0


@pytest.mark.parametrize(("stepped", "finite"), [(None, False), (lambda i, loss: False, True)])
def test_a_loop_that_never_steps_with_time_allowed_ends_at_once_if_not_finite_else_when_its_time_is_up(stepped, finite):
    """Issue 52, items 1-2, against round four: the time a probe allows a loop's own accumulation never keeps a NaN
    guard's loop running (it ends past the floor), and a finite loop that never steps ends when that time is up."""
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3, open_step_s=0.2)
    with pytest.raises(NoStepClosed) as ended, run.control.active():
        _steps_only_when(run, stepped, micro_batches=10**7)
    assert ended.value.finite is finite and run.control.clock.steps_done == 0
    if finite:
        assert ended.value.micro_batches > 257 and ended.value.waited_s is not None
    else:
        assert ended.value.micro_batches == 257 and ended.value.waited_s is None


def test_a_probe_of_a_loop_that_accumulates_many_micro_batches_itself_or_skips_a_run_of_steps_is_not_ended():
    """Its own accumulation of 64 micro-batches under acc=1, and a GradScaler's run of 20 skipped steps at its
    start (here: no step for 20 x 64 micro-batches once): both far from a loop that never steps."""
    run = Run(Config(batch_size=1), "cpu", probing=True, warmup_steps=1, measured_steps=200)
    with run.control.active():
        _steps_only_when(run, lambda i, loss: (i + 1) % 64 == 0 and not 64 <= i < 20 * 64, micro_batches=24 * 64)
    assert run.control.clock.steps_done == 5 and run.control.clock.fewest_per_step == 64


def _accumulates_itself(run: Run, total: int, *, overflows: int = 0, scaler: bool = False) -> None:
    """build-nanogpt's loop: `total // run.batch_size` micro-batches a step, worked out by the loop itself; with
    `scaler`, a GradScaler whose first `overflows` steps see an inf loss (fp16's start: each one skipped)."""
    model, optimizer = _model_and_optimizer()
    grad_scaler = torch.amp.GradScaler("cpu", enabled=scaler)
    accumulation, step = total // run.batch_size, 0
    while True:
        for _ in range(accumulation):
            loss = model(torch.randn(run.batch_size, 8)).pow(2).mean() / accumulation
            grad_scaler.scale(loss * float("inf") if step < overflows else loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1


def test_a_probe_follows_a_loop_that_accumulates_more_than_its_floor_itself_to_its_steps_and_says_so():
    """Issue 52, items 1: build-nanogpt's `grad_accum_steps = total_batch_size // (B * T)` at 512 samples a step runs
    512 micro-batches at b=1: past the 256 a probe allowed without a step it ended as NoOptimizerStep, and a search
    whose pilot was that small exported nothing. With the time its limits allow a step, the loop is followed."""
    run = Run(Config(batch_size=1), "cpu", probing=True, warmup_steps=1, measured_steps=2, open_step_s=120.0)
    with pytest.raises(ProbeFinished), run.control.active():
        _accumulates_itself(run, 512)
    clock = run.control.clock
    assert clock.fewest_per_step == 512 and clock.measured_samples == clock.steps_measured * 512
    assert any("no optimizer step closed in the first 256 micro-batches and the loss was finite" in note
               for note in run.control.notes), run.control.notes


def test_a_gradscalers_skipped_steps_are_steps_tried_and_a_scaler_that_skips_every_one_ends_diverged():
    """Issue 52, item 2: a loop accumulating 40 itself whose GradScaler skips its first 7 steps (an fp16 start)
    held 280 micro-batches before its first step and ended as NoOptimizerStep; a skipped step is a step tried.
    One whose scaler skips every step still ends, diverged, after 32 skips in a row (2**16 down to 2**-16)."""
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=2)
    with pytest.raises(ProbeFinished), run.control.active():
        _accumulates_itself(run, 160, overflows=7, scaler=True)
    assert run.control.clock.steps_done >= 3
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=2)
    with pytest.raises(NoStepClosed) as ended, run.control.active():
        _accumulates_itself(run, 160, overflows=10**9, scaler=True)
    assert ended.value.finite is False and ended.value.skipped == 33 and run.control.clock.steps_done == 0


def _accumulates_to_64(run: Run) -> None:
    accumulates_to_64(run, *_model_and_optimizer(), width=8)


@pytest.mark.parametrize("batch", [4, 16])
def test_a_kept_loop_with_its_own_accumulation_under_acc_1_is_counted_as_it_ran(batch):
    """Issue 44, item 3: under the config's acc=1, a loop accumulating 64 // b micro-batches itself was counted one
    micro-batch a step: b=4 read 16x too few samples, b=16 4x, and the ranking favoured large micro-batches 4x."""
    run = Run(Config(batch_size=batch), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    with pytest.raises(ProbeFinished), run.control.active():
        _accumulates_to_64(run)
    clock = run.control.clock
    assert clock.measured_samples == clock.steps_measured * 64  # micro-batches ran x micro-batch
    assert any(f"keeps its own accumulation ({64 // batch} micro-batches a step)" in note for note in run.control.notes)


def test_a_kept_gan_loop_and_a_closure_count_one_micro_batch_a_step_and_two_optimizers_side_by_side_all():
    """Several backward passes a step are one micro-batch where two optimizers step each after passes of its own
    (a GAN: real, fake, then generator) or where they run inside the optimizer's step (a closure); two optimizers
    that step back to back (Muon beside AdamW) after a loop's own accumulation of 4 ran 4 micro-batches."""
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    (critic, c_opt), (generator, g_opt) = _model_and_optimizer(1), _model_and_optimizer(2)
    with pytest.raises(ProbeFinished), run.control.active():
        while True:
            x = torch.randn(run.batch_size, 8)
            critic(x).mean().backward()
            critic(generator(x).detach().expand(-1, 8)).mean().backward()
            c_opt.step()
            generator(x).mean().backward()
            g_opt.step()
    assert run.control.clock.measured_samples == run.control.clock.steps_measured * 4 and not run.control.notes
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    (first, first_opt), (second, second_opt) = _model_and_optimizer(1), _model_and_optimizer(2)
    with pytest.raises(ProbeFinished), run.control.active():
        while True:
            for _ in range(4):
                x = torch.randn(run.batch_size, 8)
                (first(x) + second(x)).mean().backward()
            second_opt.step()
            first_opt.step()
    assert run.control.clock.measured_samples == run.control.clock.steps_measured * 4 * 4
    run = Run(Config(batch_size=4), "cpu", probing=True, warmup_steps=1, measured_steps=3)
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ProbeFinished), run.control.active():
        while True:
            x = torch.randn(run.batch_size, 8)
            optimizer.step(lambda: model(x).pow(2).mean().backward())
    assert run.control.clock.measured_samples == run.control.clock.steps_measured * 4 and not run.control.notes
