"""Memory estimate vs measured peak: how far the fake-tensor estimate (autofit.memory._estimator) is
from what a probe measures, before and after a calibration fitted on the other configs.

    python -m benchmarks.estimate [--limit 4GiB]

For each bundled study and several configs: the estimated tensor bytes at the peak, and a real
probe's peak less its baseline (the process before the step). Calibration: measured = a + k x
estimate, least squares over the other configs of the same study (leave-one-out), as a search
would calibrate from the probes of its script that it has before the next one. Writes benchmarks/estimate.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from autofit.config import Config
from autofit.memory import estimate_memory
from autofit.probing import Worker
from autofit.units import parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CASES = {
    "gpt": (Config(32), Config(64), Config(128), Config(128, checkpoint_segments=4), Config(64, "bf16")),
    "cnn": (Config(24), Config(64), Config(128)),
    "mlp": (Config(256), Config(1024), Config(4096), Config(4096, "bf16")),
}


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares a + k x through (estimate, measured)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in points) / var if var else 1.0
    return my - k * mx, k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="4GiB")
    args = parser.parse_args()
    limit = parse_size(args.limit)
    started = time.perf_counter()
    rows = []
    for study, configs in CASES.items():
        script = os.path.join(REPO, "studies", f"{study}.py")
        estimates = estimate_memory(script, list(configs))
        with Worker(script, device="cpu", memory_limit=limit) as worker:
            worker.start()
            for config in configs:
                result = worker.probe(config, warmup=2, steps=5, timeout=300)
                estimate = estimates.estimates.get(config)
                if result.ok and estimate is not None:
                    rows.append({"study": study, "config": config.label(), "estimate": estimate.total_bytes,
                                 "measured": result.peak_bytes - (result.baseline_bytes or 0),
                                 "activations": estimate.breakdown["activations"]})
                print(f"  {study} {config.label():<16} estimate "
                      f"{(estimate.total_bytes if estimate else 0) / 2**20:8.1f} MiB  measured "
                      f"{((result.peak_bytes or 0) - (result.baseline_bytes or 0)) / 2**20:8.1f} MiB  {result.status}",
                      flush=True)
    for i, row in enumerate(rows):  # as a search calibrates: from the other probes of the same script
        a, k = _fit([(r["estimate"], r["measured"]) for j, r in enumerate(rows) if j != i and r["study"] == row["study"]])
        row["calibrated"] = a + k * row["estimate"]
    a, k = _fit([(r["estimate"], r["measured"]) for r in rows])
    lines = [f"Memory estimate vs measured peak on CPU ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores), `python -m benchmarks.estimate --limit {args.limit}`, "
             f"{(time.perf_counter() - started) / 60:.1f} min.", "",
             "| study | config | estimate (tensors) | measured (peak − baseline) | raw error | calibrated (same study, leave-one-out) | calibrated error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        raw = r["estimate"] / r["measured"] - 1
        cal = r["calibrated"] / r["measured"] - 1
        lines.append(f"| {r['study']} | {r['config']} | {r['estimate'] / 2**20:,.1f} MiB | {r['measured'] / 2**20:,.1f} MiB "
                     f"| {raw:+.1%} | {r['calibrated'] / 2**20:,.1f} MiB | {cal:+.1%} |")
    errors = sorted(abs(r["calibrated"] / r["measured"] - 1) for r in rows)
    raws = sorted(abs(r["estimate"] / r["measured"] - 1) for r in rows)
    lines += ["", f"- calibration over all {len(rows)} configs: measured = {a / 2**20:,.1f} MiB + {k:.2f} x estimate",
              f"- |raw error|: median {statistics.median(raws):.1%}, max {max(raws):.1%}; |calibrated error| "
              f"(leave-one-out): median {statistics.median(errors):.1%}, max {max(errors):.1%}"]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(HERE, "estimate.md"), "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
