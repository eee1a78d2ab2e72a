"""Fake tensors that answer what a training loop reads from them, for the memory estimator.

PyTorch's FakeTensorMode has shapes, not values: `loss.item()`, `float(norm)`, `if not
torch.isfinite(norm)`, GradScaler's check for infinities and `torch.where(mask)` all stop it
(DataDependentOutputException, DynamicOutputShapeException). A loss's value does not change memory,
so `ValueFreeFakeMode` answers the value reads with a harmless one, and data-dependent sizes with a
guess, and keeps notes of what it guessed:

- a value: FakeTensorMode's own constant where it kept one; what a tensor was built to hold where
  known (`torch.full(0.0)`: GradScaler's `found_inf`, the isnan/isinf/isfinite family: a finite
  loss, followed through casts, views, any/all and logical not); otherwise 1 (1.0, True): a finite,
  positive loss or norm. A value plus or minus a number holds that much more or less, so a window's
  ends read apart are as far apart as the script asked (nanoGPT's `data[i:i + block_size]`: each end
  read alone as 1 made every batch empty).
- a size (`nonzero`, `torch.where(mask)`, boolean indexing, `masked_select`): from how dense the
  mask is where that is known (`chosen == e` over top-k or argmax indices of n choices: 1/n, a
  balanced router), otherwise every element (an upper bound). `unique`: every element.

A ShapeEnv with unbacked symbols (what torch.export does) would keep sizes symbolic, but a Python
`if` over them still needs a value, and memory needs a number: so concrete answers, noted.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

aten = torch.ops.aten
prims = torch.ops.prims

#: Ops whose output holds its (first) input's value or density hint.
_SAME_HINT = {
    aten.clone.default, aten._to_copy.default, aten.detach.default, aten.alias.default, aten.view.default,
    aten._unsafe_view.default, aten.reshape.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.unsqueeze.default, aten.expand.default, aten.select.int, aten.slice.Tensor, aten.any.default,
    aten.all.default, aten.any.dim, aten.all.dim, aten.amax.default, aten.amin.default, aten.max.default,
    aten.min.default, aten.lift_fresh_copy.default, aten.t.default, aten.transpose.int, aten.permute.default,
    aten.contiguous.default, aten.flatten.using_ints, aten.as_strided.default, aten.unbind.int,
    prims.convert_element_type.default,
}
_EITHER = {aten.logical_or.default, aten.bitwise_or.Tensor}
_BOTH = {aten.logical_and.default, aten.bitwise_and.Tensor, aten.mul.Tensor}
_NEGATE = {aten.logical_not.default, aten.bitwise_not.default}
_NOT_FINITE = {aten.isnan.default, aten.isinf.default, aten.isposinf.default, aten.isneginf.default}
_DYNAMIC = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
            aten.unique_consecutive.default, aten.argwhere.default}
_HINT = "_autofit_hint"
#: A scalar read plus or minus a number holds the value read, shifted (a window's end from its start).
_SHIFT = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar}
#: In-place ops after which a tensor still holds what it was built to: GradScaler's unscaling writes
#: `found_inf` only where a gradient is not finite, which a fake step's never is.
_KEEPS_VALUE = {aten._amp_foreach_non_finite_check_and_unscale_.default, aten.fill_.Scalar, aten.zero_.default}


class ValueFreeFakeMode(FakeTensorMode):
    """FakeTensorMode that reads values and data-dependent sizes as described in the module's docstring;
    `notes` says which sizes it guessed, once per op and way of guessing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.notes: dict[str, str] = {}
        self._entered = 0  # the mode enters itself again inside its dispatch

    def __enter__(self):
        # `f"{loss:.4f}"`: Tensor.__format__ reads a 0-d tensor's value only for a plain Tensor, so a fake
        # one refuses any format spec (nanoGPT's evaluation line); here it formats its harmless value.
        if self._entered == 0:
            FakeTensor.__format__ = _format_value
        self._entered += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._entered -= 1
        if self._entered == 0:
            del FakeTensor.__format__  # Tensor's own again
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten._local_scalar_dense.default, aten.item.default):
            return self._value(args[0])
        if func in _DYNAMIC:
            return self._dynamic(func, types, args, kwargs)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        _hint_output(func, args, kwargs, out)
        return out

    def _value(self, tensor: torch.Tensor) -> float | int | bool:
        constant = getattr(tensor, "constant", None)
        if constant is not None:
            return constant.item()
        kind, value = getattr(tensor, _HINT, ("value", 1))
        value = value if kind == "value" else 1
        if tensor.dtype == torch.bool:
            return bool(value)
        return float(value) if tensor.dtype.is_floating_point or tensor.dtype.is_complex else int(value)

    def _dynamic(self, func, types, args, kwargs):
        """A data-dependent size: the guess the module's docstring describes, as a fake tensor."""
        base = args[0]
        name = func.overloadpacket.__name__
        if func in (aten.nonzero.default, aten.argwhere.default):
            count = _count_true(base)
            self._note(name, base, count)
            return self._empty((count, base.dim()), torch.long, base.device, types)
        if func is aten.masked_select.default:
            mask = args[1]
            shape = torch.broadcast_shapes(base.shape, mask.shape)
            count = min(_count_true(mask) * math.prod(shape) // max(1, mask.numel()), math.prod(shape))
            self._note(name, mask, count)
            return self._empty((count,), base.dtype, base.device, types)
        # unique: every element distinct (an upper bound); inverse and counts as unique returns them
        self.notes.setdefault(name, f"`{name}` has a data-dependent size: taken at its upper bound (every element)")
        count = base.numel() if func is not aten.unique_dim.default else base.shape[kwargs.get("dim", args[1])]
        values_shape = (count,) if func is not aten.unique_dim.default else tuple(
            count if i == kwargs.get("dim", args[1]) else s for i, s in enumerate(base.shape))
        values = self._empty(values_shape, base.dtype, base.device, types)
        inverse = self._empty(tuple(base.shape) if func is not aten.unique_dim.default else (count,), torch.long,
                              base.device, types)
        counts = self._empty((count,), torch.long, base.device, types)
        return values, inverse, counts

    def _note(self, name: str, mask: torch.Tensor, count: int) -> None:
        how = "from its mask's known density" if getattr(mask, _HINT, ("",))[0] == "density" else \
            "taken at its upper bound (every element)"
        self.notes.setdefault(f"{name} {how}", f"`{name}` has a data-dependent size: {how}")

    def _empty(self, shape: tuple, dtype: torch.dtype, device: torch.device, types) -> torch.Tensor:
        return super().__torch_dispatch__(aten.empty.memory_format, types, (list(shape),),
                                          {"dtype": dtype, "device": device})


def _format_value(tensor: torch.Tensor, spec: str) -> str:
    if tensor.dim() == 0:
        return format(tensor.item(), spec)
    return torch.Tensor.__format__(tensor, spec)


def _count_true(mask: torch.Tensor) -> int:
    kind, value = getattr(mask, _HINT, ("", None))
    if kind == "density":
        return min(mask.numel(), math.ceil(mask.numel() * value))
    if kind == "value":
        return mask.numel() if value else 0
    return mask.numel()


def _hint_output(func, args, kwargs, out) -> None:
    """What the output of `func` is known to hold (see the module's docstring), as an attribute."""
    hint = None
    source = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if source is not None and func._schema.is_mutable and func not in _KEEPS_VALUE and hasattr(source, _HINT):
        delattr(source, _HINT)  # `acc += x`: what it was built to hold is gone
    if func in (aten.full.default, aten.full_like.default, aten.fill_.Scalar):
        hint = ("value", args[1])
    elif func in (aten.zeros.default, aten.zeros_like.default, aten.zero_.default):
        hint = ("value", 0)
    elif func in (aten.ones.default, aten.ones_like.default):
        hint = ("value", 1)
    elif func in _NOT_FINITE:
        hint = ("value", False)
    elif func is aten.isfinite.default:
        hint = ("value", True)
    elif func is aten.eq.Tensor and len(args) > 1 and args[0] is args[1]:
        hint = ("value", True)  # x == x: no NaN (isfinite's decomposition)
    elif func in (aten.eq.Scalar, aten.ne.Scalar) and len(args) > 1 and args[1] in (math.inf, -math.inf):
        hint = ("value", func is aten.ne.Scalar)  # abs(x) != inf: finite
    elif func is aten.topk.default:
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        _set(out[1], ("uniform", source.shape[dim]))
        return
    elif func in _SHIFT and source is not None and source.dim() == 0 and kwargs.get("alpha", 1) == 1 \
            and (offset := _number(args[1] if len(args) > 1 else None)) is not None \
            and getattr(source, _HINT, ("value", 1))[0] == "value":
        # `data[i:i + block_size]` over a read index `i`: the end is the start plus the block, both read
        # (scalars only: a mask's `x - 1` read as 0 would guess its nonzero count at 0, under the truth)
        value = getattr(source, _HINT, ("value", 1))[1]
        hint = ("value", value + offset if func in (aten.add.Tensor, aten.add.Scalar) else value - offset)
    elif func in (aten.argmax.default, aten.argmin.default):
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        hint = ("uniform", source.shape[dim] if dim is not None else source.numel())
    elif source is not None and (known := getattr(source, _HINT, None)) is not None:
        kind, value = known
        if func in _SAME_HINT:
            hint = known
        elif func in _NEGATE and kind == "value":
            hint = ("value", not value)
        elif func in _NEGATE and kind == "density":
            hint = ("density", 1 - value)
        elif kind == "uniform" and func in (aten.eq.Scalar, aten.ne.Scalar, aten.eq.Tensor, aten.ne.Tensor):
            # chosen == e, or one_hot(chosen, n) (chosen == arange(n)): one of n values matches
            density = 1 / max(1, value)
            hint = ("density", density if func in (aten.eq.Scalar, aten.eq.Tensor) else 1 - density)
        elif kind == "value" and not value and func in (aten.sum.default, aten.sum.dim_IntList):
            hint = ("value", 0)  # torch.isnan(x).sum(): no NaN counted
        elif kind == "value" and (func in _EITHER or func in _BOTH) and len(args) > 1:
            other = getattr(args[1], _HINT, None)
            if other is not None and other[0] == "value":
                hint = ("value", (value or other[1]) if func in _EITHER else (value and other[1]))
    if hint is not None:
        _set(out, hint)


def _number(value) -> float | int | None:
    """A Python number, or the value of a tensor that holds a known constant (a wrapped scalar); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    constant = getattr(value, "constant", None) if isinstance(value, torch.Tensor) else None
    return constant.item() if constant is not None and constant.numel() == 1 else None


def _set(out, hint: tuple) -> None:
    if isinstance(out, (tuple, list)):  # unbind: each piece holds what the whole did
        for piece in out:
            _set(piece, hint)
    elif isinstance(out, torch.Tensor):
        try:
            setattr(out, _HINT, hint)
        except (AttributeError, TypeError):
            pass
