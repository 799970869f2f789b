"""A plain torchrun-style DDP job, written the way users write them, for the job-end soak test.

The model is never deleted and the script ends with destroy_process_group(): the DDP reducer and its
gloo process group are torn down by the interpreter, as in most real scripts. Knobs (env):
STEPS; SLOW_RANK/SLOW_LAST (extra matmuls on the last N steps: a trigger fires as the job ends);
FREEZE_RANK (a helper process SIGSTOPs this rank 250 ms once a second, through its exit);
KILL_RANK/KILL_AT (SIGKILL at that step); STUCK_EXIT_RANK (finishes, then blocks in interpreter
teardown, like a library thread deadlocking Python's exit); SHORT_RANK (runs half the steps: its
data ran out first, uneven inputs); FINAL_SAVE_S (rank 0 saves the final model for this long after
the last step while the others end); NO_DESTROY (the script never calls destroy_process_group(), as
many do not: the program's gloo connections close only when its process ends); FINAL_UPLOAD_S
(rank 0 waits this long for a subprocess after the last step, as an upload of the final model);
MPI_FINALIZE (the script uses mpi4py itself: an MPI allreduce at the end, then MPI.Finalize(), then
a few more local optimizer steps before it writes its result).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "40"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_LAST = int(os.environ.get("SLOW_LAST", "0"))
FREEZE_RANK = int(os.environ.get("FREEZE_RANK", "-1"))
KILL_RANK = int(os.environ.get("KILL_RANK", "-1"))
KILL_AT = int(os.environ.get("KILL_AT", "-1"))
STUCK_EXIT_RANK = int(os.environ.get("STUCK_EXIT_RANK", "-1"))
SHORT_RANK = int(os.environ.get("SHORT_RANK", "-1"))
FINAL_SAVE_S = float(os.environ.get("FINAL_SAVE_S", "0"))
FINAL_UPLOAD_S = float(os.environ.get("FINAL_UPLOAD_S", "0"))
FAULTS = Path(__file__).resolve().parents[3] / "scripts" / "faultlib" / "faults.py"


class StuckAtExit:
    """Blocks when the interpreter clears module globals at exit (after every atexit handler)."""

    def __del__(self) -> None:
        time.sleep(3600)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == FREEZE_RANK:
        subprocess.Popen([sys.executable, str(FAULTS), "apply", "--pid", str(os.getpid()), "--kind", "freeze",
                          "--seconds", "600", "ms=250", "every=1.0"])
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 256), torch.randn(16, 256)
    extra = torch.randn(256, 256)
    for step in range(STEPS // 2 if rank == SHORT_RANK else STEPS):
        if rank == KILL_RANK and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        inp = x
        if rank == SLOW_RANK and step >= STEPS - SLOW_LAST:
            for _ in range(150):
                inp = inp + 1e-6 * (inp @ extra)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(inp), y).backward()
        opt.step()
    out = Path(os.environ["OUT_DIR"])
    if rank == 0 and FINAL_SAVE_S:
        end = time.monotonic() + FINAL_SAVE_S
        while time.monotonic() < end:
            torch.save(model.state_dict(), out / "final.pt")
            fd = os.open(out / "final.pt", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    if rank == 0 and FINAL_UPLOAD_S:
        subprocess.run(["sleep", str(FINAL_UPLOAD_S)], check=True)
    if os.environ.get("MPI_FINALIZE"):
        from mpi4py import MPI

        assert MPI.COMM_WORLD.allreduce(1) == dist.get_world_size()
        dist.destroy_process_group()
        MPI.Finalize()
        param = torch.nn.Parameter(torch.ones(4))
        local = torch.optim.SGD([param], lr=0.1)
        for _ in range(3):   # steps after MPI is gone: eroica must not vote in them
            param.sum().backward()
            local.step()
        (out / f"rank{rank}.json").write_text(json.dumps({"steps": STEPS}))
        return
    (out / f"rank{rank}.json").write_text(json.dumps({"steps": STEPS}))
    if not os.environ.get("NO_DESTROY"):
        dist.destroy_process_group()


if int(os.environ.get("RANK", "-1")) == STUCK_EXIT_RANK:
    stuck = StuckAtExit()
main()
