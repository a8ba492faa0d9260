"""How many candidates a round makes of each data source: a pilot, then the missing rows over the yield measured,
counting on the repeats that grow as a source fills; the next round planned ahead; when a source is exhausted
(docs/execution.md, "Rounds")."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from opsynth.config import (
    AHEAD_EXTRA,
    AHEAD_SHORTFALL_SD,
    EXHAUSTION_MIN_CANDIDATES,
    EXHAUSTION_YIELD,
    INITIAL_OVERSAMPLING,
    MAX_ROUND_CANDIDATES,
    PILOT_CANDIDATES,
    ROUND_PADDING,
)

MIN_CANDIDATES_PER_ROUND = 4
# Where a source's capacity cannot give a round's rows at all (by the fit), it makes the candidates that would
# take this share of what is left; its rounds' yields then tell whether it is exhausted.
SATURATED_SHARE = 0.9
# The capacity is fitted once a source's rounds have this many repeats (a count's relative error is about one over
# its square root), and read as unbounded before. A pilot's few repeats are the most drawn operator graphs meeting
# their caps, which a fit over all the graphs takes for a small capacity: torch#2's 3 repeats in 160 candidates
# fitted 4,200 where its rounds 0-1 fitted 14,000, and the round planned from it made 2,200 candidates too many
# (4,094, on the CPU's tiny workload, where they cost the 2 cores 26 s of a 6,000-row run).
MIN_FIT_REPEATS = 50


@dataclass(frozen=True)
class SourceRound:
    """One finished round of a data source: the rows it had before, the candidates it ran (those set aside past
    the round's fill point not counted), how many of them were dropped as repeats, and the rows it gained."""

    rows_before: int
    run: int
    repeats: int
    gained: int

    @property
    def keep(self) -> float:
        """Of its candidates that were no repeat, the share that became rows."""
        fresh = self.run - self.repeats
        return self.gained / fresh if fresh > 0 else 0.0


def no_repeats(capacity: float, rows: int, n: float) -> float:
    """Candidates expected to be no repeat among `n` made when `rows` of the source's `capacity` are taken."""
    if math.isinf(capacity):
        return n
    return max(0.0, capacity - rows) * -math.expm1(-n / capacity)


def candidates_for(capacity: float, rows: int, fresh: float) -> int:
    """Candidates to make for `fresh` of them to be no repeat, from `rows` taken; where the capacity left cannot
    give them, those that would take SATURATED_SHARE of what is left."""
    if math.isinf(capacity):
        return math.ceil(fresh)
    left = capacity - rows
    share = min(fresh / left, SATURATED_SHARE) if left > 0 else SATURATED_SHARE
    return math.ceil(-capacity * math.log1p(-share))


def fitted_capacity(rounds: list[SourceRound]) -> float:
    """The capacity at which the rounds' expected non-repeats add up to theirs (math.inf where they repeated fewer
    than MIN_FIT_REPEATS times). The expectation grows with the capacity, so bisection on its logarithm finds it;
    large rounds weigh most."""
    rounds = [x for x in rounds if x.run > 0]
    fresh = sum(x.run - x.repeats for x in rounds)
    if sum(x.run for x in rounds) - fresh < MIN_FIT_REPEATS:
        return math.inf

    def expected(capacity: float) -> float:
        return sum(no_repeats(capacity, x.rows_before, x.run) for x in rounds)

    low = max(x.rows_before for x in rounds) + 1.0
    if expected(low) >= fresh:
        return low
    high = 2.0 * low
    while expected(high) < fresh:
        high *= 2.0
        if high > 1e12:
            return math.inf
    for _ in range(60):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if expected(mid) < fresh else (low, mid)
    return high


def _fitted(past: list[SourceRound]) -> tuple[float, float]:
    """A source's capacity and keep rate from its finished rounds; where no capacity is fitted, every candidate
    counts as no repeat, at the last round's rows per candidate."""
    capacity, last = fitted_capacity(past), past[-1]
    return capacity, (last.keep if math.isfinite(capacity) else last.gained / last.run)


def plan_round(
    missing: dict[str, int], tried: Counter, history: dict[str, list[SourceRound]], rows: Counter
) -> dict[str, int]:
    """Candidates to make per data source: a bounded pilot first, then enough for the missing rows at the keep
    rate of the last round (`history[source]`: its finished rounds), among candidates made no repeat at the
    capacity fitted to all its rounds, from the `rows` it has. The last round's keep rate, not the run's: it
    changes as the sizes and checks settle. A plan larger than MAX_ROUND_CANDIDATES is scaled down to it (each
    source keeps its share)."""
    plan = {}
    for source, want in missing.items():
        past = history.get(source, [])
        if past and past[-1].gained:
            capacity, keep = _fitted(past)
            n = candidates_for(capacity, rows[source], want * ROUND_PADDING / keep)
        elif tried[source]:
            n = 2 * max(past[-1].run if past else 0, MIN_CANDIDATES_PER_ROUND)  # nothing gained: double the effort
        else:
            n = min(math.ceil(want * INITIAL_OVERSAMPLING), PILOT_CANDIDATES)
        plan[source] = max(MIN_CANDIDATES_PER_ROUND, n)
    return capped(plan)


def capped(plan: dict[str, int]) -> dict[str, int]:
    """A plan of more than MAX_ROUND_CANDIDATES scaled down to it, each source keeping its share."""
    total = sum(plan.values())
    if total > MAX_ROUND_CANDIDATES:
        plan = {s: max(MIN_CANDIDATES_PER_ROUND, n * MAX_ROUND_CANDIDATES // total) for s, n in plan.items()}
    return plan


def speculative_plan(
    missing: dict[str, int], plan: dict[str, int], history: dict[str, list[SourceRound]], rows: Counter
) -> dict[str, int]:
    """The next round's plan, made as a round of `plan` starts its execution, so that the next one's CPU stages
    run beside it: the rows still `missing` less what this round should yield (its non-repeats at the capacity
    fitted so far, from the `rows` each source has, at the last finished round's keep rate; before any, the
    pilot's 1 / INITIAL_OVERSAMPLING and no repeats), AHEAD_SHORTFALL_SD standard deviations short of the
    expectation, planned as `plan_round` plans from the rows this round should leave; a source short even so,
    or planned on the prior alone, covers half that keep rate too, within AHEAD_EXTRA more candidates (its
    yield may be falling, or the prior too high). It skips a source whose last round gained nothing (its yield
    is unknown), and is empty where this round should fill every quota. Too many candidates cost CPU time only:
    the execution stops at each round's fill point (see `pipeline.selection.FillPoint`)."""
    ahead = {}
    for source, want in missing.items():
        past = history.get(source, [])
        if past and not past[-1].gained:
            continue
        capacity, keep = _fitted(past) if past else (math.inf, 1 / INITIAL_OVERSAMPLING)
        tried = plan.get(source, 0)
        fresh = no_repeats(capacity, rows[source], tried)
        n = _planned_ahead(want, tried, fresh, keep, capacity, rows[source])
        if n or not past:  # short even at its yield, or resting on the prior alone
            n = max(n, min(_planned_ahead(want, tried, fresh, keep / 2, capacity, rows[source]), n + AHEAD_EXTRA))
        if n:
            ahead[source] = n
    return capped(ahead)


def _planned_ahead(want: int, tried: int, fresh: float, keep: float, capacity: float, rows: int) -> int:
    """Candidates for the rows `want` still missing after `tried` of this round, `fresh` of them no repeat and
    kept at `keep`, counting on AHEAD_SHORTFALL_SD standard deviations less than expected; 0 where they should
    come even so."""
    expected = fresh * keep
    rate = expected / tried if tried else 0.0
    spread = math.sqrt(tried * rate * (1 - rate)) if rate < 1 else 0.0
    gained = expected - AHEAD_SHORTFALL_SD * spread  # below 0 where the spread is wide: counted as it is
    short = want - gained
    if short <= 0:
        return 0
    n = candidates_for(capacity, rows + max(0, math.floor(gained)), short * ROUND_PADDING / keep)
    return max(MIN_CANDIDATES_PER_ROUND, n)


def exhausted_sources(plan: dict[str, int], gained: Counter, missing: dict[str, int]) -> list[str]:
    """The data sources still short of rows whose last round made many candidates for very few rows."""
    return [
        s
        for s, made in plan.items()
        if s in missing and made >= EXHAUSTION_MIN_CANDIDATES and gained[s] < EXHAUSTION_YIELD * made
    ]
