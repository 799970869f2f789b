"""Peer groups: which ranks are expected to behave alike (the unit of differential comparison).

Sources, in order of trust:

1. ``topology`` string such as ``"pp=4,tp=8,dp=*"``: dims in the order given, ranks laid out row-major
   with the LAST dim fastest (like torch's DeviceMesh: rank = ((pp * TP) + tp) * DP + dp for the example).
   One ``*`` is allowed and is inferred from the world size. Ranks are peers when they share the
   coordinates of every role dim (pp/pipe/pipeline/stage); tp/dp/cp/ep... ranks are interchangeable.
2. Recorded process groups (``summary["groups"]``): a rank's stage is its position in its "pp" group;
   otherwise ranks joined by dp/tp/... groups form one peer set. Groups with unknown names are not
   trusted on their own and are intersected with signature clusters.
3. Signature clustering: ranks that run the same significant functions the same number of times
   per step. A cluster that differs from a bigger one in only a few calls, or that is a small
   minority (at most a third of the largest cluster), is merged into its nearest bigger cluster,
   so a culprit running extra ops is not hidden in a group of its own. Clusters of equal size
   (balanced pipeline stages) are never merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica_runtime.engine.table import ROLE_DIMS, Table


@dataclass(frozen=True)
class Peers:
    """A partition of the table's rows into peer groups."""

    labels: np.ndarray          # (R,) group label per row
    groups: list[np.ndarray]    # rows of each group (index = label)
    source: str                 # "topology" | "groups" | "signature" | "groups+signature" | "single"
    notes: tuple[str, ...] = ()

    def describe(self, limit: int = 32) -> dict:
        """Small JSON description (sizes of at most ``limit`` groups)."""
        sizes = [int(len(g)) for g in self.groups]
        return {"source": self.source, "count": len(sizes), "sizes": sizes[:limit],
                "truncated": len(sizes) > limit}


def parse_topology(topology: str, world_size: int) -> list[tuple[str, int]]:
    """Parse ``"pp=4,tp=8,dp=*"`` into [(dim, size)]; raise ValueError when it cannot fit the world."""
    dims: list[tuple[str, int | None]] = []
    for part in topology.replace(" ", "").split(","):
        if not part:
            continue
        name, sep, size = part.partition("=")
        if not sep or not name:
            raise ValueError(f"topology {topology!r}: expected dim=size items, got {part!r}")
        if size == "*":
            dims.append((name.lower(), None))
        elif size.isdigit() and int(size) > 0:
            dims.append((name.lower(), int(size)))
        else:
            raise ValueError(f"topology {topology!r}: bad size {size!r} for dim {name!r}")
    if not dims:
        raise ValueError(f"topology {topology!r}: no dims")
    if sum(1 for _, s in dims if s is None) > 1:
        raise ValueError(f"topology {topology!r}: at most one '*' dim")
    known = int(np.prod([s for _, s in dims if s is not None])) if any(s for _, s in dims) else 1
    out: list[tuple[str, int]] = []
    for name, s in dims:
        if s is None:
            if world_size % known:
                raise ValueError(f"topology {topology!r}: world size {world_size} is not a multiple of {known}")
            s = world_size // known
        out.append((name, s))
    total = int(np.prod([s for _, s in out]))
    if total != world_size:
        raise ValueError(f"topology {topology!r} describes {total} ranks, the job has {world_size}")
    return out


def _unique_rows(a: np.ndarray) -> tuple[int, np.ndarray] | None:
    """``np.unique(a, axis=0, return_inverse=True)``'s (count, inverse), ~20x faster on 100,000 rows:
    rows hashed, every row checked equal to its hash group's first, then the few distinct rows put in
    the same lexicographic order. None (use np.unique) on NaN or a hash collision."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        if np.isnan(a).any():
            return None
        a = a + 0.0                      # -0.0 and 0.0 are one value, as np.unique compares them
    bits = (a if a.dtype.itemsize == 8 else a.astype(np.int64)).view(np.uint64)
    h = np.zeros(a.shape[0], dtype=np.uint64)
    for j in range(a.shape[1]):          # a 64-bit mix of the row's bit patterns (splitmix-style)
        h = (h ^ (bits[:, j] * np.uint64((0x9E3779B97F4A7C15 * (j + 1)) & 0xFFFFFFFFFFFFFFFF | 1))) \
            * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    reps = a[first]
    if not np.array_equal(a, reps[inv]):
        return None
    order = np.lexsort(reps.T[::-1])     # first column most significant, as np.unique orders rows
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.arange(len(order))
    return len(order), where[inv.reshape(-1)]


def _from_labels(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Relabel to 0..G-1 and split rows per label (one argsort, no per-group scans)."""
    fast = _unique_rows(labels) if labels.ndim > 1 and labels.shape[1] and len(labels) else None
    if fast is not None:
        count, dense = fast
    else:
        uniq, dense = np.unique(labels, return_inverse=True, axis=0 if labels.ndim > 1 else None)
        count = len(uniq)
    dense = dense.reshape(-1)
    order = np.argsort(dense, kind="stable")
    bounds = np.searchsorted(dense[order], np.arange(count + 1))
    return dense, [order[bounds[i]:bounds[i + 1]] for i in range(count)]


