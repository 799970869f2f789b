"""Multi-rank fault experiment for the summary builder (run under ``mpiexec -n 4``).

Each scenario trains a small gloo DDP MLP, injects one fault on one rank, profiles K steps the
way capture.py does (start at a step boundary, ``prof.step()`` at each boundary inside the
window, stop after K steps; a ``schedule(wait=0, warmup=0, active=K)`` so every step is a
``ProfilerStep#N`` annotation), builds the summary with ``summary.build`` and writes it to
``<out>/<scenario>.rank<r>.msgpack`` (and ``.raw.`` built from the raw kineto events).
``--capture module`` profiles through the product's ``eroica_runtime.capture.Capture`` instead
(taking its profiler object so both event forms can be built); ``--capture waiting`` does the same
beside a torch.profiler of the job's own that waits for its steps (a schedule's ``wait``: it opens a
``ProfilerStep#N`` range at every step, after eroica's mark, as a training loop's ``prof.step()``
after its optimizer step does). RANK/WORLD_SIZE come from
PMI_RANK/PMI_SIZE.

``--scenarios compute:1,gc:3`` picks the slow rank per scenario (default ``--slow-rank``), and
``module/compute:2`` the capture mode of one scenario (default ``--capture``; its files are then named
``module-compute.*``), so one launch can run both modes.
Scenarios: ``compute`` (extra matmuls in forward), ``data0`` / ``data2`` (slow Dataset
``__getitem__``, num_workers 0 / 2), ``gc`` (GC storm), ``direct`` (plain dist.all_reduce,
no DDP, with extra compute on the slow rank), ``none`` (healthy baseline).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
import warnings

rank = int(os.environ.get("PMI_RANK", os.environ.get("RANK", "0")))
world = int(os.environ.get("PMI_SIZE", os.environ.get("WORLD_SIZE", "1")))
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                  MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from eroica_runtime import summary, telemetry  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
ARGS = argparse.Namespace()
FAULT = {"compute": False, "data": False, "gc": False}
_HEAP: list = []


class MLP(torch.nn.Module):
    """Four 512-wide layers; the slow rank adds a matmul loop when the compute fault is on."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(4))
        self.out = torch.nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        if FAULT["compute"]:
            a = torch.ones(384, 384) / 384
            for _ in range(ARGS.extra):
                a = a @ a
                a = a / a.norm()
            x = x + a.sum() * 0
        return self.out(x)


class SlowDataset(torch.utils.data.Dataset):
    """Random samples; sleeps in __getitem__ when the data fault is on for this rank."""

    def __init__(self, slow: bool, scale: float) -> None:
        self.slow = slow
        self.scale = scale

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.slow:
            time.sleep(ARGS.sleep_ms / 1000.0 * self.scale)
        return torch.randn(512), i % 10


def gc_storm() -> None:
    """Make garbage with cycles and force full collections over a large live heap."""
    junk = []
    for _ in range(2000):
        d: dict = {}
        d["self"] = d
        junk.append(d)
    del junk
    for _ in range(ARGS.gc_collects):
        gc.collect()


