"""The search space: which micro-batches, precisions, checkpoint levels and policies, accumulations
and (for distributed probes) shardings to consider."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autofit.config import CHECKPOINT_POLICIES, KNOB, KNOBS, PRECISIONS, SAMPLES, SHARDINGS, TOKENS, Config, Rate
from autofit.errors import UsageError
from autofit.knobs import label
from autofit.planner._loader_rule import LoaderChoices
from autofit.planner._recompute import checkpoint_policy

#: Precisions ranked by the memory their activations take (higher = more memory).
MEMORY_RANK = {"fp32": 2, "tf32": 2, "bf16": 1, "fp16": 1}


def nice_batch_sizes(low: int, high: int) -> list[int]:
    """Powers of two and 1.5x powers of two in [low, high], plus both ends: ~2 sizes per octave."""
    values = {low, high}
    power = 1
    while power <= high:
        for v in (power, power * 3 // 2):
            if low <= v <= high:
                values.add(v)
        power *= 2
    return sorted(values)


def divisors_in(n: int, low: int, high: int) -> list[int]:
    return [d for d in range(max(1, low), min(n, high) + 1) if n % d == 0]


def token_caps(declared: tuple[int, int], longest: int) -> tuple[int, int]:
    """The token caps to climb for a function that batches by tokens (run.token_batches): from the
    longest sample up (a lower cap would not bound a batch that holds it, and the ladder's first rung is
    the data's worst case, that sample alone at the cap) within the `declared` range."""
    low, high = declared
    if longest > high:
        raise UsageError(f"The token range must reach the longest sample ({longest} tokens), but got {low}:{high}.")
    return max(low, longest), high


def checkpoint_levels(blocks: int | None) -> list[int]:
    """0, about a quarter, half, and all of the blocks (distinct values)."""
    if not blocks:
        return [0]
    return sorted({0, max(1, round(blocks / 4)), max(1, round(blocks / 2)), blocks})


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """Everything but the micro-batch: within one strategy, memory rises with batch size."""

    precision: str
    checkpoint_segments: int = 0
    accumulation_steps: int | None = None  # None: derived from the global batch
    sharding: str = "ddp"
    compile: bool = False
    checkpoint_policy: str = "full"
    """"full" or "selective" (see CHECKPOINT_POLICIES); "full" when no block is checkpointed."""

    def label(self) -> str:
        """The label of its configs without their size (the knobs' own words: autofit.knobs)."""
        return label(self, KNOBS)

    @property
    def family(self) -> tuple[str, str, bool]:
        """Strategies whose memory is ordered by checkpointing alone (rule 1 of the planner; see
        `needs_no_more_memory`)."""
        return self.precision, self.sharding, self.compile


@dataclass(frozen=True)
class SearchSpace:
    """Sizes × strategies, with the global-batch rule applied. The sizes are micro-batches, or token caps
    (`max_tokens`) for a function that batches by tokens (`tokens`): `Config.size` either way."""

    batch_sizes: tuple[int, ...]
    precisions: tuple[str, ...]
    checkpoint_segments: tuple[int, ...] = (0,)
    accumulations: tuple[int, ...] = (1,)
    global_batch: int | None = None
    shardings: tuple[str, ...] = ("ddp",)
    compiles: tuple[bool, ...] = (False,)
    """(False,): eager only; (False, True): the function offers run.compile(), both are probed."""
    loader: LoaderChoices = LoaderChoices()
    """The loader settings to try on the leader (none: the function does not offer run.loader())."""
    checkpoint_policies: tuple[str, ...] = ("full",)
    """What the checkpointed levels recompute: ("full",), or with "selective" too, both are probed."""
    tokens: bool = False
    """The sizes are token caps (run.token_batches): each config's `max_tokens`, no cap on its samples."""
    global_tokens: int | None = None
    """By tokens: the real tokens per optimizer step, all ranks together, that the run keeps
    (`@autofit(global_tokens=N)`, which sets the accumulation from the data); None: not held."""
    longest_sample: int | None = None
    """By tokens: the data's longest sample (its batch is a cap's worst; the squares rule caps the others'
    squares at its batch's)."""
    variants: tuple[str, ...] = ()
    """The knobs that change speed and not what fits (autofit.knobs' order "compute") the function offers:
    each tried on the leader (rule 11)."""

    @property
    def offered(self) -> frozenset[str]:
        """The knobs' offers (autofit.knobs) this space considers: what the function offered and the
        search may change, with more than one value to try."""
        return frozenset(name for name, considered in (
            ("distribute", self.shardings != ("ddp",)), ("compile", True in self.compiles),
            ("loader", self.loader.offered), ("selective", "selective" in self.checkpoint_policies),
            ("tokens", self.tokens)) if considered) | {KNOB[name].offer for name in self.variants}

    @classmethod
    def build(
        cls,
        *,
        batch_range: tuple[int, int],
        precisions: tuple[str, ...],
        checkpoint_blocks: int | None = None,
        use_checkpoint: bool = True,
        global_batch: int | None = None,
        accumulations: tuple[int, ...] | None = None,
        shardings: tuple[str, ...] = ("ddp",),
        compiles: tuple[bool, ...] = (False,),
        loader: LoaderChoices | None = None,
        checkpoint_policies: tuple[str, ...] = ("full",),
        token_range: tuple[int, int] | None = None,
        first_precision: str | None = None,
        global_tokens: int | None = None,
        longest_sample: int | None = None,
        variants: tuple[str, ...] = (),
        considered: Mapping[str, tuple[str, ...]] | None = None,
    ) -> SearchSpace:
        """`token_range`: batches by tokens, the caps to climb (the batch range and global batch then
        do not apply, `global_tokens` does). `first_precision`: the precision the first strategy (the
        planner's pilot) runs, the device's first guess; the others follow in `PRECISIONS`' order.
        `considered`: the values of the knobs a search takes lists of, by name (SearchOptions.considered),
        over `shardings` and `checkpoint_policies`; a knob absent there: its default alone for sharding."""
        if considered is not None:
            shardings = considered.get("sharding", ("ddp",))
            checkpoint_policies = considered.get("checkpoint_policy", checkpoint_policies)
        low, high = token_range or batch_range
        if token_range is not None:
            sizes, global_batch = nice_batch_sizes(low, high), None
        elif global_batch is not None:
            sizes = divisors_in(global_batch, low, high)
            if not sizes:
                raise UsageError(
                    f"The global batch must be divisible by a batch size in {low}:{high}, "
                    f"but {global_batch} has no divisor there."
                )
            accumulations = (1,)
        else:
            sizes = nice_batch_sizes(low, high)
        if not precisions:
            raise UsageError("The precision list must not be empty.")
        levels = checkpoint_levels(checkpoint_blocks) if use_checkpoint else [0]
        return cls(
            batch_sizes=tuple(sizes),
            precisions=tuple(sorted((p for p in PRECISIONS if p in precisions), key=lambda p: p != first_precision)),
            checkpoint_segments=tuple(levels),
            accumulations=tuple(sorted(set(accumulations or (1,)))),
            global_batch=global_batch,
            shardings=tuple(h for h in SHARDINGS if h in shardings) or ("ddp",),
            compiles=tuple(sorted(set(compiles))) or (False,),
            loader=loader or LoaderChoices(),
            checkpoint_policies=tuple(q for q in CHECKPOINT_POLICIES if q in checkpoint_policies and levels != [0])
            or ("full",),
            tokens=token_range is not None,
            global_tokens=global_tokens if token_range is not None else None,
            longest_sample=longest_sample if token_range is not None else None,
            variants=tuple(variants),
        )

    def strategies(self) -> list[Strategy]:
        accs = (None,) if self.global_batch else self.accumulations
        return [Strategy(precision=p, checkpoint_segments=k, accumulation_steps=a, sharding=h, compile=c,
                         checkpoint_policy=q)
                for c in self.compiles for h in self.shardings for p in self.precisions
                for k in self.checkpoint_segments for q in (self.checkpoint_policies if k else ("full",))
                for a in accs]

    def config(self, strategy: Strategy, size: int) -> Config:
        if self.global_batch:
            accumulation = self.global_batch // size
        else:
            accumulation = strategy.accumulation_steps or 1
        return Config(batch_size=size, precision=strategy.precision,
                      checkpoint_segments=strategy.checkpoint_segments, accumulation_steps=accumulation,
                      sharding=strategy.sharding, compile=strategy.compile,
                      checkpoint_policy=checkpoint_policy(strategy), max_tokens=size if self.tokens else None)

    @property
    def ranked_by(self) -> Rate:
        """The throughput its configs rank by (`Config.ranked_by`): real tokens/s by tokens, else samples/s."""
        return TOKENS if self.tokens else SAMPLES

    def holds_kind(self, config: Config) -> bool:
        """`config` sized as this space's are (by tokens or by samples): only those compare with them."""
        return (config.max_tokens is not None) == self.tokens

    def admits(self, config: Config) -> bool:
        """Whether `config` is one this space asks for, its loader or squares variant included: the same
        global batch (or one of its accumulations), one of its precisions, shardings, compiles, checkpoint
        levels and policies, a size within its range. A resumed study's probes of other settings are not."""
        if not self.holds_kind(config):
            return False
        if self.global_batch is not None and config.global_batch != self.global_batch:
            return False
        if self.global_batch is None and not self.tokens and config.accumulation_steps not in self.accumulations:
            return False
        return (config.precision in self.precisions and config.sharding in self.shardings
                and config.compile in self.compiles and config.checkpoint_segments in self.checkpoint_segments
                and (not config.checkpoint_segments or config.checkpoint_policy in self.checkpoint_policies)
                and min(self.batch_sizes) <= config.size <= max(self.batch_sizes))

    def configs(self) -> list[Config]:
        return [self.config(s, b) for s in self.strategies() for b in self.batch_sizes]

    def strategy_of(self, config: Config) -> Strategy:
        acc = None if self.global_batch else config.accumulation_steps
        return Strategy(precision=config.precision, checkpoint_segments=config.checkpoint_segments,
                        accumulation_steps=acc, sharding=config.sharding, compile=config.compile,
                        checkpoint_policy=checkpoint_policy(config))

    def contains(self, config: Config) -> bool:
        return config in set(self.configs())

    def to_dict(self) -> dict:
        return {
            "batch_sizes": list(self.batch_sizes),
            "precisions": list(self.precisions),
            "checkpoint_segments": list(self.checkpoint_segments),
            "accumulations": list(self.accumulations),
            "global_batch": self.global_batch,
            "shardings": list(self.shardings),
            **({"compiles": list(self.compiles)} if self.compiles != (False,) else {}),
            **({"loader": {"workers": list(self.loader.workers), "pin_memory": list(self.loader.pin_memory),
                           "prefetch_factors": list(self.loader.prefetch_factors),
                           "declared_workers": self.loader.declared_workers}} if self.loader.offered else {}),
            **({"checkpoint_policies": list(self.checkpoint_policies)}
               if self.checkpoint_policies != ("full",) else {}),
            **({"tokens": True} if self.tokens else {}),
            **({"global_tokens": self.global_tokens} if self.global_tokens is not None else {}),
            **({"longest_sample": self.longest_sample} if self.longest_sample is not None else {}),
            **({"variants": list(self.variants)} if self.variants else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> SearchSpace:
        return cls(
            batch_sizes=tuple(data["batch_sizes"]),
            precisions=tuple(data["precisions"]),
            checkpoint_segments=tuple(data.get("checkpoint_segments", (0,))),
            accumulations=tuple(data.get("accumulations", (1,))),
            global_batch=data.get("global_batch"),
            shardings=tuple(data.get("shardings", ("ddp",))),
            compiles=tuple(bool(c) for c in data.get("compiles", (False,))),
            loader=_loader_choices(data.get("loader")),
            checkpoint_policies=tuple(data.get("checkpoint_policies", ("full",))),
            tokens=bool(data.get("tokens", False)),
            global_tokens=data.get("global_tokens"),
            longest_sample=data.get("longest_sample"),
            variants=tuple(data.get("variants", ())),
        )


def _loader_choices(data: dict | None) -> LoaderChoices:
    if not data:
        return LoaderChoices()
    return LoaderChoices(workers=tuple(int(w) for w in data["workers"]),
                         pin_memory=tuple(bool(p) for p in data.get("pin_memory", ())),
                         prefetch_factors=tuple(int(p) for p in data.get("prefetch_factors", ())),
                         declared_workers=int(data.get("declared_workers", 0)))
