"""How long a candidate's execution keeps a worker, learned per operator from a run's own verdicts, so that a round
starts its longest candidates early and does not end on one task's compile (docs/execution.md, "Rounds")."""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Iterable, Mapping

from opsynth.filters.execution import MEMORY_WAIT

PRIOR_WEIGHT = 2.0  # executions' worth of the run's mean in an operator's estimate
WAITS = ("lock_wait", MEMORY_WAIT)  # phases in which a worker waits rather than works


class _Mean:
    __slots__ = ("n", "total")

    def __init__(self):
        self.n, self.total = 0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x

    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


class HostCosts:
    """Worker seconds per execution (working, and in all with its waits for the GPU), overall and per operator,
    from the verdicts of one run; safe to share between threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._work = _Mean()
        self._occupied = _Mean()
        self._ops: dict[str, _Mean] = {}

    def add(self, ops: Iterable[str], phase_s: Mapping[str, float] | None) -> None:
        """One candidate's execution (its calibration's tries summed), from its verdict's `phase_s`."""
        if not phase_s:
            return  # decided without running (not needed, checkpointed before phases were kept)
        occupied = sum(phase_s.values())
        work = occupied - sum(phase_s.get(p, 0.0) for p in WAITS)
        with self._lock:
            self._occupied.add(occupied)
            self._work.add(work)
            for op in set(ops):
                self._ops.setdefault(op, _Mean()).add(work)

    def executions(self) -> int:
        return self._work.n

    def occupied_s(self) -> float:
        """A worker's mean seconds per execution, waits included: the pool's workers over it hand out that many
        candidates a second."""
        return self._occupied.mean()

    def lead_s(self, ops: Iterable[str]) -> float:
        """How much longer than the run's mean an execution of these operators is expected to take, at most (0
        for operators not seen yet)."""
        with self._lock:
            base = self._work.mean()
            estimates = [(seen.total + PRIOR_WEIGHT * base) / (seen.n + PRIOR_WEIGHT)
                         for op in ops if (seen := self._ops.get(op)) is not None]  # fmt: skip
        return max([0.0, *(e - base for e in estimates)])


_runs: dict[str, HostCosts] = {}
_runs_lock = threading.Lock()


def for_run(progress_dir: str) -> HostCosts:
    """The costs learned in this process by the run whose round checkpoints to `progress_dir` (its rounds'
    folders share a parent), made empty on first use: a resumed run's first batch fills it from the verdicts its
    round's checkpoints hold (pipeline.execution_stage). Where the execution stage runs outside the driver's
    process, each of its processes learns its own."""
    key = posixpath.dirname(progress_dir.rstrip("/"))
    with _runs_lock:
        return _runs.setdefault(key, HostCosts())
