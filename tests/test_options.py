import pytest

from opsynth.config import OPS6K_MIXTURE
from opsynth.errors import UsageError
from opsynth.options import parse_dtypes, parse_mixture, parse_window, quotas


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


def test_mixture_accepts_both_spellings():
    m = parse_mixture("torch1=25, torch#2=75")
    assert m["torch#1"] == 25.0 and m["torch#2"] == 75.0 and m["transformers"] == 0.0
    thirds = parse_mixture("torch1=33.33,torch2=33.33,torch3=33.33")  # within the slack of 100: made exact
    assert sum(thirds.values()) == pytest.approx(100.0)


@pytest.mark.parametrize(
    "text",
    ["torch1", "torch9=3", "torch1=abc", "torch1=-1", "torch1=0", "torch1=1,torch1=2", "torch1=nan", "",
     "torch1=20,torch2=60", "torch1=1,torch2=3"],
)  # fmt: skip
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

    from opsynth.pipeline.planning import SourceRound, plan_round

    missing = {"torch#1": 20}
    # The run so far: 200 made for 80 rows (40 %), but the last round: 100 made for 10 rows (10 %).
    history = {"torch#1": [SourceRound(0, 100, 0, 70), SourceRound(70, 100, 0, 10)]}
    plan = plan_round(missing, Counter({"torch#1": 200}), history, Counter({"torch#1": 80}))
    assert plan == {"torch#1": 230}  # 20 missing / 10 % x 1.15
    nothing = {"torch#1": [SourceRound(0, 30, 0, 0)]}
    assert plan_round(missing, Counter({"torch#1": 200}), nothing, Counter()) == {"torch#1": 60}
    pilot = plan_round({"torch#1": 100}, Counter(), {}, Counter())
    assert pilot == {"torch#1": 160}  # 1.6 per row, at most 160


def test_a_round_never_exceeds_the_candidate_cap():
    from collections import Counter

    from opsynth.config import MAX_ROUND_CANDIDATES
    from opsynth.pipeline.planning import SourceRound, plan_round

    # 600,000 rows at a 50 % yield would ask for 1.4 M candidates in one round.
    history = {"torch#1": [SourceRound(0, 10, 0, 5)], "torch#2": [SourceRound(0, 10, 0, 5)]}
    plan = plan_round({"torch#1": 20_400, "torch#2": 502_620}, Counter({"torch#1": 10, "torch#2": 10}), history,
                      Counter({"torch#1": 5, "torch#2": 5}))  # fmt: skip
    assert sum(plan.values()) <= MAX_ROUND_CANDIDATES
    assert plan["torch#2"] > 20 * plan["torch#1"]  # shares kept


def test_repeats_grow_as_a_source_fills_and_its_rounds_are_planned_for_them():
    import math
    from collections import Counter

    from opsynth.pipeline.planning import SATURATED_SHARE, SourceRound, fitted_capacity, no_repeats, plan_round

    # torch#2 in one H200's 6,000-row run: round 0 ran 160 (3 repeats, 125 rows), round 1 3,605 from 125 rows
    # (459 repeats, 2,508 rows). The fitted capacity predicts round 2, 3,174 candidates from 2,633 rows: 2,334
    # were no repeat.
    history = [SourceRound(0, 160, 3, 125), SourceRound(125, 3605, 459, 2508)]
    capacity = fitted_capacity(history)
    assert 13_000 < capacity < 15_000
    assert abs(no_repeats(capacity, 2633, 3174) - 2334) < 0.03 * 2334
    # Each round's own expectation at that capacity, summed, gives theirs: the fit's definition.
    assert sum(no_repeats(capacity, x.rows_before, x.run) for x in history) == pytest.approx(160 - 3 + 3605 - 459)
    # Round 2 at the last round's yield (2,393 rows missing, 3,605 candidates a 2,508 rows, x 1.15: 3,956) would
    # give 2,783 no repeat, 2,219 rows; planned for the repeats it is 5,103 candidates, the round's cap of 4,096.
    plan = plan_round({"torch#2": 2393}, Counter({"torch#2": 3765}), {"torch#2": history}, Counter({"torch#2": 2633}))
    keep = 2508 / (3605 - 459)
    fresh = 2393 * 1.15 / keep
    assert plan == {"torch#2": 4096}  # the round's cap
    assert no_repeats(capacity, 2633, math.ceil(-capacity * math.log1p(-fresh / (capacity - 2633)))) == pytest.approx(
        fresh, rel=1e-3
    )
    # No repeat yet: no saturation, the last round's yield alone.
    assert fitted_capacity([SourceRound(0, 100, 0, 80)]) == math.inf
    assert plan_round({"torch#2": 80}, Counter({"torch#2": 100}), {"torch#2": [SourceRound(0, 100, 0, 80)]},
                      Counter({"torch#2": 80})) == {"torch#2": 115}  # fmt: skip
    # A source with fewer tasks left than its rows need makes those that take SATURATED_SHARE of what is left:
    # single operators, about 320 by the fit, 95 rows taken, 400 more wanted.
    single = [SourceRound(0, 160, 23, 69), SourceRound(69, 97, 42, 26)]
    capacity = fitted_capacity(single)
    rows = Counter({"torch#1": 95})
    (n,) = plan_round({"torch#1": 400}, Counter({"torch#1": 257}), {"torch#1": single}, rows).values()
    assert no_repeats(capacity, 95, n) == pytest.approx(SATURATED_SHARE * (capacity - 95), rel=1e-2)


