"""Jobs a worker pool (filters.workers) starts ahead of the run they belong to, and the thread that goes on starting
them between two runs (docs/execution.md, "Rounds")."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from multiprocessing import Pipe
from multiprocessing.connection import Connection

from opsynth.filters.worker_handle import Job, WorkerHandle
from opsynth.reasons import Verdict

# Makes job index's verdict final, or runs the follow-up it asks for (see WorkerPool.run).
Finish = Callable[[int, Verdict], None]


class JobsAhead:
    """The jobs started ahead of their run: each one's verdict, None while it runs."""

    def __init__(self) -> None:
        self._verdicts: dict[Job, Verdict | None] = {}

    def started(self, job: Job) -> None:
        self._verdicts[job] = None

    def done(self, job: Job, verdict: Verdict) -> None:
        self._verdicts[job] = verdict

    def adopt(self, pending: deque, finish: Finish, workers: Iterable[WorkerHandle]) -> None:
        """Of a run's pending (index, job) pairs, those started ahead: a verdict in hand is final at once, a job in
        flight goes on for this run; the other verdicts started ahead are dropped."""
        if not self._verdicts:
            return  # nothing was started ahead (most runs)
        workers = list(workers)
        jobs = list(pending)
        pending.clear()  # follow-ups of verdicts taken here go first, as in a run
        kept = []
        for index, job in jobs:
            verdict = self._verdicts.pop(job, None)
            running = next((w for w in workers if w.ahead == job), None)
            if verdict is not None:
                finish(index, verdict)
            elif running is not None:
                running.ahead, running.job = None, index
            else:
                kept.append((index, job))
        pending.extend(kept)
        self._verdicts = {job: None for job, verdict in self._verdicts.items() if verdict is None}

    def let_go_unneeded(
        self, workers: Iterable[WorkerHandle], skip: Callable[[int], Verdict | None], finish: Finish
    ) -> None:
        """The jobs in the workers' hands whose places `skip` now decides (the verdicts in since they were handed
        out make them not needed): their places final at once, the jobs left to run as if started ahead, so that
        a run never waits for a task it no longer needs (the last round of a run, its slowest compiles)."""
        for w in workers:
            if w.job is not None and (verdict := skip(w.job)) is not None:
                self._verdicts[w.in_hand] = None
                finish(w.detach(), verdict)


class Bridge:
    """A pool's work between two runs: `work(stop)` on a thread of its own, which starts jobs ahead on the workers
    left idle and takes their verdicts until `stop` (the reading end of a pipe) can be read; `end` makes it so."""

    def __init__(self, work: Callable[[Connection], None]):
        self._stop, self._stopping = Pipe(duplex=False)
        self.error: BaseException | None = None

        def run() -> None:
            try:
                work(self._stop)
            except BaseException as e:  # raised in the caller's thread (`WorkerPool._end_bridge`)
                self.error = e

        self._thread = threading.Thread(target=run, name="worker-pool-bridge", daemon=True)
        self._thread.start()

    def end(self) -> None:
        self._stopping.send_bytes(b"")
        self._thread.join()
        self._stop.close()
        self._stopping.close()
