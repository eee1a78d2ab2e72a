"""Where memory binds and checkpointing must pay, on the CPU (issue 51): the stand-in of a Llama-style decoder at a
long context on a launch-bound GPU, for tests/e2e/test_memory_binds.py and benchmarks.

- a deep stack of Llama-style blocks (RMSNorm, causal SDPA, SwiGLU) over many tokens and a narrow width, offered
  to `run.checkpoint`: what the blocks save for backward is most of the peak, and what they compute is little;
- a fixed cost per micro-batch (`STANDIN_LAUNCH_S`, 0.6 s: a GPU's kernel launches and idle tail, a wait a third
  in the forward and the rest in the backward, outside the blocks, so a recompute does not repeat it), the same
  whatever else the machine's cores do: a micro-batch costs about the same whatever its size, so the largest
  micro-batch that fits is the fastest, and checkpointing, which lets a larger one fit, pays;
- a fixed part of the memory (`STANDIN_STATE_MIB`, 256 MiB: the weights, gradients and optimizer state of a
  larger model, held for the run) that puts the plain micro-batch's memory edge at 8-11 samples under
  `--memory-limit 700MiB` (630 MiB usable), and every block checkpointed at 2-3x that.

Set STANDIN_BLOCKS / STANDIN_SEQ / STANDIN_WIDTH to change its shape; a normal run trains 4 steps."""
import ctypes
import os
import time

import torch
import torch.nn.functional as F

from autofit import autofit

BLOCKS = int(os.environ.get("STANDIN_BLOCKS", "24"))
SEQ = int(os.environ.get("STANDIN_SEQ", "128"))
WIDTH = int(os.environ.get("STANDIN_WIDTH", "32"))
HEADS = 4
LAUNCH_S = float(os.environ.get("STANDIN_LAUNCH_S", "1.0"))
STATE_FLOATS = int(os.environ.get("STANDIN_STATE_MIB", "224")) * 2**18


# Memory as a GPU's caching allocator holds it: glibc's dynamic mmap threshold would keep the freed activations in
# its heap, where a checkpointed block's recompute fragments them (full checkpointing read 4.9 MiB a sample where
# its tensors take 1), so every allocation of 64 KiB or more is mapped and unmapped instead (M_MMAP_THRESHOLD).
ctypes.CDLL(None).mallopt(-3, 64 * 1024)


class Launches(torch.autograd.Function):
    """A micro-batch's fixed device time, as a wait: a third in the forward, the rest in the backward."""

    @staticmethod
    def forward(ctx, h):
        time.sleep(LAUNCH_S / 3)
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * LAUNCH_S / 3)
        return grad


class Block(torch.nn.Module):
    """Llama-style: RMSNorm, causal attention (SDPA), a SwiGLU MLP; the elementwise ops between the matmuls keep as
    much for backward as the matmuls' outputs, so selective checkpointing saves less than full."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.gate = torch.nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (d,))).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        h = F.rms_norm(x, (d,))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@autofit
def train(run):
    torch.set_num_threads(1)  # a GPU script's host side: one thread launching kernels
    torch.manual_seed(0)
    state = torch.zeros(STATE_FLOATS)  # noqa: F841 (the rest of the model's state on the device, never read here)
    blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
    run.checkpoint(blocks)
    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, SEQ, WIDTH) for _ in range(2)]
    for _ in range(10**6 if run.probing else 2):
        for x in run.batches(data):
            h = x
            for block in blocks:
                h = block(h)
            run.backward(Launches.apply(h).pow(2).mean(), optimizer)
    print("memory_standin: done", flush=True)


if __name__ == "__main__":
    train()
