"""The GPUs a forecast can aim at: memory, dense peaks per precision, achievable matmul, HBM bandwidth.

Dated 2026-11-28. Sources: dense peaks are autofit.devices' table (each NVIDIA datasheet's dense figure,
the sparse one halved where only that is printed), with the B200, T4 and V100 added here from their
datasheets (HGX B200: BF16 4.5 / TF32 2.2 PFLOP/s per GPU with sparsity; T4: FP32 8.1, FP16 65; V100 SXM2:
FP32 15.7, FP16 125; neither of the last two runs bf16 or tf32 on tensor cores). Achievable matmul is the
"maximum achievable matmul FLOPS" (MAMF) that Stas Bekman's ml-engineering book measured, bf16, 2026-08:
A100 271, H100 and H200 794.5, B200 1745 TFLOP/s. Where none is published, the dense peak times 0.80, the
median of the published MAMF over the dense peak (A100 0.87, H100 0.80, B200 0.78), and the forecast says
so. Bandwidth is the datasheet's HBM/GDDR figure. Memory is the total the driver reports (nvidia-smi,
MiB), which is what a search's limit is taken from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autofit.devices import peak_flops_for

T = 1e12
MIB = 1024**2
#: Achievable matmul over the dense peak where no MAMF is published: the median of the published ratios.
ASSUMED_MATMUL_EFFICIENCY = 0.80
SPECS_DATE = "2026-11-28"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as a forecast sees it. `peaks` holds the dense FLOP/s of each precision it runs
    (a precision it lacks is absent); `mamf_bf16` the published achievable bf16 matmul, None if none."""

    name: str
    memory_bytes: int
    bandwidth: float
    """Bytes per second of device memory (HBM or GDDR)."""
    peaks: dict[str, float] = field(repr=False)
    mamf_bf16: float | None = None
    source: str = ""

    def runs(self, precision: str) -> bool:
        return precision in self.peaks

    def matmul(self, precision: str) -> float:
        """Achievable matmul FLOP/s at `precision`: the published MAMF scaled by the precision's peak
        over bf16's, else the dense peak times ASSUMED_MATMUL_EFFICIENCY."""
        peak = self.peaks[precision]
        if self.mamf_bf16 is not None and "bf16" in self.peaks:
            return self.mamf_bf16 * peak / self.peaks["bf16"]
        return peak * ASSUMED_MATMUL_EFFICIENCY

    @property
    def matmul_published(self) -> bool:
        return self.mamf_bf16 is not None


def _peaks(nvml_name: str) -> dict[str, float]:
    peak = peak_flops_for(nvml_name)
    assert peak is not None, nvml_name
    return {p: peak.flops_per_s(p) for p in ("fp32", "tf32", "bf16", "fp16")}


_MAMF = "MAMF from ml-engineering (2026-08)"
GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in (
    GpuSpec("H100", 81559 * MIB, 3.35 * T, _peaks("NVIDIA H100 SXM"), 794.5 * T, f"H100 SXM datasheet; {_MAMF}"),
    GpuSpec("H100-PCIe", 81559 * MIB, 2.0 * T, _peaks("NVIDIA H100 PCIe"), None, "H100 PCIe datasheet"),
    GpuSpec("H200", 143771 * MIB, 4.8 * T, _peaks("NVIDIA H200 SXM"), 794.5 * T, f"H200 SXM datasheet; {_MAMF}"),
    GpuSpec("B200", 183359 * MIB, 8.0 * T, {"fp32": 75 * T, "tf32": 1100 * T, "bf16": 2250 * T, "fp16": 2250 * T},
            1745 * T, f"HGX B200 datasheet (per GPU); {_MAMF}"),
    GpuSpec("A100-80GB", 81920 * MIB, 2.039 * T, _peaks("NVIDIA A100-SXM4-80GB"), 271 * T,
            f"A100 datasheet (80 GB SXM); {_MAMF}"),
    GpuSpec("A100-40GB", 40960 * MIB, 1.555 * T, _peaks("NVIDIA A100-SXM4-40GB"), 271 * T,
            f"A100 datasheet (40 GB SXM); {_MAMF} (measured on the 80 GB part, the same compute)"),
    GpuSpec("L40S", 46068 * MIB, 0.864 * T, _peaks("NVIDIA L40S"), None, "L40S datasheet"),
    GpuSpec("L4", 23034 * MIB, 0.300 * T, _peaks("NVIDIA L4"), None, "L4 datasheet"),
    GpuSpec("A10G", 23028 * MIB, 0.600 * T, _peaks("NVIDIA A10G"), None, "A10 datasheet (AWS's A10G)"),
    GpuSpec("T4", 15360 * MIB, 0.320 * T, {"fp32": 8.1 * T, "fp16": 65 * T}, None, "T4 datasheet (no bf16, no tf32)"),
    GpuSpec("V100", 16384 * MIB, 0.900 * T, {"fp32": 15.7 * T, "fp16": 125 * T}, None,
            "V100 SXM2 16 GB datasheet (no bf16, no tf32)"),
)}

#: What `autofit forecast` aims at when --gpu is not given.
DEFAULT_TARGETS = ("H100", "H200", "A100-80GB", "L4", "B200")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def gpu_spec(name: str) -> GpuSpec:
    """The spec a --gpu name means ("h100", "A100-80GB", "a10080gb"); UsageError naming the known ones."""
    from autofit.errors import UsageError

    wanted = _key(name)
    for spec in GPUS.values():
        if _key(spec.name) == wanted:
            return spec
    aliases = {"a100": "A100-80GB", "h100sxm": "H100", "h200sxm": "H200", "h100pcie": "H100-PCIe"}
    if wanted in aliases:
        return GPUS[aliases[wanted]]
    raise UsageError(f"A target GPU must be one of {', '.join(GPUS)}, but got {name!r}.")


def spec_of_device(device_name: str | None, total_bytes: int | None = None) -> GpuSpec | None:
    """The spec of the GPU a file was measured on, from its NVML name ("NVIDIA H100 80GB HBM3"), the
    memory size telling an A100's two parts apart; None for a CPU or a GPU not listed."""
    if not device_name:
        return None
    words = device_name.lower().replace("-", " ").replace("_", " ").split()
    candidates = [spec for spec in GPUS.values()
                  if _key(spec.name.split("-")[0]) in words
                  and (("pcie" in words) == ("PCIe" in spec.name))]
    if not candidates or "mig" in words or "nvl" in words:
        return None
    if total_bytes:
        return min(candidates, key=lambda spec: abs(spec.memory_bytes - total_bytes))
    return candidates[0]
