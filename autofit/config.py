"""One candidate training configuration, and the precisions autofit knows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from autofit.errors import UsageError

#: The largest micro-batch a search considers when none is given: in effect no bound, so memory
#: (or the data) stops the climb, not a number picked in advance.
MAX_BATCH = 2**20

#: Precisions in order of preference when throughput ties: fewer numerical surprises first.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")

#: How the ranks of a distributed run hold the model (run.distribute), least memory saved first:
#: DistributedDataParallel (every rank a whole replica); FSDP2 (`fully_shard` per block, then the
#: root: parameters, gradients and optimizer state split among the ranks); FSDP2 with them kept on
#: the CPU between uses. One process ignores it.
SHARDINGS: tuple[str, ...] = ("ddp", "fsdp", "fsdp-offload")

#: Micro-batches per optimizer step a probe runs at most: a config that accumulates more is priced from
#: them (its step's first micro-batch, those in the middle, and its last with the optimizer step:
#: autofit.runtime._accumulation), so a probe costs what four micro-batches a step cost, not a whole
#: global batch's step.
PROBE_ACCUMULATION = 4

#: What a checkpointed block (run.checkpoint) recomputes in backward, most memory saved first:
#: "full" its whole forward; "selective" all but the outputs of matmuls, convolutions and attention,
#: which it keeps (torchtitan's op-level selective checkpointing).
CHECKPOINT_POLICIES: tuple[str, ...] = ("full", "selective")


@dataclass(frozen=True)
class Rate:
    """The throughput a search ranks configs by (`Config.ranked_by`): its name in probe records, study
    frames and the best-config file, and its unit in words."""

    name: str
    unit: str


#: Samples/s: what a micro-batch of a fixed sample count is ranked by.
SAMPLES = Rate("samples_per_s", "samples/s")
#: Real (non-padding) tokens/s: what token batches (`max_tokens`) are ranked by. Their micro-batches hold
#: as many samples as fit under the cap, short or long, so samples/s favours a cap that fills its
#: batches with short samples; the tokens trained per second are the work done.
TOKENS = Rate("tokens_per_s", "tokens/s")
#: The rates a probe measures (where its batches count tokens, both).
RATES: tuple[Rate, ...] = (SAMPLES, TOKENS)


@dataclass(frozen=True)
class Config:
    """The settings one probe (or the real run) trains under."""

    batch_size: int
    """Micro-batch: samples per forward/backward. Larger is faster until memory runs out."""
    precision: str = "fp32"
    """fp32, tf32 (TF32 matmuls, CUDA only), bf16 or fp16 (autocast; fp16 adds loss scaling)."""
    checkpoint_segments: int = 0
    """Blocks that recompute activations in backward: less memory, more compute."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: keeps the global batch while the micro-batch shrinks."""
    sharding: str = "ddp"
    """Distributed runs only: ddp, fsdp or fsdp-offload (see SHARDINGS)."""
    compile: bool = False
    """torch.compile the model the function offers through run.compile() (eager when False)."""
    # The input pipeline (run.loader); None: as the script declares it (else DataLoader's default).
    loader_workers: int | None = None
    """DataLoader worker processes: batches load in parallel with the step, for CPU cores and memory
    (each worker holds a copy of the dataset object); 0 loads in the training process itself."""
    pin_memory: bool | None = None
    """Page-locked host batches: faster, asynchronous copies to a GPU, for host memory that cannot be
    swapped out (no gain on the CPU)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (workers > 0 only): absorbs uneven loading times, for host memory."""
    checkpoint_policy: str = "full"
    """What the checkpointed blocks recompute (see CHECKPOINT_POLICIES): "selective" keeps the matmul,
    convolution and attention outputs, so it saves less memory than "full" for little recompute."""
    max_tokens: int | None = None
    """Token batching (run.token_batches): a micro-batch's padded tokens (samples x its longest) at
    most, in place of a fixed sample count; memory follows the cap, not the longest sample. None: a
    micro-batch of `batch_size` samples. With it, `batch_size` is the most samples a micro-batch holds."""
    max_squares: int | None = None
    """Token batching only: a micro-batch's padded squares (samples x its longest², what an attention that
    is not fused holds per head and layer) at most, beside `max_tokens`: the long batches are held by it,
    so the short ones may hold more tokens than a cap set at the longest length (a per-length cap, as
    2-D buckets are). None: `max_tokens` alone."""

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_sharding(self.sharding)
        check_checkpoint_policy(self.checkpoint_policy)
        if self.batch_size < 1:
            raise UsageError(f"The batch size must be at least 1, but got {self.batch_size}.")
        if self.accumulation_steps < 1:
            raise UsageError(
                f"The accumulation steps must be at least 1, but got {self.accumulation_steps}."
            )
        if self.checkpoint_segments < 0:
            raise UsageError(
                f"The checkpoint segments must be 0 or more, but got {self.checkpoint_segments}."
            )
        check_loader(self.loader_workers, self.prefetch_factor)
        check_max_tokens(self.max_tokens, self.batch_size)
        check_max_squares(self.max_squares, self.max_tokens)

    @property
    def size(self) -> int:
        """The size knob a search climbs and an OOM lowers: `max_tokens` where it is set, else `batch_size`."""
        return self.max_tokens if self.max_tokens is not None else self.batch_size

    def with_size(self, size: int, **fields) -> Config:
        """This config at another size (the samples' cap kept within a smaller token cap, a squares cap
        scaled with the token cap: each batch's memory beyond the fixed part scales alike), `fields` set too."""
        if self.max_tokens is None:
            return replace(self, batch_size=size, **fields)
        squares = None if self.max_squares is None else max(1, self.max_squares * size // self.max_tokens)
        return replace(self, max_tokens=size, batch_size=min(self.batch_size, size),
                       **{"max_squares": squares, **fields})

    @property
    def probe_accumulation(self) -> int:
        """Micro-batches per optimizer step a probe of this config runs (PROBE_ACCUMULATION at most)."""
        return min(self.accumulation_steps, PROBE_ACCUMULATION)

    def probe_steps(self, micro_batches: int) -> int:
        """Optimizer steps of a probe of this config that hold at least `micro_batches` micro-batches (a
        probe's length is asked in micro-batches: what a step costs is priced, not paid many times)."""
        return max(1, -(-micro_batches // self.probe_accumulation))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step (of one rank). By tokens it counts no samples: `batch_size` there only
        caps a micro-batch's samples (the cap itself unless set lower), and a step's size is its tokens, so
        the best-config file writes none (see `autofit.export.config_entry`)."""
        return self.batch_size * self.accumulation_steps

    @property
    def ranked_by(self) -> Rate:
        """The throughput this config is measured and ranked by: real tokens/s by tokens, else samples/s."""
        return TOKENS if self.max_tokens is not None else SAMPLES

    def size_label(self) -> str:
        """The size knob in words: 'batch 64', or 'max_tokens=4096' by tokens."""
        return f"max_tokens={self.max_tokens}" if self.max_tokens is not None else f"batch {self.batch_size}"

    def to_dict(self) -> dict:
        """The fields; `sharding`, `compile` and `checkpoint_policy` only when not the default, the
        loader's only when set, so that single-process, eager, fully checkpointed configs (and every
        study recorded before those existed) keep their form."""
        data = asdict(self)
        if self.sharding == "ddp":
            del data["sharding"]
        if not self.compile:
            del data["compile"]
        for name in LOADER_FIELDS:
            if data[name] is None:
                del data[name]
        if self.checkpoint_policy == "full":
            del data["checkpoint_policy"]
        if self.max_tokens is None:
            del data["max_tokens"]
        if self.max_squares is None:
            del data["max_squares"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Config:
        return cls(
            batch_size=int(data["batch_size"]),
            precision=str(data.get("precision", "fp32")),
            checkpoint_segments=int(data.get("checkpoint_segments", 0)),
            accumulation_steps=int(data.get("accumulation_steps", 1)),
            sharding=str(data.get("sharding", "ddp")),
            compile=bool(data.get("compile", False)),
            loader_workers=_optional(data.get("loader_workers"), int),
            pin_memory=_optional(data.get("pin_memory"), bool),
            prefetch_factor=_optional(data.get("prefetch_factor"), int),
            checkpoint_policy=str(data.get("checkpoint_policy", "full")),
            max_tokens=_optional(data.get("max_tokens"), int),
            max_squares=_optional(data.get("max_squares") or None, int),  # 0: none (a study's trial params)
        )

    @property
    def loader(self) -> dict:
        """The loader fields this config sets (empty: the loader as the script declares it)."""
        return {name: getattr(self, name) for name in LOADER_FIELDS if getattr(self, name) is not None}

    def label(self) -> str:
        """Short human form: 'bf16 b=64 ckpt=2 selective acc=4' ('bf16 max_tokens=4096' by tokens)."""
        parts = [self.precision]
        if self.max_tokens is not None:
            parts.append(f"max_tokens={self.max_tokens}")
        if self.max_squares is not None:
            parts.append(f"max_squares={self.max_squares}")
        if self.max_tokens is None or self.batch_size < self.max_tokens:
            parts.append(f"b={self.batch_size}")
        if self.checkpoint_segments:
            parts.append(f"ckpt={self.checkpoint_segments}")
            if self.checkpoint_policy != "full":
                parts.append(self.checkpoint_policy)
        if self.accumulation_steps > 1:
            parts.append(f"acc={self.accumulation_steps}")
        if self.sharding != "ddp":
            parts.append(self.sharding)
        if self.compile:
            parts.append("compiled")
        if self.loader_workers is not None:
            parts.append(f"loader-workers={self.loader_workers}")
        if self.pin_memory is not None:
            parts.append("pinned" if self.pin_memory else "unpinned")
        if self.prefetch_factor is not None:
            parts.append(f"prefetch={self.prefetch_factor}")
        return " ".join(parts)


#: The Config fields of the input pipeline (run.loader), None unless a config sets them.
LOADER_FIELDS: tuple[str, ...] = ("loader_workers", "pin_memory", "prefetch_factor")
#: The worker counts a search tries (those within the cores a probe may load with: autofit.planner's
#: `worker_counts`).
LOADER_WORKERS: tuple[int, ...] = (0, 1, 2, 4, 8)
#: Prefetch depths per worker: DataLoader's default and one further ahead.
LOADER_PREFETCH: tuple[int, ...] = (2, 4)


def _optional(value, kind):
    return None if value is None else kind(value)


def check_loader(workers: int | None, prefetch: int | None) -> None:
    if workers is not None and workers < 0:
        raise UsageError(f"The loader workers must be 0 or more, but got {workers}.")
    if prefetch is not None and prefetch < 1:
        raise UsageError(f"The prefetch factor must be at least 1, but got {prefetch}.")
    if prefetch is not None and workers == 0:
        raise UsageError("The prefetch factor needs loader workers (batches load ahead in workers), "
                         "but got 0 workers.")


def check_max_tokens(max_tokens: int | None, batch_size: int) -> None:
    """A token cap is a positive whole number, and the samples' cap within it (each sample holds a
    token at least, so a larger one could never bind)."""
    if max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"The max tokens must be a whole number of at least 1, but got {max_tokens!r}.")
    if batch_size > max_tokens:
        raise UsageError(f"The batch size (the most samples a token batch holds) must be at most the max tokens "
                         f"({max_tokens}), but got {batch_size}.")


def check_max_squares(max_squares: int | None, max_tokens: int | None) -> None:
    """A squares cap is a positive whole number, beside a token cap (it bounds batches by tokens)."""
    if max_squares is None:
        return
    if isinstance(max_squares, bool) or not isinstance(max_squares, int) or max_squares < 1:
        raise UsageError(f"The max squares must be a whole number of at least 1, but got {max_squares!r}.")
    if max_tokens is None:
        raise UsageError("The max squares bounds micro-batches by tokens: it needs max_tokens too.")


def pareto_front(points) -> list[tuple[int, int]]:
    """The (padded tokens, padded squares) pairs no other pair matches or beats in both, squares first: what
    a micro-batch by tokens needs in memory rises with both (its activations with its tokens, an attention
    that is not fused with its squares), so these batches are the worst whatever the model's mix of the two."""
    front: list[tuple[int, int]] = []
    for tokens, squares in sorted({(int(t), int(s)) for t, s in points}, key=lambda p: (-p[1], -p[0])):
        if not front or tokens > front[-1][0]:
            front.append((tokens, squares))
    return front


def widest_envelope(envelopes) -> dict | None:
    """Token envelopes (their records' dicts: a probe's knobs, the best-config file's) as one: each measure's
    largest, and the Pareto front of the micro-batches they ran (`front`, where they hold one). Kept here, on
    plain dicts, so the processes that import no torch merge them as the run does."""
    envelopes = [e for e in envelopes if e]
    if not envelopes:
        return None
    merged = {key: max(int(e[key]) for e in envelopes) for key in ("longest_sample", "padded_tokens", "padded_squares")}
    fronts = [tuple(point) for e in envelopes for point in e.get("front") or ()]
    return {**merged, "front": [list(p) for p in pareto_front(fronts)]} if fronts else merged


def device_shardings(device_type: str) -> tuple[str, ...]:
    """The shardings a device type can run: offloading needs an accelerator to offload from."""
    return SHARDINGS if device_type != "cpu" else tuple(h for h in SHARDINGS if h != "fsdp-offload")


def check_sharding(name: str) -> str:
    if name not in SHARDINGS:
        raise UsageError(f"The sharding must be one of {', '.join(SHARDINGS)}, but got {name!r}.")
    return name


def check_checkpoint_policy(name: str) -> str:
    if name not in CHECKPOINT_POLICIES:
        raise UsageError(f"The checkpoint policy must be one of {', '.join(CHECKPOINT_POLICIES)}, but got {name!r}.")
    return name


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise UsageError(f"The precision must be one of {', '.join(PRECISIONS)}, but got {name!r}.")
    return name


#: A script's own dtype, by the names scripts use for it (nanoGPT's `dtype = 'bfloat16'`, `torch.float16`).
_DTYPE_PRECISIONS = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def precision_of(value: object) -> str:
    """The precision a script declares, as autofit names it: one of PRECISIONS, or a dtype by its torch name
    (`"bfloat16"`, `torch.bfloat16`)."""
    name = str(value).removeprefix("torch.")
    return check_precision(_DTYPE_PRECISIONS.get(name, name))
