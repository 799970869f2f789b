"""A small transformer with activation checkpointing (torch.utils.checkpoint, non-reentrant), DDP on gloo.

From step FAULT_FROM on rank FAULT_RANK: FAULT=anomaly turns on torch.autograd.set_detect_anomaly(True);
FAULT=threads calls torch.set_num_threads(THREADS); FAULT=compute runs MATMULS extra matmuls in each
checkpointed block's forward (recomputed in backward)."""
import os

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "2"))
FAULT_FROM = int(os.environ.get("FAULT_FROM", "60"))
STEPS = int(os.environ.get("STEPS", "150"))
D = 128
step = 0


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(D, 4, batch_first=True)
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        if FAULT == "compute" and dist.get_rank() == FAULT_RANK and step >= FAULT_FROM:
            for _ in range(int(os.environ.get('MATMULS', '6'))):
                x = x + 1e-6 * torch.tanh(x @ torch.ones(D, D))
        return x + self.mlp(self.ln2(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(D, 1000)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(x)


def main():
    global step
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(STEPS):
        if FAULT == "anomaly" and dist.get_rank() == FAULT_RANK and step == FAULT_FROM:
            torch.autograd.set_detect_anomaly(True)
        if FAULT == "threads" and dist.get_rank() == FAULT_RANK and step == FAULT_FROM:
            torch.set_num_threads(int(os.environ.get("THREADS", "2")))
        tok = torch.randint(0, 1000, (8, 32), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tok).flatten(0, 1), tok.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print("trained", STEPS, "steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