def _topology_labels(table: Table, dims: list[tuple[str, int]]) -> np.ndarray:
    stride = 1
    strides = []
    for _, size in reversed(dims):
        strides.append(stride)
        stride *= size
    strides.reverse()
    role = [(i, s) for i, (name, s) in enumerate(dims) if name in ROLE_DIMS]
    labels = np.zeros(table.n, dtype=np.int64)
    for i, size in role:
        labels = labels * size + (table.rank // strides[i]) % size
    return labels


def _union_labels(table: Table) -> np.ndarray:
    parent = np.arange(table.n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in table.alike_groups:
        rows = table.rows_of(g)
        if len(rows) < 2:
            continue
        root = find(int(rows[0]))
        for r in rows[1:].tolist():
            other = find(r)
            if other != root:
                parent[other] = root
    return np.array([find(i) for i in range(table.n)], dtype=np.int64)


# device work has its own share of a summary's function table (summary/build.py), so its own cut line
_DEVICE_KINDS = ("kernel", "memcpy", "memset")
# a function that only some ranks list tells stages apart only if it takes at least this share of the
# step on every rank that lists it (see _absences_are_real)
STAGE_MARKER_SHARE = 0.05


def _absences_are_real(table: Table, cols: np.ndarray, step_ms: float, margin: float = 2.0) -> np.ndarray:
    """Which of ``cols`` can tell stages apart: a rank that does not list the function did not call it.

    A summary lists its top functions by time and folds the rest into ``<other>``. On shared cores a
    trivial op that a preemption landed in takes milliseconds on one rank and microseconds on its
    peers, so it is listed by some ranks only; as a count of 0 on the others it split plain 4-rank
    DDP jobs into two groups of two in 8 of 476 fault-bench captures (``aten::add`` at 0.1 and 3.6 ms
    on two ranks, absent on two; ``aten::t`` at 5.4 and 1.4 ms; ``aten::add_`` at 1.8 and 0.9 ms), and
    a group under 3 ranks is not compared at all. So a function listed by some ranks only is a stage's
    mark when every rank listing it spends ``STAGE_MARKER_SHARE`` of the step in it and ``margin`` x
    the absent ranks' smallest listed function (of the same share, host or device: below it the
    absence may be the table's cut). A stage's own work (its layers' collectives, its embedding or
    loss) is far above both.
    """
    if len(cols) == 0:
        return np.zeros(0, dtype=bool)
    def listed(rows: Any, columns: Any) -> np.ndarray:
        return (table.fn_count[rows][:, columns] > 0) | (table.fn_ms[rows][:, columns] > 0)

    absent = ~listed(slice(None), cols)                  # (R, len(cols)): only the candidates, at scale
    keep = np.ones(len(cols), dtype=bool)
    gaps = np.flatnonzero(absent.any(axis=0))
    if len(gaps) == 0:
        return keep
    # the table cut of the ranks that lack a candidate: their smallest listed function of each share
    rows = np.flatnonzero(absent[:, gaps].any(axis=1))
    other = np.asarray([name == "<other>" for name in table.fn_names], dtype=bool)
    device = np.asarray([k in _DEVICE_KINDS for k in table.fn_kind], dtype=bool)
    mine = listed(rows, slice(None))
    cut_off = mine[:, other].any(axis=1) if other.any() else np.zeros(len(rows), dtype=bool)
    ms = table.fn_ms[rows]
    cut = {}
    for is_dev in (False, True):
        share = ~other & (device == is_dev)
        smallest = np.where(mine & share[None, :], ms, np.inf).min(axis=1) if share.any() \
            else np.full(len(rows), np.inf)
        cut[is_dev] = np.where(cut_off & np.isfinite(smallest), smallest, 0.0)
    at = {int(r): i for i, r in enumerate(rows.tolist())}
    for i in gaps.tolist():
        j = int(cols[i])
        lacking = [at[int(r)] for r in np.flatnonzero(absent[:, i]).tolist()]
        present = ~absent[:, i]
        lowest = float(table.fn_ms[present, j].min()) if present.any() else 0.0
        keep[i] = lowest >= STAGE_MARKER_SHARE * step_ms and \
            lowest > margin * float(cut[bool(device[j])][lacking].max())
    return keep


def signature_labels(table: Table, merge_below: float = 0.25) -> np.ndarray:
    """Cluster rows by which significant functions they call and how often (see module doc)."""
    n = table.n
    if n == 0 or not table.fn_names:
        return np.zeros(n, dtype=np.int64)
    step_med = float(np.median(table.col("step"))) or 1.0
    cand = np.flatnonzero((table.fn_ms.max(axis=0) >= 0.02 * step_med)
                          & np.array([name != "<other>" for name in table.fn_names]))
    cand = cand[_absences_are_real(table, cand, step_med)]
    if len(cand) == 0:
        return np.zeros(n, dtype=np.int64)
    counts = np.round(table.fn_count[:, cand].astype(np.float64), 1)
    labels, groups = _from_labels(counts)
    if len(groups) == 1:
        return labels
    if max(len(g) for g in groups) == 1:
        # every rank differs a little (per-step counts wobble with window edges, a culprit calls
        # more): a stage is never a lone rank, so with no cluster of two there is one group
        return np.zeros(n, dtype=np.int64)
    sizes = np.array([len(g) for g in groups])
    reps = np.array([counts[g[0]] for g in groups])
    by_size = np.argsort(-sizes, kind="stable")
    target = np.arange(len(groups))
    largest = sizes.max()
    for gi in by_size[::-1]:
        bigger = [gj for gj in by_size if sizes[gj] > sizes[gi] and target[gj] == gj]
        if not bigger:
            continue
        a = reps[gi]
        dists = []
        for gj in bigger:
            b = reps[gj]
            denom = np.maximum(a, b).sum()
            dists.append(float(np.abs(a - b).sum() / denom) if denom else 0.0)
        k = int(np.argmin(dists))
        # a close signature, or a small minority (a stage is never a lone rank among big stages:
        # a minority that calls something extra is more likely a culprit doing extra work)
        if dists[k] < merge_below or sizes[gi] <= 0.34 * largest or sizes[gi] == 1:
            target[gi] = bigger[k]
    for _ in range(len(groups)):     # follow merge chains to their final cluster
        nxt = target[target]
        if np.array_equal(nxt, target):
            break
        target = nxt
    return target[labels]


def form_peers(table: Table, *, topology: str | None = None, world_size: int | None = None) -> Peers:
    """Partition ranks into peer groups (see the module docstring for the rules)."""
    notes: list[str] = []
    if table.n == 0:
        return Peers(np.zeros(0, dtype=np.int64), [], "single")
    if topology:
        try:
            dims = parse_topology(topology, int(world_size or (int(table.rank.max()) + 1)))
            labels, groups = _from_labels(_topology_labels(table, dims))
            return Peers(labels, groups, "topology")
        except ValueError as exc:
            notes.append(f"topology ignored: {exc}")
    if np.any(table.stage >= 0):
        stage = table.stage.astype(np.int64)
        if np.any(stage < 0):   # ranks without a pp group: put them in signature clusters of their own
            sig = signature_labels(table)
            stage = np.where(stage < 0, -1 - sig, stage)
        labels, groups = _from_labels(stage)
        return Peers(labels, groups, "groups", tuple(notes))
    if table.alike_groups:
        comp = _union_labels(table)
        source = "groups"
        if table.unknown_groups:
            comp = np.stack([comp, signature_labels(table)], axis=1)
            source = "groups+signature"
        labels, groups = _from_labels(comp)
        return Peers(labels, groups, source, tuple(notes))
    labels, groups = _from_labels(signature_labels(table))
    return Peers(labels, groups, "signature" if len(groups) > 1 else "single", tuple(notes))
