"""Dense peak FLOP/s per GPU model and precision: the denominator of MFU (model FLOPs utilisation).

Dense, never sparse: NVIDIA's datasheets lead with the 2:4 structured-sparsity figure for tensor
cores (the H100 SXM's "1,979 TFLOPS bf16" is 989.4 dense), and using it halves every MFU; a run
training dense weights can reach only the dense peak. Each figure is the datasheet's dense number
(its sparse one divided by two where only that is printed), with the document it comes from.

Precisions as autofit names them: `fp32` is IEEE float32 on the CUDA cores (autofit turns TF32 off
for it), `tf32` the TF32 tensor-core rate, `bf16` and `fp16` the 16-bit tensor-core rate with fp32
accumulation (what autocast uses; GeForce cards run fp16-accumulate at twice that, which PyTorch
does not use). No entry, no MFU: a CPU, or a GPU not listed, reports null rather than a guess.

A name finds its model by whole tokens, never by a fragment ("a100" is not in "NVIDIA RTX A1000",
"h200" not in "NVIDIA GH200"): the vendor words, memory size and HBM generation are set aside, and
what is left must be a model the table lists exactly ("NVIDIA GeForce RTX 4090 D" is not the 4090).

A MIG slice ("NVIDIA A100-SXM4-80GB MIG 3g.40gb") has the share of the GPU's tensor cores its SMs
give it: its peak is the whole GPU's scaled by the slice's SMs over the GPU's (clocks are the GPU's).
The slice's SM count comes from CUDA (`multi_processor_count`), which only the worker asks; from a
name alone the share is unknown (the profile's "3g" counts compute slices, and slices are not a fixed
share of the SMs: an A100's seven 1g slices hold 98 of its 108), so a MIG name alone has no peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

T = 1e12


@dataclass(frozen=True)
class PeakFlops:
    """One GPU model's dense peaks in FLOP/s, and where they come from."""

    model: str
    fp32: float
    tf32: float
    bf16: float
    source: str
    multiprocessors: int | None = None
    """The whole GPU's SMs, which a MIG slice's share is counted against (GPUs with MIG only)."""

    def flops_per_s(self, precision: str) -> float:
        return {"fp32": self.fp32, "tf32": self.tf32, "bf16": self.bf16, "fp16": self.bf16}[precision]


_H100_SXM = PeakFlops("H100 SXM", 67 * T, 494.7 * T, 989.4 * T,
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM5: FP32 67, TF32 989 / BF16 1,979 with sparsity)", 132)
_H200_SXM = PeakFlops("H200 SXM", 67 * T, 494.7 * T, 989.4 * T,
                 "NVIDIA H200 Tensor Core GPU datasheet (SXM: FP32 67, TF32 989 / BF16 1,979 with sparsity)", 132)
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet (40 and 80 GB, SXM and PCIe: FP32 19.5, TF32 156, BF16 312 dense)"
_A100_SXM = PeakFlops("A100 SXM", 19.5 * T, 156 * T, 312 * T, _A100_SOURCE, 108)

