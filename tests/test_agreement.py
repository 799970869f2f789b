"""The rule of an agreement on where steps are counted (eroica_runtime/agreement.py), on a stand-in for
the side channel whose requests complete when the test says so. What it does across real ranks is in
tests/test_runtime.py (a pass and an optimizer of one rank's own, a second stage on every rank)."""
from __future__ import annotations

import numpy as np

from eroica_runtime.agreement import MARGIN, Agreement
from eroica_runtime.sidechannel import Vote


class Side:
    """Requests posted in order; each completes when ``answer`` sets what every rank's MAX came to."""

    def __init__(self) -> None:
        self.posted: list[Vote] = []
        self.moved: list[int] = []       # the pass each progress() call was made at
        self.abandoned: list[Vote] = []
        self.passed = 0

    def post_max(self, values: np.ndarray, about: str) -> Vote:
        assert about == "switch"
        vote = Vote(None, values.copy(), np.zeros_like(values))
        self.posted.append(vote)
        return vote

    def answer(self, most: int) -> None:
        vote = self.posted[-1]
        vote.recv[0], vote.done = most, True

    def settle(self, vote: Vote) -> bool:
        return vote.done

    def progress(self, vote: Vote, deadline: float) -> bool:
        self.moved.append(self.passed)
        return vote.done

    def abandon(self, vote: Vote) -> None:
        self.abandoned.append(vote)


def _ready(side: Side, agreement: Agreement, passed: int) -> bool:
    side.passed = passed
    return agreement.ready(passed)


def test_a_rank_alone_never_changes_and_moves_its_request_on_only_for_the_margin() -> None:
    side = Side()
    agreement = Agreement(side, "switch")
    assert not any(_ready(side, agreement, n) for n in range(8, 200))
    assert len(side.posted) == 1 and side.posted[0].send[0] == 8   # asked once, kept posted
    assert side.moved == list(range(8, 8 + MARGIN))   # polled while its peers could be asking too
    agreement.abandon()
    assert side.abandoned == side.posted


def test_every_rank_changes_margin_past_the_most_any_had_passed_then_asks_anew() -> None:
    side = Side()
    agreement = Agreement(side, "switch")
    assert not _ready(side, agreement, 8)
    side.answer(11)   # a peer had passed 11 when it asked
    took = [n for n in range(9, 30) if _ready(side, agreement, n)]
    assert took[0] == 11 + MARGIN
    assert len(side.posted) == 2 and side.posted[1].send[0] == 11 + MARGIN + 1   # the next change asked anew
    agreement.abandon()
    assert side.abandoned == side.posted[1:]
