"""Plain records that cross processes and storages: what one probe measured (`ProbeResult`), and what
a runner learned of the user's function once it was loaded (`WorkerInfo`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from autofit.config import Config
from autofit.knobs import Offers
from autofit.units import input_bound_text

#: ok: ran its steps. oom: the allocator ran dry. error: the user's code raised.
#: diverged: loss became NaN/inf. timeout: killed at the time limit. crashed: the worker died.
STATUSES = ("ok", "oom", "error", "diverged", "timeout", "crashed")


@dataclass
class ProbeResult:
    status: str
    config: Config
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    """Real (non-padding) tokens trained per second, where the function's batches count them (run.batches
    with token batches, or its `tokens=`); all ranks of a distributed probe."""
    step_time_median_s: float | None = None
    step_time_iqr_s: float | None = None
    warmup_steps: int = 0
    measured_steps: int = 0
    peak_bytes: int | None = None
    memory_limit: int | None = None
    """The memory limit the probe ran under (`limit_bytes` in the stored record, as in the best-config file)."""
    wall_s: float = 0.0
    knobs: dict = field(default_factory=dict)
    """What the function offers and what its run saw: autofit.knobs' `Offers` as its dict (`offers` reads it)."""
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    memory_after_bytes: int | None = None
    baseline_bytes: int | None = None
    allocator: dict = field(default_factory=dict)
    threads: int | None = None
    """Intra-op threads the probe's steps ran on (torch.get_num_threads()): on the CPU each thread keeps its own
    buffers, so the count changes a config's peak as well as its speed; None: a record from before it was kept."""
    log_path: str | None = None
    notes: list[str] = field(default_factory=list)
    world_size: int = 1
    """Ranks the probe ran on (a distributed probe: throughput of all of them, the largest peak)."""
    warmup_s: float | None = None
    """Wall time of the warm-up steps: compilation (torch.compile), cuDNN autotuning, first-use costs."""
    start_s: float | None = None
    """From the probe's start to its first micro-batch's end: the function's or script's own set-up
    (building the model, reading data, its own evaluation) and the first forward and backward, where
    compilation lands. Never counted in the throughput, nor against a probe's step timeout."""
    compile_s: float | None = None
    """Seconds torch.compile spent compiling during the probe, whoever asked for it (run.compile or the
    script's own torch.compile), timed by TorchDynamo's compile callbacks (where it has none, a compiled
    config's warm-up beyond its steps at the measured pace); None: nothing compiled."""
    compile_cache_hits: int | None = None
    """Graphs the compiler took from its caches in the probe (inductor's and AOTAutograd's, kept on disk:
    a probe after the first of a config compiles from them, whatever was reset between probes)."""
    probe_accumulation: int | None = None
    """Micro-batches per optimizer step the probe ran, where fewer than the config's: its steps were priced
    as the config's (autofit.runtime._accumulation); None: it ran the config's own."""
    probe_step_s: float | None = None
    """Median time of the probe's own optimizer steps (of `probe_accumulation` micro-batches where set):
    what a longer run of it takes per step."""
    inner_micro_s: float | None = None
    """Where the probe priced its steps: one micro-batch inside a step, timed exactly."""
    data_wait_s: float | None = None
    """Host time the measured steps waited inside `next()` on the data (run.batches): an upper bound on
    the device's idle time, since on a GPU the wait can overlap kernels queued before it."""
    data_wait_share: float | None = None
    """data_wait_s over the measured time; None where autofit does not drive the loop (a framework's
    trainer, run.control.adopt_loop)."""
    restart_worker: bool = False
    """The probe left the worker unusable (a sticky CUDA error): replace it before the next probe."""
    flops_per_sample: float | None = None
    """Model FLOPs per sample (forward, backward, optimizer; checkpointing's recompute left out),
    counted by PyTorch's FLOP formulas on one step after the measured ones; None for compiled or sharded configs."""
    flops_per_token: float | None = None
    """Model FLOPs per real (non-padding) token of the same counted step, where its batches count tokens."""
    flops_per_s: float | None = None
    """Model FLOP/s achieved: samples/s x FLOPs per sample, or by tokens real tokens/s x FLOPs per token
    (all ranks of a distributed probe)."""
    mfu: float | None = None
    """Model FLOPs utilisation: FLOP/s over the device's dense peak at this precision (None on a CPU
    or a GPU without a known peak: autofit.devices.PEAK_FLOPS)."""
    joules_per_sample: float | None = None
    """Energy the GPU drew per sample over the measured steps (NVML's energy counter; None elsewhere)."""
    alloc_retries: int | None = None
    """Times the allocator freed its cache to retry an allocation in the measured steps (CUDA's
    num_alloc_retries): above 0, the config only just fits; None: not counted (a CPU, cudaMallocAsync, a
    record from before it was kept: `only_just_fits` reads the whole probe's count there)."""
    modules: dict = field(default_factory=dict)
    """The script's local modules its process had loaded when the probe ended (path from the project's root to
    its code_sha256: autofit.probing's `local_modules`): the code it ran beside the script's own, so a probe
    of an older helper is told apart. Empty: none, or a record from before they were kept."""

    @property
    def offers(self) -> Offers:
        """What the function offers and what its run saw, as the record the child noted (an old study's
        probe kept the same dict)."""
        return Offers.from_dict(self.knobs or {})

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def rate(self) -> float | None:
        """The throughput a search ranks this probe by (`Config.ranked_by`): samples/s, or by tokens
        real tokens/s (None where the function's batches did not count them)."""
        return getattr(self, self.config.ranked_by.name)

    @property
    def only_just_fits(self) -> bool:
        """It ran, but the allocator had to free its cache and retry allocations to stay under the cap in its
        measured steps (CUDA's num_alloc_retries): at the edge of memory, and slower for it."""
        retries = self.alloc_retries if self.alloc_retries is not None else self.allocator.get("num_alloc_retries")
        return self.ok and int(retries or 0) > 0

    @property
    def host_pinned_bytes(self) -> int | None:
        """Pinned host memory the probe held at its peak (an activation offload's copies, pinned batches), as the
        host allocator rounds it; None where not read (a CPU, a torch without host memory stats)."""
        return self.allocator.get("host_pinned_peak_bytes") or None

    def set_flops(self, flops_per_sample: float, peak_flops_per_s: float | None,
                  flops_per_token: float | None = None) -> None:
        """FLOPs per sample (and per real token), and from them FLOP/s and MFU against one device's dense
        peak (every rank of a distributed probe has its own device, so the peak counts once per rank).
        By tokens the FLOP/s come from tokens/s and FLOPs per token: a micro-batch's samples vary with the
        lengths drawn, its tokens far less."""
        self.flops_per_sample, self.flops_per_token = flops_per_sample, flops_per_token
        if self.config.max_tokens is not None and flops_per_token and self.tokens_per_s:
            self.flops_per_s = self.tokens_per_s * flops_per_token
        elif self.samples_per_s:
            self.flops_per_s = self.samples_per_s * flops_per_sample
        else:
            return
        if peak_flops_per_s:
            mfu = self.flops_per_s / (peak_flops_per_s * max(1, self.world_size))
            if mfu > 1.0:  # more than the hardware can do: the count or the peak is wrong, never a figure
                self.notes.append(f"MFU read {mfu:.0%}, over 100%: a measuring error (a peak for other math than "
                                  f"what ran?); not stored")
            else:
                self.mfu = mfu

    def to_dict(self) -> dict:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["limit_bytes"] = data.pop("memory_limit")  # the stored record keeps the file's name
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ProbeResult:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["memory_limit"] = data.get("limit_bytes", data.get("memory_limit"))
        kwargs["config"] = Config.from_dict(data["config"])
        return cls(**kwargs)

    def summary(self) -> str:
        """One line for logs: 'ok  bf16 b=64  812.3 samples/s  peak 1.21 GiB' (by tokens the rate ranked,
        real tokens/s, first: 'ok  bf16 max_tokens=4096  51,234 real tokens/s (201.3 samples/s) ...')."""
        from autofit.units import format_flops, format_size

        line = f"{self.status:<8} {self.config.label():<24}"
        if self.config.max_tokens is not None and self.tokens_per_s:  # batches by tokens: the real ones
            line += f" {self.tokens_per_s:10,.0f} real tokens/s"
            if self.samples_per_s is not None:
                line += f" ({self.samples_per_s:,.1f} samples/s)"
        elif self.samples_per_s is not None:
            line += f" {self.samples_per_s:10.1f} samples/s"
        if self.peak_bytes is not None:
            line += f"  peak {format_size(self.peak_bytes)}"
        if self.memory_limit is not None:
            line += f" of {format_size(self.memory_limit)}"
        if self.only_just_fits:
            line += "  (only just fits: allocator retries)"
        if self.host_pinned_bytes:
            line += f"  (pinned host {format_size(self.host_pinned_bytes)})"
        if self.flops_per_s:
            line += f"  {format_flops(self.flops_per_s)}"
            if self.mfu is not None:
                line += f" (MFU {self.mfu:.1%})"
        if self.ok and (waited := input_bound_text(self.data_wait_share)):
            line += f"  ({waited})"
        if self.probe_accumulation is not None:
            line += f"  (priced from {self.probe_accumulation} micro-batches a step)"
        if self.start_s is not None and self.start_s >= 1.0:
            line += f"  (first micro-batch after {self.start_s:.1f}s: not counted)"
        if self.compile_s is not None:
            cached = f", {self.compile_cache_hits} graphs from its cache" if self.compile_cache_hits else ""
            line += f"  (compiled in {self.compile_s:.1f}s{cached}, not counted)"
        if self.error_message and self.status != "ok":
            line += f"  ({self.error_type}: {self.error_message.splitlines()[0][:120]})"
        return line


@dataclass
class WorkerInfo:
    """What a runner reported once torch and the user's script were loaded."""

    function: str
    options: dict | None
    device: dict
    precisions: list[str]
    default_precisions: list[str]
    baseline_bytes: int
    memory_limit: int | None
    """The memory limit the runner's process enforces (bytes; None: the whole device)."""
    versions: dict
    load_s: float
    pid: int
