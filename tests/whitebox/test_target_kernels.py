"""The memory estimator's CUDA kernels on CPU fake tensors (autofit.memory._target_kernels): CUDA's fused
attention keeps no scores matrix, where the CPU's math path, which dropout sends it to, does."""
from __future__ import annotations


def _attention_bytes(target: str, dropout: float) -> int:
    """The peak of one causal attention's forward under bf16 autocast, batch 2, 4 heads, length 512."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from autofit.memory._target_kernels import target_kernels

    with FakeTensorMode(), target_kernels(target):
        q, k, v = (torch.randn(2, 4, 512, 64, requires_grad=True) for _ in range(3))
        tracker = MemTracker()
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("peak").values())


def test_a_cuda_target_keeps_no_attention_scores_where_dropout_sends_the_cpu_to_its_math_path():
    scores = 2 * 4 * 512 * 512  # one length x length matrix per head: what the math path keeps, several times
    cpu, cuda = _attention_bytes("cpu", 0.1), _attention_bytes("cuda", 0.1)
    assert cpu > 4 * scores  # scores, softmax and the dropout mask
    qkv_and_out = 4 * 2 * 4 * 512 * 64 * 2  # bf16 casts of q, k, v and the output, as CUDA's flash keeps
    assert qkv_and_out <= cuda < qkv_and_out + scores  # and the logsumexp, a few KiB
    assert cuda == _attention_bytes("cpu", 0.0)  # the CPU's fused kernel: CUDA's memory shape


def test_a_cuda_target_steps_optimizers_with_cudas_default_foreach_kernels():
    import torch
    from torch.optim.optimizer import _default_to_fused_or_foreach

    from autofit.memory._target_kernels import target_kernels

    params = [torch.nn.Parameter(torch.zeros(4))]
    assert _default_to_fused_or_foreach(params, False) == (False, False)  # the CPU's: one at a time
    with target_kernels("cuda"):
        assert _default_to_fused_or_foreach(params, False) == (False, True)  # CUDA's: the foreach kernels
    assert _default_to_fused_or_foreach(params, False) == (False, False)


def test_tensors_sent_to_cuda_stay_fake_cpu_tensors_and_cuda_autocast_is_the_cpus():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autofit.memory._target_kernels import target_kernels

    model = torch.nn.Linear(8, 8)  # a model built at import (the estimator converts fake ones in place)
    with FakeTensorMode(allow_non_fake_inputs=True), target_kernels("cuda"):
        model.to("cuda")
        x = torch.ones(2, 8, device="cuda:0")
        moved = torch.ones(2, 8).pin_memory().to(torch.device("cuda"), non_blocking=True).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x + moved)
    assert {model.weight.device.type, x.device.type, moved.device.type} == {"cpu"}
    assert out.dtype == torch.bfloat16


def _saved_bytes(target: str, offload: bool) -> tuple[int, list]:
    """The peak of a forward and backward of four small layers at a large batch (the activations are most of
    it), its saved tensors sent to the host by `save_on_cpu` when `offload`, and the gradients' shapes."""
    from contextlib import nullcontext

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from autofit.memory._target_kernels import target_kernels

    with FakeTensorMode(), target_kernels(target):
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
                                      for _ in range(4)])
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            with torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else nullcontext():
                loss = model(torch.randn(4096, 64)).square().sum()
            loss.backward()
        peak = sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("peak").values())
        return peak, [tuple(p.grad.shape) for p in model.parameters()]


def test_a_cuda_target_keeps_the_tensors_save_on_cpu_sends_to_the_host_off_the_device():
    activation = 4096 * 64 * 4  # one layer's output, in fp32
    kept, shapes = _saved_bytes("cuda", False)
    offloaded, offloaded_shapes = _saved_bytes("cuda", True)
    assert offloaded_shapes == shapes  # backward still runs, on tensors of the saved ones' shapes
    assert kept >= 8 * activation  # the 8 saved activations (each layer's input and its GELU's)
    assert offloaded <= kept - 6 * activation  # a layer's two at most on the device at once: in its backward
    assert _saved_bytes("cpu", True)[0] >= kept  # on the CPU the copies are the device's (the host's) too
