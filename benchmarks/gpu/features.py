"""Every feature beyond nanoGPT measured on one GPU in one command: the dated table of docs/benchmarks.md.

    python -m benchmarks.gpu.features [--parts tokens,memory,estimator,offload,allocator,hf] [--out out/gpu]
    benchmarks/gpu/run_checklist.sh features          (the same, as the GPU checklist's step)

Each part runs autofit as a user would (`autofit search`, then the exported file's normal run, or
`autofit estimate` then a probe of its answer), each command under its own time limit, its log in
--out, and gives one row: feature, GPU, figure, date, command. Together about 12 minutes by their budgets:

- tokens: issue 53's variable-length LM (tests/corpus/varlen_lm.py) searched by tokens for 3 minutes under a 2 GiB
  cap; the pick's whole epoch against the plain loop's best fixed batch (16, 32 or 64 samples, each a whole
  epoch) in bf16 and in the pick's precision; the pick's probe over its epoch (goal: within 10%); the best bf16
  and tf32 configs the search measured (goal: the pick is at least the faster);
- memory: a Llama-style decoder of about 1B parameters at 2048 tokens (benchmarks/gpu/llama.py), bf16, under a cap
  where plain fits only at micro-batch 1-2 (measured from plain b=1 and b=2 unless $LIMIT_MEMORY): searched for 3
  minutes, then the expert's answer, the best of a hand grid (no checkpointing, selective, full, each at the
  micro-batches that fit), its finalists and the search's pick measured again interleaved: pick / expert, and the
  search's OOM probes (issue 51: pick >= 0.97 of the expert, at most 1 OOM probe);
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
`<out>/...` for a folder outside it: never this machine's absolute path. Budgets and caps: $BUDGET_TOKENS (3m),
$BUDGET_MEMORY (3m), $BUDGET_HF (90s), $LIMIT_TOKENS (2GiB), $LIMIT_MEMORY (measured: plain fits b=2, not 3),
$LIMIT_ALLOCATOR (16GiB: GPT-2 medium's edge), $GRID_ROUNDS (2).
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
from dataclasses import asdict, dataclass, replace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
#: GPT-2 medium (benchmarks/gpu/gpt124m.py's sizes): the allocator part's model, at its memory edge.
MEDIUM = {"GPT124M_LAYERS": "24", "GPT124M_WIDTH": "1024", "GPT124M_SAMPLES": "1024"}
#: Where the searches and the hand grid run: the GPU, or `FEATURES_DEVICE=cpu` for a check of the script at a tiny
#: size (the `memory` and `hf` parts; never a figure for the table).
DEVICE = os.environ.get("FEATURES_DEVICE", "cuda")


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
    device = ["--gpu", "0"] if DEVICE == "cuda" else ["--device", DEVICE]
    args = [PY, "-m", "autofit.cli", "search", script, *device, "--budget", budget, "--fresh",
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
    """Checkpointing where memory binds (issue 51): a Llama-style decoder of about 1B parameters at 2048 tokens, bf16,
    under a cap where plain fits at micro-batch 2 and not 3 ($LIMIT_MEMORY, else measured: `_llama_cap`), searched
    for $BUDGET_MEMORY (3m); then the expert's answer, the best of a hand grid (`_expert_grid`), with the pick in its
    interleaved rounds: pick / expert, and the search's OOM probes."""
    feature = "checkpointing where memory binds (Llama ~1B, 2048 tokens)"
    limit = _env("LIMIT_MEMORY", "") or _llama_cap(out)
    if limit.startswith("no figure"):
        return [Row(feature, limit, f"python -m autofit.cli probe {LLAMA} --gpu 0 --precision bf16 --batch-size 2")]
    args, best = _search(LLAMA, "llama", out, _env("BUDGET_MEMORY", "3m"), limit, {}, ("--precision", "bf16"))
    if best is None:
        return [Row(feature, "no figure: the search failed (llama-search.log)", _shown(args))]
    from autofit import Config

    pick = Config.from_dict(best["config"])
    grid = _expert_grid(out, limit, pick)
    (expert, expert_rate), pick_rate = grid["expert"], grid["rates"].get(pick.label())
    why = grid["note"] or "the pick did not fit in the grid's worker, llama-grid.log"
    versus = (f"pick ÷ expert {pick_rate / expert_rate:.2f} (interleaved: {pick.label()} {pick_rate:,.1f}, expert "
              f"{expert} {expert_rate:,.1f} samples/s, best of {len(grid['rates'])} configs)"
              if pick_rate and expert_rate else f"pick ÷ expert: no figure ({why})")
    plain = _best_plain(out, "llama")
    search = (f"{_pick(best)}; {versus}; OOM probes {_oom_probes(out, 'llama')} of the search's "
              f"{_probes(out, 'llama')}; plain fits up to b={grid['plain_edge']}; the best plain config the search "
              f"measured: " + (f"{plain[0]} {plain[1]:,.1f} samples/s" if plain else "none"))
    return [Row(feature, search, _shown(args) + f"; then the hand grid, {GRID_ROUNDS} rounds (benchmarks/gpu/"
                "features.py `_expert_grid`)")]


