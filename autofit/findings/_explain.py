"""Words for what a search found: why the winner won, what went wrong along the way, and why
nothing fits. Pure functions of the planner and the study's trials, shared by the search's own
summary and by `autofit export`/`show` reading a stored study."""

from __future__ import annotations

import statistics

import optuna

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.findings._confirmation import ab_words
from autofit.planner import TIE_TOLERANCE, Candidate, Planner, dominates, loader_reason, squares_reason
from autofit.probing import BUDGET_CUT
from autofit.study import DATA_BOUND_ERRORS, script_trials, trial_result
from autofit.units import format_size


def explain(ranked: list[Candidate], done, planner: Planner, usable: float) -> str:
    """Why the winner won, in one sentence a person can check."""
    best = ranked[0]
    parts = [f"{best.config.label()}: {best.rate:,.1f} {best.config.ranked_by.unit}"]
    changed = ab_words(ranked, done, planner)
    if changed:
        parts.append(changed)
    parts.extend(_as_an_expert(ranked, planner.ranking_margin(done)))
    loader = loader_reason(planner.space.loader, ranked, done)
    if loader:
        parts.append(loader)
    squares = squares_reason(ranked, planner.space.longest_sample)
    if squares:
        parts.append(squares)
    others = {}
    for c in ranked[1:]:
        key = c.config.precision
        if key != best.config.precision and key not in others:
            others[key] = c
    for precision, c in others.items():
        parts.append(f"{best.standing / c.standing:.2f}x the best {precision} config ({c.config.label()})")
    strategy = planner.space.strategy_of(best.config)
    larger = sorted((o for o in done if planner.space.strategy_of(o.config) == strategy
                     and planner.space.holds_kind(o.config) and o.config.max_squares == best.config.max_squares
                     and o.config.size > best.config.size),
                    key=lambda o: o.config.size)
    if larger:
        o = larger[0]
        size = o.config.size_label()
        if o.data_bound:
            parts.append(f"{size} is more than the data can feed (the loop ran out of batches)")
        elif o.status == "oom":
            parts.append(f"{size} ran out of memory")
        elif o.status == "ok" and o.peak_bytes and o.peak_bytes > usable:
            parts.append(f"{size} needs {format_size(o.peak_bytes)} > {format_size(usable)} usable")
        elif o.status == "ok" and o.rate:
            measured = next((c.standing for c in ranked if c.config == o.config), None)
            if measured is None:
                parts.append(f"{size} read {o.rate / best.rate:.2f}x on a suspect measurement that no second "
                             f"probe settled (a longer --budget or more --trials measures it again)")
            elif measured <= best.standing:
                parts.append(f"{size} was no faster ({measured / best.standing:.2f}x)")
            else:
                parts.append(f"{size} was within {TIE_TOLERANCE:.0%} "
                             f"({measured / best.standing:.2f}x) and needs more memory")
    else:
        memory = planner.space and _predicted_next(planner, best.config, done, usable)
        if memory:
            parts.append(memory)
    return "; ".join(parts)


def _as_an_expert(ranked: list[Candidate], margin: float) -> list[str]:
    """Faster readings the winner stands above: configs it dominates (the same work and more) that
    were not faster beyond the noise, and near-ties settled for less recompute or accumulation."""
    best, words = ranked[0], []
    for c in ranked[1:]:
        if c.standing <= best.standing:
            continue
        gain = c.standing / best.standing
        if dominates(best.config, c.config):
            words.append(f"{c.config.label()} read {gain:.2f}x but adds "
                         f"{'accumulation' if c.config.accumulation_steps > best.config.accumulation_steps else 'recompute'}"
                         f" to it: not faster beyond the noise ({margin:.0%})")
        else:
            words.append(f"{c.config.label()} read {gain:.2f}x, within {TIE_TOLERANCE:.0%}: the tie goes to "
                         f"less recompute, then fewer accumulation steps, then the lower peak")
    return words


