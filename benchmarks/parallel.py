"""Parallel search on one machine: the same study searched with 1, 2 and 4 CPU workers.

    python -m benchmarks.parallel [--study studies/mlp.py] [--budget 4m] [--memory-limit 1GiB]

Each search starts fresh and ends by itself (or at the budget). Reported per worker count: the wall
time of the whole search and the time until the config it finally exported was first probed, the
probes it made and how many of them were rechecks (probes spent again on a measurement the
interference check did not trust: what competing workers cost), and the exported config. Then every
exported config is measured again alone, interleaved, through autofit's worker, so "true
samples/s" is one method on a quiet machine; "÷ 1 worker" compares each answer with the single
worker's. Writes benchmarks/parallel.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import optuna

from autofit.search import SearchSettings, run_search
from autofit.study import trial_config
from autofit.units import format_size, parse_duration, parse_size
from benchmarks.interference import remeasure

HERE = os.path.dirname(os.path.abspath(__file__))


def search(args, tmp: str, workers: int) -> dict:
    settings = SearchSettings(script=args.study, device="cpu", memory_limit=args.memory_limit, budget_s=args.budget,
                              storage=f"sqlite:///{tmp}/w{workers}.db", out=os.path.join(tmp, f"w{workers}.json"),
                              parallel=workers, fresh=True)
    started = time.time()
    result = run_search(settings)
    wall = time.time() - started
    trials = optuna.load_study(study_name=result.study_name, storage=settings.storage).get_trials()
    first = min((t.datetime_complete.timestamp() for t in trials
                 if t.datetime_complete and trial_config(t) == result.best and "probe" in t.user_attrs),
                default=None)
    phases = [t.user_attrs.get("phase") for t in trials if "probe" in t.user_attrs]
    return {"workers": workers, "best": result.best, "wall": wall, "found": first - started if first else None,
            "probes": len(phases), "rechecks": phases.count("recheck"), "stopped": result.stopped,
            "noisy": any("too noisy" in note for note in result.notes),
            "believed": result.ranked[0].rate if result.ranked else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="studies/mlp.py")
    parser.add_argument("--budget", type=parse_duration, default=parse_duration("4m"))
    parser.add_argument("--memory-limit", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--parallel", default="1,2,4", help="parallel probe counts (autofit search --parallel), in order")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the final re-measure")
    args = parser.parse_args()
    command = "python -m benchmarks.parallel " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [search(args, tmp, int(n)) for n in args.parallel.split(",")]
    picks = list(dict.fromkeys(r["best"] for r in runs if r["best"] is not None))
    true = remeasure(args, picks, args.rounds)
    single = true.get(runs[0]["best"], 0.0) or 1.0
    lines = [f"`{command}` ({(time.perf_counter() - started) / 60:.1f} min, {os.cpu_count()} cores; each worker's "
             f"limit {format_size(args.memory_limit)}; budget {args.budget:.0f} s)", "",
             "| workers | search wall s | answer first probed at s | probes | rechecks | stopped by | exported | "
             "samples/s the search believed | true samples/s (alone) | ÷ 1 worker | said too noisy |",
             "|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|"]
    for r in runs:
        best = r["best"]
        found = f"{r['found']:.0f}" if r["found"] is not None else "-"
        lines.append(f"| {r['workers']} | {r['wall']:.0f} | {found} | {r['probes']} | {r['rechecks']} | {r['stopped']} | "
                     f"{best.label() if best else 'none'} | {r['believed'] or 0:,.1f} | {true.get(best, 0.0):,.1f} | "
                     f"{true.get(best, 0.0) / single:.3f} | {'yes' if r['noisy'] else ''} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(HERE, "parallel.md"), "w") as handle:
        handle.write("# Parallel search on one CPU machine: 1, 2 and 4 workers\n\n" + text)


if __name__ == "__main__":
    main()
