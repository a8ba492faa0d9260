from opsynth.filters.shape_check import check_shapes
from opsynth.reasons import KEEP, LOAD_ERROR, SHAPE_ERROR
from tests import fixtures


def test_good_task_passes_with_its_output_shape():
    verdict = check_shapes(fixtures.GOOD)
    assert verdict.reason == KEEP
    assert verdict.measurements["output_shapes"] == [[8, 16]]


def test_mismatch_is_a_shape_error_naming_the_line():
    verdict = check_shapes(fixtures.SHAPE_MISMATCH)
    assert verdict.reason == SHAPE_ERROR
    assert "self.linear(x)" in verdict.detail


def test_unparseable_and_incomplete_programs_are_load_errors():
    assert check_shapes(fixtures.UNLOADABLE).reason == LOAD_ERROR
    verdict = check_shapes(fixtures.NO_GET_INPUTS)
    assert verdict.reason == LOAD_ERROR
    assert "get_inputs" in verdict.detail


def test_data_dependent_ops_are_left_to_execution():
    verdict = check_shapes(fixtures.task("return torch.masked_select(x, x > 0)"))
    assert verdict.reason == KEEP
    assert "inconclusive" in verdict.detail


def test_no_memory_is_allocated_for_huge_shapes():
    huge = fixtures.GOOD.replace("torch.randn(8, 32)", "torch.randn(1 << 20, 1 << 10, 32)")
    assert check_shapes(huge.replace("nn.Linear(32, 16)", "nn.Linear(32, 16)")).reason == KEEP
