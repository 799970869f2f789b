"""The step clock counts one step per iteration (first optimizer), and mark_step() takes over; each
step also records the training thread's CPU, run-queue and batch-wait time."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

import torch

from eroica_runtime.stepclock import ADOPT_AFTER, LONGEST, SWITCH_AFTER, StepClock


@contextlib.contextmanager
def _counting() -> Iterator[tuple[StepClock, list[int], list[str]]]:
    """An installed clock, the steps it ended and where it was told steps are counted, uninstalled after."""
    seen: list[int] = []
    told: list[str] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.on_counted_at = told.append
    clock.install()
    try:
        yield clock, seen, told
    finally:
        clock.uninstall()


def _opt() -> torch.optim.Optimizer:
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.zeros(2)
    return torch.optim.SGD([p], lr=0.1)


def test_two_optimizers_and_accumulation_count_one_step_per_iteration() -> None:
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        a, b = _opt(), _opt()
        for it in range(10):
            if it % 2 == 1:  # gradient accumulation: the optimizers step every other iteration
                a.step()
                b.step()
    finally:
        clock.uninstall()
    assert seen == [0, 1, 2, 3, 4]
    assert all(ms >= 0 for _, ms in clock.durations)


def test_a_gans_critic_steps_do_not_move_the_count_off_the_generator() -> None:
    """Five critic steps per generator step (WGAN), the generator stepping first: one step per
    generator step, for the whole job."""
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        gen, critic = _opt(), _opt()
        for _ in range(12):
            gen.step()
            for _ in range(5):
                critic.step()
    finally:
        clock.uninstall()
    assert seen == list(range(12))


def test_a_second_stage_with_a_new_optimizer_is_still_counted() -> None:
    """A fine-tuning's second stage steps a new optimizer: whether the first one is gone or kept
    alive, steps go on being counted (only the first stage's were), and the switch records no step
    spanning the steps in between."""
    for keep in (False, True):
        seen: list[int] = []
        clock = StepClock(lambda step, ms, seen=seen: seen.append(step))
        clock.install()
        try:
            first = _opt()
            for _ in range(5):
                first.step()
            kept = [first] if keep else []
            del first
            second = _opt()
            for _ in range(20):
                time.sleep(0.02)
                second.step()
        finally:
            clock.uninstall()
        assert len(kept) == int(keep)
        lost = SWITCH_AFTER if keep else 0
        assert seen == list(range(5 + 20 - lost)), (keep, seen)
        # recorded: never one spanning the SWITCH_AFTER steps the switch took (9 sleeps, 180 ms). The bar
        # leaves a step 120 ms to lose to the scheduler: at 10 ms sleeps and 4.5x the median, one step of
        # 48 ms on a loaded box (stage one beside the Slurm tests) failed it
        later = [ms for step, ms in clock.durations if step >= 5]
        assert max(later) < (SWITCH_AFTER - 1) * sorted(later)[len(later) // 2], clock.durations


def test_mark_step_replaces_the_optimizer_hook() -> None:
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        opt = _opt()
        clock.mark()
        opt.step()  # ignored once steps are marked by hand
        clock.mark()
    finally:
        clock.uninstall()
    assert seen == [0, 1]


def test_mark_step_after_steps_counted_elsewhere_switches_as_any_change_of_where_they_are_counted() -> None:
    """A loop counted at its backward()s (no optimizer) or at its optimizer that starts calling
    mark_step() later: one step a mark from then on, no step spanning the switch, its warm-up no
    stall, and the runtime told (rank 0 says so, the detectors learn the new steps afresh)."""
    for opt_steps in (False, True):
        with _counting() as (clock, seen, told):
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(ADOPT_AFTER + 4):
                model(torch.randn(3, 4)).sum().backward()
                if opt_steps:
                    opt.step()
            before = clock.step
            time.sleep(0.3)    # no step spans this
            for _ in range(3):
                clock.mark()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()     # ignored from the first mark on
        want = ["mark_step"] if opt_steps else ["backward", "mark_step"]
        assert told == want and clock.counted_at == "mark_step", told
        assert seen == list(range(before + 2)) and clock.counted_from == before, (seen, before)
        assert clock.long_from > before and max(ms for _, ms in clock.durations) < 250, clock.durations


def test_an_error_in_the_step_clock_never_reaches_the_jobs_optimizer_step_backward_or_batch() -> None:
    """The clock runs inside the job's optimizer step, its backward() and its DataLoader's next(): an
    error there (a telemetry reading that fails) goes to the runtime (which switches eroica off on the
    rank), and the job's call returns as if eroica were not there."""
    def broken() -> float:
        raise OSError("cgroup file gone")

    for where in ("optimizer", "backward", "batch"):
        errors: list[str] = []
        clock = StepClock(lambda step, ms: None, gc_ms=broken)
        clock.on_error = errors.append
        clock.install()
        try:
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            loader = torch.utils.data.DataLoader(list(range(ADOPT_AFTER + 2)))
            for _ in loader if where == "batch" else range(ADOPT_AFTER + 2):
                if where != "batch":
                    model(torch.randn(3, 4)).sum().backward()
                if where == "optimizer":
                    opt.step()
        finally:
            clock.uninstall()
        assert errors and all("OSError: cgroup file gone" in e for e in errors), (where, errors)


def test_a_step_the_grad_scaler_skipped_still_ends_its_iteration() -> None:
    """A mixed-precision loop whose GradScaler skips the optimizer step when the gradients overflow (the
    first 3 iterations, while the loss scale settles, and every 5th after): one step per iteration, the
    first skipped one included, each about one iteration long (merged, every 5th step was two), and the
    skips counted for the job summary. The scaler's step is torch's again after uninstall."""
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for it in range(30):
            time.sleep(0.02)
            loss = model(torch.ones(2, 4)).sum()
            if it < 3 or it % 5 == 4:
                loss = loss * float("inf")
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        clock.uninstall()
    assert seen == list(range(30)), seen
    assert clock.skips == 3 + 6 and clock.optimizer_steps == 30 - 9 and clock.counted_at == "optimizer"
    ms = sorted(ms for _, ms in clock.durations)
    # two iterations merged are a 2x step (6 of them before); one or two preempted steps on a busy host are not
    assert ms[-3] < 1.8 * ms[len(ms) // 2], clock.durations
    assert not getattr(torch.amp.GradScaler.step, "__eroica_counted__", False)


def test_an_optimizer_from_outside_torch_optim_driven_by_a_grad_scaler_is_counted_and_never_a_skip() -> None:
    """GradScaler drives any object with ``param_groups`` and ``step()``; such a step runs no torch.optim
    post-hook, so every one of them looked skipped ("skipped 30 of 30"). Its steps are counted at the
    scaler's step(), one an iteration, and none is said to be skipped."""
    class Plain:   # an update rule of one's own, no torch.optim base class
        def __init__(self, params: list[torch.nn.Parameter]) -> None:
            self.param_groups = [{"params": params}]

        def step(self) -> None:
            with torch.no_grad():
                for p in self.param_groups[0]["params"]:
                    p -= 0.1 * p.grad

        def zero_grad(self) -> None:
            for p in self.param_groups[0]["params"]:
                p.grad = None

    with _counting() as (clock, seen, _told):
        model = torch.nn.Linear(4, 4)
        opt = Plain(list(model.parameters()))
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(30):
            opt.zero_grad()
            scaler.scale(model(torch.ones(2, 4)).sum()).backward()
            scaler.step(opt)
            scaler.update()
    assert seen == list(range(30)) and clock.skips == 0 and clock.counted_at == "optimizer", (seen, clock.skips)


class _SlowData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.zeros(2)


def test_each_step_records_its_thread_cpu_run_queue_and_batch_wait() -> None:
    clock = StepClock(lambda step, ms: None)
    clock.install()
    # no collection of another test's garbage in these steps (a worker that ran many tests before
    # may reach a generation-2 collection here, which the clock rightly books as GC time)
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        opt = _opt()
        loader = iter(torch.utils.data.DataLoader(_SlowData(), batch_size=4))   # 4 x 2 ms per batch
        for _ in range(6):
            next(loader)
            t = time.perf_counter()
            while time.perf_counter() - t < 0.005:   # 5 ms of CPU work
                pass
            opt.step()
    finally:
        if collecting:
            gc.enable()
        clock.uninstall()
    rows = list(clock.thread)
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    for _, cpu, runq, stops, data, gc_ms, thr in rows:
        assert cpu + runq >= 4.0 and runq >= 0 and stops == 0 and gc_ms == 0   # 5 ms running or runnable
        assert thr == 0.0                        # no quota clock given: nothing held
        assert 7.0 <= data < 40.0, rows          # the batch wait is counted, every step
    # uninstall puts torch's DataLoader back as it was
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    assert not getattr(_BaseDataLoaderIter.__next__, "__eroica_timed__", False)


def test_a_quota_clock_that_gives_up_leaves_the_steps_unheld() -> None:
    """The quota clock returns None once its cgroup files fail: the steps after that record no
    throttled time (never the negative of what was counted so far)."""
    readings = iter([0.0, 5.0, 12.0, None, None, None])
    clock = StepClock(lambda step, ms: None, throttled_ms=lambda: next(readings))
    for _ in range(6):
        clock.mark()
    assert [round(r[6], 3) for r in clock.thread] == [5.0, 7.0, 0.0, 0.0, 0.0]


def test_the_longest_steps_after_warm_up_are_kept_with_what_the_thread_did_and_where() -> None:
    """A one-off stall leaves no capture behind: the clock keeps the few longest steps whole, with the
    training thread's CPU in them and where it was (the watchdog's sample for that step)."""
    clock = StepClock(lambda step, ms: None, long_from=3)
    clock.where = lambda step: ["train.py:10 main", "train.py:20 stall"] if step == 6 else None
    clock.disturbed = lambda step: step == 9   # a capture's lead-in: eroica's link probe held it up
    busy = {1: 0.12, 6: 0.08, 9: 0.03}   # step 1 is warm-up (a first compile): not kept
    for step in range(LONGEST + 8):   # more steps after warm-up than are kept
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < busy.get(step, 0.002):
            pass   # on a CPU, as a recompile or a rank's lone work is
        clock.mark()
    kept = clock.long_steps()
    assert [d["step"] for d in kept][:2] == [6, 9] and len(kept) == LONGEST
    assert all(d["step"] >= 3 for d in kept)
    six = kept[0]
    # busy: on a CPU, or runnable and waiting for one (under -n 2 on 2 cores: 40 + 40 ms of 80 seen)
    assert six["ms"] >= 70 and six["cpu"] > 0 and six["cpu"] + six["runq"] >= 0.8 * six["ms"], six
    assert six["where"] == ["train.py:10 main", "train.py:20 stall"] and "where" not in kept[1]
    assert kept[1].get("eroica") == 1 and "eroica" not in six


def test_starting_a_dataloaders_workers_counts_as_waiting_for_data() -> None:
    """Without persistent_workers every epoch's iter() starts the workers anew: the training thread
    waits for its input pipeline then, as much as in next()."""
    clock = StepClock(lambda step, ms: None)
    clock.install()
    try:
        loader = torch.utils.data.DataLoader(_SlowData(), batch_size=4, num_workers=2)
        before = clock.data_ms
        t0 = time.perf_counter()
        it = iter(loader)
        took = (time.perf_counter() - t0) * 1e3
        assert clock.data_ms - before >= 0.9 * took > 0
        next(it)
        del it
    finally:
        clock.uninstall()
    assert torch.utils.data.DataLoader.__iter__.__qualname__ == "DataLoader.__iter__"


class _Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


def test_the_step_an_epoch_began_in_is_marked_and_worker_restarts_are_counted() -> None:
    """Three epochs of 10 batches, a step each: the steps that began the second and third epoch are
    marked (the detectors leave them unjudged), and the loader's workers, started anew at each epoch
    without persistent_workers, are counted as restarts; with persistent_workers they are not."""
    clock = StepClock(lambda step, ms: None)
    clock.install()
    try:
        loader = torch.utils.data.DataLoader(_Data(), batch_size=4, num_workers=1)
        began = []
        for _ in range(3):
            for _batch in loader:
                clock.boundary()
                began.append(clock.epoch_began)
        assert [i for i, b in enumerate(began) if b] == [0, 10, 20]
        t = clock.loader
        assert (t.count, t.restarts, t.workers, t.batches) == (3, 3, 1, 33)   # each epoch's StopIteration too
        assert 0 < t.ms <= clock.data_ms
        kept = torch.utils.data.DataLoader(_Data(), batch_size=4, num_workers=1, persistent_workers=True)
        for _ in range(3):
            for _batch in kept:
                clock.boundary()
        assert (clock.loader.count, clock.loader.restarts) == (6, 3)
        del kept
        # two datasets so far (each epoch's validation pass would be another); a loader made anew
        # every epoch over the same dataset is still the one
        assert t.to_json(clock.data_ms)["datasets"] == 2
        same = _Data()
        for _ in range(3):
            for _batch in torch.utils.data.DataLoader(same, batch_size=4):
                clock.boundary()
        assert t.count == 9 and t.to_json(clock.data_ms)["datasets"] == 3
    finally:
        clock.uninstall()


def test_a_loop_that_calls_iter_every_step_is_no_epoch_rhythm() -> None:
    """``next(iter(loader))`` each step (a common shortcut): every step begins an iteration, and
    marking them all would leave the detectors blind; only the first is marked."""
    clock = StepClock(lambda step, ms: None)
    clock.install()
    try:
        loader = torch.utils.data.DataLoader(_Data(), batch_size=4)
        began = []
        for _ in range(20):
            next(iter(loader))
            clock.boundary()
            began.append(clock.epoch_began)
        assert began.count(True) == 1 and began[0] and clock.loader.count == 20
    finally:
        clock.uninstall()


def _model() -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


def _manual_step(model: torch.nn.Module) -> None:
    """One iteration of a loop with its own update rule: no torch.optim optimizer."""
    model.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad


def test_a_loop_without_an_optimizer_has_its_steps_counted_at_each_backward() -> None:
    """A manual-SGD loop: after ADOPT_AFTER backward()s with no optimizer step, each backward() ends a
    step (the adopting one is step 0, the start-up), and the clock says so once."""
    with _counting() as (clock, seen, told):
        model = _model()
        for _ in range(ADOPT_AFTER + 9):
            _manual_step(model)
    assert clock.counted_at == "backward" and told == ["backward"]
    assert seen == list(range(10))
    assert not hasattr(torch.autograd.backward, "__eroica_counted__")   # uninstalled: the original again


def test_an_optimizer_after_a_long_first_accumulation_takes_the_count_over() -> None:
    """More backward()s than ADOPT_AFTER before the optimizer's first step (a huge accumulation):
    counted at backward() until then, at the optimizer from its first step on, with no step spanning
    the switch; an ordinary accumulation (4 micro-batches) is never counted at its backward()s. From
    the optimizer's first step on, backward() is torch's own again (eroica's wrapper stood in every
    traceback through backward(): an out-of-memory error, a peer's lost connection)."""
    for micro, want in ((ADOPT_AFTER + 8, ["backward", "optimizer"]), (4, [])):
        with _counting() as (clock, seen, told):
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(3):
                for _ in range(micro):
                    model(torch.randn(3, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
                assert not hasattr(torch.autograd.backward, "__eroica_counted__")
        assert told == want and clock.counted_at == "optimizer", (micro, told)
        if micro == 4:
            assert seen == [0, 1, 2]
        else:   # 9 backward()s counted (step 0 at the 64th), then the optimizer's 2nd and 3rd steps
            assert seen == list(range(11)) and len(clock.durations) == 10, seen
            # the optimizer's steps, from step 9, have a warm-up of their own: no stall, no reference
            assert clock.counted_from == 9 and clock.long_from == 10, (clock.counted_from, clock.long_from)


def test_a_reentrant_checkpoints_backward_inside_a_backward_is_no_step() -> None:
    """torch.utils.checkpoint(use_reentrant=True) runs a backward() inside the loop's own: one step."""
    from torch.utils.checkpoint import checkpoint

    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        model = _model()
        for _ in range(ADOPT_AFTER + 4):
            x = torch.randn(3, 4, requires_grad=True)
            checkpoint(model, x, use_reentrant=True).sum().backward()
    finally:
        clock.uninstall()
    assert clock.counted_at == "backward" and seen == list(range(5))


def test_an_inference_loop_has_its_steps_counted_at_each_batch_of_the_main_thread() -> None:
    """No optimizer and no backward(): after ADOPT_AFTER DataLoader batches each batch ends a step. A
    prefetching thread's batches are not the loop's: they count nothing."""
    import threading

    from torch.utils.data import DataLoader

    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        side = threading.Thread(target=lambda: list(DataLoader(range(200), batch_size=2)))
        side.start()
        side.join()
        assert clock.counted_at is None and not seen
        model = _model()
        with torch.no_grad():
            for x in DataLoader(torch.randn(ADOPT_AFTER + 5, 4), batch_size=1):
                model(x)
    finally:
        clock.uninstall()
    assert clock.counted_at == "batch" and seen == list(range(6))


def test_batches_become_steps_only_when_the_gate_says_every_rank_counts_them() -> None:
    """The runtime's gate (every rank asked to count batches, and from which one: runtime._adopt_gate)
    is asked at each batch from ADOPT_AFTER on; until it says yes no step is counted, and a gate that
    never does (a pass on one rank alone) leaves the steps to the optimizer that steps later."""
    from torch.utils.data import DataLoader

    for open_at, want in ((ADOPT_AFTER + 3, "batch"), (None, None)):
        asked: list[tuple[str, int]] = []
        seen: list[int] = []
        clock = StepClock(lambda step, ms, seen=seen: seen.append(step))

        def gate(at: str, passed: int, asked: list = asked, open_at: int | None = open_at) -> bool:
            asked.append((at, passed))
            return open_at is not None and passed >= open_at

        clock.adopt_gate = gate
        clock.install()
        try:
            model = _model()
            with torch.no_grad():
                for x in DataLoader(torch.randn(ADOPT_AFTER + 6, 4), batch_size=1):
                    model(x)
            after_batches = clock.counted_at
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
        finally:
            clock.uninstall()
        assert asked[0] == ("batch", ADOPT_AFTER), asked
        assert after_batches == want and clock.counted_at == "optimizer", (open_at, after_batches)
        if open_at is not None:   # batches ADOPT_AFTER + 3 (the start-up) .. + 6
            assert asked[-1] == ("batch", ADOPT_AFTER + 3) and seen[:4] == [0, 1, 2, 3], (asked, seen)
        else:   # asked at every batch from ADOPT_AFTER on; the optimizer's first step is the start-up
            assert len(asked) == 7 and seen == [0, 1, 2], (asked, seen)


def test_mark_step_ends_the_search_for_where_steps_are_counted() -> None:
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        model = _model()
        for _ in range(ADOPT_AFTER + 5):
            _manual_step(model)
            clock.mark()
    finally:
        clock.uninstall()
    assert clock.counted_at == "mark_step" and seen == list(range(ADOPT_AFTER + 5))


def test_the_last_steps_sent_at_job_end_leave_out_warm_up_eroicas_steps_and_stopped_ones() -> None:
    """(step, busy, step ms) for engine/imbalance.py: the thread's CPU time plus its wait for batches,
    less the warm-up steps, the steps eroica disturbed and a step the process was stopped in."""
    clock = StepClock(lambda step, ms: None, long_from=3)
    clock.install()
    try:
        opt = _opt()
        for step in range(12):
            if step == 7:
                clock.continued += 1   # a SIGCONT: stopped and continued in step 7
            sum(i * i for i in range(20000))
            opt.step()
    finally:
        clock.uninstall()
    got = clock.last_steps(skip={5})
    assert [s for s, _, _ in got] == [3, 4, 6, 8, 9, 10, 11]
    assert all(busy > 0 and ms >= busy * 0.5 for _, busy, ms in got), got
    clock._cuda = True   # a GPU rank: its thread's times do not show the device's work
    assert clock.last_steps(skip=set()) == []
