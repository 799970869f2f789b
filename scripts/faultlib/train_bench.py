"""Tiny DDP training job for the fault bench: a small transformer LM on CPU with gloo.

Why: the bench needs a real training loop (DataLoader, forward/backward, gradient allreduce, optimizer
step) that runs unmodified under ``torchrun``, ``eroica-run`` or plain ``mpiexec``, with a fault planted
by environment only (``EROICA_BENCH_FAULT``, see :mod:`faults`), so the launcher never changes.

    torchrun --nproc-per-node 4 scripts/faultlib/train_bench.py --steps 60
    EROICA_BENCH_FAULT=compute:rank=2:start=20:ms=50 torchrun --nproc-per-node 4 scripts/faultlib/train_bench.py
    torchrun --nproc-per-node 4 scripts/faultlib/train_bench.py --parallel fsdp2 --compile   # FSDP2, compiled
    torchrun --nproc-per-node 4 scripts/faultlib/train_bench.py --checkpoint-every 25   # rank 0 saves, others wait

``--parallel fsdp2`` shards the model with FSDP2 (``fully_shard`` per layer and at the root, on a 1-D
CPU device mesh: per-layer all-gathers in forward and backward, reduce-scatters of the gradients)
instead of DDP's one bucketed all-reduce; ``--compile`` runs the model under ``torch.compile``
(inductor's CPU code: the compiled graph's ops replace the eager ones in the profile).

Rank/world come from RANK/WORLD_SIZE (torchrun, eroica-run), else PMI_RANK/PMI_SIZE (bare mpiexec);
MASTER_ADDR/MASTER_PORT default to 127.0.0.1:29500. At the end every rank prints ``BENCH_STEPS {json}``
(its step times and fault on/off events) and rank 0 prints a per-step table and ``BENCH_SUMMARY {json}``;
with ``--out DIR`` (or EROICA_BENCH_OUT) each rank also writes ``DIR/steps-rank<r>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so "faultlib" imports when run as a file

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from faultlib.faults import FaultController  # noqa: E402


class TokenDataset(Dataset):
    """Deterministic random token sequences (no download; the same on every run)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(idx)
        return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)


class TinyLM(nn.Module):
    """Embedding + a few pre-norm transformer encoder layers + LM head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos[: x.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.body(h, mask=mask, is_causal=True))


def _env_int(names: tuple[str, ...], default: int) -> int:
    for n in names:
        if os.environ.get(n):
            return int(os.environ[n])
    return default


def launcher_rank_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's/eroica-run's environment, else bare mpiexec's (MPICH, Open MPI)."""
    return (_env_int(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"), 0),
            _env_int(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 1))


def _at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer >= lo (a zero batch or step count fails late and obscurely, in
    the DataLoader or the model, on every rank)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{value} must be at least {lo}")
        return value
    return parse


def bench_parser(description: str, d_model: int = 128, heads: int = 4) -> argparse.ArgumentParser:
    """The flags every bench training job takes (this one, the Lightning and the HF Trainer jobs), so
    the bench drives them all alike."""
    e = os.environ.get
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=_at_least(1), default=int(e("EROICA_BENCH_STEPS", "60")), help="optimizer steps")
    ap.add_argument("--batch-size", type=_at_least(1), default=8)
    ap.add_argument("--seq", type=_at_least(1), default=32)
    ap.add_argument("--vocab", type=_at_least(2), default=1000)
    ap.add_argument("--d-model", type=_at_least(1), default=d_model)
    ap.add_argument("--layers", type=_at_least(1), default=2)
    ap.add_argument("--heads", type=_at_least(1), default=heads)
    ap.add_argument("--workers", type=_at_least(0), default=int(e("EROICA_BENCH_WORKERS", "0")))
    ap.add_argument("--threads", type=_at_least(1), default=int(e("EROICA_BENCH_THREADS", "1")))
    ap.add_argument("--out", default=e("EROICA_BENCH_OUT"))
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    e = os.environ.get
    ap = bench_parser(__doc__.splitlines()[0])
    ap.add_argument("--parallel", choices=("ddp", "fsdp2"), default=e("EROICA_BENCH_PARALLEL", "ddp"),
                    help="data parallelism: DDP (one bucketed all-reduce) or FSDP2 (fully_shard per layer)")
    ap.add_argument("--compile", action="store_true", default=e("EROICA_BENCH_COMPILE", "") == "1",
                    help="run the model under torch.compile")
    ap.add_argument("--device-ms", type=float, default=float(e("EROICA_BENCH_DEVICE_MS", "0")),
                    help="sleep this long per step after the backward, standing in for accelerator time "
                         "the host waits on (a GPU-bound step): the CPU is idle, as on a real GPU job")
    ap.add_argument("--checkpoint-every", type=_at_least(0), default=int(e("EROICA_BENCH_CHECKPOINT_EVERY", "0")),
                    help="every N steps rank 0 saves the model and optimizer state (torch.save, fsync) while the "
                         "other ranks wait at a barrier, as most training loops do; 0: never")
    ap.add_argument("--checkpoint-mb", type=_at_least(0), default=int(e("EROICA_BENCH_CHECKPOINT_MB", "200")),
                    help="MB of extra state in each checkpoint (the tiny model's own is ~2 MB)")
    args = ap.parse_args(argv)
    if args.parallel not in ("ddp", "fsdp2"):   # argparse checks choices on the command line, not a default
        ap.error(f"EROICA_BENCH_PARALLEL={args.parallel!r}: expected ddp or fsdp2")
    return args


