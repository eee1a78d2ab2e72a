"""The one line a search that exports nothing ends with: what the probes found, and what to do."""

from __future__ import annotations

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.findings import nothing_fits
from autofit.planner import Observation

MIB = 2**20
USABLE, LIMIT = 720 * MIB, 800 * MIB
BUDGET = MemoryBudget(limit_bytes=LIMIT, headroom=0.1, usable_bytes=USABLE)


def test_a_config_that_fit_then_crossed_the_headroom_is_named_with_both_figures():
    """At the edge of the memory a longer measurement can read more than the probe did. With the trials
    spent, the search has nothing that fits, though one config did once: the line says so, and what
    would help, rather than that the smallest config needed less than the memory there is."""
    edge = Config(batch_size=256, checkpoint_segments=2)
    done = [Observation(Config(batch_size=512), "oom"),
            Observation(edge, "ok", peak_bytes=int(715.6 * MIB), rate=10.0),
            Observation(Config(batch_size=384), "ok", peak_bytes=760 * MIB, rate=11.0),
            Observation(edge, "ok", peak_bytes=int(741.6 * MIB), rate=10.0, phase="confirm")]
    line = nothing_fits(done, BUDGET)
    assert "fp32 b=256 ckpt=2 fit in a probe (715.60 MiB) but read 741.60 MiB when measured again" in line
    assert "more --trials or --budget" in line and "\n" not in line


def test_without_such_a_config_the_line_names_the_smallest_config_and_its_need():
    done = [Observation(Config(batch_size=64), "ok", peak_bytes=730 * MIB, rate=5.0), Observation(Config(batch_size=128), "oom")]
    line = nothing_fits(done, BUDGET)
    assert line == ("Nothing fits under 720.00 MiB usable (800.00 MiB limit, 10% headroom): the smallest config "
                    "tried (fp32 b=64) needed 730.00 MiB.")


def test_timeouts_below_one_oom_are_not_said_to_have_run_out_of_memory():
    """Two small configs timed out and one larger ran out of memory: the line once said that the smallest
    config tried (b=1, which timed out) ran out of memory."""
    done = [Observation(Config(batch_size=1), "timeout", wall_s=60.0), Observation(Config(batch_size=2), "timeout",
                                                                                      wall_s=60.0),
            Observation(Config(batch_size=4), "oom")]
    line = nothing_fits(done, BUDGET)
    assert "b=1) ran out of memory" not in line
    assert "the smallest config that ran out of memory was fp32 b=4; none smaller ran to its end" in line
    assert "2 timed out (a slow machine may need a longer --probe-timeout)" in line


def test_timeouts_beside_failures_are_counted_and_get_their_remedy():
    """The "longer --probe-timeout" hint once could never print: the failures it looked among exclude timeouts."""
    done = [Observation(Config(batch_size=1), "timeout", wall_s=60.0), Observation(Config(batch_size=2), "error")]
    line = nothing_fits(done, BUDGET)
    assert line.startswith("No config could be measured: 2 probes failed (raised an error, timed out)")
    assert "the smallest tried was fp32 b=1" in line and "longer --probe-timeout" in line