def rate_note(ranked: list[Candidate], done) -> str:
    """Which of the winner's probes its figures come from and why (see `Measurement`), and any config
    that led on its short probes until its confirmation run measured it slower."""
    best = ranked[0]
    unit = best.config.ranked_by.unit
    rule, probes = best.measurement.rule, best.measurement.probes
    short = _short_rate(best.config, done)
    if rule == "confirmation":
        gap = best.rate / short - 1 if short else 0.0
        against = (f"agreeing with its short probes' {short:,.1f}" if abs(gap) < 0.005 else
                   f"{abs(gap):.0%} {'below' if gap < 0 else 'above'} its short probes' {short:,.1f}: the long run counts")
        rounds = len(probes)
        source = "its confirmation run" if rounds == 1 else f"the median of its {rounds} A/B rounds"
        parts = [f"from {source}: {best.rate:,.1f} {unit}, {against}"]
    elif rule == "fastest":
        parts = ["from the fastest of its probes: they disagreed beyond the noise seen, and interference "
                 "slows a probe, never speeds it up"]
    else:
        parts = [f"the median of its {len(probes)} probe{'s' if len(probes) != 1 else ''}"]
    if rule == "confirmation" and best.measurement.erratic:
        parts.append("its steps varied far beyond the short probes' (a slowdown that sets in later, or "
                     "another job on the machine: search again on a quiet one if so)")
    for c in ranked[1:]:
        led = _short_rate(c.config, done)
        if c.measurement.rule == "confirmation" and led and led > best.rate:
            parts.append(f"{c.config.label()} led with {led:,.1f} {unit} on its short probes but measured "
                         f"{c.rate:,.1f} in its confirmation (the A/B)")
    faster = next((c for c in ranked[1:] if c.scale != 1.0 and c.rate > best.rate), None)
    if faster is not None:  # a short figure above the winner's long one: say why it ranks below
        parts.append(f"a config the A/B did not measure compares at its short probes' figure x{faster.scale:.2f}, "
                     f"the A/B's long rounds against its entrants' short probes (like with like): "
                     f"{faster.config.label()}'s {faster.rate:,.1f} {unit} counts as {faster.standing:,.1f}")
    return "; ".join(parts)


def _short_rate(config: Config, done) -> float | None:
    """The median rate of `config`'s probes other than its confirmation runs."""
    rates = [o.rate for o in done
             if o.config == config and o.status == "ok" and o.rate and o.phase != "confirm"]
    return statistics.median(rates) if rates else None


def _predicted_next(planner: Planner, config: Config, done, usable: float) -> str | None:
    sizes = planner.space.batch_sizes
    if config.size not in sizes or config.size == sizes[-1]:
        if config.size != sizes[-1]:
            return None
        return ("it is the largest cap allowed (--token-range)" if config.max_tokens is not None
                else "it is the largest batch allowed (--batch-range)")
    strategy = planner.space.strategy_of(config)
    nxt = planner.space.config(strategy, sizes[sizes.index(config.size) + 1])
    size = nxt.size_label()
    predicted = planner.predicted_peak(nxt, done)
    if predicted is not None and predicted.high > usable:
        need = f"{format_size(predicted.low)}-{format_size(predicted.high)}" if predicted.high < float("inf") \
            else f"at least {format_size(predicted.low)}"
        verdict = "does not fit" if predicted.low > usable else "might not fit"
        return (f"{size} is predicted to need {need} (memory estimator): it {verdict} in "
                f"{format_size(usable)} usable" + ("" if predicted.low > usable else ", and could not be 10% faster"))
    line = planner.memory_line(strategy, done)
    if line is None:
        return None
    if line(nxt.size) > usable:
        return f"{size} is predicted to need {format_size(line(nxt.size))} > {format_size(usable)} usable"
    return f"{size} was not probed (predicted to need {format_size(line(nxt.size))}, which fits)"


def fault_notes(study: optuna.Study, planner: Planner, seen) -> list[str]:
    """What went wrong along the way, one line each: unusable precisions, crashes, leaks."""
    notes = []
    unusable = planner.unusable_precisions(seen)
    policies = planner.unusable_policies(seen)
    for trial in script_trials(study):
        result = trial_result(trial)
        if result is None:
            continue
        precision, policy = result.config.precision, result.config.checkpoint_policy
        what = precision if precision in unusable else f"{policy} checkpointing" if policy in policies else None
        if what and result.status in ("error", "diverged"):
            notes.append(f"{what} is unusable here: {result.error_type}: "
                         f"{(result.error_message or '').splitlines()[0][:200]} (trial {trial.number})")
            if what == precision:
                unusable.discard(precision)
            else:
                policies.discard(policy)
        elif result.error_type in DATA_BOUND_ERRORS and trial.user_attrs.get("phase") != "confirm" \
                and any(o.status == "ok" for o in seen):
            notes.append(f"{result.config.size_label()} is more than the data can feed (the function ran "
                         f"out of batches before the probe's steps): the climb stopped below it (trial {trial.number})")
        elif result.status in ("crashed", "timeout"):
            status = "not measured" if result.error_type == BUDGET_CUT else result.status
            notes.append(f"trial {trial.number} ({result.config.label()}) {status}: "
                         f"{(result.error_message or '').splitlines()[0][:200]}")
        notes.extend(f"trial {trial.number}: {note}" for note in result.notes)
    return notes


