"""The token benchmark's own logic (benchmarks/tokens.py): how each baseline's value is found, and the
hand-set configs it writes into autofit's file. Its figures come from running it (docs/benchmarks.md)."""
from __future__ import annotations

from autofit.config import Config
from autofit.export import SCHEMA, SCHEMA_VERSION, read_best
from benchmarks.tokens import largest_doubling, write_config


def test_doubling_then_bisection_finds_the_exact_largest_fit_and_doubling_alone_the_last_power():
    asked: list[int] = []

    def fits(value: int) -> bool:
        asked.append(value)
        return value <= 74

    assert largest_doubling(fits, 1, bisect=True) == 74
    assert asked[:8] == [1, 2, 4, 8, 16, 32, 64, 128]  # doubling to the first failure, then bisecting 64..128
    assert largest_doubling(lambda v: v <= 74, 1, bisect=False) == 64
    assert largest_doubling(lambda v: v <= 74, 256, bisect=False) is None  # the start itself does not fit


def test_a_hand_set_config_replaces_the_exported_one_and_drops_the_token_envelope(tmp_path):
    searched = Config(batch_size=4096, max_tokens=4096, precision="fp32")
    document = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "config": searched.to_dict(),
                "measured": {"token_envelope": {"longest_sample": 256, "padded_tokens": 4096,
                                                "padded_squares": 65536}},
                "memory": {}, "device": {"type": "cpu"}, "versions": {}, "script": {}}
    path = tmp_path / "hand.json"
    write_config(document, Config(batch_size=74, precision="fp32"), str(path))
    written = read_best(str(path))
    assert written.config == Config(batch_size=74, precision="fp32")
    assert written.measured.token_envelope is None  # a hand-set run has no guard
    assert document["measured"]["token_envelope"] and document["config"] == searched.to_dict()  # untouched
