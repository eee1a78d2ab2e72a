"""One rank of a distributed probe, started by torchrun:

    python -m torch.distributed.run --nproc-per-node N ... -m autofit.probing._rank_process REQUEST.json

Every rank loads the user's script, caps its own memory, runs the probe (the user's function, which
joins the process group through `run.distribute`), and writes its result to OUT/rank-R.json. A rank
whose probe did not end ok exits with status 3 at once, so that torchrun tears the other ranks down
instead of leaving them waiting in a collective; autofit.probing._torchrun combines the results.
"""

from __future__ import annotations

import json
import os
import sys


def main(request_path: str) -> int:
    with open(request_path) as handle:
        request = json.load(handle)
    from autofit.config import Config
    from autofit.devices import make_backend
    from autofit.probing._probe import MIN_MEASURE_S, run_probe
    from autofit.probing._script import find_function, load_script
    from autofit.runtime import ranks_from_env

    ranks = ranks_from_env()
    backend = make_backend(request["device"], ranks.local_rank if request["device"] == "cuda" else 0)
    fn = find_function(load_script(request["script"]), request.get("function"), request["script"])
    backend.release()
    backend.apply_memory_limit(request.get("memory_limit"), request.get("usable_bytes"))
    # Ranks measure at least as long as a single-process probe, stopping at the same step (the Run's
    # clock agrees on the step count among them after the first measured step).
    min_measure_s = request.get("min_measure_s")
    result = run_probe(fn, Config.from_dict(request["config"]), backend, warmup_steps=request["warmup"],
                       measured_steps=request["steps"], ranks=ranks,
                       min_measure_s=MIN_MEASURE_S if min_measure_s is None else min_measure_s)
    result.world_size = ranks.world_size
    path = os.path.join(request["out"], f"rank-{ranks.rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result.to_dict(), handle)
    os.replace(path + ".tmp", path)
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
