"""A search by tokens ranks, bounds and confirms token caps by real (non-padding) tokens/s, not samples/s: a
cap whose batches fill with short samples reads more samples/s while it trains fewer tokens. Its why-line,
`autofit show` and best-config file say `max_tokens=N` and tokens/s, and the file's config states the tokens
per step (`global_tokens`), not a global batch that counts nothing. A search by samples ranks as before.

Stored studies of fake probes (no run): the planner reads them as a search and `autofit show` do."""

from __future__ import annotations

import optuna
import pytest

from autofit.config import Config
from autofit.export import read_best, write_best
from autofit.findings import StoredStudy, best_document, observations, study_planner
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.report import describe_study
from autofit.study import config_params, distributions

GiB = 2**30
TOKENS = SearchSpace.build(batch_range=(1, 2**20), token_range=(256, 4096), precision=("fp32",),
                           global_tokens=65536)
SAMPLES = SearchSpace.build(batch_range=(256, 4096), precision=("fp32",))

#: (cap, samples/s, real tokens/s): the 512 cap reads the most samples/s (its batches hold the short
#: samples), the 1024 cap trains the most tokens.
PROBES = [(512, 40.0, 8000.0), (768, 34.0, 11000.0), (1024, 30.0, 12000.0)]


def _config(space: SearchSpace, size: int) -> Config:
    return space.config(space.strategies()[0], size)


