"""Which storage and study a reading command means (`locate`, `locate_storage`).

Without --storage the default storage (studies/autofit.db) is read when it holds the study, else the
recorded studies that ship with autofit (autofit/recorded/autofit.db, package data), so the commands
and the notebook work right after install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import optuna

from autofit.errors import UsageError
from autofit.study._storage import default_storage_url, open_for_reading, redacted, storage_exists, storage_file

#: The recorded searches of the bundled studies ship inside the package (package data), so they are
#: there after `pip install torch-autofit` from a wheel, not only in a source checkout.
BUNDLED_DB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recorded", "autofit.db")


def bundled_storage_url() -> str:
    """The storage of the recorded studies that ship with autofit (one per bundled study script)."""
    return "sqlite:///" + BUNDLED_DB


def study_names(url: str) -> list[str]:
    return sorted(optuna.get_all_study_names(storage=open_for_reading(url)))


def match_study(names: list[str], wanted: str) -> str | None:
    """`wanted` exactly, or the one study whose script stem it is ("gpt" for "gpt.train-cpu0")."""
    if wanted in names:
        return wanted
    by_stem = [n for n in names if n.split(".", 1)[0] == wanted]
    if len(by_stem) > 1:
        raise UsageError(f"The study name must pick one study, but {wanted!r} matches {', '.join(by_stem)}.")
    return by_stem[0] if by_stem else None


@dataclass(frozen=True)
class Located:
    """Where a command's study is: the storage URL, the study name, and a note when it fell back."""

    storage: str
    name: str
    note: str | None = None


def _pick(names: list[str], wanted: str | None, url: str, what: str | None = None) -> str:
    url = redacted(url)
    what = what or url
    if not names:
        raise UsageError(f"The storage must hold a study, but {url} has none.")
    if wanted is None:
        if len(names) == 1:
            return names[0]
        raise UsageError(f"--study must name one of the {len(names)} studies in {what} ({', '.join(names)}), "
                         f"but none was given.")
    found = match_study(names, wanted)
    if found is None:
        raise UsageError(f"The study must be one of those in {what} ({', '.join(names)}), but got {wanted!r}.")
    return found


def locate(study: str | None = None, storage: str | None = None) -> Located:
    """The storage and study a command means (rules in the module docstring)."""
    if storage:
        return Located(storage, _pick(study_names(storage), study, storage))
    default, bundled = default_storage_url(), bundled_storage_url()
    default_names = study_names(default) if storage_exists(default) else []
    if default_names and (study is None or match_study(default_names, study)):
        return Located(default, _pick(default_names, study, default))
    if not storage_exists(bundled):
        if storage_exists(default):
            return Located(default, _pick(default_names, study, default))
        raise UsageError(f"The storage must exist, but {storage_file(default)} does not (run `autofit search` "
                         f"first, or pass --storage).")
    bundled_names = study_names(bundled)
    reason = (f"{storage_file(default)} does not exist" if not storage_exists(default)
              else f"{storage_file(default)} has no study {study!r}" if study and default_names
              else f"{storage_file(default)} holds no study")
    if study is not None and not match_study(bundled_names, study):
        mine = f" ({', '.join(default_names)})" if default_names else ""
        raise UsageError(f"The study must be one of those in {storage_file(default)}{mine} or the recorded ones "
                         f"({', '.join(bundled_names)}), but got {study!r}.")
    name = _pick(bundled_names, study, bundled, what="the recorded studies")
    return Located(bundled, name, note=f"reading the recorded study {name} in {BUNDLED_DB}: {reason}")


def locate_storage(storage: str | None = None) -> Located:
    """For listing: --storage, else the default storage if it holds studies, else the recorded one."""
    if storage:
        return Located(storage, "")
    default, bundled = default_storage_url(), bundled_storage_url()
    if storage_exists(default) and study_names(default):
        return Located(default, "")
    if storage_exists(bundled):
        why = "does not exist" if not storage_exists(default) else "holds no study"
        return Located(bundled, "", note=f"listing the recorded studies in {BUNDLED_DB}: {storage_file(default)} {why}")
    return Located(default, "")
