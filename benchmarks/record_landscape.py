"""Record a full landscape: every config of a search space, probed for real under a memory limit.

    python -m benchmarks.record_landscape --study studies/gpt.py --memory-limit 1.5GiB \
        --batch 1:512 [--precision fp32,bf16,fp16] [--name gpt] [--no-selective]

One worker serves the whole landscape (it survives OOMs and restarts itself after crashes). Batches
are probed smallest first, every strategy (precision, checkpoint level and, where it checkpoints,
policy: full or selective, as a search tries them; accumulation) at each; once
a batch runs out of memory, every larger batch of that strategy is recorded as `oom` with
`"implied": true` and the wall time of the OOM probe that implied it (what probing it would have
cost, about), instead of being probed. Everything else is measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from autofit.config import CHECKPOINT_POLICIES, PRECISIONS, Config
from autofit.export import MemoryBudget
from autofit.planner import SearchSpace, checkpoint_levels
from autofit.probing import Worker
from autofit.units import format_size, parse_size
from benchmarks.landscape import LANDSCAPE_DIR, Entry, Landscape, describe

AGGREGATE = "fastest run's samples/s and step times; median wall; largest peak"


def _batch_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    lo, hi = int(low), int(high or low)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"--batch must be LOW:HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def _run(result) -> dict:
    """One probe of a config, as stored in the entry's `runs`."""
    run = {"status": result.status, "samples_per_s": result.samples_per_s, "peak_bytes": result.peak_bytes,
           "step_time_median_s": result.step_time_median_s, "step_time_iqr_s": result.step_time_iqr_s,
           "wall_s": round(result.wall_s, 3)}
    if result.status != "ok" and result.error_message:
        run["error"] = f"{result.error_type}: {result.error_message.splitlines()[0][:200]}"
    return run


def _entry(config: Config, runs: list[dict]) -> Entry:
    """Aggregate a config's probes: the fastest run's throughput and step times (other jobs on a
    shared CPU only ever slow a probe down, so the fastest run is the least disturbed), the median
    wall time, the largest peak. A config that failed in any run keeps that status (a config that
    only sometimes fits is not one to recommend)."""
    ok = [r for r in runs if r["status"] == "ok"]
    bad = [r for r in runs if r["status"] != "ok"]
    status = bad[0]["status"] if bad else "ok"
    fastest = max(ok, key=lambda r: r["samples_per_s"] or 0.0) if ok else {}
    peaks = [r["peak_bytes"] for r in runs if r["peak_bytes"] is not None]
    return Entry(
        config=config, status=status, peak_bytes=max(peaks) if peaks else None,
        samples_per_s=fastest.get("samples_per_s") if status == "ok" else None,
        step_time_median_s=fastest.get("step_time_median_s"), step_time_iqr_s=fastest.get("step_time_iqr_s"),
        wall_s=round(statistics.median(r["wall_s"] for r in runs), 3),
        error=bad[0].get("error") if bad else None,
        runs=runs if len(runs) > 1 else None,
    )


def reaggregate(path: str) -> Landscape:
    """Recompute every entry of a saved landscape from its stored runs (after a change of rule)."""
    landscape = Landscape.load(path)
    for config, e in landscape.entries.items():
        if e.runs:
            landscape.entries[config] = _entry(config, e.runs)
    landscape.meta["aggregate"] = AGGREGATE
    landscape.save(path)
    return landscape


