"""The kernel of `scaled_dot_product_attention` as a knob (`Config.sdpa_backend`): which kernels can run a
function's attention is noted in a probe, and the one a config names is preferred for the whole run.

PyTorch picks a kernel per call (flash, memory-efficient, cuDNN or math on a GPU; flash or math on a CPU) by
the call's dtype, shapes and mask. The pick is not always the fastest, and some kernels build a plan per shape
(cuDNN's graphs), which variable lengths pay at almost every batch; so a search tries the others on its leader.

- Noting (`watch_attention`, a probe's only): `torch.nn.functional.scaled_dot_product_attention` is wrapped for
  the run's lifetime, the original put back at its end. At a call of a kind not seen before (device, dtype as
  autocast casts it, head sizes, mask, dropout, causality) it asks PyTorch which kernels would take it
  (`torch._fused_sdp_choice` under each kernel alone: no attention is computed) and notes, in the run's offers,
  those that take every kind of call, the one PyTorch picks left out (`Offers.sdpa_backends`): none where one
  kernel runs it all. Under torch.compile's tracing the wrapper only calls the original, so a compiled graph is
  the same with or without it. Calls through a name bound before the probe began (`from torch.nn.functional
  import scaled_dot_product_attention` at a module's top, imported earlier) are not seen: the knob is then not
  searched, and nothing else changes.
- Applying (`attention_scope`, every run: probe and normal run alike): `torch.nn.attention.sdpa_kernel` with the
  config's kernel and math enabled for the run's lifetime (math takes a call the kernel cannot), as the user
  would wrap the loop; the flags are put back at its end. None (the default) changes nothing.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

#: The config's names of torch.nn.attention.SDPBackend's kernels (autofit.config.SDPA_BACKENDS).
_KERNELS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
#: The kernels a device type has (what the device runs of them at all; a call may still need math).
_DEVICE_KERNELS = {"cpu": ("math", "flash")}


def _backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _KERNELS[name])


@contextlib.contextmanager
def attention_scope(backend: str | None) -> Iterator[None]:
    """The run's attention under `backend` (a name of autofit.config.SDPA_BACKENDS), with math for the calls it
    cannot take; None: PyTorch's own choice, nothing changed."""
    if backend is None:
        yield
        return
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(list(dict.fromkeys([_backend(backend), _backend("math")]))):
        yield


class AttentionWatch:
    """The kernels that take every kind of attention call a probe's function made (`saw`), noted in `offers`
    (the run's `Knobs`) as `sdpa_backends`: those other than PyTorch's own pick, where there is one."""

    def __init__(self, offers: Any) -> None:
        self._offers = offers
        self._kinds: set[tuple] = set()
        self._runs: set[str] | None = None  # the kernels that took every kind seen
        self._picked: set[str] = set()  # PyTorch's own picks

    def saw(self, args: tuple, kwargs: dict) -> None:
        """A call of scaled_dot_product_attention with these arguments (checked once per kind of call)."""
        call = _Call.of(args, kwargs)
        if call is None or call.kind in self._kinds:
            return
        self._kinds.add(call.kind)
        runs, picked = call.kernels()
        self._runs = runs if self._runs is None else self._runs & runs
        self._picked |= picked
        others = sorted(self._runs - self._picked, key=list(_KERNELS).index)
        self._offers.sdpa_backends = others or None


class _Call:
    """One call's inputs as autocast hands them to the kernel."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, dropout: float,
                 causal: bool, scale: Any, gqa: bool) -> None:
        self.query, self.key, self.value, self.mask = query, key, value, mask
        self.dropout, self.causal, self.scale, self.gqa = dropout, causal, scale, gqa
        device = query.device.type
        self.dtype = query.dtype
        if query.dtype == torch.float32 and torch.is_autocast_enabled(device):
            self.dtype = torch.get_autocast_dtype(device)  # autocast casts the inputs before the kernel sees them
        self.kind = (device, self.dtype, query.dim(), query.shape[-1], value.shape[-1], key.shape[-2] == query.shape[-2],
                     None if mask is None else mask.dtype, dropout > 0, causal, gqa, query.requires_grad)

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> _Call | None:
        """The call's inputs by the function's signature (query, key, value, attn_mask=None, dropout_p=0.0,
        is_causal=False, scale=None, enable_gqa=False); None where they are not plain tensors."""
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        given = {**dict(zip(names, args)), **kwargs}
        tensors = [given.get(n) for n in names[:3]]
        if not all(isinstance(t, torch.Tensor) for t in tensors) or tensors[0].dim() < 2:
            return None
        return cls(*tensors, given.get("attn_mask"), float(given.get("dropout_p") or 0.0),
                   bool(given.get("is_causal", False)), given.get("scale"), bool(given.get("enable_gqa", False)))

    def kernels(self) -> tuple[set[str], set[str]]:
        """(the kernels that take this call, PyTorch's own pick among them)."""
        from torch.nn.attention import sdpa_kernel

        q, k, v = (t if t.dtype == self.dtype else torch.empty(t.shape, dtype=self.dtype, device=t.device)
                   for t in (self.query, self.key, self.value))
        names = _DEVICE_KERNELS.get(q.device.type, tuple(_KERNELS))
        runs, picked = set(), set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each kernel that cannot take the call warns why
            choice = self._choice(q, k, v)
            picked |= {n for n in names if choice == _backend(n).value}
            for name in names:
                with sdpa_kernel([_backend(name)]):
                    if self._choice(q, k, v) == _backend(name).value:
                        runs.add(name)
        return runs, picked

    def _choice(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int | None:
        try:  # private, but the one question PyTorch answers without running the attention
            return int(torch._fused_sdp_choice(q, k, v, self.mask, self.dropout, self.causal, scale=self.scale,
                                               enable_gqa=self.gqa))
        except (RuntimeError, TypeError):
            return None


_watch: AttentionWatch | None = None
_original: Any = None


def _watched(*args: Any, **kwargs: Any) -> Any:
    """`scaled_dot_product_attention` while a probe watches: its call noted, then the original's answer."""
    watch = _watch
    if watch is not None and not torch.compiler.is_compiling():
        try:
            watch.saw(args, kwargs)
        except Exception:  # noqa: BLE001 - a note for the search, never a reason for the user's step to fail
            pass
    return (_original or torch.nn.functional.scaled_dot_product_attention)(*args, **kwargs)


@contextlib.contextmanager
def watch_attention(offers: Any) -> Iterator[None]:
    """A probe's lifetime with its attention calls noted in `offers` (AttentionWatch); the function is back as it
    was at the end, whatever happened."""
    global _watch, _original
    import torch.nn.functional as functional

    if _watch is not None:  # a run inside a run (never in autofit's own): the outer one notes
        yield
        return
    _original = functional.scaled_dot_product_attention
    _watch = AttentionWatch(offers)
    functional.scaled_dot_product_attention = _watched
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = _original
        _watch = None
