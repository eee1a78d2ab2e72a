"""The corpus (tests/corpus/): scripts in the styles of widely used public examples, searched and run.

    python -m benchmarks.corpus [NAME ...] [--trials 8] [--rounds 3] [--out benchmarks/corpus.md]
    python -m benchmarks.corpus --probe-process persistent --out benchmarks/corpus-persistent.md
    python -m benchmarks.corpus --device cuda --trials 6 --rounds 1 --out $OUT/corpus-cuda.md

`--probe-process persistent` runs every probe of a search in one process, as CUDA must (a CUDA context
cannot be forked). On CUDA the whole card is the limit, the normal run's peak is the GPU memory NVML
reports for its process, and scripts of several ranks are left out on one GPU.

For each script: a real search under the script's CPU memory limit, bounded by its probe count
(`--trials`), into a study of its own; then, round after round, one probe of the winner (as a search
runs it, in autofit's worker) and the script run normally in a fresh process (`python script.py`, or
`torchrun --nproc-per-node 2` for the DDP script) with the exported file, reporting what it measured
through $AUTOFIT_RUN_REPORT, interleaved so that a drift of the machine hits both alike. One table:

- the search's answer: the winner, its samples/s, probes (of them out of memory), wall seconds;
- peak memory of the winner: the memory estimator's raw figure (MemoryPrediction.raw_peak) and its
  calibrated range from the study's other probes (as the planner predicts a config before probing
  it), against the peak the search measured and the normal run's peak, counted as a probe counts it
  (resident less file-backed pages, or the data segment; one process only);
- throughput: the probe's and the normal run's samples/s (medians over the rounds) and their ratio.

Writes the markdown table to stdout and to `--out`. Throughput figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from autofit.export import read_best
from autofit.probing import make_runner
from benchmarks import pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CORPUS = os.path.join(REPO, "tests", "corpus")
MIB = 2**20


@dataclass(frozen=True)
class Script:
    name: str
    limit: str
    nproc: int = 1

    @property
    def path(self) -> str:
        return os.path.join(CORPUS, f"{self.name}.py")


SCRIPTS = (
    Script("word_language_model", "1GiB"),
    Script("mnist_cnn", "1GiB"),
    Script("dcgan", "1GiB"),
    Script("nanogpt_train", "1GiB"),
    Script("hf_trainer_clm", "1536MiB"),
    Script("lightning_tied", "1536MiB"),
    Script("ddp_converted", "1GiB", nproc=2),
    Script("moe", "1GiB"),
    Script("late_device", "1GiB"),
)


def _env(tmp: str, device: str = "cpu", **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": pythonpath(), "AUTOFIT_DEVICE": device, "HF_OUT": os.path.join(tmp, "hf_out"),
            "PL_OUT": os.path.join(tmp, "pl_out"), **extra}


def search(script: Script, trials: int, tmp: str, device: str = "cpu", probe_process: str | None = None) -> dict:
    """A real search of `script` in `tmp`; the exported document, the stored study and the wall time."""
    from autofit.findings import load_study

    storage = f"sqlite:///{tmp}/corpus.db"
    best = os.path.join(tmp, "best.json")
    ranks = ["--nproc-per-node", str(script.nproc)] if script.nproc > 1 else []
    where = ["--gpu", "0"] if device == "cuda" else ["--device", "cpu", "--memory-limit", script.limit]
    process = ["--probe-process", probe_process] if probe_process and script.nproc == 1 else []
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "search", script.path, *where, *process,
                           "--trials", str(trials), "--storage", storage,
                           "--out", best, *ranks], cwd=tmp, env=_env(tmp, device), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"search of {script.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"document": read_best(best), "path": best, "study": load_study(storage=storage), "wall_s": wall}


def predicted_peak(study, config, device: str = "cpu") -> tuple[float | None, tuple[float, float] | None]:
    """The estimator's raw peak of `config` (MemoryPrediction.raw_peak) and the planner's calibrated range
    from the study's probes of other configs; None where the study has no estimates."""
    from autofit.findings import observations

    if study.estimates is None:
        return None, None
    prediction = study.estimates.prediction(device)
    if prediction is None:
        return None, None
    raw = prediction.raw_peak(config)
    others = [o for o in observations(study.trials()) if o.config != config]
    peak = prediction.calibrate(others).peak(config)
    return raw, (None if peak is None else (peak.low, peak.high))


def _status_bytes(pid: int) -> dict[str, int]:
    """/proc/PID/status's memory fields in bytes (empty once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in lines if line.endswith(" kB"))
    return {key: int(value.split()[0]) * 1024 for key, value in fields}


def peak_while_running(process: subprocess.Popen, every_s: float = 0.01) -> int:
    """The process's peak as a CPU probe counts it: the larger of its peak resident set less file-backed
    and shared pages, and its data segment (what RLIMIT_DATA caps), sampled until it exits."""
    peak = 0
    while process.poll() is None:
        status = _status_bytes(process.pid)
        if status:
            resident = status.get("VmHWM", 0) - status.get("RssFile", 0) - status.get("RssShmem", 0)
            peak = max(peak, resident, status.get("VmData", 0))
        time.sleep(every_s)
    return peak


def gpu_peak_while_running(process: subprocess.Popen, every_s: float = 0.01) -> int:
    """The largest GPU memory NVML reports for the process (context, allocator pools), until it exits."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    peak = 0
    while process.poll() is None:
        for app in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if app.pid == process.pid and app.usedGpuMemory:
                peak = max(peak, app.usedGpuMemory)
        time.sleep(every_s)
    return peak


