"""What one probe leaves in its process, taken back before the next: the persistent process model.

On CUDA every probe runs in one long-lived process (a CUDA context cannot be forked), and on the CPU
`--probe-process persistent` does the same; a forked probe starts from the warm process as it was
after the script loaded. `Pristine` is that starting point, captured once after loading and put back
before every probe, so that both process models give a probe the same start:

- random number generators (torch, CUDA, Python's `random`, NumPy's global one);
- grad mode, autocast left entered, default dtype, intra-op threads, deterministic algorithms,
  cuDNN's flags, the float32 matmul/convolution precision (TF32), reduced-precision reductions, the
  attention kernels (flash, memory-efficient, math, cuDNN) and anomaly detection;
- global module and optimizer hooks, and hooks added to the modules the script builds at import;
- torch-function and dispatch modes left entered;
- torch.compile's caches (dynamo's compiled frames and its recompile counts);
- `os.environ` (allocator settings included) and `sys.argv`;
- the script module's global names (a counter the function rebinds, a list it replaces), and the
  contents of the lists, dicts, sets and deques they name (a list the function appends to).

What cannot be put back is said in one line (`carried_over`): objects the script built at import and
the function changed in place, a model's weights first among them.
"""

from __future__ import annotations

import collections
import os
import random
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch.nn.modules import module as _module_hooks
from torch.optim import optimizer as _optimizer_hooks

#: Global hook registries of torch.nn.Module and torch.optim.Optimizer (OrderedDicts keyed by handle id).
_MODULE_HOOKS = ("_global_backward_hooks", "_global_backward_pre_hooks", "_global_buffer_registration_hooks",
                 "_global_forward_hooks", "_global_forward_hooks_always_called",
                 "_global_forward_hooks_with_kwargs", "_global_forward_pre_hooks",
                 "_global_module_registration_hooks", "_global_parameter_registration_hooks")
_OPTIMIZER_HOOKS = ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")
#: Per-module hook dicts (of the modules the script builds at import).
_INSTANCE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                   "_state_dict_hooks", "_load_state_dict_pre_hooks", "_forward_hooks_with_kwargs",
                   "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
