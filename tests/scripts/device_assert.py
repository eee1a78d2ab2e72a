"""On CUDA, an out-of-range embedding index trips a device-side assert: the CUDA context is broken
for the rest of the process (a sticky error). Used by scripts/check_cuda.py; on CPU it is a plain
IndexError. Batch 1 trains normally, so the probe after the failing one can show a fresh worker."""
import torch

from autofit import autofit


@autofit
def train(run):
    table = torch.nn.Embedding(10, 4).to(run.device)
    opt = torch.optim.SGD(table.parameters(), lr=0.1)
    bad = run.batch_size > 1
    while True:
        for ids in run.batches([torch.full((run.batch_size,), 10**6 if bad else 3)] * 4):
            loss = table(ids).sum()
            run.backward(loss, opt)
            if bad:
                torch.cuda.synchronize() if run.device.type == "cuda" else None
