"""One rank (FAIL_RANK, default 2) fails while the others keep waiting.

FAIL_MODE=raise: it raises ValueError. FAIL_MODE=kill: it SIGKILLs itself. FAIL_MODE=oom (root): it joins a
memory cgroup of FAIL_LIMIT_MB (64; named FAIL_CGROUP) and fills 8 times that at once, or with FAIL_LEAK_MB
keeps that many MB more every 0.1 s, so the kernel's OOM killer ends it.
FAIL_MODE=worker-oom (root): its DataLoader worker does that, and the rank raises torch's "DataLoader
worker (pid N) is killed by signal: Killed."
FAIL_MODE=worker-copies (root): it builds a dataset of 2 million Python strings (~190 MB), joins the
memory cgroup (FAIL_LIMIT_MB) and reads it in order through 2 forked DataLoader workers, a batch of
16,384 every FAIL_BATCH_S (0.05 s: ~30 MB of strings a second):
each worker copies the pages of the strings it reads (their reference counts), which the cgroup charges,
until its OOM killer ends the largest process, the rank (all the rank's own memory predates the cgroup).
FAIL_MODE=kill-busy-workers: it starts 2 DataLoader workers, each in a 120 s __getitem__ (writing its pid
into the folder FAIL_PIDS first), and SIGKILLs itself once both are in it.
FAIL_ATTEMPTS=N: it fails only in the first N attempts (TORCHELASTIC_RESTART_COUNT < N), after which
every rank finishes normally (for --max-restarts).
"""
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def outgrow_memory() -> None:
    """Join a memory cgroup of FAIL_LIMIT_MB and outgrow it (at once, or FAIL_LEAK_MB every 0.1 s): the
    kernel's OOM killer ends this process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    from faultlib import faults

    limit_mb, leak_mb = int(os.environ.get("FAIL_LIMIT_MB", "64")), int(os.environ.get("FAIL_LEAK_MB", "0"))
    jail = faults.CgroupJail("memory", os.environ["FAIL_CGROUP"])
    limit = jail.create() / ("memory.limit_in_bytes" if jail.mode == "v1" else "memory.max")
    limit.write_text(str(limit_mb << 20))
    jail.add(os.getpid())
    kept = []
    while leak_mb:
        kept.append(b"\x01" * (leak_mb << 20))
        time.sleep(0.1)
    hog = b"\x01" * (8 * limit_mb << 20)
    raise SystemExit(f"not killed with {len(hog)} bytes in a {limit_mb} MB cgroup")


class Strings(Dataset):
    def __init__(self, n: int) -> None:
        self.items = [f"item-{i:09d}-" * 3 for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> int:
        return len(self.items[idx])


def read_through_workers() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    from faultlib import faults

    data = Strings(2_000_000)
    jail = faults.CgroupJail("memory", os.environ["FAIL_CGROUP"])
    limit = jail.create() / ("memory.limit_in_bytes" if jail.mode == "v1" else "memory.max")
    limit.write_text(str(int(os.environ.get("FAIL_LIMIT_MB", "64")) << 20))
    jail.add(os.getpid())
    for _epoch in range(20):
        for _ in DataLoader(data, batch_size=16384, num_workers=2, collate_fn=sum):
            time.sleep(float(os.environ.get("FAIL_BATCH_S", "0.05")))
    raise SystemExit("not killed")


class Busy(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, idx: int) -> int:
        (Path(os.environ["FAIL_PIDS"]) / str(os.getpid())).touch()
        time.sleep(120)
        return idx


def kill_with_busy_workers() -> None:
    loader = iter(DataLoader(Busy(), num_workers=2))
    while len(list(Path(os.environ["FAIL_PIDS"]).iterdir())) < 2:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
    next(loader)


class Hog(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, idx: int) -> int:
        outgrow_memory()
        return idx


dist.init_process_group("gloo")
dist.barrier()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
failing = attempt < int(os.environ.get("FAIL_ATTEMPTS", "1000"))
if failing:
    if dist.get_rank() == int(os.environ.get("FAIL_RANK", "2")):
        mode = os.environ.get("FAIL_MODE", "raise")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "oom":
            time.sleep(float(os.environ.get("FAIL_AFTER_S", "0")))   # its wrapper samples its memory meanwhile
            outgrow_memory()
        if mode == "worker-oom":
            next(iter(DataLoader(Hog(), num_workers=1)))
        if mode == "kill-busy-workers":
            kill_with_busy_workers()
        if mode == "worker-copies":
            read_through_workers()
        raise ValueError(f"planted failure on rank {dist.get_rank()}")
    time.sleep(120)  # the launcher must stop the survivors long before this
print(f"rank {dist.get_rank()} finished attempt {attempt}", flush=True)
dist.destroy_process_group()
