"""autofit's search benchmark: record real probe landscapes once, replay search strategies on them.

- `record_landscape`: measures every config of a search space for real (one worker) into JSON.
- `landscape`: the recorded data, answering `probe(config)` with optional seeded noise.
- `strategies`: autofit's planner and the baselines (grid, random, TPE, Lightning, Accelerate,
  DeepSpeed-like), each run against a replayed landscape.
- `replay`: every landscape × every strategy × many seeds, summarised as markdown tables.
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pythonpath() -> str:
    """This checkout first, then the caller's own PYTHONPATH: packages carried beside it (wheels in a
    folder of their own, as on a device machine) must stay importable in the child processes."""
    return os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)


def publish(text: str, path: str) -> None:
    """A benchmark's table: printed, and written to its file (the docs quote the file)."""
    print(text)
    with open(path, "w") as handle:
        handle.write(text)
