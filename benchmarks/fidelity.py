"""Fidelity: does a probe measure the program the user will run? Probe vs normal run, interleaved.

    python -m benchmarks.fidelity [--rounds 3] [--device cpu] [NAME ...]

For each script and config, round after round: one probe through autofit's worker (as a search
runs it), then the same script run normally in a fresh process (`python script.py`, the decorated
function reading the config from $AUTOFIT_CONFIG and writing what it measured to
$AUTOFIT_RUN_REPORT). Both figures are steady-state samples/s after the same two warm-up steps: the
probe over its measured steps, the normal run over the rest of its training. Interleaving makes a
drift of the machine hit both sides alike. The ratio probe ÷ normal (median over rounds) must stay
within 3%. Beside it, the normal run's own spread over the rounds (the same program run again): on a
noisy machine a gap smaller than that spread is not evidence of a bias. The ddp and fsdp2 cases run
each probe as a torchrun job of 2 ranks and the normal run under `torchrun --nproc-per-node 2`. Writes a markdown table to stdout and to benchmarks/fidelity.md (cpu) or
benchmarks/fidelity-<device>.md.
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

from autofit.config import Config
from autofit.export import BestConfig, write_best
from autofit.probing import make_runner
from benchmarks import pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    configs: tuple[Config, ...]
    note: str
    nproc: int = 1  # >1: probes are torchrun jobs and the normal run is `torchrun --nproc-per-node N`
    env: tuple[tuple[str, str], ...] = ()


def _cases() -> tuple[Case, ...]:
    """Several configs per script: batch sizes, checkpointing, and bf16 where the CPU runs it natively
    (emulated bf16 is ~15x slower and no search would pick it)."""
    from autofit.devices import cpu_has_native_bf16

    bf16 = cpu_has_native_bf16()
    return (
        Case("gpt", "studies/gpt.py",
             (Config(batch_size=96), Config(batch_size=32), Config(batch_size=64, checkpoint_segments=4)) + ((Config(batch_size=64, precision="bf16"),) if bf16 else ()),
             "bundled: character GPT (nanoGPT-style loop, DataLoader)"),
        Case("cnn", "studies/cnn.py", (Config(batch_size=64), Config(batch_size=24)) + ((Config(batch_size=24, precision="bf16"),) if bf16 else ()),
             "bundled: conv classifier"),
        Case("mlp", "studies/mlp.py", (Config(batch_size=1024), Config(batch_size=256)) + ((Config(batch_size=256, precision="bf16"),) if bf16 else ()),
             "bundled: wide MLP"),
        Case("word_lm", "benchmarks/fidelity_scripts/word_lm.py", (Config(batch_size=20), Config(batch_size=64)),
             "not written for autofit: pytorch/examples-style LSTM LM"),
        Case("host_bound", "benchmarks/fidelity_scripts/host_bound.py", (Config(batch_size=8), Config(batch_size=32)),
             "a host-bound deep narrow MLP: its step mostly Python and launches, so per-saved-tensor hooks show"),
        Case("hf_trainer", "tests/scripts/hf_trainer.py",
             (Config(batch_size=8, accumulation_steps=2), Config(batch_size=4, accumulation_steps=4)),
             "a Hugging Face Trainer (GPT-2 from its config) through autofit.integrations.hf"),
        Case("lightning", "tests/scripts/lightning_module.py",
             (Config(batch_size=16, accumulation_steps=4), Config(batch_size=32, accumulation_steps=2)),
             "a Lightning Trainer and LightningModule through autofit.integrations.lightning"),
        Case("lightning_tied", "tests/corpus/lightning_tied.py", (Config(batch_size=16, precision="bf16"),)
             if bf16 else (Config(batch_size=16),), "corpus: a Lightning Trainer, tied weights"),
        Case("lightning_defaults", "tests/scripts/lightning_defaults.py",
             (Config(batch_size=16, precision="bf16"),) if bf16 else (Config(batch_size=16),),
             "the tied LM under a Trainer at Lightning's defaults: progress bar, model summary, sanity check"),
        Case("hf_trainer_clm", "tests/corpus/hf_trainer_clm.py", (Config(batch_size=16, precision="bf16"),)
             if bf16 else (Config(batch_size=16),), "corpus: Hugging Face's run_clm with the Trainer"),
        Case("accelerate_clm", "tests/corpus/accelerate_clm_no_trainer.py", (Config(batch_size=16, precision="bf16"),)
             if bf16 else (Config(batch_size=16),), "corpus: Hugging Face's run_clm_no_trainer with Accelerate"),
        Case("ddp", "tests/scripts/ddp_train.py", (Config(batch_size=16), Config(batch_size=4, accumulation_steps=4)),
             "2 ranks (gloo) under torchrun, DDP; config per rank", nproc=2, env=(("EPOCHS", "40"),)),
        Case("fsdp2", "tests/scripts/ddp_train.py", (Config(batch_size=16),),
             "2 ranks (gloo) under torchrun, FSDP2 per layer; config per rank", nproc=2,
             env=(("EPOCHS", "40"), ("SHARD", "1"))),
    )


#: On a GPU: GPT-2 small (benchmarks/gpu/gpt124m.py), whose steps are long enough to time.
CUDA_CASES = (
    Case("gpt124m", "benchmarks/gpu/gpt124m.py", (Config(batch_size=48, precision="bf16"), Config(batch_size=16, precision="bf16")),
         "GPT-2 small (124M), HF transformers model built from its config"),
)


def _config_file(path: str, config: Config, device: str, world_size: int) -> None:
    """A best-config file holding `config`, as `autofit search` would write it."""
    write_best(path, BestConfig(config=config, device={"type": device}, world_size=world_size))


def normal_run(case: Case, config: Config, device: str, tmp: str) -> dict:
    """Run the script as a user would (under torchrun for several ranks), with `config`; what its
    Run measured (the main rank's report: global samples/s)."""
    config_path = os.path.join(tmp, "best.json")
    report_path = os.path.join(tmp, "run.json")
    _config_file(config_path, config, device, case.nproc)
    env = {**os.environ, **dict(case.env), "AUTOFIT_CONFIG": config_path, "AUTOFIT_RUN_REPORT": report_path,
           "AUTOFIT_DEVICE": device, "PYTHONPATH": pythonpath(), "WEIGHTS_OUT": os.path.join(tmp, "weights.pt")}
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={case.nproc}"]
                if case.nproc > 1 else [sys.executable])
    started = time.perf_counter()
    subprocess.run([*launcher, case.script], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(report_path) as handle:
        report = json.load(handle)
    report["wall_s"] = time.perf_counter() - started
    return report


def measure(case: Case, rounds: int, device: str) -> list[dict]:
    saved = dict(os.environ)
    os.environ.update(dict(case.env))  # the probe's worker inherits it, as a search started with it would
    try:
        return _measure(case, rounds, device)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _measure(case: Case, rounds: int, device: str) -> list[dict]:
    rows = {config: {"probe": [], "normal": [], "probe_steps": [], "normal_steps": []} for config in case.configs}
    script = os.path.join(REPO, case.script)
    worker = make_runner(script, device=device, nproc=case.nproc)
    with tempfile.TemporaryDirectory() as tmp, worker:
        worker.start()
        for _ in range(rounds):
            for config in case.configs:
                result = worker.probe(config, warmup=2, steps=5, timeout=600)
                if result.ok:
                    rows[config]["probe"].append(result.samples_per_s)
                    rows[config]["probe_steps"].append(result.measured_steps)
                report = normal_run(case, config, device, tmp)
                rows[config]["normal"].append(report["samples_per_s"])
                rows[config]["normal_steps"].append(report["measured_steps"])
                print(f"  {case.name:<8} {config.label():<18} probe {result.samples_per_s or 0:9.1f}  "
                      f"normal {report['samples_per_s']:9.1f} samples/s", file=sys.stderr, flush=True)
    out = []
    for config, row in rows.items():
        ratios = [p / n for p, n in zip(row["probe"], row["normal"])]
        out.append({"case": case.name, "note": case.note, "config": config.label(),
                    "probe": statistics.median(row["probe"]) if row["probe"] else None,
                    "normal": statistics.median(row["normal"]),
                    "ratio": statistics.median(ratios) if ratios else None,
                    "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                    "normal_spread": _spread(row["normal"]),
                    "probe_steps": statistics.median(row["probe_steps"]) if row["probe_steps"] else 0,
                    "normal_steps": statistics.median(row["normal_steps"])})
    return out


def _spread(values: list[float]) -> float:
    """(max - min) / median: how far one program's figure moves between runs."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def table(rows: list[dict], rounds: int, device: str, seconds: float) -> str:
    lines = [
        f"Probe vs normal run, {rounds} interleaved rounds, device {device} "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), {seconds / 60:.1f} min.",
        "",
        "| script | config | probe samples/s | normal run samples/s | probe ÷ normal (median) | min–max | normal run's own spread | steps measured (probe / normal) |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "—"
        spread = f"{r['ratio_min']:.3f}–{r['ratio_max']:.3f}" if r["ratio"] else "—"
        lines.append(f"| {r['case']} | {r['config']} | {r['probe'] or 0:,.1f} | {r['normal']:,.1f} | {ratio} | "
                     f"{spread} | ±{r['normal_spread'] / 2:.1%} | {r['probe_steps']:.0f} / {r['normal_steps']:.0f} |")
    within = [r for r in rows if r["ratio"] and abs(r["ratio"] - 1) <= 0.03]
    in_noise = [r for r in rows if r["ratio"] and abs(r["ratio"] - 1) <= max(0.03, r["normal_spread"] / 2)]
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    lines += ["", f"- [{'x' if len(within) == len(rows) else ' '}] every probe within 3% of its normal run "
                  f"(median ratio): {len(within)} of {len(rows)}; within 3% or the normal run's own spread: "
                  f"{len(in_noise)} of {len(rows)}",
              f"- median of all ratios: {statistics.median(ratios):.3f}" if ratios else "- no ratios"]
    notes = sorted({f"{r['case']}: {r['note']}" for r in rows})
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for case in _cases() if args.device == "cpu" else CUDA_CASES:
        if not args.names or case.name in args.names:
            rows += measure(case, args.rounds, args.device)
    text = table(rows, args.rounds, args.device, time.perf_counter() - started)
    print(text)
    out = args.out or os.path.join(HERE, "fidelity.md" if args.device == "cpu" else f"fidelity-{args.device}.md")
    with open(out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
