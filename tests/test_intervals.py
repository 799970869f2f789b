"""Interval arithmetic the builder's phases rest on (summary/intervals.py): a window's self-time segments
are merged in numpy above a few dozen intervals, and must come out exactly as the plain loop's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eroica_runtime.summary.intervals import _NUMPY_FROM, intersect, length, subtract, union, union_cols


def covered(ivs: list[tuple[float, float]], x: float) -> bool:
    return any(s <= x < e for s, e in ivs)


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones() -> None:
    ivs = [(5.0, 7.0), (0.0, 2.0), (2.0, 3.0), (1.0, 1.5), (9.0, 9.0), (8.0, 7.5), (6.0, 8.0)]
    assert union(ivs) == [(0.0, 3.0), (5.0, 8.0)]
    many = ivs * _NUMPY_FROM          # the numpy path: the same answer
    assert union(many) == [(0.0, 3.0), (5.0, 8.0)]
    assert union_cols([s for s, _ in many], [e for _, e in many]) == [(0.0, 3.0), (5.0, 8.0)]
    assert union([]) == union_cols([], []) == []


interval = st.tuples(st.integers(0, 400), st.integers(-3, 30)).map(lambda t: (t[0] / 4, (t[0] + t[1]) / 4))


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, max_size=3 * _NUMPY_FROM))
def test_union_covers_exactly_what_its_intervals_cover_on_both_paths(ivs: list[tuple[float, float]]) -> None:
    small = union(ivs[:_NUMPY_FROM - 1])            # the loop
    big = union(ivs)                                # numpy once there are enough
    for merged, source in ((small, ivs[:_NUMPY_FROM - 1]), (big, ivs)):
        assert merged == sorted(merged)
        assert all(s < e for s, e in merged)
        assert all(a[1] < b[0] for a, b in zip(merged, merged[1:], strict=False))   # disjoint, not touching
        for x in {v for iv in source for v in iv} | {v + 0.125 for iv in source for v in iv}:
            assert covered(merged, x) == covered(source, x), x
    assert union_cols([s for s, _ in ivs], [e for _, e in ivs]) == big


def test_intersect_and_subtract_split_an_interval_list_in_two() -> None:
    a = union([(0.0, 10.0), (20.0, 30.0)])
    b = union([(5.0, 25.0), (28.0, 40.0)])
    inside, outside = intersect(a, b), subtract(a, b)
    assert inside == [(5.0, 10.0), (20.0, 25.0), (28.0, 30.0)]
    assert outside == [(0.0, 5.0), (25.0, 28.0)]
    assert length(inside) + length(outside) == length(a)
