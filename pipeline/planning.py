"""How many candidates a round makes of each data source: a pilot, then the missing rows over the last round's
yield; the next round's plan made ahead, as this one's execution starts; and when a source is exhausted."""

from __future__ import annotations

import math
from collections import Counter

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


def plan_round(missing: dict[str, int], tried: Counter, last_round: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Candidates to make per data source: a bounded pilot first, then the missing rows over the yield of the
    last round (`last_round[source]` = candidates made, rows gained). The last round's yield, not the run's:
    as a source's quota nears what the dedup caps admit, the yield falls and the average would lag behind.
    A plan larger than MAX_ROUND_CANDIDATES is scaled down to it (each source keeps its share)."""
    plan = {}
    for source, want in missing.items():
        made, gained = last_round.get(source, (0, 0))
        if gained:
            n = math.ceil(want * made / gained * ROUND_PADDING)
        elif tried[source]:
            n = 2 * max(made, MIN_CANDIDATES_PER_ROUND)  # the last round gained nothing: double the effort
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


def speculative_plan(missing: dict[str, int], plan: dict[str, int], last_round: dict) -> dict[str, int]:
    """The next round's plan, made as a round of `plan` starts its execution, so that the next one's CPU stages
    run beside it: the rows still `missing` less what this round should yield at the last finished round's
    yield of each data source (before any, the pilot's 1 / INITIAL_OVERSAMPLING), AHEAD_SHORTFALL_SD standard
    deviations short of the expectation, over that yield, padded as `plan_round` pads; a source short even so,
    or planned on the prior alone, covers half that yield too, within AHEAD_EXTRA more candidates (its yield may
    be falling, or the prior too high). It skips a source whose last round gained nothing (its yield is unknown),
    and is empty where this round should fill every quota. Too many candidates cost CPU time only: the execution
    stops at each round's fill point (see `pipeline.selection.FillPoint`)."""
    ahead = {}
    for source, want in missing.items():
        made, gained = last_round.get(source, (0, 0))
        if made and not gained:
            continue
        tried = plan.get(source, 0)
        expected = gained / made if made else 1 / INITIAL_OVERSAMPLING
        n = _planned_ahead(want, tried, expected)
        if n or not made:  # short even at its yield, or resting on the prior alone
            n = max(n, min(_planned_ahead(want, tried, expected / 2), n + AHEAD_EXTRA))
        if n:
            ahead[source] = n
    return capped(ahead)


def _planned_ahead(want: int, tried: int, expected: float) -> int:
    """Candidates for the rows `want` still missing after `tried` of this round at yield `expected`, counting on
    AHEAD_SHORTFALL_SD standard deviations less than it; 0 where they should come even so."""
    spread = math.sqrt(tried * expected * (1 - expected)) if expected < 1 else 0.0
    short = want - (tried * expected - AHEAD_SHORTFALL_SD * spread)
    return max(MIN_CANDIDATES_PER_ROUND, math.ceil(short / expected * ROUND_PADDING)) if short > 0 else 0


def exhausted_sources(plan: dict[str, int], gained: Counter, missing: dict[str, int]) -> list[str]:
    """The data sources still short of rows whose last round made many candidates for very few rows."""
    return [
        s
        for s, made in plan.items()
        if s in missing and made >= EXHAUSTION_MIN_CANDIDATES and gained[s] < EXHAUSTION_YIELD * made
    ]