def test_the_next_round_is_planned_from_what_this_one_may_yield_short_of_its_expectation():
    from collections import Counter

    from opsynth.config import AHEAD_EXTRA, MAX_ROUND_CANDIDATES
    from opsynth.pipeline.planning import SourceRound, speculative_plan

    def measured(run, gained, repeats=0, rows_before=0):
        return [SourceRound(rows_before, run, repeats, gained)]

    none = Counter()
    # A 600-row run's pilot: 160 torch#2 candidates for 503 rows, at the pilot's 62.5 % about 100 (sd 6.1); 74
    # torch#3 candidates for its 46 rows are expected to give 46.25 (sd 4.2), which two sd short of it misses 8.
    ahead = speculative_plan({"torch#2": 503, "torch#3": 46}, {"torch#2": 160, "torch#3": 74}, {}, none)
    # (503 - (100 - 2 x 6.1)) / 62.5 % x 1.15 = 764.2; (46 - (46.25 - 2 x 4.2)) / 62.5 % x 1.15 = 14.9; and as
    # those rest on the prior alone, half its yield is covered too, with at most 32 candidates more: torch#2
    # 765 + 32; torch#3 at 31.25 % (23.1 expected, sd 4.0: 30.9 short) 114, so 15 + 32.
    assert ahead == {"torch#2": 765 + AHEAD_EXTRA, "torch#3": 15 + AHEAD_EXTRA}
    # The source of a few rows whose real yield was 0.4 on one H200 (20 rows, a pilot of 32): 11 at the prior's
    # yield, which left it 2 rows short in every 600-row run there; 43 now.
    assert speculative_plan({"torch#1": 20}, {"torch#1": 32}, {}, none) == {"torch#1": 11 + AHEAD_EXTRA}
    # Where even half the prior's yield fills a source, nothing is planned for it.
    assert speculative_plan({"torch#1": 2}, {"torch#1": 32}, {}, none) == {}
    # After a round of 400 that gave 320 rows (80 %): 252 candidates for 183 rows do, two sd short (188.9).
    assert speculative_plan({"torch#2": 183}, {"torch#2": 252}, {"torch#2": measured(400, 320)}, none) == {}
    # 100 do not (160 at 80 %): half that yield is covered too, within 32 more, the yield may be falling.
    ahead = speculative_plan({"torch#2": 183}, {"torch#2": 100}, {"torch#2": measured(400, 320)}, none)
    assert ahead == {"torch#2": 160 + AHEAD_EXTRA}
    # Single operators in a 2,000-row run on one H200: round 0's 109 candidates gave 40 rows, round 1 ran 51 for
    # the 28 missing (18.7 expected, sd 3.4) and gave 14. Round 2, planned at round 0's 37 %, was 51 and gave 10
    # of the 14 (its yield 20 %), so a round 3 followed; at half the yield the plan is about 150, so 51 + 32.
    ahead = speculative_plan({"torch#1": 28}, {"torch#1": 51}, {"torch#1": measured(109, 40)}, none)
    assert ahead == {"torch#1": 51 + AHEAD_EXTRA}
    # A yield of 1 (the CPU's tiny workload) is certain: the plan's own rows do.
    assert speculative_plan({"torch#2": 50}, {"torch#2": 50}, {"torch#2": measured(60, 60)}, none) == {}
    assert speculative_plan({"torch#1": 20}, {"torch#1": 60}, {"torch#1": measured(60, 0)}, none) == {}, "unknown"
    assert sum(speculative_plan({"torch#2": 50_000}, {"torch#2": 400}, {}, none).values()) <= MAX_ROUND_CANDIDATES


