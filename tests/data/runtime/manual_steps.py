"""A training loop with no torch.optim optimizer: steps are marked with eroica_runtime.mark_step()."""
import torch
import torch.distributed as dist

import eroica_runtime

dist.init_process_group("gloo")
w = torch.randn(64, 64)
for _ in range(40):
    x = torch.randn(32, 64) @ w
    dist.all_reduce(x)
    w -= 1e-4 * x.mean()
    eroica_runtime.mark_step()
if dist.get_rank() == 0:
    print("manual loop done", flush=True)
dist.destroy_process_group()
