"""Batching by tokens against the ways people batch variable-length data, over one whole epoch each.

    python -m benchmarks.tokens [--memory-limit 1GiB] [--budget 3m] [--rounds 3] [--samples 2048]

The script is benchmarks/tokens_study.py: tests/corpus/sft_tokens.py's causal LM over ShareGPT-like
conversation lengths (4..256 tokens, mean about 62: a long tail). Four ways to batch it, each found as
its users find it, under the same memory limit and at the precision autofit's search picked (so the
ratios are about batching alone), each "fits" as a search decides (a probe that ran, its peak inside the
10% headroom a search keeps):

- (a) **fixed, safe**: the largest fixed batch whose batch of the longest samples fits (probes of the
  longest sample only: doubling, then bisection): the choice that survives the long tail;
- (b) **fixed, typical**: doubling the batch on ordinary shuffled batches until a probe runs out of
  memory, the last one that fitted; the run keeps autofit's runtime OOM fallback behind it;
- (c) **hand-set token cap**: `max_tokens` at the largest power of two whose worst batch (the probe
  draws the longest samples first) fits;
- (d) **autofit**: `autofit search` with the budget, then the exported file as written (its cap and the
  token guard's envelope).

Each then trains one whole epoch as a normal run (`AUTOFIT_CONFIG`, `AUTOFIT_MEMORY_LIMIT`: the same
cap), interleaved (a b c d a b c d ...) so that a drift of the machine falls on all of them. Reported:
real (non-padding) tokens/s over the run's measured steps, OOMs caught (the run's lowerings), micro-batches
run in pieces (token guard / OOM fallback), padding share, and whether the epoch finished. The headline
is autofit ÷ (a), the median of the per-round ratios with their range. Writes benchmarks/tokens-cpu.md
(`--device cuda`: benchmarks/tokens-cuda.md, or `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from autofit.config import Config
from autofit.units import parse_size
from benchmarks import REPO, pythonpath
from benchmarks.experts import ratio_words

HERE = os.path.dirname(os.path.abspath(__file__))
STUDY = "benchmarks/tokens_study.py"
HEADROOM = 0.1  # autofit search's default
STRATEGIES = ("(a) fixed, safe", "(b) fixed, typical", "(c) token cap, hand-set", "(d) autofit")


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    print("$", " ".join(args), file=sys.stderr, flush=True)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)


class Prober:
    """One probe of the study at a config (through `autofit probe`, under the limit): does it fit? As a
    search decides: it ran its steps and its peak stayed out of the headroom autofit keeps (10%)."""

    def __init__(self, env: dict, limit: str, precision: str) -> None:
        self.env, self.limit, self.precision = env, limit, precision
        self.usable = parse_size(limit) * (1 - HEADROOM)
        self.count = 0

    def fits(self, knob: str, value: int, *study_args: str) -> bool:
        self.count += 1
        done = _run(["-m", "autofit.cli", "probe", STUDY, f"--{knob}", str(value), "--precision", self.precision,
                     "--memory-limit", self.limit, "--json", "--", *study_args], self.env)
        try:
            result = json.loads(done.stdout)["result"]
            return result["status"] == "ok" and (result["peak_bytes"] or 0) <= self.usable
        except (json.JSONDecodeError, KeyError):
            sys.exit(f"probe failed to report: {done.stderr[-1500:]}")


def largest_doubling(fits: Callable[[int], bool], start: int, bisect: bool) -> int | None:
    """The largest value that fits, doubling from `start` until one does not (then bisecting the gap
    when `bisect`); None when `start` itself does not fit."""
    if not fits(start):
        return None
    low, high = start, None
    while high is None:
        if fits(low * 2):
            low *= 2
        else:
            high = low * 2
    while bisect and high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def write_config(document: dict, config: Config, path: str) -> None:
    """autofit's exported file with another config in it and no token envelope: a hand-set run."""
    changed = json.loads(json.dumps(document))
    changed["config"] = config.to_dict()
    (changed.get("measured") or {}).pop("token_envelope", None)
    with open(path, "w") as handle:
        json.dump(changed, handle, indent=2)


