"""One rank of a distributed probe, started by torchrun:

    python -m torch.distributed.run --nproc-per-node N ... -m autofit.probing._rank_process REQUEST.json

Every rank loads the user's script, caps its own memory (autofit.probing._bootstrap), runs the probe
(the user's function, which joins the process group through `run.distribute`), and writes its result
to OUT/rank-R.json (autofit.probing._wire). A rank whose probe did not end ok exits with status 3 at
once, so that torchrun tears the other ranks down instead of leaving them waiting in a collective;
autofit.probing._torchrun combines the results.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from dataclasses import replace

from autofit.probing._bootstrap import bootstrap, die_with_parent, prepare_process
from autofit.probing._sources import local_modules
from autofit.probing._wire import read_rank_request, write_rank_result


def main(request_path: str) -> int:
    prepare_process()
    # A probe past its timeout has torchrun SIGKILLed, which leaves it no time to stop its ranks, each in a
    # session of its own: without this they lived on as orphans (a hung rank forever, holding its memory).
    die_with_parent()
    if os.getppid() == 1:
        return 3  # torchrun died before this rank could follow it
    load_request, probe_request, out = read_rank_request(request_path)
    from autofit.probing._probe import run_probe
    from autofit.probing._progress import ProgressFile
    from autofit.probing._wire import MIN_MEASURE_S
    from autofit.runtime import ranks_from_env

    ranks = ranks_from_env()
    loaded = bootstrap(replace(load_request, index=ranks.local_rank if load_request.device == "cuda" else 0))
    # Ranks measure at least as long as a single-process probe, stopping at the same step (the Run's
    # clock agrees on the step count among them after the first measured step).
    min_measure_s = probe_request.min_measure_s
    # Rank 0 tells the runner how far the job got (every rank steps together: one is enough).
    tells = probe_request.progress_path and ranks.rank == 0
    with ProgressFile(probe_request.progress_path) if tells else nullcontext() as progress:
        result = run_probe(loaded.fn, probe_request.config, loaded.backend, warmup_steps=probe_request.warmup,
                           measured_steps=probe_request.steps, ranks=ranks, progress=progress,
                           open_step_s=probe_request.open_step_s,
                           min_measure_s=MIN_MEASURE_S if min_measure_s is None else min_measure_s)
    result.world_size = ranks.world_size
    result.modules = local_modules(load_request.script)  # the code it ran beside the script's own
    write_rank_result(out, ranks.rank, result)
    sys.stdout.flush()
    sys.stderr.flush()
    if not result.ok:
        os._exit(3)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # leave together: the rendezvous store must outlive every rank's last use
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
