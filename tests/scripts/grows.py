from _grow import train_steps

from autofit import autofit


@autofit(batch_size=(1, 512))
def train(run):
    train_steps(run)
