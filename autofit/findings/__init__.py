"""What a study's probes say: the planner rebuilt over a stored study (`study_planner`) and the
trials as its observations (`observations`), the best-config document and its figures
(`best_document`), words for why the winner won and what went wrong (`explain`, `rate_note`,
`fault_notes`, `nothing_fits`), and a stored study read once and interpreted (`StoredStudy`, from
`load_study`; `list_studies`). The search's own summary and export, `autofit show`/`export`/`report`
and the notebook all read a study through here; autofit.study only stores and reads it."""

from __future__ import annotations

from autofit.findings._best_document import best_document
from autofit.findings._confirmation import UNCONFIRMED_BUDGET, undecided_reason
from autofit.findings._explain import explain, fault_notes, nothing_fits, rate_note
from autofit.findings._planning import observations, study_planner
from autofit.findings._stored_study import StoredStudy, list_studies, load_study

__all__ = [
    "UNCONFIRMED_BUDGET",
    "StoredStudy",
    "best_document",
    "explain",
    "fault_notes",
    "list_studies",
    "load_study",
    "nothing_fits",
    "observations",
    "rate_note",
    "study_planner",
    "undecided_reason",
]
