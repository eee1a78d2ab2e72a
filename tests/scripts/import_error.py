
raise RuntimeError("this script is broken at import")

from autofit import autofit  # noqa: E402 - never reached: the decorated function the script was to define


@autofit
def train(run):
    pass