def record(
    study: str,
    *,
    memory_limit: int,
    batch_range: tuple[int, int],
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16"),
    name: str | None = None,
    function: str | None = None,
    headroom: float = 0.1,
    device: str = "cpu",
    compile: bool = False,
    checkpoint: bool = True,
    checkpoint_policies: tuple[str, ...] = CHECKPOINT_POLICIES,
    accumulations: tuple[int, ...] | None = None,
    global_batch: int | None = None,
    warmup: int = 2,
    steps: int = 5,
    timeout: float = 120.0,
    threads: int | None = 0,
    repeats: int = 1,
    out: str | None = None,
    log=print,
) -> Landscape:
    """Probe every config of the space built from these options; save and return the landscape.

    With `repeats` > 1, every config probed in the first pass is probed again in further passes
    (alternately in reverse order, so a drift of the machine's load averages out) and its entry
    aggregates the runs (see `_entry`). `checkpoint_policies`: what the checkpointed levels recompute,
    each a strategy of its own (("full",): selective checkpointing left out, as landscapes recorded
    before it had it). `global_batch`: the micro-batches are its divisors, each with the accumulation
    that keeps it (as a search of a function that declares one)."""
    name = name or os.path.splitext(os.path.basename(study))[0]
    out = out or os.path.join(LANDSCAPE_DIR, f"{name}.json")
    if threads:
        # Inherited by the worker. One thread per probe: on a CPU shared with other jobs, torch's
        # OpenMP threads spin at barriers waiting for a descheduled sibling, which turns a little
        # contention into 5-20x slower and erratic steps; one thread degrades gracefully.
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    started = time.perf_counter()
    entries: dict[Config, Entry] = {}
    with Worker(study, function, device=device, budget=MemoryBudget(limit_bytes=memory_limit)) as worker:
        info = worker.start()
        usable_precisions = tuple(p for p in precisions if p in info.precisions)
        dropped = sorted(set(precisions) - set(usable_precisions))
        if dropped:
            log(f"the device does not run {', '.join(dropped)}; left out")
        # The pilot (smallest batch, first precision, no checkpointing) tells how many blocks the
        # function offers to run.checkpoint(), which decides the checkpoint levels of the space.
        first = min(b for b in range(batch_range[0], batch_range[1] + 1) if global_batch % b == 0) \
            if global_batch else batch_range[0]
        pilot_config = Config(batch_size=first, precision=usable_precisions[0], checkpoint_segments=0,
                              accumulation_steps=global_batch // first if global_batch else (accumulations or (1,))[0])
        pilot = worker.probe(pilot_config, warmup=warmup, steps=steps, timeout=timeout)
        blocks = pilot.offers.checkpoint_blocks
        space = SearchSpace.build(batch_range=batch_range, precision=usable_precisions,
                                  checkpoint_segments=tuple(checkpoint_levels(blocks if checkpoint else None)),
                                  accumulation_steps=tuple(sorted(set(accumulations or (1,)))),
                                  checkpoint_policy=checkpoint_policies, global_batch=global_batch,
                                  compile=(False, True) if compile and pilot.offers.compile else (False,))
        configs = space.configs()
        log(f"{name}: {len(configs)} configs ({len(space.batch_sizes)} batches x "
            f"{len(space.strategies())} strategies), limit {format_size(memory_limit)}, "
            f"checkpoint blocks {blocks}, policies {', '.join(space.values_of('checkpoint_policy'))}")
        # Batch by batch, every strategy at each: a slow drift of the machine's load (other jobs)
        # then biases batch sizes, not whole strategies against each other.
        oom_wall: dict = {}  # strategy -> wall of the OOM probe that implies its larger batches
        runs: dict[Config, list[dict]] = {}
        for batch in space.batch_sizes:
            for strategy in space.strategies():
                config = space.config(strategy, batch)
                if strategy in oom_wall:
                    entries[config] = Entry(config, "oom", wall_s=oom_wall[strategy], implied=True)
                    continue
                result = pilot if config == pilot_config else worker.probe(
                    config, warmup=warmup, steps=steps, timeout=timeout)
                runs[config] = [_run(result)]
                log(f"  [{time.perf_counter() - started:6.0f}s] {result.summary()}  ({result.wall_s:.1f}s)")
                if result.status == "oom":
                    oom_wall[strategy] = round(result.wall_s, 3)
        order = list(runs)
        for rep in range(1, repeats):
            for config in order[::-1] if rep % 2 else order:
                if runs[config][0]["status"] == "oom":
                    continue  # no second chance needed: it did not fit
                result = worker.probe(config, warmup=warmup, steps=steps, timeout=timeout)
                runs[config].append(_run(result))
                log(f"  [{time.perf_counter() - started:6.0f}s] pass {rep + 1}: {result.summary()}  "
                    f"({result.wall_s:.1f}s)")
        for config, config_runs in runs.items():
            entries[config] = _entry(config, config_runs)
        versions = info.versions
        baseline = info.baseline_bytes
        device = dict(info.device)
    elapsed = time.perf_counter() - started
    landscape = Landscape(
        name=name, space=space, memory_limit_bytes=memory_limit, headroom=headroom, entries=entries,
        device=device, baseline_bytes=baseline,
        meta={
            "study": os.path.relpath(study, os.getcwd()) if os.path.isabs(study) else study,
            "function": info.function,
            "warmup": warmup, "steps": steps, "timeout_s": timeout, "threads": threads, "repeats": repeats,
            "aggregate": AGGREGATE,
            "checkpoint_blocks": blocks,
            "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "recording_s": round(elapsed, 1),
            "probed": sum(not e.implied for e in entries.values()),
            "implied": sum(e.implied for e in entries.values()),
            "host": {"cpu_count": os.cpu_count(), "python": platform.python_version()},
            "versions": versions,
            "command": " ".join(["python -m benchmarks.record_landscape", *sys.argv[1:]]),
        },
    )
    landscape.save(out)
    log(describe(landscape))
    best = landscape.best_config()
    log(f"best feasible: {best.label() if best else None} at {landscape.best_throughput():.1f} samples/s; "
        f"usable {format_size(landscape.usable_bytes)}; recorded in {elapsed:.0f}s -> {out}")
    return landscape


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.record_landscape", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="script with one @autofit function (SCRIPT or SCRIPT:FUNCTION)")
    parser.add_argument("--memory-limit", required=True, type=parse_size, help="e.g. 1.5GiB")
    parser.add_argument("--batch", required=True, type=_batch_range, help="micro-batch range LOW:HIGH")
    parser.add_argument("--precision", default="fp32,bf16,fp16",
                        help="comma-separated precisions (default fp32,bf16,fp16)")
    parser.add_argument("--name", default=None, help="landscape name (default: the study's file name)")
    parser.add_argument("--headroom", type=float, default=0.1,
                        help="fraction of the limit kept free: feasible = peak <= limit*(1-headroom)")
    parser.add_argument("--no-checkpoint", action="store_true", help="leave activation checkpointing out")
    parser.add_argument("--no-selective", action="store_true",
                        help="leave selective checkpointing out: checkpointed levels recompute all (full) only")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compile", action="store_true",
                        help="every config compiled too, where the function offers run.compile()")
    parser.add_argument("--accumulation", default=None, help="comma-separated accumulation steps (default 1)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per probe")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS of the worker (default 0: leave the environment alone, so probes "
                             "run with the threads the user's own run gets)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="probe every (non-OOM) config this many times, in alternating order; "
                             "the entry keeps the fastest run")
    parser.add_argument("--out", default=None, help="output path (default benchmarks/landscapes/NAME.json)")
    args = parser.parse_args(argv)
    study, _, function = args.study.partition(":")
    precisions = tuple(p.strip() for p in args.precision.split(",") if p.strip())
    for p in precisions:
        if p not in PRECISIONS:
            parser.error(f"unknown precision {p!r}")
    accumulations = tuple(int(a) for a in args.accumulation.split(",")) if args.accumulation else None
    record(study, memory_limit=args.memory_limit, batch_range=args.batch, precisions=precisions,
           name=args.name, function=function or None, headroom=args.headroom, device=args.device,
           compile=args.compile,
           checkpoint=not args.no_checkpoint,
           checkpoint_policies=("full",) if args.no_selective else CHECKPOINT_POLICIES, accumulations=accumulations, warmup=args.warmup,
           steps=args.steps, timeout=args.timeout, threads=args.threads, repeats=args.repeats,
           out=args.out)


if __name__ == "__main__":
    main()
