import ctypes

from _grow import train_steps

from autofit import autofit


@autofit(precision=("fp32",), batch_range=(1, 256))
def train(run):
    if run.batch_size >= 8:
        ctypes.string_at(0)  # SIGSEGV, like a crashing kernel
    train_steps(run)
