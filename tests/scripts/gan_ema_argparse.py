"""A GAN as people write it from the DCGAN example: options from argparse at import, a generator
built at import (before the device is known) and moved later, an EMA copy of it made with
`copy.deepcopy`, two optimizers stepped in turn (the discriminator's, then the generator's through
the discriminator again), and both losses logged with `.item()`."""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

parser = argparse.ArgumentParser()
parser.add_argument("--nz", type=int, default=64)
parser.add_argument("--lr", type=float, default=2e-4)
opt = parser.parse_args()

torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(opt.nz, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 1024), nn.Tanh())


@autofit(batch_range=(8, 256), default_batch_size=32)
def train(run):
    generator = netG.to(run.device)
    ema = copy.deepcopy(generator).eval()
    discriminator = nn.Sequential(nn.Linear(1024, 512), nn.LeakyReLU(0.2), nn.Linear(512, 1)).to(run.device)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
    real = [torch.randn(run.batch_size, 1024, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    while True:
        for x in run.batches(real):
            noise = torch.randn(len(x), opt.nz, device=run.device)
            fake = generator(noise)
            ones, zeros = torch.ones(len(x), 1, device=run.device), torch.zeros(len(x), 1, device=run.device)
            opt_d.zero_grad()
            loss_d = (F.binary_cross_entropy_with_logits(discriminator(x), ones)
                      + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros))
            loss_d.backward()
            opt_d.step()
            opt_g.zero_grad()
            loss_g = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
            loss_g.backward()
            opt_g.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), generator.parameters()):
                    e.lerp_(p, 0.01)
            print(f"loss_d {loss_d.item():.3f} loss_g {loss_g.item():.3f}")
