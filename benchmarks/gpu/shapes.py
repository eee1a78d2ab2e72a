"""Where a variable-length LM's time goes, in bf16 and in tf32, in at most a minute: the GPU checklist's first
command of its `features` step (issue 53: bf16 ran 5-10x slower than tf32 on a launch-bound model batched by
tokens; is it a cost paid at each new shape?).

    python -m benchmarks.gpu.shapes [--device cuda] [--seconds 60] [--out out/gpu]
    python -m benchmarks.gpu.shapes --device cpu --small            (the same on a CPU, at a small size)

The model is tests/corpus/varlen_lm.py's (4 layers, width 256, causal scaled_dot_product_attention, lengths to
1024), at one token cap (8192: the H200 search's pick), micro-batches as run.token_batches cuts them. For each
precision (bf16 under autocast; tf32, or fp32 off a GPU), in this order:

- the attention kernel PyTorch picks for the model's calls, and each kernel that can take them
  (`torch._fused_sdp_choice`, asked without computing anything);
- a micro-batch (forward, backward, optimizer step) at each new shape, then the same batch again: the median
  time of the first against the second is the cost a new shape adds;
- the allocator's retries and its peak (`torch.cuda.memory_stats`, GPU only);
- the ops that took the time over a few new shapes, by self time (`torch.profiler`, device time on a GPU);
- in bf16, the first-against-repeat time under each kernel that takes the calls (`sdpa_kernel`): which kernel
  pays per shape.

Each part is skipped once the time is spent (said in the output). Writes --out/shapes-profile.md (the answer
for docs/benchmarks.md, "Every feature on a GPU") and --out/shapes-profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAP = 8192
KERNELS = ("flash", "efficient", "cudnn", "math")


class Clock:
    """The minute the profile may take: each part asks whether time is left."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def _batches(lm, cap: int):
    """The epoch's micro-batches of distinct shapes (length-sorted, cut at `cap` padded tokens, as
    run.token_batches cuts them), in a probe's order (every stratum of lengths early): (inputs, labels)."""
    from autofit.runtime import TokenBatchSampler

    sampler = TokenBatchSampler(lm.LENGTHS, cap, worst_first=True)
    shapes, batches = set(), []
    for batch in sampler.all_batches():
        if sampler.shape(batch) not in shapes:
            shapes.add(sampler.shape(batch))
            batches.append(lm.collate([lm.DATA[i] for i in batch]))
    return batches


class Profile:
    """One precision's figures on one device."""

    def __init__(self, lm, device, precision: str) -> None:
        import torch

        self.torch, self.lm, self.device, self.precision = torch, lm, device, precision
        torch.manual_seed(0)
        self.model = lm.VarLenLM().to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision == "tf32"

    def _autocast(self):
        torch = self.torch
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.precision == "bf16" else nullcontext()

    def step(self, batch) -> float:
        """One micro-batch's forward, backward and optimizer step, synchronised: its seconds."""
        torch, (x, y) = self.torch, batch
        x, y = x.to(self.device), y.to(self.device)
        self._sync()
        started = time.perf_counter()
        with self._autocast():
            logits = self.model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - started

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def kernels(self, batch) -> dict:
        """The attention kernel PyTorch picks for the model's calls, and those that can take them."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        width = self.lm.WIDTH
        x = batch[0][:, :].to(self.device)
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        q = torch.empty(x.shape[0], 4, x.shape[1], width // 4, device=self.device, dtype=dtype, requires_grad=True)
        names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
        choice = {getattr(SDPBackend, v).value: k for k, v in names.items()}

        def pick() -> str | None:
            try:
                return choice.get(int(torch._fused_sdp_choice(q, q, q, None, 0.0, True)))
            except RuntimeError:
                return None

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            picked = pick()
            runs = []
            for name in KERNELS:
                with sdpa_kernel([getattr(SDPBackend, names[name])]):
                    if pick() == name:
                        runs.append(name)
        return {"picked": picked, "runs": runs}

    def new_against_repeated(self, batches, clock: Clock) -> dict:
        """Each batch's first step and its second (same shape), while time is left: the medians, and what a new
        shape adds."""
        firsts, seconds = [], []
        for batch in batches:
            if clock.left() < 5:
                break
            firsts.append(self.step(batch))
            seconds.append(self.step(batch))
        if not firsts:
            return {"shapes": 0}
        first, second = statistics.median(firsts), statistics.median(seconds)
        return {"shapes": len(firsts), "new_shape_ms": first * 1e3, "repeated_shape_ms": second * 1e3,
                "added_per_new_shape_ms": (first - second) * 1e3}

    def allocator(self) -> dict:
        if self.device.type != "cuda":
            return {}
        stats = self.torch.cuda.memory_stats(self.device)
        return {"num_alloc_retries": stats.get("num_alloc_retries", 0),
                "peak_gib": stats.get("allocated_bytes.all.peak", 0) / 2**30}

    def top_ops(self, batches, count: int = 8) -> list[dict]:
        """The ops that took the time over `batches` (new shapes), by self time (device time on a GPU)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for batch in batches:
                self.step(batch)
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:count]
        return [{"op": e.key, "self_ms": getattr(e, key, 0) / 1e3, "calls": e.count} for e in events]


