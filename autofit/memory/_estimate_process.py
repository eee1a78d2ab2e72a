"""The memory estimator's process: the user's function runs two optimizer steps per config on fake
tensors (PyTorch's FakeTensorMode: shapes and dtypes, no storage), under PyTorch's MemTracker, which
sorts every tensor it sees into parameters, gradients, optimizer state, activations and temporaries.

    python -m autofit.memory._estimate_process --serve READY SCRIPT FUNCTION DEVICE INDEX
        (then one request path per line on stdin; see autofit.memory._estimator.Estimator)

Two steps, because the optimizer's state appears in the first step and the peak of a steady step
holds it. The data is read for real (outside the fake mode, through Run.data_context); the model,
the step and the optimizer never allocate. A separate process, so that anything the estimator
cannot handle (a crash in fake tensors, a function that reads a tensor's value) costs nothing.
"""

from __future__ import annotations

import json
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


def serve(ready_path: str, script: str, function: str, device: str, index: str) -> int:
    """Load the script once, say so (the `ready` file), then answer each request whose path comes on
    stdin: its configs' estimates in REQUEST.out, written after each one (what is done survives a
    crash), then REQUEST.done. Ends when stdin closes."""
    import torch._subclasses.fake_tensor  # noqa: F401 - loaded now, while the search's workers load too
    import torch.distributed._tools.mem_tracker  # noqa: F401

    from autofit.config import Config
    from autofit.devices import make_backend
    from autofit.probing import find_function, load_script

    backend = make_backend(device, int(index))
    fn = find_function(load_script(script), function or None, script)
    options = getattr(fn, "options", None)
    backend.release()
    loaded = {"baseline_bytes": backend.used_bytes(), "options": options.__dict__ if options else None,
              "function": getattr(fn, "__name__", function)}
    open(ready_path, "w").close()
    for line in sys.stdin:
        request_path = line.strip()
        with open(request_path) as handle:
            request = json.load(handle)
        reply = {**loaded, "estimates": []}
        for config in request["configs"]:
            reply["estimates"].append(estimate_one(fn, Config.from_dict(config), backend.torch_device()))
            with open(request_path + ".out", "w") as handle:
                json.dump(reply, handle)
        if not request["configs"]:
            with open(request_path + ".out", "w") as handle:
                json.dump(reply, handle)
        open(request_path + ".done", "w").close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 7:
        sys.exit("usage: python -m autofit.memory._estimate_process --serve READY SCRIPT FUNCTION DEVICE INDEX")
    sys.exit(serve(*sys.argv[2:]))
