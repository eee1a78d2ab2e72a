"""The parts a Run is a face over, each on its own: its settings, its step clock, its knobs, its OOM
redo (the run's loop, the decorator's restart, a framework's step in pieces) and its summary."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from autofit.config import Config
from autofit.normal_run import report_run
from autofit.runtime import (
    LoopRedo,
    PieceReplay,
    ProbeFinished,
    Ranks,
    Run,
    RunHooks,
    RunSettings,
    StepClock,
    StepRedo,
    checkpoint_policy_of,
    loss_of,
    run_summary,
    weighted,
)

CPU_OOM = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1"


# --- the settings -----------------------------------------------------------------------------------
def test_a_run_is_built_from_one_frozen_settings_record_or_its_shorthand():
    settings = RunSettings(Config(batch_size=4, accumulation_steps=2), "cpu", probing=True, warmup_steps=1, measured_steps=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.probing = False
    for run in (Run(settings), Run(Config(batch_size=4, accumulation_steps=2), "cpu", probing=True, warmup_steps=1,
                                   measured_steps=2)):
        assert (run.batch_size, run.accumulation_steps, run.probing, run.device) == (4, 2, True, torch.device("cpu"))
        assert run.control.clock.total_steps == 3 and not run.recovers_oom
    with pytest.raises(TypeError, match="takes no other arguments"):
        Run(settings, "cpu")


def test_a_shared_redo_keeps_the_lowerings_of_every_run_built_with_it():
    redo = StepRedo(enabled=True)
    first = Run(RunSettings(Config(batch_size=8), redo=redo))
    assert first.control.redo is redo and first.recovers_oom
    redo.take(redo.lower(Config(batch_size=8), MemoryError(), "forward", 1))
    assert Run(RunSettings(Config(batch_size=4, accumulation_steps=2), redo=redo)).lowerings == redo.lowerings != []


def test_a_run_calls_the_hooks_it_was_built_with_at_its_seams():
    """The memory estimator's: every read of the data inside `data_context`, each `run.backward` told its
    optimizer first, and each optimizer step told after it is counted, but for the one that ends the probe."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    run = Run(Config(batch_size=2), probing=True, warmup_steps=1, measured_steps=2, hooks=RunHooks(
        data_context=lambda: _Noted(seen, "data"), before_backward=lambda opt: seen.append(opt is optimizer),
        after_step=lambda: seen.append(run.control.clock.steps_done)))
    with pytest.raises(ProbeFinished), run.control.active():
        for batch in run.batches([torch.ones(2, 2)] * 5):
            run.backward(model(batch).sum(), optimizer)
    # iter(), then a fetch per micro-batch: the next one's closes the step before it; the third ends the probe
    assert seen == ["data", "data", True, "data", 1, True, "data", 2, True, "data"]
    assert Run(Config(batch_size=2)).control.hooks == RunHooks()  # none by default


class _Noted:
    def __init__(self, seen: list, what: str) -> None:
        self._seen, self._what = seen, what

    def __enter__(self) -> None:
        self._seen.append(self._what)

    def __exit__(self, *exc: object) -> None:
        pass


# --- the step clock ---------------------------------------------------------------------------------
def test_a_probes_clock_synchronises_only_where_measuring_starts_and_ends():
    synced = []
    clock = StepClock(warmup_steps=2, measured_steps=3, synchronize=lambda: synced.append(clock.steps_done))
    clock.start()
    for _ in range(5):
        clock.step_done(samples=4, tokens=0)
    assert synced == [2, 5] and clock.complete
    assert clock.steps_measured == 3 and clock.measured_samples == 12 and len(clock.step_times) == 3


def test_a_normal_runs_clock_never_synchronises_and_never_completes():
    clock = StepClock(warmup_steps=1, measured_steps=None, synchronize=lambda: pytest.fail("synchronised"))
    clock.start()
    for _ in range(10):
        clock.step_done(samples=2, tokens=6)
    assert not clock.complete and clock.total_steps is None
    assert clock.measured()[1:] == (18, 54)


