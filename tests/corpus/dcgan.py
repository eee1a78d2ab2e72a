"""A DCGAN in the style of pytorch/examples' dcgan/main.py: a generator and a discriminator of
strided (transposed) convolutions with batch norm, weights_init, two Adam optimizers, and per batch
(1) the discriminator on a real and a fake batch, (2) the generator through the discriminator;
`D(x)` and `D(G(z))` read with `.mean().item()` and logged, fixed noise kept for samples.

Changed for autofit (marked `# autofit`): the import and the decorator, the loop in a function of
`run`, the loader's batch size, `run.batches(dataloader)`, the forward passes under `run.autocast()`,
and `run.backward(loss, optimizer)` in place of each `backward(); optimizer.step()`.
Beyond the documented change: the example calls `errD_real.backward()` and `errD_fake.backward()`
and steps once; `run.backward()` steps at every call at accumulation 1, so the two discriminator
losses are summed into one `run.backward(errD_real + errD_fake, optimizerD)` (the same gradient),
and the labels the example refills in place (`label.fill_(fake_label)`) are new tensors, since the
real batch's loss still needs its labels for the backward that now comes later.
The example's `netD.zero_grad()`/`netG.zero_grad()` stay: the generator's backward leaves gradients
in the discriminator, which its next step must not see. Two optimizers share one step count, so the
script is searched without accumulation (`accumulation=(1,)`).

32x32 images of seeded noise blobs, generated at import (no download).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit

parser = argparse.ArgumentParser()
parser.add_argument("--niter", type=int, default=1, help="number of epochs to train for")
parser.add_argument("--nz", type=int, default=32, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=16)
parser.add_argument("--ndf", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.0002, help="learning rate")
parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam")
parser.add_argument("--manualSeed", type=int, default=999, help="manual seed")
opt = parser.parse_args()

nc, nz, ngf, ndf = 3, opt.nz, opt.ngf, opt.ndf


def make_images(n: int = 1024, seed: int = 0) -> TensorDataset:
    """Stands in for dset.ImageFolder(...) with Resize/CenterCrop/Normalize: images in [-1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(n, nc, 8, 8, generator=generator)
    images = nn.functional.interpolate(base, size=32, mode="bilinear", align_corners=False)
    return TensorDataset(images * 2 - 1)


dataset = make_images()


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),  # 4x4
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # 8x8
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),  # 16x16
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),  # 32x32
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # 16x16
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),  # 8x8
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),  # 4x4
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


@autofit(default_batch_size=64, accumulation=(1,))  # autofit
def train(run):  # autofit
    torch.manual_seed(opt.manualSeed)
    device = run.device
    dataloader = DataLoader(dataset, batch_size=run.batch_size, shuffle=True, drop_last=True)  # autofit
    netG = Generator().to(device)
    netG.apply(weights_init)
    netD = Discriminator().to(device)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(64, nz, 1, 1, device=device)
    real_label, fake_label = 1., 0.
    optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    for epoch in range(opt.niter) if not run.probing else range(10**6):  # autofit
        for i, (data,) in enumerate(run.batches(dataloader)):  # autofit
            ############################
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            ###########################
            netD.zero_grad()
            real_cpu = data
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)
            with run.autocast():  # autofit
                output = netD(real_cpu).float()
                errD_real = criterion(output, label)
            D_x = output.mean().item()

            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            with run.autocast():  # autofit
                fake = netG(noise)
                label = torch.full((batch_size,), fake_label, dtype=real_cpu.dtype, device=device)  # autofit
                output = netD(fake.detach()).float()
                errD_fake = criterion(output, label)
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            run.backward(errD, optimizerD)  # autofit: was errD_real.backward(); errD_fake.backward(); optimizerD.step()

            ############################
            # (2) Update G network: maximize log(D(G(z)))
            ###########################
            netG.zero_grad()
            # fake labels are real for generator cost
            label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)  # autofit: was fill_
            with run.autocast():  # autofit
                output = netD(fake).float()
                errG = criterion(output, label)
            D_G_z2 = output.mean().item()
            run.backward(errG, optimizerG)  # autofit: was errG.backward(); optimizerG.step()

            if i % 10 == 0:
                print(f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {errD.item():.4f} "
                      f"Loss_G: {errG.item():.4f} D(x): {D_x:.4f} D(G(z)): {D_G_z1:.4f} / {D_G_z2:.4f}", flush=True)
        if not run.probing:
            with torch.no_grad():
                fake = netG(fixed_noise)  # the example saves these as images
    print(f"dcgan: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
