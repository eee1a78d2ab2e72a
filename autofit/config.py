"""One candidate training configuration, and the precisions autofit knows."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autofit.errors import UsageError
from autofit.knobs import Knob, knob, knobs, label, required_knob

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

#: The multiples a search pads variable lengths to (`Config.pad_multiple`): a GPU's tile (8) and a coarse bucket
#: (64: a length of up to 1024 in 16 shapes).
PAD_MULTIPLES: tuple[int, ...] = (8, 64)

#: The kernels of `scaled_dot_product_attention` (torch.nn.attention.SDPBackend's, by their short names).
SDPA_BACKENDS: tuple[str, ...] = ("math", "flash", "efficient", "cudnn")


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


@dataclass(frozen=True, kw_only=True)
class Config:
    """The settings one probe (or the real run) trains under. Each field is a knob (autofit.knobs), declared
    here once, in the order a config's label names them; keyword-only, so a field inserted breaks nothing."""

    precision: str = knob(
        default="fp32", kind=str, choices=PRECISIONS, stored=True, offer="autocast", order="memory",
        label=lambda value, item: value,
        help="Numeric precision of the whole step (forward, backward and optimizer: autocast, TF32, fp16 loss "
             "scaling).")
    """fp32, tf32 (TF32 matmuls, CUDA only), bf16 or fp16 (autocast; fp16 adds loss scaling)."""
    max_tokens: int | None = knob(
        kind=int, optional=True, minimum=1, offer="longest_sample", order="size",
        label=lambda value, item: None if value is None else f"max_tokens={value}",
        help="Token cap of a micro-batch of run.token_batches() (its samples x its longest).")
    """Token batching (run.token_batches): a micro-batch's padded tokens (samples x its longest) at
    most, in place of a fixed sample count; memory follows the cap, not the longest sample. None: a
    micro-batch of `batch_size` samples. With it, `batch_size` is the most samples a micro-batch holds."""
    max_squares: int | None = knob(
        # 2**50 at most as a trial param: Optuna keeps integers as floats, exact below 2**53.
        kind=int, optional=True, minimum=1, maximum=2**50, offer="longest_sample", order="size", none_param=0,
        label=lambda value, item: None if value is None else f"max_squares={value}",
        help="With --max-tokens: a squares cap too (a micro-batch's samples x its longest², per-length caps).")
    """Token batching only: a micro-batch's padded squares (samples x its longest², what an attention that
    is not fused holds per head and layer) at most, beside `max_tokens`: the long batches are held by it,
    so the short ones may hold more tokens than a cap set at the longest length (a per-length cap, as
    2-D buckets are). None: `max_tokens` alone."""
    batch_size: int = required_knob(
        kind=int, minimum=1, stored=True, order="size",
        label=lambda value, item: f"b={value}" if item.max_tokens is None or value < item.max_tokens else None,
        help="Micro-batch size (with --max-tokens: the most samples a micro-batch holds; default: no cap).")
    """Micro-batch: samples per forward/backward. Larger is faster until memory runs out."""
    checkpoint_segments: int = knob(
        default=0, kind=int, minimum=0, stored=True, offer="checkpoint_blocks", order="memory", lever=True,
        label=lambda value, item: f"ckpt={value}" if value else None,
        help="Blocks (of those the function offers to run.checkpoint()) that recompute their activations.")
    """Blocks that recompute activations in backward: less memory, more compute."""
    checkpoint_policy: str = knob(
        default="full", kind=str, choices=CHECKPOINT_POLICIES, offer="checkpoint_blocks", order="memory",
        needs="checkpoint_segments", lever=True,
        label=lambda value, item: value if item.checkpoint_segments and value != "full" else None,
        help="What the checkpointed blocks recompute: all of their forward, or all but matmuls and attention.",
        consider="Checkpoint policies to consider when the function offers run.checkpoint(), e.g. full "
                 "(default: full,selective).")
    """What the checkpointed blocks recompute (see CHECKPOINT_POLICIES): "selective" keeps the matmul,
    convolution and attention outputs, so it saves less memory than "full" for little recompute."""
    offload_activations: bool = knob(
        default=False, kind=bool, offer="checkpoint_blocks", order="memory", words="activation offload", lever=True,
        label=lambda value, item: "act-offload" if value else None,
        help="The blocks offered to run.checkpoint() keep what backward needs in pinned host memory (not on the GPU).",
        supported=lambda device: (False,) if device == "cpu" else (False, True),
        unsupported="it moves what the blocks save for backward off an accelerator into the host's memory, "
                    "where a CPU's is already.")
    """Every block offered to run.checkpoint() saves the tensors its backward needs in pinned host memory
    (PyTorch's `save_on_cpu`), copied back in backward: device memory for host transfers, which can let a
    larger micro-batch fit or cost more time than it saves, so the search measures it (climbed by memory,
    as checkpointing is). A checkpointed block saves only its inputs, which go to the host too."""
    accumulation_steps: int = knob(
        default=1, kind=int, minimum=1, stored=True, offer="backward", order="memory", flag="--accumulation",
        label=lambda value, item: f"acc={value}" if value and value > 1 else None,
        help="Micro-batches per optimizer step.")
    """Micro-batches per optimizer step: keeps the global batch while the micro-batch shrinks."""
    sharding: str = knob(
        default="ddp", kind=str, choices=SHARDINGS, offer="shard_blocks", order="memory",
        label=lambda value, item: value if value != "ddp" else None,
        help="With --nproc-per-node: how run.distribute(model, blocks=...) holds the model.",
        consider="With --nproc-per-node: shardings to consider, e.g. ddp,fsdp (default: all three when the "
                 "function offers its blocks to run.distribute).",
        ranks=True, supported=lambda device: device_shardings(device),
        unsupported="FSDP2's offload keeps the model in pinned host memory for an accelerator; on the CPU there "
                    "is nothing to offload to.")
    """Distributed runs only: ddp, fsdp or fsdp-offload (see SHARDINGS)."""
    compile: bool = knob(
        default=False, kind=bool, offer="compile", order="memory",
        label=lambda value, item: "compiled" if value else None,
        help="torch.compile the model the function offers to run.compile().")
    """torch.compile the model the function offers through run.compile() (eager when False)."""
    channels_last: bool = knob(
        default=False, kind=bool, offer="channels_last", order="compute",
        label=lambda value, item: "channels-last" if value else None,
        help="The model offered to run.channels_last() in channels-last memory format (convolutions in NHWC).")
    """Convolution models: the weights, and so the activations, in channels-last memory format, which the
    fastest convolution kernels (cuDNN's, oneDNN's) take; tried on the leader, as a change of speed."""
    pad_multiple: int | None = knob(
        kind=int, optional=True, minimum=1, choices=PAD_MULTIPLES, offer="pad_multiple", order="compute",
        label=lambda value, item: None if value is None else f"pad={value}",
        help="The multiple a batch's padded length rounds up to (run.pad_multiple, read by the function's collate).")
    """Variable lengths: each batch padded to a multiple of this many tokens (None: to its longest), so an epoch
    meets a handful of shapes, not one per batch. A new shape costs time where a library builds something for
    it (cuDNN's attention graphs, oneDNN's primitives) and memory where it keeps that; padding costs compute.
    Tried on the leader, as a change of speed; by tokens the cap counts the padded length."""
    sdpa_backend: str | None = knob(
        kind=str, optional=True, choices=SDPA_BACKENDS, offer="sdpa_backends", order="compute",
        label=lambda value, item: None if value is None else f"sdpa={value}",
        help="The kernel of scaled_dot_product_attention (torch.nn.attention.sdpa_kernel; default: PyTorch's choice).",
        supported=lambda device: ("math", "flash") if device == "cpu" else SDPA_BACKENDS,
        unsupported="a CPU runs the math and flash kernels only.")
    """The attention kernel every scaled_dot_product_attention call of the run prefers (math where it cannot run
    a call); None: PyTorch's own choice. Kernels differ in speed by dtype, shape and GPU, and some build a plan
    per shape: tried on the leader, the kernels the function's calls can run only."""
    # The input pipeline (run.loader); None: as the script declares it (else DataLoader's default).
    loader_workers: int | None = knob(
        kind=int, optional=True, minimum=0, choices=(0, 1, 2, 4, 8), offer="loader", order="input",
        label=lambda value, item: None if value is None else f"loader-workers={value}",
        help="DataLoader workers of run.loader() (default: as the script declares).")
    """DataLoader worker processes: batches load in parallel with the step, for CPU cores and memory
    (each worker holds a copy of the dataset object); 0 loads in the training process itself."""
    pin_memory: bool | None = knob(
        kind=bool, optional=True, offer="loader", order="input",
        label=lambda value, item: None if value is None else ("pinned" if value else "unpinned"),
        help="Pinned host batches in run.loader() (default: as the script declares).")
    """Page-locked host batches: faster, asynchronous copies to a GPU, for host memory that cannot be
    swapped out (no gain on the CPU)."""
    prefetch_factor: int | None = knob(
        kind=int, optional=True, minimum=1, choices=(2, 4), offer="loader", order="input",
        label=lambda value, item: None if value is None else f"prefetch={value}",
        help="Batches each run.loader() worker loads ahead (default: as the script declares).")
    """Batches each worker loads ahead (workers > 0 only): absorbs uneven loading times, for host memory."""

    def __post_init__(self) -> None:
        for declared in KNOBS:
            declared.check(getattr(self, declared.name))
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
        """The knobs' values; those not `stored` always only when not their default, so that single-process,
        eager, fully checkpointed configs (and every study recorded before a knob existed) keep their form."""
        return {k.name: value for k in KNOBS if k.held(value := getattr(self, k.name))}

    @classmethod
    def from_dict(cls, data: dict) -> Config:
        """A config from its JSON, or from a trial's params (where None is each knob's `none_param`)."""
        return cls(**{declared.name: declared.from_json(data) for declared in KNOBS})

    @property
    def loader(self) -> dict:
        """The loader fields this config sets (empty: the loader as the script declares it)."""
        return {name: getattr(self, name) for name in LOADER_FIELDS if getattr(self, name) is not None}

    def label(self) -> str:
        """Short human form, every knob that is not its default: 'bf16 b=64 ckpt=2 selective acc=4'
        ('bf16 max_tokens=4096' by tokens). The one name of a config in every table, plot and line."""
        return label(self, KNOBS)