def test_the_data_wait_counts_only_for_measured_steps():
    clock = StepClock(warmup_steps=1, measured_steps=None, synchronize=lambda: None)
    clock.start()
    clock.data_waited(5.0)
    clock.step_done(1, 0)  # warm-up: its wait is left out
    clock.data_waited(0.25)
    clock.step_done(1, 0)
    assert clock.data_wait_s == 0.25


# --- the knobs --------------------------------------------------------------------------------------
def test_checkpointing_is_noted_and_taken_off_when_the_run_ends():
    blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
    run = Run(Config(batch_size=2, checkpoint_segments=2, checkpoint_policy="selective"))
    with run.control.active():
        run.checkpoint(blocks)
        assert run.control.knobs.checkpoint_blocks == 3
        assert [checkpoint_policy_of(block) for block in blocks] == ["selective", "selective", None]
    assert [checkpoint_policy_of(block) for block in blocks] == [None, None, None]


def test_compile_is_noted_and_skipped_where_the_config_or_the_run_says_eager():
    model = torch.nn.Linear(2, 2)
    run = Run(Config(batch_size=2, compile=True))
    run.control.compile_enabled = False
    assert run.compile(model) is model and run.control.knobs.compile
    assert Run(Config(batch_size=2)).compile(model) is model


def test_channels_last_is_noted_trains_in_that_format_and_is_taken_off_when_the_run_ends():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model[0].weight
    run = Run(Config(batch_size=2, channels_last=True))
    with run.control.active():
        assert run.channels_last(model) is model and run.control.knobs.channels_last
        assert model[0].weight is weight and weight.is_contiguous(memory_format=torch.channels_last)
        out = model(torch.randn(2, 3, 16, 16))
        assert out.is_contiguous(memory_format=torch.channels_last)  # the convolutions ran NHWC
        out.sum().backward()
        optimizer.step()  # the optimizer built on the parameters before keeps them
    assert weight.is_contiguous() and not weight.is_contiguous(memory_format=torch.channels_last)
    plain = Run(Config(batch_size=2))
    with plain.control.active():
        assert plain.channels_last(model) is model and plain.control.knobs.channels_last
        assert weight.is_contiguous()  # the config says no: the model as it came


def test_the_training_loader_is_the_one_the_steps_take_their_batches_from():
    data = torch.utils.data.TensorDataset(torch.randn(16, 2))
    run = Run(Config(batch_size=4, loader_workers=0))  # no worker process starts: the declared ones are noted
    evaluation = run.loader(data, num_workers=0)
    training = run.loader(data, num_workers=1)
    assert run.control.knobs.loader and run.control.knobs.declared_workers == 0  # the first loader, until the steps say
    for _ in run.batches(training):
        break
    assert run.control.knobs.declared_workers == 1 and evaluation.batch_size == training.batch_size == 4


def test_distribute_in_one_process_moves_the_model_and_notes_the_blocks():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    run = Run(Config(batch_size=2, sharding="fsdp"))
    assert run.distribute(model, blocks=list(model)) is model
    assert run.control.knobs.shard_blocks == 2


# --- the redo: the run's own loop ---------------------------------------------------------------------
def test_the_loop_redo_restarts_before_the_first_step_and_lowers_in_place_after_it():
    redo = LoopRedo(StepRedo(enabled=True), probing=False)
    assert redo.caught(Config(batch_size=8), RuntimeError(CPU_OOM), "forward", steps_done=0, can_feed_again=True) is None
    assert redo.restart_lowering.after == Config(batch_size=4, accumulation_steps=2) and not redo.redoing
    assert redo.redo.lowerings == []  # not taken: only the normal call knows whether it starts again
    after = redo.caught(Config(batch_size=8), RuntimeError(CPU_OOM), "backward", steps_done=3, can_feed_again=True)
    assert after == Config(batch_size=4, accumulation_steps=2) and redo.redoing
    assert [(item.step, item.where) for item in redo.redo.lowerings] == [(4, "backward")]


