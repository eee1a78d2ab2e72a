"""A torchrun script of nanoGPT's shape, without a function: `autofit.start` at module level, then the
script initialises DDP itself from torchrun's environment (gloo on the CPU) and wraps its model in
DistributedDataParallel, and shares its accumulation out over the ranks as nanoGPT does
(`gradient_accumulation_steps //= world_size`): so it asks `run` for the accumulation of the whole
world, which is `run.accumulation_steps * run.world_size`. --record=FILE appends what each rank saw."""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autofit

parser = argparse.ArgumentParser()
parser.add_argument("--record", default=None)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
parser.add_argument("--iters", type=int, default=100_000)
args = parser.parse_args()

run = autofit.start(global_batch=args.batch_size * args.gradient_accumulation_steps, batch_range=(1, 64))
batch_size, gradient_accumulation_steps = run.batch_size, run.accumulation_steps * run.world_size

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend="gloo")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    assert gradient_accumulation_steps % world_size == 0
    gradient_accumulation_steps //= world_size
else:
    world_size, rank = 1, 0
if args.record:
    with open(args.record, "a") as handle:
        handle.write(json.dumps({"rank": rank, "world_size": world_size, "batch_size": batch_size,
                                 "accumulation": gradient_accumulation_steps}) + "\n")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
if ddp:
    model = DDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for it in range(args.iters):
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        x = torch.randn(batch_size, 64)
        wide = x.repeat(1, 1024)  # batch x 256 KiB, kept for backward
        loss = (model(x).pow(2).mean() + wide.sigmoid().mean() * 1e-3) / gradient_accumulation_steps
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if rank == 0 and it % 10 == 0:
        print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}")
if ddp:
    # gloo: a worker thread may still hold the last all-reduce and free it while the interpreter exits, which
    # aborts it ("terminate called without an active exception": 5 runs in 20 without autofit, 1 in 30 after a
    # plain barrier). A barrier whose work is kept to the end has the main thread free it: 0 in 40.
    leaving = dist.barrier(async_op=True)
    leaving.wait()
    dist.destroy_process_group()
print(f"done after {args.iters} iterations on {world_size} ranks")
