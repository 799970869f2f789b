"""When each rank made its steps' collectives, and how late that was against the earliest rank
(eroica_runtime/lateness.py): pure arithmetic on the Flight Recorder's creation times."""
import numpy as np

from eroica_runtime.lateness import last_created, lateness

MS = 1_000_000   # ns


def test_each_step_gets_the_last_collective_made_in_it_and_none_outside_the_recorded_steps() -> None:
    ends = {9: 1000 * MS, 10: 1100 * MS, 11: 1200 * MS, 12: 1300 * MS}
    created = [1010 * MS, 1090 * MS, 1150 * MS, 1199 * MS, 1200 * MS, 1250 * MS]   # out of order is fine
    got = last_created(created[::-1], [9, 10, 11, 12, 13], ends)
    # step 9's start is unknown, step 13's end is; 1200 ms belongs to step 11 (made by its end)
    assert got[0] == np.inf and got[4] == np.inf
    assert got[1:4].tolist() == [1090.0, 1200.0, 1250.0]
    assert last_created([], [10], ends).tolist() == [np.inf]
    # a step with no collective of its own (the ring had dropped it, or the loop made none)
    assert last_created([1250 * MS], [10, 11, 12], ends).tolist() == [np.inf, np.inf, 1250.0]
    # eroica's vote held the rank 40 ms after step 11's end: its step-12 collective was that much later
    assert last_created(created, [12], ends, {11: 40 * MS, 12: 7 * MS}).tolist() == [1210.0]


def test_a_rank_late_in_bursts_is_late_by_the_burst_and_a_steady_lead_is_not_lateness() -> None:
    earliest = 1000.0 + 100.0 * np.arange(32)
    jitter = np.tile([0.0, 3.0, 1.0, 5.0], 8)
    burst = np.where((np.arange(32) % 20) < 8, 80.0, 0.0)
    late = lateness(earliest + jitter + burst, earliest)
    assert np.allclose(late[burst > 0], 80.0 + jitter[burst > 0], atol=5.0)   # less its usual lead
    assert late[burst == 0].max() <= 5.0
    # a host whose clock runs 40 ms apart, or a pipeline stage always later by design: not late
    assert lateness(earliest + 40.0 + jitter, earliest).max() <= 5.0
    # what either side does not know counts as on time
    mine = earliest + burst
    mine[3] = np.inf
    theirs = earliest.copy()
    theirs[5] = np.inf
    late = lateness(mine, theirs)
    assert late[3] == 0.0 and late[5] == 0.0 and late[0] == 80.0
    assert lateness(np.full(4, np.inf), np.full(4, np.inf)).tolist() == [0.0] * 4
