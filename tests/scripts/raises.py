from autofit import autofit


def helper_that_fails(n):
    raise ValueError(f"bad shape {n}")


@autofit
def train(run):
    for x in run.batches(range(100)):
        helper_that_fails(run.batch_size)
