"""Time to a good answer: what a search of 1, 2, 3 and 5 minutes picks, against the best of the exhaustive grid.

    python -m benchmarks.time_to_answer [--study standin|gpt] [--budgets 1m,2m,3m,5m] [--rounds 3]

A GPU user tries a search of a few minutes first; on a GPU a probe pays a long start (compilation) and a
global batch's long steps, and how the search spends its minutes decides the answer. Two studies:
- `standin` (tests/scripts/gpu_standin.py): a GPU's costs on the CPU: an 8 s start before the first step in
  every probe, a global batch of 480 kept by accumulation, a saturating device, memory rising with the
  micro-batch; searched under 1 GiB as a GPU user would, with no other flag;
- `gpt` (studies/gpt.py): the README's small GPT under 1 GiB, a CPU's own costs.

The grid probes every config of the search space (benchmarks/record_landscape.py: every precision the
device runs by default, checkpoint level and policy, and micro-batch; the global batch's divisors for the
stand-in); its best is the fastest that fits the usable memory. Each budget's search runs from a fresh
study, in order, alone on the machine. The picks and the grid's best are then measured again
**interleaved** (A B C A B C ..., benchmarks/gpu/compare.py: one worker, the same program), and each pick's
figure is the median over the rounds of pick ÷ grid best in that round, with its range. Writes
benchmarks/time-to-answer-STUDY.md with the table and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from autofit.config import CHECKPOINT_POLICIES
from autofit.export import read_best
from autofit.units import parse_size
from benchmarks import REPO, pythonpath

STUDIES = {
    "standin": {"script": "tests/scripts/gpu_standin.py", "memory_limit": "1GiB", "global_batch": 480,
                "precisions": ("fp32",), "batch_range": (1, 480)},
    "gpt": {"script": "studies/gpt.py", "memory_limit": "1GiB", "global_batch": None,
            "precisions": None, "batch_range": (4, 512)},
}


def _run(args: list[str], env: dict, cwd: str) -> subprocess.CompletedProcess:
    print("$", " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return done


def _default_precisions() -> tuple[str, ...]:
    """The precisions a CPU search tries by default on this machine (bf16 where it has the instructions)."""
    from autofit.devices import make_backend

    return tuple(make_backend("cpu").default_precisions())


def search(study: dict, budget: str, env: dict, tmp: str) -> dict:
    """One search from a fresh study, as a user runs it: its pick (the exported file), probes and wall."""
    out = os.path.join(tmp, f"best-{budget}.json")
    storage = f"sqlite:///{tmp}/search-{budget}.db"
    began = time.perf_counter()
    done = _run(["-m", "autofit.cli", "search", study["script"], "--device", "cpu", "--memory-limit",
                 study["memory_limit"], "--budget", budget, "--storage", storage, "--out", out], env, tmp)
    wall = time.perf_counter() - began
    if done.returncode != 0 or not os.path.exists(out):
        return {"budget": budget, "error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200], "wall_s": wall}
    import optuna

    from autofit.study import open_storage, trial_result

    names = optuna.get_all_study_names(open_storage(storage))
    trials = optuna.load_study(study_name=names[0], storage=open_storage(storage)).trials
    results = [r for t in trials if (r := trial_result(t)) is not None]
    return {"budget": budget, "file": out, "config": read_best(out).config, "wall_s": wall, "probes": len(results),
            "configs": len({r.config for r in results if r.ok}),
            "timeouts": sum(r.status == "timeout" for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(STUDIES), default="standin")
    parser.add_argument("--budgets", default="1m,2m,3m,5m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="micro-batches each interleaved round measures")
    args = parser.parse_args()
    from benchmarks.record_landscape import record

    study = STUDIES[args.study]
    precisions = study["precisions"] or _default_precisions()
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(REPO, study["script"])
        study = {**study, "script": script}
        os.environ.update(env)
        began = time.perf_counter()
        grid = record(script, memory_limit=parse_size(study["memory_limit"]), batch_range=study["batch_range"],
                      precisions=precisions, checkpoint_policies=CHECKPOINT_POLICIES, global_batch=study["global_batch"],
                      name=f"time-to-answer-{args.study}", out=os.path.join(tmp, "grid.json"), device="cpu")
        grid_s = time.perf_counter() - began
        grid_best = grid.best_config()
        if grid_best is None:
            sys.exit("the grid found nothing that fits")
        searches = [search(study, budget, env, tmp) for budget in args.budgets.split(",")]
        picks = {"grid best": json.dumps(grid_best.to_dict())}
        for found in searches:
            if "config" in found:
                picks[f"autofit {found['budget']}"] = "@" + found["file"]
        compared_path = os.path.join(tmp, "compare.json")
        compared = _run(["-m", "benchmarks.gpu.compare", script, "--device", "cpu", "--memory-limit",
                         study["memory_limit"], "--rounds", str(args.rounds), "--steps", str(args.steps),
                         "--out", compared_path,
                         *[part for name, spec in picks.items() for part in ("--config", f"{name}={spec}")]], env, tmp)
        if compared.returncode != 0:
            sys.exit(f"compare failed: {compared.stderr[-1000:]}")
        rows = json.load(open(compared_path))["rows"]
    write_table(args, grid, grid_best, grid_s, searches, rows, time.perf_counter() - started)


def _ratios(rows: dict, name: str) -> list[float]:
    return [a / b for a, b in zip(rows[name].get("rounds", []), rows["grid best"].get("rounds", [])) if a and b]


def write_table(args, grid, grid_best, grid_s: float, searches: list[dict], rows: dict, elapsed: float) -> None:
    command = f"python -m benchmarks.time_to_answer --study {args.study} --budgets {args.budgets} --rounds {args.rounds}"
    lines = [f"# Time to a good answer: {args.study}", "", f"`{command}` ({elapsed / 60:.1f} min), "
             f"{time.strftime('%Y-%m-%d')}.", "",
             f"Grid: {len(grid.entries)} configs probed in {grid_s / 60:.1f} min; its best {grid_best.label()} "
             f"({rows['grid best']['median_samples_per_s']:,.1f} samples/s in the interleaved rounds).", "",
             "| budget | pick | probes (configs measured, timeouts) | search wall | pick ÷ grid best (median) | range |",
             "|---|---|---:|---:|---:|---|"]
    for found in searches:
        name = f"autofit {found['budget']}"
        if "config" not in found:
            lines.append(f"| {found['budget']} | failed: {found['error']} | | {found['wall_s']:.0f} s | | |")
            continue
        ratios = _ratios(rows, name)
        median = f"**{statistics.median(ratios):.3f}**" if ratios else "n/a"
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else ""
        lines.append(f"| {found['budget']} | {found['config'].label()} | {found['probes']} ({found['configs']}, "
                     f"{found['timeouts']}) | {found['wall_s']:.0f} s | {median} | {spread} |")
    text = "\n".join(lines) + "\n"
    path = os.path.join(REPO, "benchmarks", f"time-to-answer-{args.study}.md")
    with open(path, "w") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
