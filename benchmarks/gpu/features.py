"""Every feature beyond nanoGPT measured on one GPU in one command: the dated table of docs/benchmarks.md.

    python -m benchmarks.gpu.features [--parts tokens,memory,estimator,offload,hf] [--out out/gpu]
    benchmarks/gpu/run_checklist.sh features          (the same, as the GPU checklist's step)

Each part runs autofit as a user would (`autofit search`, then the exported file's normal run, or
`autofit estimate` then a probe of its answer), each command under its own time limit, its log in
--out, and gives one row: feature, GPU, figure, date, command. Together about 10 minutes on an H100:

- tokens: issue 53's variable-length LM (tests/corpus/varlen_lm.py) searched by tokens for 3 minutes under a 2 GiB
  cap; the pick's whole epoch against the plain loop's best fixed batch (16, 32 or 64 samples, each a whole
  epoch) in bf16 and in the pick's precision; the pick's probe over its epoch (goal: within 10%); the best bf16
  and tf32 configs the search measured (goal: the pick is at least the faster);
- memory: GPT-2 medium (24 layers, width 1024, context 1024) under a 16 GiB cap, bf16, where memory binds:
  does checkpointing (and which policy) pay against the best plain config measured; the pick's probe
  against its normal run;
- estimator: `autofit estimate --memory` for GPT-2 small on the GPU's memory, then a probe of the config it
  says fits: predicted against measured peak (and never a predicted fit that runs out of memory);
- offload: GPT-2 small probed at one micro-batch ($OFFLOAD_BATCH, 32), bf16, without and with activation
  offload (`--offload-activations`: the blocks' saved tensors in pinned host memory): its peak and its speed;
- hf: the Hugging Face Trainer adapter on GPT-2 small (benchmarks/gpu/hf_gpt2.py): searched, then its
  export's normal run against the probe.

Writes --out/features.md (the table, to paste into docs/benchmarks.md "Every feature on a GPU") and
--out/features.json. Budgets and caps: $BUDGET_TOKENS (3m), $BUDGET_MEMORY (2m), $BUDGET_HF (90s),
$LIMIT_TOKENS (2GiB), $LIMIT_MEMORY (16GiB).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
MEDIUM = {"GPT124M_LAYERS": "24", "GPT124M_WIDTH": "1024", "GPT124M_SAMPLES": "1024"}


@dataclass
class Row:
    feature: str
    figure: str
    command: str


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _run(args: list[str], log: str, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """One command as a user types it, its output kept in `log`; (exit status, output). A command past its
    limit is killed and answers 124, as `timeout` does."""
    full_env = {**os.environ, "PYTHONPATH": REPO, "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.perf_counter()
    try:
        done = subprocess.run(args, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
        status, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        status = 124
        output = (stopped.stdout or b"").decode(errors="replace") + (stopped.stderr or b"").decode(errors="replace")
    with open(log, "w") as handle:
        handle.write(f"$ {' '.join(args)}\n# exit {status} after {time.perf_counter() - started:.0f} s\n{output}")
    return status, output


def _shown(args: list[str], env: dict[str, str] | None = None) -> str:
    """The command as the table prints it: its environment first, the interpreter as `python`."""
    words = ["python" if a == PY else a for a in args]
    return " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *words])


def _normal_run(script: str, best: str, out: str, name: str, env: dict[str, str] | None = None) -> dict | None:
    """The exported file's normal run (`python SCRIPT` reading it), as a user runs it: what its Run measured."""
    report = os.path.join(out, f"{name}-run.json")
    status, _ = _run([PY, script], os.path.join(out, f"{name}-run.log"), 600,
                     {**(env or {}), "AUTOFIT_CONFIG": best, "AUTOFIT_RUN_REPORT": report})
    if status != 0 or not os.path.exists(report):
        return None
    with open(report) as handle:
        return json.load(handle)


def _fidelity(best: dict, run: dict | None) -> str:
    """'probe ÷ normal run 0.99 (136.2 vs 137.6 samples/s)', from the file's figure and the run's."""
    probe = best["measured"].get("samples_per_s")
    if not run or not run.get("samples_per_s") or not probe:
        return "normal run: no figure (see its log)"
    return f"probe ÷ normal run {probe / run['samples_per_s']:.2f} ({probe:,.1f} vs {run['samples_per_s']:,.1f} samples/s)"


