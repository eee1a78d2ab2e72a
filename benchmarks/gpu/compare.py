"""Measure several configs of one study interleaved (A B C A B C ...) through autofit's worker.

    python -m benchmarks.gpu.compare benchmarks/gpu/gpt124m.py --device cuda \
        --config autofit=bf16:48:0 --config lightning=fp32:16:0 --rounds 3 --steps 10

A config is PRECISION:BATCH[:CHECKPOINTED_BLOCKS[:ACCUMULATION]], or @FILE: the config of a
best-config file exactly as exported (every field, so what runs is what the search picked), or a
config as JSON (`{"batch_size": 8, "precision": "bf16", ...}`). Every config runs the same training
program in the same process, round after round, so a drift of the machine hits them all alike. The
median samples/s over the rounds is reported, with the peak memory and the status of each round; each
probe's line also says what the worker held before and after it (of it, tensors) and which worker ran
it, so a worker kept or replaced, and what it carried, can be read off.
"""

from __future__ import annotations

import argparse
import json
import statistics

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import Worker


def parse_config(text: str) -> tuple[str, Config]:
    name, _, spec = text.partition("=")
    if spec.startswith("@"):
        from autofit.export import read_best

        return name, read_best(spec[1:]).config
    if spec.startswith("{"):
        return name, Config.from_dict(json.loads(spec))
    parts = spec.split(":")
    precision, batch = parts[0], int(parts[1])
    checkpoint = int(parts[2]) if len(parts) > 2 else 0
    accumulation = int(parts[3]) if len(parts) > 3 else 1
    return name, Config(batch_size=batch, precision=precision, checkpoint_segments=checkpoint,
                        accumulation_steps=accumulation)


def _memory_after(result) -> str:
    """The worker's memory before and after the probe, and its tensors (where the device tells them
    apart): what a kept worker carries into the next probe."""
    gib = 2**30
    if result.memory_after_bytes is None or result.baseline_bytes is None:
        return "memory after: not read"
    text = f"memory {result.baseline_bytes / gib:.2f} -> {result.memory_after_bytes / gib:.2f} GiB"
    before, after = (result.allocator.get(k) for k in ("tensors_at_start_bytes", "tensors_after_bytes"))
    if before is not None and after is not None:
        text += f" (tensors {before / gib:.2f} -> {after / gib:.2f} GiB)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-limit", default=None, help="the limit the probes run under, e.g. 2GiB")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from autofit.units import parse_size

    limit = parse_size(args.memory_limit) if args.memory_limit else None
    configs = [parse_config(text) for text in args.config]
    rows = {name: {"config": config.to_dict(), "samples_per_s": [], "status": [], "peak_bytes": [], "mfu": [],
                   "flops_per_s": [], "rounds": []}
            for name, config in configs}
    with Worker(args.script, device=args.device, budget=MemoryBudget(limit_bytes=limit)) as worker:
        info = worker.start()
        for _ in range(args.rounds):
            for name, config in configs:
                result = worker.probe(config, warmup=args.warmup, steps=args.steps, timeout=600)
                rows[name]["status"].append(result.status)
                rows[name]["peak_bytes"].append(result.peak_bytes)
                rows[name]["rounds"].append(round(result.samples_per_s, 2) if result.samples_per_s else None)
                if result.samples_per_s:
                    rows[name]["samples_per_s"].append(round(result.samples_per_s, 2))
                    rows[name]["flops_per_s"].append(result.flops_per_s)
                    rows[name]["mfu"].append(result.mfu)
                print(f"{name:>12} {config.label():<28} {result.status:<8} "
                      f"{result.samples_per_s or 0:9.1f} samples/s  peak {(result.peak_bytes or 0) / 2**30:6.2f} GiB"
                      f"  {_memory_after(result)}  worker {worker.pid}", flush=True)
                for note in result.notes:
                    print(f"{'':>12} note: {note}", flush=True)
    for row in rows.values():
        row["median_samples_per_s"] = statistics.median(row["samples_per_s"]) if row["samples_per_s"] else None
    document = {"device": info.device, "versions": info.versions, "rows": rows}
    text = json.dumps(document, indent=2)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
