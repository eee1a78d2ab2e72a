"""autofit against Lightning's and Hugging Face's batch-size finders on CPU, under one memory limit.

    python -m benchmarks.finders_cpu [--memory-limit 2GiB] [--budget 3m] [--rounds 3]

One model for the three tools: a small GPT-2 built from its config (benchmarks/gpu/gpt124m.py with
GPT124M_SEQ/LAYERS/WIDTH shrunk for a CPU), seeded random tokens. Each finder runs in its own process
as its users run it (Lightning `scale_batch_size` power mode from 2; HF `auto_find_batch_size` from 256),
that process capped by the limit as autofit caps a probe; autofit searches the same script under the
same limit. The three picks are then re-measured interleaved in one worker under the limit
(benchmarks/gpu/compare.py). Writes benchmarks/finders-cpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import publish, pythonpath
from benchmarks.gpu.compare import parse_config

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SMALL_GPT = {"GPT124M_SEQ": "64", "GPT124M_LAYERS": "4", "GPT124M_WIDTH": "256", "GPT124M_SAMPLES": "1024"}
SCRIPT = "benchmarks/gpu/gpt124m.py"
KEEPS = {"autofit": "with --global-batch (not asked here)", "lightning": "no: the batch it finds is the global batch",
         "hf": "no: the batch it finds is the global batch"}


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    print("$", " ".join(args), file=sys.stderr, flush=True)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", default="2GiB")
    parser.add_argument("--budget", default="3m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    env = {**os.environ, **SMALL_GPT, "PYTHONPATH": pythonpath()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        picks, found = {}, {}
        for tool, extra in (("lightning", []), ("hf", ["--start", "256"])):
            out = os.path.join(tmp, f"{tool}.json")
            began = time.perf_counter()
            done = _run(["-m", "benchmarks.gpu.finders", tool, "--device", "cpu", "--memory-limit", args.memory_limit,
                         "--fit-steps", "4", "--out", out, *extra], env)
            if done.returncode != 0 or not os.path.exists(out):
                found[tool] = {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"}
                continue
            found[tool] = {**json.load(open(out)), "wall_s": time.perf_counter() - began}
            picks[tool] = f"fp32:{found[tool]['batch_size']}"
        best = os.path.join(tmp, "autofit.best.json")
        began = time.perf_counter()
        searched = _run(["-m", "autofit.cli", "search", SCRIPT, "--device", "cpu", "--memory-limit", args.memory_limit,
                         "--budget", args.budget, "--storage", f"sqlite:///{tmp}/autofit.db", "--out", best], env)
        search_s = time.perf_counter() - began
        if searched.returncode != 0:
            sys.exit(f"autofit search failed: {searched.stderr[-1000:]}")
        config = json.load(open(best))["config"]
        picks["autofit"] = (f"{config['precision']}:{config['batch_size']}:{config.get('checkpoint_segments', 0)}:"
                            f"{config.get('accumulation_steps', 1)}")
        compared_path = os.path.join(tmp, "compare.json")
        compared = _run(["-m", "benchmarks.gpu.compare", SCRIPT, "--device", "cpu", "--memory-limit", args.memory_limit,
                         "--rounds", str(args.rounds), "--steps", str(args.steps), "--out", compared_path,
                         *[part for name, spec in picks.items() for part in ("--config", f"{name}={spec}")]], env)
        if compared.returncode != 0:
            sys.exit(f"compare failed: {compared.stderr[-1000:]}")
        rows = json.load(open(compared_path))["rows"]
    reference = rows["autofit"]["median_samples_per_s"]
    lines = [
        f"`python -m benchmarks.finders_cpu --memory-limit {args.memory_limit} --budget {args.budget} --rounds "
        f"{args.rounds}` ({(time.perf_counter() - started) / 60:.1f} min, {os.cpu_count()} cores; small GPT-2: "
        f"{', '.join(f'{k}={v}' for k, v in SMALL_GPT.items())})",
        "",
        "| tool | picked | time to pick | samples/s (interleaved re-measure, median) | ÷ autofit | peak | keeps the global batch |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    times = {"autofit": search_s, **{tool: found[tool].get("wall_s", 0) for tool in found}}
    for name in ("autofit", "lightning", "hf"):
        if name not in rows:
            lines.append(f"| {name} | — ({found.get(name, {}).get('error', 'no pick')}) | | | | | |")
            continue
        row = rows[name]
        rate = row["median_samples_per_s"]
        peak = max((p for p in row["peak_bytes"] if p), default=0) / 2**20
        ratio = f"{rate / reference:.2f}" if rate and reference else "—"
        statuses = "/".join(sorted(set(row["status"])))
        label = parse_config(f"{name}={picks[name]}")[1].label()
        lines.append(f"| {name} | {label} ({statuses}) | {times.get(name, 0):.0f} s | {rate or 0:.1f} | {ratio} | "
                     f"{peak:.0f} MiB | {KEEPS[name]} |")
    publish("\n".join(lines) + "\n", os.path.join(HERE, "finders-cpu.md"))


if __name__ == "__main__":
    main()
