"""The memory estimator inside short searches of the corpus: does it answer in time, and how far is
its raw prediction from the peaks the probes then measure?

    python -m benchmarks.estimates_in_search [NAME ...] [--budget 2m] [--out benchmarks/estimates-in-search.md]

For each one-process corpus script (tests/corpus/), a real `autofit search SCRIPT --budget 2m` under the
script's memory limit (benchmarks/corpus.py's), into a study of its own; then from that study:

- the estimator: the configs it estimated of those it was asked, in how many seconds, and the share
  of the search space's configs it predicts (the rest of a curve is interpolated from its estimates);
- the precisions the search probed, each with the number of the probe that first ran it;
- every probe that ran to the end: its measured peak against the raw prediction, made before any
  probe (the estimator's process baseline and measured runtime context, plus its tensor bytes at
  `autofit.memory.CPU_TYPICAL_FACTOR`): the median error, the worst over and the worst under;
  probes that ran out of memory.

The bounds the README states: raw within 10% of the measured peak, never more than 5% under it.
Needs a quiet machine (the estimator runs on the idle CPU time the probes leave).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from autofit.findings import load_study, observations
from benchmarks.corpus import SCRIPTS, Script, _env

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(script: Script, budget: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/s.db"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "autofit.cli", "search", script.path, "--device", "cpu",
                               "--memory-limit", script.limit, "--budget", budget, "--storage", storage,
                               "--out", os.path.join(tmp, "best.json")], cwd=tmp, env=_env(tmp), capture_output=True,
                              text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"search of {script.name} failed ({done.returncode}): {done.stderr[-1500:]}")
        study = load_study(storage=storage)
        seen = observations(study.trials())
        space = study.space
        prediction = study.estimates.prediction("cpu") if study.estimates else None
    first: dict[str, int] = {}
    for number, o in enumerate(seen, start=1):
        first.setdefault(o.config.precision, number)
    errors = []
    for o in seen:
        raw = prediction.raw_peak(o.config) if prediction else None
        if o.status == "ok" and o.peak_bytes and raw:
            errors.append(raw / o.peak_bytes - 1)
            print(f"  {script.name:<20} {o.config.label():<22} raw {raw / 2**20:7.0f} MiB  measured "
                  f"{o.peak_bytes / 2**20:7.0f} MiB  {errors[-1]:+.1%}", file=sys.stderr, flush=True)
    configs = space.configs()
    predicted = sum(prediction.tensor_bytes(c) is not None for c in configs) if prediction else 0
    return {"name": script.name, "wall_s": wall, "probes": len(seen), "oom": sum(o.status == "oom" for o in seen),
            "estimator": study.estimates.summary() if study.estimates else "not run",
            "predicted": predicted, "space": len(configs), "first": first, "errors": errors}


def table(rows: list[dict], budget: str, seconds: float) -> str:
    lines = [f"The memory estimator in `--budget {budget}` searches of the corpus, CPU ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores), `python -m benchmarks.estimates_in_search --budget {budget}`, {seconds / 60:.1f} min.",
             "",
             "| script | probes (OOM) | estimated | space predicted | precisions (first probe) | probes compared | "
             "raw error: median | worst over | worst under | within bounds |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---|"]
    every = []
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['name']} | FAILED: {r['failed'][:200]} |||||||||")
            continue
        e = r["errors"]
        every += e
        estimated = r["estimator"].removeprefix("memory estimator: ")
        precisions = ", ".join(f"{p} (#{n})" for p, n in r["first"].items())
        share = f"{r['predicted']} of {r['space']}"
        if e:
            ok = "yes" if max(e) <= 0.10 and min(e) >= -0.05 else "no"
            lines.append(f"| {r['name']} | {r['probes']} ({r['oom']}) | {estimated} | {share} | {precisions} | {len(e)} | "
                         f"{statistics.median(e):+.1%} | {max(e):+.1%} | {min(e):+.1%} | {ok} |")
        else:
            lines.append(f"| {r['name']} | {r['probes']} ({r['oom']}) | {estimated} | {share} | {precisions} | 0 | — | — | — | — |")
    if every:
        inside = sum(-0.05 <= x <= 0.10 for x in every)
        lines += ["", f"- all probes compared: {len(every)}; raw error median {statistics.median(every):+.1%}, "
                      f"worst over {max(every):+.1%}, worst under {min(every):+.1%}; "
                      f"{inside} of {len(every)} within +10%/−5%"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scripts to run (default: every one-process script)")
    parser.add_argument("--budget", default="2m")
    parser.add_argument("--out", default=os.path.join(HERE, "estimates-in-search.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for script in SCRIPTS:
        if script.nproc > 1 or (args.names and script.name not in args.names):
            continue
        try:
            rows.append(measure(script, args.budget))
        except RuntimeError as exc:
            rows.append({"name": script.name, "failed": str(exc)})
        print(f"  {rows[-1]['name']}: done", file=sys.stderr, flush=True)
    text = table(rows, args.budget, time.perf_counter() - started)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