def profile_precision(lm, device, precision: str, clock: Clock, shapes: int, cap: int) -> dict:
    """One precision's figures (see the module's docstring), each part while time is left."""
    profile = Profile(lm, device, precision)
    batches = _batches(lm, cap)
    profile.step(batches[-1])  # the first step pays the process's first-use costs, not a shape's
    out = {"precision": precision, "attention": profile.kernels(batches[0])}
    out["steps"] = profile.new_against_repeated(batches[:shapes], clock)
    out["allocator"] = profile.allocator()
    if clock.left() > 8:
        out["top_ops"] = profile.top_ops(batches[shapes:shapes + 3])
    if precision == "bf16":
        out["per_kernel"] = per_kernel(profile, out["attention"]["runs"], batches[shapes + 3:], clock)
    return out


def per_kernel(profile: Profile, kernels: list[str], batches, clock: Clock) -> dict:
    """The first-against-repeat time under each kernel that takes the calls (a few new shapes each)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "math": "MATH"}
    out = {}
    share = max(1, len(batches) // max(1, len(kernels)))
    for index, name in enumerate(kernels):
        if clock.left() < 6:
            out[name] = "skipped: the time was spent"
            continue
        with sdpa_kernel([getattr(SDPBackend, names[name])]):
            out[name] = profile.new_against_repeated(batches[index * share:(index + 1) * share][:3], clock)
    return out


def answer(results: list[dict], device: str) -> str:
    """The figures as markdown: one line per precision, then the top ops."""
    lines = [f"# Variable lengths on {device}: each new shape's cost (benchmarks/gpu/shapes.py)", ""]
    for r in results:
        steps, att, alloc = r["steps"], r["attention"], r.get("allocator") or {}
        line = (f"- **{r['precision']}**: attention picked {att['picked']}, kernels that run: {', '.join(att['runs'])}; "
                f"a step at a new shape {steps.get('new_shape_ms', 0):.1f} ms, the same shape again "
                f"{steps.get('repeated_shape_ms', 0):.1f} ms (+{steps.get('added_per_new_shape_ms', 0):.1f} ms per "
                f"new shape, {steps.get('shapes', 0)} shapes)")
        if alloc:
            line += f"; allocator retries {alloc['num_alloc_retries']}, peak {alloc['peak_gib']:.2f} GiB"
        lines.append(line)
        for kernel, figures in (r.get("per_kernel") or {}).items():
            lines.append(f"  - under {kernel} alone: " + (figures if isinstance(figures, str) else
                         f"new {figures.get('new_shape_ms', 0):.1f} ms, again {figures.get('repeated_shape_ms', 0):.1f} ms"))
        for op in r.get("top_ops") or []:
            lines.append(f"  - {op['op']}: {op['self_ms']:.1f} ms self over 3 new shapes ({op['calls']} calls)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seconds", type=float, default=60.0, help="the whole profile's time (imports included)")
    parser.add_argument("--small", action="store_true", help="a small model and data set (a check on a CPU)")
    parser.add_argument("--shapes", type=int, default=8, help="new shapes timed per precision")
    parser.add_argument("--out", default=os.environ.get("OUT", "out/gpu"))
    args = parser.parse_args()
    clock = Clock(args.seconds - 2)
    if args.small:
        os.environ.update(VARLEN_SAMPLES="200", VARLEN_LAYERS="1", VARLEN_WIDTH="64")
    sys.path.insert(0, REPO)
    import torch

    from tests.corpus import varlen_lm as lm

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks.gpu.shapes --device cuda needs a CUDA device (or --device cpu --small)")
    precisions = ("bf16", "tf32") if device.type == "cuda" else ("bf16", "fp32")
    results = []
    for precision in precisions:
        if clock.left() < 10:
            print(f"{precision}: skipped, the time was spent", flush=True)
            continue
        results.append(profile_precision(lm, device, precision, clock, args.shapes, 1024 if args.small else CAP))
        print(json.dumps(results[-1]["steps"]), flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    text = answer(results, name)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "shapes-profile.md"), "w") as handle:
        handle.write(text)
    with open(os.path.join(args.out, "shapes-profile.json"), "w") as handle:
        json.dump({"device": name, "torch": torch.__version__, "results": results}, handle, indent=2)
    print(text)


if __name__ == "__main__":
    main()
