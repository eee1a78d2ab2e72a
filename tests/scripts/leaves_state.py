"""A train function that leaves one kind of process state behind ($LEAVES names which) and stops
with an error when it finds what an earlier call in the same process left: run twice in one
process (`--probe-process persistent`, CUDA's model), the second probe must start as the first did.

$FIRST_DRAW is a file: the first call writes its first random draw there, later calls compare."""

import os
import random
import sys

import torch
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils._python_dispatch import TorchDispatchMode

from autofit import autofit

LEAVES = os.environ.get("LEAVES", "")
CALLS = 0  # rebound by the function: a fresh process always starts at 0
model_at_import = torch.nn.Linear(8, 1) if LEAVES == "module_model" else None


class Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _leftovers() -> list[str]:
    """What a fresh process would not show."""
    found = {
        "grad_mode": not torch.is_grad_enabled(),
        "environ": "LEFT_BY_A_PROBE" in os.environ,
        "argv": "--left-by-a-probe" in sys.argv,
        "cudnn": torch.backends.cudnn.benchmark,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "default_dtype": torch.get_default_dtype() != torch.float32,
        "module_hook": bool(module_hooks._global_forward_hooks),
        "optimizer_hook": any(not type(getattr(hook, "__self__", None)).__module__.startswith("autofit.")
                              for hook in optimizer_hooks._global_optimizer_pre_hooks.values()),  # autofit's own follow the run
        "dispatch_mode": torch._C._len_torch_dispatch_stack() > 0,
        "autocast": torch.is_autocast_enabled("cpu"),
        "globals": CALLS != 0,
        "threads": torch.get_num_threads() == 1 and os.environ.get("EXPECT_THREADS", "1") != "1",
        "compiled": "torch._dynamo" in sys.modules and sys.modules["torch._dynamo"].convert_frame.FRAME_COUNTER > 0,
        "anomaly": torch.is_anomaly_enabled(),
        "sdp": not torch.backends.cuda.flash_sdp_enabled() or not torch.backends.cuda.math_sdp_enabled(),
        "reduced_precision": not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
    return [name for name, present in found.items() if present]


def _check_rng() -> list[str]:
    draw = f"{torch.rand(1).item():.8f} {random.random():.8f}"
    path = os.environ.get("FIRST_DRAW")
    if not path:
        return []
    if not os.path.exists(path):
        with open(path, "w") as handle:
            handle.write(draw)
        return []
    with open(path) as handle:
        return [] if handle.read() == draw else ["rng"]


KINDS = ("grad_mode", "environ", "argv", "cudnn", "deterministic", "default_dtype", "module_hook",
         "optimizer_hook", "dispatch_mode", "autocast", "globals", "threads", "anomaly", "sdp", "reduced_precision")


def _leave(kind: str, model: torch.nn.Module) -> None:
    global CALLS
    if kind == "all":
        for each in KINDS:
            _leave(each, model)
    elif kind == "grad_mode":
        torch.set_grad_enabled(False)
    elif kind == "environ":
        os.environ["LEFT_BY_A_PROBE"] = "1"
    elif kind == "argv":
        sys.argv.append("--left-by-a-probe")
    elif kind == "cudnn":
        torch.backends.cudnn.benchmark = True
    elif kind == "deterministic":
        torch.use_deterministic_algorithms(True)
    elif kind == "default_dtype":
        torch.set_default_dtype(torch.float64)
    elif kind == "module_hook":
        module_hooks.register_module_forward_hook(lambda module, args, out: None)
    elif kind == "optimizer_hook":
        optimizer_hooks.register_optimizer_step_pre_hook(lambda opt, args, kwargs: None)
    elif kind == "dispatch_mode":
        Passthrough().__enter__()
    elif kind == "autocast":
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    elif kind == "globals":
        CALLS += 1
    elif kind == "threads":
        torch.set_num_threads(1)
    elif kind == "anomaly":
        torch.autograd.set_detect_anomaly(True)
    elif kind == "sdp":  # a script that picks its attention kernels for the whole process
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
    elif kind == "reduced_precision":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


@autofit(batch_range=(4, 64))
def train(run):
    leftovers = _leftovers() + _check_rng()
    if leftovers:
        raise RuntimeError(f"found what an earlier probe left: {', '.join(leftovers)}")
    model = model_at_import if model_at_import is not None else torch.nn.Linear(8, 1)
    if LEAVES in ("compiled", "all"):
        model = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(run.batch_size, 8), torch.randn(run.batch_size, 1)) for _ in range(4)]
    try:
        while True:
            for x, y in run.batches(data):
                with run.autocast():
                    loss = torch.nn.functional.mse_loss(model(x), y)
                run.backward(loss, opt)
    finally:
        _leave(LEAVES, model)  # runs as the probe ends (ProbeFinished passes through here)