def _pick(best: dict) -> str:
    """'bf16 b=8 ckpt=12 acc=4: 41.2 samples/s, MFU 38%, peak 13.9 of 14.4 GiB usable'."""
    from autofit import Config

    measured, memory = best["measured"], best["memory"]
    text = f"{Config.from_dict(best['config']).label()}: {measured.get('samples_per_s') or 0:,.1f} samples/s"
    if measured.get("mfu"):
        text += f", MFU {measured['mfu']:.0%}"
    if measured.get("peak_bytes") and memory.get("usable_bytes"):
        text += f", peak {measured['peak_bytes'] / 2**30:.1f} of {memory['usable_bytes'] / 2**30:.1f} GiB usable"
    return text


def _search(script: str, name: str, out: str, budget: str, limit: str | None, env: dict[str, str],
            extra: tuple[str, ...] = ()) -> tuple[list[str], dict | None]:
    best = os.path.join(out, f"{name}.best.json")
    args = [PY, "-m", "autofit.cli", "search", script, "--gpu", "0", "--budget", budget, "--fresh",
            "--storage", f"sqlite:///{out}/features.db", "--study", name, "--out", best,
            *(["--memory-limit", limit] if limit else []), *extra]
    status, _ = _run(args, os.path.join(out, f"{name}-search.log"), 600, env)
    if status != 0 or not os.path.exists(best):
        return args, None
    with open(best) as handle:
        return args, json.load(handle)


VARLEN = "tests/corpus/varlen_lm.py"
#: The plain loop's fixed batches (issue 53's ran 32): each trained over a whole epoch.
FIXED_BATCHES = (16, 32, 64)


def _fixed_epoch(best: dict, precision: str, batch: int, out: str) -> float | None:
    """The plain loop (varlen_lm.py with $VARLEN_FIXED: `batch` shuffled samples padded to their longest) over a
    whole epoch at `precision`, with no memory cap, as its user runs it: its real tokens/s (None: it failed)."""
    from autofit import Config

    name = f"tokens-fixed-{precision}-{batch}"
    path = os.path.join(out, f"{name}.json")
    document = json.loads(json.dumps(best))
    document["config"] = Config(batch_size=batch, precision=precision).to_dict()
    document["measured"].pop("token_envelope", None)
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)
    run = _normal_run(VARLEN, path, out, name, {"VARLEN_FIXED": "1"})
    return run.get("tokens_per_s") if run else None


def _best_probed(best: dict, precision: str) -> str:
    """The fastest config of `precision` the search measured (the winner or a runner-up), or 'none measured'."""
    from autofit import Config

    entries = [(best["config"], best["measured"].get("tokens_per_s"))]
    entries += [(r["config"], r.get("tokens_per_s")) for r in best.get("runner_ups") or []]
    found = [(rate, Config.from_dict(c).label()) for c, rate in entries if c.get("precision") == precision and rate]
    return f"{max(found)[1]} {max(found)[0]:,.0f}" if found else "none measured"


def part_tokens(out: str) -> list[Row]:
    """Issue 53's held-out LM (tests/corpus/varlen_lm.py) searched by tokens for 3 minutes under a 2 GiB cap: the
    pick's whole epoch against the plain loop's best fixed batch in bf16 and in the pick's precision, its probe
    over its epoch, and the best bf16 and tf32 configs the search measured (the pick should be the faster)."""
    args, best = _search(VARLEN, "tokens", out, _env("BUDGET_TOKENS", "3m"), _env("LIMIT_TOKENS", "2GiB"), {})
    if best is None:
        return [Row("batches by tokens, variable lengths (whole epoch)", "no figure: the search failed "
                    "(tokens-search.log)", _shown(args))]
    from autofit import Config

    pick = Config.from_dict(best["config"])
    run = _normal_run(VARLEN, os.path.join(out, "tokens.best.json"), out, "tokens")
    epoch = run.get("tokens_per_s") if run else None
    probe = best["measured"].get("tokens_per_s")
    plain = {}
    for precision in dict.fromkeys(("bf16", pick.precision)):
        rates = {b: rate for b in FIXED_BATCHES if (rate := _fixed_epoch(best, precision, b, out))}
        plain[precision] = max(((rate, b) for b, rate in rates.items()), default=None)
    if not epoch:
        return [Row("batches by tokens, variable lengths (whole epoch)",
                    f"{pick.label()}: its normal run gave no figure (tokens-run.log)", _shown(args))]
    parts = [f"{pick.label()}: its whole epoch {epoch:,.0f} real tokens/s"]
    for precision, found in plain.items():
        parts.append(f"{epoch / found[0]:.2f}x the plain loop's best fixed batch in {precision} (b={found[1]}, "
                     f"{found[0]:,.0f})" if found else f"no plain {precision} epoch ran")
    if probe:
        parts.append(f"probe ÷ epoch {probe / epoch:.2f}")
    parts.append(f"best probed bf16 {_best_probed(best, 'bf16')}, tf32 {_best_probed(best, 'tf32')}")
    return [Row("batches by tokens, variable lengths (whole epoch)", "; ".join(parts), _shown(args))]


