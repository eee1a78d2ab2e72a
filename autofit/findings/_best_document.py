"""The best-config document, built from a stored study: one function for the search's own export and
for `autofit export`.

Everything the document needs is in the study itself (the probes on its trials, the search's settings
in its "autofit" user attribute), so a study can be exported again later, on another machine, without
probing anything; the search's own export is the same call at the end of the search.
"""

from __future__ import annotations

import statistics
from typing import Any

import optuna

from autofit.config import RATES, Config, widest_envelope
from autofit.devices import mfu
from autofit.errors import NoFeasibleConfig
from autofit.export import BestConfig, MeasuredFigures, RunnerUp, ScriptEntry, StudyEntry, versions
from autofit.findings._confirmation import ab_record, unconfirmed_reason
from autofit.findings._explain import explain, rate_note
from autofit.findings._planning import observations, study_planner
from autofit.planner import Candidate, Observation, Planner
from autofit.study import (
    StudyMeta,
    model_flops_per_sample,
    model_flops_per_token,
    other_script_probes,
    recorded_end,
    redacted,
    script_trials,
    study_meta,
    trial_result,
)

#: What an export says when the search that wrote the study never reached its end.
NOT_FINISHED = "the search did not finish (nothing recorded its end)"


def best_document(
    study: optuna.Study,
    storage: str,
    *,
    planner: Planner | None = None,
    stopped: str | None = None,
    partial: bool | None = None,
    trials: list | None = None,
) -> BestConfig:
    """The best-config file's record (`write_best` stamps the time it writes it).

    `stopped` and `partial` default to what the search recorded on the study; NoFeasibleConfig when
    none of the probes fits. Only the probes of the script the study names count (`script_trials`), so the
    file's figures are measured under the sha256 it gives.
    """
    meta = study_meta(study)
    usable = meta.memory.usable_bytes
    planner = planner or study_planner(study)
    trials = trials if trials is not None else script_trials(study)
    seen = observations(trials)
    done = [o for o in seen if o.status != "running"]
    ranked = planner.ranked(seen)
    if not ranked:
        raise NoFeasibleConfig(_none_fits(study, len(done)))
    end = recorded_end(study)
    stopped = stopped if stopped is not None else end.get("stopped", NOT_FINISHED)
    partial = partial if partial is not None else bool(end.get("partial", True))
    measured = _measured(ranked, done, trials, meta, planner, partial)
    reason = measured.unconfirmed
    run_versions = meta.versions
    return BestConfig(
        partial=partial, config=ranked[0].config, global_tokens=planner.space.global_tokens,
        measured=measured, memory=meta.memory, device=meta.device_info,
        # Ranks each probe ran on: the micro-batch and accumulation are per rank, the global batch is
        # theirs x this (a torchrun run with another world size shares the accumulation out again).
        world_size=meta.world_size,
        # PYTORCH_CUDA_ALLOC_CONF and the like, as the probes ran (None: not recorded by this study)
        allocator=meta.allocator,
        versions=versions(run_versions.get("torch"), run_versions.get("cuda")),
        # The script as the search measured it (its bytes, its code and its local modules' code): a later run
        # warns if it changed since, naming what changed (None for studies recorded before the hashes were
        # kept; re-hashing now would hide a change).
        script=ScriptEntry(path=meta.script, function=meta.function, sha256=meta.script_sha256,
                           args=tuple(meta.script_args or ()), code_sha256=meta.code_sha256, modules=meta.modules),
        study=StudyEntry(name=study.study_name, storage=redacted(storage), probes=len(done),
                         oom=sum(o.too_big(usable) for o in done), failed=sum(o.failed for o in done),
                         stopped=stopped),
        why=explain(ranked, done, planner, usable) + (f"; unconfirmed: {reason}" if reason else ""),
        runner_ups=tuple(RunnerUp(config=c.config, rate=c.rate, peak_bytes=c.peak_bytes) for c in ranked[1:5]),
    )


def _none_fits(study: optuna.Study, probes: int) -> str:
    """Why there is nothing to export; the probes of another version of the script are counted apart."""
    others = other_script_probes(study)
    return (f"The study {study.study_name} must have a config that fits to export, but none of its {probes} "
            f"probes of the script does" + (f" ({others} of another version of it are not ranked: search again "
                                             f"to probe this one)." if others else "."))


