"""A script that sets its own intra-op threads at import ($SCRIPT_THREADS, else 1), as many CPU scripts do: its run
trains on them, whatever OMP_NUM_THREADS says, and so must its probes."""
import os

import torch

from autofit import autofit

torch.set_num_threads(int(os.environ.get("SCRIPT_THREADS", "1")))


@autofit
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(run.batch_size, 8) for _ in range(4)]
    while True:
        for x in run.batches(data):
            run.backward(model(x).square().mean(), opt)
