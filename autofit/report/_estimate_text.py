"""`autofit estimate`'s answer: per memory size, the predicted config and where its memory goes,
always marked as predicted (fake tensors, not a run). For a function that batches by tokens the configs
are token caps (`max_tokens`), each estimated at its worst micro-batch."""

from __future__ import annotations

from autofit.memory import ALLOCATOR_OVERHEAD, CPU_TYPICAL_FACTOR, CUDA_CONTEXT_BYTES, PARTS, Fit, WhatFits
from autofit.units import format_size

_SHORT = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "activations": "activ",
          "temporaries": "temp", "other": "other"}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def describe_known_parts(fits: WhatFits, target: str) -> str:
    """A partial estimate: the parts the optimizers hold, what was not predicted and why."""
    estimate = fits.partial
    known = [p for p in PARTS if p not in estimate.missing and estimate.breakdown[p]]
    lines = [f"memory estimate of {target}: PARTIAL, predicted from fake tensors, not measured", *fits.notes, ""]
    lines += [f"{part:>12}  {format_size(estimate.breakdown[part])}" for part in known]
    device = "CUDA context prior" if fits.on_gpu else "this process before any step"
    lines += ["", f"a device needs at least {format_size(fits.known_floor())} ({device} included) before "
                  f"{' and '.join(p for p in estimate.missing if p != 'temporaries')}; "
                  "`autofit search` measures the rest from its first probe."]
    return "\n".join(lines)


def known_parts_json(fits: WhatFits, target: str) -> dict:
    estimate = fits.partial
    return {"target": target, "predicted": "partial", "device": "gpu" if fits.on_gpu else "cpu",
            "baseline_bytes": fits.baseline, "missing": list(estimate.missing), "why_missing": estimate.why_missing,
            "notes": fits.notes, "known_bytes": {p: estimate.breakdown[p] for p in PARTS if p not in estimate.missing},
            "at_least_bytes": fits.known_floor(), "fits": []}


def describe_fits(fits: WhatFits, predicted: list[Fit], target: str) -> str:
    device = "a GPU of each size" if fits.on_gpu else "this CPU"
    lines = [f"memory estimate of {target} on {device}: PREDICTED from two steps on fake tensors, not measured",
             *fits.notes, ""]
    labels = {f.memory_bytes: f.config.label() + (" (data)" if fits.data_bound(f.config) else "")
              for f in predicted if f.config is not None}
    width = max([24, *map(len, labels.values())])  # "bf16 b=16 ckpt=2 selective acc=8"
    header = f"{'memory':>10} {'config':<{width}} {'peak (pred.)':>12}  " + " ".join(f"{_SHORT[p]:>7}" for p in PARTS)
    lines += [header, "-" * len(header)]
    for fit in predicted:
        if fit.config is None:
            lines.append(f"{format_size(fit.memory_bytes):>10} {'nothing fits':<{width}}")
            continue
        parts = " ".join(f"{_mib(fit.estimate.breakdown[p]):>7}" for p in PARTS)
        lines.append(f"{format_size(fit.memory_bytes):>10} {labels[fit.memory_bytes]:<{width}} "
                     f"{format_size(fit.predicted_peak_bytes):>12}  {parts}")
    lines += ["", "parts in MiB of tensors at the predicted peak; usable memory is each size less the "
                  f"headroom ({format_size(predicted[0].usable_bytes)} of {format_size(predicted[0].memory_bytes)})."]
    if fits.on_gpu:
        lines.append(f"peak = tensors x {1 + ALLOCATOR_OVERHEAD:.2f} (caching allocator) + "
                     f"{format_size(CUDA_CONTEXT_BYTES)} (CUDA context, workspaces): priors, not yet calibrated "
                     f"by probes; tensors estimated on CPU fake tensors with CUDA's kernels' memory (fused "
                     f"attention, foreach optimizer steps; CPU autocast's op list).")
    else:
        lines.append(f"peak = tensors x {CPU_TYPICAL_FACTOR:.1f} (the heap's holes, typical) + {format_size(fits.baseline)} "
                     f"(this process before any step, Python, torch and the script, and its runtime's context, "
                     f"measured): the factor is a prior until probes calibrate it.")
    if any(_holds_no_gradients(f) for f in predicted):
        lines.append("grads near 0 (acc=1): the peak comes at the forward's end or the backward's start, before this "
                     "step's gradients exist (the last step's were freed by zero_grad).")
    tokens = _by_tokens(predicted)
    if any(f.config is not None and fits.data_bound(f.config) for f in predicted):
        lines.append("(data): a larger cap runs the same batches (the whole data is one batch that half the cap holds)."
                     if tokens else
                     "(data): the data feeds no larger micro-batch (a DataLoader with drop_last over fewer samples).")
    if tokens:
        lines.append(_worst_batches_line(predicted))
    lines.append("preference without measurements: the fastest precision, then the fewest checkpointed blocks "
                 f"(selective before full), at the largest {'token cap' if tokens else 'micro-batch'} that fits; "
                 "`autofit search` measures which is really fastest.")
    return "\n".join(lines)


