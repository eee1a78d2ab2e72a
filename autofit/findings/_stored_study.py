"""A stored study read once and interpreted: its trials, the planner's observations and ranking, the
best-config document, the fitted memory models and the search's progress (`StoredStudy`, returned by
`autofit.load_study`), and every study of a storage summarised (`list_studies`).

The search writes; everything here only reads, so a study can be shown, exported or plotted at any
time, from any machine, with nothing probed again. Which storage and study a command means is
autofit.study's `locate`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import optuna

from autofit.errors import NoFeasibleConfig, UsageError
from autofit.export import BestConfig, MemoryBudget
from autofit.findings._best_document import best_document
from autofit.findings._planning import observations, study_planner
from autofit.memory import StoredEstimates, stored_estimates
from autofit.study import (
    Located,
    StudyMeta,
    locate,
    locate_storage,
    open_for_reading,
    redacted,
    script_trials,
    storage_file,
    study_meta,
    trial_result,
    trials_frame,
)

if TYPE_CHECKING:
    import pandas as pd
    from optuna.trial import FrozenTrial

    from autofit.config import Config, Rate
    from autofit.planner import Candidate, Line, Planner, SearchSpace, Strategy
    from autofit.probing import ProbeResult

optuna.logging.set_verbosity(optuna.logging.WARNING)


class StoredStudy:
    """One study, read once into a plain record: its trials, the planner's observations and ranking,
    the probes as a typed frame, the best-config document, the fitted memory models and the search's
    progress. The table (`autofit show`), the report and the notebook all read this one record, so
    none of them walks the study again or re-derives what another already did."""

    def __init__(self, study: optuna.Study, storage: str, note: str | None = None) -> None:
        self.storage = storage
        self.note = note
        self.name: str = study.study_name
        self.meta: StudyMeta = study_meta(study)
        """The search's settings as the study keeps them (script, device, memory budget, space, ...)."""
        self.memory: MemoryBudget = self.meta.memory
        """The memory the search probed against: the limit, the headroom and what was left to a config."""
        self._trials: list[FrozenTrial] = script_trials(study)
        """The trials of the script the study names (a probe of another version measured another model)."""
        self._planner = study_planner(study)
        self.space: SearchSpace = self._planner.space
        self.ranked_by: Rate = self.space.ranked_by
        """The throughput the study ranks by: samples/s, or real tokens/s for a search by tokens."""
        self._observations = observations(self._trials)
        self._ranked = self._planner.ranked(self._observations)
        self._frame = trials_frame(self._trials, self.memory.usable_bytes)
        self._memory_models = self._planner.memory_models(self._observations)
        self.estimates: StoredEstimates | None = stored_estimates(study)
        """The memory estimator's answers for the search (None: it ran without, or had none)."""
        self._progress = self._read_progress()
        try:
            self._document: BestConfig | None = best_document(study, storage, planner=self._planner,
                                                              trials=self._trials)
            self._no_document: NoFeasibleConfig | None = None
        except NoFeasibleConfig as error:
            self._document, self._no_document = None, error

    def __repr__(self) -> str:
        return f"<StoredStudy {self.name} in {redacted(self.storage)}: {len(self._trials)} trials>"

    def trials(self) -> list[FrozenTrial]:
        return self._trials

    def trials_frame(self) -> pd.DataFrame:
        """One row per probe, typed (see autofit.study.COLUMNS): what the table, report and notebook show."""
        return self._frame

    def planner(self) -> Planner:
        return self._planner

    def ranked(self) -> list[Candidate]:
        """Feasible configs, best first, ranked exactly as the search ranks them."""
        return self._ranked

    def best(self) -> Config | None:
        return self._ranked[0].config if self._ranked else None

    def document(self) -> BestConfig:
        """The best-config file the search wrote, as its record (`.to_dict()`: the JSON; NoFeasibleConfig when
        nothing fits)."""
        if self._document is None:
            raise self._no_document
        return self._document

    def memory_models(self) -> dict[Strategy, Line]:
        """The planner's fitted memory line (peak = a + m x batch) of each strategy it has one for."""
        return self._memory_models

    def where_memory_goes(self, config: Config, measured_peak: float | None) -> dict[str, float] | None:
        """The config's peak by part: predicted tensors (parameters ... temporaries) and the measured
        rest ("device"); None without estimates of its strategy."""
        return self.estimates.where_memory_goes(config, measured_peak) if self.estimates else None

    def progress(self) -> pd.DataFrame:
        """After each probe (in trial order): probe-seconds spent so far and the best feasible config
        the search knew then with its rate (`ranked_by`), ranked as the search ranks (so the last row is
        the winner)."""
        return self._progress

    def _read_progress(self) -> pd.DataFrame:
        import pandas as pd

        rows, seen, spent = [], [], 0.0
        for trial in sorted(self._trials, key=lambda t: t.number):
            result = trial_result(trial)
            if result is None:
                continue
            seen.extend(observations([trial]))
            spent += result.wall_s
            ranked = self._planner.ranked(seen)
            rows.append({"trial": trial.number, "probe_seconds": spent,
                         "best_rate": ranked[0].rate if ranked else float("nan"),
                         "best": ranked[0].config.label() if ranked else None})
        return pd.DataFrame(rows, columns=["trial", "probe_seconds", "best_rate", "best"])

    def probe(self, number: int) -> tuple[FrozenTrial, ProbeResult]:
        """Trial `number` and its probe; UsageError naming the probes there are when it has none."""
        trials = {t.number: t for t in self._trials}
        trial = trials.get(number)
        result = trial_result(trial) if trial is not None else None
        if result is None:
            probed = sorted(n for n, t in trials.items() if trial_result(t) is not None)
            span = f"{probed[0]}-{probed[-1]}" if probed else "none"
            raise UsageError(f"The trial must be one of the study's probes ({span}), but got {number}.")
        return trial, result

    def log_path(self, number: int) -> str | None:
        """The probe's output file: where the search wrote it, or beside the storage if it moved."""
        trial, result = self.probe(number)
        candidates = [result.log_path] if result.log_path else []
        path = storage_file(self.storage)
        if path is not None:
            candidates.append(os.path.join(os.path.dirname(os.path.abspath(path)), "runs", self.name,
                                           f"trial-{trial.number}.log"))
        for candidate in candidates:
            if os.path.isfile(candidate):
                return candidate
        return None

    def summary(self) -> dict[str, Any]:
        """One line's worth: device, limit, probes, best config and its throughput (`rate`, in `rate_unit`)."""
        return {
            "study": self.name, "device": self.meta.device_info.get("name"),
            "limit_bytes": self.memory.limit_bytes, "probes": len(self._frame),
            "best": self._ranked[0].config.label() if self._ranked else None,
            "rate": self._ranked[0].rate if self._ranked else None, "rate_unit": self.ranked_by.unit,
        }


def load_study(name: str | None = None, storage: str | None = None) -> StoredStudy:
    """A stored study by name (or the only one in the storage); see the module docstring for which storage."""
    where = locate(name, storage)
    study = optuna.load_study(study_name=where.name, storage=open_for_reading(where.storage))
    return StoredStudy(study, where.storage, where.note)


def list_studies(storage: str | None = None) -> tuple[Located, list[dict[str, Any]]]:
    """Every study in the storage, with its summary (studies autofit did not write get only a name)."""
    where = locate_storage(storage)
    rows = []
    opened = open_for_reading(where.storage)
    for name in sorted(optuna.get_all_study_names(storage=opened)):
        try:
            rows.append(StoredStudy(optuna.load_study(study_name=name, storage=opened), where.storage).summary())
        except UsageError:
            rows.append({"study": name, "device": None, "limit_bytes": None, "probes": 0, "best": None,
                         "rate": None, "rate_unit": None})
    return where, rows
