"""Notes, at each micro-batch, whether the probe is measuring it (its clock's `measuring`) and whether a memory
sampler thread (the CPU backend's, whatever its name) runs beside it; writes the notes to $BESIDE_OUT when the
probe ends it. A probe's measured steps must run as the normal run's, which runs no sampler (issue 52, item 4)."""

from __future__ import annotations

import json
import os
import threading

import torch

from autofit import autofit


def _sampler_alive() -> bool:
    return any("sampler" in t.name or "_sample_data" in t.name for t in threading.enumerate())


@autofit(default_batch_size=4)
def train(run) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(run.batch_size, 8) for _ in range(16)]
    seen: list[list] = []
    try:
        while True:
            for x in run.batches(data):
                with run.autocast():
                    loss = model(x).square().mean()
                run.backward(loss, optimizer)
                seen.append([run.optimizer_steps, run.control.clock.measuring, _sampler_alive()])
    finally:
        with open(os.environ["BESIDE_OUT"], "w") as handle:
            json.dump(seen, handle)
