"""Selective activation checkpointing (config.checkpoint_policy): what a checkpointed block recomputes
(counted in FLOPs, as torchtitan checks it), what it saves (a real probe's peak), the config field,
and the planner's order of memory by checkpointing."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing import Worker
from autofit.runtime import Run, checkpoint_policy_of
from tests.support import STUDIES, script

MiB = 2**20


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention and an MLP, with the elementwise ops between them."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


def _flops(config: Config) -> tuple[int, int]:
    """FLOPs of forward and of backward through two blocks under `config`'s checkpointing."""
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block(), Block()])
    Run(config).checkpoint(blocks)
    h = x = torch.randn(4, 32, 64, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        for block in blocks:
            h = block(h)
    with FlopCounterMode(display=False) as backward:
        h.sum().backward()
    assert x.grad is not None
    return forward.get_total_flops(), backward.get_total_flops()


def test_full_checkpointing_recomputes_the_matmuls_and_selective_none_of_them():
    forward, backward = _flops(Config(batch_size=4))
    full_forward, full_backward = _flops(Config(batch_size=4, checkpoint_segments=2))
    selective_forward, selective_backward = _flops(Config(batch_size=4, checkpoint_segments=2, checkpoint_policy="selective"))
    assert forward > 0 and full_forward == selective_forward == forward
    # The forward's matmuls and attention again, but for each block's last matmul: PyTorch stops
    # recomputing once it has every tensor the backward needs, and that output is not one.
    assert 0.6 * forward < full_backward - backward < forward
    assert selective_backward == backward  # their outputs were saved: nothing compute-heavy again


def test_one_checkpointed_block_of_two_recomputes_half_as_much():
    _, backward = _flops(Config(batch_size=4))
    _, both = _flops(Config(batch_size=4, checkpoint_segments=2))
    _, one = _flops(Config(batch_size=4, checkpoint_segments=1))
    _, one_selective = _flops(Config(batch_size=4, checkpoint_segments=1, checkpoint_policy="selective"))
    assert 2 * (one - backward) == both - backward and one_selective == backward


def test_applying_another_policy_changes_it_and_keeps_the_module():
    blocks = torch.nn.ModuleList([Block(), Block()])
    keys = list(blocks.state_dict())
    Run(Config(batch_size=4, checkpoint_segments=2)).checkpoint(blocks)
    Run(Config(batch_size=4, checkpoint_segments=2)).checkpoint(blocks)  # idempotent: not checkpointed twice
    assert [checkpoint_policy_of(b) for b in blocks] == ["full", "full"]
    Run(Config(batch_size=4, checkpoint_segments=1, checkpoint_policy="selective")).checkpoint(blocks)
    assert [checkpoint_policy_of(b) for b in blocks] == ["selective", None]
    assert "forward" not in vars(blocks[1])  # unwrapped: the class's own forward again
    assert list(blocks.state_dict()) == keys


def _peaks(script_name: str, configs: list[Config]) -> list[int]:
    """Each config's peak, probed in one worker in the order given: smallest expected first, so that
    what an earlier probe leaves in the heap cannot make a later one look smaller."""
    with Worker(script_name, budget=MemoryBudget(limit_bytes=3 * 2**30)) as worker:
        worker.start()
        results = [worker.probe(config, warmup=1, steps=1, timeout=120, min_measure_s=0.0) for config in configs]
    assert all(r.ok for r in results), [r.error_message for r in results]
    return [r.peak_bytes for r in results]


@pytest.mark.slow
def test_a_real_probe_peaks_lower_with_selective_and_lowest_with_full_checkpointing():
    """Eight transformer blocks at one batch: checkpointed selectively they keep the matmul and
    attention outputs, fully only each block's input."""
    configs = [Config(batch_size=256, checkpoint_segments=8), Config(batch_size=256, checkpoint_segments=8, checkpoint_policy="selective"),
               Config(batch_size=256)]
    full, selective, none = _peaks(script("transformer_blocks.py"), configs)
    assert none - selective > 48 * MiB and selective - full > 48 * MiB, (none / MiB, selective / MiB, full / MiB)


@pytest.mark.slow
def test_the_bundled_gpt_peaks_lower_with_selective_and_lowest_with_full_checkpointing():
    configs = [Config(batch_size=128, checkpoint_segments=4), Config(batch_size=128, checkpoint_segments=4, checkpoint_policy="selective"),
               Config(batch_size=128)]  # at 128: 1211, 922 and 762 MiB (twice the margins at 256, for twice the time)
    full, selective, none = _peaks(f"{STUDIES}/gpt.py", configs)
    assert none - selective > 64 * MiB and selective - full > 64 * MiB, (none / MiB, selective / MiB, full / MiB)


def test_the_policy_is_validated_labelled_and_kept_only_when_not_full():
    with pytest.raises(UsageError, match=r"The checkpoint policy must be one of full, selective, but got 'some'\."):
        Config(batch_size=8, checkpoint_segments=1, checkpoint_policy="some")
    selective = Config(batch_size=64, precision="bf16", checkpoint_segments=2, checkpoint_policy="selective")
    assert selective.label() == "bf16 b=64 ckpt=2 selective"
    assert Config(batch_size=64, precision="bf16", checkpoint_segments=2).label() == "bf16 b=64 ckpt=2"
    assert "checkpoint_policy" not in Config(batch_size=64, checkpoint_segments=2).to_dict()  # old files keep their form
    assert Config.from_dict(selective.to_dict()) == selective


def test_a_bad_policy_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    from click.testing import CliRunner

    from autofit.cli import cli

    for command, value in (("search", "full,some"), ("probe", "some")):
        args = ["--batch-size", "4"] if command == "probe" else ["--out", str(tmp_path / "b.json")]
        result = CliRunner().invoke(cli, [command, script("fits_small.py"), "--checkpoint-policy", value, *args])
        assert result.exit_code == 2 and "some" in result.output and "Traceback" not in result.output, result.output
    with pytest.raises(UsageError, match="The checkpoint policy must be one of full, selective, but got 'some'."):
        from autofit import autofit

        autofit(checkpoint_policy="some")


@pytest.mark.slow  # 12 s: the default tier stays near 5 minutes
def test_a_probe_from_the_command_line_runs_under_the_policy_it_names(tmp_path):
    import json

    from tests.support import autofit_cli

    done = autofit_cli("probe", script("fits_small.py"), "--device", "cpu", "--memory-limit", "768MiB",
                       "--batch-size", "4", "--checkpoint-segments", "2", "--checkpoint-policy", "selective", "--steps", "1",
                       "--warmup", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)["result"]
    assert result["status"] == "ok" and result["config"]["checkpoint_policy"] == "selective"
    assert Config.from_dict(result["config"]).label() == "fp32 b=4 ckpt=2 selective"


@pytest.mark.slow
def test_a_search_probes_selective_checkpointing_and_exports_what_wins(tmp_path):
    """A real search of the eight blocks at batch 128 on one intra-op thread (peaks there: 537 MiB with no
    checkpointing, 465 MiB selective, 387 MiB full; each thread adds its buffers, 579/513/438 MiB on two),
    where no checkpointing does not fit the cap (504 MiB usable):
    only checkpointed strategies run, selective ones are probed (an Optuna param of this study), and the
    exported file reads back as ranked. (Over small batches too, a quiet CPU's flat throughput rightly
    keeps the planner from checkpointing at all.)"""
    import optuna

    import autofit
    from autofit.export import read_best
    from autofit.study import trial_result
    from tests.support import autofit_cli

    storage = f"sqlite:///{tmp_path}/s.db"
    done = autofit_cli("search", script("transformer_blocks.py"), "--device", "cpu", "--memory-limit", "560MiB",
                       "--precision", "fp32", "--batch-range", "128:128", "--budget", "30m", "--trials", "6", "--no-estimate",
                       "--storage", storage, "--study", "s", "--out", str(tmp_path / "best.json"), cwd=tmp_path,
                       env={"OMP_NUM_THREADS": "1"}, timeout=1800)  # bounded by its 6 trials at batch 128; no estimator beside (its 14 configs took 86 s)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = optuna.load_study(study_name="s", storage=storage).trials
    results = [r for t in trials if (r := trial_result(t))]
    assert any(r.config.checkpoint_policy == "selective" and r.config.checkpoint_segments for r in results), \
        [r.config.label() for r in results]
    assert any(t.params.get("checkpoint_policy") == "selective" for t in trials)  # a param once knobs are known
    assert read_best(str(tmp_path / "best.json")).config == autofit.load_study("s", storage).best()
