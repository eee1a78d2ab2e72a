from _grow import train_steps

from autofit import autofit


@autofit(batch_range=(1, 512))
def train(run):
    train_steps(run)