def test_the_next_round_counts_on_this_ones_repeats():
    from collections import Counter

    from opsynth.pipeline.planning import SourceRound, fitted_capacity, no_repeats, speculative_plan

    # One H200's 6,000-row run, as its round 2 (3,174 torch#2 candidates, 2,633 rows taken, 2,393 missing)
    # starts. Round 3, planned at round 1's yield alone (rows per candidate), was too small: round 2 gave 1,862
    # rows, left 531 missing, and round 3 gave 240 of them; two more rounds followed.
    history = [SourceRound(0, 160, 3, 125), SourceRound(125, 3605, 459, 2508)]
    blind = [SourceRound(0, 160, 0, 125), SourceRound(125, 3605, 0, 2508)]  # the same yields, no repeats told
    rows = Counter({"torch#2": 2633})
    ahead = speculative_plan({"torch#2": 2393}, {"torch#2": 3174}, {"torch#2": history}, rows)["torch#2"]
    before = speculative_plan({"torch#2": 2393}, {"torch#2": 3174}, {"torch#2": blind}, rows)["torch#2"]
    capacity, keep = fitted_capacity(history), history[-1].keep
    assert no_repeats(capacity, 2633 + 1862, ahead) * keep > 531 > no_repeats(capacity, 2633 + 1862, before) * keep
    # A pilot's few repeats (3 of 160) fit no capacity: the next round is planned as without them.
    pilot = speculative_plan({"torch#2": 4901}, {"torch#2": 3605}, {"torch#2": history[:1]}, Counter({"torch#2": 125}))
    assert (
        pilot
        == speculative_plan({"torch#2": 4901}, {"torch#2": 3605}, {"torch#2": blind[:1]}, Counter())
        == {
            "torch#2": 3174  # the run's round 2
        }
    )


def test_an_exhausted_data_source_hands_its_missing_rows_to_the_largest_one():
    from collections import Counter

    from opsynth.pipeline.planning import exhausted_sources
    from opsynth.pipeline.selection import Selector

    selector = Selector({"torch#1": 200, "torch#2": 5000, "torch#3": 450})
    selector.rows.update({"torch#1": 120, "torch#2": 3800, "torch#3": 400})
    # The round of a 6K run in which single operators ran out: 13 rows from 2,971 candidates.
    plan = {"torch#1": 2971, "torch#2": 1109, "torch#3": 15}
    gained = Counter({"torch#1": 13, "torch#2": 314})
    # torch#3 made no row, but from too few candidates to judge it; torch#2 yields 28 %.
    assert exhausted_sources(plan, gained, selector.missing()) == ["torch#1"]
    assert exhausted_sources({"torch#1": 1000}, Counter({"torch#1": 10}), selector.missing()) == []  # 1 % still yields
    assert exhausted_sources(plan, gained, {"torch#2": 5}) == []  # a source with its rows is never exhausted
    assert selector.retire("torch#1", set()) == ("torch#2", 80)
    assert selector.missing() == {"torch#2": 1280, "torch#3": 50}
    assert sum(selector.quota.values()) == 5650  # the set keeps its size
    # With no other source left to take them, the rows stay missing (and the run fails short, saying so).
    assert Selector({"torch#1": 10}).retire("torch#1", set()) is None
    assert Selector({"torch#1": 10, "torch#2": 10}).retire("torch#1", {"torch#2"}) is None