def nothing_fits(done, budget: MemoryBudget) -> str:
    """Why nothing could be exported under `budget`, for the one-line error: memory when the probes ran out of it or
    crossed the headroom, and what really happened when they timed out, crashed or raised instead."""
    peaks = [o.peak_bytes for o in done if o.status == "ok" and o.peak_bytes]
    failed = [o for o in done if o.failed]
    slow = [o for o in done if o.status == "timeout"]
    if slow and not failed and not peaks and not any(o.status == "oom" for o in done):
        longest = max(slow, key=lambda o: o.wall_s)
        cut = sum(o.cut for o in slow)
        what = (f"{len(slow) - cut} timed out" if len(slow) > cut else "") + (
            f"{', ' if len(slow) > cut else ''}{cut} ran until the budget ended" if cut else "")
        return (f"No config could be measured: {len(slow)} probes ({what}) before any finished; the longest, "
                f"{longest.config.label()}, ran {longest.wall_s:.0f}s (trial {longest.trial}). Give the search a "
                f"longer --budget (at least {2 * longest.wall_s / 60:.0f}m: its start, compilation included, comes "
                f"before its first step) or a longer --probe-timeout; `autofit show --trial {longest.trial}` says "
                f"where it stopped, and its log what it was doing.")
    if failed and not peaks and not any(o.status == "oom" for o in done):
        gone = failed + [o for o in slow if o.timed_out]  # a timeout beside failures: said, with its remedy
        kinds = sorted({o.status for o in gone})
        smallest = min(gone, key=lambda o: o.config.size).config.label()
        what = {"timeout": "timed out", "crashed": "crashed", "error": "raised an error",
                "diverged": "diverged (non-finite loss)"}
        return (f"No config could be measured: {len(gone)} probes failed ("
                f"{', '.join(what[k] for k in kinds)}), none ran out of memory; the smallest tried was "
                f"{smallest}. See `autofit show` for each probe's error"
                + ("; a slow machine may need a longer --probe-timeout" if "timeout" in kinds else "") + ".")
    usable = budget.usable_bytes
    head = (f"Nothing fits under {format_size(usable)} usable ({format_size(budget.limit_bytes)} limit, "
            f"{budget.headroom:.0%} headroom)")
    crossed = _crossed_when_measured_again(done, usable)
    if crossed is not None:
        return (f"{head}: {crossed}, and no other config measured fits. Give the search more --trials or "
                f"--budget (it tries more checkpointing or a smaller size next), or keep less --headroom.")
    return f"{head}: {_smallest_need(done)}{_what_else(failed, [o for o in slow if o.timed_out])}."


def _smallest_need(done) -> str:
    """What the smallest config that ran (or ran out of memory) needed; `tried` where it is the smallest of
    all, else said as the smallest that got that far (smaller ones timed out or failed)."""
    smallest = min(o.config.size for o in done) if done else None
    measured = [o for o in done if o.status == "ok" and o.peak_bytes]
    if measured:
        least = min(measured, key=lambda o: (o.config.size, o.peak_bytes))
        which = "tried" if least.config.size == smallest else "measured"
        return f"the smallest config {which} ({least.config.label()}) needed {format_size(least.peak_bytes)}"
    ooms = [o for o in done if o.status == "oom"]
    if not ooms:
        return "no config was measured"
    least = min(ooms, key=lambda o: o.config.size)
    if least.config.size == smallest:
        return f"even the smallest config tried ({least.config.label()}) ran out of memory"
    return f"the smallest config that ran out of memory was {least.config.label()}; none smaller ran to its end"


def _what_else(failed, timed_out) -> str:
    """The probes that neither fit nor ran out of memory, counted, with what to do about them."""
    parts = ([f"{len(failed)} probes failed (see autofit show)"] if failed else []) + (
        [f"{len(timed_out)} timed out (a slow machine may need a longer --probe-timeout)"] if timed_out else [])
    return f"; {', '.join(parts)}" if parts else ""


def _crossed_when_measured_again(done, usable: float) -> str | None:
    """A config that fit in one probe and crossed the headroom (or ran out) in a later one, said with
    both figures: at the edge of the memory, a longer measurement met a batch or an allocation the
    first one did not, and the search had nothing left to try."""
    for first in done:
        if not first.fits(usable) or first.peak_bytes is None:
            continue
        later = next((o for o in done if o.config == first.config and o.too_big(usable)), None)
        if later is not None:
            again = "ran out of memory" if later.status == "oom" else f"read {format_size(later.peak_bytes)}"
            return (f"{first.config.label()} fit in a probe ({format_size(first.peak_bytes)}) but {again} when "
                    f"measured again")
    return None
