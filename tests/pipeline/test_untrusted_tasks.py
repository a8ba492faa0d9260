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

from tests import fixtures

HONEST = {"good": (fixtures.GOOD, "keep"), "stochastic": (fixtures.STOCHASTIC, "not_deterministic"),
          "constant": (fixtures.CONSTANT, "indistinguishable_outputs")}  # fmt: skip
TOKEN = "hf_opsynthTestToken0123456789"


def _running_under(folder: Path) -> list[int]:
    """Live processes working in `folder` or below it (the workers' scratch folders are made under TMPDIR)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").startswith(str(folder)) and _state(int(entry.name)) != "Z":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _environment(tmp_path: Path) -> dict:
    """Secrets to hide, and a TMPDIR of the test's own, under which the workers make their folders."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "HF_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": TOKEN, "TMPDIR": str(tmp_path / "tmp")}


def _validate(folder: Path, report: Path, cwd: Path, timeout_s: str = "8") -> subprocess.CompletedProcess:
    env = _environment(cwd)
    argv = [sys.executable, "-m", "pipeline", "validate", str(folder), "--device", "cpu", "--workers", "2",
            "--timeout-s", timeout_s, "--no-compile-check", "--runtime-window-ms", "0,1000",
            "--report", str(report)]  # fmt: skip
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process checks read /proc (Linux)")
def test_hostile_tasks_cost_only_their_own_verdicts(tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    found = tmp_path / "found.txt"
    # Hostile first, honest last: a worker a hostile task changed must never judge an honest one.
    cases = {**fixtures.HOSTILE, "secrets": (fixtures.secrets_probe(str(found)), "keep"), **HONEST}
    for i, (name, (source, _)) in enumerate(cases.items()):
        (tasks / f"{i:02d}_{name}.py").write_text(source)
    report = tmp_path / "report.jsonl"
    done = _validate(tasks, report, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = {json.loads(line)["task"][3:-3]: json.loads(line)["verdict"] for line in report.read_text().splitlines()}
    assert list(verdicts) == list(cases), "the report names every task, in order"
    for name, (_, expected) in cases.items():
        if expected == "not keep":
            assert verdicts[name] != "keep", name
        else:
            assert verdicts[name] == expected, (name, verdicts[name])
    for i, name in enumerate(cases):
        assert f"{i:02d}_{name}.py: {verdicts[name]}" in done.stdout
    assert TOKEN not in found.read_text(), "a secret reached task code"
    assert not (tmp_path / fixtures.SECRET_FILE).exists() and not (tasks / fixtures.SECRET_FILE).exists()
    assert not _running_under(tmp_path / "tmp"), "a worker, or a process a task started, outlived the run"


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
    process = subprocess.Popen(argv, env=_environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_running_under(tmp_path / "tmp")) < 2:  # a worker's two processes
        time.sleep(0.2)
    workers = _running_under(tmp_path / "tmp")
    assert workers, "no worker started"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _running_under(tmp_path / "tmp"):
        time.sleep(0.2)
    assert not _running_under(tmp_path / "tmp"), "workers outlived the run"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
