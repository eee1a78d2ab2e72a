"""Search strategies replayed against a recorded landscape.

Every strategy is a function `run(session) -> Config | None` that probes through `session.probe`
and returns the config it would train with. Before probing it may set `session.pick_rule`: what it
would answer if stopped now (default: the fastest measured config that fits the usable memory);
the session records that pick after every probe, which is how "probes to reach 97% of the best"
is measured.

Rules shared by all strategies:
- a probe that did not fit (status `oom`, or a peak above the usable memory) is a failed fit: the
  baselines treat it as the OOM a tool capped at the usable memory would see, and it counts as an
  OOM probe in the tables, for every strategy alike;
- off-grid batch sizes a baseline would try (0.9x, 1.05x a prediction) are snapped down to the
  nearest batch size of the landscape's grid.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autofit.config import Config
from autofit.planner import Observation, SearchSpace, Strategy
from benchmarks.landscape import Landscape

#: "Reaching the best": the strategy's pick is within this fraction of the grid's best throughput.
TARGET = 0.97

PickRule = Callable[[Sequence[Observation]], "Config | None"]


# --- replay session -------------------------------------------------------------------------------
class Session:
    """One strategy's run against one landscape with one noise seed: the probes and the picks."""

    def __init__(self, landscape: Landscape, *, seed: int = 0, noise: float = 1.0,
                 noise_model: str = "iqr", max_probes: int | None = None) -> None:
        self.landscape = landscape
        self.space = landscape.space
        self.usable = landscape.usable_bytes
        self.seed = seed
        self.noise = noise
        self.noise_model = noise_model
        self.max_probes = max_probes or 4 * len(landscape.configs()) + 10
        self.observations: list[Observation] = []
        self.picks: list[Config | None] = []
        self.pick_rule: PickRule = lambda obs: best_measured(obs, self.usable)
        #: (predicted range before the probe, measured peak) of every probe the planner predicted
        self.predictions: list[tuple[object, float]] = []
        self._repeats: dict[Config, int] = defaultdict(int)

    def probe(self, config: Config, length: float = 1.0, phase: str = "explore") -> Observation:
        """Replay one probe (noisy throughput, recorded wall time) and record the pick after it;
        `length`: measured steps relative to the recording's (see Landscape.probe)."""
        if len(self.observations) >= self.max_probes:
            raise BudgetExhausted(f"more than {self.max_probes} probes")
        obs = self.landscape.probe(config, noise=self.noise, seed=self.seed, repeat=self._repeats[config],
                                   noise_model=self.noise_model, length=length)
        if phase != "explore":
            obs = dataclasses.replace(obs, phase=phase)
        self._repeats[config] += 1
        self.observations.append(obs)
        self.picks.append(self.pick_rule(self.observations))
        return obs

    def fits(self, obs: Observation) -> bool:
        return obs.fits(self.usable)

    def reached(self) -> bool:
        """Whether some pick so far was within TARGET of the grid's best (measurement only)."""
        goal = TARGET * self.landscape.best_throughput()
        return any(self.landscape.true_throughput(p) >= goal for p in self.picks)


class BudgetExhausted(RuntimeError):
    """A strategy probed more than the session allows (a runaway loop)."""


def best_measured(observations: Sequence[Observation], usable: float) -> Config | None:
    """The config with the highest median measured samples/s among those that fit."""
    rates: dict[Config, list[float]] = defaultdict(list)
    bad: set[Config] = set()
    for o in observations:
        if o.fits(usable) and o.rate:
            rates[o.config].append(o.rate)
        elif o.status != "running":
            bad.add(o.config)
    scored = {c: statistics.median(r) for c, r in rates.items() if c not in bad}
    return max(scored, key=scored.get) if scored else None


# --- results ----------------------------------------------------------------------------------
@dataclass
class Result:
    """One strategy on one landscape with one seed."""

    strategy: str
    landscape: str
    seed: int
    probes: int
    seconds: float
    oom_probes: int
    pick: Config | None
    ratio: float  # true throughput of the pick / grid best
    probes_to_target: float  # math.inf: never
    seconds_to_target: float
    notes: list[str] = field(default_factory=list)
    predictions: list[tuple[object, float]] = field(default_factory=list)


