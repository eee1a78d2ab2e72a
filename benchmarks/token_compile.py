"""torch.compile over batches by tokens: does a compiled run recompile at each new shape, and does padding to a
multiple or marking the shape dynamic help? (issue 53, item 3; composer #2214, transformers #27830.)

    python -m benchmarks.token_compile [--batches 30] [--cap 4096] [--out benchmarks/token-compile-cpu.md]

tests/corpus/varlen_lm.py's model ($VARLEN_LAYERS 2, $VARLEN_WIDTH 128 by default here: a CPU's inductor), its
first `--batches` micro-batches as run.token_batches cuts them at `--cap`, through `torch.compile(model)` in a
process of its own per way: as they come; padded to 64 (`run.pad_multiple`); both dimensions (samples, length)
marked dynamic from the first batch (`torch._dynamo.maybe_mark_dynamic`); the model compiled `dynamic=True`.
Reported: the distinct shapes, the graphs Dynamo compiled, the first three steps' time (compilation lands there),
the median step after ten, and all of them. Needs a C compiler (inductor). Writes --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import REPO, pythonpath

WAYS = ("as they come", "padded to 64", "marked dynamic", "dynamic=True")


def one_way(way: str, batches: int, cap: int) -> dict:
    """In this process: the model compiled one way, trained over the batches; what it did."""
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from autofit.runtime import TokenBatchSampler
    from tests.corpus import varlen_lm as lm

    torch.manual_seed(0)
    model = lm.VarLenLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    compiled = torch.compile(model, dynamic=True) if way == "dynamic=True" else torch.compile(model)
    multiple = 64 if way == "padded to 64" else 1
    sampler = TokenBatchSampler(lm.LENGTHS, cap, pad_multiple=multiple, seed=0)
    cut = list(sampler)[:batches]
    times = []
    for batch in cut:
        x, y = lm.collate([lm.DATA[i] for i in batch], multiple=multiple)
        if way == "marked dynamic":
            for dim in (0, 1):
                torch._dynamo.maybe_mark_dynamic(x, dim)
        started = time.perf_counter()
        loss = F.cross_entropy(compiled(x).float().flatten(0, 1), y.flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
    later = sorted(times[10:]) or sorted(times)
    return {"way": way, "shapes": len({sampler.shape(b) for b in cut}), "graphs": counters["stats"]["unique_graphs"],
            "first_three_s": sum(times[:3]), "median_after_ten_ms": later[len(later) // 2] * 1e3, "total_s": sum(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--cap", type=int, default=4096)
    parser.add_argument("--way", help=argparse.SUPPRESS)  # one way, in a process of its own
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "token-compile-cpu.md"))
    args = parser.parse_args()
    if args.way:
        print(json.dumps(one_way(args.way, args.batches, args.cap)))
        return
    env = {**os.environ, "PYTHONPATH": pythonpath(), "VARLEN_LAYERS": os.environ.get("VARLEN_LAYERS", "2"),
           "VARLEN_WIDTH": os.environ.get("VARLEN_WIDTH", "128")}
    rows = []
    for way in WAYS:
        done = subprocess.run([sys.executable, "-m", "benchmarks.token_compile", "--way", way, "--batches",
                               str(args.batches), "--cap", str(args.cap)], cwd=REPO, env=env, capture_output=True,
                              text=True)
        if done.returncode != 0:
            sys.exit(f"{way}: {done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    command = f"python -m benchmarks.token_compile --batches {args.batches} --cap {args.cap}"
    lines = [f"`{command}` ({os.cpu_count()} cores; layers {env['VARLEN_LAYERS']}, width {env['VARLEN_WIDTH']})", "",
             "| way | shapes | graphs compiled | first 3 steps | median step after 10 | all steps |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['way']} | {r['shapes']} | {r['graphs']} | {r['first_three_s']:.1f} s | "
              f"{r['median_after_ten_ms']:.0f} ms | {r['total_s']:.1f} s |" for r in rows]
    text = "# torch.compile over batches by tokens\n\n" + "\n".join(lines) + "\n"
    with open(args.out, "w") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
