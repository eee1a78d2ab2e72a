import time

from autofit import autofit


@autofit
def train(run):
    for x in run.batches(range(10**6)):
        time.sleep(3600)
