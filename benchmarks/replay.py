"""Replay every recorded landscape with every strategy over many seeds; print markdown tables.

    python -m benchmarks.replay [--seeds 20] [--noise 1.0] [--noise-models iqr,runs]
                                [--out benchmarks/results.md]

Per landscape and strategy, medians over seeds of: probes, probe-seconds, probes and probe-seconds
until the strategy's pick first reaches 97% of the grid's best true throughput ("never" counts as
infinitely many), OOM probes, and the true throughput of the final pick divided by the grid's best
(median and min). "True throughput" is the recorded, noise-free samples/s of a config; a config
counts only if it is feasible: it ran (status ok) with a peak <= limit * (1 - headroom).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence

from autofit.units import format_size
from benchmarks.landscape import Landscape, landscape_paths
from benchmarks.strategies import BUDGETED, STRATEGIES, TARGET, Result, run_strategy

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.md")
BASELINES = ("lightning-power", "lightning-binsearch", "accelerate", "deepspeed", "grid", "random", "tpe")


def replay_landscape(landscape: Landscape, seeds: int, noise: float = 1.0,
                     strategies: Sequence[str] = tuple(STRATEGIES),
                     noise_model: str = "iqr") -> dict[str, list[Result]]:
    """Every strategy over `seeds` seeds; random and TPE get autofit's probe count of that seed."""
    results: dict[str, list[Result]] = {name: [] for name in strategies}
    for seed in range(seeds):
        auto = run_strategy("autofit", landscape, seed=seed, noise=noise, noise_model=noise_model)
        budget = max(1, auto.probes)
        for name in strategies:
            if name == "autofit":
                results[name].append(auto)
            else:
                results[name].append(run_strategy(name, landscape, seed=seed, noise=noise,
                                                  noise_model=noise_model,
                                                  budget=budget if name in BUDGETED else None))
    return results


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _num(x: float, digits: int = 0) -> str:
    if math.isinf(x):
        return "never"
    if math.isnan(x):
        return "-"
    return f"{x:.{digits}f}"


def _count(x: float) -> str:
    """A median count: whole, or .5 when the median falls between two seeds."""
    return _num(x, 1 if not math.isinf(x) and x % 1 else 0)


def _reach(results: Sequence[Result]) -> str:
    n = sum(not math.isinf(r.probes_to_target) for r in results)
    probes = _median([r.probes_to_target for r in results])
    seconds = _median([r.seconds_to_target for r in results])
    if math.isinf(probes):
        return f"never ({n}/{len(results)})"
    return f"{_count(probes)} / {_num(seconds)} s ({n}/{len(results)})"


