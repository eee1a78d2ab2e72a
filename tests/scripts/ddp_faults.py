"""ddp_train.py with a fault on rank 1 alone: at micro-batch 16 and above it runs out of memory (a 2 GiB
buffer under a 1 GiB limit), at 12 it is killed (SIGKILL) while rank 0 waits for it; rank 0 is healthy."""
import os
import signal

import torch
from ddp_train import train as healthy

from autofit import autofit


@autofit(default_batch_size=8)
def train(run):
    if run.rank == 1 and run.batch_size >= 16:
        torch.empty(2 * 2**30, dtype=torch.uint8).fill_(1)  # the allocator refuses: rank 1's OOM
    if run.rank == 1 and run.batch_size == 12:
        os.kill(os.getpid(), signal.SIGKILL)
    healthy.fn(run)
