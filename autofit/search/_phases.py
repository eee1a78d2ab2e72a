"""The phases of a search, in order: explore (the planner's configs, and suspect measurements
rechecked, on every runner at once), remeasure (the close contenders measured again, longer), confirm
(an A/B of the configs within the noise of the leader, alternating, over longer rounds) and export
(the best-config file). Each phase asks the sampler what its next trial would probe
(`AutofitSampler.propose`), checks that the clock allows it, and probes it through the search's state
(`SearchState.start_probe`, `SearchState.finish_probe`); the loop (`Search`) calls them in order."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from typing import TYPE_CHECKING

from autofit.errors import NoFeasibleConfig, UserCodeError
from autofit.export import default_best_path, device_tag, write_best
from autofit.findings import UNCONFIRMED_BUDGET, best_document, fault_notes, nothing_fits, undecided_reason
from autofit.planner import ABPlan, Observation
from autofit.probing import BUDGET_CUT, ProbeResult
from autofit.search._build_space import loader_note
from autofit.search._sampler import Proposal
from autofit.search._settings import SearchResult
from autofit.search._state import RunningProbe, SearchState
from autofit.study import other_script_probes, record_end

if TYPE_CHECKING:
    from autofit.search._pool import Runner


def explore(state: SearchState) -> str:
    """Keep every runner busy with the sampler's next trial (the planner's next config, or a suspect one
    to recheck) until the budget, --trials or the planner stop it; record each probe as it finishes.
    Returns why it stopped."""
    free = list(state.pool.runners)
    running: dict[Future, RunningProbe] = {}
    stopped: str | None = None
    knobs_known = False  # once known, always known: no need to read the study again
    try:
        while True:
            knobs_known = knobs_known or state.session.offers() is not None
            while free and stopped is None and (knobs_known or not running):
                launch = _next_explore(state, len(running), free[-1])
                if isinstance(launch, str):
                    stopped = launch
                elif launch is None:
                    break  # nothing new until a running probe reports
                else:
                    runner = free.pop()
                    probe = state.start_probe(runner, state.s.steps)
                    if probe is None:
                        free.append(runner)  # another searcher claimed the config first
                        continue
                    running[probe.future] = probe
            if not running:
                if stopped is not None:
                    return stopped
                time.sleep(1.0)  # another searcher's probes are running: what they find decides
                done = set()
            else:
                done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in done:
                probe = running.pop(future)
                free.append(probe.runner)
                result = state.finish_probe(probe)
                if probe.proposal.phase == "explore":
                    _check_fatal(result, state.session.observations(exclude=probe.trial.number))
                    state.learn_knobs(result)
            state.session.check_liveness()  # a searcher that died: its configs are probed again (by anyone)
    finally:
        for probe in running.values():  # an interruption or a fault: stop them at once
            probe.runner.kill()


def _next_explore(state: SearchState, running: int, runner: Runner) -> Proposal | str | None:
    """What the free `runner` probes next; a reason (str) to stop launching; or None when nothing is
    worth probing until the probes running now report."""
    if state.s.trials is not None and state.probes_this_run + running >= state.s.trials:
        return f"reached --trials {state.s.trials}"
    study, budget = state.session.study, state.time_budget
    seen = state.session.observations()
    proposal = state.sampler.propose(study, "explore")
    if proposal is None:
        if running or any(o.status == "running" for o in seen):
            return None  # what the probes running now (here or in another searcher) find decides
        return "the planner had nothing left worth probing"
    # Nothing measured yet that the space asks for (a token function's pilot came before its knobs): a probe
    # while any budget is left (it is killed at the budget's end at worst).
    measured = state.planner.best(seen) is not None
    reserve = budget.decision_reserve(state.planner, seen, study) if measured else 0.0
    if budget.left() < budget.next_probe_estimate(seen, proposal.config, runner.next_start_s) + reserve:
        if measured or budget.left() < _LAST_TRY_S:
            return ("the time budget (a compiled probe compiles first)" if proposal.config.compile
                    else "the time budget")
    return proposal


#: With nothing measured, a probe is still started while this much of the budget is left.
_LAST_TRY_S = 10.0


def _check_fatal(result: ProbeResult, seen: list[Observation]) -> None:
    """The function raised before any probe ran: a bug to fix, not a config to rule out."""
    if result.status == "error" and not any(o.status in ("ok", "oom") for o in seen):
        raise UserCodeError(
            f"The training function raised on the first probe ({result.config.label()}): "
            f"{result.error_type}: {(result.error_message or '').splitlines()[0] if result.error_message else ''}\n"
            f"{result.traceback or ''}".rstrip()
            + f"\nFix the error (its output is in {result.log_path}); nothing was exported."
        )


def remeasure(state: SearchState, runner: Runner) -> None:
    """Noise: the close contenders (within the noise of the best, measured once) get a second
    measurement, twice as long, before a winner is named, as long as the A/B still fits after it."""
    study, budget = state.session.study, state.time_budget
    steps = state.s.steps * 2
    while (proposal := state.sampler.propose(study, "remeasure")) is not None:
        seen = state.session.observations()
        if budget.left() < budget.confirm_estimate(study, proposal.config, steps) \
                + budget.shortest_ab(state.planner, seen, study):
            break
        state.probe(runner, steps)


def confirm(state: SearchState, runner: Runner) -> None:
    """The confirmation, an A/B: the configs within the noise of the leader (`Planner.ab_entrants`) run
    in turn (A, B, C, A, B, C, ...) over rounds longer than a probe, and the median of each one's rounds
    is its figure (see `Measurement`), so the winner is the one the A/B favours. A config no A/B measured
    whose short probes read faster than the winner's rounds beyond the noise is confirmed in turn (three A/Bs
    at most: `Planner.ab_entrants`); a winner the budget left no room for stays unconfirmed, and says why."""
    led = state.planner.best(state.session.observations())  # the leader before any A/B
    _confirm_rounds(state, runner)
    # one note, on the winner the A/Bs leave: a later A/B may hand the win back (a note per A/B contradicted it)
    first = state.planner.best(state.session.observations())
    if led is not None and first is not None and first != led:
        state.notes.append(f"the A/B changed the winner: {first.label()} ranks first now, "
                           f"above {led.label()}, which led before it")


def _confirm_rounds(state: SearchState, runner: Runner) -> None:
    """`confirm`'s A/Bs, three at most; notes what the budget left out. The leader alone is measured longer
    only once its strategy has climbed to its memory edge (otherwise the budget went to the climb)."""
    study = state.session.study
    for _ in range(3):
        seen = state.session.observations()
        entrants = state.planner.ab_entrants(seen)
        if not entrants:
            return
        if len(entrants) == 1 and state.planner.leader_can_climb(seen):
            state.notes.append(f"{entrants[0].label()} is unconfirmed: its strategy could still climb when the "
                               f"budget ran out (a longer --budget climbs it, then measures the winner longer)")
            return
        plan = state.time_budget.ab_plan(study, entrants, since=max((o.trial for o in seen if o.trial is not None),
                                                                 default=-1))
        if plan is None:
            undecided = _undecided(state, seen)
            if undecided:
                state.notes.append(f"{entrants[0].label()} is unconfirmed: {undecided_reason(undecided)}")
            else:
                state.notes.append(f"{entrants[0].label()} is unconfirmed: {UNCONFIRMED_BUDGET}")
            return
        if len(plan.entrants) < len(entrants):
            state.notes.append(f"the A/B left out {', '.join(c.label() for c in entrants[len(plan.entrants):])}, "
                               f"within the noise of the leader: the budget left could not hold them")
        if not _run_ab(state, runner, plan):
            return


def _undecided(state: SearchState, seen: list) -> str | None:
    """Why the leader's A/B rounds decide nothing yet (they disagree beyond the noise); None: they do, or it
    has none."""
    ranked = state.planner.ranked(seen)
    return ranked[0].measurement.undecided if ranked and ranked[0].measurement is not None else None


def _run_ab(state: SearchState, runner: Runner, plan: ABPlan) -> bool:
    """`plan`'s rounds, one after another on `runner`; False when the budget ran out before its end."""
    study, budget = state.session.study, state.time_budget
    while (proposal := state.sampler.propose(study, "confirm", plan)) is not None:
        if budget.left() < budget.confirm_estimate(study, proposal.config, plan.steps):
            state.notes.append(f"the A/B stopped before its end: the budget ran out "
                               f"({proposal.config.label()}'s next round did not fit)")
            return False
        result = state.probe(runner, plan.steps)
        if result is None:
            return False  # another searcher claimed the round: its A/B decides
        if result.error_type == BUDGET_CUT:  # no verdict: the round measured nothing
            state.notes.append(f"the A/B stopped before its end: the budget ran out during {proposal.config.label()}'s "
                               f"round (not measured; its probes stand)")
            return False
        if not (result.ok and (result.peak_bytes or 0) <= state.session.memory_budget.usable_bytes):
            state.notes.append(f"{proposal.config.label()} failed its A/B round "
                               f"({result.status if result.status != 'ok' else 'over the headroom'}): "
                               f"it runs no more rounds")
            plan = replace(plan, entrants=tuple(c for c in plan.entrants if c != proposal.config))
    return True


