"""Trust, round five (issue 52, item 8): the forecast's edges. The held-out command reads every best-config file
autofit writes (nanoGPT's record "tokens_per_s": null); tokens for such a file come from a stated assumption;
a price of nan or inf, and a directory as the input, are one line each; --json is always JSON; the source's
memory limit is said to be dropped (or, for a token cap, kept); a config by tokens shows its token cap, and its
runner-ups keep their rate."""

from __future__ import annotations

import glob
import json
import os

import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.errors import UsageError
from autofit.forecast import forecast, gpu_spec
from benchmarks.forecast import RESULTS, held_out, nanogpt_document
from tests.support import REPO

GIB = 1024**3
H200 = {"type": "cuda", "name": "NVIDIA H200", "total_bytes": 143771 * 1024**2}


def _strict(text: str):
    """JSON as the standard has it: no NaN, no Infinity."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"not JSON: {name}"))


def _file(tmp_path, name: str, document: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "autofit.best-config", "schema_version": 1, "versions": {},
                                "script": {"path": "train.py"}, **document}))
    return str(path)


def _nanogpt_h200(tmp_path) -> str:
    """nanoGPT's defaults as its own loop's best-config file holds them (it counts no tokens: null), measured on
    an H200 (the H100 log's figures: this test checks the reading, not the error)."""
    document = nanogpt_document()
    document["measured"]["tokens_per_s"] = None
    document["device"] = H200
    document["memory"] = {"limit_bytes": H200["total_bytes"], "headroom": 0.1, "usable_bytes": H200["total_bytes"] * 0.9}
    return _file(tmp_path, "nanogpt.best.json", document)


def _by_tokens(tmp_path) -> str:
    """A file by tokens (max_tokens=8192, found under a 2 GiB limit of an H100), with a runner-up by tokens."""
    base = json.load(open(os.path.join(RESULTS, "2026-11-25-gpt124m.best.json")))
    config = {"batch_size": 8192, "max_tokens": 8192, "accumulation_steps": 1, "global_batch": None,
              "precision": "bf16", "checkpoint_segments": 0}
    runner = {**config, "max_tokens": 4096, "batch_size": 4096, "tokens_per_s": 100_000.0, "peak_bytes": 1.0 * GIB}
    measured = {**base["measured"], "ranked_by": "tokens_per_s", "samples_per_s": 200.0, "tokens_per_s": 120_000.0,
                "peak_bytes": 1.6 * GIB}
    return _file(tmp_path, "tokens.best.json", base | {"config": config, "measured": measured, "runner_ups": [runner],
                                                        "memory": {"limit_bytes": 2 * GIB, "headroom": 0.1,
                                                                   "usable_bytes": 1.8 * GIB}})


def test_the_held_out_check_reads_every_best_config_file_autofit_writes(tmp_path):
    """The H100 files, the bundled CPU studies' files, nanoGPT's own loop (no tokens: the old check raised
    "A budget in tokens needs a file that counts tokens") and a file by tokens: each gives its figures, as
    JSON, its error in samples/s where the forecast has a rate."""
    files = sorted(glob.glob(os.path.join(RESULTS, "*.best.json")) + glob.glob(os.path.join(REPO, "autofit", "recorded",
                                                                                            "*.best.json")))
    files += [_nanogpt_h200(tmp_path), _by_tokens(tmp_path)]
    for path in files:
        result = held_out(path, "H100")
        _strict(json.dumps(result, allow_nan=False))
        assert result["config"] is None or result["samples_per_s"] is None or result["error"] is not None, path
    nanogpt = held_out(files[-2], "H100")
    assert nanogpt["error"] == pytest.approx(nanogpt["samples_per_s"] / 475.7 - 1) and nanogpt["tokens_per_s"] is None
    assert nanogpt["cost_unit"] == "million samples" and nanogpt["cost"]
    with_tokens = held_out(files[-2], "H100", tokens_per_sample=1024)
    assert with_tokens["tokens_per_s"] == pytest.approx(nanogpt["samples_per_s"] * 1024)


def test_tokens_for_a_file_that_counts_samples_only_are_a_stated_assumption(tmp_path):
    """`--tokens 10B` on nanoGPT's file: one line naming --samples and --tokens-per-sample; with the tokens a
    sample holds given, the forecast runs and says so. A count that disagrees with a file's own is refused."""
    path = _nanogpt_h200(tmp_path)
    refused = CliRunner().invoke(cli, ["forecast", path, "--tokens", "10B"])
    assert refused.exit_code != 0 and len(refused.output.strip().splitlines()) == 1
    assert "--tokens-per-sample" in refused.output
    given = CliRunner().invoke(cli, ["forecast", path, "--tokens", "10B", "--tokens-per-sample", "1024", "--gpu", "H100"])
    assert given.exit_code == 0, given.output
    assert "hours for 10B tokens" in given.output and "1,024 a sample, as given (--tokens-per-sample)" in given.output
    counted = os.path.join(RESULTS, "2026-11-25-gpt124m.best.json")  # 1024 tokens a sample, counted
    with pytest.raises(UsageError, match="must agree with the file's own count"):
        forecast(json.load(open(counted)), [gpu_spec("H100")], tokens_per_sample=512)


@pytest.mark.parametrize("price", ["nan", "inf", "-inf"])
def test_a_price_that_is_not_a_finite_positive_number_is_one_line(price):
    counted = os.path.join(RESULTS, "2026-11-25-gpt124m.best.json")
    result = CliRunner().invoke(cli, ["forecast", counted, "--gpu", "H100", "--price", f"H100={price}", "--json"])
    assert result.exit_code == 2 and "positive, finite number" in result.output and "nan-nan" not in result.output
    with pytest.raises(UsageError, match="positive, finite number"):
        forecast(json.load(open(counted)), [gpu_spec("H100")], prices={"H100": float(price)})


def test_the_json_holds_no_nan_whatever_the_file_holds(tmp_path):
    """A file whose tokens/s is NaN (Python's JSON writes and reads it) made every token figure NaN, printed as
    bare NaN (13 of them): no token count then, and every figure finite or null."""
    base = json.load(open(os.path.join(RESULTS, "2026-11-25-gpt124m.best.json")))
    path = tmp_path / "nan.best.json"
    path.write_text(json.dumps(base | {"measured": {**base["measured"], "tokens_per_s": float("nan")}}))
    result = CliRunner().invoke(cli, ["forecast", str(path), "--gpu", "H100,L4", "--json"])
    assert result.exit_code == 0, result.output
    answer = _strict(result.output)
    assert answer["tokens_per_sample"] is None and answer["targets"][0]["samples_per_s"]["point"] > 0


def test_a_directory_as_the_input_is_one_line_and_a_non_zero_exit():
    result = CliRunner().invoke(cli, ["forecast", RESULTS])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1, result.output
    assert "is a directory" in result.output and "2026-11-25-gpt124m.best.json" in result.output
    assert not isinstance(result.exception, OSError)


def test_the_source_s_memory_limit_is_said_to_be_dropped_or_kept(tmp_path):
    """Searched under 16 GiB of an 80 GB H100: each target is sized by its own memory, and the note says the
    limit was dropped. A token cap found under a 2 GiB limit is kept as measured, and said so."""
    base = json.load(open(os.path.join(RESULTS, "2026-11-25-gpt124m.best.json")))
    capped = base | {"memory": {"limit_bytes": 16 * GIB, "headroom": 0.1, "usable_bytes": 14.4 * GIB}}
    notes = forecast(capped, [gpu_spec("H200")]).notes
    assert any("memory limit of 16.00 GiB" in n and "the limit dropped" in n for n in notes), notes
    assert not any("memory limit of" in n for n in forecast(base, [gpu_spec("H200")]).notes)  # no limit below it
    result = CliRunner().invoke(cli, ["forecast", _by_tokens(tmp_path), "--gpu", "H100"])
    assert "memory limit of 2.00 GiB" in result.output and "token cap found under that limit is kept" in result.output


def test_a_file_by_tokens_shows_its_token_cap_and_its_runner_up_keeps_its_rate(tmp_path):
    path = _by_tokens(tmp_path)
    result = CliRunner().invoke(cli, ["forecast", path, "--gpu", "H100"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith("H100"))
    assert "max_tokens=8192" in row and "b=8192" not in row
    answer = _strict(CliRunner().invoke(cli, ["forecast", path, "--gpu", "H100", "--json"]).output)
    runner = next(s for s in answer["targets"][0]["strategies"] if "max_tokens=4096" in s["strategy"])
    assert runner["samples_per_s"] is not None  # 100k tokens/s at the winner's 600 tokens a sample, scaled
