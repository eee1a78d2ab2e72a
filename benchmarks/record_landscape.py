"""Record a full landscape: every config of a search space, probed for real under a memory limit.

    python -m benchmarks.record_landscape --study studies/gpt.py --memory-limit 1.5GiB \
        --batch 1:512 [--precision fp32,bf16,fp16] [--name gpt]

One worker serves the whole landscape (it survives OOMs and restarts itself after crashes). Within
one strategy (precision, checkpoint level, accumulation) batches are probed smallest first; once a
batch runs out of memory, every larger batch of that strategy is recorded as `oom` with
`"implied": true` and the wall time of the OOM probe that implied it (what probing it would have
cost, about), instead of being probed. Everything else is measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

from autofit.search._space import SearchSpace
from autofit.space import PRECISIONS, Config
from autofit.units import format_size, parse_size
from autofit.worker import Worker
from benchmarks.landscape import LANDSCAPE_DIR, Entry, Landscape, describe


def _batch_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    lo, hi = int(low), int(high or low)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"--batch must be LOW:HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def _entry(result, config: Config) -> Entry:
    error = None
    if result.status != "ok" and result.error_message:
        error = f"{result.error_type}: {result.error_message.splitlines()[0][:200]}"
    return Entry(
        config=config, status=result.status, peak_bytes=result.peak_bytes,
        samples_per_s=result.samples_per_s, step_time_median_s=result.step_time_median_s,
        step_time_iqr_s=result.step_time_iqr_s, wall_s=round(result.wall_s, 3), error=error,
    )


def record(
    study: str,
    *,
    memory_limit: int,
    batch_range: tuple[int, int],
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16"),
    name: str | None = None,
    function: str | None = None,
    headroom: float = 0.1,
    checkpoint: bool = True,
    accumulations: tuple[int, ...] | None = None,
    warmup: int = 2,
    steps: int = 5,
    timeout: float = 120.0,
    threads: int | None = 1,
    out: str | None = None,
    log=print,
) -> Landscape:
    """Probe every config of the space built from these options; save and return the landscape."""
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
    with Worker(study, function, device="cpu", memory_limit=memory_limit) as worker:
        info = worker.start()
        usable_precisions = tuple(p for p in precisions if p in info.precisions)
        dropped = sorted(set(precisions) - set(usable_precisions))
        if dropped:
            log(f"the device does not run {', '.join(dropped)}; left out")
        # The pilot (smallest batch, first precision, no checkpointing) tells how many blocks the
        # function offers to run.checkpoint(), which decides the checkpoint levels of the space.
        pilot_config = Config(batch_range[0], usable_precisions[0], 0, (accumulations or (1,))[0])
        pilot = worker.probe(pilot_config, warmup=warmup, steps=steps, timeout=timeout)
        blocks = pilot.knobs.get("checkpoint_blocks")
        space = SearchSpace.build(batch_range=batch_range, precisions=usable_precisions,
                                  checkpoint_blocks=blocks, use_checkpoint=checkpoint,
                                  accumulations=accumulations)
        configs = space.configs()
        log(f"{name}: {len(configs)} configs ({len(space.batch_sizes)} batches x "
            f"{len(space.strategies())} strategies), limit {format_size(memory_limit)}, "
            f"checkpoint blocks {blocks}")
        for strategy in space.strategies():
            oom_wall: float | None = None
            for batch in space.batch_sizes:
                config = space.config(strategy, batch)
                if oom_wall is not None:
                    entries[config] = Entry(config, "oom", wall_s=oom_wall, implied=True)
                    continue
                if config == pilot_config:
                    result = pilot
                else:
                    result = worker.probe(config, warmup=warmup, steps=steps, timeout=timeout)
                entries[config] = _entry(result, config)
                log(f"  [{time.perf_counter() - started:6.0f}s] {result.summary()}  ({result.wall_s:.1f}s)")
                if result.status == "oom":
                    oom_wall = round(result.wall_s, 3)
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
            "warmup": warmup, "steps": steps, "timeout_s": timeout, "threads": threads,
            "checkpoint_blocks": blocks,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
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
    parser.add_argument("--accumulation", default=None, help="comma-separated accumulation steps (default 1)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per probe")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS of the worker (default 1; 0: leave the environment alone)")
    parser.add_argument("--out", default=None, help="output path (default benchmarks/landscapes/NAME.json)")
    args = parser.parse_args(argv)
    study, _, function = args.study.partition(":")
    precisions = tuple(p.strip() for p in args.precision.split(",") if p.strip())
    for p in precisions:
        if p not in PRECISIONS:
            parser.error(f"unknown precision {p!r}")
    accumulations = tuple(int(a) for a in args.accumulation.split(",")) if args.accumulation else None
    record(study, memory_limit=args.memory_limit, batch_range=args.batch, precisions=precisions,
           name=args.name, function=function or None, headroom=args.headroom,
           checkpoint=not args.no_checkpoint, accumulations=accumulations, warmup=args.warmup,
           steps=args.steps, timeout=args.timeout, threads=args.threads, out=args.out)


if __name__ == "__main__":
    main()
