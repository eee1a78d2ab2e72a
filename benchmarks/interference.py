"""Interference, live: a search while another job competes for the CPU, against the same search on a
quiet machine, with and without autofit's rechecks.

    python -m benchmarks.interference [--study studies/gpt.py] [--budget 3m] [--memory-limit 1GiB]

Three searches of the same study, one after another: quiet; with a competing process (a torch
matmul loop on every core) running from --start to --stop seconds into the search; and the same
competition with rechecks turned off (autofit believing every measurement, as it did before). Then
the three exported configs are measured again on the quiet machine, interleaved, through autofit's
worker, so "true throughput" is one measurement method on one machine state. Writes
benchmarks/interference.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import Worker
from autofit.search import SearchSettings, run_search
from autofit.units import format_size, parse_duration, parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
_COMPETITOR = ("import torch\ntorch.set_num_threads(os.cpu_count())\na = torch.randn(1024, 1024)\n"
               "while True:\n    a @ a\n")


class Competitor:
    """Another job on the machine from `start` to `stop` seconds after `begin()`."""

    def __init__(self, start: float, stop: float) -> None:
        self.start, self.stop = start, stop
        self._proc: subprocess.Popen | None = None
        self._timers: list[threading.Timer] = []

    def begin(self) -> None:
        self._timers = [threading.Timer(self.start, self._launch), threading.Timer(self.stop, self.end)]
        for timer in self._timers:
            timer.start()

    def _launch(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", "import os\n" + _COMPETITOR])

    def end(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def search(args, tmp: str, name: str, competitor: Competitor | None, recheck: bool) -> dict:
    settings = SearchSettings(script=args.study, device="cpu", memory_limit=args.memory_limit, budget_s=args.budget,
                              storage=f"sqlite:///{tmp}/{name}.db", out=os.path.join(tmp, f"{name}.json"),
                              recheck=recheck, fresh=True)
    if competitor:
        competitor.begin()
    try:
        result = run_search(settings)
    finally:
        if competitor:
            competitor.end()
    import optuna

    trials = optuna.load_study(study_name=result.study_name, storage=settings.storage).get_trials()
    phases = [t.user_attrs.get("phase") for t in trials]
    return {"name": name, "best": result.best, "probes": result.probes, "rechecks": phases.count("recheck"),
            "notes": result.notes, "search_rate": result.ranked[0].rate if result.ranked else None}


def remeasure(args, configs: list[Config], rounds: int) -> dict[Config, float]:
    rates: dict[Config, list[float]] = {c: [] for c in configs}
    with Worker(args.study, budget=MemoryBudget(limit_bytes=args.memory_limit)) as worker:
        worker.start()
        for _ in range(rounds):
            for config in configs:
                result = worker.probe(config, warmup=2, steps=10, timeout=600)
                if result.ok:
                    rates[config].append(result.samples_per_s)
    return {c: statistics.median(r) if r else 0.0 for c, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="studies/gpt.py")
    parser.add_argument("--budget", type=parse_duration, default=parse_duration("3m"))
    parser.add_argument("--memory-limit", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--start", type=float, default=15.0, help="seconds into the search the competitor starts")
    parser.add_argument("--stop", type=float, default=75.0, help="seconds into the search the competitor stops")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the final re-measure")
    args = parser.parse_args()
    command = "python -m benchmarks.interference " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [search(args, tmp, "quiet", None, recheck=True),
                search(args, tmp, "competing", Competitor(args.start, args.stop), recheck=True),
                search(args, tmp, "competing, no rechecks", Competitor(args.start, args.stop), recheck=False)]
    picks = list(dict.fromkeys(r["best"] for r in runs if r["best"] is not None))
    true = remeasure(args, picks, args.rounds)
    quiet = true.get(runs[0]["best"], 0.0) or 1.0
    lines = [f"`{command}` ({(time.perf_counter() - started) / 60:.1f} min, {os.cpu_count()} cores; "
             f"limit {format_size(args.memory_limit)}; competitor from {args.start:.0f} s to {args.stop:.0f} s "
             f"of each competing search)", "",
             "| search | probes | rechecks | exported | samples/s the search believed | true samples/s (quiet re-measure) | ÷ quiet search's pick | said |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for r in runs:
        best = r["best"]
        noisy = next((n for n in r["notes"] if "too noisy" in n), "")
        lines.append(f"| {r['name']} | {r['probes']} | {r['rechecks']} | {best.label() if best else 'none'} | "
                     f"{r['search_rate'] or 0:,.1f} | {true.get(best, 0.0):,.1f} | {true.get(best, 0.0) / quiet:.3f} | "
                     f"{'too noisy: ' + noisy[:80] + '…' if noisy else ''} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(HERE, "interference.md"), "w") as handle:
        handle.write("# A search while another job competes for the CPU\n\n" + text)


if __name__ == "__main__":
    main()
