from filters.dedup import dedup_key, split_group
from tests import fixtures


def test_comments_docstrings_and_layout_do_not_change_the_key():
    edited = fixtures.GOOD.replace("class Model(nn.Module):", 'class Model(nn.Module):\n    """Doc."""  # note')
    edited = edited.replace("return torch.relu(self.linear(x))", "return torch.relu( self.linear(x) )  # relu")
    assert dedup_key(edited) == dedup_key(fixtures.GOOD)
    assert dedup_key(fixtures.CONSTANT) != dedup_key(fixtures.GOOD)


def test_the_first_member_in_run_order_is_kept():
    kept, dropped = split_group([("torch#2", 9), ("torch#2", 3), ("torch#2", 5)], lambda c: c, already_seen=False)
    assert kept == ("torch#2", 3)
    assert dropped == [("torch#2", 5), ("torch#2", 9)]


def test_a_key_seen_in_an_earlier_round_keeps_nothing():
    kept, dropped = split_group([("torch#1", 1)], lambda c: c, already_seen=True)
    assert kept is None and dropped == [("torch#1", 1)]
