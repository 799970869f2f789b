"""A rank that profiles once (kineto logs its start/stop on stderr), runs one window the way eroica's
capture does (torch warns at each toggle of host-op collection around the lead-in step) beside a
profiler of the job's own that waits for its steps (the window stops inside the optimizer step,
itself inside the job's open ProfilerStep#N range: torch's soft assert "collection.cpp:...] Warning:
Optimizer.step#Test.step (function operator())"), and draws a
progress bar the way tqdm does: carriage returns, no newline until the end. Rank 0 waits (up to 60 s) for the file
PROGRESS_SEEN before finishing its bar: the test creates it once the partial bar reached its console."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import profile, record_function, schedule

from eroica_runtime.capture import Capture

with profile():
    torch.zeros(1).add_(1)
dist.init_process_group("gloo")   # from here torch writes its C++ warnings with its own [rankN]: prefix
jobs = profile(schedule=schedule(wait=1000, warmup=1, active=1))   # the job's, waiting for its steps
jobs.start()
cap = Capture()
cap.start(2, "test", 1)
torch.zeros(1).add_(1)
cap.mark()            # eroica's boundary, in the optimizer step's post-hook
jobs.step()           # the job's prof.step() after its optimizer step: its ProfilerStep#1 opens
with record_function("Optimizer.step#Test.step"):
    torch.zeros(1).add_(1)
    names = {e.name() for e in cap.stop()}   # the window closes at the next boundary
jobs.stop()
assert "eroica::step#2" in names and "ProfilerStep#1" in names, sorted(names)
sys.stderr.write("[W1201 00:00:00.000000000 train.cpp:12] a warning of the job's own\n")
print(f"profiled rank={os.environ['RANK']}", flush=True)
if os.environ["RANK"] == "0":
    sys.stderr.write("\rprogress  50%|#####     |")
    sys.stderr.flush()
    seen, deadline = os.environ["PROGRESS_SEEN"], time.monotonic() + 60
    while not os.path.exists(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stderr.write("\rprogress 100%|##########|" + (" seen" if os.path.exists(seen) else " not seen") + "\n")
    sys.stderr.flush()
dist.destroy_process_group()
