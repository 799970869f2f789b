"""Keep the program's process groups from being destroyed where torch can deadlock: inside ~Reducer.

The hang it prevents (seen under eroica-run and reproduced with py-spy stacks, tests/test_exit.py):
a DDP script calls ``destroy_process_group()`` and returns, and its DDP model dies with the function's
frame. The Python ``ProcessGroup`` object is already gone, so the C++ ``Reducer`` holds the last
reference: ~Reducer runs with the GIL held (its binding does not release it), destroys the gloo group,
and ~ProcessGroupGloo joins its worker threads. A worker still finishing the last gradient allreduce
destroys that work, whose captured thread-local state holds a Python object (autograd stashes a
contextvars context there during backward), so it waits for the GIL: the rank never exits, and every
other rank waits for it in MPI_Finalize.

Holding a Python reference to every group the program creates means the Reducer is never the last
owner. The references are dropped at safe points: at a step boundary for groups the program has
destroyed, and in eroica's atexit handler (before interpreter teardown) for the rest. Dropping the
Python object destroys the group through torch's binding, which releases the GIL first, so the
worker can finish. ``destroy_process_group()`` still shuts the backend down when the program calls it;
only the C++ object's memory outlives the call until the next safe point.
"""

from __future__ import annotations

from typing import Any

REFRESH_EVERY = 64   # step boundaries between two looks at torch's group registry


class GroupKeeper:
    def __init__(self) -> None:
        self._held: dict[int, Any] = {}   # id(group) -> group (process groups are not all hashable alike)

    def hold(self, group: Any) -> None:
        if group is not None:
            self._held[id(group)] = group

    def refresh(self) -> None:
        """Hold every live group torch knows of; drop the ones the program destroyed (a safe point)."""
        live = _live_groups()
        if live is None:
            return
        alive = {id(g) for g in live}
        for key in [k for k in self._held if k not in alive]:
            del self._held[key]   # destroyed by the program: ours may be the last reference, freed here
        for group in live:
            self._held[id(group)] = group

    def release(self) -> None:
        """Drop every reference (eroica's atexit: before teardown, with the interpreter fully alive)."""
        self._held.clear()


def _live_groups() -> list[Any] | None:
    """The process groups torch's registry holds now (None when torch.distributed is not usable)."""
    try:
        from torch.distributed import distributed_c10d as c10d

        return list(c10d._world.pg_map.keys())
    except Exception:
        return None
