"""Add the memory estimator's answer to every config of the recorded landscapes, so that replays can
give the planner the predictions a live search has, and score them against the recorded peaks.

    python -m benchmarks.record_estimates [--landscape PATH ...]

Each entry gains `estimate` (predicted tensor bytes by part, autofit.memory._estimator) or
`estimate_error` (why there is none); `meta.estimator` records the estimator process's baseline,
the time the estimates took and the torch version. One estimator process per landscape.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from autofit.memory import estimate_memory
from benchmarks.landscape import Landscape, landscape_paths

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(path: str) -> None:
    landscape = Landscape.load(path)
    configs = landscape.configs()
    started = time.perf_counter()
    found = estimate_memory(os.path.join(REPO, landscape.meta["study"]), configs,
                            function=landscape.meta.get("function"), timeout=1800)
    for config in configs:
        entry = landscape.entries[config]
        estimate = found.estimates.get(config)
        entry.estimate = dict(estimate.breakdown) if estimate else None
        entry.estimate_error = None if estimate else found.unavailable.get(config, "no estimate")
    elapsed = time.perf_counter() - started
    landscape.meta["estimator"] = {"baseline_bytes": found.baseline_bytes, "seconds": round(elapsed, 1),
                                   "configs": len(configs), "estimated": len(found.estimates),
                                   "torch": torch.__version__,
                                   "command": "python -m benchmarks.record_estimates"}
    landscape.save(path)
    print(f"{landscape.name}: {len(found.estimates)}/{len(configs)} configs estimated in {elapsed:.0f} s"
          + (f" ({found.error})" if found.error else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.record_estimates", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--landscape", action="append", default=None, help="JSON path (default: all)")
    args = parser.parse_args(argv)
    for path in args.landscape or landscape_paths():
        record(path)


if __name__ == "__main__":
    main()
