"""A rank that profiles once (kineto logs its start/stop on stderr) and draws a progress bar the way
tqdm does: carriage returns, no newline until the end. Rank 0 waits (up to 60 s) for the file
PROGRESS_SEEN before finishing its bar: the test creates it once the partial bar reached its console."""
import os
import sys
import time

import torch
from torch.profiler import profile

with profile():
    torch.zeros(1).add_(1)
print(f"profiled rank={os.environ['RANK']}", flush=True)
if os.environ["RANK"] == "0":
    sys.stderr.write("\rprogress  50%|#####     |")
    sys.stderr.flush()
    seen, deadline = os.environ["PROGRESS_SEEN"], time.monotonic() + 60
    while not os.path.exists(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stderr.write("\rprogress 100%|##########|" + (" seen" if os.path.exists(seen) else " not seen") + "\n")
    sys.stderr.flush()