LLAMA = "benchmarks/gpu/llama.py"
#: The micro-batches of the expert's hand grid (a search's ladder): each policy from its first size above plain's
#: largest fit (below it plain fits, and is faster) up to its own largest fit.
GRID_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Rounds of the hand grid: the first finds what fits; the others, interleaved, measure the configs within
#: GRID_FINALISTS of the best again, the search's pick among them.
GRID_ROUNDS = int(os.environ.get("GRID_ROUNDS", 2))
GRID_FINALISTS = 0.85
HEADROOM = 0.1  # the search's default


def _llama_cap(out: str) -> str:
    """The memory limit under which plain fits at micro-batch 2 and not 3: plain b=1 and b=2 probed without a cap in
    one worker, and the usable memory put half a sample's growth above b=2's peak (the limit is that over 1 - the
    headroom), in MiB; a line saying why where either probe failed."""
    from autofit.config import Config
    from autofit.export import MemoryBudget
    from autofit.probing import Worker

    peaks = []
    with open(os.path.join(out, "llama-cap.log"), "w") as log:
        try:
            with Worker(os.path.join(REPO, LLAMA), device=DEVICE, budget=MemoryBudget(limit_bytes=None)) as worker:
                worker.start()
                for batch in (1, 2):
                    result = worker.probe(Config(batch_size=batch, precision="bf16"), timeout=600)
                    log.write(f"bf16 b={batch}: {result.status} peak {result.peak_bytes} {result.samples_per_s}\n")
                    if not (result.ok and result.peak_bytes):
                        return (f"no figure: plain bf16 b={batch} did not run without a cap ({result.status}, "
                                f"llama-cap.log)")
                    peaks.append(result.peak_bytes)
        except Exception as error:  # no GPU, a worker that did not start: the row says so, the other parts run
            log.write(f"{type(error).__name__}: {error}\n")
            return f"no figure: the cap's probes did not run ({type(error).__name__}, llama-cap.log)"
    usable = peaks[1] + 0.5 * (peaks[1] - peaks[0])
    return f"{int(usable / (1 - HEADROOM) / 2**20)}MiB"


