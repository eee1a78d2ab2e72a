"""Every feature beyond nanoGPT measured on one GPU in one command: the dated table of docs/benchmarks.md.

    python -m benchmarks.gpu.features [--parts tokens,memory,estimator,offload,allocator,hf] [--out out/gpu]
    benchmarks/gpu/run_checklist.sh features          (the same, as the GPU checklist's step)

Each part runs autofit as a user would (`autofit search`, then the exported file's normal run, or
`autofit estimate` then a probe of its answer), each command under its own time limit, its log in
--out, and gives one row: feature, GPU, figure, date, command. Together about 10 minutes on an H100:

- tokens: benchmarks/tokens.py on the GPU (a variable-length LM under a 2 GiB cap): autofit's search,
  the safe fixed batch found the same way, each trained over a whole epoch (issue "Beyond nanoGPT": the
  token row at least 2x the safe fixed batch);
- memory: GPT-2 medium (24 layers, width 1024, context 1024) under a 16 GiB cap, bf16, where memory binds:
  does checkpointing (and which policy) pay against the best plain config measured; the pick's probe
  against its normal run;
- estimator: `autofit estimate --memory` for GPT-2 small on the GPU's memory, then a probe of the config it
  says fits: predicted against measured peak (and never a predicted fit that runs out of memory);
- offload: GPT-2 small probed at one micro-batch ($OFFLOAD_BATCH, 32), bf16, without and with activation
  offload (`--offload-activations`: the blocks' activations copied to pinned host memory on a side stream),
  then the same over every block checkpointed (the offload then moves the blocks' inputs alone): peak, speed
  and pinned host memory, against the issue's goal (at most 15% slower with at least 40% of the memory
  saved) and against what the host link measured here allows;
- allocator: GPT-2 medium, bf16, under the 16 GiB cap at b=3 and b=4 (its edge on an H200), each probed with
  autofit's default allocator settings (expandable segments) and with them off: peak, speed and the
  allocator's retries in the measured steps;
- hf: the Hugging Face Trainer adapter on GPT-2 small (benchmarks/gpu/hf_gpt2.py): searched, then its
  export's normal run against the probe.

Writes --out/features.md (the table, to paste into docs/benchmarks.md "Every feature on a GPU") and
--out/features.json, their commands' --out paths relative to the repository (where the commands run), or
`<out>/...` for a folder outside it: never this machine's absolute path. Budgets and caps: $BUDGET_TOKENS (3m), $BUDGET_MEMORY (2m), $BUDGET_HF (90s),
$LIMIT_TOKENS (2GiB), $LIMIT_MEMORY (16GiB).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

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


def part_tokens(out: str) -> list[Row]:
    md = os.path.join(out, "tokens-cuda.md")
    args = [PY, "-m", "benchmarks.tokens", "--device", "cuda", "--memory-limit", _env("LIMIT_TOKENS", "2GiB"),
            "--budget", _env("BUDGET_TOKENS", "3m"), "--rounds", "1", "--samples", "4096", "--out", md]
    status, _ = _run(args, os.path.join(out, "tokens.log"), 600)
    rows = _table_rows(md) if status == 0 and os.path.exists(md) else {}
    safe, found = rows.get("(a) fixed, safe"), rows.get("(d) autofit")
    if not (safe and found):
        return [Row("batches by tokens (whole epoch)", f"no figure: exit {status} (tokens.log)", _shown(args))]
    figure = (f"autofit {found[1]} {found[3]} real tokens/s = {found[4]} the safe fixed batch ({safe[1]}, "
              f"{safe[3]}); OOMs {found[5]}, found in {found[2]}")
    return [Row("batches by tokens (whole epoch)", figure, _shown(args))]


def _table_rows(path: str) -> dict[str, list[str]]:
    """A markdown table's rows by their first cell (benchmarks/tokens.py's output), bold marks removed."""
    rows = {}
    with open(path) as handle:
        for line in handle:
            if line.startswith("| ("):
                cells = [re.sub(r"\*\*|\s*\(median.*", "", c).strip() for c in line.strip().strip("|").split("|")]
                rows[cells[0]] = cells
    return rows


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


def _probed(args: list[str], log: str, env: dict[str, str] | None = None) -> dict:
    """The record of an `autofit probe ... --json` (its status "no record" where it printed none)."""
    _, output = _run(args, log, 300, env)
    try:
        return json.loads(output[output.index("{"):output.rindex("}") + 1])["result"]
    except (ValueError, KeyError):
        return {"status": "no record"}


def _host_link() -> tuple[float, float]:
    """The host link's bandwidth each way, device to host and back (bytes/s), as pinned copies of 1 GiB measure
    it here (the best of three): what an activation offload's copies can move at most."""
    import torch

    device, host = torch.empty(2**30, dtype=torch.uint8, device="cuda"), torch.empty(2**30, dtype=torch.uint8,
                                                                                        pin_memory=True)
    rates = []
    for target, source in ((host, device), (device, host)):
        best = 0.0
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            end.synchronize()
            best = max(best, 2**30 / (start.elapsed_time(end) / 1000))
        rates.append(best)
    del device, host
    torch.cuda.empty_cache()
    torch._C._host_emptyCache()  # nothing of this stays pinned while the probes run
    return rates[0], rates[1]


