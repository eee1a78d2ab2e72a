"""The offload's arithmetic decides what leaves at the micro-batch asked, not at the traced ones: the runtime sends
only storages of MIN_OFFLOAD_BYTES or more, and a storage small at the traced sizes passes it at a larger one."""
from __future__ import annotations

from autofit.memory._trace_data import Instance, StepTrace
from autofit.memory._traced_offload import Sent
from autofit.memory._traced_peaks import Layout
from autofit.runtime import MIN_OFFLOAD_BYTES


def _trace(size: int, per_sample: int, movable: bool = True) -> StepTrace:
    """One offloaded block's call that saves one tensor of `per_sample` bytes a sample, and one of a fixed MiB."""
    return StepTrace(size=size, pack_storage=[0, 1], pack_instance=[0, 0], pack_released=[None, None],
                     pack_movable=[movable, movable], pack_nbytes=[size * per_sample, MIN_OFFLOAD_BYTES],
                     instances=[Instance(block=0, first=0, last=1)], blocks=1, offload_min_bytes=MIN_OFFLOAD_BYTES)


def test_a_storage_below_the_threshold_at_the_traced_sizes_leaves_at_a_size_that_passes_it():
    per_sample = MIN_OFFLOAD_BYTES // 5  # 2 and 4 samples: under; 5 and more: over
    small, large = _trace(2, per_sample), _trace(4, per_sample)
    offloaded, kept = Layout(((None, True),)), Layout(((None, False),))
    assert Sent.at(small, large, offloaded, 4).packs == {1}  # the fixed MiB alone
    assert Sent.at(small, large, offloaded, 8).packs == {0, 1}
    assert Sent.at(small, large, kept, 8).packs == frozenset()  # not offloaded: nothing leaves
    checkpointed = Layout((("full", True),))  # a checkpointed block's saves are recomputed: its inputs leave instead
    assert Sent.at(small, large, checkpointed, 8).packs == frozenset()


def test_a_parameter_or_its_cast_never_leaves_however_large():
    small, large = _trace(2, MIN_OFFLOAD_BYTES, movable=False), _trace(4, MIN_OFFLOAD_BYTES, movable=False)
    assert Sent.at(small, large, Layout(((None, True),)), 64).packs == frozenset()