def part_memory(out: str) -> list[Row]:
    script = "benchmarks/gpu/gpt124m.py"
    args, best = _search(script, "medium", out, _env("BUDGET_MEMORY", "2m"), _env("LIMIT_MEMORY", "16GiB"), MEDIUM,
                         ("--precision", "bf16"))
    if best is None:
        return [Row("checkpointing where memory binds (GPT-2 medium)", "no figure: the search failed (medium-search.log)",
                    _shown(args, MEDIUM))]
    plain = _best_plain(out, "medium")
    versus = (f"; the best plain config measured: {plain[0]} {plain[1]:,.1f} samples/s "
              f"({best['measured']['samples_per_s'] / plain[1]:.2f}x)" if plain else "; no plain config fitted")
    run = _normal_run(script, os.path.join(out, "medium.best.json"), out, "medium", MEDIUM)
    return [Row("checkpointing where memory binds (GPT-2 medium)", _pick(best) + versus, _shown(args, MEDIUM)),
            Row("probe against its normal run (GPT-2 medium)", _fidelity(best, run),
                f"AUTOFIT_CONFIG={out}/medium.best.json python {script}")]


def _best_plain(out: str, study: str) -> tuple[str, float] | None:
    """The fastest feasible probe without checkpointing in the study: what checkpointing must beat."""
    from autofit import load_study

    frame = load_study(study, f"sqlite:///{out}/features.db").trials_frame()
    plain = frame[(frame["checkpoint_segments"] == 0) & frame["feasible"].fillna(False).astype(bool)]
    if plain.empty:
        return None
    top = plain.sort_values("samples_per_s", ascending=False).iloc[0]
    return str(top["label"]), float(top["samples_per_s"])


def part_estimator(out: str) -> list[Row]:
    import torch

    script = "benchmarks/gpu/gpt124m.py"
    total = torch.cuda.get_device_properties(0).total_memory
    size = f"{total // 2**30}GiB"
    args = [PY, "-m", "autofit.cli", "estimate", script, "--memory", size, "--precision", "bf16", "--json"]
    status, output = _run(args, os.path.join(out, "estimate.log"), 300)
    try:
        answer = json.loads(output[output.index("{"):output.rindex("}") + 1])
        fit = answer["fits"][0]
    except (ValueError, KeyError, IndexError):
        return [Row("memory estimate against the measured peak", f"no estimate: exit {status} (estimate.log)",
                    _shown(args))]
    if not fit.get("config"):
        return [Row("memory estimate against the measured peak", f"the estimate found no fit in {size}", _shown(args))]
    config = fit["config"]
    probe = [PY, "-m", "autofit.cli", "probe", script, "--gpu", "0", "--precision", config["precision"],
             "--batch-size", str(config["batch_size"]),
             "--checkpoint-segments", str(config.get("checkpoint_segments", 0)), "--json"]
    result = _probed(probe, os.path.join(out, "estimate-probe.log"))
    predicted = fit["predicted_peak_bytes"]
    if result.get("status") != "ok" or not result.get("peak_bytes"):
        figure = f"predicted fit {config} ({predicted / 2**30:.1f} GiB) probed: {result.get('status')}"
    else:
        measured = result["peak_bytes"]
        figure = (f"b={config['batch_size']} bf16 in {size}: predicted {predicted / 2**30:.1f} GiB, measured "
                  f"{measured / 2**30:.1f} GiB ({predicted / measured - 1:+.0%}); usable "
                  f"{fit['usable_bytes'] / 2**30:.1f} GiB")
    return [Row("memory estimate against the measured peak (GPT-2 small)", figure,
                _shown(args) + " ; then " + _shown(probe))]


