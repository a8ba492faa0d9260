"""`generate --plan`: whether each data source holds enough distinct tasks for its rows, before any GPU time."""

import re
from collections import Counter

import pytest

from opsynth.commands.cli import main
from opsynth.config import OPS6K_MIXTURE
from opsynth.options import GenerateOptions, quotas
from opsynth.pipeline.plan import (
    OPEN,
    SourcePlan,
    capacity,
    estimate,
    most_rows,
    richness,
    tasks_needed,
    walk_source,
)


def _options(num_samples: int, mixture: dict[str, float] = OPS6K_MIXTURE) -> GenerateOptions:
    return GenerateOptions(
        out="", num_samples=num_samples, seed=3, preset="ops6k", mixture=mixture, op_weights="ops6k", device="cpu",
        workload="tiny", runtime_window_ms=(0.005, 50.0), kernelbench="embedded", similarity_threshold=0.9,
        jaccard_threshold=0.85, compile_check=False, timeout_s=60, workers=1, batch_size=64,
    )  # fmt: skip


def test_capacity_follows_saturating_growth_and_stays_open_while_the_second_half_keeps_pace():
    assert capacity(500, 750) == 1000  # each half admits half of what is left: 500 + 250 + 125 + ...
    assert capacity(500, 1000) is OPEN and capacity(500, 960) is OPEN  # 40 fewer: within a count's noise
    assert capacity(500, 900) == 2500  # 100 fewer: saturation shows
    assert capacity(0, 0) == 0
    assert capacity(300, 300) == 300, "the second half admitted nothing: it ran dry"


def test_richness_counts_the_unseen_tasks_from_those_drawn_once_and_twice():
    assert richness(Counter({"a": 3, "b": 2, "c": 5})) == 3  # every task drawn again: nothing unseen
    assert richness(Counter({**{f"once{i}": 1 for i in range(10)}, "x": 2, "y": 2})) == 12 + 10 * 9 // 6
    many = Counter({f"t{i}": 1 for i in range(100)})
    assert richness(many) > 1000  # nothing repeats: no end in sight


def test_the_estimate_is_the_growth_fit_bounded_by_the_richness():
    draws = Counter({f"t{i}": 2 for i in range(300)})  # every task drawn twice: 300 is all there is
    assert capacity(500, 1000) is OPEN and estimate(500, 1000, draws) == 300
    assert estimate(500, 750, Counter({f"t{i}": 1 for i in range(900)})) == 1000  # the fit, the smaller


def test_a_source_that_runs_dry_is_short_and_one_within_reach_is_met():
    dry = walk_source(_options(50_000, {"torch#1": 100.0}), "torch#1", 50_000, sample=300)
    assert dry.walked == 300 and not dry.met
    assert dry.distinct <= dry.capacity < dry.needed
    small = walk_source(_options(20), "torch#1", 20, sample=300)
    assert small.met and small.distinct == small.needed < small.walked <= 300


@pytest.fixture
def short_walks(monkeypatch):
    """The plan's first estimate after 300 candidates, not PLAN_SAMPLE: a source far short is told as surely."""
    import opsynth.pipeline.plan

    monkeypatch.setattr(opsynth.pipeline.plan, "PLAN_SAMPLE", 300)


def test_plan_prints_each_source_and_refuses_a_mixture_a_source_cannot_meet(capsys, short_walks):
    assert main(["generate", "--plan", "--num-samples", "40", "--device", "cpu", "--workload", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    sources = [s for s, n in quotas(40, OPS6K_MIXTURE).items() if n]  # transformers gets no row of 40
    assert out[0].startswith("plan for 40 rows") and [line.split()[0] for line in out[2:]] == sources
    assert all(line.split()[-1] == "ok" for line in out[2:])

    argv = ["generate", "--plan", "--num-samples", "100000", "--mixture", "torch1=100", "--device", "cpu"]
    assert main([*argv, "--workload", "tiny"]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[2].split()[-1] == "short"
    assert captured.err.startswith("opsynth: error: torch#1 holds about") and len(captured.err.splitlines()) == 1
    assert "(--dtypes)" in captured.err  # float32 alone: more dtypes would widen the source
    held, fewer = map(int, re.search(r"holds about (\d+) .* --num-samples (\d+) or fewer", captured.err).groups())
    assert tasks_needed(fewer) <= held < tasks_needed(fewer + 1)


def test_the_rows_a_refusal_offers_are_the_most_every_short_source_meets():
    short = [
        SourcePlan("torch#1", 20400, 29143, 1000, 900, 6480),
        SourcePlan("transformers", 7080, 10115, 1000, 806, 2505),
    ]
    n = most_rows(short, OPS6K_MIXTURE)

    def needs(rows: int) -> list[int]:
        return [tasks_needed(quotas(rows, OPS6K_MIXTURE)[p.source]) for p in short]

    assert all(need <= p.capacity for need, p in zip(needs(n), short, strict=True))
    assert any(need > p.capacity for need, p in zip(needs(n + 1), short, strict=True))
    assert n < most_rows(short[1:], OPS6K_MIXTURE)  # torch#1 is the tighter of the two


def test_dtypes_widen_what_a_source_holds(capsys, short_walks):
    from dataclasses import replace

    asked = _options(50_000, {"torch#1": 100.0})
    float32 = walk_source(asked, "torch#1", 50_000, sample=300)
    mixed = walk_source(replace(asked, dtypes={"float32": 1.0, "bfloat16": 1.0, "float16": 1.0}), "torch#1", 50_000,
                        sample=300)  # fmt: skip
    assert mixed.distinct > float32.distinct and mixed.capacity > float32.capacity

    argv = ["generate", "--plan", "--num-samples", "100000", "--mixture", "torch1=100", "--device", "cpu",
            "--workload", "tiny"]  # fmt: skip
    assert main([*argv, "--dtypes", "float32,bfloat16,float16"]) == 2
    captured = capsys.readouterr()
    assert "dtypes float32=1,bfloat16=1,float16=1" in captured.out and "(--dtypes)" not in captured.err


@pytest.mark.parametrize("argv", [["--num-samples", "5"], ["--num-samples", "5", "--device", "cpu"]])
def test_generate_without_out_or_plan_is_a_usage_error(argv, capsys):
    assert main(["generate", *argv]) == 2
    assert "--out" in capsys.readouterr().err
