"""autofit's search benchmark: record real probe landscapes once, replay search strategies on them.

- `record_landscape`: measures every config of a search space for real (one worker) into JSON.
- `landscape`: the recorded data, answering `probe(config)` with optional seeded noise.
- `strategies`: autofit's planner and the baselines (grid, random, TPE, Lightning, Accelerate,
  DeepSpeed-like), each run against a replayed landscape.
- `replay`: every landscape × every strategy × many seeds, summarised as markdown tables.
"""
