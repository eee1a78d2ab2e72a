"""autofit's pick against what an expert would set by hand, and against the exhaustive grid, in one run.

    python -m benchmarks.experts [--device cpu] [--memory-limit 2GiB] [--budget 3m] [--rounds 3]
    python -m benchmarks.experts --pair nanogpt      # the held-out pair: nanoGPT's own train.py, accumulation kept
    python -m benchmarks.experts --device cuda --script benchmarks/gpu/gpt124m.py --full-size --budget 4m

The baselines are the strongest sensible choices, not the weakest:
- Lightning's `scale_batch_size` (power mode from 2) and HF's `auto_find_batch_size` (from 256), each
  run **in bf16** as an engineer configures them (`precision="bf16-mixed"`, `bf16=True`), in their
  own process, as their users run them, capped by the same limit;
- "bf16 at the largest batch that fits, no checkpointing": the hand-set expert config, read off the grid;
- the exhaustive grid's best (the truth): every precision x checkpoint level x checkpoint policy (full,
  selective) x batch of the search space probed for real (benchmarks/record_landscape.py), the fastest that fits the usable memory.
autofit searches the same script under the same limit; its exported best-config file is measured as
written. All picks are then re-measured **interleaved** (A B C A B C ...) in one worker under the limit
(benchmarks/gpu/compare.py), so a drift of the machine hits them all alike. The headline is the
median of the per-round ratios with their range ("parity within noise" where the range covers 1.0).

`--pair nanogpt` runs the same comparison on a script autofit was not tuned on: nanoGPT's own train.py
(tests/corpus/nanogpt_repo, four lines added) with the nanoGPT README's CPU recipe and a global batch of
48 kept by accumulation (`--batch_size=12 --gradient_accumulation_steps=4`), on a generated character
corpus, in fp32 alone (nanoGPT autocasts only on a GPU: its bf16 on a CPU is fp32). Its expert
baseline is the largest micro-batch that fits, the fewest accumulation steps; the Lightning and HF
finders have no form of that script and are left out. Writes
benchmarks/experts-DEVICE[-PAIR].md with the table and the command.
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

from autofit.config import CHECKPOINT_POLICIES, Config
from autofit.units import format_flops, parse_size
from benchmarks import pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = "benchmarks/gpu/gpt124m.py"
#: The small GPT-2 of the CPU rows (benchmarks/finders-cpu.md uses the same).
SMALL_GPT = {"GPT124M_SEQ": "64", "GPT124M_LAYERS": "4", "GPT124M_WIDTH": "256", "GPT124M_SAMPLES": "1024"}
#: nanoGPT README's CPU recipe, a global batch of 48 (12 x 4 accumulation steps).
NANOGPT_ARGS = ["--dataset=shakespeare_char", "--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                "--batch_size=12", "--gradient_accumulation_steps=4", "--n_layer=4", "--n_head=4", "--n_embd=128",
                "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]


def _run(args: list[str], env: dict, cwd: str = REPO) -> subprocess.CompletedProcess:
    print("$", " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return done


def _spec(config: Config) -> str:
    return json.dumps(config.to_dict())  # every field (the checkpoint policy, the loader) reaches the compare


def run_finder(tool: str, args: argparse.Namespace, env: dict, tmp: str) -> dict:
    out = os.path.join(tmp, f"{tool}.json")
    began = time.perf_counter()
    extra = ["--start", "256"] if tool == "hf" else []
    done = _run(["-m", "benchmarks.gpu.finders", tool, "--device", args.device, "--memory-limit", args.memory_limit,
                 "--precision", "bf16", "--fit-steps", "4", "--out", out, *extra], env)
    if done.returncode != 0 or not os.path.exists(out):
        tail = done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"
        return {"error": tail, "wall_s": time.perf_counter() - began}
    return {**json.load(open(out)), "wall_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--script", default=SCRIPT)
    parser.add_argument("--full-size", action="store_true", help="the script as it is (default: the small GPT-2 env)")
    parser.add_argument("--memory-limit", default="2GiB")
    parser.add_argument("--budget", default="3m", help="autofit's search budget")
    parser.add_argument("--grid-batch", default="4:256", help="the grid's micro-batch range LOW:HIGH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--pair", choices=["nanogpt"], default=None,
                        help="the held-out pair: nanoGPT's own train.py with its CPU recipe, global batch 48")
    args = parser.parse_args()
    from benchmarks.record_landscape import record

    env = {**os.environ, "PYTHONPATH": pythonpath(), **({} if args.full_size or args.pair else SMALL_GPT)}
    script_args: list[str] = []
    global_batch, precisions = None, ("fp32", "bf16")
    started = time.perf_counter()
    picks: dict[str, str] = {}
    times: dict[str, float] = {}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = REPO
        if args.pair == "nanogpt":
            from tests.support.nanogpt import nanogpt_folder

            cwd = os.path.join(tmp, "nanogpt")
            args.script, script_args, global_batch, precisions = nanogpt_folder(cwd), NANOGPT_ARGS, 48, ("fp32",)
            env["AUTOFIT_SCRIPT_ARGS"] = json.dumps(script_args)  # the grid's and the compare's probes
            os.chdir(cwd)  # the grid's worker: nanoGPT reads data/ from where it runs
        os.environ.update(env)  # the grid's worker runs the same script under the same settings
        for tool in () if args.pair else ("lightning", "hf"):
            found = run_finder(tool, args, env, tmp)
            name = f"{tool} (bf16)"
            times[name] = found["wall_s"]
            if "batch_size" in found:
                picks[name] = f"bf16:{found['batch_size']}"
                notes[name] = f"its own training after finding: {found.get('fit')}" + (
                    f" ({found['error'][:160]})" if found.get("fit") != "ok" and found.get("error") else "")
            else:
                notes[name] = found["error"]
        low, _, high = args.grid_batch.partition(":")
        began = time.perf_counter()
        grid = record(args.script, memory_limit=parse_size(args.memory_limit), batch_range=(int(low), int(high)),
                      precisions=precisions, checkpoint_policies=CHECKPOINT_POLICIES,  # as the search
                      global_batch=global_batch, name="experts-grid", out=os.path.join(tmp, "grid.json"),
                      device=args.device)
        times["grid best"] = time.perf_counter() - began
        fits = [e for e in grid.entries.values() if e.status == "ok" and e.peak_bytes and e.peak_bytes <= grid.usable_bytes]
        grid_best = grid.best_config()
        if grid_best is not None:
            picks["grid best"] = _spec(grid_best)
        hand = [e.config for e in fits if e.config.precision == precisions[-1] and e.config.checkpoint_segments == 0]
        if hand:
            largest = max(hand, key=lambda c: c.batch_size)  # at a global batch: the fewest accumulation steps
            expert = f"{precisions[-1]}, largest batch that fits"
            picks[expert] = _spec(largest)
            times[expert] = times["grid best"]
            notes[expert] = "read off the grid (doubling by hand until OOM finds the same)"
        best_file = os.path.join(tmp, "autofit.best.json")
        began = time.perf_counter()
        searched = _run(["-m", "autofit.cli", "search", args.script, "--device", args.device, "--memory-limit",
                         args.memory_limit, "--budget", args.budget, "--storage", f"sqlite:///{tmp}/autofit.db",
                         "--precision", ",".join(precisions),
                         "--out", best_file, *(["--", *script_args] if script_args else [])], env, cwd)
        times["autofit"] = time.perf_counter() - began
        if searched.returncode != 0:
            sys.exit(f"autofit search failed: {searched.stderr[-1000:]}")
        picks["autofit"] = "@" + best_file  # measured as exported: every field of the file
        compared_path = os.path.join(tmp, "compare.json")
        compared = _run(["-m", "benchmarks.gpu.compare", args.script, "--device", args.device, "--memory-limit",
                         args.memory_limit, "--rounds", str(args.rounds), "--steps", str(args.steps),
                         "--out", compared_path,
                         *[part for name, spec in picks.items() for part in ("--config", f"{name}={spec}")]], env, cwd)
        if compared.returncode != 0:
            sys.exit(f"compare failed: {compared.stderr[-1000:]}")
        rows = json.load(open(compared_path))["rows"]
        os.chdir(REPO)
    write_table(args, rows, picks, times, notes, time.perf_counter() - started, grid.meta.get("probed"))


def round_ratios(rows: dict, name: str, other: str) -> list[float]:
    """`name` ÷ `other` in each interleaved round both completed (they shared that round's drift)."""
    return [a / b for a, b in zip(rows[name].get("rounds", []), rows[other].get("rounds", [])) if a and b]


def ratio_words(ratios: list[float]) -> str:
    """The median of the per-round ratios with their range; "parity within noise" where it covers 1.0."""
    if not ratios:
        return "n/a"
    low, high = min(ratios), max(ratios)
    words = f"**{statistics.median(ratios):.2f}x** (median of {len(ratios)} rounds, range {low:.2f}-{high:.2f}"
    return words + ("; parity within noise)" if low <= 1.0 <= high else ")")


def write_table(args, rows: dict, picks: dict, times: dict, notes: dict, elapsed: float, grid_probes) -> None:
    rate = {name: row["median_samples_per_s"] for name, row in rows.items()}
    baselines = [n for n in rows if n not in ("autofit", "grid best") and rate.get(n)]
    strongest = max(baselines, key=lambda n: rate[n]) if baselines else None
    command = (f"python -m benchmarks.experts --device {args.device} --memory-limit {args.memory_limit} "
               f"--budget {args.budget} --rounds {args.rounds} --grid-batch {args.grid_batch}"
               + (" --full-size" if args.full_size else "")
               + (f" --pair {args.pair}" if args.pair else "")
               + (f" --script {args.script}" if args.script != SCRIPT and not args.pair else ""))
    setting = (f"; nanoGPT train.py {' '.join(NANOGPT_ARGS)}" if args.pair == "nanogpt"
               else "" if args.full_size else f"; small GPT-2: {', '.join(f'{k}={v}' for k, v in SMALL_GPT.items())}")
    lines = [
        f"`{command}` ({elapsed / 60:.1f} min in all, {os.cpu_count()} cores; grid: {grid_probes} probes{setting})",
        "",
        "| pick | config | time to pick | samples/s (interleaved, median) | ÷ strongest baseline | ÷ grid best | model FLOP/s | MFU | peak |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        config = Config.from_dict(row["config"])
        samples = rate.get(name)
        vs_strongest = f"{samples / rate[strongest]:.2f}" if samples and strongest else "—"
        vs_grid = f"{samples / rate['grid best']:.2f}" if samples and rate.get("grid best") else "—"
        flops = [f for f in row.get("flops_per_s", []) if f]
        mfus = [m for m in row.get("mfu", []) if m is not None]
        peak = max((p for p in row["peak_bytes"] if p), default=0) / 2**20
        lines.append(f"| {name} | {config.label()} ({'/'.join(sorted(set(row['status'])))}) | {times.get(name, 0):.0f} s "
                     f"| {samples or 0:,.1f} | {vs_strongest} | {vs_grid} | "
                     f"{format_flops(sorted(flops)[len(flops) // 2]) if flops else '—'} | "
                     f"{f'{sorted(mfus)[len(mfus) // 2]:.1%}' if mfus else 'n/a'} | {peak:.0f} MiB |")
    if strongest and rate.get("autofit"):
        lines += ["", f"autofit ÷ the strongest baseline ({strongest}): {ratio_words(round_ratios(rows, 'autofit', strongest))}"
                      + (f"; ÷ the grid's best: {ratio_words(round_ratios(rows, 'autofit', 'grid best'))}"
                         if rate.get("grid best") else "")]
        lines += ["", "Per round (interleaved): " + "; ".join(
            f"{name} {', '.join(f'{r:,.1f}' if r else 'failed' for r in row.get('rounds', []))}" for name, row in rows.items())]
    lines += [f"- {name}: {note}" for name, note in notes.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    suffix = f"-{args.pair}" if args.pair else ""
    with open(os.path.join(HERE, f"experts-{args.device}{suffix}.md"), "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
