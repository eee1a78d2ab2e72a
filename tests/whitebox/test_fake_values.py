"""The estimator's fake tensors that answer value reads (autofit.memory._fake_values), in this process."""

from __future__ import annotations

import torch


def test_value_reads_are_answered_and_data_dependent_sizes_guessed_in_process():
    from autofit.memory._fake_values import ValueFreeFakeMode

    mode = ValueFreeFakeMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.randn(64, 16)
        loss = x.square().mean()
        assert loss.item() == 1.0 and float(loss) == 1.0
        assert bool(torch.isfinite(loss)) and not bool(torch.isnan(loss).any()) and not torch.isinf(loss).any()
        assert not bool(torch.isnan(loss) | torch.isinf(loss)) and torch.isnan(x).sum().item() == 0
        assert bool(torch.isfinite(x).all()) and not bool((~torch.isfinite(x)).any())
        _, chosen = x.softmax(-1).topk(2, dim=-1)
        rows, _ = torch.where(chosen == 3)
        assert rows.shape == (64 * 2 // 16,)  # 2 of 16 choices per row, balanced
        assert x[x > 0].shape == (64 * 16,)  # unknown density: every element
        expert_mask = torch.nn.functional.one_hot(chosen, num_classes=16).permute(2, 1, 0)  # as Mixtral routes
        assert torch.where(expert_mask[3])[0].shape == (64 * 2 // 16,)
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.Adam(model.parameters())
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(model(x).sum()).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        assert bool(torch.isfinite(norm))
        scaler.step(opt)  # found_inf is 0: the step is taken
        scaler.update()
        assert len(opt.state) == 2
    assert sorted(mode.notes.values()) == [
        "`nonzero` has a data-dependent size: from its mask's known density",
        "`nonzero` has a data-dependent size: taken at its upper bound (every element)"]


def test_a_fake_loss_formats_with_a_spec_as_a_number_and_tensor_formatting_is_left_as_it_was():
    """nanoGPT prints `f"{losses['train']:.4f}"` in its evaluation: a plain FakeTensor refuses the spec
    (TypeError), which stopped the estimator before the first training step."""
    from torch._subclasses.fake_tensor import FakeTensor

    from autofit.memory._fake_values import ValueFreeFakeMode

    mode = ValueFreeFakeMode()
    with mode:
        loss = torch.zeros(4).mean()
        assert f"{loss:.4f}" == "1.0000"  # the harmless value a fake loss reads as
    assert "__format__" not in FakeTensor.__dict__
    assert f"{torch.tensor(2.5):.1f}" == "2.5"


def test_a_window_over_a_read_index_is_as_long_as_the_script_asked():
    """nanoGPT's get_batch: `data[i:i + block_size]` for each random start `i`. Both ends are read values:
    each read alone as 1 made every window empty (a batch of 0 tokens, no activations estimated)."""
    import numpy as np

    from autofit.memory._fake_values import ValueFreeFakeMode

    data = np.arange(1000)
    with ValueFreeFakeMode(allow_non_fake_inputs=True):
        starts = torch.randint(1000 - 64, (4,))
        windows = [data[i:i + 64] for i in starts]
        start, end, before = int(starts[0]), int(starts[0] + 64), int(starts[0] - 3)
    assert [len(w) for w in windows] == [64] * 4
    assert (end - start, start - before) == (64, 3)
