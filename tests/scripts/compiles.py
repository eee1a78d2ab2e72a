"""A small MLP offered to run.compile(): a search probes it eager and compiled (inductor on CPU),
as separate strategies, and reports the compile time apart from the step time."""
import torch
import torch.nn.functional as F

from autofit import autofit


@autofit(batch_range=(16, 256), precision="fp32")
def train(run):
    torch.manual_seed(0)
    model = run.compile(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                                            torch.nn.GELU(), torch.nn.Linear(64, 1)).to(run.device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(run.batch_size, 64), torch.randn(run.batch_size, 1)) for _ in range(8)]
    while True:
        for x, y in run.batches(data):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            run.backward(loss, opt)
