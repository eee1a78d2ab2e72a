"""What the CPU's memory sampler costs the steps beside it: a host-bound step with the sampler awake and asleep, in
one process, interleaved.

    python -m benchmarks.memory_sampler [--rounds 30] [--steps 50] [--batch-size 32]

The CPU backend reads a probe's VmData from a thread that wakes every 2 ms (autofit/devices/_cpu.py) and takes the
GIL each time; a normal run runs no such thread. Since issue 52 it sleeps while a probe's steps are timed
(`DeviceBackend.timing`). Round after round, the same model (benchmarks/fidelity_scripts/host_bound.py) takes
`--steps` plain steps with the backend's sampler awake, then as many with it asleep; the ratio is the median of
the rounds' own ratios, so a drift of a shared machine hits both alike. Writes one markdown line to stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from autofit.devices import make_backend

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fidelity_scripts"))

from host_bound import WIDTH, build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, x = build(), torch.randn(args.batch_size, WIDTH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step_s() -> float:
        started = time.perf_counter()
        for _ in range(args.steps):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - started) / args.steps

    backend = make_backend("cpu", 0)
    backend.reset_peak()  # the sampler starts, as at a probe's start
    step_s()  # first use, off the record
    awake, asleep = [], []
    for _ in range(args.rounds):
        backend.timing(False)
        awake.append(step_s())
        backend.timing(True)
        asleep.append(step_s())
    backend.peak_bytes()  # the sampler stops
    ratios = sorted(a / b for a, b in zip(awake, asleep))
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"host_bound b={args.batch_size}, {torch.get_num_threads()} threads, {args.rounds} rounds of {args.steps} "
          f"steps: sampler awake {statistics.median(awake) * 1e3:.3f} ms a step, asleep "
          f"{statistics.median(asleep) * 1e3:.3f} ms; awake ÷ asleep **{statistics.median(ratios):.3f}** "
          f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})")


if __name__ == "__main__":
    main()
