"""The corpus scripts that batch by tokens (`run.token_batches`): SFT over conversations, a causal LM over
packed documents, a CTC speech encoder over frames. Each: a probe at a token cap reports the longest sample
and real tokens; a short search under a memory limit climbs `max_tokens` from the longest sample up and
exports the cap, and the script run normally with the file, under the limit it was searched under, trains a
whole epoch (its longest samples included) with no OOM and reports its padding share. Beside them, what
the packed and the speech script promise their losses: a document's logits in a pack are its logits alone
(no attention or label crosses a document), an utterance's loss does not depend on its batch's padding."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from autofit import Config
from tests.support import CORPUS, REPO, autofit_cli


@dataclass(frozen=True)
class Entry:
    """One token-batched corpus script: its longest sample (in its tokens) and the limit it is searched under."""

    name: str
    longest: int
    limit: str

    @property
    def path(self) -> str:
        return os.path.join(CORPUS, f"{self.name}.py")


ENTRIES = [
    Entry("sft_tokens", 256, "768MiB"),
    Entry("packed_tokens", 256, "768MiB"),
    Entry("speech_tokens", 350, "768MiB"),
]


def _params():
    return [pytest.param(entry, id=entry.name) for entry in ENTRIES]


def _script(name: str):
    """The corpus script as a module (its data built at import, nothing run)."""
    spec = importlib.util.spec_from_file_location(f"corpus_{name}", os.path.join(CORPUS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("entry", _params())
def test_a_search_exports_max_tokens_and_a_normal_epoch_runs_under_the_limit(entry, tmp_path):
    searched = autofit_cli("search", entry.path, "--device", "cpu", "--memory-limit", entry.limit, "--precision",
                           "fp32", "--trials", "3", "--budget", "3m", cwd=tmp_path, timeout=900)
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert "max_tokens=" in searched.stderr  # the probes were sized by tokens
    assert "real (non-padding) tokens/s" in searched.stdout + searched.stderr
    best = tmp_path / "studies" / f"{entry.name}.train.cpu.best.json"
    document = json.loads(best.read_text())
    config = Config.from_dict(document["config"])
    assert config.max_tokens is not None and config.max_tokens >= entry.longest  # at least the longest sample
    assert document["config"]["max_tokens"] == config.max_tokens
    assert document["measured"]["peak_bytes"] <= document["memory"]["usable_bytes"]
    envelope = document["measured"]["token_envelope"]  # what the winner's probes ran: the longest batch first
    assert envelope["longest_sample"] == entry.longest and envelope["padded_tokens"] <= config.max_tokens, \
        (config.label(), envelope, document["measured"].get("probes"), searched.stderr[-2000:])
    squares = config.max_squares or config.max_tokens * entry.longest  # a squares cap holds the long batches
    assert envelope["padded_squares"] >= min(config.max_tokens // entry.longest,
                                             squares // entry.longest**2) * entry.longest**2

    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_CONFIG"}
    ran = subprocess.run([sys.executable, entry.path], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**environment, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu",
                              "AUTOFIT_MEMORY_LIMIT": "json", "AUTOFIT_OOM_RECOVERY": "0",
                              "AUTOFIT_RUN_REPORT": str(tmp_path / "run.json")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"with the best config from studies/{best.name}: {config.label()}" in ran.stderr
    assert f"{entry.name}: done" in ran.stdout  # the epoch ended: every batch, the longest ones too
    assert "token batches:" in ran.stderr and f"padding (longest {entry.longest} tokens)" in ran.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["config"]["max_tokens"] == config.max_tokens and not report["lowerings"]
    assert 0 < report["padding_share"] < 0.5 and report["tokens_per_s"]
    # the same data as the probes': no batch lies beyond their envelope
    assert (report["guard_split_batches"], report["oom_split_batches"]) == (0, 0)
    assert "micro-batches run in pieces" not in ran.stderr


@pytest.mark.slow
@pytest.mark.parametrize("entry", _params())
def test_a_probe_by_tokens_reports_the_longest_sample_and_real_tokens(entry, tmp_path):
    probed = autofit_cli("probe", entry.path, "--device", "cpu", "--memory-limit", "2GiB", "--max-tokens", "2048",
                         "--json", cwd=tmp_path)
    assert probed.stdout, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert probed.returncode == 0 and result["status"] == "ok", (result["error_message"], result["traceback"])
    assert result["config"]["max_tokens"] == 2048 and result["knobs"]["longest_sample"] == entry.longest
    assert result["knobs"]["token_envelope"]["longest_sample"] == entry.longest  # the batch holding it ran first
    assert result["knobs"]["batches"] and result["measured_steps"] >= Config.from_dict(result["config"]).probe_steps(5)
    assert 0 < result["tokens_per_s"] and result["samples_per_s"] < result["tokens_per_s"]
    # FLOP/s by tokens: the counted step's FLOPs per real token at the measured tokens/s (its samples vary)
    assert result["flops_per_token"] and result["flops_per_sample"] > result["flops_per_token"]
    assert result["flops_per_s"] == pytest.approx(result["tokens_per_s"] * result["flops_per_token"])


@pytest.mark.slow
def test_a_squares_cap_is_probed_and_a_normal_run_batches_as_its_file_says(tmp_path):
    """Per-length caps (`max_squares`): the probe's long batches stay within the squares cap while its short
    ones hold more tokens than the squares cap's own token cap would, and a normal run with a file that holds
    both caps cuts the epoch into exactly the batches the sampler cuts for them."""
    from autofit.export import BestConfig, write_best
    from autofit.runtime import TokenBatchSampler

    entry, cap = ENTRIES[0], 1024
    squares = cap * entry.longest
    probed = autofit_cli("probe", entry.path, "--device", "cpu", "--memory-limit", "2GiB", "--max-tokens", str(4 * cap),
                         "--max-squares", str(squares), "--json", cwd=tmp_path)
    assert probed.stdout, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert probed.returncode == 0 and result["status"] == "ok", result["error_message"]
    assert result["config"]["max_squares"] == squares
    envelope = result["knobs"]["token_envelope"]
    assert envelope["longest_sample"] == entry.longest and envelope["padded_squares"] <= squares
    assert envelope["padded_tokens"] > cap  # a short batch (run first, beside the longest) held more than T

    config = Config(batch_size=4 * cap, max_tokens=4 * cap, max_squares=squares)
    best = write_best(str(tmp_path / "sq.best.json"), BestConfig(config=config, device={"type": "cpu", "name": "cpu"}))
    ran = subprocess.run([sys.executable, entry.path], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu", "AUTOFIT_CONFIG": best,
                              "AUTOFIT_RUN_REPORT": str(tmp_path / "run.json")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["config"]["max_squares"] == squares and not report["lowerings"]
    expected = TokenBatchSampler(_script(entry.name).LENGTHS, 4 * cap, max_squares=squares, seed=0).stats()
    assert f"token batches: {expected.batches} batches of {expected.samples} samples" in ran.stderr
    alone = TokenBatchSampler(_script(entry.name).LENGTHS, cap, seed=0).stats()
    assert expected.batches < alone.batches  # the short samples batch larger than under the token cap alone


@pytest.mark.slow
def test_a_probe_whose_batch_cap_passes_its_token_cap_is_refused(tmp_path):
    refused = autofit_cli("probe", ENTRIES[0].path, "--device", "cpu", "--batch-size", "4096", "--max-tokens", "2048",
                          cwd=tmp_path)
    assert refused.returncode != 0 and "at most the max tokens" in refused.stderr


def test_a_pack_trains_each_document_as_it_would_alone():
    packed = _script("packed_tokens")
    pack = next(item for item in packed.PACKS if len(item[1]) == packed.PACK_DEPTH)
    torch.manual_seed(0)
    model = packed.TinyLM().eval()
    x, positions, document, y = packed.collate([pack, packed.PACKS[0]])  # padded beside another pack
    assert (y[0] != packed.IGNORE).sum() == len(pack[0]) - len(pack[1])  # one label fewer per document
    with torch.no_grad():
        together = model(x, positions, document)[0]
        start = 0
        for size in pack[1]:
            alone = pack[0][start : start + size]
            x1, positions1, document1, y1 = packed.collate([(alone, [size])])
            assert torch.equal(y1[0], y[0, start : start + size])  # no label reaches the next document
            assert torch.allclose(model(x1, positions1, document1)[0], together[start : start + size], atol=1e-5)
            start += size


def test_an_utterance_loss_does_not_depend_on_its_batch():
    speech = _script("speech_tokens")
    torch.manual_seed(0)
    model = speech.ConvCTC().eval()
    short, long = sorted((speech.DATA[i] for i in range(8)), key=lambda item: len(item[0]))[:: 7]

    def losses(items):
        features, frames, texts, text_lengths = speech.collate(items)
        logits, out_frames = model(features, frames)
        log_probs = logits.log_softmax(1).permute(2, 0, 1)
        return torch.nn.functional.ctc_loss(log_probs, texts, out_frames, text_lengths, reduction="none")

    with torch.no_grad():
        batched = losses([short, long])  # the short one padded to the long one's frames
        alone = torch.cat([losses([short]), losses([long])])
    assert len(short[0]) < len(long[0])
    assert torch.allclose(batched, alone, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.serial  # a 2m budget: beside another test, noisy probes spent it on remeasuring 3072 and 4096
def test_a_search_probes_a_squares_cap_after_a_climb_that_memory_stopped(tmp_path):
    """Rule 9 in a real search: the climb by tokens ends where the long batches' scores fill the memory, the
    steps are not saturated (a larger batch trains more tokens per second), so the leader is probed under a
    squares cap at its worst batch's (cap x 256) with a larger token cap; whatever wins fits and is exported
    with every field it ran with."""
    script = os.path.join(REPO, "tests", "scripts", "tokens_launch_bound.py")
    searched = autofit_cli("search", script, "--device", "cpu", "--memory-limit", "600MiB", "--precision", "fp32",
                           "--budget", "2m", cwd=tmp_path, timeout=600)
    assert searched.returncode == 0, searched.stderr[-3000:]
    import optuna

    import autofit
    from autofit.study import trial_config

    stored = autofit.load_study("tokens_launch_bound.train-cpu0", f"sqlite:///{tmp_path}/studies/autofit.db")
    study = optuna.load_study(study_name=stored.name, storage=f"sqlite:///{tmp_path}/studies/autofit.db")
    configs = [c for t in study.get_trials() if (c := trial_config(t)) is not None]
    assert stored.trials_frame()["max_squares"].notna().sum() == len([c for c in configs if c.max_squares])
    assert stored.space.longest_sample == 256  # the study keeps what the rule needs
    variants = [c for c in configs if c.max_squares is not None]
    assert variants, searched.stderr[-3000:]
    leaders = {c.max_tokens for c in configs if c.max_tokens is not None and c.max_squares is None}
    assert all(v.max_squares % 256 == 0 and v.max_squares // 256 in leaders for v in variants)
    assert all(v.max_tokens > v.max_squares // 256 for v in variants)
    best = tmp_path / "studies" / "tokens_launch_bound.train.cpu.best.json"
    document = json.loads(best.read_text())
    assert document["measured"]["peak_bytes"] <= document["memory"]["usable_bytes"]
    assert Config.from_dict(document["config"]).max_squares == document["config"].get("max_squares")