#: The knobs, in their label's order.
KNOBS: tuple[Knob, ...] = knobs(Config)
#: The knobs by name.
KNOB: dict[str, Knob] = {k.name: k for k in KNOBS}
#: The knobs whose values a search may be told to consider (`--sharding ddp,fsdp`): `SearchOptions.consider`.
CONSIDERED: tuple[Knob, ...] = tuple(k for k in KNOBS if k.consider)
#: The Config fields of the input pipeline (run.loader), None unless a config sets them.
LOADER_FIELDS: tuple[str, ...] = tuple(k.name for k in KNOBS if k.offer == "loader")
#: The worker counts a search tries (those within the cores a probe may load with: autofit.planner's
#: `worker_counts`).
LOADER_WORKERS: tuple[int, ...] = KNOB["loader_workers"].choices
#: Prefetch depths per worker: DataLoader's default and one further ahead.
LOADER_PREFETCH: tuple[int, ...] = KNOB["prefetch_factor"].choices


def check_loader(workers: int | None, prefetch: int | None) -> None:
    """Prefetching needs workers to load ahead in."""
    if prefetch is not None and workers == 0:
        raise UsageError("The prefetch factor needs loader workers (batches load ahead in workers), "
                         "but got 0 workers.")


def check_max_tokens(max_tokens: int | None, batch_size: int) -> None:
    """The samples' cap within a token cap (each sample holds a
    token at least, so a larger one could never bind)."""
    if max_tokens is not None and batch_size > max_tokens:
        raise UsageError(f"The batch size (the most samples a token batch holds) must be at most the max tokens "
                         f"({max_tokens}), but got {batch_size}.")


