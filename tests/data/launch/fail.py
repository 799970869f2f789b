"""One rank (FAIL_RANK, default 2) fails while the others keep waiting.

FAIL_MODE=raise: it raises ValueError. FAIL_MODE=kill: it SIGKILLs itself.
FAIL_ATTEMPTS=N: it fails only in the first N attempts (TORCHELASTIC_RESTART_COUNT < N), after which
every rank finishes normally (for --max-restarts).
"""
import os
import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
failing = attempt < int(os.environ.get("FAIL_ATTEMPTS", "1000"))
if failing:
    if dist.get_rank() == int(os.environ.get("FAIL_RANK", "2")):
        if os.environ.get("FAIL_MODE", "raise") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError(f"planted failure on rank {dist.get_rank()}")
    time.sleep(120)  # the launcher must stop the survivors long before this
print(f"rank {dist.get_rank()} finished attempt {attempt}", flush=True)
dist.destroy_process_group()
