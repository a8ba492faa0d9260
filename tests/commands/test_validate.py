"""Task code is untrusted: `opsynth validate` over hostile and broken tasks ends with a complete report, each
hostile task costing only its own verdict, every honest task validated after them keeping its own, no secret
reaching task code, and nothing a task started left running."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsynth.bench.faults import environment, hostile_validate, running_under, verdicts_hold
from tests import fixtures


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_hostile_tasks_cost_only_their_own_verdicts(tmp_path):
    """Hostile first, checker-patching ones among them, honest last: each honest task keeps the verdict it gets
    alone (tests/filters/test_execution.py), since a worker a task changed never judges another."""
    result = hostile_validate(tmp_path, timeout_s=5.0)
    assert result["exit"] == 0
    assert [v is not None for v in result["verdicts"]] == [True] * len(result["tasks"]), "the report is complete"
    assert verdicts_hold(result), list(zip(result["tasks"], result["verdicts"], strict=True))
    for name, verdict in zip(result["tasks"], result["verdicts"], strict=True):
        assert f"{name}: {verdict}" in result["stdout"]
    assert not result["secret_reached_task"] and not result["files_left_in_working_folder"]
    assert result["leftover_processes"] == 0, "a worker, or a process a task started, outlived the run"


def _validating_a_hanging_task(tmp_path: Path, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """`validate` of a task that hangs, in a process of its own, once its worker is up (its two processes)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hang.py").write_text(fixtures.HANG)
    argv = [sys.executable, "-m", "opsynth", "validate", str(tasks), "--device", "cpu", "--workers", "1",
            "--timeout-s", "600", "--no-compile-check"]  # fmt: skip
    process = subprocess.Popen(argv, env=environment(tmp_path / "tmp"), stdout=subprocess.DEVNULL, stderr=stderr,
                               text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(running_under(tmp_path / "tmp")) < 2:
        time.sleep(0.2)
    assert running_under(tmp_path / "tmp"), "no worker started"
    return process


def _workers_gone(tmp_path: Path) -> bool:
    """Whether the run's workers are gone, within two minutes."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and running_under(tmp_path / "tmp"):
        time.sleep(0.2)
    return not running_under(tmp_path / "tmp")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_sigterm_stops_a_run_in_one_line_and_its_workers_with_it(tmp_path):
    """`timeout` or a scheduler stops the command with SIGTERM: it ends as after Ctrl-C (143, the line that says how
    to resume, last), and no worker outlives it."""
    process = _validating_a_hanging_task(tmp_path, stderr=subprocess.PIPE)
    process.terminate()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143
    assert stderr.strip().splitlines()[-1] == "opsynth: interrupted; run the same command again to resume"
    assert _workers_gone(tmp_path), "workers outlived the run"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_workers_die_with_a_killed_run(tmp_path):
    process = _validating_a_hanging_task(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _workers_gone(tmp_path), "workers outlived the run"
    assert not list((tmp_path / "tmp").glob("opsynth-workers-*")), "the workers' folders outlived the run"
