"""The memory of the kernels a target device runs, counted on fake CPU tensors: the estimator always
runs the function on the CPU (no GPU needed, none spent), but a CUDA run keeps what CUDA's kernels
keep, not the CPU's, and takes the branches a script takes on CUDA.

- The device: the function's `run.device` is `cuda:0`, so a script that picks its autocast, its fused
  optimizer or its pinned copies by the device's type (nanoGPT's `device_type`) takes its CUDA branch.
  Its tensors stay fake CPU tensors: a tensor or module sent to CUDA (`.to`, `.cuda()`, a `device=`
  of a factory) goes to the CPU, `torch.autocast("cuda")` is the CPU's autocast at the same dtype, and
  pinning is skipped (a CPU-only PyTorch has no CUDA device to pin for). The torch.cuda API itself
  (`torch.cuda.is_available()` and the like) is left as it is.

- Attention (`F.scaled_dot_product_attention`): on CUDA the flash or memory-efficient kernel runs with
  dropout inside it, keeping the output and a logsumexp of batch x heads x length, never the length x
  length scores. The CPU's fused kernel keeps exactly that but refuses dropout, so with dropout the CPU
  runs the math path, whose scores, softmax and dropout mask are a few bytes x batch x heads x length²
  (GPT-2 small at bf16 b=16: 40.3 GiB of activations so, 12.8 GiB without). For a CUDA target the
  attention runs without its dropout, on the CPU's fused kernel: dropout changes values, not the bytes
  a fused kernel keeps. Where the CPU's fused kernel refuses the inputs for another reason, the math
  path's memory is counted: an estimate over, never under.
- Saved tensors sent to the host (a run's activation offload, autofit.runtime's `ActivationOffload`, and a
  script's own `torch.autograd.graph.save_on_cpu`): on CUDA each copy leaves the device until backward copies
  it back, where on the CPU it is a second CPU tensor. For a CUDA target a saved tensor is kept as its size
  alone (its host copy, not the device's memory), and backward makes a new tensor of it on the device. The
  run's offload keeps its own rules (what it leaves on the device, the block it holds while the next one runs,
  the block it brings back early): only its copies are the estimator's.
- Autocast: CUDA's runs more ops in float32 than the CPU's (PyTorch's AMP op reference, "CUDA Ops that can
  autocast to float32": `pow`, `exp`, `rsqrt`, `layer_norm`, `softmax`, ...): GPT-2's GELU (`pow(x, 3)`, then
  `tanh`) keeps float32 tensors where the CPU's keeps bfloat16 ones, a sixth of its activations. For a CUDA
  target the CPU's autocast runs those ops as CUDA's does (`_cuda_autocast_ops`).
- Optimizers: without `foreach=` or `fused=`, PyTorch's optimizers step CUDA tensors with the foreach
  kernels (temporaries the size of every parameter of a group at once) and CPU tensors one parameter
  at a time. For a CUDA target the CPU is treated as a foreach device, so the step's temporaries are
  CUDA's. A `fused=True` optimizer keeps no temporaries on either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autofit.runtime import OffloadTransport, offload_transport

#: The targets whose kernels the estimate can count: the CPU it runs on, and CUDA.
TARGETS = ("cpu", "cuda")


@contextmanager
def target_kernels(target: str) -> Iterator[None]:
    """Within it, the function's steps keep the memory `target`'s kernels keep (nothing changes for
    the CPU)."""
    if target not in TARGETS:
        raise ValueError(f"the estimator counts the kernels of {' or '.join(TARGETS)}, but got {target!r}")
    if target == "cpu":
        yield
        return
    with _fused_attention(), _foreach_steps(), _saved_on_the_host(), offload_transport(_HostSizes), \
            _cuda_on_the_cpu(), _cuda_autocast_ops():
        yield


#: The device a CUDA target's function is given (its tensors are the CPU's: `target_kernels`).
CLAIMED_CUDA = "cuda:0"


def _on_cpu(value: Any) -> Any:
    """`value` with a CUDA device (a torch.device, "cuda", "cuda:1") replaced by the CPU."""
    if isinstance(value, torch.device) and value.type == "cuda":
        return _CPU
    if isinstance(value, str) and value.split(":")[0] == "cuda":
        return _CPU
    return value


_CPU = torch.device("cpu")


class _CudaOnTheCpu(TorchDispatchMode):
    """Factories and copies asked for a CUDA device make CPU tensors (below it, the fake mode's), and
    pinning one is a no-op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._pin_memory.default:  # nothing to pin for: the tensor as it is
            return args[0]
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _on_cpu(kwargs["device"])}
        return func(*args, **kwargs)


@contextmanager
def _cuda_on_the_cpu() -> Iterator[None]:
    """CUDA's Python entry points that would need a CUDA build, on the CPU (the module's docstring)."""
    autocast = torch.amp.autocast_mode.autocast
    patched = {(torch.Tensor, "to"): lambda original: lambda self, *args, **kwargs: original(
                   self, *map(_on_cpu, args), **{k: _on_cpu(v) for k, v in kwargs.items()}),
               (torch.Tensor, "cuda"): lambda original: lambda self, *args, **kwargs: self.to(
                   _CPU, non_blocking=kwargs.get("non_blocking", False)),
               (torch.nn.Module, "cuda"): lambda original: lambda self, *args, **kwargs: self.to(_CPU),
               (autocast, "__init__"): lambda original: lambda self, device_type, *args, **kwargs: original(
                   self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)}
    originals = {key: getattr(*key) for key in patched}
    for (owner, name), wrap in patched.items():
        setattr(owner, name, wrap(originals[owner, name]))
    try:
        with _CudaOnTheCpu():
            yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