def _measured(ranked: list[Candidate], done: list[Observation], trials, meta: StudyMeta, planner: Planner,
              partial: bool) -> MeasuredFigures:
    """The winner's measured figures: its rates, peak and probes, where its rates come from, and the A/B
    that confirmed it (or why none did)."""
    best = ranked[0]
    usable = meta.memory.usable_bytes
    undecided = best.measurement.undecided if best.measurement is not None else None
    confirmed = not undecided and any(o.phase == "confirm" and o.config == best.config and o.fits(usable) for o in done)
    return MeasuredFigures(
        # the rate the search ranked by: samples_per_s, or tokens_per_s (real tokens) by tokens
        ranked_by=best.config.ranked_by,
        # the highest peak any of its probes reached: a run must fit them all
        peak_bytes=best.peak_bytes,
        probes=best.probes,
        confirmed=confirmed,
        # why not, when it is not (None when it is)
        unconfirmed=unconfirmed_reason(confirmed, done, partial, undecided),
        # the A/B that confirmed it: each entrant's rounds (at the ranked rate), median and spread (None: none ran)
        ab=ab_record(ranked, done, planner),
        # which probes the rates come from ("confirmation", "median", "fastest"), and why
        rate_from=best.measurement.rule,
        rate_note=rate_note(ranked, done),
        # its rates and the figures behind them, from the probes its ranked rate comes from
        **rate_figures(best, trials, meta.device_info, meta.world_size),
        # the intra-op threads its probes ran on (None: not recorded): a CPU run on other threads is warned
        threads=probe_most(best.config, trials, "threads"),
        # the allocator's retries in its measured steps, and the pinned host memory it held (CUDA; None elsewhere)
        alloc_retries=probe_most(best.config, trials, "alloc_retries"),
        host_pinned_bytes=probe_most(best.config, trials, "host_pinned_bytes"),
        # the micro-batches by tokens its probes ran (None: it does not batch by tokens): a normal run
        # splits one beyond them before it runs
        token_envelope=token_envelope(best.config, trials),
    )


def probe_most(config: Config, trials, figure: str) -> int | None:
    """The most of a `figure` of the probes of `config` that ran their steps (their intra-op threads, should they
    differ; their allocator retries; their pinned host memory); None where no probe recorded it (a study from
    before it was kept, a device that does not count it)."""
    counts = [value for trial in trials if (result := trial_result(trial)) and result.ok
              and result.config == config and (value := getattr(result, figure)) is not None]
    return max(counts, default=None)


def token_envelope(config: Config, trials) -> dict | None:
    """What the probes of `config` that ran their steps drew by tokens (runtime.TokenEnvelope's fields),
    widened over all of them (`widest_envelope`); None where none batched by tokens."""
    drawn = [envelope for trial in trials if (result := trial_result(trial)) and result.ok and result.config == config
             and (envelope := result.knobs.get("token_envelope"))]
    return widest_envelope(drawn)


def rate_figures(best: Candidate, trials, device: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Every rate at the winner's ranked rate (`Candidate.rate`), and every figure behind them (the
    other rate per ranked one: tokens per sample or samples per token; joules, the share of time waiting
    for data) the median over the probes that rate comes from, so the file's figures describe one
    measurement. Model FLOPs per sample are the model's, whatever the probe."""
    number = {o.trial for o in best.measurement.probes}
    probes = [r for t in trials if t.number in number and (r := trial_result(t))]
    rates = {r.name: _at_rate(best, probes, r.name) for r in RATES}
    flops, per_token = model_flops_per_sample(trials), model_flops_per_token(trials)
    samples, tokens = rates["samples_per_s"], rates["tokens_per_s"]
    if best.config.max_tokens is not None and per_token and tokens:  # by tokens: samples per batch vary
        flops_per_s = tokens * per_token
    else:
        flops_per_s = samples * flops if flops and samples else None
    utilisation = (mfu(flops_per_s / max(1, world_size), device.get("name", ""), best.config.precision)
                   if flops_per_s and device.get("type") == "cuda" else None)
    waited = _median([r.data_wait_share for r in probes])
    return {**rates, "flops_per_sample": flops, "flops_per_token": per_token or None, "flops_per_s": flops_per_s,
            "mfu": utilisation, "joules_per_sample": _median([r.joules_per_sample for r in probes]),
            # share of the measured time its probes waited for data (None: autofit did not see the data)
            "data_wait_share": waited}


def _at_rate(best: Candidate, probes: list, name: str) -> float | None:
    """The winner's rate `name`: its ranked rate, or that times the median ratio of `name` to it in its probes."""
    if name == best.config.ranked_by.name:
        return best.rate
    ratio = _median([getattr(r, name) / r.rate for r in probes if getattr(r, name) and r.rate])
    return best.rate * ratio if ratio else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
