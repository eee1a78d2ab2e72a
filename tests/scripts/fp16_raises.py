from _grow import train_steps

from autofit import autofit


def refuse_fp16(run, loss):
    if run.precision == "fp16":
        raise NotImplementedError("this model's custom kernel has no fp16 version")
    return loss


@autofit(precision=("fp32", "bf16", "fp16"), batch_range=(1, 256))
def train(run):
    train_steps(run, refuse_fp16)
