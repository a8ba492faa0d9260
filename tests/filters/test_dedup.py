from opsynth.filters.dedup import WithinSetFilter, dedup_key, op_graph_hash, split_group, task_key
from tests import fixtures


def test_comments_docstrings_and_layout_do_not_change_the_key():
    edited = fixtures.GOOD.replace("class Model(nn.Module):", 'class Model(nn.Module):\n    """Doc."""  # note')
    edited = edited.replace("return torch.tanh(self.linear(x)) * 2", "return torch.tanh( self.linear(x) )*2  # tanh")
    assert edited != fixtures.GOOD
    assert dedup_key(edited) == dedup_key(fixtures.GOOD)
    assert dedup_key(fixtures.CONSTANT) != dedup_key(fixtures.GOOD)


def test_the_first_member_in_run_order_is_kept():
    kept, dropped = split_group([("torch#2", 9), ("torch#2", 3), ("torch#2", 5)], lambda c: c, already_seen=False)
    assert kept == ("torch#2", 3)
    assert dropped == [("torch#2", 5), ("torch#2", 9)]


def test_a_key_seen_in_an_earlier_round_keeps_nothing():
    kept, dropped = split_group([("torch#1", 1)], lambda c: c, already_seen=True)
    assert kept is None and dropped == [("torch#1", 1)]


def test_operator_graph_hash_follows_the_ordered_ops():
    assert op_graph_hash(["nn.Conv2d", "torch.relu"]) == op_graph_hash(["nn.Conv2d", "torch.relu"])
    assert op_graph_hash(["nn.Conv2d", "torch.relu"]) != op_graph_hash(["torch.relu", "nn.Conv2d"])


def _rebatched(source: str) -> str:
    """The same program with another batch extent, as the calibration rescales it: in `batch_size = N`, and in
    the shapes `get_inputs` writes out for other inputs that share it."""
    import re

    n = re.search(r"(?m)^batch_size = (\d+)$", source).group(1)
    m = str(int(n) * 2 + 3)
    head, inputs = source.split("def get_inputs", 1)
    head = head.replace(f"\nbatch_size = {n}\n", f"\nbatch_size = {m}\n")
    return head + "def get_inputs" + re.sub(rf"(torch\.\w+\(){n}\b", rf"\g<1>{m}", inputs)


def test_module_constants_read_by_the_program_are_part_of_its_key():
    from opsynth.config import WORKLOADS
    from opsynth.operator_catalog.codegen import render
    from opsynth.operator_catalog.compose import compose

    source = render(compose(3, 2, WORKLOADS["tiny"], 64)).source
    assert _rebatched(source) != source
    assert dedup_key(_rebatched(source)) != dedup_key(source)  # another size is another program
    assert dedup_key(source + "\nunused = 5\n") == dedup_key(source)  # a constant nothing reads is no change


def test_the_same_task_is_the_same_program_but_for_its_batch_extent():
    from opsynth.config import WORKLOADS
    from opsynth.operator_catalog.codegen import render
    from opsynth.operator_catalog.compose import compose

    source = render(compose(3, 2, WORKLOADS["tiny"], 64)).source
    assert task_key(_rebatched(source)) == task_key(source)
    for line in source.splitlines():
        if line.split(" = ")[0] in {"channels", "in_features", "length", "height", "width", "depth"}:
            name, value = line.split(" = ")
            assert task_key(source.replace(line, f"{name} = {int(value) + 1}")) != task_key(source), name
    widened = source.replace("def forward(self, x):", "def forward(self, x):\n        x = x * 2")
    assert task_key(widened) != task_key(source)