def check_max_squares(max_squares: int | None, max_tokens: int | None) -> None:
    """A squares cap beside a token cap (it bounds batches by tokens)."""
    if max_squares is not None and max_tokens is None:
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


def front_corners(front) -> list[tuple[int, int]]:
    """The points of a (padded tokens, padded squares) front that some memory of the form a x tokens + b x
    squares (a, b >= 0) is worst at: the corners of its hull toward more of both, fewest tokens first. Every
    other point of the front lies under the segment between two corners, so a batch there needs no more than
    the worse of those two, whatever the model's mix."""
    corners: list[tuple[int, int]] = []
    for point in sorted({(int(t), int(s)) for t, s in front}):
        while len(corners) >= 2 and _turn(corners[-2], corners[-1], point) >= 0:
            corners.pop()  # under (or on) the segment from the corner before it to this point
        corners.append(point)
    return corners


def under_front(front, tokens: int, squares: int) -> bool:
    """Whether a batch of `tokens` padded tokens and `squares` padded squares is under the front's hull (no
    larger in both than a mix of two of its corners): its memory is then at most the worse corner's."""
    corners = front_corners(front)
    if not corners or tokens > corners[-1][0] or squares > corners[0][1]:
        return False
    if tokens <= corners[0][0]:
        return True
    for (x1, y1), (x2, y2) in zip(corners, corners[1:]):
        if x1 <= tokens <= x2:
            return (squares - y1) * (x2 - x1) <= (y2 - y1) * (tokens - x1)
    return False


