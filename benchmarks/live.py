"""Run autofit live (real probes, not replayed) on each bundled study and score it against the study's
recorded landscape: probes, probe-seconds, OOM probes, and the true (recorded) throughput of the
config it exports divided by the landscape's best.

    python -m benchmarks.live [--budget 5m] [--compare-estimate] [NAME ...]

Each live search uses the landscape's memory limit, headroom, batch range, precisions, warm-up and
measured steps, and thread count as the recording did. With --compare-estimate each study is
searched twice in a row, with the memory estimator and without (--no-estimate), so the two compare
on one machine in one run. It writes a markdown table to stdout and to benchmarks/live.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from autofit.findings import observations
from autofit.memory import stored_estimates
from autofit.search import SearchSettings, run_search
from autofit.study import open_storage
from autofit.units import parse_duration
from benchmarks.landscape import Landscape, landscape_paths

HERE = os.path.dirname(os.path.abspath(__file__))


def live_row(landscape: Landscape, budget_s: float, estimate: bool = True) -> dict:
    import optuna

    meta = landscape.meta
    space = landscape.space
    threads = meta.get("threads")  # the worker runs with the threads the landscape was recorded with
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    else:
        os.environ.pop("OMP_NUM_THREADS", None)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/live.db"
        started = time.monotonic()
        result = run_search(SearchSettings(
            script=meta["study"], function=meta.get("function"), device="cpu", memory_limit=landscape.memory_limit_bytes,
            headroom=landscape.headroom, budget_s=budget_s, batch_range=(min(space.batch_sizes), max(space.batch_sizes)),
            precision=tuple(space.values_of("precision")), storage=storage, out=os.path.join(tmp, "best.json"),
            warmup=meta.get("warmup", 1), steps=meta.get("steps", 3), estimate=estimate,
        ))
        elapsed = time.monotonic() - started
        study = optuna.load_study(study_name=result.study_name, storage=open_storage(storage))
        seen = [o for o in observations(study.trials) if o.status != "running"]
        estimated = stored_estimates(study)
    explore = [o for o in seen if o.phase == "explore"]
    return {
        "name": landscape.name,
        "estimator": f"{estimated.seconds:.0f} s" if estimated else "off",
        "probes": len(seen),
        "explore_probes": len(explore),
        "probe_s": sum(o.wall_s for o in seen),
        "search_s": elapsed,
        "oom": sum(o.too_big(landscape.usable_bytes) for o in seen),
        "pick": result.best.label() if result.best else "none",
        "ratio": landscape.true_throughput(result.best) / landscape.best_throughput() if result.best else 0.0,
        "grid_s": landscape.grid_seconds(),
        "grid_probes": len(landscape.configs()),
        "best": landscape.best_config().label(),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| study | estimator | live probes (explore) | probe-s | ÷ grid probe-s | did not fit | exported | true throughput ÷ grid best | grid best |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['estimator']} | {r['probes']} ({r['explore_probes']}) | {r['probe_s']:.0f} | "
            f"{r['probe_s'] / r['grid_s']:.0%} | {r['oom']} | {r['pick']} | {r['ratio']:.3f} | {r['best']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="landscape names (default: all)")
    parser.add_argument("--budget", default="5m", help="budget of each live search")
    parser.add_argument("--compare-estimate", action="store_true",
                        help="search each study with the memory estimator and without, one after the other")
    args = parser.parse_args(argv)
    rows = []
    for path in landscape_paths():
        landscape = Landscape.load(path)
        if args.names and landscape.name not in args.names:
            continue
        for estimate in ((True, False) if args.compare_estimate else (True,)):
            rows.append(live_row(landscape, parse_duration(args.budget), estimate))
            print(table(rows[-1:]), flush=True)
    text = table(rows)
    print("\n" + text)
    with open(os.path.join(HERE, "live.md"), "w") as handle:
        flag = " --compare-estimate" if args.compare_estimate else ""
        handle.write("# autofit live on the bundled studies\n\n`python -m benchmarks.live --budget "
                     f"{args.budget}{flag}`\n\n{text}\n")


if __name__ == "__main__":
    main()