def test_the_loop_redo_lets_through_what_it_cannot_redo():
    redo = LoopRedo(StepRedo(enabled=True), probing=False)
    assert redo.caught(Config(batch_size=8), ValueError("a bug"), "forward", steps_done=3, can_feed_again=True) is None
    assert redo.caught(Config(batch_size=8), RuntimeError(CPU_OOM), "forward", steps_done=3, can_feed_again=False) is None
    probe = LoopRedo(StepRedo(enabled=True), probing=True)
    assert not probe.recovering
    assert probe.in_place(Config(batch_size=8), RuntimeError(CPU_OOM), "forward", steps_done=3) is None
    assert redo.redo.lowerings == probe.redo.lowerings == []


# --- the redo: the decorator's restart --------------------------------------------------------------
def test_until_it_starts_starts_again_with_the_lowered_config_after_freeing_the_failed_attempts_memory():
    events = []
    redo = StepRedo(enabled=True, release_memory=lambda: events.append("freed"))
    pending = []

    def start(config):
        events.append(config)
        if config is None or config.batch_size > 2:
            pending.append(redo.lower(config or Config(batch_size=8), RuntimeError(CPU_OOM), "forward", 1, restart=True))
            raise RuntimeError(CPU_OOM)
        return "trained"

    assert redo.until_it_starts(start, lambda: pending.pop()) == "trained"
    assert events == [None, "freed", Config(batch_size=4, accumulation_steps=2), "freed", Config(batch_size=2, accumulation_steps=4)]
    assert [item.restart for item in redo.lowerings] == [True, True]


def test_until_it_starts_lets_an_oom_through_when_the_attempt_asks_for_no_restart():
    redo = StepRedo(enabled=True)

    def start(config):
        raise RuntimeError(CPU_OOM)

    with pytest.raises(RuntimeError, match="can't allocate"):
        redo.until_it_starts(start, lambda: None)
    assert redo.lowerings == []


# --- the redo: a framework's step in pieces -----------------------------------------------------------
class _Output(dict):
    """A dict whose `.loss` follows its "loss" item, as an HF ModelOutput does."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        setattr(self, key, value)


def test_weighting_leaves_the_users_output_as_it_was():
    loss = torch.tensor(2.0)
    for output in ({"loss": loss, "logits": 1}, _Output(loss=loss, logits=1)):
        if isinstance(output, _Output):
            output.loss = loss
        half = weighted(output, 0.5)
        assert type(half) is type(output) and half is not output
        assert half["loss"].item() == 1.0 and output["loss"] is loss and half["logits"] == 1
        assert loss_of(half).item() == 1.0 and loss_of(output) is loss
    assert weighted(loss, 0.5).item() == 1.0 and loss.item() == 2.0
    assert weighted(output, 1.0) is output and weighted(None, 0.5) is None
    assert loss_of(torch.ones(3)) is None  # not a loss: a tensor of outputs


def test_weighting_an_hf_model_output_keeps_its_type_and_attribute():
    outputs = pytest.importorskip("transformers.modeling_outputs")
    output = outputs.CausalLMOutput(loss=torch.tensor(2.0), logits=torch.ones(1))
    half = weighted(output, 0.5)
    assert type(half) is outputs.CausalLMOutput and half.loss.item() == 1.0 and half["loss"].item() == 1.0
    assert output.loss.item() == 2.0 and output["loss"].item() == 2.0


@pytest.mark.parametrize("fails_in", ["forward", "backward"])
def test_a_framework_step_fed_in_pieces_after_an_oom_has_the_whole_steps_gradient(fails_in):
    """The Accelerate and Lightning shape: the framework runs the forward (`first_piece`), then its
    backward on the loss it got (`backward_and_rest`); one OOM in the second micro-batch lowers 8 -> 4."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    reference = copy.deepcopy(model)
    micro_batches = [torch.randn(8, 4) for _ in range(2)]
    reference(torch.cat(micro_batches)).pow(2).mean().backward()
    run = Run(Config(batch_size=8, accumulation_steps=2), recover_oom=True)
    run.control.clock.steps_done = 3  # mid-run: the step is redone in place
    replay = PieceReplay(run.control, lambda: model.zero_grad(set_to_none=True))
    failures = {"forward": 0, "backward": 0}

    def forward(piece):
        if fails_in == "forward" and piece.shape[0] == 8 and len(seen) == 1 and not failures["forward"]:
            failures["forward"] += 1
            raise RuntimeError(CPU_OOM)
        return model(piece).pow(2).mean()

    def backward(loss):
        (loss / 2).backward()  # the framework divides by its accumulation

    def work(piece, weight, context):
        replay.whole_piece(piece, weight, forward, backward)

    seen = []
    for batch in micro_batches:
        loss = replay.first_piece(batch, forward, work)
        seen.append(batch)

        def framework_backward(loss=loss):
            if fails_in == "backward" and len(seen) == 2 and not failures["backward"]:
                failures["backward"] += 1
                raise RuntimeError(CPU_OOM)
            backward(loss)

        replay.backward_and_rest(batch, None, loss, framework_backward, work)
    replay.step_done()
    assert failures[fails_in] == 1 and run.config == Config(batch_size=4, accumulation_steps=4)
    assert [item.where for item in run.lowerings] == [fails_in]
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)
    torch.testing.assert_close(model.bias.grad, reference.bias.grad)