def _turn(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
    """Positive when o -> a -> b turns left (b above the line through o and a, for x rising)."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def widest_envelope(envelopes) -> dict | None:
    """Token envelopes (their records' dicts: a probe's knobs, the best-config file's) as one: each measure's
    largest, the Pareto front of the micro-batches they ran (`front`, where they hold one), and the per-shape
    caches' capacities they ran under (`caches`, where recorded). Kept here, on
    plain dicts, so the processes that import no torch merge them as the run does."""
    envelopes = [e for e in envelopes if e]
    if not envelopes:
        return None
    merged = {key: max(int(e[key]) for e in envelopes) for key in ("longest_sample", "padded_tokens", "padded_squares")}
    fronts = [tuple(point) for e in envelopes for point in e.get("front") or ()]
    caches = next((e["caches"] for e in envelopes if e.get("caches")), None)  # the same in every probe of a search
    return {**merged, **({"front": [list(p) for p in pareto_front(fronts)]} if fronts else {}),
            **({"caches": dict(caches)} if caches else {})}


def device_shardings(device_type: str) -> tuple[str, ...]:
    """The shardings a device type can run: offloading needs an accelerator to offload from."""
    return SHARDINGS if device_type != "cpu" else tuple(h for h in SHARDINGS if h != "fsdp-offload")


def check_sharding(name: str) -> str:
    KNOB["sharding"].check(name)
    return name


def check_checkpoint_policy(name: str) -> str:
    KNOB["checkpoint_policy"].check(name)
    return name


def check_precision(name: str) -> str:
    KNOB["precision"].check(name)
    return name


#: A script's own dtype, by the names scripts use for it (nanoGPT's `dtype = 'bfloat16'`, `torch.float16`).
_DTYPE_PRECISIONS = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def precision_of(value: object) -> str:
    """The precision a script declares, as autofit names it: one of PRECISIONS, or a dtype by its torch name
    (`"bfloat16"`, `torch.bfloat16`)."""
    name = str(value).removeprefix("torch.")
    return check_precision(_DTYPE_PRECISIONS.get(name, name))
