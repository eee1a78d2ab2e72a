"""A normal run's warnings (a config searched on another device, other allocator settings, a changed script) name
the user's line that started the run: they once named a line inside autofit (a fixed stacklevel that counted
autofit's frames wrong, and differently for a decorated function's call, `make_run` and `autofit.start`)."""

from __future__ import annotations

import json
import warnings

from autofit import autofit


@autofit
def train(run):  # never run here: only its plan is made
    pass


def test_a_stale_config_is_warned_from_the_line_that_plans_the_run(tmp_path, monkeypatch):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({
        "schema": "autofit.best-config", "schema_version": 1, "measured": {}, "memory": {}, "versions": {},
        "config": {"batch_size": 4, "accumulation_steps": 1, "precision": "fp32", "checkpoint_segments": 0},
        "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}, "script": {"path": __file__}}))
    monkeypatch.setenv("AUTOFIT_DEVICE", "cpu")
    for plan in (lambda: train.plan_run(config_path=best), lambda: train.make_run(config_path=best)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan()
        stale = [w for w in caught if "was searched on cuda" in str(w.message)]
        assert stale and stale[0].filename == __file__, [(w.filename, w.lineno) for w in caught]
