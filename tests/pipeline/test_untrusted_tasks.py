"""Task code is untrusted: `opsynth validate` over hostile and broken tasks ends with a complete report, each
hostile task costing only its own verdict, every honest task validated after them keeping its own, no secret
reaching task code, and nothing a task started left running."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.faults import environment, hostile_validate, opsynth, running_under, verdicts_hold
from tests import fixtures

HONEST = fixtures.HONEST


def _validate(folder: Path, report: Path, cwd: Path) -> subprocess.CompletedProcess:
    argv = ["validate", str(folder), "--device", "cpu", "--workers", "2", "--timeout-s", "8", "--no-compile-check",
            "--runtime-window-ms", "0,1000", "--report", str(report)]  # fmt: skip
    return opsynth(argv, cwd / "tmp", cwd=cwd)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_hostile_tasks_cost_only_their_own_verdicts(tmp_path):
    # Hostile first, honest last: a worker a hostile task changed must never judge an honest one.
    result = hostile_validate(tmp_path)
    assert result["exit"] == 0
    assert [v is not None for v in result["verdicts"]] == [True] * len(result["tasks"]), "the report is complete"
    assert verdicts_hold(result), list(zip(result["tasks"], result["verdicts"], strict=True))
    for name, verdict in zip(result["tasks"], result["verdicts"], strict=True):
        assert f"{name}: {verdict}" in result["stdout"]
    assert not result["secret_reached_task"] and not result["files_left_in_working_folder"]
    assert result["leftover_processes"] == 0, "a worker, or a process a task started, outlived the run"


def test_a_checker_patching_task_changes_no_honest_verdict(tmp_path):
    """The honest tasks alone, then behind tasks that patch what the checker calls: the same verdicts."""
    alone, behind = tmp_path / "alone", tmp_path / "behind"
    alone.mkdir()
    behind.mkdir()
    patchers = {n: fixtures.HOSTILE[n][0] for n in ("patches_allclose", "patches_module_call", "sets_default_dtype")}
    for i, (name, source) in enumerate({**patchers, **{n: s for n, (s, _) in HONEST.items()}}.items()):
        (behind / f"{i:02d}_{name}.py").write_text(source)
        if name in HONEST:
            (alone / f"{i:02d}_{name}.py").write_text(source)
    verdicts = {}
    for folder in (alone, behind):
        report = tmp_path / f"{folder.name}.jsonl"
        assert _validate(folder, report, cwd=tmp_path).returncode == 0
        lines = [json.loads(line) for line in report.read_text().splitlines()]
        verdicts[folder.name] = {d["task"][3:-3]: d["verdict"] for d in lines}
    assert {n: verdicts["behind"][n] for n in HONEST} == verdicts["alone"] == {n: v for n, (_, v) in HONEST.items()}
    assert all(verdicts["behind"][n] == "tampering" for n in patchers)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_workers_die_with_a_killed_run(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hang.py").write_text(fixtures.HANG)
    argv = [sys.executable, "-m", "pipeline", "validate", str(tasks), "--device", "cpu", "--workers", "1",
            "--timeout-s", "600", "--no-compile-check"]  # fmt: skip
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(argv, env=environment(tmp_path / "tmp"), **quiet)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(running_under(tmp_path / "tmp")) < 2:  # a worker's two processes
        time.sleep(0.2)
    workers = running_under(tmp_path / "tmp")
    assert workers, "no worker started"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and running_under(tmp_path / "tmp"):
        time.sleep(0.2)
    assert not running_under(tmp_path / "tmp"), "workers outlived the run"
    assert not list((tmp_path / "tmp").glob("opsynth-workers-*")), "the workers' folders outlived the run"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