# --- the summary and the end-of-run report ----------------------------------------------------------
def test_the_summary_counts_every_rank_and_leaves_the_warm_up_out():
    clock = StepClock(warmup_steps=1, measured_steps=None, synchronize=lambda: None)
    clock.start()
    for _ in range(4):
        clock.step_done(samples=8, tokens=80)
    clock.measured_time_s = 2.0  # the figures below follow from it, whatever the steps took
    summary = run_summary(Config(batch_size=8), torch.device("cpu"), clock, Ranks(rank=0, world_size=2), [])
    assert (summary["optimizer_steps"], summary["warmup_steps"], summary["measured_steps"]) == (4, 1, 3)
    assert summary["samples_per_s"] == 3 * 8 * 2 / 2.0 and summary["tokens_per_s"] == 3 * 80 * 2 / 2.0
    assert summary["config"] == Config(batch_size=8).to_dict() and summary["lowerings"] == []


def test_only_the_main_rank_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOFIT_RUN_REPORT", str(tmp_path / "run.json"))
    run = Run(Config(batch_size=2), ranks=Ranks(rank=1, world_size=2))
    run.control.clock.start()
    run.control.step_taken(2)
    report_run(run)
    assert capsys.readouterr().err == "" and not (tmp_path / "run.json").exists()


def test_an_input_bound_run_says_so_in_its_report(capsys):
    run = Run(Config(batch_size=2), warmup_steps=0)
    run.control.clock.start()
    run.control.clock.data_waited(10.0)  # more than the step itself can have taken
    run.control.step_taken(2)
    report_run(run)
    said = capsys.readouterr().err
    assert "trained 1 optimizer steps with fp32 b=2" in said and "input-bound: 100% of the time waiting" in said


def test_a_run_by_tokens_reports_its_real_tokens_per_second_first(capsys):
    """As the search ranked it and the best-config file heads with it; a run by samples keeps samples/s first."""
    for config, first in ((Config(batch_size=64, max_tokens=64), "real tokens/s ("), (Config(batch_size=8), "samples/s (")):
        run = Run(config, warmup_steps=0)
        run.control.clock.start()
        run.control.step_taken(4, 200)
        report_run(run)
        said = capsys.readouterr().err
        assert f"trained 1 optimizer steps with {config.label()}: " in said and first in said, said
    assert "max_tokens=64" in Config(batch_size=64, max_tokens=64).label()


def test_a_probe_s_line_by_tokens_leads_with_real_tokens_per_second():
    from autofit.probing import ProbeResult

    line = ProbeResult(status="ok", config=Config(batch_size=64, max_tokens=64), samples_per_s=40.0, tokens_per_s=8000.0).summary()
    assert "fp32 max_tokens=64" in line and line.index("8,000 real tokens/s") < line.index("40.0 samples/s")
