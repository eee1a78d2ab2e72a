from _grow import train_steps

from autofit import autofit


def overflow_fp16(run, loss):
    return loss * float("inf") if run.precision == "fp16" else loss


@autofit(precision=("fp32", "fp16"), batch_range=(1, 256))
def train(run):
    train_steps(run, overflow_fp16)
