"""The search space: the sizes to climb (micro-batches, or token caps) and the values of each knob to try,
derived from the knobs' declarations (autofit.knobs): a strategy is a config without its size, one value
of each knob of order "memory"; the loader's settings and the compute knobs are tried on the leader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import product
from typing import Any

from autofit.config import KNOBS, MAX_BATCH, SAMPLES, TOKENS, Config, Rate
from autofit.errors import UsageError
from autofit.knobs import Knob, label
from autofit.planner._loader_rule import LoaderChoices
from autofit.planner._recompute import ORDERED_BY_RULES

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


#: The knobs a strategy holds (order "memory": the size a config fits at moves with them), in their
#: declaration's order: a search's product of their values, each climbed by size.
STRATEGY_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.order == "memory")
_STRATEGY_NAMES = tuple(k.name for k in STRATEGY_KNOBS)
#: A stored space's keys for its knobs' values before the space was derived from the declarations.
_OLD_KEYS = {"precision": "precisions", "accumulation_steps": "accumulations", "sharding": "shardings",
             "compile": "compiles", "checkpoint_policy": "checkpoint_policies"}


class Strategy:
    """A config without its size: one value of each knob of STRATEGY_KNOBS (a knob not given: its default;
    the accumulation None where the global batch derives it). Within one strategy, memory rises with size.
    Read a knob as an attribute (`strategy.precision`); equal, and hashed, by its values."""

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(_STRATEGY_NAMES)
        if unknown:
            raise TypeError(f"A strategy holds the knobs {', '.join(_STRATEGY_NAMES)}, "
                            f"not {', '.join(sorted(unknown))}.")
        object.__setattr__(self, "_values", tuple(values.get(k.name, k.default) for k in STRATEGY_KNOBS))

    def __getattr__(self, name: str) -> Any:
        if name in _STRATEGY_NAMES:
            return self._values[_STRATEGY_NAMES.index(name)]
        raise AttributeError(name)

    def __reduce__(self) -> tuple:
        return _strategy, (self.items(),)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("A strategy is frozen: `replaced` makes another.")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._values)

    def __repr__(self) -> str:
        return f"Strategy({', '.join(f'{n}={v!r}' for n, v in self.items())})"

    def items(self) -> tuple[tuple[str, Any], ...]:
        """(knob name, value) of each knob it holds, in the declaration's order."""
        return tuple(zip(_STRATEGY_NAMES, self._values))

    def replaced(self, **values: Any) -> Strategy:
        return Strategy(**{**dict(self.items()), **values})

    def label(self) -> str:
        """The label of its configs without their size (the knobs' own words: autofit.knobs)."""
        return label(self, KNOBS)

    @property
    def family(self) -> tuple:
        """Strategies whose memory is ordered by the planner's rules alone (rule 1: checkpointing and
        accumulation; see `needs_no_more_memory`): every other knob's value."""
        return tuple(v for n, v in self.items() if n not in ORDERED_BY_RULES)


def _strategy(items: tuple[tuple[str, Any], ...]) -> Strategy:
    """A strategy from its `items()` (how one is pickled and copied)."""
    return Strategy(**dict(items))


def size_axis(batch_range: tuple[int, int], token_range: tuple[int, int] | None,
              global_batch: int | None) -> tuple[tuple[int, ...], int | None]:
    """The sizes to climb and the global batch they keep: token caps (no global batch), the divisors of
    the global batch within the batch range, or micro-batches about two an octave."""
    low, high = token_range or batch_range
    if token_range is not None or global_batch is None:
        return tuple(nice_batch_sizes(low, high)), None
    sizes = divisors_in(global_batch, low, high)
    if not sizes:
        raise UsageError(f"The global batch must be divisible by a batch size in {low}:{high}, "
                         f"but {global_batch} has no divisor there.")
    return tuple(sizes), global_batch


