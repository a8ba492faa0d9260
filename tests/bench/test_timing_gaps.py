"""The timing-gap benchmark needs a GPU (its measure runs on one by hand): without one it says so and exits 2."""

import pytest
import torch

from opsynth.bench.timing_gaps import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="measures where a GPU is")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--reps", "1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "opsynth: timing_gaps needs a CUDA device\n"
