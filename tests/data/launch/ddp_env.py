"""An unmodified torchrun-style DDP script: gloo, env://, a spawn DataLoader with a worker.

Writes its torchrun environment and training result to $OUT_DIR/rank<R>.json.
"""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE")


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g))
    dl = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    for x, y in dl:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    result = [round(float(v), 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    out = {"env": {k: os.environ.get(k) for k in KEYS}, "result": result, "pid": os.getpid(),
           "argv": sys.argv[1:]}
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)
    del model, opt, dl  # DDP's reducer holds the process group: free it before the group goes
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