@contextmanager
def _fused_attention() -> Iterator[None]:
    """`F.scaled_dot_product_attention` with CUDA's fused kernels' memory: without dropout, which sends
    the CPU to its math path (a module that called it through `torch.nn.functional` is followed, as are
    `nn.MultiheadAttention` and `nn.TransformerEncoderLayer`, which call it from there)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
        return original(query, key, value, attn_mask, 0.0, is_causal, *args, **kwargs)

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@contextmanager
def _foreach_steps() -> Iterator[None]:
    """The CPU counted among the foreach devices, as CUDA is, when an optimizer picks its default."""
    from torch.optim import optimizer

    original = optimizer._get_foreach_kernels_supported_devices

    def with_cpu() -> list[str]:
        return [*original(), "cpu"]

    optimizer._get_foreach_kernels_supported_devices = with_cpu
    try:
        yield
    finally:
        optimizer._get_foreach_kernels_supported_devices = original


#: Ops CUDA's autocast runs in float32, their lower-precision inputs cast (the AMP op reference's "CUDA Ops that
#: can autocast to float32", those the CPU's autocast leaves as they come: an op with a CPU autocast rule of its
#: own keeps it)...
_CUDA_FLOAT32 = ("pow", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "exp", "expm1", "log", "log10", "log1p",
                 "log2", "reciprocal", "rsqrt", "softplus", "layer_norm", "group_norm", "norm", "cosine_similarity",
                 "dist", "pdist", "renorm", "logsumexp")
#: ... and those it runs with a float32 output, their `dtype` set (no copy of the input).
_CUDA_FLOAT32_OUTPUT = ("softmax", "log_softmax", "cumsum", "cumprod", "sum")
_LOWER = (torch.bfloat16, torch.float16)


@contextmanager
def _cuda_autocast_ops() -> Iterator[None]:
    """The CPU's autocast running `_CUDA_FLOAT32` and `_CUDA_FLOAT32_OUTPUT` as CUDA's autocast does: kernels of
    the CPU's autocast dispatch key for those ops (PyTorch's `torch.library`, as `register_autocast` makes them),
    removed on exit."""
    library = torch.library.Library("aten", "IMPL")
    try:
        for names, output in ((_CUDA_FLOAT32, False), (_CUDA_FLOAT32_OUTPUT, True)):
            for name in names:
                packet = getattr(torch.ops.aten, name, None)
                for overload in packet.overloads() if packet is not None else ():
                    op = getattr(packet, overload)
                    qualified = f"aten::{name}" + (f".{overload}" if overload != "default" else "")
                    if _cuda_rule_only(qualified):
                        library.impl(qualified.split("::")[1], _float32_kernel(op, output), "AutocastCPU", with_keyset=True)
        yield
    finally:
        library._destroy()


def _cuda_rule_only(qualified: str) -> bool:
    """Whether CUDA's autocast has a rule for the op and the CPU's none (an overload only TorchScript knows: no)."""
    try:
        return (torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastCUDA")
                and not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastCPU"))
    except RuntimeError:
        return False


def _float32_kernel(op: Any, output: bool) -> Any:
    """An autocast kernel running `op` in float32 (its inputs cast, or with `output` its dtype set), autocast
    off inside, as CUDA's autocast kernels run."""
    schema = [argument.name for argument in op._schema.arguments]
    where = schema.index("dtype") if output and "dtype" in schema else None

    def kernel(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if output:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if where is not None and first is not None and first.dtype in _LOWER:
                if len(args) > where:
                    if args[where] is None:
                        args = (*args[:where], torch.float32, *args[where + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
        else:
            args = tuple(_float32(a) for a in args)
            kwargs = {k: _float32(v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
            return op(*args, **kwargs)

    return kernel


def _float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOWER:
        return value.float()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_float32(v) for v in value)
    return value


class _SavedOnTheHost(torch.autograd.graph.saved_tensors_hooks):
    """`save_on_cpu` as a CUDA target runs it, in device memory: what a saved tensor leaves on the device is
    nothing (its copy is the host's: its shape alone is kept) until backward copies it back, a new tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # pinning and the device type: the same memory
        def leave(tensor: torch.Tensor) -> tuple:
            return tensor.size(), tensor.dtype, tensor.layout, tensor.device

        def come_back(kept: tuple) -> torch.Tensor:
            size, dtype, layout, device = kept
            return torch.empty(size, dtype=dtype, layout=layout, device=device)

        super().__init__(leave, come_back)


class _HostSizes(OffloadTransport):
    """The run's activation offload as a CUDA target's memory sees it: a storage sent to the host leaves the
    device (its size alone is kept) until backward makes a new one of it there; no stream."""

    def __init__(self, device: torch.device) -> None:
        pass

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"  # the target's tensors are the fake CPU ones

    def to_host(self, flat: torch.Tensor) -> tuple[tuple[int, torch.dtype], None]:
        return (flat.numel(), flat.dtype), None

    def to_device(self, host: tuple[int, torch.dtype]) -> tuple[torch.Tensor, None]:
        return torch.empty(host[0], dtype=host[1]), None

    def wait(self, event: None) -> None:
        pass


@contextmanager
def _saved_on_the_host() -> Iterator[None]:
    """`torch.autograd.graph.save_on_cpu` keeping what a CUDA run keeps on the device (the module's docstring)."""
    graph = torch.autograd.graph
    original = graph.save_on_cpu
    graph.save_on_cpu = _SavedOnTheHost
    try:
        yield
    finally:
        graph.save_on_cpu = original
