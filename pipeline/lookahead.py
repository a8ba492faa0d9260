"""The next round's first executions, started at the end of this round's where the workers would otherwise idle
(the `ahead` of WorkerPool.run): only candidates the next round's fill point asks for whatever verdicts are still to
come, so which rows a run keeps does not change (docs/execution.md, "Rounds")."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from opsynth.pipeline.selection import FillPoint, wanted
from opsynth.records import Candidate


@dataclass(frozen=True)
class NextRound:
    """What an execution stage needs to start the next round's candidates ahead."""

    candidates: Callable[[], list[Candidate] | None]  # in its execution order, once its CPU stages are done
    missing: dict[str, int]  # rows each data source missed when this round began
    wanted: dict[str, int]  # accepted candidates this round asks of each data source


_registry: dict[str, NextRound] = {}
_registry_lock = threading.Lock()


def register(progress_dir: str, next_round: NextRound | None) -> None:
    """The next round of the round whose execution checkpoints to `progress_dir` (None: no next round)."""
    with _registry_lock:
        if next_round is None:
            _registry.pop(progress_dir, None)
        else:
            _registry[progress_dir] = next_round


def registered(progress_dir: str) -> NextRound | None:
    with _registry_lock:
        return _registry.get(progress_dir)


def certainly_asked(
    missing: dict[str, int], asked_now: dict[str, int], accepted: dict[str, int], undecided: dict[str, int]
) -> dict[str, int]:
    """How many of the next round's first candidates of each data source (by index) its fill point asks for,
    whatever the `undecided` candidates of this round turn out to be, given those `accepted` so far."""
    least = {s: n - min(asked_now.get(s, 0), accepted.get(s, 0) + undecided.get(s, 0)) for s, n in missing.items()}
    return wanted({s: n for s, n in least.items() if n > 0})


class StartAhead:
    """The `ahead` of one execution batch: the next candidate of the next round, in its execution order, among
    those its fill point certainly asks for; None while there is none (yet)."""

    def __init__(self, next_round: NextRound, fill: FillPoint, todo: list[Candidate], job_of: Callable):
        self.next_round = next_round
        self.fill = fill
        self.job_of = job_of
        self.undecided = Counter(c.data_source for c in todo)
        self.started: set[tuple[str, int]] = set()
        self._ranks: dict[tuple[str, int], int] | None = None

    def decided(self, candidate: Candidate) -> None:
        """One of this batch's candidates has its final verdict (or was found not needed)."""
        self.undecided[candidate.data_source] -= 1

    def __call__(self):
        candidates = self.next_round.candidates()
        if not candidates:
            return None
        if self._ranks is None:
            by_index = sorted(c.order for c in candidates)
            per_source = Counter()
            self._ranks = {}
            for order in by_index:
                self._ranks[order] = per_source[order[0]]
                per_source[order[0]] += 1
        accepted = {s: len(indices) for s, indices in self.fill.accepted.items()}
        asked = certainly_asked(self.next_round.missing, self.next_round.wanted, accepted, self.undecided)
        for c in candidates:
            if c.order not in self.started and self._ranks[c.order] < asked.get(c.data_source, 0):
                self.started.add(c.order)
                return self.job_of(c)
        return None