def run(scenario: str, slow_rank: int, mode: str, name: str, model: torch.nn.Module | None,
        opt: torch.optim.Optimizer | None, out: str, gcmon: telemetry.GcMonitor) -> None:
    slow = rank == slow_rank
    _HEAP.clear()
    if slow and scenario == "gc":
        _HEAP.extend({"i": i} for i in range(60_000))  # makes each full collection expensive
    FAULT["compute"] = slow and scenario in ("compute", "direct")
    FAULT["data"] = slow and scenario.startswith("data")
    FAULT["gc"] = slow and scenario == "gc"
    workers = 2 if scenario == "data2" else 0
    loader = torch.utils.data.DataLoader(SlowDataset(FAULT["data"], 8.0 if workers else 1.0), batch_size=ARGS.batch,
                                         num_workers=workers)
    it = iter(loader)
    flat = torch.randn(300_000)
    jobs = None   # the job's own profiler, waiting for its steps ("waiting" mode)
    if mode == "waiting":
        jobs = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=10**6, warmup=1, active=1))
        jobs.start()

    def step() -> None:
        x, y = next(it)
        if FAULT["gc"]:
            gc_storm()
        if scenario == "direct":
            h = x
            for _ in range(6):
                h = torch.tanh(h @ torch.ones(512, 512) / 512)
            if FAULT["compute"]:
                a = torch.ones(384, 384) / 384
                for _ in range(ARGS.extra):
                    a = a @ a
                    a = a / a.norm()
            dist.all_reduce(flat)
            work = dist.all_reduce(flat, async_op=True)
            work.wait()
            return
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def job_step() -> None:   # the job's prof.step() after its step (after eroica's boundary)
        if jobs is not None:
            jobs.step()

    for _ in range(ARGS.warmup):
        step()
        job_step()
    dist.barrier()
    k = ARGS.k
    step_ms = []
    tel_start = telemetry.sample()
    gc0 = gcmon.snapshot()
    if mode in ("module", "waiting"):  # the product's own capture.Capture (lead's module)
        from eroica_runtime.capture import Capture

        cap = Capture()
        cap.start(100, "test", k)  # as the runtime does: one lead-in step, then the k window steps
        step()
        cap.mark()
        job_step()
        for i in range(k):
            t0 = time.perf_counter()
            step()
            step_ms.append((time.perf_counter() - t0) * 1000.0)
            if i < k - 1:
                cap.mark()
                job_step()
        prof = cap._prof  # stop it here (not cap.stop()) so both event forms can be built
        cap._prof = None
        prof.stop()
        if jobs is not None:
            jobs.stop()
    else:
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False, with_stack=False,
                       schedule=schedule(wait=0, warmup=0, active=k))
        prof.start()
        for i in range(k):
            t0 = time.perf_counter()
            step()
            step_ms.append((time.perf_counter() - t0) * 1000.0)
            if i < k - 1:
                prof.step()
        prof.stop()
    gc1 = gcmon.snapshot()
    tel_end = telemetry.sample()
    t0 = time.perf_counter()
    raw = prof.profiler.kineto_results.events()
    t_raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    events = prof.events()
    t_events = time.perf_counter() - t0
    identity = {"rank": rank, "local_rank": rank, "world_size": world, "pid": os.getpid(),
                "host": socket.gethostname(), "device": {"index": None, "uuid": None, "name": None},
                "groups": [], "versions": {"eroica": "test", "torch": torch.__version__}}
    kw = {"identity": identity, "capture": {"step": 100, "trigger": "test", "k": k},
          "steps": [{"step": 100 + i, "ms": ms} for i, ms in enumerate(step_ms)],
          "gc": {"count": (gc1[0] - gc0[0]) / k, "ms": (gc1[1] - gc0[1]) / k},
          "telemetry": {"start": tel_start, "end": tel_end}}
    t0 = time.perf_counter()
    doc = summary.build(events, **kw)
    t_build = time.perf_counter() - t0
    data = summary.encode(doc)
    with open(os.path.join(out, f"{name}.rank{rank}.msgpack"), "wb") as fh:
        fh.write(data)
    # the same window from the raw kineto events (the cheap path capture.py may use)
    t0 = time.perf_counter()
    raw_data = summary.encode(summary.build(raw, **kw))
    t_build_raw = time.perf_counter() - t0
    with open(os.path.join(out, f"{name}.raw.rank{rank}.msgpack"), "wb") as fh:
        fh.write(raw_data)
    ph = doc["phases"]
    print(f"[{name}] rank {rank}{'*' if slow else ' '} " + " ".join(
        f"{p}={ph[p]:.1f}" for p in ("step", "data", "forward", "backward", "optimizer", "comm",
                                     "comm_total", "host_gap", "gc", "overlap"))
          + f" bytes={len(data)} events_s={t_events:.3f} build_s={t_build:.3f}"
          + f" raw_events_s={t_raw:.3f} raw_build_s={t_build_raw:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", default="compute,data0,data2,gc,direct")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--extra", type=int, default=40)
    ap.add_argument("--sleep-ms", type=float, default=3.0)
    ap.add_argument("--gc-collects", type=int, default=1)
    ap.add_argument("--capture", choices=("schedule", "module", "waiting"), default="schedule",
                    help="profile with a schedule (ProfilerStep per step) or through eroica_runtime.capture "
                         "(waiting: beside a profiler of the job's own waiting for its steps)")
    ap.parse_args(namespace=ARGS)
    os.makedirs(ARGS.out, exist_ok=True)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    gcmon = telemetry.GcMonitor().install()
    model = torch.nn.parallel.DistributedDataParallel(MLP(), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for item in ARGS.scenarios.split(","):
        spec, _, who = item.partition(":")
        mode, _, scenario = spec.rpartition("/")
        if mode not in ("", "schedule", "module", "waiting"):
            ap.error(f"--scenarios {item!r}: capture mode {mode!r} is not 'schedule', 'module' or 'waiting'")
        run(scenario, int(who) if who else ARGS.slow_rank, mode or ARGS.capture, spec.replace("/", "-"), model,
            opt, ARGS.out, gcmon)
        dist.barrier()
    del model, opt  # DDP's reducer holds the process group: free it before the group goes
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main()
    gc.freeze()   # leave fast (the exit's last collections over torch's objects): tests/data/runtime/train.py
    sys.exit(rc)
