"""Input-bound: every sample takes a few milliseconds to load (a Dataset whose __getitem__ sleeps, as one
reading and decoding files does), while the model's step takes microseconds. The script declares no
workers: its loader loads in the training process, and DataLoader workers would load in parallel."""
import os
import time

import torch

from autofit import autofit

#: Seconds each sample takes to load (AUTOFIT_TEST_LOAD_S overrides it).
LOAD_S = float(os.environ.get("AUTOFIT_TEST_LOAD_S", "0.002"))
#: Samples in the dataset (AUTOFIT_TEST_SAMPLES overrides it: a normal run trains one pass over them).
SAMPLES = int(os.environ.get("AUTOFIT_TEST_SAMPLES", "4096"))
#: The loaders run.loader() built in this process (a test reads what a normal run trained with).
LOADERS = []


class SlowData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        time.sleep(LOAD_S)
        return torch.full((16,), (index % 7) / 64), torch.tensor(float(index % 3))


def train_steps(run, dataset=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = run.loader(dataset if dataset is not None else SlowData(), num_workers=0)
    LOADERS.append(loader)
    while True:
        for x, y in run.batches(loader):
            with run.autocast():
                loss = (model(x).squeeze(1) - y).pow(2).mean()
            run.backward(loss, opt)
        if not run.probing:
            return


@autofit(batch_range=(4, 8), precision=["fp32"])
def train(run):
    train_steps(run)