def summarize(name: str, session: Session, pick: Config | None, budget: int | None = None,
              notes: list[str] | None = None) -> Result:
    """Score a finished session. With `budget`, the strategy is scored as if stopped after
    `budget` probes (its pick then), while the time to reach the target uses the whole run."""
    land = session.landscape
    obs = session.observations
    n = len(obs) if budget is None else min(budget, len(obs))
    if budget is not None:
        pick = session.picks[n - 1] if n else None
    goal = TARGET * land.best_throughput()
    to_probes, to_seconds, elapsed = math.inf, math.inf, 0.0
    for i, (o, p) in enumerate(zip(obs, session.picks)):
        elapsed += o.wall_s
        if land.true_throughput(p) >= goal:
            to_probes, to_seconds = i + 1, elapsed
            break
    best = land.best_throughput()
    return Result(
        strategy=name, landscape=land.name, seed=session.seed, probes=n,
        seconds=sum(o.wall_s for o in obs[:n]),
        oom_probes=sum(not o.fits(session.usable) and o.status in ("oom", "ok") for o in obs[:n]),
        pick=pick, ratio=land.true_throughput(pick) / best if best else 0.0,
        probes_to_target=to_probes, seconds_to_target=to_seconds, notes=list(notes or []),
        predictions=list(session.predictions),
    )


# --- helpers for the baselines ----------------------------------------------------------------
def baseline_strategy(space: SearchSpace) -> Strategy:
    """What the batch-size finders of Lightning, Accelerate and DeepSpeed search: fp32 (or the
    space's first precision), no checkpointing, the first accumulation."""
    first = space.strategies()[0]
    precision = "fp32" if "fp32" in space.values_of("precision") else space.values_of("precision")[0]
    return Strategy(precision=precision, checkpoint_segments=0, accumulation_steps=first.accumulation_steps)


def snap_down(space: SearchSpace, batch: float) -> int | None:
    """The largest grid batch size <= `batch` (None below the smallest)."""
    sizes = space.batch_sizes
    i = bisect.bisect_right(sizes, math.floor(batch + 1e-9))
    return sizes[i - 1] if i else None


# --- (a) autofit ------------------------------------------------------------------------------
def _planner_class():
    try:
        from autofit.planner import Planner
        return Planner, None
    except ImportError:
        return StandInPlanner, "stand-in planner (autofit.planner._planner missing)"


class StandInPlanner:
    """Used only while autofit's planner does not exist: per strategy, double until it no longer fits."""

    def __init__(self, space: SearchSpace, usable_bytes: float) -> None:
        self.space, self.usable = space, usable_bytes

    def next(self, observations: Sequence[Observation]) -> Config | None:
        tried = {o.config: o for o in observations}
        for strategy in self.space.strategies():
            for b in self.space.batch_sizes[::2]:
                c = self.space.config(strategy, b)
                if c not in tried:
                    return c
                if not tried[c].fits(self.usable):
                    break
        return None

    def best(self, observations: Sequence[Observation]) -> Config | None:
        return best_measured(observations, self.usable)


def autofit_search(session: Session, recheck: bool = True, estimates: bool = True) -> Config | None:
    """(a) autofit's Planner with the memory estimator's predictions (when the landscape has them):
    recheck a suspect measurement if there is one (as the live search does), else ask for the next
    config, probe it, until the planner says done."""
    planner_cls, _ = _planner_class()
    prediction = session.landscape.prediction() if estimates else None
    planner = (planner_cls(session.space, session.usable, check_noise=recheck, prediction=prediction)
               if prediction is not None else planner_cls(session.space, session.usable, check_noise=recheck))
    session.pick_rule = planner.best
    while True:
        suspect = planner.recheck(session.observations)
        if suspect is not None:
            session.probe(suspect, phase="recheck")
            continue
        config = planner.next(session.observations)
        if config is None:
            return planner.best(session.observations)
        predicted = planner.predicted_peak(config, session.observations) if prediction is not None else None
        observed = session.probe(config)
        if predicted is not None and observed.status == "ok" and observed.peak_bytes:
            session.predictions.append((predicted, float(observed.peak_bytes)))


