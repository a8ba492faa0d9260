"""The GPU-memory interference benchmark's classing of forwards by the other process's calls (its measure needs a
GPU and runs on one by hand)."""

from opsynth.bench.free_interference import where_it_fell


def test_a_forward_is_classed_by_the_call_it_overlaps_else_by_the_nearest_span_after_one():
    calls = [("alloc", 1.000, 1.002), ("free", 2.000, 2.004)]
    assert where_it_fell(1.001, 1.003, calls) == "alloc, during"
    assert where_it_fell(2.010, 2.011, calls) == "free, within 20 ms after"
    assert where_it_fell(2.030, 2.031, calls) == "free, within 50 ms after"
    assert where_it_fell(2.090, 2.091, calls) == "free, within 100 ms after"
    assert where_it_fell(1.500, 1.501, calls) == "clear"