def epoch(env: dict, limit: str, config_path: str, fixed: bool, report: str) -> dict:
    """One whole epoch as a normal run with the file at `config_path`: its run report, and more."""
    began = time.perf_counter()
    done = _run([STUDY, *(["--fixed"] if fixed else [])],
                {**env, "AUTOFIT_CONFIG": config_path, "AUTOFIT_MEMORY_LIMIT": limit, "AUTOFIT_RUN_REPORT": report})
    wall = time.perf_counter() - began
    if done.returncode != 0 or not os.path.exists(report):
        return {"finished": False, "error": done.stderr.strip().splitlines()[-1:] or ["?"], "wall_s": wall}
    summary = json.load(open(report))
    os.unlink(report)
    padding = re.search(r"padding_share=([0-9.]+)", done.stdout)
    return {"finished": True, "tokens_per_s": summary["tokens_per_s"], "lowerings": len(summary["lowerings"]),
            "guard": summary["guard_split_batches"], "oom_split": summary["oom_split_batches"],
            "padding": float(padding.group(1)) if padding else None, "steps": summary["optimizer_steps"],
            "wall_s": wall, "final": (Config.from_dict(summary["lowerings"][-1]["after"]).label()
                                     if summary["lowerings"] else None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--budget", default="3m", help="autofit's search budget")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048, help="conversations in the epoch")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU checklist's `tokens` step)")
    parser.add_argument("--out", default=None, help="the table's file (default: benchmarks/tokens-<device>.md)")
    args = parser.parse_args()
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": pythonpath(), "AUTOFIT_DEVICE": args.device, "TOKENS_SAMPLES": str(args.samples)}
    with tempfile.TemporaryDirectory() as tmp:
        best = os.path.join(tmp, "autofit.best.json")
        began = time.perf_counter()
        searched = _run(["-m", "autofit.cli", "search", STUDY, "--memory-limit", args.memory_limit, "--budget",
                         args.budget, "--storage", f"sqlite:///{tmp}/autofit.db", "--out", best], env)
        found_in = {"(d) autofit": time.perf_counter() - began}
        if searched.returncode != 0:
            sys.exit(f"autofit search failed: {searched.stderr[-1500:]}")
        document = json.load(open(best))
        picked = Config.from_dict(document["config"])
        prober = Prober(env, args.memory_limit, picked.precision)
        configs: dict[str, Config | None] = {}
        for name, find in (
            ("(a) fixed, safe", lambda: largest_doubling(lambda b: prober.fits("batch-size", b, "--fixed", "--longest"),
                                                         1, bisect=True)),
            ("(b) fixed, typical", lambda: largest_doubling(lambda b: prober.fits("batch-size", b, "--fixed"),
                                                            1, bisect=False)),
            ("(c) token cap, hand-set", lambda: largest_doubling(lambda t: prober.fits("max-tokens", t), 256,
                                                                 bisect=False)),
        ):
            began, before = time.perf_counter(), prober.count
            value = find()
            found_in[name] = time.perf_counter() - began
            if value is None:
                configs[name] = None
                continue
            # a cap's batch_size is its sample limit: none below the cap (as `autofit probe --max-tokens`)
            knob = {"batch_size": value, "max_tokens": value} if name.startswith("(c)") else {"batch_size": value}
            configs[name] = Config(precision=picked.precision, **knob)
            print(f"{name}: {configs[name].label()} after {prober.count - before} probes", file=sys.stderr)
        configs["(d) autofit"] = picked
        paths = {}
        for name, config in configs.items():
            if config is None or name == "(d) autofit":
                continue
            paths[name] = os.path.join(tmp, f"{name[1]}.json")
            write_config(document, config, paths[name])
        paths["(d) autofit"] = best
        runs: dict[str, list[dict]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, path in paths.items():
                runs[name].append(epoch(env, args.memory_limit, path, name.startswith(("(a)", "(b)")),
                                        os.path.join(tmp, "report.json")))
    write_table(args, configs, runs, found_in, document, time.perf_counter() - started)


def write_table(args, configs: dict, runs: dict, found_in: dict, document: dict, elapsed: float) -> None:
    command = (f"python -m benchmarks.tokens --memory-limit {args.memory_limit} --budget {args.budget} "
               f"--rounds {args.rounds} --samples {args.samples}"
               + (f" --device {args.device}" if args.device != "cpu" else ""))
    rate = {name: [r.get("tokens_per_s") if r["finished"] else None for r in rounds] for name, rounds in runs.items()}
    median = {name: statistics.median([r for r in rates if r]) if any(rates) else None for name, rates in rate.items()}
    lines = [f"`{command}` ({elapsed / 60:.1f} min in all, {os.cpu_count()} cores, "
             f"{document.get('device', {}).get('name', 'cpu')}; the epoch: {args.samples} conversations)", "",
             "| batching | config | found in | real tokens/s (median) | ÷ (a) | OOMs caught | in pieces (guard/OOM) "
             "| padding | epochs finished |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    safe = "(a) fixed, safe"
    for name in STRATEGIES:
        config = configs.get(name)
        if config is None:
            lines.append(f"| {name} | nothing fits | {found_in.get(name, 0):.0f} s | — | — | — | — | — | — |")
            continue
        rounds = runs[name]
        per_round = [a / b for a, b in zip(rate[name], rate.get(safe, [])) if a and b]
        done = [r for r in rounds if r["finished"]]
        paddings = [r["padding"] for r in done if r["padding"] is not None]
        lines.append(
            f"| {name} | {config.label()} | {found_in.get(name, 0):.0f} s | {median[name] or 0:,.0f} | "
            f"{ratio_words(per_round) if name != safe else '1.00'} | {sum(r['lowerings'] for r in done)} | "
            f"{sum(r['guard'] for r in done)}/{sum(r['oom_split'] for r in done)} | "
            f"{statistics.median(paddings):.1%} | {len(done)} of {len(rounds)} |" if paddings else
            f"| {name} | {config.label()} | {found_in.get(name, 0):.0f} s | — | — | — | — | — | 0 of {len(rounds)} |")
    hand = "(c) token cap, hand-set"
    if rate.get("(d) autofit") and rate.get(hand):
        lines += ["", f"autofit ÷ the hand-set token cap (c): "
                      f"{ratio_words([a / b for a, b in zip(rate['(d) autofit'], rate[hand]) if a and b])}"]
    lines += ["", "Per round (interleaved, real tokens/s): " + "; ".join(
        f"{name} {', '.join(f'{r:,.0f}' if r else 'failed' for r in rate[name])}" for name in runs)]
    lowered = [f"{name} lowered to {r['final']}" for name, rounds in runs.items() for r in rounds if r.get("final")]
    if lowered:
        lines += ["", "After an OOM: " + "; ".join(sorted(set(lowered)))]
    failed = [f"{name}: {r['error'][0]}" for name, rounds in runs.items() for r in rounds if not r["finished"]]
    lines += [f"- did not finish: {line}" for line in failed]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out or os.path.join(HERE, f"tokens-{args.device}.md"), "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
