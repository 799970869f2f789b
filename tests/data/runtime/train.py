"""A small, unmodified torchrun-style DDP job with an optional real fault on one rank.

FAULT=compute|data|gc|leak|none on FAULT_RANK from step FAULT_FROM (optimizer steps); STEPS steps.
LOOP=closure runs forward and backward inside ``optimizer.step(closure)``, as PyTorch Lightning does;
LOOP=manual updates the weights itself (``p -= lr * p.grad``), with no torch.optim optimizer;
LOOP=inference only runs forward under no_grad and all-reduces the outputs (no backward, no step).
LOOP=amp scales the loss with a torch.amp.GradScaler, whose step() skips the optimizer step when the
gradients hold an inf (the loss is made inf at the first 3 steps, as a mixed-precision job's first
steps overflow while the scale settles, and then every AMP_SKIP_EVERY steps).
compute: extra matmuls inside forward; data: the Dataset's __getitem__ sleeps; gc: cyclic garbage and
forced collections each step; leak: keeps LEAK_MB more MB of tensors every step, as a loop that holds
what it should drop. Writes nothing itself; eroica (if injected) does the watching.
"""
import gc
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "2"))
FAULT_FROM = int(os.environ.get("FAULT_FROM", "40"))
DATA_SLEEP_S = float(os.environ.get("DATA_SLEEP_S", "0.004"))   # data fault: per sample (16 a batch)
STEPS = int(os.environ.get("STEPS", "80"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))       # seconds of (healthy) sleep per step
SLEEP_MORE = float(os.environ.get("SLEEP_MORE", "0"))       # every rank sleeps this much longer ...
SLEEP_MORE_FROM = int(os.environ.get("SLEEP_MORE_FROM", "-1"))   # ... from this step (a job-wide drift)
KILL_RANK = int(os.environ.get("KILL_RANK", "-1"))           # this rank SIGKILLs itself ...
KILL_AT = int(os.environ.get("KILL_AT", "-1"))               # ... at this step
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))           # this rank blocks forever in forward ...
HANG_AT = int(os.environ.get("HANG_AT", "-1"))               # ... from this step
HANG_SAMPLE = int(os.environ.get("HANG_SAMPLE", "-1"))       # or its DataLoader blocks forever reading this sample
PAUSE = os.environ.get("PAUSE", "")       # checkpoint: rank 0 saves while the others wait; eval: all evaluate
PAUSE_AT = [int(s) for s in os.environ.get("PAUSE_AT", "-1").split(",")]   # ... after this step (or these,
#                                          one PAUSE kind each: PAUSE=checkpoint,eval PAUSE_AT=25,40)
PAUSE_EVERY = int(os.environ.get("PAUSE_EVERY", "0"))        # ... or after every this many steps
PAUSE_S = float(os.environ.get("PAUSE_S", "0"))               # ... for this long (no optimizer step meanwhile)
PAUSE_DIR = os.environ.get("PAUSE_DIR", "/tmp")              # where the checkpoint is written
STALL_RANK = int(os.environ.get("STALL_RANK", "-1"))         # this rank works alone (matmuls) ...
STALL_AT = [int(s) for s in os.environ.get("STALL_AT", "-1").split(",")]   # ... once, before this step's
#                                                               forward (or these steps) ...
STALL_S = float(os.environ.get("STALL_S", "0"))               # ... for this long
STALL_KIND = os.environ.get("STALL_KIND", "compute").split(",")   # ... or asleep (sleep: a write to slow
#                                                               storage); one for all, or one per STALL_AT
STALL_EVERY = int(os.environ.get("STALL_EVERY", "0"))        # ... and again every this many steps after it
START_SLEEP_RANK = int(os.environ.get("START_SLEEP_RANK", "-1"))   # this rank reads its shard from slow storage ...
START_SLEEP_S = float(os.environ.get("START_SLEEP_S", "0"))         # ... this long before it builds its model
WORKERS = int(os.environ.get("WORKERS", "0"))
EPOCH_STEPS = int(os.environ.get("EPOCH_STEPS", "0"))          # batches an epoch (0: one epoch of STEPS)
PERSISTENT = os.environ.get("PERSISTENT", "0") == "1"            # persistent_workers, with WORKERS
# the job takes SIGUSR1 for itself as Lightning's SLURM auto-requeue does (only when it has no handler
# yet), and each rank sends itself one at this step, as Slurm's --signal=USR1@90 would
OWN_USR1_AT = int(os.environ.get("OWN_USR1_AT", "-1"))
LOOP = os.environ.get("LOOP", "plain")
# these ranks train with autograd anomaly detection on (a debugging switch left on), off again after the
# last step, as Lightning's Trainer(detect_anomaly=True) does around fit()
ANOMALY_RANKS = [int(r) for r in os.environ.get("ANOMALY_RANKS", "").split(",") if r]
AMP_SKIP_EVERY = int(os.environ.get("AMP_SKIP_EVERY", "0"))
DIM = int(os.environ.get("DIM", "256"))
LEAK_MB = float(os.environ.get("LEAK_MB", "4"))
state = {"step": 0, "usr1": 0}


