"""One side of a score (filters.scoring), run contained: `python -m opsynth.filters.scoring_process FOLDER`, FOLDER
holding `job.json` and, for the solution's side, `case.pt`; it writes `out.pt` (tensors only) and `result.json`,
which the scorer reads as data (docs/commands.md, "Scoring")."""

from __future__ import annotations

import json
import os
import sys
import traceback

from opsynth.filters.containment import Limits, apply_limits, die_with_parent, enter_namespaces, mount_own_proc

JOB_FILE, CASE_FILE, OUT_FILE, RESULT_FILE = "job.json", "case.pt", "out.pt", "result.json"
REFERENCE, SOLUTION = "reference", "solution"


def _write_result(folder: str, result: dict) -> None:
    with open(os.path.join(folder, RESULT_FILE), "w") as f:
        json.dump(result, f)


def _run(folder: str, job: dict) -> None:
    import torch

    from opsynth.filters import scoring

    if job["role"] == REFERENCE:
        try:
            case, kept = scoring.reference_case(job["task"], job["seed"], job["device"], job["measure"])
        except BaseException as e:  # the task's own failure, told to the scorer
            _write_result(folder, {"ok": False, "stage": "task", "error": f"{type(e).__name__}: {e}"[-2000:]})
            return
        torch.save(case, os.path.join(folder, CASE_FILE))
        torch.save(kept.pop("outputs"), os.path.join(folder, OUT_FILE))
        _write_result(folder, {"ok": True, **kept})
        return
    stage = "build"
    try:
        if job.get("extension_dir"):
            scoring.build_extension(job["extension_dir"], os.path.join(folder, "build"), job["solution"])
        stage = "run"
        case = torch.load(os.path.join(folder, CASE_FILE), weights_only=True)
        outputs, solution_ms = scoring.solution_run(job["solution"], job["solution_path"], case, job["device"])
    except BaseException as e:  # its exit() included: whatever the solution raises is its failure
        detail = f"{type(e).__name__}: {e}".strip()
        _write_result(folder, {"ok": False, "stage": stage, "error": detail[-2000:]})
        return
    torch.save(outputs, os.path.join(folder, OUT_FILE))
    _write_result(folder, {"ok": True, "solution_ms": solution_ms})


def main(folder: str) -> int:
    with open(os.path.join(folder, JOB_FILE)) as f:
        job = json.load(f)
    apply_limits(Limits(file_size_bytes=16 << 30))  # the case and outputs of a large task are files too
    namespaces = enter_namespaces()
    child = os.fork()
    if child == 0:
        die_with_parent()
        if "pid" in namespaces:
            mount_own_proc()
        status = 0
        try:
            _run(folder, job)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        os.kill(os.getpid(), os.WTERMSIG(status))  # end as the child ended, so the scorer can tell the signal
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    from opsynth.filters.scoring_process import main as run_side  # one copy of this module, under its own name

    sys.exit(run_side(sys.argv[1]))