@dataclass(frozen=True)
class SearchSpace:
    """Sizes × strategies, with the global-batch rule applied. The sizes are micro-batches, or token caps
    (`max_tokens`) for a function that batches by tokens (`tokens`): `Config.size` either way."""

    batch_sizes: tuple[int, ...]
    knobs: tuple[tuple[str, tuple], ...] = ()
    """Each knob of STRATEGY_KNOBS with the values to try, the pilot's first: (name, values) in the
    declaration's order (a mapping is taken too; a knob absent: its default alone)."""
    global_batch: int | None = None
    loader: LoaderChoices = field(default_factory=LoaderChoices)
    """The loader settings to try on the leader (none: the function does not offer run.loader())."""
    tokens: bool = False
    """The sizes are token caps (run.token_batches): each config's `max_tokens`, no cap on its samples."""
    global_tokens: int | None = None
    """By tokens: the real tokens per optimizer step, all ranks together, that the run keeps
    (`@autofit(global_tokens=N)`, which sets the accumulation from the data); None: not held."""
    longest_sample: int | None = None
    """By tokens: the data's longest sample (its batch is a cap's worst; the squares rule caps the others'
    squares at its batch's)."""
    variants: tuple[tuple[str, tuple], ...] = ()
    """The knobs that change speed and not what fits (autofit.knobs' order "compute") the function offers, each
    with its values to try (a knob given by its name alone: every value it declares but its default): each tried
    on the leader (rule 11)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", tuple(_variant(item) for item in self.variants))
        given = dict(self.knobs)
        unknown = set(given) - set(_STRATEGY_NAMES)
        if unknown:
            raise TypeError(f"A search space holds the values of {', '.join(_STRATEGY_NAMES)}, "
                            f"not of {', '.join(sorted(unknown))}.")
        object.__setattr__(self, "knobs", tuple((k.name, tuple(dict.fromkeys(given.get(k.name) or (k.default,))))
                                                for k in STRATEGY_KNOBS))

    def values_of(self, name: str) -> tuple:
        """The values of knob `name` (one of STRATEGY_KNOBS) this space tries."""
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, tuple]:
        return dict(self.knobs)

    @property
    def offered(self) -> frozenset[str]:
        """The knobs' offers (autofit.knobs' Offers fields) this space considers: what the function offered
        and the search may change (a knob's values other than its default alone; the leader's variants). A
        `stored` knob is a trial param of every study anyway: its offer is left to the others that share it."""
        held = {k.offer for k in STRATEGY_KNOBS if not k.stored and self.values_of(k.name) != (k.default,)}
        return frozenset(held | {k.offer for k in KNOBS if (k.order == "input" and self.loader.offered)
                                 or k.name in dict(self.variants) or (k.order == "size" and k.offer and self.tokens)})

    @classmethod
    def build(cls, *, batch_range: tuple[int, int] = (1, MAX_BATCH), token_range: tuple[int, int] | None = None,
              global_batch: int | None = None, global_tokens: int | None = None, longest_sample: int | None = None,
              loader: LoaderChoices | None = None, variants: tuple = (), **values: tuple) -> SearchSpace:
        """The space of `values` (each knob of STRATEGY_KNOBS by name: the values to try, the pilot's first)
        over the sizes of `size_axis`. `token_range`: batches by tokens, the caps to climb (the batch range and
        global batch then do not apply, `global_tokens` does). A global batch derives each accumulation; a
        knob that `needs` another acts only where that one is set."""
        sizes, global_batch = size_axis(batch_range, token_range, global_batch)
        for knob in STRATEGY_KNOBS:
            if knob.name in values and not values[knob.name]:
                raise UsageError(f"The {knob.in_words} list must not be empty.")
            if knob.needs and not any(values.get(knob.needs, ())):
                values[knob.name] = (knob.default,)
        if global_batch is not None:
            values["accumulation_steps"] = (1,)
        tokens = token_range is not None
        return cls(batch_sizes=sizes, knobs=tuple(values.items()), global_batch=global_batch,
                   loader=loader or LoaderChoices(), tokens=tokens, global_tokens=global_tokens if tokens else None,
                   longest_sample=longest_sample if tokens else None, variants=tuple(variants))

    def strategies(self) -> list[Strategy]:
        """The product of the knobs' values, pilot's first; a knob where it does not act (`needs`) at its
        default, so each strategy comes once."""
        combos = product(*(values for _, values in self.knobs))
        return list(dict.fromkeys(self._strategy(dict(zip(_STRATEGY_NAMES, combo))) for combo in combos))

    def _strategy(self, values: Mapping[str, Any]) -> Strategy:
        acting = {k.name: (values[k.name] if not k.needs or values[k.needs] else k.default) for k in STRATEGY_KNOBS}
        return Strategy(**{**acting, **({"accumulation_steps": None} if self.global_batch else {})})

    def config(self, strategy: Strategy, size: int) -> Config:
        """`strategy` at `size`: its knobs set, the accumulation keeping the global batch where there is one."""
        accumulation = self.global_batch // size if self.global_batch else (strategy.accumulation_steps or 1)
        return Config(batch_size=size, max_tokens=size if self.tokens else None,
                      **{**{k.name: k.acting(strategy) for k in STRATEGY_KNOBS}, "accumulation_steps": accumulation})

    @property
    def ranked_by(self) -> Rate:
        """The throughput its configs rank by (`Config.ranked_by`): real tokens/s by tokens, else samples/s."""
        return TOKENS if self.tokens else SAMPLES

    def holds_kind(self, config: Config) -> bool:
        """`config` sized as this space's are (by tokens or by samples): only those compare with them."""
        return (config.max_tokens is not None) == self.tokens

    def admits(self, config: Config) -> bool:
        """Whether `config` is one this space asks for, its loader, squares or compute variant included: the
        same global batch (or one of its accumulations), one of the values of each knob where it acts, a size
        within its range. A resumed study's probes of other settings are not."""
        if not self.holds_kind(config):
            return False
        if self.global_batch is not None and config.global_batch != self.global_batch:
            return False
        held = [k for k in STRATEGY_KNOBS if (k.name != "accumulation_steps" or not (self.global_batch or self.tokens))
                and (not k.needs or getattr(config, k.needs))]
        return (all(getattr(config, k.name) in self.values_of(k.name) for k in held)
                and min(self.batch_sizes) <= config.size <= max(self.batch_sizes))

    def configs(self) -> list[Config]:
        return [self.config(s, b) for s in self.strategies() for b in self.batch_sizes]

    def strategy_of(self, config: Config) -> Strategy:
        return self._strategy({k.name: getattr(config, k.name) for k in STRATEGY_KNOBS})

    def contains(self, config: Config) -> bool:
        return config in set(self.configs())

    def distribution_args(self) -> dict[str, Any]:
        """The arguments of autofit.study's `distributions` that hold this space's configs as trial params."""
        return {"batch_range": (min(self.batch_sizes), max(self.batch_sizes)),
                "max_checkpoint": max(self.values_of("checkpoint_segments")),
                "max_accumulation": max(self.global_batch or 1, *self.values_of("accumulation_steps")),
                "offered": self.offered,
                "token_range": (min(self.batch_sizes), max(self.batch_sizes)) if self.tokens else None}

    def to_dict(self) -> dict:
        """The space as a study keeps it: each knob's values by its name where they are not its default alone."""
        return {
            "batch_sizes": list(self.batch_sizes), "global_batch": self.global_batch,
            **{k.name: list(v) for k, (_, v) in zip(STRATEGY_KNOBS, self.knobs) if v != (k.default,)},
            **({"loader": {"workers": list(self.loader.workers), "pin_memory": list(self.loader.pin_memory),
                           "prefetch_factors": list(self.loader.prefetch_factors),
                           "declared_workers": self.loader.declared_workers}} if self.loader.offered else {}),
            **({"tokens": True} if self.tokens else {}),
            **({"global_tokens": self.global_tokens} if self.global_tokens is not None else {}),
            **({"longest_sample": self.longest_sample} if self.longest_sample is not None else {}),
            **({"variants": {name: list(values) for name, values in self.variants}} if self.variants else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> SearchSpace:
        """A stored space: this form, or an older one (its knobs' values under their old keys)."""
        knobs = {k.name: tuple(k.kind(v) for v in values) for k in STRATEGY_KNOBS
                 if (values := data.get(k.name, data.get(_OLD_KEYS.get(k.name, k.name)))) is not None}
        return cls(batch_sizes=tuple(data["batch_sizes"]), knobs=tuple(knobs.items()),
                   global_batch=data.get("global_batch"), loader=_loader_choices(data.get("loader")),
                   tokens=bool(data.get("tokens", False)), global_tokens=data.get("global_tokens"),
                   longest_sample=data.get("longest_sample"), variants=tuple(dict(data.get("variants") or {}).items()
                                                                             if isinstance(data.get("variants"), dict)
                                                                             else data.get("variants", ())))


def _variant(item: str | tuple) -> tuple[str, tuple]:
    """A variant as (knob name, its values to try): a name alone (a space stored before the values were kept)
    means every value its knob declares but its default."""
    if isinstance(item, str):
        knob = next(k for k in KNOBS if k.name == item)
        return item, tuple(v for v in knob.trial_values() if v is not None and v != knob.default)
    name, values = item
    return name, tuple(values)


def _loader_choices(data: dict | None) -> LoaderChoices:
    if not data:
        return LoaderChoices()
    return LoaderChoices(workers=tuple(int(w) for w in data["workers"]),
                         pin_memory=tuple(bool(p) for p in data.get("pin_memory", ())),
                         prefetch_factors=tuple(int(p) for p in data.get("prefetch_factors", ())),
                         declared_workers=int(data.get("declared_workers", 0)))
