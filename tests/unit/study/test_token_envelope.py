"""The micro-batches by tokens the probes ran travel to the run that trusts them: a probe's record, the
stored study, the best-config file's `measured.token_envelope` (its winner's probes only, each measure's
largest), and the settings of the normal run that reads the file."""

from __future__ import annotations

import optuna

from autofit import Config
from autofit.decorator import AutofitFunction
from autofit.export import BestConfig, MeasuredFigures, read_best, write_best
from autofit.findings import best_document
from autofit.normal_run import resolve_run_config
from autofit.options import SearchOptions
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.runtime import TokenEnvelope
from tests.support.studies import study_of

GiB = 2**30
TOKENS = (64, 1024)
SPACE = SearchSpace.build(batch_range=(1, 2**20), token_range=TOKENS, precision=("fp32",))


def _probe(max_tokens: int, rate: float, envelope: TokenEnvelope | None) -> ProbeResult:
    knobs = {"longest_sample": 80, **({"token_envelope": envelope.to_dict()} if envelope else {})}
    return ProbeResult(status="ok", config=Config(batch_size=max_tokens, max_tokens=max_tokens), samples_per_s=rate,
                       tokens_per_s=rate * 60,  # a search by tokens ranks by them
                       peak_bytes=GiB, step_time_median_s=1.0, step_time_iqr_s=0.02, knobs=knobs)


def _study(results: list[ProbeResult]) -> optuna.Study:
    return study_of(results, SPACE, (1, 2**20), token_range=TOKENS)


def test_the_file_holds_what_the_winners_probes_ran_each_measures_largest():
    study = _study([_probe(256, 100.0, TokenEnvelope(80, 240, 19200)),  # another config's probe: not the winner's
                    _probe(512, 300.0, TokenEnvelope(64, 512, 32768)),
                    _probe(512, 306.0, TokenEnvelope(60, 480, 34560))])  # another draw of the winning cap
    measured = best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()["measured"]
    assert measured["token_envelope"] == {"longest_sample": 64, "padded_tokens": 512, "padded_squares": 34560}


def test_a_file_by_samples_holds_none():
    study = _study([_probe(256, 100.0, None)])
    assert "token_envelope" not in best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()["measured"]


def test_the_envelope_in_the_file_reaches_the_normal_runs_settings(tmp_path, monkeypatch):
    envelope = TokenEnvelope(64, 512, 33000)
    config = Config(batch_size=512, max_tokens=512)
    path = write_best(str(tmp_path / "train.train.best.json"), BestConfig(
        config=config, measured=MeasuredFigures(token_envelope=envelope.to_dict()), device={"type": "cpu", "name": "cpu"}))
    assert read_best(path).measured.token_envelope == envelope.to_dict()
    monkeypatch.setenv("AUTOFIT_CONFIG", path)
    fn = AutofitFunction(lambda run: None, SearchOptions())
    plan = resolve_run_config(fn, None, "cpu")
    assert plan.config == config and plan.token_envelope == envelope
    assert fn.make_run(plan=plan).control.settings.token_envelope == envelope
    without = write_best(str(tmp_path / "old.best.json"), BestConfig(config=config, device={"type": "cpu", "name": "cpu"}))
    assert resolve_run_config(fn, without, "cpu").token_envelope is None  # a file written before it: no guard