def export(state: SearchState, stopped: str, partial: bool) -> SearchResult:
    """The search's result, and the best-config file written from the study (none when nothing fits)."""
    session, planner = state.session, state.planner
    study = session.study
    seen = session.observations()
    state.notes[:0] = fault_notes(study, planner, seen)
    noisy = planner.noise_summary(seen)
    if noisy:
        state.notes.append(noisy)
    shared_loader = loader_note(state.s) if planner.space.loader.offered else None
    if shared_loader:
        state.notes.append(shared_loader)
    done = [o for o in seen if o.status != "running"]
    ranked = planner.ranked(seen)
    record_end(study, stopped, partial)
    result = SearchResult(
        best=ranked[0].config if ranked else None, document=None, json_path=None, ranked=ranked,
        study_name=session.study_name, storage=session.storage_label, probes=len(done),
        ooms=sum(o.too_big(session.memory_budget.usable_bytes) for o in done), failed=sum(o.failed for o in done),
        elapsed_s=time.monotonic() - state.started, stopped=stopped, partial=partial,
        usable_bytes=session.memory_budget.usable_bytes, notes=state.notes, url=session.s.storage,
    )
    if not ranked:
        if partial:
            return result
        raise NoFeasibleConfig(_nothing_to_export(state, done, stopped))
    document = best_document(study, session.storage_label, planner=planner, stopped=stopped, partial=partial)
    result.why = document.why
    device = session.device_info
    path = state.s.out or default_best_path(session.script, state.info.function, session.output_dir,
                                             device_tag(device.type, device.name))
    lowered_note = _lowered_run_note(path)
    if lowered_note:
        result.notes.append(lowered_note)
    result.json_path = write_best(path, document)
    result.document = document
    return result


def _nothing_to_export(state: SearchState, done: list[Observation], stopped: str) -> str:
    """Why a finished search exports nothing: nothing fits, or nothing was probed; the probes of another
    version of the script are not ranked (they measured another model), and are counted apart."""
    session = state.session
    said = (nothing_fits(done, session.memory_budget) if done else
            f"A search must probe a config to export one, but this one stopped ({stopped}) before its first "
            f"probe: give it a longer --budget.")
    others = other_script_probes(session.study, session.version)
    return said + (f" ({others} of the study's probes ran another version of the script: they are kept but not "
                   f"ranked.)" if others else "")


def _lowered_run_note(best_path: str) -> str | None:
    """What a real run with the previous answer recorded when it ran out of memory, if it did."""
    from autofit.runtime import lowered_path, read_lowerings

    recorded = read_lowerings(lowered_path(best_path))
    if not recorded or not recorded.lowerings:
        return None
    first = recorded.lowerings[0]
    before, after = first.before, recorded.ended_with
    return (f"a real run of {before.label()} ran out of memory at step {first.step} ({first.where}) and went "
            f"on with {after.label()} ({lowered_path(best_path)}): if its inputs grow beyond what the probes "
            f"saw, keep more --headroom or probe with the largest inputs")
