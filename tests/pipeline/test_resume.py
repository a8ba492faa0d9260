"""A run killed with SIGKILL mid-way, then resumed with the same command, ends with the dataset of an
uninterrupted run, reusing the execution checkpoints it had written."""

import json
import os
import signal
import subprocess
import sys
import time

from datasets import load_dataset

from opsynth.bench.faults import environment, running_under
from opsynth.commands.cli import main
from tests import fixtures

# A window no task can leave, so that timing noise cannot make the two runs differ.
ARGS = ["--num-samples", "24", "--seed", "5", *fixtures.TINY_RUN, "--no-compile-check", "--runtime-window-ms",
        "0,10000", "--batch-size", "2"]  # fmt: skip


def test_sigkill_then_resume_gives_the_uninterrupted_dataset(tmp_path, capsys):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert main(["generate", "--out", str(reference), *ARGS]) == 0

    process = subprocess.Popen(
        [sys.executable, "-m", "opsynth", "generate", "--out", str(killed), *ARGS],
        env=environment(tmp_path / "tmp"),  # its workers make their folders there
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    progress = killed / ".opsynth" / "progress"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        if progress.exists() and len(list(progress.glob("round-*/batch-*.jsonl"))) >= 3:
            break
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # the run's own process group: its workers are sessions of their own
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    deadline = time.monotonic() + 60
    while running_under(tmp_path / "tmp") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running_under(tmp_path / "tmp"), "workers outlived the killed run"
    assert not (killed / "stats.json").exists()
    checkpoints = len(list(progress.glob("round-*/batch-*.jsonl")))
    # Killed during the execution of round 0: its CPU stages are done and are not redone.
    round0 = killed / ".opsynth" / "round-00000"
    (prepared,) = round0.glob("prepared-*.jsonl")
    prepared_at = prepared.stat().st_mtime_ns
    capsys.readouterr()

    assert main(["generate", "--out", str(killed), *ARGS]) == 0
    assert "round 0: its CPU stages were done; resuming at its execution" in capsys.readouterr().err
    assert prepared.stat().st_mtime_ns == prepared_at
    assert load_dataset(str(killed), split="train")["id"] == load_dataset(str(reference), split="train")["id"]
    assert load_dataset(str(killed), split="train")["code"] == load_dataset(str(reference), split="train")["code"]
    assert checkpoints >= 3
    keys = [
        json.loads(line)["key"] for f in progress.glob("round-*/batch-*.jsonl") for line in f.read_text().splitlines()
    ]
    assert len(keys) == len(set(keys)), "a checkpointed candidate was executed again"
    stats = json.loads((killed / "stats.json").read_text())
    reference_stats = json.loads((reference / "stats.json").read_text())
    # The same candidates, verdicts and rows; the executions are the work done, which past a round's fill point
    # depends on what had started (see pipeline.selection.FillPoint).
    work = ("executions", "executions_per_row")
    assert {k: v for k, v in stats["counts"].items() if k not in work} == {
        k: v for k, v in reference_stats["counts"].items() if k not in work
    }
    # The phases of every verdict, the killed run's included, as if it had run once.
    every = stats["timings_s"]["checkpointed_worker_phases"]
    assert every["verdicts"] == reference_stats["funnel"]["execute"]["in"] == len(keys)
    # The run's wall time is both processes': the killed one's (recorded at its start) and the resumed one's.
    sessions = stats["timings_s"]["sessions"]
    assert sorted(s["finished"] for s in sessions) == [False, True]
    assert stats["timings_s"]["sessions_total"] == round(sum(s["wall_s"] for s in sessions), 1)
    assert [s["finished"] for s in reference_stats["timings_s"]["sessions"]] == [True]