def autofit_no_recheck_search(session: Session) -> Config | None:
    """(a'') The Planner loop believing every measurement: what autofit did before it learnt to
    notice interference. Compared with (a) under the `interference` noise model."""
    return autofit_search(session, recheck=False)


def autofit_no_estimate_search(session: Session) -> Config | None:
    """(a''') The Planner loop without the memory estimator: memory learnt from probes alone."""
    return autofit_search(session, estimates=False)


def autofit_remeasure_search(session: Session) -> Config | None:
    """(a') The Planner loop, then the live search's remeasure step (autofit/search/_phases.py): the
    up to three best contenders within 5% of the best, probed once so far, are probed again with
    twice the steps; then planner.best. (The live search's final long confirmation run is left
    out: it costs time but cannot change the pick in a replay, where feasibility is recorded.)"""
    planner_cls, _ = _planner_class()
    planner = planner_cls(session.space, session.usable)
    autofit_search(session)
    if not hasattr(planner, "ranked"):
        return planner.best(session.observations)
    ranked = planner.ranked(session.observations)
    for candidate in ranked[:3]:
        if candidate.rate >= 0.95 * ranked[0].rate and candidate.probes <= 1:
            session.probe(candidate.config, length=2.0, phase="remeasure")
    return planner.best(session.observations)


# --- (b) grid ---------------------------------------------------------------------------------
def grid_search(session: Session) -> Config | None:
    """(b) Exhaustive grid: every config once, strategy by strategy, smallest batch first."""
    for config in session.space.configs():
        session.probe(config)
    return best_measured(session.observations, session.usable)


# --- (c) random -------------------------------------------------------------------------------
def random_search(session: Session, budget: int) -> Config | None:
    """(c) Random search: configs drawn uniformly without replacement from the grid.

    Scored after `budget` probes; kept going (at most the whole grid) until its pick first reaches
    the target, only to measure how long that takes."""
    configs = session.space.configs()
    random.Random(f"random|{session.seed}").shuffle(configs)
    for config in configs:
        if len(session.observations) >= budget and session.reached():
            break
        session.probe(config)
    return best_measured(session.observations, session.usable)