#: Switches read and written as plain attributes: (object path, attribute).
_SWITCHES = (("torch.backends.cudnn", "benchmark"), ("torch.backends.cudnn", "deterministic"),
             ("torch.backends.cudnn", "enabled"),
             ("torch.backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
             ("torch.backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"))
#: Switches read and written through functions: (getter, setter) under torch (a script that picks its
#: attention kernels, or debugs with anomaly detection, for its whole process).
_FLAGS = (("backends.cuda.flash_sdp_enabled", "backends.cuda.enable_flash_sdp"),
          ("backends.cuda.mem_efficient_sdp_enabled", "backends.cuda.enable_mem_efficient_sdp"),
          ("backends.cuda.math_sdp_enabled", "backends.cuda.enable_math_sdp"),
          ("backends.cuda.cudnn_sdp_enabled", "backends.cuda.enable_cudnn_sdp"),
          ("is_anomaly_enabled", "autograd.set_detect_anomaly"))
#: The float32 precision switches of PyTorch's current API (torch >= 2.9): the legacy `allow_tf32`
#: flags are never read where they exist (mixing the two APIs raises).
_FP32_SWITCHES = ("torch.backends", "torch.backends.cuda.matmul", "torch.backends.cudnn",
                  "torch.backends.cudnn.conv", "torch.backends.cudnn.rnn", "torch.backends.mkldnn",
                  "torch.backends.mkldnn.matmul", "torch.backends.mkldnn.conv", "torch.backends.mkldnn.rnn")
_LEGACY_TF32 = (("torch.backends.cuda.matmul", "allow_tf32"), ("torch.backends.cudnn", "allow_tf32"))


def _resolve(path: str) -> Any:
    target: Any = torch
    for part in path.split(".")[1:]:
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _registries(module: ModuleType, names: tuple[str, ...]) -> dict[str, dict]:
    return {name: getattr(module, name) for name in names if isinstance(getattr(module, name, None), dict)}


@dataclass
class Pristine:
    """The process as a probe must find it (see the module docstring)."""

    script: ModuleType | None
    rng: dict[str, Any] = field(default_factory=dict)
    switches: dict[tuple[str, str], Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    hook_keys: dict[int, tuple[dict, set]] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    script_globals: dict[str, Any] = field(default_factory=dict)
    models: list[tuple[str, torch.nn.Module, dict[int, int]]] = field(default_factory=list)
    containers: list[tuple[Any, Any]] = field(default_factory=list)
    threads: int = 1
    grad_enabled: bool = True
    default_dtype: torch.dtype = torch.float32
    deterministic: tuple[bool, bool] = (False, False)
    modes: tuple[int, int] = (0, 0)
    autocast: dict[str, tuple[bool, torch.dtype]] = field(default_factory=dict)

    @classmethod
    def capture(cls, script: ModuleType | None) -> Pristine:
        state = cls(script=script)
        state.rng = _rng_state()
        state.switches = _read_switches()
        state.flags = _read_flags()
        state.environ, state.argv = dict(os.environ), list(sys.argv)
        state.threads, state.grad_enabled = torch.get_num_threads(), torch.is_grad_enabled()
        state.default_dtype = torch.get_default_dtype()
        state.deterministic = (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled())
        state.modes = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
        state.autocast = {name: (torch.is_autocast_enabled(name), torch.get_autocast_dtype(name))
                          for name in ("cpu", "cuda")}
        registries = {**_registries(_module_hooks, _MODULE_HOOKS),
                      **_registries(_optimizer_hooks, _OPTIMIZER_HOOKS)}
        if script is not None:
            state.script_globals = dict(vars(script))
            for name, value in state.script_globals.items():
                if type(value) in _CONTAINERS and not name.startswith("__"):  # never __builtins__
                    state.containers.append((value, _CONTAINERS[type(value)][0](value)))
                if isinstance(value, torch.nn.Module):
                    state.models.append((name, value, _versions(value)))
                    for sub in value.modules():
                        registries.update({f"{id(sub)}.{h}": getattr(sub, h) for h in _INSTANCE_HOOKS
                                           if isinstance(getattr(sub, h, None), dict)})
        state.hook_keys = {id(registry): (registry, set(registry)) for registry in registries.values()}
        return state

    def restore(self) -> None:
        """Put the process back as it was captured (what can be put back)."""
        _pop_modes(*self.modes)
        _reset_compiled()
        for name, (enabled, dtype) in self.autocast.items():  # an autocast entered and never left
            torch.set_autocast_enabled(name, enabled)
            torch.set_autocast_dtype(name, dtype)
        torch.clear_autocast_cache()
        for registry, keys in self.hook_keys.values():
            for key in set(registry) - keys:
                del registry[key]
        _write_switches(self.switches)
        _write_flags(self.flags)
        torch.set_grad_enabled(self.grad_enabled)
        torch.set_default_dtype(self.default_dtype)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if os.environ != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        sys.argv[:] = self.argv
        if self.script is not None:
            namespace = vars(self.script)
            for name in set(namespace) - set(self.script_globals):
                del namespace[name]
            namespace.update(self.script_globals)
        for container, contents in self.containers:
            _CONTAINERS[type(container)][1](container, contents)
        _set_rng_state(self.rng)

    def carried_over(self) -> str | None:
        """One line naming what the script built at import and a probe changed in place, or None."""
        changed = [name for name, model, versions in self.models if _versions(model) != versions]
        if not changed:
            return None
        names = ", ".join(f"`{name}`" for name in changed)
        return (f"the script builds {names} at import and the function trains it in place: in one process its "
                f"weights carry over from probe to probe (speed and memory are measured as usual; build the "
                f"model inside the function for every probe to start from the same weights)")


def _refill(container: Any, contents: Any) -> None:
    add = container.extend if isinstance(container, list | collections.deque) else container.update
    container.clear()
    add(contents)


#: The containers whose contents are put back in place: type -> (copy, refill).
_CONTAINERS: dict[type, tuple[Any, Any]] = {
    kind: (kind.copy, _refill) for kind in (list, dict, set, collections.OrderedDict, collections.defaultdict)}
_CONTAINERS[collections.deque] = (list, _refill)


def _versions(model: torch.nn.Module) -> dict[int, int]:
    """Each parameter's and buffer's version counter: an in-place update (an optimizer step) bumps it."""
    return {id(t): t._version for t in (*model.parameters(), *model.buffers())}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.random.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.random.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _function(path: str) -> Any:
    target: Any = torch
    for part in path.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _read_flags() -> dict[str, Any]:
    values = {}
    for getter, setter in _FLAGS:
        read = _function(getter)
        if read is not None and _function(setter) is not None:
            values[setter] = read()
    return values


def _write_flags(values: dict[str, Any]) -> None:
    for setter, value in values.items():
        _function(setter)(value)


def _read_switches() -> dict[tuple[str, str], Any]:
    values: dict[tuple[str, str], Any] = {}
    new_api = hasattr(torch.backends.cuda.matmul, "fp32_precision")
    pairs = list(_SWITCHES) + ([(path, "fp32_precision") for path in _FP32_SWITCHES] if new_api else list(_LEGACY_TF32))
    for path, attribute in pairs:
        target = _resolve(path)
        if target is not None and hasattr(target, attribute):
            try:
                values[(path, attribute)] = getattr(target, attribute)
            except RuntimeError:  # a switch this build refuses to read: left as it is
                continue
    return values


def _write_switches(values: dict[tuple[str, str], Any]) -> None:
    for (path, attribute), value in values.items():
        target = _resolve(path)
        try:
            if getattr(target, attribute) != value:
                setattr(target, attribute, value)
        except RuntimeError:
            continue


def _pop_modes(functions: int, dispatches: int) -> None:
    """Leave the torch-function and dispatch modes a probe entered and never left."""
    from torch.overrides import _pop_mode as pop_function_mode
    from torch.utils._python_dispatch import _pop_mode as pop_dispatch_mode

    while torch._C._len_torch_dispatch_stack() > dispatches:
        pop_dispatch_mode()
    while torch._C._len_torch_function_stack() > functions:
        pop_function_mode()


def _reset_compiled() -> None:
    """Forget torch.compile's compiled frames, guards and recompile counts (only if it was used)."""
    if "torch._dynamo" in sys.modules:
        torch.compiler.reset()