def _probed(args: list[str], log: str) -> dict:
    """The record of an `autofit probe ... --json` (its status "no record" where it printed none)."""
    _, output = _run(args, log, 300)
    try:
        return json.loads(output[output.index("{"):output.rindex("}") + 1])["result"]
    except (ValueError, KeyError):
        return {"status": "no record"}


def part_offload(out: str) -> list[Row]:
    """Activation offload (`offload_activations`) on GPT-2 small at one micro-batch, bf16: the probe's peak and
    speed without it and with it (what it saves in memory, what its host transfers cost)."""
    script, batch = "benchmarks/gpu/gpt124m.py", _env("OFFLOAD_BATCH", "32")
    runs = {}
    for offload in (False, True):
        args = [PY, "-m", "autofit.cli", "probe", script, "--gpu", "0", "--precision", "bf16", "--batch-size", batch,
                *(["--offload-activations"] if offload else []), "--json"]
        runs[offload] = (args, _probed(args, os.path.join(out, f"offload-{'on' if offload else 'off'}.log")))
    (plain_args, plain), (args, offloaded) = runs[False], runs[True]
    command = _shown(plain_args) + " ; then with --offload-activations"
    if not all(r.get("status") == "ok" and r.get("peak_bytes") and r.get("samples_per_s") for r in (plain, offloaded)):
        return [Row("activation offload (GPT-2 small)", f"no figure: probes {plain.get('status')}, "
                    f"{offloaded.get('status')} (offload-off.log, offload-on.log)", command)]
    figure = (f"bf16 b={batch}: peak {plain['peak_bytes'] / 2**30:.1f} -> {offloaded['peak_bytes'] / 2**30:.1f} GiB "
              f"({offloaded['peak_bytes'] / plain['peak_bytes'] - 1:+.0%}), {plain['samples_per_s']:,.1f} -> "
              f"{offloaded['samples_per_s']:,.1f} samples/s ({offloaded['samples_per_s'] / plain['samples_per_s'] - 1:+.0%})")
    return [Row("activation offload (GPT-2 small)", figure, command)]


def part_hf(out: str) -> list[Row]:
    script = "benchmarks/gpu/hf_gpt2.py"
    args, best = _search(script, "hf", out, _env("BUDGET_HF", "90s"), None, {}, ("--precision", "bf16"))
    if best is None:
        return [Row("HF Trainer adapter (GPT-2 small)", "no figure: the search failed (hf-search.log)", _shown(args))]
    run = _normal_run(script, os.path.join(out, "hf.best.json"), out, "hf")
    return [Row("HF Trainer adapter (GPT-2 small)", _pick(best) + "; " + _fidelity(best, run), _shown(args))]


PARTS: dict[str, Callable[[str], list[Row]]] = {
    "tokens": part_tokens, "memory": part_memory, "estimator": part_estimator, "offload": part_offload, "hf": part_hf,
}


def table(rows: list[Row], gpu: str, date: str) -> str:
    lines = ["| feature | GPU | figure | date | command |", "|---|---|---|---|---|"]
    lines += [f"| {r.feature} | {gpu} | {r.figure} | {date} | `{r.command}` |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    parser.add_argument("--out", default=os.environ.get("OUT", "out/gpu"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks.gpu.features needs a CUDA device: torch.cuda.is_available() is False")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    gpu, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    rows: list[Row] = []
    for name in args.parts.split(","):
        started = time.perf_counter()
        print(f"=== {name} ({datetime.datetime.now():%H:%M:%S})", flush=True)
        part_rows = PARTS[name](out)
        for row in part_rows:
            print(f"  {row.feature}: {row.figure}  [{time.perf_counter() - started:.0f} s]", flush=True)
        rows += part_rows
    text = table(rows, gpu, date)
    with open(os.path.join(out, "features.md"), "w") as handle:
        handle.write(text)
    with open(os.path.join(out, "features.json"), "w") as handle:
        json.dump({"gpu": gpu, "date": date, "torch": torch.__version__, "rows": [asdict(r) for r in rows]}, handle,
                  indent=2)
    print(text)


if __name__ == "__main__":
    main()