def _expert_grid(out: str, limit: str, pick) -> dict:
    """The expert's answer: bf16 without checkpointing, then every block checkpointed selective, then full, each at
    the micro-batches of GRID_SIZES from above plain's largest fit up to its own (first round: one probe each, in a
    worker under the search's limit); then GRID_ROUNDS - 1 interleaved rounds (A B C, A B C) of the configs within
    GRID_FINALISTS of the best and of the search's pick. Each config's rate: the median of its rounds. Returns
    {"expert": (label, rate), "rates": {label: rate}, "plain_edge": b, "note": why there is no expert}."""
    import statistics

    from autofit.config import Config
    from autofit.export import MemoryBudget
    from autofit.probing import Worker
    from autofit.units import parse_size

    budget = MemoryBudget.of(parse_size(limit), HEADROOM)
    layers = int(os.environ.get("LLAMA_LAYERS", 22))
    runs: dict = {}
    grid = []  # the hand grid's own configs that fit (the search's pick, measured beside them, is not one of them)
    plain_edge = 0
    with open(os.path.join(out, "llama-grid.log"), "w") as log, \
            Worker(os.path.join(REPO, LLAMA), device=DEVICE, budget=budget) as worker:
        worker.start()

        def measure(config) -> bool:
            result = worker.probe(config, timeout=600)
            fits = result.ok and (result.peak_bytes or 0) <= budget.usable_bytes and bool(result.samples_per_s)
            log.write(f"{config.label():<32} {result.status:<8} {result.samples_per_s or 0:9.2f} samples/s  peak "
                      f"{(result.peak_bytes or 0) / 2**30:.2f} GiB{'' if fits else '  (does not fit)'}\n")
            log.flush()
            if fits:
                runs.setdefault(config, []).append(result.samples_per_s)
            return fits

        for segments, policy in ((0, "full"), (layers, "selective"), (layers, "full")):
            for size in (b for b in GRID_SIZES if b > (plain_edge if segments else 0)):
                config = Config(batch_size=size, precision="bf16", checkpoint_segments=segments, checkpoint_policy=policy)
                if not measure(config):
                    break
                grid.append(config)
                plain_edge = size if not segments else plain_edge
        if not grid:
            return {"expert": (None, None), "rates": {}, "plain_edge": plain_edge, "note": "nothing fit"}
        top = max(statistics.median(r) for r in runs.values())
        finalists = [c for c, r in runs.items() if statistics.median(r) >= GRID_FINALISTS * top]
        if pick not in finalists:
            finalists.append(pick)
        for _ in range(GRID_ROUNDS - 1):
            for config in finalists:
                measure(config)
    expert = max((c for c in runs if c in grid), key=lambda c: statistics.median(runs[c]))
    return {"expert": (expert.label(), statistics.median(runs[expert])), "plain_edge": plain_edge, "note": "",
            "rates": {c.label(): statistics.median(r) for c, r in runs.items()}}


def _best_plain(out: str, study: str) -> tuple[str, float] | None:
    """The fastest feasible probe without checkpointing in the study: what checkpointing must beat."""
    from autofit import load_study

    frame = load_study(study, f"sqlite:///{out}/features.db").trials_frame()
    plain = frame[(frame["checkpoint_segments"] == 0) & frame["feasible"].fillna(False).astype(bool)]
    if plain.empty:
        return None
    top = plain.sort_values("samples_per_s", ascending=False).iloc[0]
    return str(top["label"]), float(top["samples_per_s"])


def _oom_probes(out: str, study: str) -> int:
    """The study's probes of configs that did not fit: out of memory, or a peak inside the headroom."""
    from autofit import load_study

    frame = load_study(study, f"sqlite:///{out}/features.db").trials_frame()
    return int(((frame["status"] == "oom") | ((frame["status"] == "ok") & ~frame["feasible"].fillna(False).astype(bool)))
               .sum())


def _probes(out: str, study: str) -> int:
    from autofit import load_study

    return len(load_study(study, f"sqlite:///{out}/features.db").trials_frame())


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
    script, limit = "benchmarks/gpu/gpt124m.py", _env("LIMIT_ALLOCATOR", "16GiB")
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

    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks.gpu.features needs a CUDA device: torch.cuda.is_available() is False")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else f"{DEVICE} (a check of the scripts, not a figure)"
    date = datetime.date.today().isoformat()
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
