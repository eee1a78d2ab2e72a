"""Parses its command line at import, as pytorch/examples do: a probe must give it its defaults."""
import argparse

import torch

from autofit import autofit

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()


@autofit
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 8)] * 4):
            run.backward(model(x).pow(2).mean(), opt)