#: The issue's goal for activation offload (issue 51): at most 15% slower, with at least 40% of the memory saved.
OFFLOAD_GOAL = (0.15, 0.40)


def _offload_figure(batch: str, plain: dict, offloaded: dict, link: tuple[float, float]) -> str:
    """'bf16 b=32: peak 47.9 -> 24.9 GiB (-48%), 152.9 -> 131.0 samples/s (-14%), pinned host 32.0 GiB; goal met;
    the host link moves 23.0 GiB each way at 51.2/52.0 GB/s: at most 34.2 samples/s'."""
    saved = 1 - offloaded["peak_bytes"] / plain["peak_bytes"]
    slower = 1 - offloaded["samples_per_s"] / plain["samples_per_s"]
    pinned = (offloaded.get("allocator") or {}).get("host_pinned_peak_bytes")
    moved = max(0, plain["peak_bytes"] - offloaded["peak_bytes"])  # at least what left the device, each way
    ceiling = int(batch) / (moved / link[0] + moved / link[1]) if moved else None
    met = slower <= OFFLOAD_GOAL[0] and saved >= OFFLOAD_GOAL[1]
    return (f"bf16 b={batch}: peak {plain['peak_bytes'] / 2**30:.1f} -> {offloaded['peak_bytes'] / 2**30:.1f} GiB "
            f"({-saved:+.0%}), {plain['samples_per_s']:,.1f} -> {offloaded['samples_per_s']:,.1f} samples/s "
            f"({-slower:+.0%})" + (f", pinned host {pinned / 2**30:.1f} GiB" if pinned else "")
            + f"; goal (at most {OFFLOAD_GOAL[0]:.0%} slower, at least {OFFLOAD_GOAL[1]:.0%} saved) "
            + ("met" if met else "not met")
            + (f"; the host link moves {moved / 2**30:.1f} GiB each way at {link[0] / 1e9:.1f}/{link[1] / 1e9:.1f} GB/s: "
               f"at most {ceiling:,.1f} samples/s" if ceiling else ""))


def part_offload(out: str) -> list[Row]:
    """Activation offload (`offload_activations`) on GPT-2 small at one micro-batch, bf16: the probe's peak, speed
    and pinned host memory without it and with it, alone and over every block checkpointed (where it moves only
    the blocks' inputs), against the issue's goal and against what the host link measured here allows."""
    script, batch = "benchmarks/gpu/gpt124m.py", _env("OFFLOAD_BATCH", "32")
    link = _host_link()
    rows = []
    for name, extra in (("", []), (" over full checkpointing", ["--checkpoint-segments", "12"])):
        runs = {}
        for offload in (False, True):
            args = [PY, "-m", "autofit.cli", "probe", script, "--gpu", "0", "--precision", "bf16", "--batch-size",
                    batch, *extra, *(["--offload-activations"] if offload else []), "--json"]
            log = os.path.join(out, f"offload{'-ckpt' if extra else ''}-{'on' if offload else 'off'}.log")
            runs[offload] = (args, _probed(args, log))
        (plain_args, plain), (_, offloaded) = runs[False], runs[True]
        command = _shown(plain_args) + " ; then with --offload-activations"
        feature = f"activation offload (GPT-2 small{name})"
        if not all(r.get("status") == "ok" and r.get("peak_bytes") and r.get("samples_per_s")
                   for r in (plain, offloaded)):
            rows.append(Row(feature, f"no figure: probes {plain.get('status')}, {offloaded.get('status')} "
                                     f"(offload{'-ckpt' if extra else ''}-off.log, -on.log)", command))
            continue
        rows.append(Row(feature, _offload_figure(batch, plain, offloaded, link), command))
    return rows


