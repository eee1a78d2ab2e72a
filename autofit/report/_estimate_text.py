"""`autofit estimate`'s answer: per memory size, the predicted config and where its memory goes,
always marked as predicted (fake tensors, not a run)."""

from __future__ import annotations

from autofit.memory import ALLOCATOR_OVERHEAD, CUDA_CONTEXT_BYTES, PARTS, Fit, WhatFits
from autofit.units import format_size

_SHORT = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "activations": "activ",
          "temporaries": "temp", "other": "other"}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def describe_fits(fits: WhatFits, predicted: list[Fit], target: str) -> str:
    device = "GPU of each size" if fits.on_gpu else "this CPU"
    lines = [f"memory estimate of {target} on a {device}: PREDICTED from two steps on fake tensors, not measured",
             ""]
    header = f"{'memory':>10} {'config':<24} {'peak (pred.)':>12}  " + " ".join(f"{_SHORT[p]:>7}" for p in PARTS)
    lines += [header, "-" * len(header)]
    for fit in predicted:
        if fit.config is None:
            lines.append(f"{format_size(fit.memory_bytes):>10} {'nothing fits':<24}")
            continue
        parts = " ".join(f"{_mib(fit.estimate.breakdown[p]):>7}" for p in PARTS)
        label = fit.config.label() + (" (data)" if fits.data_bound(fit.config) else "")
        lines.append(f"{format_size(fit.memory_bytes):>10} {label:<24} "
                     f"{format_size(fit.predicted_peak_bytes):>12}  {parts}")
    lines += ["", "parts in MiB of tensors at the predicted peak; usable memory is each size less the "
                  f"headroom ({format_size(predicted[0].usable_bytes)} of {format_size(predicted[0].memory_bytes)})."]
    if fits.on_gpu:
        lines.append(f"peak = tensors x {1 + ALLOCATOR_OVERHEAD:.2f} (caching allocator) + "
                     f"{format_size(CUDA_CONTEXT_BYTES)} (CUDA context, workspaces): priors, not yet calibrated "
                     f"by probes; tensors estimated on CPU fake tensors (CPU autocast's op list).")
    else:
        lines.append(f"peak = tensors + {format_size(fits.baseline)} (this process before any step: Python, torch, "
                     f"the script); the CPU allocator's caching is not in the estimate.")
    if any(f.config is not None and fits.data_bound(f.config) for f in predicted):
        lines.append("(data): the data feeds no larger micro-batch (a DataLoader with drop_last over fewer samples).")
    lines.append("preference without measurements: the fastest precision, then the fewest checkpointed blocks, at "
                 "the largest micro-batch that fits; `autofit search` measures which is really fastest.")
    return "\n".join(lines)


def fits_json(fits: WhatFits, predicted: list[Fit], target: str) -> dict:
    return {
        "target": target, "predicted": True, "device": "gpu" if fits.on_gpu else "cpu",
        "baseline_bytes": fits.baseline,
        "fits": [{"memory_bytes": f.memory_bytes, "usable_bytes": f.usable_bytes,
                  "config": f.config.to_dict() if f.config else None,
                  "predicted_peak_bytes": f.predicted_peak_bytes,
                  "breakdown_bytes": f.estimate.breakdown if f.estimate else None} for f in predicted],
    }
