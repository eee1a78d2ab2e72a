"""What the CPU's libraries keep per shape in bf16, bounded or not (issue 53, item 4): speed and memory.

    python -m benchmarks.shape_caches [--steps 40] [--cap 3072] [--out benchmarks/shape-caches-cpu.md]

tests/corpus/varlen_lm.py's model in bf16 autocast (a CPU with AVX512-BF16 or AMX: oneDNN runs its matmuls),
`--steps` micro-batches of new shapes (log-normal lengths, as many samples as `--cap` tokens hold), then the first
half of them again (shapes met before), in a process of its own per setting of the caches' capacities
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `LRU_CACHE_CAPACITY`): their libraries' defaults (1024 each), and the bounds
a run by tokens sets (autofit.runtime's `bound_shape_caches`). Reported: the mean step at new shapes and at shapes
met before, VmData (what a CPU's memory limit caps) after each part, and the resident set once the heap's free
pages went back (`malloc_trim`): what the caches hold. Writes --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time

from benchmarks import REPO, pythonpath

SETTINGS = {"the libraries' defaults": {}, "autofit's bounds": None}  # None: DEFAULT_CAPACITIES


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmData"):
                values[key] = int(rest.split()[0]) // 1024
    return values


def one_setting(steps: int, cap: int) -> dict:
    """In this process (its environment already set): the figures of the module's docstring."""
    import torch
    import torch.nn.functional as F

    from tests.corpus.varlen_lm import VOCAB, VarLenLM

    torch.manual_seed(0)
    model = VarLenLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(0)
    lengths = [int(v) for v in torch.exp(math.log(90) + 0.9 * torch.randn(steps, generator=generator)).clamp(8, 1000)]

    def step(n: int) -> float:
        x = torch.randint(0, VOCAB, (max(1, cap // n), n))
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - started

    step(64)  # the process's first-use costs
    new = sum(step(n) for n in lengths) / steps
    after_new = _status()
    again = sum(step(n) for n in lengths[: steps // 2]) / (steps // 2)
    after_again = _status()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"new_ms": new * 1e3, "again_ms": again * 1e3, "data_after_new": after_new["VmData"],
            "data_after_again": after_again["VmData"], "trimmed_rss": _status()["VmRSS"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cap", type=int, default=3072)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "shape-caches-cpu.md"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_setting(args.steps, args.cap)))
        return
    from autofit.runtime import DEFAULT_CAPACITIES

    rows = []
    for name, setting in SETTINGS.items():
        capacities = DEFAULT_CAPACITIES if setting is None else setting
        env = {k: v for k, v in os.environ.items() if k not in DEFAULT_CAPACITIES}
        env.update({k: str(v) for k, v in capacities.items()}, PYTHONPATH=pythonpath())
        done = subprocess.run([sys.executable, "-m", "benchmarks.shape_caches", "--one", "--steps", str(args.steps),
                               "--cap", str(args.cap)], cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{name}: {done.stderr[-2000:]}")
        shown = ", ".join(f"{k}={v}" for k, v in capacities.items()) or "unset (1024 each)"
        rows.append((name, shown, json.loads(done.stdout.strip().splitlines()[-1])))
    lines = [f"`python -m benchmarks.shape_caches --steps {args.steps} --cap {args.cap}` ({os.cpu_count()} cores)", "",
             "| caches | capacities | step at a new shape | step at one met before | VmData after the new ones | "
             "after those again | resident, free pages returned |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {shown} | {r['new_ms']:.0f} ms | {r['again_ms']:.0f} ms | {r['data_after_new']} MiB | "
              f"{r['data_after_again']} MiB | {r['trimmed_rss']} MiB |" for name, shown, r in rows]
    text = "# What the CPU's libraries keep per shape in bf16\n\n" + "\n".join(lines) + "\n"
    with open(args.out, "w") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
