"""What a candidate's execution costs a worker, learned from a run's verdicts, and the order it gives a round:
the candidates expected to take longest start early, by as many places as the pool hands out meanwhile."""

from dataclasses import replace

import pytest

from opsynth.pipeline import host_costs
from opsynth.pipeline.execution_stage import execution_order
from opsynth.pipeline.host_costs import PRIOR_WEIGHT, HostCosts
from opsynth.records import Candidate


def _phases(work: float, waited: float = 0.0) -> dict:
    return {"load": 0.1, "compile": work - 0.1, "lock_wait": waited}


def test_an_operator_seen_slow_leads_by_its_mean_drawn_toward_the_runs_mean():
    costs = HostCosts()
    for _ in range(8):
        costs.add(["torch.add", "torch.relu"], _phases(1.0, waited=0.5))
    costs.add(["torch.argsort", "torch.add"], _phases(9.0, waited=3.0))
    costs.add(["torch.argsort"], _phases(5.0))
    assert costs.executions() == 10
    base = (8 * 1.0 + 9.0 + 5.0) / 10  # waits are not work
    assert costs.occupied_s() == pytest.approx((8 * 1.5 + 12.0 + 5.0) / 10)  # with them: a worker's time
    argsort = (9.0 + 5.0 + PRIOR_WEIGHT * base) / (2 + PRIOR_WEIGHT)
    assert costs.lead_s(["torch.argsort"]) == pytest.approx(argsort - base)
    assert costs.lead_s(["torch.relu", "torch.argsort", "nn.Unseen"]) == pytest.approx(argsort - base)  # the costliest
    assert (8 + 9.0 + PRIOR_WEIGHT * base) / (9 + PRIOR_WEIGHT) < base  # with a slow one, mostly fast
    assert [costs.lead_s(ops) for ops in (["torch.add"], ["torch.relu"], ["nn.Unseen"], [])] == [0.0] * 4


def test_an_execution_decided_unrun_teaches_nothing():
    costs = HostCosts()
    costs.add(["torch.add"], None)
    costs.add(["torch.add"], {})
    assert costs.executions() == 0 and costs.lead_s(["torch.add"]) == 0.0


def test_the_rounds_of_one_run_share_their_costs_and_another_run_has_its_own(tmp_path):
    run, other = tmp_path / "run" / "progress", tmp_path / "other" / "progress"
    assert host_costs.for_run(f"{run}/round-00000") is host_costs.for_run(f"{run}/round-00001/")
    assert host_costs.for_run(f"{other}/round-00000") is not host_costs.for_run(f"{run}/round-00000")


def _candidates(n: int, slow: dict[int, str]) -> list[Candidate]:
    return [
        Candidate("torch#2", i, i, ("torch.add", slow.get(i, "torch.relu")), f"code {i}", (), f"key{i}")
        for i in range(n)
    ]


def test_a_candidate_expected_to_take_longest_starts_as_many_places_earlier_as_the_workers_hand_out_meanwhile():
    costs = HostCosts()
    for _ in range(20):
        costs.add(["torch.add", "torch.relu"], _phases(1.0))
    for _ in range(4):
        costs.add(["torch.add", "torch.argsort"], _phases(4.0))
    candidates = _candidates(100, {90: "torch.argsort"})
    assert execution_order(candidates) == candidates  # nothing learned: index order
    assert execution_order(candidates, HostCosts(), workers=14) == candidates
    order = execution_order(candidates, costs, workers=10)
    per_s = 10 / costs.occupied_s()
    moved = costs.lead_s(["torch.add", "torch.argsort"]) * per_s
    assert 5 < moved < 90
    assert order.index(candidates[90]) == int(90 - moved) + 1  # just behind the candidate whose place it takes
    assert [c.index for c in order if c.index != 90] == [i for i in range(100) if i != 90]  # the others in turn
    assert execution_order(candidates, costs, workers=100).index(candidates[90]) == 0  # as early as can be


def test_learned_costs_keep_the_data_sources_spread_and_move_only_the_costly():
    costs = HostCosts()
    for op, seconds in (("torch.relu", 1.0), ("torch.relu", 1.2), ("torch.sort", 6.0), ("torch.sort", 7.0)):
        costs.add(["torch.add", op], _phases(seconds))
    light = _candidates(40, {})
    heavy = [replace(c, data_source="transformers", ops=("BertLayer",)) for c in _candidates(4, {})]
    static = execution_order([*heavy, *light])
    assert execution_order([*heavy, *light], costs, workers=14) == static  # no operator seen costly
    sorted_last = [*light[:39], replace(light[39], ops=("torch.add", "torch.sort"))]
    order = execution_order([*heavy, *sorted_last], costs, workers=14)
    assert order.index(sorted_last[39]) < static.index(light[39])
    assert [c for c in order if c is not sorted_last[39]] == [c for c in static if c is not light[39]]
