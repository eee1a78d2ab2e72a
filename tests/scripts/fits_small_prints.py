"""fits_small.py that talks: each probe prints its config and every step's loss, so a test can
find a probe's own output in its log (memory grows ~1 MiB per sample, as in fits_small.py)."""
from fits_small import train_steps

from autofit import autofit


def _say(line):
    print(line, flush=True)


@autofit(batch_range=(1, 2048))
def train(run):
    _say(f"probe config: precision={run.precision} batch_size={run.batch_size}")
    train_steps(run, _say)
