"""A DDP job whose rank 0 logs metrics every 10 steps (every parameter's statistics pulled to Python,
formatted, appended to a file: ~40 ms on this 2-core machine) while the other ranks wait for it in
the next all-reduce; from step --from-step on."""

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def log_metrics(step: int, model: torch.nn.Module, path: str, reps: int) -> None:
    stats = {}
    for _ in range(reps):
        for name, p in model.named_parameters():
            t = p.detach()
            stats[name] = [float(t.mean()), float(t.std()), float(t.abs().max()), t.flatten()[:2000].tolist()]
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "stats": stats})[:100000] + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--from-step", type=int, default=0)
    ap.add_argument("--log-reps", type=int, default=40, help="how much logging work (40: ~40 ms here)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                                        torch.nn.Linear(1024, 512)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(tempfile.gettempdir(), f"metrics-{os.getpid()}.jsonl")
    for step in range(a.steps):
        loss = model(torch.randn(32, 512)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
        if dist.get_rank() == 0 and step >= a.from_step and step % a.every == 0:
            log_metrics(step, model, path, a.log_reps)
    if os.path.exists(path):
        os.unlink(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