def table(landscape: Landscape, results: dict[str, list[Result]]) -> str:
    """The markdown table of one landscape (plus a line describing it)."""
    best = landscape.best_config()
    feasible = sum(landscape.feasible(c) for c in landscape.configs())
    meta = landscape.meta
    lines = [
        f"### {landscape.name}",
        "",
        f"{meta.get('study', '?')}: {len(landscape.configs())} configs "
        f"({len(landscape.space.batch_sizes)} batch sizes {landscape.space.batch_sizes[0]}-"
        f"{landscape.space.batch_sizes[-1]} × {len(landscape.space.strategies())} strategies), "
        f"{feasible} feasible; limit {format_size(landscape.memory_limit_bytes)}, headroom "
        f"{landscape.headroom:.0%} (usable {format_size(landscape.usable_bytes)}); grid best "
        f"**{best.label() if best else None}** at {landscape.best_throughput():.1f} samples/s; "
        f"full grid {landscape.grid_seconds():.0f} probe-s"
        + (f"; recorded in {meta['recording_s']:.0f} s" if "recording_s" in meta else "") + ".",
        "",
        "| strategy | probes | probe-s | to 97%: probes / probe-s (reached) | OOM probes | final ÷ best: median | min |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, rs in results.items():
        lines.append(
            f"| {name} | {_count(_median([r.probes for r in rs]))} | {_num(_median([r.seconds for r in rs]))} | "
            f"{_reach(rs)} | {_count(_median([r.oom_probes for r in rs]))} | "
            f"{_median([r.ratio for r in rs]):.3f} | {min(r.ratio for r in rs):.3f} |"
        )
    notes = sorted({n for rs in results.values() for r in rs for n in r.notes})
    if notes:
        lines += ["", *(f"- note: {n}" for n in notes)]
    return "\n".join(lines)


def prediction_errors(landscape: Landscape, results: dict[str, list[Result]]) -> str:
    """How the memory predictions autofit probed with compared with the peaks then measured: raw
    (tensor bytes plus the estimator's baseline) and calibrated (the range's middle), and how often
    the range held the measured peak."""
    pairs = [p for r in results.get("autofit", []) for p in r.predictions]
    anchored = [(r, peak) for r, peak in pairs if math.isfinite(r.high)]
    if not anchored:
        return "Memory predictions: none (no estimates recorded: python -m benchmarks.record_estimates)."
    errors = sorted(abs(r.middle / peak - 1) for r, peak in anchored)
    held = sum(r.low <= peak <= r.high for r, peak in anchored)
    prediction = landscape.prediction()
    raw = sorted(abs((prediction.device_bytes + prediction.tensor_bytes(c)) / landscape.entries[c].peak_bytes - 1)
                 for c in landscape.configs() if landscape.entries[c].status == "ok"
                 and landscape.entries[c].peak_bytes and prediction.tensor_bytes(c) is not None)
    p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
    return (f"Memory predictions (estimator, `python -m benchmarks.record_estimates`): raw estimate + "
            f"baseline vs measured peak over the {len(raw)} configs that ran: |error| median {statistics.median(raw):.1%}, "
            f"max {max(raw):.1%}. Calibrated, as autofit's probes met them ({len(anchored)} probes over the seeds, "
            f"{len(pairs) - len(anchored)} more before any peak anchored them): |middle of range − measured| "
            f"median {statistics.median(errors):.1%}, p90 {p90:.1%}, max {errors[-1]:.1%}; the range held the "
            f"measured peak in {held / len(anchored):.0%}.")


def targets(landscape: Landscape, results: dict[str, list[Result]]) -> tuple[str, bool]:
    """autofit's targets on one landscape, as markdown bullets, and whether all were met."""
    auto = results.get("autofit")
    if not auto:
        return "", True
    ratio = _median([r.ratio for r in auto])
    worst = min(r.ratio for r in auto)
    seconds = _median([r.seconds for r in auto])
    grid_s = landscape.grid_seconds()
    ooms = _median([r.oom_probes for r in auto])
    checks: list[tuple[str, bool]] = [
        (f"final ≥ {TARGET:.2f} of best: median {ratio:.3f} (min {worst:.3f})", ratio >= TARGET),
        (f"probe-seconds ≤ 15% of the grid's: {seconds:.0f} s = {seconds / grid_s:.1%} of {grid_s:.0f} s",
         seconds <= 0.15 * grid_s),
    ]
    others = {n: _median([r.oom_probes for r in rs]) for n, rs in results.items() if n in BASELINES}
    if others:
        # Strictly fewer than every baseline; a baseline with none too can only be tied (at 0).
        fewest = min(others, key=others.get)
        met = all(ooms < v or ooms == v == 0 for v in others.values())
        ties = [n for n, v in others.items() if v == ooms]
        checks.append((f"fewer OOM probes than every baseline (median): autofit {_count(ooms)}, fewest baseline "
                       f"{_count(others[fewest])} ({fewest})" + (f"; tied with {', '.join(ties)}" if ties else ""),
                       met))
    if "tpe" in results:
        tpe = _median([r.probes_to_target for r in results["tpe"]])
        probes = _median([r.probes_to_target for r in auto])
        checks.append((f"probes to reach 97% ≤ half of TPE's (medians): {_count(probes)} vs {_count(tpe)}",
                       probes <= 0.5 * tpe))
    text = "\n".join(f"- [{'x' if ok else ' '}] {line}" for line, ok in checks)
    return f"Targets for autofit ({landscape.name}):\n\n{text}", all(ok for _, ok in checks)


PREAMBLE = """# autofit search benchmark

Replayed from recorded CPU landscapes (`benchmarks/landscapes/*.json`: every config probed for real
under a memory limit, see `meta` in each file for the recording command) with
`{command}`.

- Throughput in a replayed probe carries seeded log-normal noise: sigma = noise scale × the config's
  recorded step-time IQR / median / 1.349 (noise model `iqr`), or × the typical spread between two
  recorded probes of one config (model `runs`, which on this shared 2-core machine also carries the
  other jobs' changing load); at most 0.25. The same probe draws the same noise in every strategy.
  Status and peak memory replay as recorded; each probe is charged its recorded wall time.
- True throughput: recorded, noise-free samples/s (the fastest of the recorded runs); feasible:
  status ok and peak ≤ limit × (1 − headroom). "final ÷ best" is the true throughput of the config
  a strategy picks over the grid's best (0 for none or an infeasible pick).
- to 97%: probes and probe-seconds until the strategy's pick (what it would answer if stopped then)
  first reaches 97% of the best; medians over seeds with "never" counted as infinite; (reached) says
  in how many seeds it did.
- OOM probes: probes that did not fit (out of memory, or ran with a peak inside the headroom).
- random and tpe are scored after as many probes as autofit used with the same seed (the columns
  probes, probe-s, OOM probes and final); their "to 97%" continues the same run (random: without
  replacement, at most the whole grid; TPE: at most 4× the grid's trials, a repeated config answered
  from its first probe at no cost).
- autofit is the Planner loop (ask, probe, until it returns None; pick = planner.best);
  autofit+remeasure adds the live search's remeasure step (the close contenders probed again with
  twice the steps), not its final confirmation run.
- grid probes every config once, implied OOMs included (charged the wall of the OOM that implied them).
- lightning-power / lightning-binsearch / accelerate / deepspeed search the batch size only, in
  fp32 without checkpointing, as those tools do; off-grid sizes they would try are snapped down to
  the grid; deepspeed profiles at the smallest batch of the grid.
"""


def run_section(paths: Sequence[str], seeds: int, noise: float, noise_model: str,
                strategies: Sequence[str], heading: str) -> tuple[str, bool]:
    """Tables and target checks for every landscape under one noise model."""
    parts = [f"## {heading}\n"]
    all_met = True
    for path in paths:
        landscape = Landscape.load(path)
        started = time.perf_counter()
        results = replay_landscape(landscape, seeds, noise, strategies, noise_model)
        check, met = targets(landscape, results)
        all_met &= met
        sigmas = sorted(landscape.sigma(c, noise_model) for c in landscape.configs()
                        if landscape.entries[c].status == "ok")
        noise_line = (f"Replay noise ({noise_model}): median sigma {noise * statistics.median(sigmas):.3f}."
                      if sigmas and noise > 0 else "Replay noise: none.")
        block = (f"{table(landscape, results)}\n\n{noise_line}\n\n{prediction_errors(landscape, results)}\n\n"
                 f"{check}\n")
        print(block)
        print(f"(replayed in {time.perf_counter() - started:.1f} s)\n", file=sys.stderr)
        parts.append(block)
    parts.append(f"All autofit targets met ({heading}): {'yes' if all_met else 'no'}.\n")
    print(parts[-1])
    return "\n".join(parts), all_met


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--noise", type=float, default=1.0, help="noise scale (0: noise-free replay)")
    parser.add_argument("--noise-models", default="iqr,runs",
                        help="comma-separated: iqr (primary; the targets) and/or runs (robustness)")
    parser.add_argument("--landscape", action="append", default=None, help="JSON path (default: all)")
    parser.add_argument("--strategy", action="append", default=None, choices=list(STRATEGIES))
    parser.add_argument("--out", default=RESULTS_PATH, help="markdown file to write ('-': none)")
    args = parser.parse_args(argv)
    paths = args.landscape or landscape_paths()
    if not paths:
        sys.exit("no landscapes: record some with python -m benchmarks.record_landscape")
    strategies = args.strategy or list(STRATEGIES)
    if "autofit" not in strategies:
        strategies.insert(0, "autofit")  # it sets the budget of random and TPE
    command = "python -m benchmarks.replay " + " ".join(argv if argv is not None else sys.argv[1:])
    parts = [PREAMBLE.format(command=command.strip())]
    for i, model in enumerate(m.strip() for m in args.noise_models.split(",") if m.strip()):
        heading = (f"Noise model `{model}` × {args.noise}, {args.seeds} seeds"
                   + (" (primary: the targets)" if i == 0 else " (robustness)"))
        text, _ = run_section(paths, args.seeds, args.noise, model, strategies, heading)
        parts.append(text)
    if args.out != "-":
        with open(args.out, "w") as handle:
            handle.write("\n".join(parts))


if __name__ == "__main__":
    main()
