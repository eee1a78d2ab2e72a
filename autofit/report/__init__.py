"""What people read: terminal text for probes, searches, studies and `autofit estimate`; matplotlib
figures of a study; the self-contained HTML report. Nothing here decides anything."""

from __future__ import annotations

from autofit.report._estimate_text import describe_fits, describe_known_parts, fits_json, known_parts_json
from autofit.report._forecast_text import describe_forecast
from autofit.report._probe_text import describe_probe, rate_text
from autofit.report._search_text import describe_search
from autofit.report._study_text import describe_study, describe_trial, select_probes, studies_table

__all__ = [
    "describe_fits",
    "describe_forecast",
    "describe_known_parts",
    "describe_probe",
    "describe_search",
    "describe_study",
    "describe_trial",
    "fits_json",
    "known_parts_json",
    "rate_text",
    "select_probes",
    "studies_table",
    "write_report",
    "render_report",
    "study_figures",
]


def write_report(*args, **kwargs):
    """The HTML report (see _html.write_report); matplotlib is imported only when one is written."""
    from autofit.report._html import write_report as _write_report

    return _write_report(*args, **kwargs)


def render_report(*args, **kwargs):
    """The HTML page from the study and its figures as PNG bytes (see _html.render_report)."""
    from autofit.report._html import render_report as _render_report

    return _render_report(*args, **kwargs)


def study_figures(*args, **kwargs):
    """The study's figures (see _plots.study_figures); matplotlib is imported only when drawn."""
    from autofit.report._plots import study_figures as _study_figures

    return _study_figures(*args, **kwargs)
