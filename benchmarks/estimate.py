"""Memory estimate vs measured peak: how far the fake-tensor estimate (autofit.memory._estimator) is
from what a probe measures, before and after a calibration fitted on the other configs.

    python -m benchmarks.estimate [--limit 4GiB]
    python -m benchmarks.estimate --scripts DIR_OR_FILES [--batches 8,16,32] [--out PATH]
    python -m benchmarks.estimate --space SCRIPT --how traced|per-config [--every-config] [--target cpu|cuda]

For each bundled study (or, with --scripts, each script given or each .py in a folder given: the
real-world-style ones in tests/scripts, a corpus) and several configs: the estimated tensor bytes at
the peak, and a real probe's peak less its baseline (the process before the step). Calibration:
measured = a + k x estimate, least squares over the other configs of the same study (leave-one-out),
as a search would calibrate from the probes of its script that it has before the next one. Writes benchmarks/estimate.md
(--scripts: benchmarks/estimate-scripts.md). A script whose step the fake tensors cannot follow has a
partial estimate (parameters, gradients, optimizer state): its row says so, its error is the known
parts' against the whole measured peak.

--space: how long the estimator takes over a script's search space on this machine (no probe): the space a
search builds from what the function offers on the CPU (or, --target cuda, on a GPU), the configs a search
asks the estimator for (`configs_to_estimate`) and then every config of it. `--how traced`: each program traced
once at two micro-batches and every config arithmetic (autofit.memory._traced_space); `--how per-config`: a
run of its own for each config (the estimator before the one-trace answer; this mode runs on that code too, for
the old figure: `git archive 9564680 | tar -x -C OLD`, copy this file into OLD/benchmarks, run it there with
PYTHONPATH=OLD). Appends a row to benchmarks/estimate-space.md; time it alone (`/work/bin/cpu alone ...`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.memory import Estimator, estimate_memory
from autofit.probing import Worker, WorkerStartError
from autofit.units import parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CASES = {
    "gpt": (Config(batch_size=32), Config(batch_size=64), Config(batch_size=128), Config(batch_size=128, checkpoint_segments=4), Config(batch_size=64, precision="bf16")),
    "cnn": (Config(batch_size=24), Config(batch_size=64), Config(batch_size=128)),
    "mlp": (Config(batch_size=256), Config(batch_size=1024), Config(batch_size=4096), Config(batch_size=4096, precision="bf16")),
}


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares a + k x through (estimate, measured)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in points) / var if var else 1.0
    return my - k * mx, k


#: --scripts without arguments: the reproductions of real-world scripts the estimator must follow.
REAL_SCRIPTS = ("nanogpt_loop.py", "moe_routing.py", "built_on_cpu_then_moved.py", "reads_loss_value.py",
                "class_balanced.py", "lightning_tied.py", "hf_trainer.py")


def _script_paths(spec: str) -> list[str]:
    """The scripts of `spec`: files or folders of them, comma-separated."""
    paths = []
    for item in spec.split(","):
        if os.path.isdir(item):
            paths += sorted(os.path.join(item, f) for f in os.listdir(item)
                            if f.endswith(".py") and not f.startswith("_"))
        else:
            paths.append(item)
    return paths


def _configs(options: dict | None, batches: list[int]) -> tuple[Config, ...]:
    """A config per batch, the global batch the decorator declares kept by accumulation (batches that
    do not divide it are skipped)."""
    global_batch = (options or {}).get("global_batch")
    return tuple(Config(batch_size=b, accumulation_steps=global_batch // b if global_batch else 1) for b in batches
                 if not global_batch or global_batch % b == 0)


def _space(script: str, target: str) -> tuple[Estimator, SearchSpace]:
    """An estimator process of `script` (loaded) and the space a search on `target` builds from the knobs the
    function offers (one config estimated to learn them: not timed)."""
    from autofit.devices import cpu_has_native_bf16
    from autofit.options import SearchOptions
    from autofit.planner import Asked, SearchSpace, knob_values

    estimator = Estimator(script, target=target, beside_probes=False)
    estimator.wait_ready()
    offers = estimator.estimate([Config(batch_size=2)]).offers
    options = estimator.options or {}
    precisions = ("bf16", "fp16", "tf32", "fp32") if target == "cuda" else (
        ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",))
    asked = Asked(offers, SearchOptions(precision=tuple(options.get("precision") or ()) or None), target,
                  precisions=precisions, default_precisions=precisions[:1])
    return estimator, SearchSpace.build(batch_range=tuple(options.get("batch_range") or (1, 1024)), **knob_values(asked))


def space_timing(script: str, how: str, target: str, out: str, every_config: bool = False) -> str:
    """The seconds the estimator takes over `script`'s space (see the module's docstring), as a markdown row;
    per-config, every config of the space too where `every_config`."""
    from autofit.planner import configs_to_estimate

    estimator, space = _space(script, target)
    with estimator:
        asked, every = configs_to_estimate(space.configs()), list(space.configs())
        started = time.perf_counter()
        found = estimator.estimate(asked, timeout=36000, **({"traced": True} if how == "traced" else {}))
        asked_s = time.perf_counter() - started
        row = (f"| {os.path.relpath(script, REPO)} | {target} | {how} | {len(found.estimates)} of {len(asked)} "
               f"a search asks: {asked_s:.1f} s")
        if how == "traced" or every_config:  # then every config of the space (traced: from the traces kept)
            started = time.perf_counter()
            all_found = estimator.estimate(every, timeout=36000, **({"traced": True} if how == "traced" else {}))
            row += f"; then all {len(all_found.estimates)} of {len(every)}: {time.perf_counter() - started:.1f} s"
    row += f" | {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')} |"
    with open(out, "a") as handle:
        handle.write(row + "\n")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="4GiB")
    parser.add_argument("--space", default=None, help="a script whose search space the estimator is timed over")
    parser.add_argument("--how", choices=("traced", "per-config"), default="traced")
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--every-config", action="store_true",
                        help="--how per-config: then every config of the space too (traced does it always)")
    parser.add_argument("--scripts", nargs="?", const=",".join(os.path.join(REPO, "tests", "scripts", s)
                                                              for s in REAL_SCRIPTS), default=None,
                        help="scripts or folders of them, comma-separated (default: tests/scripts' real-world ones)")
    parser.add_argument("--batches", default="8,16,32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.space:
        print(space_timing(args.space, args.how, args.target, args.out or os.path.join(HERE, "estimate-space.md"),
                           args.every_config))
        return
    limit = parse_size(args.limit)
    started = time.perf_counter()
    rows = []
    if args.scripts:
        cases = {os.path.basename(p).removesuffix(".py"): (p, None) for p in _script_paths(args.scripts)}
    else:
        cases = {study: (os.path.join(REPO, "studies", f"{study}.py"), configs) for study, configs in CASES.items()}
    for study, (script, configs) in cases.items():
        with Worker(script, device="cpu", budget=MemoryBudget(limit_bytes=limit)) as worker:
            try:
                info = worker.start()
            except WorkerStartError as exc:  # nothing to measure against: said, and the next script
                print(f"  {study}: no probe ({exc})", flush=True)
                continue
            configs = configs or _configs(info.options, [int(b) for b in args.batches.split(",")])
            estimates = estimate_memory(script, list(configs))
            for config in configs:
                result = worker.probe(config, warmup=2, steps=5, timeout=300)
                estimate = estimates.estimates.get(config)
                if result.ok and estimate is not None:
                    rows.append({"study": study, "config": config.label(), "estimate": estimate.total_bytes,
                                 "measured": result.peak_bytes - (result.baseline_bytes or 0),
                                 "activations": estimate.breakdown["activations"],
                                 "partial": "partial: " + "+".join(estimate.missing) + " missing"
                                 if estimate.missing else ""})
                why = estimates.unavailable.get(config, "")
                print(f"  {study} {config.label():<16} estimate "
                      f"{(estimate.total_bytes if estimate else 0) / 2**20:8.1f} MiB  measured "
                      f"{((result.peak_bytes or 0) - (result.baseline_bytes or 0)) / 2**20:8.1f} MiB  {result.status} "
                      f"{(estimate.summary() or '') if estimate else why}", flush=True)
    for i, row in enumerate(rows):  # as a search calibrates: from the other probes of the same script
        a, k = _fit([(r["estimate"], r["measured"]) for j, r in enumerate(rows) if j != i and r["study"] == row["study"]])
        row["calibrated"] = a + k * row["estimate"]  # (a study with one config: k = 1, a = its own offset)
    a, k = _fit([(r["estimate"], r["measured"]) for r in rows])
    lines = [f"Memory estimate vs measured peak on CPU ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores), `python -m benchmarks.estimate --limit {args.limit}"
             f"{' --scripts ' + args.scripts if args.scripts else ''}`, "
             f"{(time.perf_counter() - started) / 60:.1f} min.", "",
             "| study | config | estimate (tensors) | measured (peak − baseline) | raw error | calibrated (same study, leave-one-out) | calibrated error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        raw = r["estimate"] / r["measured"] - 1
        cal = r["calibrated"] / r["measured"] - 1
        lines.append(f"| {r['study']} | {r['config']}{' (' + r['partial'] + ')' if r['partial'] else ''} "
                     f"| {r['estimate'] / 2**20:,.1f} MiB | {r['measured'] / 2**20:,.1f} MiB "
                     f"| {raw:+.1%} | {r['calibrated'] / 2**20:,.1f} MiB | {cal:+.1%} |")
    errors = sorted(abs(r["calibrated"] / r["measured"] - 1) for r in rows)
    raws = sorted(abs(r["estimate"] / r["measured"] - 1) for r in rows)
    lines += ["", f"- calibration over all {len(rows)} configs: measured = {a / 2**20:,.1f} MiB + {k:.2f} x estimate",
              f"- |raw error|: median {statistics.median(raws):.1%}, max {max(raws):.1%}; |calibrated error| "
              f"(leave-one-out): median {statistics.median(errors):.1%}, max {max(errors):.1%}"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or os.path.join(HERE, "estimate-scripts.md" if args.scripts else "estimate.md")
    with open(out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
