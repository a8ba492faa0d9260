"""`opsynth bench` runs each stage and reports rates; no timing is asserted (machines are noisy)."""

import json

import pytest

from opsynth.commands.cli import main

EXECUTE = ["execute", "--device", "cpu", "--n", "4", "--workers", "2", "--no-compile-check"]


@pytest.mark.parametrize("argv", [["cpu", "--n", "6"], ["decontam", "--n", "6"], EXECUTE])
def test_bench_reports_a_rate(tmp_path, capsys, argv):
    out = tmp_path / "bench.json"
    assert main(["bench", *argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["candidates"] == int(argv[argv.index("--n") + 1])
    rate = result.get("candidates_per_s_per_core") or result.get("candidates_per_s")
    assert rate > 0
    if argv[0] == "cpu":  # as many other candidates checked first, untimed
        assert result["warmup_candidates"] == 6 and result["warmup_s"] > 0
    if argv[0] == "decontam":
        assert result["brute_force_mismatches"] == 0
    if argv[0] == "execute":
        assert sum(result["verdicts"].values()) == 4


def test_bench_selection_reports_what_the_selection_keeps_per_row(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "selection", "--n", "5000", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["candidates"] == 5000 and 0 < result["rows"] <= 5000
    assert 0 < result["bytes_per_row"] < 1000 and result["state_mib"] > 0
