"""The memory estimator's process: the user's function runs two optimizer steps per config on fake
tensors (PyTorch's FakeTensorMode: shapes and dtypes, no storage), under PyTorch's MemTracker, which
sorts every tensor it sees into parameters, gradients, optimizer state, activations and temporaries.

    python -m autofit.memory._estimate_process FD
        (FD: its end of the channel to autofit.memory._estimator.Estimator: a load request, then
        requests of configs; each config's estimate is sent as soon as it is known)

Two steps, because the optimizer's state appears in the first step and the peak of a steady step
holds it. The data is read for real (outside the fake mode, through Run.data_context); the model,
the step and the optimizer never allocate. A separate process, so that anything the estimator
cannot handle (a crash in fake tensors, a function that reads a tensor's value) costs nothing.
"""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager
from typing import Any

#: MemTracker's categories -> the breakdown autofit shows.
_CATEGORIES = {"PARAM": "parameters", "BUFFER": "parameters", "GRAD": "gradients", "OPT": "optimizer",
               "ACT": "activations", "TEMP": "temporaries", "OTH": "other"}


def estimate_one(fn: Any, config: Any, device: Any) -> dict:
    """Peak tensor bytes of two steps of `fn` under `config`, by category; or why there is none."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.mem_tracker import MemTracker

    from autofit.runtime import ProbeFinished, Run

    run = Run(config, device, probing=True, warmup_steps=1, measured_steps=1, min_measure_s=0.0,
              max_measured_steps=1)
    run.compile_enabled = False  # fake tensors through inductor: estimated as the eager model
    tracker = MemTracker()
    tracking = []

    @contextmanager
    def read_data_then_track():
        """Data for real; the tracker from the first batch on: entered earlier, its weak references
        to the new parameters would stop `model.to(device)` from swapping them."""
        with unset_fake_temporarily():
            yield
        if not tracking:
            tracking.append(tracker.__enter__())

    run.data_context = read_data_then_track
    step_taken, backward = run.step_taken, run.backward
    seen_optimizers: set[int] = set()

    def step_taken_then_reset(samples: int, tokens: int = 0) -> None:
        step_taken(samples, tokens)  # ends the run (ProbeFinished) after the second step
        tracker.reset_mod_stats()  # MemTracker follows one iteration of each module at a time

    def backward_tracking_parameters(loss, optimizer, **kwargs):
        if id(optimizer) not in seen_optimizers:  # its parameters (and their gradients) by name
            seen_optimizers.add(id(optimizer))
            params = [p for group in optimizer.param_groups for p in group["params"]]
            tracker.track_external(torch.nn.ParameterList(params), optimizer)
        return backward(loss, optimizer, **kwargs)

    run.step_taken = step_taken_then_reset
    run.backward = backward_tracking_parameters
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), _moves_in_place(), run.active():
            try:
                fn(run)
            except ProbeFinished:
                pass
            finally:
                if tracking:
                    tracker.__exit__(None, None, None)
    except Exception as exc:  # noqa: BLE001 - the estimate is unavailable, and the reason is reported
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400],
                "traceback": traceback.format_exc()[-3000:]}
    if run.clock.steps_done < 2:
        return {"ok": False, "error": f"the function returned after {run.clock.steps_done} optimizer steps "
                                      f"of the two an estimate runs"}
    breakdown = dict.fromkeys(_CATEGORIES.values(), 0)
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for key, value in per_device.items():
            name = _CATEGORIES.get(getattr(key, "name", str(key)))
            if name is not None:
                breakdown[name] += int(value)
    return {"ok": True, "breakdown": breakdown, "knobs": run.knobs.to_dict()}


@contextmanager
def _moves_in_place():
    """`module.to(device)` of a model already there returns it as it is: PyTorch swaps fake
    parameters into new ones, which fails while the fake mode holds references to them."""
    import itertools

    import torch

    original = torch.nn.Module.to

    def to(module, *args, **kwargs):
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        tensors = itertools.chain(module.parameters(), module.buffers())
        if dtype is None and memory_format is None and all(
                device is None or (t.device.type == device.type and device.index in (None, t.device.index))
                for t in tensors):
            return module
        return original(module, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


def main(argv: list[str]) -> int:
    """Load the script once (as every child does: autofit.probing's bootstrap, without a memory cap,
    since no tensor here has storage), say so, then answer each request of configs with one message
    per estimate (what is done reaches the supervisor before a crash) and a last one. Ends when the
    channel closes."""
    import torch._subclasses.fake_tensor  # noqa: F401 - loaded now, while the search's workers load too
    import torch.distributed._tools.mem_tracker  # noqa: F401

    from autofit.config import Config
    from autofit.probing import Channel, LoadRequest, ScriptError, bootstrap, ok_reply, serve

    channel = Channel.from_fd(int(argv[1]))
    message = channel.receive()
    if message is None or message["op"] != "load":
        return 0
    try:
        loaded = bootstrap(LoadRequest.from_wire(message["request"]), cap_memory=False)
    except ScriptError as exc:
        raise exc.__cause__ from None  # the process dies of the user's error: the supervisor reports how
    channel.send(ok_reply(**loaded.describe()))
    device = loaded.backend.torch_device()

    def estimate(request: dict) -> dict:
        for config in request["configs"]:
            channel.send(ok_reply(estimate=estimate_one(loaded.fn, Config.from_dict(config), device)))
        return ok_reply(done=True)

    return serve(channel, {"estimate": estimate})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
