"""What the `autofit` group hands its commands (`CliContext`: the device and storage their options
named, resolved on first use), and how autofit's errors leave the command line (click exceptions
shown as one line, `autofit: error: ...`, with exit status 2 for bad input and 1 otherwise)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from autofit.errors import AutofitError, UsageError

if TYPE_CHECKING:
    import optuna

    from autofit.devices import DeviceInfo


class _OneLine:
    """A click exception shown as autofit shows its errors: the traceback of the user's script when
    it failed, then one line."""

    traceback: str | None = None

    def show(self, file: Any = None) -> None:
        if self.traceback:
            click.echo(self.traceback.rstrip(), err=True)
        click.echo(f"autofit: error: {self.format_message()}", err=True)  # type: ignore[attr-defined]


class CommandFailed(_OneLine, click.ClickException):
    """The command could not do its work (the script failed, nothing fits, a storage is broken): exit 1."""

    def __init__(self, message: str, traceback: str | None = None) -> None:
        super().__init__(message)
        self.traceback = traceback


class BadInput(_OneLine, click.UsageError):
    """The user asked for something that cannot work: exit 2."""


def as_click_error(exc: AutofitError, ctx: click.Context | None = None) -> click.ClickException:
    """The click exception an error of autofit's leaves the command line as."""
    if isinstance(exc, UsageError):
        return BadInput(str(exc), ctx)
    return CommandFailed(str(exc), getattr(exc, "traceback", None))


@dataclass
class CliContext:
    """The click context object: the options that say where commands work, as given, and what they
    resolve to, worked out (and checked) when a command first asks."""

    device_type: str | None = None
    """--device as given (None: cuda with --gpu; else `default_device`: $AUTOFIT_DEVICE, a visible GPU, the CPU)."""
    gpu: int | tuple[int, ...] | None = None
    """--gpu as given: one index, or several to probe on at once."""
    storage_url: str | None = None
    """--storage as given (None: the default)."""
    _storage: Any = field(default=None, repr=False)

    _default: tuple[str, int, str] | None = field(default=None, repr=False)

    @property
    def device(self) -> str:
        """The device type commands probe on; a UsageError for --device cpu with --gpu. Neither given: the
        device a normal run trains on (`default_device`: a visible GPU before the CPU), said in one line."""
        if self.gpu is not None and self.device_type == "cpu":
            shown = ",".join(map(str, self.gpu)) if isinstance(self.gpu, tuple) else self.gpu
            raise UsageError(f"--gpu must go with --device cuda, but got --device cpu --gpu {shown}.")
        if self.device_type or self.gpu is not None:
            return self.device_type or "cuda"
        return self._defaulted()[0]

    @property
    def index(self) -> int:
        """The (first) device index."""
        if self.gpu is None and self.device_type is None:
            return self._defaulted()[1]
        first = self.gpu[0] if isinstance(self.gpu, tuple) else self.gpu
        return first or 0

    def _defaulted(self) -> tuple[str, int, str]:
        if self._default is None:
            from autofit.devices import default_device, default_device_line

            self._default = default_device()
            line = default_device_line(*self._default, given="--device", cpu="--device cpu")
            if line:
                click.echo(line, err=True)
        return self._default

    @property
    def gpus(self) -> tuple[int, ...]:
        """Several GPUs to probe on at once (one worker each); () for one device."""
        return tuple(self.gpu) if isinstance(self.gpu, tuple) and len(self.gpu) > 1 else ()

    def device_info(self) -> DeviceInfo:
        """The device's name and memory, or a UsageError saying why it cannot be used."""
        from autofit.devices import check_device

        return check_device(self.device, self.index)

    def storage(self) -> optuna.storages.BaseStorage:
        """The Optuna storage --storage names, opened on first use (a StorageError if it cannot be)."""
        if self._storage is None:
            from autofit.study import open_storage

            self._storage = open_storage(self.storage_url)
        return self._storage


def into_context(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback that keeps the option's value on the context object, as `name`."""

    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        setattr(ctx.ensure_object(CliContext), name, value)
        return value

    return keep