def test_a_resumed_round_follows_the_plan_it_wrote(tmp_path):
    import json

    from opsynth.pipeline.graph import ACCEPTED, EXECUTE_REJECTED, PREPARE_REJECTED
    from opsynth.pipeline.rounds import DONE_MARKER, PLAN_FILE, recorded_plan

    assert recorded_plan(str(tmp_path / "round-00003")) is None  # not started: the planner decides
    planned = tmp_path / "round-00004"
    planned.mkdir()
    (planned / PLAN_FILE).write_text(json.dumps({"torch#2": 40, "torch#3": 2}))
    assert recorded_plan(str(planned)) == {"torch#2": 40, "torch#3": 2}
    # A finished round of an earlier version wrote no plan: its candidates are counted from its records.
    done = tmp_path / "round-00005"
    done.mkdir()
    (done / f"{ACCEPTED}-00000-of-00001.jsonl").write_text('{"data_source": "torch#2"}\n' * 3)
    (done / f"{PREPARE_REJECTED}-00000-of-00002.jsonl").write_text('{"candidate": {"data_source": "torch#1"}}\n')
    (done / f"{EXECUTE_REJECTED}-00000-of-00001.jsonl").write_text('{"candidate": {"data_source": "torch#2"}}\n')
    assert recorded_plan(str(done)) is None  # unfinished: redone as planned
    (done / DONE_MARKER).write_text("")
    assert recorded_plan(str(done)) == {"torch#1": 1, "torch#2": 4}
    assert list(recorded_plan(str(done))) == ["torch#1", "torch#2"]  # in the mixture's order, as planned


def test_dtypes_read_as_weights_in_a_fixed_order_float32_alone_as_none():
    assert parse_dtypes("bfloat16=1, float32=3") == {"float32": 3.0, "bfloat16": 1.0}
    assert parse_dtypes("float16,bfloat16") == {"bfloat16": 1.0, "float16": 1.0}
    assert parse_dtypes("float16=0,float32=5") is None  # the default: float32 alone
    assert parse_dtypes("float16") == {"float16": 1.0}


@pytest.mark.parametrize("text", ["float64", "half", "float32=x", "float32=-1", "float32=0", "float32,float32", "",
                                  "bfloat16=inf"])  # fmt: skip
def test_malformed_dtypes_are_usage_errors(text):
    with pytest.raises(UsageError, match="--dtypes"):
        parse_dtypes(text)


def test_a_gpu_set_element_budget_is_part_of_what_a_resume_must_match():
    from dataclasses import replace

    from opsynth.options import GenerateOptions

    options = GenerateOptions(
        out="o", num_samples=20, seed=1, preset="ops6k", mixture=OPS6K_MIXTURE, op_weights="ops6k", device="cpu",
        workload="tiny", runtime_window_ms=(0.005, 50.0), kernelbench="embedded", similarity_threshold=0.9,
        jaccard_threshold=0.85, compile_check=False, timeout_s=60, workers=2, batch_size=64,
    )  # fmt: skip
    assert options.fingerprint()["max_elements"] is None  # the workload's own budget
    assert replace(options, max_elements=1 << 31).fingerprint()["max_elements"] == 1 << 31
    assert replace(options, workers=7, accelerator="x").fingerprint() == options.fingerprint()
    assert "dtypes" not in options.fingerprint()  # as a run made before --dtypes recorded it
    mixed = replace(options, dtypes={"float32": 3.0, "bfloat16": 1.0})
    assert mixed.fingerprint()["dtypes"] == {"float32": 3.0, "bfloat16": 1.0}
    assert mixed.sizes.dtypes == (("float32", 3.0), ("bfloat16", 1.0)) and options.sizes.dtypes == (("float32", 1.0),)


def test_a_data_source_name_says_its_kind_and_operator_count():
    from opsynth.data_sources import TRANSFORMERS, kind, operator_count, torch_source

    assert torch_source(3) == "torch#3" and operator_count("torch#3") == 3 and kind("torch#3") == "torch"
    assert kind(TRANSFORMERS) == "transformers" and operator_count(TRANSFORMERS) == 1
