"""A script without a function that offers its blocks to activation checkpointing: `autofit.start` at module
level, then `run.checkpoint(model.blocks)` once the model is built, its own loop and optimizer step (the
pages' example of a module-level script whose search can trade recompute for memory)."""
import torch

import autofit

run = autofit.start(global_batch=64, default_batch_size=16)


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


torch.manual_seed(0)
model = torch.nn.Sequential(*[Block(256) for _ in range(8)]).to(run.device)
run.checkpoint(list(model))  # autofit: offer the blocks; the config says how many recompute their forward
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(512, 128, 256)
for step in range(10**6 if run.probing else 4):
    for micro in range(run.accumulation_steps):
        x = data[torch.randint(0, len(data), (run.batch_size,))].to(run.device)
        loss = model(x).pow(2).mean() / run.accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