def test_within_set_filter_caps_graphs_and_refuses_a_task_already_admitted():
    from opsynth.config import WORKLOADS
    from opsynth.operator_catalog.codegen import render
    from opsynth.operator_catalog.compose import compose

    within = WithinSetFilter()
    relu = ["torch.relu"]
    task = render(compose(3, 4, WORKLOADS["tiny"], 64))
    assert within.admit("a", task_key(task.source), task.ops, 2) is None
    assert "the same task as a" in within.admit(
        "b", task_key(_rebatched(task.source)), ["nn.Linear", "torch.sigmoid"], 2
    )
    assert within.admit("c", task_key(fixtures.CONSTANT), relu, 2) is None
    assert within.admit("d", task_key(fixtures.VANISHING), relu, 2) is None
    assert "operator graph" in within.admit("e", task_key(fixtures.NAN), relu, 2)


def test_what_the_filter_keeps_per_row_is_two_numbers_where_key_and_name_are_digests():
    import hashlib

    from opsynth.filters.dedup import compact, spelled

    within = WithinSetFilter()
    key, row = hashlib.sha256(b"task").hexdigest(), hashlib.sha256(b"code").hexdigest()[:16]
    assert within.admit(row, key, ["torch.relu"], 5) is None
    assert within.tasks == {int(key[:16], 16): int(row, 16)}
    assert f"the same task as {row} (its batch extent aside)" == within.admit("other", key, ["torch.relu"], 5)
    assert spelled(compact(row)) == row and compact("a") == "a"
    assert compact("0x12345678901234567") == "0x12345678901234567"
    assert compact(key.upper()) == key.upper()  # a digest as written by hexdigest only


def test_selection_takes_the_quota_in_index_order_skipping_duplicates():
    from opsynth.pipeline.selection import select
    from opsynth.records import Candidate

    def cand(index, code, ops):
        return Candidate("torch#1", index, index, tuple(ops), code)

    from opsynth.config import WORKLOADS
    from opsynth.operator_catalog.codegen import render
    from opsynth.operator_catalog.compose import compose

    task = render(compose(5, 1, WORKLOADS["tiny"], 64)).source
    accepted = {"torch#1": [cand(4, fixtures.VANISHING, ["*"]), cand(1, task, ["nn.Linear"]),
                            cand(2, _rebatched(task), ["nn.Linear"]),
                            cand(3, fixtures.CONSTANT, ["torch.ones_like"])]}  # fmt: skip
    selected, skipped = select(accepted, {"torch#1": 2})
    assert [c.index for c in selected["torch#1"]] == [1, 3]
    assert [(r.candidate.index, r.reason, r.stage) for r in skipped] == [(2, "duplicate", "select")]


def test_the_graph_cap_grows_where_a_quota_needs_more_rows_than_there_are_operator_lists():
    import math

    from opsynth.operator_catalog.registry import sampleable
    from opsynth.pipeline.selection import rows_per_graph

    operators = len(sampleable("torch"))
    assert rows_per_graph("torch#1", 204) == math.ceil(3 * 204 / operators)  # 204 rows, ~316 single-op lists
    assert rows_per_graph("torch#1", 2040) * operators >= 3 * 2040  # ops60k: 2,040 rows, one single-op list each
    assert rows_per_graph("torch#2", 5026) == 1  # ordered pairs of operators are plenty: each list once
    assert rows_per_graph("torch#1", 20_400) == math.ceil(3 * 20_400 / operators)  # ops600k


def test_a_task_rescaled_is_the_same_task_where_a_second_input_shares_the_batch_extent():
    from opsynth.config import WORKLOADS
    from opsynth.operator_catalog.codegen import render
    from opsynth.operator_catalog.compose import compose

    # Seed 0 of two operators: `y = torch.randn(4, 64)` beside `x = torch.randn(batch_size, in_features)`, the
    # renderer writing the second input's shape out; the calibration's rescale doubles both.
    source, rescaled = (render(compose(0, 2, WORKLOADS["tiny"], 64, scale)).source for scale in (1.0, 2.0))
    assert "torch.randn(4, 64)" in source and "torch.randn(8, 64)" in rescaled
    assert task_key(rescaled) == task_key(source)
    # A second input's leading extent that is not the batch's stays part of the task.
    assert task_key(source.replace("torch.randn(4, 64)", "torch.randn(3, 64)")) != task_key(source)
