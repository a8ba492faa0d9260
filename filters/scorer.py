"""Scoring one solution against one task: the task's side and then the solution's run in contained processes of
their own (filters.scoring_process), and this process, which runs neither's code, compares their outputs and gives
the reward (filters.scoring.reward; what the solution can and cannot reach: docs/commands.md, "Scoring")."""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

from opsynth.errors import OpsynthError
from opsynth.filters.containment import python_path, task_environment
from opsynth.filters.scoring_process import CASE_FILE, JOB_FILE, OUT_FILE, REFERENCE, RESULT_FILE, SOLUTION

TIMEOUT_S = 600.0  # each side, a solution's build included


class TaskFailed(OpsynthError):
    """The task itself could not be run: no solution can be scored against it."""


@dataclass(frozen=True)
class Score:
    reward: int  # -1, 1, 2 or 3
    reason: str
    solution_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    baseline: str  # "recorded" (the row's times) or "measured" (now, beside the solution)

    def to_json(self) -> dict:
        return asdict(self)


def _side(folder: str, job: dict, timeout_s: float, gpu: int | None) -> tuple[dict | None, str]:
    """Run one side in `folder` (on GPU `gpu` where given): (its result.json, or None, and why none)."""
    with open(os.path.join(folder, JOB_FILE), "w") as f:
        json.dump(job, f)
    env = task_environment(os.environ, folder, python_path())
    if gpu is not None:  # the gpu-th of those this process sees
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu].strip() if visible else str(gpu)
    log = open(os.path.join(folder, "stderr.txt"), "wb")  # noqa: SIM115 - closed below, after the process
    process = subprocess.Popen(
        [sys.executable, "-m", "opsynth.filters.scoring_process", folder],
        env=env,
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None, f"gave no result within {timeout_s:g} s"
    finally:
        log.close()
    try:
        with open(os.path.join(folder, RESULT_FILE)) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = None
    if isinstance(result, dict):
        return result, ""
    if code < 0:
        return None, f"crashed ({signal.Signals(-code).name})" if -code in signal.valid_signals() else "crashed"
    return None, f"exited with code {code}, giving no result"


def _tail(folder: str, size: int = 1500) -> str:
    """The end of what a side's process printed."""
    try:
        with open(os.path.join(folder, "stderr.txt"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _load_tensors(path: str):
    import torch

    return torch.load(path, weights_only=True)


def _draw_mismatch(want: list, have, label: str) -> str | None:
    """Why the solution's outputs of one input draw (`have`, as read from its file) are not the task's (`want`)."""
    import torch

    from opsynth.filters.comparison import outputs_close
    from opsynth.filters.scoring import ATOL, RTOL

    if not isinstance(have, list) or not all(isinstance(t, torch.Tensor) for t in have):
        return f"{label}: its forward returned no tensors"
    if len(have) != len(want):
        return f"{label}: {len(have)} output tensors, the task's {len(want)}"
    shapes = [tuple(t.shape) for t in have], [tuple(t.shape) for t in want]
    if shapes[0] != shapes[1]:
        return f"{label}: output shapes {shapes[0]}, the task's {shapes[1]}"
    if not outputs_close(want, have, ATOL, RTOL):
        return f"{label}: outputs differ from the task's beyond atol = rtol = {ATOL:g}"
    return None


def _compare(expected: list, got) -> str | None:
    """Why the solution's outputs (one list per draw, then the one after its timed forwards, see
    scoring.solution_run) are not the task's, or None where they agree."""
    if not isinstance(got, list) or len(got) != len(expected) + 1:
        return "its outputs are not one list per input draw"
    for k, (want, have) in enumerate(zip(expected, got[:-1], strict=True)):
        mismatch = _draw_mismatch(want, have, f"draw {k + 1}")
        if mismatch is not None:
            return mismatch
    if _draw_mismatch(expected[1], got[-1], "") is not None:
        return "after its timed forwards its output did not follow its inputs' new values (outputs kept by storage)"
    return None


def score(task: str, solution: str, solution_path: str, extension_dir: str | None, device: str,
          recorded: tuple[float | None, float | None] | None = None, timeout_s: float = TIMEOUT_S,
          gpu: int | None = None) -> Score:  # fmt: skip
    """The reward of `solution` (the source of a file defining ModelNew, at `solution_path`, with the .cu/.cpp
    sources of `extension_dir` built beside it) against the task program `task`, on `device` (GPU `gpu` of
    several). The baselines are `recorded` (eager, compiled ms) where given, else measured now on the task's
    side."""
    from opsynth.filters.scoring import reward

    root = tempfile.mkdtemp(prefix="opsynth-score-")
    baseline = "recorded" if recorded is not None else "measured"
    try:
        ref_dir, sol_dir = os.path.join(root, REFERENCE), os.path.join(root, SOLUTION)
        os.mkdir(ref_dir, 0o700)
        os.mkdir(sol_dir, 0o700)
        job = {"role": REFERENCE, "task": task, "device": device, "measure": recorded is None,
               "seed": secrets.randbelow(2**31)}  # fmt: skip
        result, why = _side(ref_dir, job, timeout_s, gpu)
        if result is None or not result.get("ok"):
            raise TaskFailed(f"the task does not run: {why or result.get('error')}")
        expected = _load_tensors(os.path.join(ref_dir, OUT_FILE))
        eager_ms, compile_ms = recorded if recorded is not None else (result.get("eager_ms"), result.get("compile_ms"))
        os.replace(os.path.join(ref_dir, CASE_FILE), os.path.join(sol_dir, CASE_FILE))
        shutil.rmtree(ref_dir)  # the task's outputs are in this process only from here on

        def failed(reason: str) -> Score:
            return Score(-1, reason, None, eager_ms, compile_ms, baseline)

        job = {"role": SOLUTION, "solution": solution, "solution_path": solution_path, "device": device,
               "extension_dir": os.path.abspath(extension_dir) if extension_dir else None}  # fmt: skip
        result, why = _side(sol_dir, job, timeout_s, gpu)
        if result is None:
            return failed(f"the solution {why}")
        if not result.get("ok"):
            if result.get("stage") == "build":  # with the compiler's own words, from the side's output
                error, printed = str(result.get("error"))[-1000:], _tail(sol_dir)
                return failed(f"its sources do not build: {error}" + ("" if printed in error else f" {printed}"))
            return failed(f"it raises: {str(result.get('error'))[-1500:]}")
        try:
            got = _load_tensors(os.path.join(sol_dir, OUT_FILE))
        except Exception as e:
            return failed(f"its outputs cannot be read as tensors ({type(e).__name__})")
        mismatch = _compare(expected, got)
        if mismatch is not None:
            return failed(f"incorrect: {mismatch}")
        solution_ms = result.get("solution_ms")
        if not isinstance(solution_ms, int | float) or not solution_ms > 0:
            return failed("its time could not be measured")
        points, reason = reward(float(solution_ms), eager_ms, compile_ms)
        return Score(points, reason, float(solution_ms), eager_ms, compile_ms, baseline)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def summary(scores: list[Score]) -> dict:
    """The paper's metrics over a set's scores: the shares of solutions that are correct, faster than eager and
    faster than torch.compile, and the geometric mean of the speed-up over eager of the correct ones."""
    n = len(scores)
    correct = [s for s in scores if s.reward > 0]
    speedups = [s.eager_ms / s.solution_ms for s in correct if s.eager_ms and s.solution_ms]
    geomean = math.exp(sum(math.log(x) for x in speedups) / len(speedups)) if speedups else None
    return {
        "tasks": n,
        "pass_rate": len(correct) / n if n else 0.0,
        "faster_than_eager_rate": sum(s.reward >= 2 for s in scores) / n if n else 0.0,
        "faster_than_compile_rate": sum(s.reward == 3 for s in scores) / n if n else 0.0,
        "geomean_speedup_over_eager": geomean,
    }
