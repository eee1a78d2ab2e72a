"""Where a CPU probe's memory beyond its tensors goes: glibc's heap, measured with its default dynamic
mmap threshold and with the threshold fixed (`MALLOC_MMAP_THRESHOLD_`), against the estimator's tensors.

    python -m benchmarks.cpu_heap [--scripts late_device,mnist_cnn,word_language_model] [--batches 128,512]

glibc serves an allocation from its heap below the mmap threshold and maps it on its own above it;
freeing a mapped chunk raises the threshold to that chunk's size (up to 32 MiB), so after the first
step most tensors come from the heap, whose freed holes stay in the process's data segment (the
quantity a CPU probe's peak and the memory limit count). With the threshold fixed at 64 KiB every
large tensor is mapped and given back when freed. For each corpus script and config: the estimator's
tensor bytes and its measured runtime context, and a real probe's peak less its baseline under
both settings (each in a fresh worker). Writes benchmarks/cpu-heap.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.memory import estimate_memory
from autofit.probing import Worker
from autofit.units import parse_size
from benchmarks.corpus import CORPUS

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2**20
FIXED = "65536"


def _probe(script: str, config: Config, fixed: bool) -> float:
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if fixed:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = FIXED
    else:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    try:
        with Worker(script, device="cpu", budget=MemoryBudget(limit_bytes=parse_size("8GiB"))) as worker:
            worker.start()
            result = worker.probe(config, warmup=2, steps=5, timeout=600)
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    if not result.ok:
        raise RuntimeError(f"{config.label()}: {result.status} {result.error_message}")
    return result.peak_bytes - (result.baseline_bytes or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", default="late_device,mnist_cnn,word_language_model")
    parser.add_argument("--batches", default="128,512")
    parser.add_argument("--out", default=os.path.join(HERE, "cpu-heap.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for name in args.scripts.split(","):
        script = os.path.join(CORPUS, f"{name}.py")
        configs = [Config(batch_size=int(b), precision=p) for p in ("fp32", "bf16") for b in args.batches.split(",")]
        found = estimate_memory(script, configs)
        for config in configs:
            estimate = found.estimates.get(config)
            default, fixed = _probe(script, config, False), _probe(script, config, True)
            rows.append((name, config.label(), estimate.total_bytes if estimate else None, found.context_bytes,
                         default, fixed))
            print(f"  {name} {config.label()}: tensors {rows[-1][2] and rows[-1][2] / MIB:.0f} MiB, default "
                  f"{default / MIB:.0f} MiB, fixed threshold {fixed / MIB:.0f} MiB", flush=True)
    lines = [f"A CPU probe's peak less its baseline, glibc's default vs `MALLOC_MMAP_THRESHOLD_={FIXED}`; CPU "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), `python -m benchmarks.cpu_heap "
             f"--scripts {args.scripts} --batches {args.batches}`, {(time.perf_counter() - started) / 60:.1f} min.", "",
             "| script | config | tensors (estimate) | context (measured) | peak − baseline, default | "
             "same, threshold fixed | default ÷ fixed | (default − context) ÷ tensors |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, label, tensors, context, default, fixed in rows:
        factor = f"{(default - (context or 0)) / tensors:.2f}" if tensors else "—"
        lines.append(f"| {name} | {label} | {(tensors or 0) / MIB:,.0f} MiB | {(context or 0) / MIB:,.0f} MiB | "
                     f"{default / MIB:,.0f} MiB | {fixed / MIB:,.0f} MiB | {default / fixed:.2f} | {factor} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
