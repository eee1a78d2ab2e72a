"""How configs (or strategies) order by what they keep of the forward: the memory a checkpoint level
and policy needs, the recompute it costs, and whether accumulation holds gradients through a forward.
Pure functions of a config's fields, read by the space, the feasibility rules and the ranking."""

from __future__ import annotations

from autofit.config import KNOBS

#: The knobs of a strategy whose memory order these rules know (checkpointing, accumulation): strategies that
#: differ in them alone are one family (`Strategy.family`), compared by `needs_no_more_memory`; any other
#: knob of order "memory" makes a family of its own, compared with no other.
ORDERED_BY_RULES = ("checkpoint_segments", "checkpoint_policy", "accumulation_steps")
#: The memory levers (autofit.knobs' `lever`: the checkpointed blocks and their policy, activation offload): away
#: from their defaults they trade speed for memory and nothing else (rule 12).
LEVERS = tuple(k for k in KNOBS if k.lever)
#: The levers rule 1's order does not know: each makes a family of its own, and has priors of its own.
OTHER_LEVERS = tuple(k for k in LEVERS if k.name not in ORDERED_BY_RULES)


def without_levers(strategy):
    """`strategy` (a Strategy) with every memory lever at its default: what its levers save memory for."""
    return strategy.replaced(**{k.name: k.default for k in LEVERS})


def pulls_a_lever(item) -> bool:
    """Whether a Config or Strategy sets a memory lever away from its default (where it acts)."""
    return any(k.acting(item) != k.default for k in LEVERS)


def checkpoint_policy(item) -> str:
    """The checkpoint policy of a Config or Strategy as it acts: "full" where no block is checkpointed
    (the policy then changes nothing), so such configs share one strategy and one memory curve."""
    return item.checkpoint_policy if item.checkpoint_segments else "full"


def needs_no_more_memory(a, b) -> bool:
    """Whether `a` needs no more memory than `b` at the same micro-batch, both of one family (Configs
    or Strategies): rule 1's order by checkpointing. More blocks under one policy need less; at as
    many blocks or more, full checkpointing needs less than selective, which needs less than none.
    Selective with more blocks than full compares with it neither way: unknown, never implied."""
    ka, kb = a.checkpoint_segments, b.checkpoint_segments
    if kb == 0:
        return True
    if ka < kb:
        return False
    pa, pb = checkpoint_policy(a), checkpoint_policy(b)
    return pa == pb or pa == "full"


def holds_gradients(item) -> bool:
    """Whether a Config or Strategy keeps gradients alive through a forward: accumulating keeps the earlier
    micro-batches' through the next one's, while with one micro-batch a step none are (zero_grad freed
    them), so that needs no more memory at one micro-batch, and perhaps less at a larger one. Every
    accumulation above one holds the same; a strategy whose accumulation follows the global batch
    (None) accumulates below it and counts as accumulating."""
    return item.accumulation_steps is None or item.accumulation_steps > 1


def recomputes_no_more(a, b) -> bool:
    """Whether `a` recomputes no more of the forward than `b` (rule 3's order by checkpointing):
    none recomputes nothing; selective on as many blocks or fewer recomputes less than full; one
    policy on fewer blocks, less than on more. The memory order reversed: what keeps more of the forward
    recomputes less of it."""
    return needs_no_more_memory(b, a)