@contextlib.contextmanager
def joined_job(threads: int) -> Iterator[tuple[int, int, FaultController]]:
    """(rank, world size, the fault planted on this rank) inside the job's gloo process group, as every
    bench job runs: torch's threads and seed set, env:// with MASTER_ADDR/PORT defaulting to
    127.0.0.1:29500. On the way out, after the caller dropped its model (DDP's reducer and FSDP hold the
    group), the ranks tear down together: a gloo group destroyed at interpreter exit, or while a peer
    still talks to it, can abort."""
    rank, world = launcher_rank_world()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    ctl = FaultController.from_env(rank)
    try:
        yield rank, world, ctl
        gc.collect()
        dist.barrier()
    finally:
        ctl.close()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with joined_job(args.threads) as (rank, world, ctl):
        model = parallel(TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq), args.parallel, world)
        if args.compile:
            model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        n_items = args.batch_size * world * (args.steps + 1)
        ds = ctl.wrap_dataset(TokenDataset(n_items, args.seq, args.vocab), batch_size=args.batch_size)
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
        loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
        it = iter(loader)
        loss_fn = nn.CrossEntropyLoss()
        step_ms: list[float] = []
        save = checkpointer(rank, args.checkpoint_mb) if args.checkpoint_every else None
        for step in range(args.steps):
            t0 = time.perf_counter()
            ctl.step(step)
            batch = next(it)
            logits = model(batch[:, :-1])
            loss = loss_fn(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.device_ms:
                time.sleep(args.device_ms / 1e3)
            ctl.after_collectives(step)
            opt.step()
            if save is not None and step % args.checkpoint_every == args.checkpoint_every - 1:
                save(model, opt)
            step_ms.append((time.perf_counter() - t0) * 1e3)
        ctl.close()
        report(rank, world, step_ms, ctl, float(loss.item()), args.out)
        del model, opt, it, loader   # DDP's reducer holds the process group: dropped before the teardown
    return 0


def checkpointer(rank: int, extra_mb: int) -> Callable[[nn.Module, torch.optim.Optimizer], None]:
    """What a training loop's periodic checkpoint does: rank 0 writes the model's and the optimizer's
    state (and ``extra_mb`` of other state) to local storage and syncs it while every other rank
    waits at a barrier. The file is rewritten in place, in a directory removed at exit; only rank 0
    holds the extra state."""
    if rank != 0:
        return lambda model, opt: dist.barrier()
    import atexit
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="eroica-bench-ckpt-"))
    atexit.register(shutil.rmtree, where, True)
    extra = torch.zeros(extra_mb * (1 << 20) // 4)

    def save(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        path = where / "checkpoint.pt"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        dist.barrier()
    return save


def parallel(model: TinyLM, how: str, world: int) -> nn.Module:
    """The model wrapped for data parallelism as a user would: DDP, or FSDP2 per layer and at the root."""
    if how == "ddp":
        return DDP(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for layer in model.body.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def report(rank: int, world: int, step_ms: list[float], ctl: FaultController, loss: float, out: str | None) -> None:
    """Print (and optionally write) per-step timings; rank 0 also prints the job view."""
    mine = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "step_ms": [round(x, 3) for x in step_ms],
            "fault_events": ctl.events, "fault_event_wall": ctl.event_wall, "loss": loss,
            "end_wall": time.time()}
    print("BENCH_STEPS " + json.dumps(mine), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"steps-rank{rank}.json").write_text(json.dumps(mine))
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return
    rows = [g for g in gathered if g]
    per_step = [max(r["step_ms"][s] for r in rows) for s in range(len(step_ms))]
    print("step " + " ".join(f"{'r' + str(r['rank']):>8}" for r in rows) + "      max")
    for s, m in enumerate(per_step):
        print(f"{s:4d} " + " ".join(f"{r['step_ms'][s]:8.1f}" for r in rows) + f" {m:8.1f}")
    starts = [e[0] for r in rows for e in r["fault_events"] if e[2] == "on"]
    first = min(starts) if starts else None
    warm = per_step[min(3, len(per_step) - 1):]  # skip warm-up steps
    summary = {"world": world, "steps": len(per_step), "median_step_ms": statistics.median(warm) if warm else None,
               "fault_start": first, "hosts": sorted({r["host"] for r in rows})}
    if first is not None and 3 < first < len(per_step):
        summary["median_before_ms"] = statistics.median(per_step[3:first])
        summary["median_after_ms"] = statistics.median(per_step[first:])
    print("BENCH_SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    rc = main()
    gc.freeze()   # leave fast (the exit's last collections over torch's objects): tests/data/runtime/train.py
    sys.exit(rc)
