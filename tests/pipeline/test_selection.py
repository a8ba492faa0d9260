"""A round's fill point: its candidates are needed in index order until enough are accepted; the execution
stage skips the rest as verdicts come in, and the records set aside all of them, however many ran."""

from opsynth.pipeline.selection import FillPoint, trim, wanted
from opsynth.reasons import NOT_NEEDED, RUNTIME_BELOW_WINDOW
from opsynth.records import Candidate, Rejection


def _prepared(index: int, source: str = "torch#1") -> Candidate:
    return Candidate(source, index, index, ("nn.Linear",), f"# {source} {index}", (), f"k{index}",
                     measurements={"predicted_ms": 3.0})  # fmt: skip


def _ran(index: int, source: str = "torch#1") -> Candidate:
    """As the execution stage leaves a candidate: rescaled and measured."""
    return _prepared(index, source).measured({"eager_ms": 2.5, "calibration_steps": 1})


def test_a_round_asks_for_its_missing_rows_and_a_spare_for_duplicates():
    assert wanted({"torch#1": 10, "torch#2": 0}) == {"torch#1": 12}


def test_a_candidate_is_needed_until_enough_of_lower_index_are_accepted_in_whatever_order_verdicts_come():
    fill = FillPoint({"torch#1": 2, "torch#2": 1})
    fill.add(_ran(5), True)
    assert fill.needed(_prepared(9)), "one accepted so far"
    fill.add(_ran(3), False)
    fill.add(_ran(1), True)
    assert not fill.needed(_prepared(6)) and fill.skipped(_prepared(6)).reason == NOT_NEEDED
    assert fill.needed(_prepared(5)) and fill.skipped(_prepared(4)) is None, "only one accepted below them"
    assert fill.needed(_prepared(7, "torch#2")), "another data source is counted apart"
    assert not FillPoint({}).needed(_prepared(0)), "a data source the round asks nothing of"
    fill.add(_ran(8), True)  # a third accepted torch#1 candidate: beyond what was asked, it meets no other need
    assert fill.missing() == 1, "torch#2 still misses its one"


def test_the_records_set_aside_every_candidate_past_the_fill_point_whether_it_ran_or_not():
    prepared = {c.order: c for c in map(_prepared, range(6))}
    below = [Rejection(_ran(1), RUNTIME_BELOW_WINDOW, "execute", "eager 0.2 ms < 1.0 ms")]
    shape = [Rejection(_prepared(7), "shape_error", "shape_check", "mismatch")]
    # One run reached 3, 4 and 5 before it knew 0 and 2 were accepted; another skipped them.
    busy = trim([_ran(0), _ran(2), _ran(3), _ran(5)],
                [*below, Rejection(_ran(4), RUNTIME_BELOW_WINDOW, "execute", "x"), *shape],
                {"torch#1": 2}, prepared)  # fmt: skip
    quick = trim([_ran(0), _ran(2)],
                 [*below, *(Rejection(prepared[("torch#1", i)], NOT_NEEDED, "execute", "x") for i in (3, 4, 5)),
                  *shape], {"torch#1": 2}, prepared)  # fmt: skip
    assert busy == quick
    accepted, rejected, aside = busy
    assert [c.index for c in accepted] == [0, 2]
    assert [(x.candidate.index, x.reason) for x in rejected] == [(1, RUNTIME_BELOW_WINDOW), (7, "shape_error")]
    assert aside == [prepared[("torch#1", i)] for i in (3, 4, 5)], "as prepared, not as measured"


def test_a_transformers_row_is_refused_only_where_its_very_program_is_a_rows_already():
    from opsynth.filters.dedup import dedup_key
    from opsynth.pipeline.selection import Selector
    from opsynth.reasons import DUPLICATE

    def variant(index: int, batch: int, scale: float = 1.0) -> Candidate:
        code = f"class Model:\n    pass\n\n\ndef get_inputs():\n    return [torch.randn({batch}, 8)]\n"
        return Candidate("transformers", index, index, ("GPT2MLP",), code, (), dedup_key(code), batch_scale=scale)

    selector = Selector({"transformers": 4, "torch#1": 2})
    chosen, skipped = selector.admit([variant(0, 1), variant(1, 4)])
    assert [c.index for c in chosen] == [0, 1] and not skipped, "variants of one class are rows of their own"
    # A later round's candidate, drawn at a batch of 64 and shrunk to 1 in execution: row 0's very program.
    chosen, skipped = selector.admit([variant(5, 1, 1 / 64), variant(6, 2)])
    assert [c.index for c in chosen] == [6]
    assert [(r.candidate.index, r.reason) for r in skipped] == [(5, DUPLICATE)]
    assert variant(0, 1).id in skipped[0].detail
    assert selector.rows["transformers"] == 3