def _by_tokens(predicted: list[Fit]) -> bool:
    """The configs are token caps (the function batches by tokens, run.token_batches)."""
    return any(f.config is not None and f.config.max_tokens is not None for f in predicted)


def _worst_batches_line(predicted: list[Fit]) -> str:
    """How each cap was estimated: at its worst micro-batch, named per cap (samples x padded length)."""
    shapes = {f.config.max_tokens: f.estimate.worst_batch for f in predicted
              if f.config is not None and f.estimate.worst_batch is not None}
    named = ", ".join(f"max_tokens={cap}: {samples} x {longest}" for cap, (samples, longest) in sorted(shapes.items()))
    return ("max_tokens: each cap estimated at its worst micro-batch, not a random draw: the data's longest "
            "samples, as many as the cap holds, padded to the longest, at both estimated steps (an attention's "
            "scores grow with the square of the length; a batch of shorter samples fills the cap closer, by less "
            f"than one longest sample's tokens){' (' + named + ')' if named else ''}.")


def _holds_no_gradients(fit: Fit) -> bool:
    """A peak without gradients: no accumulation keeps them over the next forward, where the peak is."""
    if fit.config is None or fit.config.accumulation_steps > 1:
        return False
    return fit.estimate.breakdown["gradients"] < fit.estimate.breakdown["parameters"] / 10


def fits_json(fits: WhatFits, predicted: list[Fit], target: str) -> dict:
    """The answer as JSON. By tokens (`"size": "max_tokens"`) each row names its cap (`max_tokens`) and the
    worst micro-batch it was estimated at (`worst_batch`: samples and padded length)."""
    tokens = fits.sizes.tokens
    return {
        "target": target, "predicted": True, "device": "gpu" if fits.on_gpu else "cpu",
        "size": "max_tokens" if tokens else "batch_size",
        **({"longest_sample": fits.sizes.longest_sample} if tokens else {}),
        "baseline_bytes": fits.baseline, "notes": fits.notes,
        "fits": [{"memory_bytes": f.memory_bytes, "usable_bytes": f.usable_bytes,
                  **({"max_tokens": f.config.max_tokens if f.config else None} if tokens else {}),
                  "config": f.config.to_dict() if f.config else None,
                  "predicted_peak_bytes": f.predicted_peak_bytes,
                  "breakdown_bytes": f.estimate.breakdown if f.estimate else None,
                  **({"worst_batch": _worst_batch_json(f)} if tokens else {})} for f in predicted],
    }


def _worst_batch_json(fit: Fit) -> dict | None:
    shape = fit.estimate.worst_batch if fit.estimate is not None else None
    if shape is None:
        return None
    return {"samples": shape[0], "longest": shape[1], "token_envelope": fit.estimate.token_envelope}
