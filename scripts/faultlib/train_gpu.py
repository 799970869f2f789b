"""DDP training job for the GPU bench: a transformer LM on CUDA (gloo with CUDA tensors when ranks share
one GPU: NCCL refuses two ranks on one device), with a fault planted by environment only.

``EROICA_GPU_FAULT`` (empty: healthy), one of::

    matmul:rank=R:start=S:n=N      N extra square bf16 matmuls (size --mm-size) per step, in forward
    pageable:rank=R:start=S:mb=M   M MB copied host->device from pageable memory per step
    data:rank=R:start=S:ms=T       the rank's dataset sleeps T ms per batch
    gc:rank=R:start=S              cyclic garbage and a full gc.collect() per step

At the end every rank prints ``BENCH_STEPS {json}`` (its step times, ms); ``--cpu-smoke`` runs the same
code on CPU tensors (tiny sizes) to test the bench without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

KINDS = ("matmul", "pageable", "data", "gc")


def parse_fault(text: str) -> dict[str, str]:
    """EROICA_GPU_FAULT -> {kind, rank, start, ...}; SystemExit with one line naming what is wrong."""
    if not text:
        return {}
    kind, *params = text.split(":")
    out = {"kind": kind}
    for p in params:
        key, _, value = p.partition("=")
        out[key] = value
    if kind not in KINDS:
        raise SystemExit(f"train_gpu: EROICA_GPU_FAULT={text!r}: unknown kind {kind!r} (use {', '.join(KINDS)})")
    for key, kind_of in (("rank", int), ("start", int), ("n", int), ("mb", float), ("ms", float)):
        try:
            if key in out:
                kind_of(out[key])
        except ValueError:
            raise SystemExit(f"train_gpu: EROICA_GPU_FAULT={text!r}: {key}={out[key]!r} is not a number") from None
    return out


class Tokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int, sleep_ms: float = 0.0) -> None:
        self.n, self.seq, self.vocab, self.sleep_ms = n, seq, vocab, sleep_ms
        self.slow = False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.slow and self.sleep_ms:
            time.sleep(self.sleep_ms / 1e3)
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.extra: torch.Tensor | None = None   # the planted GEMMs' operand
        self.extra_n = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos[: x.shape[1]]
        for _ in range(self.extra_n):
            assert self.extra is not None
            self.extra = self.extra @ self.extra * 1e-4    # extra device work only this rank does
        return self.head(self.body(h, is_causal=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--mm-size", type=int, default=4096)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.batch, args.seq, args.vocab, args.d_model, args.layers, args.heads, args.mm_size = 4, 32, 512, 64, 2, 4, 256
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = not args.cpu_smoke and torch.cuda.is_available()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    backend = "nccl" if cuda and torch.cuda.device_count() >= world else "gloo"
    fault = parse_fault(os.environ.get("EROICA_GPU_FAULT", ""))
    dist.init_process_group(backend)
    mine = fault and int(fault.get("rank", "-1")) == rank
    start = int(fault.get("start", "60")) if fault else 1 << 30
    torch.manual_seed(0)
    dtype = torch.bfloat16 if cuda else torch.float32
    model = LM(args.vocab, args.d_model, args.layers, args.heads, args.seq).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if backend == "nccl" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    data = Tokens(args.batch * (args.steps + 2), args.seq, args.vocab,
                  float(fault.get("ms", "0")) if fault.get("kind") == "data" else 0.0)
    loader = iter(DataLoader(data, batch_size=args.batch))
    pageable = torch.ones(int(float(fault.get("mb", "0")) * 2**20) // 4) if fault.get("kind") == "pageable" else None
    junk: list = []
    step_ms = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        active = mine and step >= start
        data.slow = active and fault["kind"] == "data"
        if active and fault["kind"] == "matmul" and model.extra is None:
            model.extra = torch.randn(args.mm_size, args.mm_size, device=dev, dtype=dtype)
        model.extra_n = int(fault.get("n", "0")) if active and fault["kind"] == "matmul" else 0
        batch = next(loader).to(dev, non_blocking=True)
        if active and pageable is not None:
            pageable.to(dev)                       # host->device from pageable memory
        if active and fault["kind"] == "gc":
            for _ in range(20000):
                a: list = []
                a.append(a)
                junk.append(a)
            gc.collect()
            junk.clear()
        with torch.autocast(dev.type, dtype=dtype, enabled=cuda):
            logits = ddp(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab).float(), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()                                 # the host waits for the device once a step
        step_ms.append((time.perf_counter() - t0) * 1e3)
    print("BENCH_STEPS " + json.dumps({"rank": rank, "host": socket.gethostname(), "backend": backend,
                                       "device": str(dev), "step_ms": [round(x, 3) for x in step_ms]}), flush=True)
    del ddp, model, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
