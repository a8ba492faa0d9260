"""The local runner in multi-processing mode: its SDK worker processes run every stage, each process with worker
pools of its own, and the dataset is the one the pipelines make in this process. Apart from the portable runner's
test (test_runners.py) so that two test processes run them side by side; one round, as each of its pipelines
starts processes that import torch."""

from datasets import load_dataset

from opsynth.commands.cli import main

# One execution worker: which worker runs a task changes no verdict.
ONE_WORKER = ["--device", "cpu", "--workload", "tiny", "--workers", "1"]


def test_multi_processing_makes_the_in_process_dataset(tmp_path, capsys):
    argv = ["--num-samples", "10", "--seed", "11", *ONE_WORKER, "--no-compile-check", "--runtime-window-ms", "0,10000"]
    assert main(["generate", "--out", str(tmp_path / "here"), *argv, "--quiet"]) == 0
    multi = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]
    assert main(["generate", "--out", str(tmp_path / "multi"), *argv, *multi, "--quiet"]) == 0
    shown = capsys.readouterr()
    assert shown.out.count("wrote 10 rows to ") == 2 and shown.out.count("\n") == 2 and not shown.err
    here, multi = (load_dataset(str(tmp_path / d), split="train")["id"] for d in ("here", "multi"))
    assert here == multi and len(here) == 10
