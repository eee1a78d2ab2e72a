"""`autofit forecast` on the repository's real H100 best-config file of GPT-2 small, written before
forecasts (and before FLOPs per sample) existed: JSON for tools, the table for people, bad input as exit 2."""
from __future__ import annotations

import json
import os

from click.testing import CliRunner

from autofit.cli import cli
from tests.support import REPO

OLD_FILE = os.path.join(REPO, "benchmarks", "gpu", "results", "gpt124m.best.json")


def test_a_file_written_before_forecasts_forecasts_every_target_as_json():
    result = CliRunner().invoke(cli, ["forecast", OLD_FILE, "--gpu", "H100,H200,A100-80GB,L4,T4",
                                      "--price", "H100=2.69", "--tokens", "10B", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    targets = {t["gpu"]: t for t in answer["targets"]}
    assert list(targets) == ["H100", "H200", "A100-80GB", "L4", "T4"]
    h100, l4 = targets["H100"], targets["L4"]
    assert h100["config"]["batch_size"] == 48 and h100["price_per_gpu_hour"]["typical"] == 2.69
    assert h100["peak_bytes"] <= h100["usable_bytes"] and l4["peak_bytes"] <= l4["usable_bytes"]
    assert l4["config"]["global_batch"] == 48 and l4["config"]["batch_size"] * l4["config"]["accumulation_steps"] == 48
    assert targets["T4"]["config"]["precision"] == "fp16" and targets["T4"]["price_per_gpu_hour"] is None
    assert h100["rate_basis"] == "no-flops"  # the old file has no FLOPs: the widest interval, said so
    tokens = h100["tokens_per_s"]
    assert tokens["low"] < tokens["point"] < tokens["high"]
    assert h100["hours"]["point"] == 10e9 / tokens["point"] / 3600
    assert set(answer["recommendation"]) == {"cheapest", "fastest", "smallest"}
    assert answer["recommendation"]["smallest"] == "T4"


def test_the_table_names_the_config_the_recommendation_and_the_prices_date():
    result = CliRunner().invoke(cli, ["forecast", OLD_FILE, "--gpu", "H100,L4"])
    assert result.exit_code == 0, result.output
    assert "bf16 b=48 acc=1" in result.output and "recommendation: cheapest per token:" in result.output
    assert "2026-11-28" in result.output and "no FLOPs per sample" in result.output


def test_bad_targets_and_prices_are_usage_errors():
    unknown = CliRunner().invoke(cli, ["forecast", OLD_FILE, "--gpu", "H1000"])
    assert unknown.exit_code == 2 and "must be one of" in unknown.output
    price = CliRunner().invoke(cli, ["forecast", OLD_FILE, "--price", "H100=cheap"])
    assert price.exit_code == 2 and "H100=2.69" in price.output
