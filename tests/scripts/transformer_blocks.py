"""Eight small Llama-style transformer blocks over many tokens, so that the blocks' activations are most
of the peak: what none, selective and full checkpointing keep for backward differs by tens of MiB."""
import torch
import torch.nn.functional as F

from autofit import autofit

D, HEADS, SEQ, LAYERS = 32, 4, 64, 8


class Block(torch.nn.Module):
    """Llama-style: RMSNorm, causal attention, a SwiGLU MLP (the elementwise ops between the
    matmuls keep as much for backward as the matmuls' outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D, bias=False), torch.nn.Linear(D, D, bias=False)
        self.gate, self.up = torch.nn.Linear(D, 4 * D, bias=False), torch.nn.Linear(D, 4 * D, bias=False)
        self.down = torch.nn.Linear(4 * D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (d,))).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        h = F.rms_norm(x, (d,))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@autofit(batch_range=(1, 1024))
def train(run):
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
    run.checkpoint(blocks)
    opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, SEQ, D) for _ in range(2)]
    while True:
        for x in run.batches(data):
            with run.autocast():
                h = x
                for block in blocks:
                    h = block(h)
                loss = h.pow(2).mean()
            run.backward(loss, opt)