# --- (d) Optuna TPE ---------------------------------------------------------------------------
def tpe_search(session: Session, budget: int, max_trials: int | None = None) -> Config | None:
    """(d) Optuna's default TPESampler (seeded): batch as an ordinal index into the grid, precision,
    checkpoint level and accumulation as categoricals; objective samples/s (maximised); a failed
    fit sets a positive constraint via trial.set_constraint (OOM: objective 0).

    A config TPE proposes again is answered from its earlier probe at no cost (conservative in
    TPE's favour). Scored after `budget` probes; kept going (at most `max_trials` trials, default
    4x the grid) until its pick reaches the target, to measure how long that takes."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    space = session.space
    sampler = optuna.samplers.TPESampler(seed=session.seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: dict[Config, Observation] = {}
    max_trials = max_trials or 4 * len(space.configs())
    strategies = space.strategies()
    for _ in range(max_trials):
        if len(session.observations) >= budget and session.reached():
            break
        if len(session.observations) >= len(space.configs()) and len(seen) == len(space.configs()):
            break
        trial = study.ask()
        b = space.batch_sizes[trial.suggest_int("batch_index", 0, len(space.batch_sizes) - 1)]
        precision = trial.suggest_categorical("precision", list(space.values_of("precision")))
        k = trial.suggest_categorical("checkpoint_segments", list(space.values_of("checkpoint_segments")))
        accs = sorted({s.accumulation_steps for s in strategies}, key=lambda a: a or 0)
        acc = accs[0] if len(accs) == 1 else trial.suggest_categorical("accumulation", accs)
        config = space.config(Strategy(precision=precision, checkpoint_segments=k, accumulation_steps=acc), b)
        obs = seen.get(config) or session.probe(config)
        seen[config] = obs
        if obs.status == "oom":
            trial.set_constraint("memory", 1.0)
            value = 0.0
        elif obs.status == "ok":
            trial.set_constraint("memory", (obs.peak_bytes or 0) / session.usable - 1.0)
            value = obs.rate or 0.0
        else:
            trial.set_constraint("failed", 1.0)
            value = 0.0
        study.tell(trial, value)
    return best_measured(session.observations, session.usable)


# --- (e) Lightning-like -------------------------------------------------------------------------
def _largest_fit(session: Session, strategy: Strategy) -> Config | None:
    fits = [o.config for o in session.observations
            if session.fits(o) and session.space.strategy_of(o.config) == strategy]
    return max(fits, key=lambda c: c.batch_size) if fits else None


def power_search(session: Session) -> Config | None:
    """(e) Lightning's BatchSizeFinder, mode "power": fp32, no checkpointing; start at batch 2,
    double until a probe fails to fit; take the last that fit (batch 1 if 2 already fails)."""
    space, strategy = session.space, baseline_strategy(session.space)
    session.pick_rule = lambda obs: _largest_fit(session, strategy)
    sizes = space.batch_sizes
    b = snap_down(space, 2) or sizes[0]
    while True:
        obs = session.probe(space.config(strategy, b))
        if not session.fits(obs):
            break
        if b * 2 > sizes[-1] or b * 2 not in sizes:
            break
        b *= 2
    pick = _largest_fit(session, strategy)
    if pick is None and b > sizes[0]:
        smaller = snap_down(space, b // 2) or sizes[0]
        session.probe(space.config(strategy, smaller))
        pick = _largest_fit(session, strategy)
    return pick


def binsearch_search(session: Session) -> Config | None:
    """(e') Lightning's mode "binsearch": double from 2 until a failure, then bisect (over the
    grid) between the last fit and the first failure; take the largest that fit."""
    space, strategy = session.space, baseline_strategy(session.space)
    session.pick_rule = lambda obs: _largest_fit(session, strategy)
    sizes = list(space.batch_sizes)
    b = snap_down(space, 2) or sizes[0]
    low, high = None, None  # grid indices: last fit, first failure
    while True:
        obs = session.probe(space.config(strategy, b))
        if not session.fits(obs):
            high = sizes.index(b)
            break
        low = sizes.index(b)
        if b * 2 > sizes[-1] or b * 2 not in sizes:
            break
        b *= 2
    if high is not None:
        lo = low if low is not None else -1
        while high - lo > 1:
            mid = (lo + high) // 2
            obs = session.probe(space.config(strategy, sizes[mid]))
            if session.fits(obs):
                lo = mid
            else:
                high = mid
    return _largest_fit(session, strategy)


# --- (f) Accelerate / HF Trainer-like --------------------------------------------------------------
def accelerate_search(session: Session, start: int = 128, factor: float = 0.9) -> Config | None:
    """(f) Accelerate's find_executable_batch_size (HF Trainer auto_find_batch_size): fp32, no
    checkpointing; start at 128, on each failure multiply by 0.9 (rounded down, snapped to the next
    smaller grid size) until one runs; take it."""
    space, strategy = session.space, baseline_strategy(session.space)
    session.pick_rule = lambda obs: _largest_fit(session, strategy)
    b = snap_down(space, start) or space.batch_sizes[0]
    while True:
        obs = session.probe(space.config(strategy, b))
        if session.fits(obs):
            return obs.config
        smaller = snap_down(space, int(b * factor))
        if smaller is not None and smaller >= b:
            smaller = snap_down(space, b - 1)
        if smaller is None:
            return None
        b = smaller


# --- (g) DeepSpeed-like -------------------------------------------------------------------------
def model_state_bytes(landscape: Landscape, strategy: Strategy) -> float:
    """The memory a strategy needs before its first sample: the intercept of a least-squares line
    through the recorded (batch, peak) of its configs that ran. It stands in for what DeepSpeed
    computes from the parameter count (weights, gradients and optimizer states), which a landscape
    does not record."""
    points = [(c.batch_size, float(e.peak_bytes)) for c, e in landscape.entries.items()
              if e.status == "ok" and e.peak_bytes and landscape.space.strategy_of(c) == strategy]
    if len({b for b, _ in points}) < 2:
        return float(landscape.baseline_bytes or 0)
    n = len(points)
    mx, my = sum(b for b, _ in points) / n, sum(p for _, p in points) / n
    slope = sum((b - mx) * (p - my) for b, p in points) / sum((b - mx) ** 2 for b, _ in points)
    return max(0.0, my - slope * mx)


def deepspeed_search(session: Session) -> Config | None:
    """(g) DeepSpeed-autotuning-like: fp32, no checkpointing; profile at the smallest batch of the
    grid, extrapolate memory linearly from the model states (`model_state_bytes`, an oracle for
    DeepSpeed's analytic estimate) through the profiled peak to the largest batch predicted to
    fit; try 1.05x, 1x and 0.95x of it (snapped down to the grid); if none fits, bisect between the
    largest fit and the smallest failure. Take the fastest measured config that fit."""
    land, space, strategy = session.landscape, session.space, baseline_strategy(session.space)
    sizes = list(space.batch_sizes)
    profile = session.probe(space.config(strategy, sizes[0]))
    if not session.fits(profile) or not profile.peak_bytes:
        return best_measured(session.observations, session.usable)
    fixed = min(model_state_bytes(land, strategy), profile.peak_bytes - 1.0)
    per_sample = (profile.peak_bytes - fixed) / sizes[0]
    predicted = (session.usable - fixed) / per_sample
    tried: list[int] = []
    for f in (1.05, 1.0, 0.95):
        b = snap_down(space, min(predicted * f, sizes[-1]))
        if b is not None and b not in tried and b != sizes[0]:
            tried.append(b)
            session.probe(space.config(strategy, b))
    fit_sizes = [o.config.batch_size for o in session.observations if session.fits(o)]
    failed = [o.config.batch_size for o in session.observations if not session.fits(o)]
    if tried and all(b in failed for b in tried):
        lo, hi = sizes.index(max(fit_sizes)), sizes.index(min(failed))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            obs = session.probe(space.config(strategy, sizes[mid]))
            if session.fits(obs):
                lo = mid
            else:
                hi = mid
    return best_measured(session.observations, session.usable)


# --- registry ---------------------------------------------------------------------------------
#: name -> (function, needs the autofit budget)
STRATEGIES: dict[str, Callable[..., Config | None]] = {
    "autofit": autofit_search,
    "autofit+remeasure": autofit_remeasure_search,
    "autofit-no-recheck": autofit_no_recheck_search,
    "autofit-no-estimate": autofit_no_estimate_search,
    "grid": grid_search,
    "random": random_search,
    "tpe": tpe_search,
    "lightning-power": power_search,
    "lightning-binsearch": binsearch_search,
    "accelerate": accelerate_search,
    "deepspeed": deepspeed_search,
}
BUDGETED = ("random", "tpe")


def run_strategy(name: str, landscape: Landscape, *, seed: int, noise: float = 1.0,
                 noise_model: str = "iqr", budget: int | None = None) -> Result:
    """Run one strategy on one landscape; `budget` (probes) is required for random and TPE."""
    session = Session(landscape, seed=seed, noise=noise, noise_model=noise_model)
    notes: list[str] = []
    if name.startswith("autofit"):
        _, note = _planner_class()
        if note:
            notes.append(note)
    fn = STRATEGIES[name]
    try:
        pick = fn(session, budget) if name in BUDGETED else fn(session)
    except BudgetExhausted as exc:
        notes.append(f"stopped: {exc}")
        pick = session.pick_rule(session.observations)
    return summarize(name, session, pick, budget=budget if name in BUDGETED else None, notes=notes)
