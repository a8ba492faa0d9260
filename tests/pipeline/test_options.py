import pytest

from pipeline.config import OPS6K_MIXTURE
from pipeline.errors import UsageError
from pipeline.options import parse_mixture, parse_window, quotas


def test_6000_rows_reproduce_the_released_counts():
    assert quotas(6000, OPS6K_MIXTURE) == {
        "torch#1": 204, "torch#2": 5026, "torch#3": 457, "torch#4": 168, "torch#5": 74, "transformers": 71,
    }  # fmt: skip


@pytest.mark.parametrize("n", [1, 7, 20, 24, 99, 1001])
def test_quotas_sum_to_n_and_follow_largest_remainders(n):
    q = quotas(n, OPS6K_MIXTURE)
    assert sum(q.values()) == n
    for source, count in q.items():
        assert abs(count - n * OPS6K_MIXTURE[source] / 100) < 1


def test_mixture_accepts_both_spellings_and_normalizes():
    m = parse_mixture("torch1=1, torch#2=3")
    assert m["torch#1"] == 25.0 and m["torch#2"] == 75.0 and m["transformers"] == 0.0


@pytest.mark.parametrize(
    "text", ["torch1", "torch9=3", "torch1=abc", "torch1=-1", "torch1=0", "torch1=1,torch1=2", "torch1=nan", ""]
)
def test_malformed_mixtures_are_usage_errors(text):
    with pytest.raises(UsageError, match="--mixture"):
        parse_mixture(text)


@pytest.mark.parametrize("text", ["1", "1,2,3", "a,b", "5,1", "-1,3", "1,inf"])
def test_malformed_windows_are_usage_errors(text):
    with pytest.raises(UsageError, match="--runtime-window-ms"):
        parse_window(text)
    assert parse_window("1,100") == (1.0, 100.0)


def test_rounds_are_planned_from_the_last_rounds_yield():
    from collections import Counter

    from pipeline.run import _plan_round

    missing = {"torch#1": 20}
    # The run so far: 200 made for 80 rows (40 %), but the last round: 100 made for 10 rows (10 %).
    plan = _plan_round(missing, Counter({"torch#1": 200}), {"torch#1": (100, 10)})
    assert plan == {"torch#1": 230}  # 20 missing / 10 % x 1.15
    assert _plan_round(missing, Counter({"torch#1": 200}), {"torch#1": (30, 0)}) == {"torch#1": 60}
    assert _plan_round({"torch#1": 100}, Counter(), {}) == {"torch#1": 250}


def test_a_round_never_exceeds_the_candidate_cap():
    from collections import Counter

    from pipeline.config import MAX_ROUND_CANDIDATES
    from pipeline.run import _plan_round

    # 600,000 rows at a 50 % yield would ask for 1.4 M candidates in one round.
    plan = _plan_round({"torch#1": 20_400, "torch#2": 502_620}, Counter({"torch#1": 10, "torch#2": 10}),
                       {"torch#1": (10, 5), "torch#2": (10, 5)})  # fmt: skip
    assert sum(plan.values()) <= MAX_ROUND_CANDIDATES
    assert plan["torch#2"] > 20 * plan["torch#1"]  # shares kept
