from autofit import autofit


@autofit
def train_a(run):
    pass


@autofit
def train_b(run):
    pass