def faulty(kind: str) -> bool:
    return FAULT == kind and dist.get_rank() == FAULT_RANK and state["step"] >= FAULT_FROM


class Data(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = torch.randn(n, DIM, generator=g)
        self.slow = False

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i == HANG_SAMPLE and int(os.environ.get("RANK", "0")) == HANG_RANK:
            time.sleep(3600)  # a read that never returns (in a DataLoader worker with WORKERS)
        if self.slow:
            time.sleep(DATA_SLEEP_S)
        return self.x[i], self.y[i]


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM) for _ in range(4)])
        self.extra = torch.randn(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == HANG_RANK and 0 <= HANG_AT <= state["step"]:
            time.sleep(3600)  # stuck: the others wait for it in the gradient allreduce
        if faulty("compute"):
            for _ in range(int(os.environ.get("FAULT_MATMULS", "60"))):
                x = x + 1e-6 * (x @ self.extra)
        return self.layers(x)


def stall_kind(step: int) -> str | None:
    """The kind of STALL_RANK's stall before this step, None if none: STALL_AT's steps, and every
    STALL_EVERY steps after the last of them (work it does alone every so often)."""
    if step in STALL_AT:
        return STALL_KIND[min(STALL_AT.index(step), len(STALL_KIND) - 1)]
    last = STALL_AT[-1]
    if STALL_EVERY and last >= 0 and step > last and (step - last) % STALL_EVERY == 0:
        return STALL_KIND[-1]
    return None


def stall_once(kind: str) -> None:
    """One-off work on one rank while the others wait in the next all-reduce (a recompile, a lone save),
    or (kind sleep) a wait off the CPU (a write to a congested filesystem, an upload)."""
    if kind == "sleep":
        time.sleep(STALL_S)
        return
    a = torch.randn(DIM, DIM)
    end = time.monotonic() + STALL_S
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def pause(model: torch.nn.Module, opt: torch.optim.Optimizer, kind: str) -> None:
    """A long stretch without an optimizer step that is no hang: rank 0 writes checkpoints for
    PAUSE_S seconds while the others wait in a barrier (kind checkpoint), or every rank evaluates
    for PAUSE_S seconds, all-reducing its metric after each batch (kind eval)."""
    end = time.monotonic() + PAUSE_S
    if kind == "checkpoint":
        if dist.get_rank() == 0:
            path = os.path.join(PAUSE_DIR, "checkpoint.pt")
            while time.monotonic() < end:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": state["step"]}, path)
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        dist.barrier()
    elif kind == "eval":
        done = torch.zeros(1)
        with torch.no_grad():
            while not done.item():
                x = torch.randn(16, DIM)
                metric = model(x).pow(2).mean().reshape(1)
                dist.all_reduce(metric)
                done[0] = float(time.monotonic() >= end)
                dist.all_reduce(done, op=dist.ReduceOp.MAX)   # every rank stops after the same batch


def load_shard() -> None:
    """A start that waits on storage (a data shard or checkpoint read from a slow filesystem)."""
    time.sleep(START_SLEEP_S)


def main() -> None:
    dist.init_process_group("gloo")
    if OWN_USR1_AT >= 0 and signal.getsignal(signal.SIGUSR1) in (None, signal.SIG_DFL):
        signal.signal(signal.SIGUSR1, lambda signum, frame: state.__setitem__("usr1", state["usr1"] + 1))
    torch.manual_seed(0)
    if dist.get_rank() == START_SLEEP_RANK:
        load_shard()
    model = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if LOOP == "amp" else None
    data = Data(16 * EPOCH_STEPS if EPOCH_STEPS else 64 * STEPS)
    loader = DataLoader(data, batch_size=16, num_workers=WORKERS, persistent_workers=PERSISTENT and WORKERS > 0)
    junk = []
    kept = []
    if dist.get_rank() in ANOMALY_RANKS:
        torch.autograd.set_detect_anomaly(True)
    for x, y in (batch for _ in range(STEPS) for batch in loader):   # epochs until STEPS steps
        if state["step"] >= STEPS:
            break
        data.slow = faulty("data")
        if faulty("gc"):
            for _ in range(20000):
                a = []
                a.append(a)
                junk.append(a)
            gc.collect()
            junk.clear()
        if faulty("leak"):
            kept.append(torch.ones(int(LEAK_MB * 2**18)))
        if dist.get_rank() == KILL_RANK and state["step"] == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        if dist.get_rank() == STALL_RANK and (kind := stall_kind(state["step"])):
            stall_once(kind)
        if STEP_SLEEP or SLEEP_MORE:
            time.sleep(STEP_SLEEP + (SLEEP_MORE if 0 <= SLEEP_MORE_FROM <= state["step"] else 0.0))
        if LOOP == "closure":
            def closure(x: torch.Tensor = x, y: torch.Tensor = y, model: torch.nn.Module = model,
                        opt: torch.optim.Optimizer = opt) -> torch.Tensor:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
        elif LOOP == "manual":
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
        elif LOOP == "amp":
            assert scaler is not None
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if state["step"] < 3 or (AMP_SKIP_EVERY and state["step"] % AMP_SKIP_EVERY == AMP_SKIP_EVERY - 1):
                loss = loss * float("inf")   # an overflow: the scaler skips this step
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        elif LOOP == "inference":
            with torch.no_grad():
                dist.all_reduce(model(x).sum(0))
        else:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        state["step"] += 1
        if state["step"] in PAUSE_AT:
            pause(model, opt, PAUSE.split(",")[PAUSE_AT.index(state["step"])])
        elif PAUSE_EVERY and state["step"] % PAUSE_EVERY == 0:
            pause(model, opt, PAUSE)
        if state["step"] == OWN_USR1_AT:
            os.kill(os.getpid(), signal.SIGUSR1)
        if state["step"] == 10 and dist.get_rank() == 0:
            print("reached step 10", flush=True)  # tests wait for this: the runtime is up on all ranks
    torch.autograd.set_detect_anomaly(False)
    if dist.get_rank() == 0:
        print(f"trained {state['step']} steps", flush=True)
    if OWN_USR1_AT >= 0:
        print(f"rank {dist.get_rank()}: the job's SIGUSR1 handler ran {state['usr1']} time(s)", flush=True)
    # DDP's reducer holds the process group: free it first, and tear down together (a DDP model left
    # to the interpreter's final GC, after its group is gone, aborts the rank now and then)
    del model, opt, loader
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave fast: the interpreter's last collections at exit walk the ~1M objects torch and its dynamo
    # left, ~0.7 s of CPU a rank (0.7-2.5 s of a 4-rank job's wall time on 2 cores, docs/benchmarks.md §9). Nothing this
    # script leaves behind needs a finalizer; a real job's exit is tested by tests/data/exit/job.py.
    gc.freeze()
