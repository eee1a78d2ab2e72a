"""ddp_faults.py that notes, in $MARKS_OUT, what each call finds of the calls before it in its process, one
line per call and rank: the rank, its pid and its parent's, then what a fresh process would not show: the
module's call counter (0), the global forward hooks (none), a process group already joined (0). Then it
leaves them all behind. At micro-batch 4 each call also hangs 128 MiB on a model built at import (memory a
process kept across probes cannot put back)."""
import os

import torch
import torch.distributed as dist
from ddp_faults import train as faulty
from torch.nn.modules import module as module_hooks

from autofit import autofit

CALLS = 0
built_at_import = torch.nn.Linear(1, 1)
built_at_import.kept = []


@autofit(global_batch=32, default_batch_size=8)
def train(run):
    global CALLS
    with open(os.environ["MARKS_OUT"], "a") as out:
        out.write(f"{run.rank} {os.getpid()} {os.getppid()} {CALLS} {len(module_hooks._global_forward_hooks)} "
                  f"{int(dist.is_initialized())}\n")
    CALLS += 1
    module_hooks.register_module_forward_hook(lambda *args: None)
    if run.batch_size == 4:
        built_at_import.kept.append(torch.ones(32 * 2**20))
    faulty.fn(run)
