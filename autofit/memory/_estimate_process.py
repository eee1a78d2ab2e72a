"""The memory estimator's process: the user's function runs two optimizer steps per config on fake
tensors (PyTorch's FakeTensorMode: shapes and dtypes, no storage), under PyTorch's MemTracker, which
sorts every tensor it sees into parameters, gradients, optimizer state, activations and temporaries.

    python -m autofit.memory._estimate_process FD
        (FD: its end of the channel to autofit.memory._estimator.Estimator: a load request, then
        requests of configs; each config's estimate is sent as soon as it is known)

Two steps, because the optimizer's state appears in the first step and the peak of a steady step
holds it. The data is read for real (outside the fake mode, through the run's `RunHooks.data_context`); the model,
the step and the optimizer never allocate. The fake mode answers what a loop reads from its tensors
(`loss.item()`, GradScaler's checks) and guesses data-dependent sizes (autofit.memory._fake_values);
conversions and copies of fake parameters (tied weights, `.to()`, an EMA's deepcopy) are done without
the storage swaps PyTorch would make. Where a step still cannot be followed, the estimate is partial:
what the optimizers created hold. A separate process, so that anything the estimator cannot handle (a
crash in fake tensors) costs nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Sized
from contextlib import contextmanager
from typing import Any

#: MemTracker's categories -> the breakdown autofit shows.
_CATEGORIES = {"PARAM": "parameters", "BUFFER": "parameters", "GRAD": "gradients", "OPT": "optimizer",
               "ACT": "activations", "TEMP": "temporaries", "OTH": "other"}


def estimate_one(fn: Any, config: Any, device: Any, target: str = "cpu", traced: bool = False) -> dict:
    """Peak tensor bytes of two steps of `fn` under `config`, by category, with the memory `target`'s
    kernels keep (autofit.memory._target_kernels); or why there is none. `traced`: the steps recorded too
    (autofit.memory._step_trace; the answer's "trace"), autograd holding nothing it saves, so the peak is
    not the config's: the arithmetic over two traces gives it (autofit.memory._traced_peaks).

    Where the fake tensors cannot follow a step, what the optimizers hold is still known: the
    parameters, their gradients and the optimizer's state (`_known_parts`), with the rest missing."""

    from autofit.errors import AutofitError
    from autofit.memory._fake_values import ValueFreeFakeMode
    from autofit.memory._target_kernels import target_kernels
    from autofit.runtime import DataTooSmall, NoStepClosed, ProbeFinished

    recorder = _recorder() if traced else None
    tracker = recorder.tracker if recorder is not None else _tracker()
    run = _estimating_run(config, device, tracker, recorder)
    mode = ValueFreeFakeMode(allow_non_fake_inputs=True)
    failure = known = None
    try:
        with (mode, target_kernels(target), _conversions_in_place(), _fake_deep_copies(),
              _optimizers_created() as optimizers, run.control.active()):
            try:
                with tracker, recorder.recording() if recorder is not None else contextlib.nullcontext():
                    fn(run)  # tracked from the start: a framework's trainer reads its data itself
            except ProbeFinished:
                pass
            except NoStepClosed as exc:  # a loop that never steps its optimizer: no step to estimate
                return {"ok": False, "error": f"{exc}: the function never steps its optimizer"}
            except (DataTooSmall, AutofitError):
                raise  # the config, not the fake tensors: no estimate of it at all
            except Exception as exc:  # noqa: BLE001 - what the optimizers hold is still known
                failure = exc
                known = _known_parts(optimizers)
                raise
    except Exception as exc:  # noqa: BLE001 - the estimate is unavailable or partial, and the reason is reported
        failure = failure or exc
        why = _why(failure)
        if known is None:
            return {"ok": False, "error": why, "traceback": traceback.format_exc()[-3000:]}
        breakdown, missing = known
        return {"ok": True, "breakdown": breakdown, "missing": missing, "notes": list(mode.notes.values()),
                "error": why, "knobs": run.control.knobs.to_dict(), "traceback": traceback.format_exc()[-3000:]}
    if run.control.clock.steps_done < 2:
        return {"ok": False, "error": f"the function returned after {run.control.clock.steps_done} optimizer steps "
                                      f"of the two an estimate runs"}
    found = {"ok": True, "breakdown": _breakdown(tracker), "missing": [], "notes": list(mode.notes.values()),
             "knobs": run.control.knobs.to_dict()}
    if recorder is not None:
        samples, data = _batch_samples(run)
        found["trace"], found["data_samples"] = recorder.finish(samples), data
    return found


def _traced(programs: Any, config: Any) -> dict:
    """`config`'s estimate from its program's traces (autofit.memory._traced_space); a config the data cannot
    feed says so, as its own answer (the others of the request go on)."""
    from autofit.runtime import DataTooSmall

    try:
        return programs.estimate(config)
    except DataTooSmall as exc:
        return {"ok": False, "error": f"DataTooSmall: {exc}"}


def _recorder() -> Any:
    """A StepRecorder over autofit's StepTracker (autofit.memory._step_trace)."""
    from autofit.memory._step_trace import StepRecorder, trace_tracker_class

    return StepRecorder(trace_tracker_class(_step_tracker_class()))


def _batch_samples(run: Any) -> tuple[int, int | None]:
    """The samples of the micro-batch the run stepped (by tokens: of the cap's worst batch), and those its
    training data holds (None where unknown: a loop's own batches)."""
    envelope = run.control.knobs.token_envelope
    samples = envelope.padded_tokens // envelope.longest_sample if envelope else run.config.batch_size
    panel = run.control.panel
    loader = panel.training_loader or panel.training_source
    sampler = getattr(loader, "batch_sampler", None)
    if hasattr(sampler, "lengths"):  # run.token_batches(): this rank's samples
        return samples, len(sampler.lengths)
    try:  # a DataLoader: no micro-batch holds more than its dataset (a list of batches the loop made: any)
        return samples, len(loader.dataset) if isinstance(getattr(loader, "dataset", None), Sized) else None
    except TypeError:  # an iterable dataset: its length unknown
        return samples, None


def estimate_for(fn: Any, config: Any, cpu: Any, target: str, traced: bool = False) -> dict:
    """`estimate_one` for `target`: for CUDA, with `run.device` on CUDA (autofit.memory._target_kernels);
    where the function cannot run so on this machine (it calls the torch.cuda API, which a CPU-only
    PyTorch refuses), on its CPU branch with CUDA's kernels, and a note says so."""
    import torch

    from autofit.memory._target_kernels import CLAIMED_CUDA

    if target != "cuda":
        return estimate_one(fn, config, cpu, target, traced)
    found = estimate_one(fn, config, torch.device(CLAIMED_CUDA), target, traced)
    if found["ok"] and not found.get("missing"):
        return found
    on_cpu = estimate_one(fn, config, cpu, target, traced)
    if not on_cpu["ok"] or on_cpu.get("missing"):
        return found
    why = found.get("error") or "partial"
    on_cpu["notes"] = [*on_cpu["notes"], f"estimated on the function's CPU branch (run.device cuda:0 failed "
                                         f"here: {why}), with CUDA's kernels"]
    return on_cpu


def _estimating_run(config: Any, device: Any, tracker: Any, recorder: Any = None) -> Any:
    """A probing Run of two steps whose data is read for real (outside the fake mode), whose
    optimizers' parameters the tracker follows by name, and whose tracker restarts at each step (the
    run's hooks, `RunHooks`). Batches by tokens are the cap's worst at both steps: the data's longest
    samples, as many as the cap holds (the second step, which holds the optimizer's state, would
    otherwise run a random draw)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from autofit.runtime import Run, RunHooks

    seen_optimizers: set[int] = set()

    def track_parameters(optimizer: Any) -> None:
        if id(optimizer) not in seen_optimizers:  # its parameters (and their gradients) by name
            seen_optimizers.add(id(optimizer))
            params = [p for group in optimizer.param_groups for p in group["params"]]
            tracker.track_external(torch.nn.ParameterList(params), optimizer)

    # MemTracker follows one iteration of each module at a time: it restarts after each step that did
    # not end the run (the second ends it: ProbeFinished).
    hooks = RunHooks(data_context=unset_fake_temporarily, before_backward=track_parameters,
                     after_step=tracker.reset_mod_stats,
                     **({"blocks_offered": recorder.offered} if recorder is not None else {}))
    run = Run(config, device, probing=True, warmup_steps=1, measured_steps=1, min_measure_s=0.0,
              max_measured_steps=1, worst_token_batches=True, hooks=hooks)  # both steps at the cap's worst batch
    run.control.compile_enabled = False  # fake tensors through inductor: estimated as the eager model
    return run


def _breakdown(tracker: Any) -> dict[str, int]:
    """The tracker's peak snapshot, summed over devices, in our categories."""
    breakdown = dict.fromkeys(_CATEGORIES.values(), 0)
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for key, value in per_device.items():
            name = _CATEGORIES.get(getattr(key, "name", str(key)))
            if name is not None:
                breakdown[name] += int(value)
    return breakdown


def _tracker():
    return _step_tracker_class()()


@functools.cache
def _step_tracker_class() -> type:
    """PyTorch's MemTracker, for a training loop's steps: a second forward before the optimizer step
    (gradient accumulation) starts a new iteration of its per-module statistics instead of stopping it,
    and a forward inside the optimizer's step (Lightning's closure) makes activations, not state."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):
            self._in_opt = False  # the optimizer's post-step hook still files its state as OPT
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:  # "multiple iterative calls": the next micro-batch
                self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

        # A module whose forward ran before the last step's reset (a GAN's generator, stepped after
        # the discriminator): its statistics are gone, the global peak this estimate reads is not.
        def _post_fw_hook(self, module, inputs, outputs):
            if module in self.memory_tracking:
                super()._post_fw_hook(module, inputs, outputs)

        def _pre_bw_hook(self, module, args):
            if module in self.memory_tracking:
                super()._pre_bw_hook(module, args)

        def _post_bw_hook(self, module, args):
            if module in self.memory_tracking:
                super()._post_bw_hook(module, args)

        def _update_peak_stats(self, peak_state):
            """The global peak alone: MemTracker also updates each running module's peak after every op (half
            of GPT-2's estimate, 6 of 12 s), statistics an estimate never reads."""
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

    return StepTracker


def _why(failure: BaseException) -> str:
    """What stopped the fake tensors, in one line: the op a value or a size depends on, where it is one."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(failure, (DynamicOutputShapeException, DataDependentOutputException)):
        op = getattr(getattr(failure, "func", None), "overloadpacket", failure).__name__
        what = "has a data-dependent size" if isinstance(failure, DynamicOutputShapeException) else "reads a value"
        return f"`{op}` {what}"
    return f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"[:400]


def _known_parts(optimizers: list) -> tuple[dict[str, int], list[str]] | None:
    """What the optimizers created so far hold once they have stepped: their parameters (each once:
    tied weights are one tensor), a gradient per trainable one, and their state, made by one step of
    each on fake gradients (the state of Adam, momentum and the like is created lazily by the first
    step). None when no optimizer was created."""
    import torch

    params = {id(p): p for opt in optimizers for group in opt.param_groups for p in group["params"]}
    if not params:
        return None
    breakdown = dict.fromkeys(_CATEGORIES.values(), 0)
    breakdown["parameters"] = sum(p.numel() * p.element_size() for p in params.values())
    breakdown["gradients"] = sum(p.numel() * p.element_size() for p in params.values() if p.requires_grad)
    missing = ["activations", "temporaries"]
    try:
        with torch.no_grad():
            for p in params.values():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            for opt in optimizers:
                if not opt.state:
                    opt.step()
        state = {id(t): t for opt in optimizers for per_param in opt.state.values()
                 for t in per_param.values() if isinstance(t, torch.Tensor)}
        breakdown["optimizer"] = sum(t.numel() * t.element_size() for t in state.values())
    except Exception:  # noqa: BLE001 - the optimizer's state is missing too
        missing.insert(0, "optimizer")
    return breakdown, missing


@contextmanager
def _optimizers_created():
    """The optimizers the function creates, in order (the parts known without a step come from them)."""
    import torch

    created: list = []
    original = torch.optim.Optimizer.__init__

    def init(optimizer, *args, **kwargs):
        original(optimizer, *args, **kwargs)
        if not any(o is optimizer for o in created):
            created.append(optimizer)

    torch.optim.Optimizer.__init__ = init
    try:
        yield created
    finally:
        torch.optim.Optimizer.__init__ = original


@contextmanager
def _fake_deep_copies():
    """`copy.deepcopy` of a fake tensor (an EMA copy of the model, torchmetrics' state defaults, which
    Lightning's `self.log` makes): PyTorch's copies its storage, which a fake tensor has on the meta
    device only; a clone is the same copy without it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    original = torch.Tensor.__deepcopy__

    def deepcopy(tensor, memo):
        if not isinstance(tensor, FakeTensor):  # a real one (a model built at import): copied for real
            with unset_fake_temporarily():
                return original(tensor, memo)
        if type(tensor) is torch.nn.Parameter:
            return original(tensor, memo)
        if id(tensor) not in memo:
            with torch.no_grad():
                copied = tensor.clone()
            memo[id(tensor)] = copied.requires_grad_(tensor.requires_grad)
        return memo[id(tensor)]

    torch.Tensor.__deepcopy__ = deepcopy
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__ = original


@contextmanager
def _conversions_in_place():
    """`module.to(device)`, `.float()` and the like on fake parameters. PyTorch swaps each fake
    parameter for a converted one, which fails while anything else refers to it (the other module of
    a tied weight, the fake mode): a parameter the conversion leaves as it is stays, and one it does
    change is swapped or, where that fails, replaced."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.nn.Module._apply

    def _apply(module, fn, recurse=True):
        if not any(isinstance(p, FakeTensor) for p in module._parameters.values()):
            return original(module, fn, recurse=recurse)  # its children go through this one: patched
        if recurse:
            for child in module.children():
                child._apply(fn)
        for key, param in module._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                applied = fn(param)
            if applied is param or (applied.dtype, applied.device, applied.shape) == (param.dtype, param.device,
                                                                                      param.shape):
                continue
            converted = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
            try:
                torch.utils.swap_tensors(param, converted)
            except RuntimeError:
                module._parameters[key] = converted
        for key, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[key] = fn(buffer)
        return module

    torch.nn.Module._apply = _apply
    try:
        yield
    finally:
        torch.nn.Module._apply = original


def runtime_context_bytes(backend: Any) -> int | None:
    """What a process's first training steps cost beyond their tensors, measured for real: the CPU's
    counterpart of the CUDA context (the intra-op thread pool's stacks and malloc arenas, oneDNN's and
    the BLAS library's buffers, autograd's engine). Every probe pays it once, as the user's run does,
    and no fake tensor sees it. A model of a few hundred KiB steps in fp32 and under bf16 autocast;
    None off the CPU (the CUDA context has its prior, autofit.memory.CUDA_CONTEXT_BYTES)."""
    if backend.type != "cpu":
        return None
    import torch

    before = backend.used_bytes()
    backend.reset_peak()
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                                torch.nn.Linear(256, 128))
    optimizer = torch.optim.AdamW(model.parameters())
    inputs = torch.randn(64, 128)
    for dtype in (None, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(inputs), torch.zeros(64, dtype=torch.long))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del model, optimizer, inputs, loss
    peak = backend.peak_bytes()
    backend.release()
    return max(0, peak - before)


def _run_beside_probes() -> None:
    """Idle priority (Linux's SCHED_IDLE; a plain nice elsewhere): while it loads the script beside the
    workers' loading it takes only the CPU they leave. That is not enough beside a timed probe (it
    still slowed one 3-9x on two cores), so a search also stops it while a probe runs
    (autofit.search's _estimates.py)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


def _run_in_slices() -> None:
    """Normal priority again once loaded, where the search gives it slices of time between its probes
    and stops it while they run: at idle priority a slice was spent waiting for the CPU whenever anything
    else was runnable (a 2-minute search of nanoGPT's loop answered 1 of 6 configs in its 7 s of slices,
    each estimate 0.3-0.8 s alone). Unprivileged, where Linux refuses the change, it stays idle."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def main(argv: list[str]) -> int:
    """Load the script once (as every child does: autofit.probing's bootstrap, without a memory cap,
    since no tensor here has storage), say so, then answer each request of configs with one message
    per estimate (what is done reaches the supervisor before a crash) and a last one. Ends when the
    channel closes."""
    from autofit.config import Config
    from autofit.memory._traced_space import TracedPrograms
    from autofit.probing import Channel, LoadRequest, ScriptError, bootstrap, die_with_parent, ok_reply, serve

    # Paused (SIGSTOP) between probes, it cannot see its channel close: a searcher SIGKILLed then left it
    # stopped for good, its memory held. It dies with the searcher instead.
    die_with_parent()
    _run_beside_probes()
    channel = Channel.from_fd(int(argv[1]))
    message = channel.receive()
    if message is None or message["op"] != "load":
        return 0
    request = LoadRequest.from_wire(message["request"])
    target = message.get("target", "cpu")
    del sys.argv[1:]  # a script that parses its command line finds no arguments, not this process's FD
    try:
        loaded = bootstrap(request, cap_memory=False)
    except ScriptError as exc:
        raise exc.__cause__ from None  # the process dies of the user's error: the supervisor reports how
    described = loaded.describe()  # the baseline as a worker's: Python, torch and the script, no more
    described["context_bytes"] = runtime_context_bytes(loaded.backend)
    import torch._subclasses.fake_tensor  # noqa: F401 - after the baseline: a worker never loads them
    import torch.distributed._tools.mem_tracker  # noqa: F401

    if not message.get("beside_probes", True):
        _run_in_slices()
    channel.send(ok_reply(**described))

    device = loaded.backend.torch_device()
    programs = TracedPrograms(lambda config, traced=False: estimate_for(loaded.fn, config, device, target, traced))

    def estimate(request: dict) -> dict:
        for config in request["configs"]:
            config = Config.from_dict(config)
            if request.get("traced"):
                channel.send(ok_reply(estimate=_traced(programs, config)))
            else:
                channel.send(ok_reply(estimate=estimate_for(loaded.fn, config, device, target)))
        return ok_reply(done=True)

    return serve(channel, {"estimate": estimate})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
