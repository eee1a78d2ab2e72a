from autofit import autofit
from _grow import train_steps


@autofit(batch_size=(1, 512))
def train(run):
    train_steps(run)
