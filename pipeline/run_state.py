"""What the run driver keeps across rounds, and how a finished round adds to it: the selection (rows per data
source), the counts and rejections per stage and reason, each round's record, what every source has tried, and
the sources retired as exhausted. All of it is small per candidate; a round's rows and rejections themselves go
to spools beside its outputs (see rounds), not here.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from opsynth.config import EXHAUSTION_YIELD, SPEED_WINDOW
from opsynth.filters.calibration import CEILING_STOP
from opsynth.filters.worker_budgets import MEMORY_RETRY
from opsynth.pipeline import workfiles
from opsynth.pipeline.planning import SourceRound, exhausted_sources
from opsynth.pipeline.round_pipelines import RoundInputs
from opsynth.pipeline.rounds import (
    REJECTED_SPOOL,
    SELECTED_SPOOL,
    WORK_FILE,
    executions,
    leave_for_later_rounds,
    marked,
    prepared_candidates,
)
from opsynth.pipeline.selection import Selector, trim
from opsynth.pipeline.sizing import timed_predictions
from opsynth.reasons import DUPLICATE
from opsynth.records import Candidate, Rejection


@dataclass
class RunState:
    selector: Selector
    dropped: Counter = field(default_factory=Counter)  # (stage, reason) -> rejections
    accepted_total: int = 0
    not_needed: int = 0  # candidates past their round's fill point (see selection.FillPoint)
    tried: Counter = field(default_factory=Counter)  # candidates made per data source, over all rounds
    rounds: list[dict] = field(default_factory=list)  # each round's record, for stats.json
    round_dirs: list[str] = field(default_factory=list)
    history: dict[str, list[SourceRound]] = field(default_factory=dict)  # source -> its finished rounds
    # measured / predicted time of the latest executions at their first sizes
    timed: deque = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))
    exhausted: dict[str, dict] = field(default_factory=dict)  # source -> when it was retired, where its rows went
    idle: int = 0  # rounds in a row that added no row

    def close_round(self, inputs: RoundInputs, accepted: list[Candidate], rejected: list[Rejection], resumed: bool,
                    asked: dict[str, int], started: float, log) -> None:  # fmt: skip
        """Take in a finished round (begun at `started`, asked for `asked` accepted candidates per source): its
        candidates past the fill point set aside, the selection's choice spooled with the rejections, the
        round's record, and the sources it showed exhausted retired, their missing rows given to another."""
        r, plan, round_dir = inputs.number, inputs.plan, inputs.round_dir
        spent = executions(accepted, rejected)
        stopped, retried = marked(CEILING_STOP, accepted, rejected), marked(MEMORY_RETRY, accepted, rejected)
        accepted, rejected, aside = trim(accepted, rejected, asked, prepared_candidates(round_dir))
        self.not_needed += len(aside)
        self.timed += timed_predictions(accepted, rejected)
        self.tried.update(plan)
        rows_before = Counter(self.selector.rows)
        chosen, skipped = self.selector.admit(accepted)
        leave_for_later_rounds(round_dir, accepted, rejected, chosen)
        rejections = sorted([*rejected, *skipped], key=lambda x: x.candidate.order)
        workfiles.write_jsonl(workfiles.join(round_dir, SELECTED_SPOOL), sorted(chosen, key=lambda c: c.id))
        workfiles.write_jsonl(workfiles.join(round_dir, REJECTED_SPOOL), rejections)
        self.round_dirs.append(round_dir)
        gained = Counter(c.data_source for c in chosen)
        unused = Counter(c.data_source for c in aside)
        repeats = Counter(x.candidate.data_source for x in rejections if x.reason == DUPLICATE)
        for s, n in plan.items():
            self.history.setdefault(s, []).append(SourceRound(rows_before[s], n - unused[s], repeats[s], gained[s]))
        self.idle = 0 if chosen else self.idle + 1
        self.accepted_total += len(accepted)
        self.dropped.update((x.stage, x.reason) for x in rejections)
        self.rounds.append(
            {
                "round": r,
                "candidates": len(inputs.specs),
                "accepted": len(accepted),
                "not_needed": len(aside),
                "resumed": resumed,
                "executions": spent,
                "ceiling_stops": stopped,
                "memory_retries": retried,
                "stage_work_s": workfiles.read_json(workfiles.join(round_dir, WORK_FILE), {}),
                "wall_s": round(time.monotonic() - started, 3),
            }
        )
        log(
            f"round {r}: {len(accepted)} accepted, {len(rejected)} rejected"
            + (" (resumed)" if resumed else f" in {self.rounds[-1]['wall_s']:.0f} s")
        )
        for source in exhausted_sources(plan, gained, self.selector.missing()):
            retired = self.selector.retire(source, set(self.exhausted))
            if retired is None:
                continue
            heir, moved = retired
            self.exhausted[source] = {
                "after_round": r,
                "round_candidates": plan[source],
                "round_rows": gained[source],
                "rows": self.selector.rows[source],
                "moved_to": heir,
                "moved_rows": moved,
            }
            log(
                f"round {r}: {source} is exhausted ({gained[source]} rows from {plan[source]} candidates, under "
                f"{EXHAUSTION_YIELD:.0%}); its {moved} missing rows go to {heir}"
            )
