"""Agreements on where steps are counted: every rank changes at the same step, or none does.

Steps are where ranks vote, and every vote waits for every rank's (runtime._boundary), so a rank that
counts a step its peers do not waits the side channel's deadline and switches eroica off. Two changes
of where steps are counted are taken by one rank's own count of what it passed: steps counted at
backward()s or DataLoader batches once ADOPT_AFTER of them passed with no optimizer step
(stepclock.ADOPT_AFTER), and steps following another optimizer once SWITCH_AFTER of its steps passed
with none of the one followed (stepclock.SWITCH_AFTER). A rank alone in a pass or an optimizer of its
own (rank 0 evaluating, or fitting a linear probe, while its peers wait in a barrier) reaches that
count alone. So each change is asked of every rank: a nonblocking MAX of how many it has passed, on a
communicator of its own (sidechannel.SideChannel.post_max), and taken only once every rank posted it,
MARGIN past the most any had passed.

Why a short poll: MPICH moves a nonblocking collective on one stage per MPI call, and nothing else on
the side channel is called between two of these passes (no step boundary: no vote). Tested once a
pass, a 3-rank job learned its answer 9-11 passes after asking, past the margin, and its ranks
switched at three different steps (71, 73 and 72 steps counted of the same 90). Polled for up to
POLL_S at each pass until the answer's step, every rank of 2-4 learned it within two passes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

# passes after the most any rank had passed when it asked, at which every rank changes
MARGIN = 8
# how long each pass before that one polls the request (it returns as soon as the answer is in)
POLL_S = 0.002


class Agreement:
    """One kind of change ("adopt", "switch"), asked of every rank over ``side`` (a SideChannel)."""

    def __init__(self, side: Any, about: str) -> None:
        self._side = side
        self._about = about
        self._asked: Any = None   # the request in flight (sidechannel.Vote), None before the first ask

    def ready(self, passed: int) -> bool:
        """Whether this rank changes at this pass (``passed`` of them so far): False until every rank
        asked, then True from MARGIN past the most any had passed. A request no peer matches stays
        posted (their first ask of the same kind will); one answered is asked anew next time."""
        side = self._side
        if self._asked is None:
            self._asked = side.post_max(np.array([passed], dtype=np.int64), self._about)
        asked = self._asked
        if side.settle(asked):
            target = int(asked.recv[0]) + MARGIN
            if passed < target:
                return False
            self._asked = None
            return True
        if passed < int(asked.send[0]) + MARGIN:   # its peers may be asking right now: move it on
            side.progress(asked, time.monotonic() + POLL_S)
        return False

    def abandon(self) -> None:
        """The job ends: a request no peer ever matched is left to the side channel's drain."""
        if self._asked is not None:
            self._side.abandon(self._asked)
            self._asked = None