def _allocator_figure(records: dict[bool, dict]) -> str:
    """'expandable segments (the default): peak 13.2 GiB, 33.0 samples/s, 0 retries; off: ...'."""
    def one(record: dict) -> str:
        if record.get("status") != "ok":
            return record.get("status", "no record")
        retries = record.get("alloc_retries")
        return (f"peak {record['peak_bytes'] / 2**30:.2f} GiB, {record['samples_per_s']:,.1f} samples/s, "
                f"{'?' if retries is None else retries} retries in its measured steps")

    return f"expandable segments (autofit's default): {one(records[True])}; off: {one(records[False])}"


def part_allocator(out: str) -> list[Row]:
    """The allocator in the config: GPT-2 medium under its 16 GiB cap at its edge (b=3 fit at 13.7 GiB on an H200,
    b=4 ran out of memory there), each probed with autofit's default settings (expandable segments) and with them
    off: the peak, the speed and the allocator's retries in the measured steps."""
    script, limit = "benchmarks/gpu/gpt124m.py", _env("LIMIT_MEMORY", "16GiB")
    rows = []
    for batch in ("3", "4"):
        records, shown = {}, ""
        for expandable in (True, False):
            env = {**MEDIUM, **({} if expandable else {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})}
            args = [PY, "-m", "autofit.cli", "probe", script, "--gpu", "0", "--precision", "bf16", "--batch-size",
                    batch, "--memory-limit", limit, "--json"]
            records[expandable] = _probed(args, os.path.join(out, f"allocator-b{batch}-{int(expandable)}.log"), env)
            shown = shown or _shown(args, MEDIUM) + " ; then with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
        rows.append(Row(f"allocator settings and retries (GPT-2 medium b={batch}, {limit})",
                        _allocator_figure(records), shown))
    return rows


def part_hf(out: str) -> list[Row]:
    script = "benchmarks/gpu/hf_gpt2.py"
    args, best = _search(script, "hf", out, _env("BUDGET_HF", "90s"), None, {}, ("--precision", "bf16"))
    if best is None:
        return [Row("HF Trainer adapter (GPT-2 small)", "no figure: the search failed (hf-search.log)", _shown(args))]
    run = _normal_run(script, os.path.join(out, "hf.best.json"), out, "hf")
    return [Row("HF Trainer adapter (GPT-2 small)", _pick(best) + "; " + _fidelity(best, run), _shown(args))]


PARTS: dict[str, Callable[[str], list[Row]]] = {
    "tokens": part_tokens, "memory": part_memory, "estimator": part_estimator, "offload": part_offload,
    "allocator": part_allocator, "hf": part_hf,
}


def portable(rows: list[Row], out: str) -> list[Row]:
    """`rows` with the absolute --out folder written as a reader can use it: relative to the repository
    where it lies inside it (every command runs from there), else `<out>`."""
    out = os.path.abspath(out)
    shown = os.path.relpath(out, REPO) if os.path.commonpath([out, REPO]) == REPO else "<out>"
    return [replace(r, figure=r.figure.replace(out, shown), command=r.command.replace(out, shown)) for r in rows]


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
    rows = portable(rows, out)
    text = table(rows, gpu, date)
    with open(os.path.join(out, "features.md"), "w") as handle:
        handle.write(text)
    with open(os.path.join(out, "features.json"), "w") as handle:
        json.dump({"gpu": gpu, "date": date, "torch": torch.__version__, "rows": [asdict(r) for r in rows]}, handle,
                  indent=2)
    print(text)


if __name__ == "__main__":
    main()