def normal_run(script: Script, best: str, tmp: str, device: str = "cpu") -> dict:
    """`python script.py` (or torchrun) with the exported file; its report, and its peak memory
    counted as a probe counts it (one process only: under torchrun the ranks are the launcher's children)."""
    report = os.path.join(tmp, "run.json")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={script.nproc}"]
                if script.nproc > 1 else [sys.executable])
    env = _env(tmp, device, AUTOFIT_CONFIG=best, AUTOFIT_RUN_REPORT=report)
    errors = os.path.join(tmp, "normal-run.err")
    with open(errors, "w") as stderr:
        process = subprocess.Popen([*launcher, script.path], cwd=tmp, stdout=subprocess.DEVNULL,
                                   stderr=stderr, env=env)
        peak = gpu_peak_while_running(process) if device == "cuda" else peak_while_running(process)
    if process.returncode != 0:
        with open(errors) as handle:
            tail = [line.strip() for line in handle.read().splitlines() if line.strip()][-1:]
        raise RuntimeError(f"the normal run of {script.name} failed ({process.returncode}): {' '.join(tail)}")
    with open(report) as handle:
        measured = json.load(handle)
    measured["peak_bytes"] = peak if script.nproc == 1 else None
    return measured


def measure(script: Script, trials: int, rounds: int, device: str = "cpu", probe_process: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        found = search(script, trials, tmp, device, probe_process)
        document, study = found["document"], found["study"]
        config = read_best(found["path"]).config
        frame = study.trials_frame()
        raw, calibrated = predicted_peak(study, config, device)
        probes, normals, run_peaks = [], [], []
        worker = make_runner(script.path, device=device, nproc=script.nproc, probe_process=probe_process)
        with worker:
            worker.start()
            for _ in range(rounds):
                result = worker.probe(config, warmup=2, steps=5, timeout=600)
                if result.ok:
                    probes.append(result.samples_per_s)
                run = normal_run(script, found["path"], tmp, device)
                normals.append(run["samples_per_s"])
                if run["peak_bytes"]:
                    run_peaks.append(run["peak_bytes"])
                print(f"  {script.name:<20} {config.label():<18} probe {result.samples_per_s or 0:9.1f}  "
                      f"normal {run['samples_per_s'] or 0:9.1f} samples/s", file=sys.stderr, flush=True)
    probe = statistics.median(probes) if probes else None
    normal = statistics.median([n for n in normals if n]) if any(normals) else None
    return {"name": script.name, "config": config.label(), "world": script.nproc,
            "search_samples_per_s": document.measured.samples_per_s,
            "probes": len(frame), "oom": int((frame["status"] == "oom").sum()), "search_s": found["wall_s"],
            "estimate_raw": raw, "estimate_range": calibrated, "measured_peak": document.measured.peak_bytes,
            "run_peak": max(run_peaks) if run_peaks else None, "probe": probe, "normal": normal,
            "ratio": probe / normal if probe and normal else None,
            "estimator": study.estimates.summary() if study.estimates else "not run"}


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:,.0f}"


def _device_words(device: str, probe_process: str | None) -> str:
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)}, every probe of a search in one process"
    how = ", every probe of a search in one process (--probe-process persistent)" if probe_process == "persistent" else ""
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores){how}"


def table(rows: list[dict], trials: int, rounds: int, seconds: float, device: str = "cpu",
          probe_process: str | None = None) -> str:
    lines = [
        f"The corpus searched (`--trials {trials}`) and run, {rounds} interleaved rounds of probe vs normal run; "
        f"{_device_words(device, probe_process)}, {seconds / 60:.1f} min.",
        "",
        "| script | winner | samples/s (search) | probes (OOM) | search s | peak MiB: estimate raw | "
        "predicted range | measured (probe) | normal run | probe samples/s | normal run samples/s | "
        "probe ÷ normal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    failed = [r for r in rows if "failed" in r]
    rows = [r for r in rows if "failed" not in r]
    for r in rows:
        predicted = "—" if r["estimate_range"] is None else \
            f"{r['estimate_range'][0] / MIB:,.0f}–{r['estimate_range'][1] / MIB:,.0f}"
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.3f}"
        ranks = f" ({r['world']} ranks)" if r["world"] > 1 else ""
        lines.append(f"| {r['name']}{ranks} | {r['config']} | {r['search_samples_per_s']:,.1f} | "
                     f"{r['probes']} ({r['oom']}) | {r['search_s']:.0f} | {_mib(r['estimate_raw'])} | {predicted} | "
                     f"{_mib(r['measured_peak'])} | {_mib(r['run_peak'])} | {r['probe'] or 0:,.1f} | "
                     f"{r['normal'] or 0:,.1f} | {ratio} |")
    lines += ["", *[f"- {r['name']}: {r['estimator']}" for r in rows],
              *[f"- {r['name']}: FAILED: {r['failed']}" for r in failed]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scripts to run (default: all)")
    parser.add_argument("--trials", type=int, default=8, help="probes each search may explore")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "corpus.md"))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--probe-process", default=None, choices=["fork", "persistent"],
                        help="how each search's worker runs its probes (default: the device's)")
    args = parser.parse_args()
    unknown = set(args.names) - {s.name for s in SCRIPTS}
    if unknown:
        parser.error(f"no such corpus script: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    chosen = [script for script in SCRIPTS if not args.names or script.name in args.names]
    if args.device == "cuda":
        chosen = [script for script in chosen if script.nproc == 1]  # one GPU: one rank
    rows = []
    for script in chosen:
        try:
            rows.append(measure(script, args.trials, args.rounds, args.device, args.probe_process))
        except Exception as error:  # one script's failure is a row, not the end of the table
            print(f"{script.name}: {error}", file=sys.stderr, flush=True)
            rows.append({"name": script.name, "failed": str(error).splitlines()[0][:300]})
    text = table(rows, args.trials, args.rounds, time.perf_counter() - started, args.device, args.probe_process)
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