def _study(space: SearchSpace, probes, *, oom: int | None = None) -> optuna.Study:
    """A stored study of ok probes (size, phase, samples/s, tokens/s) and an OOM at `oom`, as a search
    writes them."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("autofit", {
        "script": "sft.py", "function": "train", "device_info": {"type": "cpu", "name": "cpu"},
        "limit_bytes": 8 * GiB, "headroom": 0.1, "usable_bytes": 7 * GiB, "space": space.to_dict()})
    for size, phase, samples, tokens in probes:
        _add(study, ProbeResult(status="ok", config=_config(space, size), samples_per_s=samples, tokens_per_s=tokens,
                                peak_bytes=size * 2**20, step_time_median_s=1.0, step_time_iqr_s=0.02), phase)
    if oom is not None:
        _add(study, ProbeResult(status="oom", config=_config(space, oom), memory_limit=8 * GiB))
    return study


def _add(study: optuna.Study, result: ProbeResult, phase: str = "explore") -> None:
    dists = distributions((1, 4096), 0, 1, token_range=(1, 4096) if result.config.max_tokens else None)
    params = {k: v for k, v in config_params(result.config).items() if k in dists}
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=dists, value=result.rate,
        state=optuna.trial.TrialState.COMPLETE if result.ok else optuna.trial.TrialState.FAIL,
        user_attrs={"probe": result.to_dict(), "phase": phase, "status": result.status}))


def _explored(probes=PROBES):
    return [(size, "explore", samples, tokens) for size, samples, tokens in probes]


def test_a_probe_by_tokens_is_ranked_by_its_real_tokens_per_second():
    by_tokens = ProbeResult(status="ok", config=_config(TOKENS, 512), samples_per_s=40.0, tokens_per_s=8000.0)
    by_samples = ProbeResult(status="ok", config=_config(SAMPLES, 512), samples_per_s=40.0, tokens_per_s=8000.0)
    assert by_tokens.rate == 8000.0 and by_samples.rate == 40.0


def test_caps_rank_by_tokens_per_second_though_a_smaller_cap_reads_more_samples_per_second():
    study = _study(TOKENS, _explored())
    ranked = study_planner(study).ranked(observations(study.get_trials()))
    assert [c.config.max_tokens for c in ranked] == [1024, 768, 512]
    assert [c.rate for c in ranked] == [12000.0, 11000.0, 8000.0]


def test_a_search_by_samples_still_ranks_by_samples_per_second():
    study = _study(SAMPLES, _explored())
    ranked = study_planner(study).ranked(observations(study.get_trials()))
    assert [c.config.batch_size for c in ranked] == [512, 768, 1024]
    assert [c.rate for c in ranked] == [40.0, 34.0, 30.0]


def test_the_a_b_takes_the_caps_within_the_noise_in_tokens_per_second():
    """768 is 8% behind 1024 in tokens/s (within the 10% the search measured: 512's two probes), 512 a third
    behind: by samples/s 512 would lead alone (768 15% behind it)."""
    study = _study(TOKENS, _explored() + [(512, "recheck", 40.0, 7200.0)])
    planner, seen = study_planner(study), observations(study.get_trials())
    assert planner.ab_entrants(seen) == [_config(TOKENS, 1024), _config(TOKENS, 768)]


def test_the_a_b_decides_by_tokens_per_second_and_the_file_keeps_its_rounds_in_them():
    rounds = [(1024, "confirm", 32.0, 10000.0), (768, "confirm", 36.0, 11000.0)] * 3
    study = _study(TOKENS, _explored() + rounds)
    document = best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()
    assert document["config"]["max_tokens"] == 768  # more tokens/s in the A/B, fewer samples/s than 512
    entrants = document["measured"]["ab"]["entrants"]
    assert [(e["label"], e["tokens_per_s"], e["median"]) for e in entrants] == [
        ("fp32 max_tokens=768", [11000.0] * 3, 11000.0), ("fp32 max_tokens=1024", [10000.0] * 3, 10000.0)]
    assert "samples_per_s" not in entrants[0]


def test_the_why_line_says_max_tokens_and_tokens_per_second():
    study = _study(TOKENS, _explored(), oom=1536)
    why = best_document(study, "sqlite:///x.db", stopped="done", partial=False).why
    assert why.startswith("fp32 max_tokens=1024: 12,000.0 tokens/s")
    assert "max_tokens=1536 ran out of memory" in why and "batch" not in why


def test_the_file_of_a_token_search_heads_with_tokens_per_second_and_states_tokens_per_step(tmp_path):
    study = _study(TOKENS, _explored())
    best = best_document(study, "sqlite:///x.db", stopped="done", partial=False)
    document = best.to_dict()
    config, measured = document["config"], document["measured"]
    assert config["max_tokens"] == 1024 and config["global_tokens"] == 65536 and config["global_batch"] is None
    assert list(measured)[:3] == ["ranked_by", "tokens_per_s", "samples_per_s"]
    assert measured["ranked_by"] == "tokens_per_s" and measured["tokens_per_s"] == 12000.0
    assert measured["samples_per_s"] == pytest.approx(30.0)  # at the ranked rate, its probes' samples per token
    assert [r["tokens_per_s"] for r in document["runner_ups"]] == [11000.0, 8000.0]
    assert all(r["global_batch"] is None and "samples_per_s" not in r for r in document["runner_ups"])
    read = read_best(write_best(str(tmp_path / "best.json"), best))
    assert read.config == _config(TOKENS, 1024) and read.to_dict()["measured"] == measured and read == best


def test_the_file_of_a_search_by_samples_keeps_its_global_batch_and_samples_first():
    document = best_document(_study(SAMPLES, _explored()), "sqlite:///x.db", stopped="done", partial=False).to_dict()
    assert document["config"]["global_batch"] == 512 and "global_tokens" not in document["config"]
    assert list(document["measured"])[:3] == ["ranked_by", "samples_per_s", "tokens_per_s"]
    assert document["measured"]["samples_per_s"] == 40.0


def test_show_says_tokens_per_second_for_a_token_search():
    stored = StoredStudy(_study(TOKENS, _explored(), oom=1536), "sqlite:///x.db")
    frame = stored.trials_frame()
    text = describe_study(stored, frame, frame)
    header = next(line for line in text.splitlines() if "trial" in line and "status" in line)
    assert "tokens/s" in header and "samples/s" not in header
    assert "12,000.0" in text  # the probes' tokens/s, not their samples/s
    assert "best: fp32 max_tokens=1024  12,000 real (non-padding) tokens/s (30.0 samples/s)" in text
    assert stored.summary()["rate"] == 12000.0 and stored.summary()["rate_unit"] == "tokens/s"
