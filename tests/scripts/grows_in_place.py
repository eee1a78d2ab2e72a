"""A persistent worker's memory after a probe, two ways (96 MiB kept in `_held`, which the worker cannot
put back): `once` grows it in its first probe and then holds, as CUDA does in a worker's first probe
(kernels loaded at first use, library handles); `every_probe` grows it by as much in every probe;
`once_and_leaks_once` grows every worker in its first probe as `once` does, and keeps 96 MiB more in one probe
of one worker only, the second probe of the first (the file $LEAKED_ONCE says it happened)."""
import os

import _held
import torch

from autofit import autofit

KEPT_FLOATS = 24 * 2**20  # 96 MiB of fp32: more than the worker's 64 MiB allowance


def train_steps(run):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 4)] * 4):
            run.backward(model(x).pow(2).mean(), opt)


@autofit
def once(run):
    if not _held.ONCE:
        _held.ONCE.append(torch.ones(KEPT_FLOATS))
    train_steps(run)


@autofit
def every_probe(run):
    _held.EVERY_PROBE.append(torch.ones(KEPT_FLOATS))
    train_steps(run)


@autofit
def once_and_leaks_once(run):
    _held.PROBES.append(None)
    if not _held.ONCE:
        _held.ONCE.append(torch.ones(KEPT_FLOATS))
    marker = os.environ["LEAKED_ONCE"]
    if len(_held.PROBES) == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        _held.EVERY_PROBE.append(torch.ones(KEPT_FLOATS))
    train_steps(run)
