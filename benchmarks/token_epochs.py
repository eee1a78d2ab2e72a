"""Does a search's token cap survive a whole epoch? Each token corpus script is searched under a memory limit,
then its exported file trains one whole epoch as a normal run under the same limit.

    python -m benchmarks.token_epochs [--memory-limit 1GiB] [--budget 2m] [--scripts a.py,b.py] [--search-args "..."]

Why: a held-out LM batched by tokens was searched under 2 GiB, then its normal run under that limit ran out of
memory at step 39 and halved its cap to 1 (issue 37, item 7). A probe runs an epoch's few worst batches (the
front of padded tokens and padded squares); the normal run must then see no batch its probes did not bound
(the token guard splits one that is beyond them) and never hold more than the probes did. Reported per
script: the exported config, its probe's peak, the normal run's largest resident memory (`ru_maxrss`, the
process as the limit saw it), OOMs caught (the run's lowerings: should be 0), micro-batches split by the
guard and by the OOM fallback, whether the epoch finished, and the exported figure over the epoch's (probe ÷
epoch: issue 53's goal is within 10%). The normal run uses
`AUTOFIT_MEMORY_LIMIT=json` (the limit in the file), as the issue's run did. Writes
benchmarks/token-epochs-cpu.md (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from autofit.config import Config
from autofit.units import format_size
from benchmarks import REPO, pythonpath

SCRIPTS = ("tests/corpus/sft_tokens.py", "tests/corpus/packed_tokens.py", "tests/corpus/speech_tokens.py")


def _run(args: list[str], env: dict, log: str) -> tuple[int, int]:
    """Run `python args` with its output in `log`: its exit status and its largest resident memory (bytes)."""
    print("$", " ".join(args), file=sys.stderr, flush=True)
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss * 1024  # kilobytes on Linux


def _tail(log: str) -> str:
    with open(log) as handle:
        lines = handle.read().strip().splitlines()
    return lines[-1] if lines else "?"


def one_script(script: str, args: argparse.Namespace, env: dict, tmp: str) -> dict:
    """Search `script`, then run one whole epoch with its file; what each did."""
    name = os.path.splitext(os.path.basename(script))[0]
    best = os.path.join(tmp, f"{name}.best.json")
    report = os.path.join(tmp, f"{name}.run.json")
    began = time.perf_counter()
    status, _ = _run(["-m", "autofit.cli", "search", script, "--memory-limit", args.memory_limit, "--budget",
                      args.budget, "--storage", f"sqlite:///{tmp}/autofit.db", "--study", name, "--out", best,
                      *args.search_args.split()], env, os.path.join(tmp, f"{name}.search.log"))
    searched_s = time.perf_counter() - began
    if status != 0 or not os.path.exists(best):
        return {"script": script, "error": f"search: {_tail(os.path.join(tmp, f'{name}.search.log'))}"}
    document = json.load(open(best))
    row = {"script": script, "config": Config.from_dict(document["config"]).label(), "searched_s": searched_s,
           "probe_peak": document["measured"].get("peak_bytes"), "limit": document["memory"]["limit_bytes"],
           "usable": document["memory"]["usable_bytes"], "probe_rate": document["measured"].get("tokens_per_s")}
    began = time.perf_counter()
    log = os.path.join(tmp, f"{name}.run.log")
    status, rss = _run([script], {**env, "AUTOFIT_CONFIG": best, "AUTOFIT_MEMORY_LIMIT": "json",
                                  "AUTOFIT_RUN_REPORT": report}, log)
    row.update(run_s=time.perf_counter() - began, run_rss=rss, finished=status == 0 and os.path.exists(report))
    if not row["finished"]:
        row["error"] = f"run: {_tail(log)}"
        return row
    summary = json.load(open(report))
    row.update(steps=summary["optimizer_steps"], ooms=len(summary["lowerings"]),
               guard=summary["guard_split_batches"], oom_split=summary["oom_split_batches"],
               tokens_per_s=summary["tokens_per_s"])
    return row


def write_table(args: argparse.Namespace, rows: list[dict], elapsed: float) -> str:
    extra = f" --search-args \"{args.search_args}\"" if args.search_args else ""
    command = (f"python -m benchmarks.token_epochs --memory-limit {args.memory_limit} --budget {args.budget}"
               f" --scripts {args.scripts}{extra}")
    lines = [f"`{command}` ({elapsed / 60:.1f} min in all, {os.cpu_count()} cores)", "",
             "| script | exported config | probe peak | epoch's largest RSS | limit (usable) | optimizer steps "
             "| OOMs caught | split by guard / OOM | real tokens/s | probe ÷ epoch | epoch finished |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        if "config" not in row:
            lines.append(f"| `{row['script']}` | {row['error']} | | | | | | | | | no |")
            continue
        limit = f"{format_size(row['limit'])} ({format_size(row['usable'])})"
        peak = format_size(row["probe_peak"]) if row.get("probe_peak") else "—"
        if not row["finished"]:
            lines.append(f"| `{row['script']}` | {row['config']} | {peak} | {format_size(row['run_rss'])} | {limit} "
                         f"| | | | | | no: {row['error']} |")
            continue
        ratio = f"{row['probe_rate'] / row['tokens_per_s']:.2f}" if row.get("probe_rate") and row["tokens_per_s"] else "—"
        lines.append(f"| `{row['script']}` | {row['config']} | {peak} | {format_size(row['run_rss'])} | {limit} | "
                     f"{row['steps']} | {row['ooms']} | {row['guard']} / {row['oom_split']} | "
                     f"{row['tokens_per_s'] or 0:,.0f} | {ratio} | yes |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--budget", default="2m", help="each script's search budget")
    parser.add_argument("--scripts", default=",".join(SCRIPTS))
    parser.add_argument("--search-args", default="", help="more arguments of each search (e.g. \"--precision bf16\")")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "token-epochs-cpu.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": pythonpath(), "AUTOFIT_DEVICE": os.environ.get("AUTOFIT_DEVICE", "cpu")}
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_script(script, args, env, tmp) for script in args.scripts.split(",")]
    table = "# A searched token cap over a whole epoch, under the searched limit\n\n" + write_table(
        args, rows, time.perf_counter() - started)
    with open(args.out, "w") as handle:
        handle.write(table)
    print(table)
    if any(not row.get("finished") or row.get("ooms") for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