#: Model tokens (see `model_tokens`) to peaks. NVML says "NVIDIA H100 80GB HBM3" for the SXM part;
#: the PCIe and NVL parts say so in their names ("NVIDIA H100 PCIe").
PEAK_FLOPS: dict[tuple[str, ...], PeakFlops] = {
    ("h100",): _H100_SXM,
    ("h100", "sxm"): _H100_SXM,
    ("h100", "pcie"): PeakFlops("H100 PCIe", 51 * T, 378 * T, 756.5 * T,
                           "NVIDIA H100 Tensor Core GPU datasheet (PCIe: FP32 51, TF32 756 / BF16 1,513 with sparsity)",
                           114),
    ("h100", "nvl"): PeakFlops("H100 NVL", 60 * T, 417.5 * T, 835 * T,
                          "NVIDIA H100 NVL datasheet (per GPU: FP32 60, TF32 835 / BF16 1,671 with sparsity)", 132),
    ("h200",): _H200_SXM,
    ("h200", "sxm"): _H200_SXM,
    ("h200", "nvl"): PeakFlops("H200 NVL", 60 * T, 417.5 * T, 835.5 * T,
                          "NVIDIA H200 Tensor Core GPU datasheet (NVL: FP32 60, TF32 835 / BF16 1,671 with sparsity)",
                          132),
    ("a100", "sxm"): _A100_SXM,
    ("a100", "pcie"): replace(_A100_SXM, model="A100 PCIe"),
    ("a100",): replace(_A100_SXM, model="A100"),  # the same figures for every form
    ("l40s",): PeakFlops("L40S", 91.6 * T, 183 * T, 362.05 * T,
                    "NVIDIA L40S datasheet (FP32 91.6, TF32 366 / BF16 733 with sparsity)"),
    ("l40",): PeakFlops("L40", 90.5 * T, 90.5 * T, 181.05 * T,
                   "NVIDIA L40 datasheet (FP32 90.5, TF32 181 / BF16 362 with sparsity)"),
    ("l4",): PeakFlops("L4", 30.3 * T, 60 * T, 121 * T,
                  "NVIDIA L4 Tensor Core GPU datasheet (FP32 30.3, TF32 120 / BF16 242 with sparsity)"),
    ("a10g",): PeakFlops("A10G", 31.2 * T, 62.5 * T, 125 * T,
                    "NVIDIA A10 datasheet (FP32 31.2, TF32 62.5, BF16 125 dense); AWS's A10G is that die"),
    ("a10",): PeakFlops("A10", 31.2 * T, 62.5 * T, 125 * T,
                   "NVIDIA A10 Tensor Core GPU datasheet (FP32 31.2, TF32 62.5, BF16 125 dense)"),
    ("rtx", "4090"): PeakFlops("GeForce RTX 4090", 82.6 * T, 82.6 * T, 165.2 * T,
                          "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 (FP32 82.6; TF32 82.6, "
                          "FP16/BF16 with FP32 accumulate 165.2, dense)"),
    ("rtx", "3090"): PeakFlops("GeForce RTX 3090", 35.6 * T, 35.6 * T, 71 * T,
                          "NVIDIA Ampere GA102 architecture whitepaper, RTX 3090 (FP32 35.6; TF32 35.6, "
                          "FP16/BF16 with FP32 accumulate 71, dense)"),
}

#: Words of a GPU's name that do not tell its model: the vendor and brand, the memory size, the HBM generation.
_NOT_THE_MODEL = re.compile(r"nvidia|geforce|tesla|\d+gb|hbm\d*e?")
#: The form factor as NVML spells it ("SXM4", "SXM5", "PCIE"), one word each.
_FORMS = {"sxm4": "sxm", "sxm5": "sxm", "pcie": "pcie"}


def model_tokens(device_name: str) -> tuple[tuple[str, ...], bool]:
    """The words of `device_name` that name its model ("NVIDIA A100-SXM4-80GB": ("a100", "sxm")), and
    whether it is a MIG slice (whose profile, after "MIG", is not part of the model)."""
    words = device_name.lower().replace("-", " ").replace("_", " ").split()
    mig = "mig" in words
    if mig:
        words = words[:words.index("mig")]
    return tuple(_FORMS.get(w, w) for w in words if not _NOT_THE_MODEL.fullmatch(w)), mig


def peak_flops_for(device_name: str, multiprocessors: int | None = None) -> PeakFlops | None:
    """The dense peaks of the GPU NVML names `device_name` ("NVIDIA H100 80GB HBM3"), None when the
    model is not listed (or the device is a CPU). A MIG slice's: the GPU's scaled by the slice's
    `multiprocessors` (SMs) over the GPU's; None without them."""
    tokens, mig = model_tokens(device_name)
    peak = PEAK_FLOPS.get(tokens)
    if peak is None or not mig:
        return peak
    if not multiprocessors or not peak.multiprocessors:
        return None
    share = min(1.0, multiprocessors / peak.multiprocessors)
    return PeakFlops(f"{peak.model} MIG ({multiprocessors} of {peak.multiprocessors} SMs)", peak.fp32 * share,
                peak.tf32 * share, peak.bf16 * share, f"{peak.source}, scaled by the slice's SMs",
                multiprocessors)


def peak_flops_per_s(device_name: str, precision: str, multiprocessors: int | None = None) -> float | None:
    """The dense peak FLOP/s of the GPU NVML names `device_name` at `precision`; None where unknown."""
    peak = peak_flops_for(device_name, multiprocessors)
    return peak.flops_per_s(precision) if peak is not None else None


def mfu(flops_per_s: float | None, device_name: str, precision: str) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's dense peak at `precision`."""
    peak = peak_flops_per_s(device_name, precision)
    if flops_per_s is None or peak is None:
        return None
    return flops_per_s / peak
