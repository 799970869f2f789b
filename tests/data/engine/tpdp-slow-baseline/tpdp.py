"""2x2 tensor-parallel x data-parallel by hand: TP groups {0,1},{2,3} all-reduce activations in
forward; DP groups {0,2},{1,3} all-reduce gradients. Rank SLOW_RANK (3) runs 40 extra 300x300 matmuls
a step from step 60. Run: eroica-run --nproc-per-node 4 tpdp.py (the captures here, 2026-12-07)."""

import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(rank % 2)
tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]


class AllReduce(torch.autograd.Function):
    """A row-parallel layer's output: summed over the tensor-parallel group in forward."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        x = x.clone()
        dist.all_reduce(x, group=tp)
        return x

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        return g


w1, w2 = nn.Linear(512, 1024), nn.Linear(1024, 512)
params = list(w1.parameters()) + list(w2.parameters())
opt = torch.optim.AdamW(params, 1e-4)
slow = int(os.environ.get("SLOW_RANK", "3"))
for it in range(int(os.environ.get("STEPS", "160"))):
    loss = AllReduce.apply(w2(torch.relu(w1(torch.randn(64, 512))))).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad, group=dp)
    if rank == slow and it >= 60:
        a = torch.randn(300, 300)
        for _ in range(40):
            a @ a
    opt.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
