"""`opsynth bench faults`: fault injection. A tiny `generate` run is broken in one way per trial (SIGKILL at a
seeded random moment, a full disk at a random size, a damaged state file) and resumed with the same command: it
must end with the dataset of an uninterrupted run, and leave no process behind. Hostile tasks go through
`validate`: each must cost only its own verdict, and no secret may reach them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opsynth.bench.hostile_tasks import HONEST, HOSTILE, SECRET_FILE, secrets_probe

# A window no task can leave, so that timing noise cannot make two runs differ; small batches, many checkpoints.
RUN_ARGS = ["--num-samples", "12", "--seed", "5", "--device", "cpu", "--workload", "tiny", "--workers", "2",
            "--no-compile-check", "--runtime-window-ms", "0,10000", "--batch-size", "2"]  # fmt: skip
RUN_TIMEOUT_S = 900
SECRET = "hf_opsynthFaultSuiteToken0123456789"
LEFTOVER_WAIT_S = 60.0  # how long a killed run's workers get to notice and end


def running_under(folder: Path) -> list[int]:
    """Live processes working in `folder` or below it (Linux; workers make their folders under TMPDIR)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if os.readlink(entry / "cwd").startswith(str(folder)) and stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return pids


def environment(tmp: Path) -> dict:
    """Secrets for task code not to see, and TMPDIR `tmp`, under which the workers make their folders."""
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "HF_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}


def _opsynth(argv: list[str], tmp: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`opsynth ARGV` in a process of its own, in `environment(tmp)`."""
    return subprocess.run([sys.executable, "-m", "opsynth", *argv], env=environment(tmp), cwd=cwd,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip


def _settled(tmp: Path) -> int:
    """The processes still running under `tmp` once a run's workers had LEFTOVER_WAIT_S to end."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while running_under(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(running_under(tmp))


def dataset_rows(out: Path) -> list[tuple[str, str]]:
    """(id, code) of a finished folder's rows, in order."""
    import pyarrow.parquet as pq

    rows = []
    for shard in sorted((out / "data").glob("train-*.parquet")):
        table = pq.read_table(shard, columns=["id", "code"])
        rows += list(zip(table.column("id").to_pylist(), table.column("code").to_pylist(), strict=True))
    return rows


def unfinished_copy(reference: Path, dest: Path) -> Path:
    """A finished run as if killed during round 0's execution: its CPU stages done, its checkpoints written."""
    shutil.copytree(reference, dest)
    for path in [dest / "stats.json", dest / "README.md", *dest.glob("data/*"), *dest.glob("rejected/*")]:
        path.unlink()
    for round_dir in (dest / ".opsynth").glob("round-*"):
        if round_dir.name == "round-00000":
            for name in (
                "_SUCCESS",
                "accepted-*",
                "rejected-execute-*",
                "stage_work_s.json",
                "checkpointed.json",
                "selected.jsonl",
            ):
                for path in round_dir.glob(name):
                    path.unlink()
        else:
            shutil.rmtree(round_dir)
    return dest


def reference_run(root: Path) -> tuple[Path, float]:
    """The uninterrupted run every trial must end with, and its wall time."""
    out = root / "reference"
    started = time.monotonic()
    done = _opsynth(["generate", "--out", str(out), *RUN_ARGS], root / "tmp-reference")
    if done.returncode != 0:
        raise RuntimeError(f"the reference run failed: {done.stderr.strip()[-500:]}")
    return out, time.monotonic() - started


def _resumed(out: Path, tmp: Path, reference: Path) -> dict:
    done = _opsynth(["generate", "--out", str(out), *RUN_ARGS], tmp)
    return {
        "resume_exit": done.returncode,
        "identical": done.returncode == 0 and dataset_rows(out) == dataset_rows(reference),
        "resume_error": done.stderr.strip().splitlines()[-1] if done.returncode else "",
    }


def kill_trials(n: int, seed: int, root: Path, reference: Path, wall_s: float) -> list[dict]:
    """SIGKILL the run's own process (its workers must notice and end) at `n` seeded moments of its wall time."""
    trials = []
    for k in range(n):
        moment = random.Random(seed * 1000 + k).uniform(0.0, wall_s)
        out, tmp = root / f"kill-{k}", root / f"tmp-kill-{k}"
        argv = [sys.executable, "-m", "opsynth", "generate", "--out", str(out), *RUN_ARGS]
        process = subprocess.Popen(argv, env=environment(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(moment)
        killed = process.poll() is None
        if killed:
            process.kill()
        process.wait()
        trial = {"kind": "kill", "at_s": round(moment, 2), "killed": killed, "leftover_processes": _settled(tmp)}
        trials.append(trial | _resumed(out, tmp, reference))
    return trials


def can_mount_tmpfs() -> bool:
    """Whether a user and mount namespace with a tmpfs can be made here (util-linux's unshare)."""
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && umount $d && rmdir $d"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", probe],
                          capture_output=True, timeout=60)  # fmt: skip
    return done.returncode == 0


def disk_trials(n: int, seed: int, root: Path, reference: Path) -> list[dict]:
    """The run on a file system of a seeded random size (a tmpfs in a namespace of its own), so that the disk
    fills at a different moment each time; then resumed on a large enough one."""
    need = sum(p.stat().st_size for p in reference.rglob("*") if p.is_file())
    trials = []
    for k in range(n):
        size_kib = max(16, int(random.Random(seed * 1000 + 500 + k).uniform(0.02, 1.0) * need / 1024))
        disk, tmp, kept = root / f"disk-{k}", root / f"tmp-disk-{k}", root / f"disk-{k}-out"
        disk.mkdir()
        run = " ".join([sys.executable, "-m", "opsynth", "generate", "--out", f"{disk}/run", *RUN_ARGS])
        script = (
            f"mount -t tmpfs -o size={size_kib}k tmpfs {disk} && "
            f"{{ {run} >/dev/null 2>{tmp}.first; echo $? > {tmp}.first-exit; }}; "
            f"mount -o remount,size=1g {disk} && cp -a {disk}/run {kept}"
        )
        subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                       env=environment(tmp), timeout=RUN_TIMEOUT_S)  # fmt: skip
        first = int(Path(f"{tmp}.first-exit").read_text())
        errors = Path(f"{tmp}.first").read_text().strip().splitlines()
        trial = {"kind": "full_disk", "size_kib": size_kib, "first_exit": first,
                 "first_error": errors[-1] if first else "", "leftover_processes": _settled(tmp)}  # fmt: skip
        trials.append(trial | _resumed(kept, tmp, reference))
    return trials


def _damage(path: Path, rng: random.Random) -> str:
    data = path.read_bytes()
    if data and rng.random() < 0.5:
        path.write_bytes(data[: rng.randrange(len(data))])
        return "truncated"
    at = rng.randrange(max(1, len(data)))
    path.write_bytes(data[:at] + bytes(rng.randrange(256) for _ in range(8)) + data[at + 8 :])
    return "garbled"


def state_trials(n: int, seed: int, root: Path, reference: Path) -> list[dict]:
    """A state file of an interrupted run, chosen and damaged at random (truncated, or bytes overwritten): the
    run resumes to the same dataset; a damaged config.json is refused in one line that names it."""
    trials = []
    for k in range(n):
        rng = random.Random(seed * 1000 + 900 + k)
        out = unfinished_copy(reference, root / f"state-{k}")
        files = sorted(p for p in (out / ".opsynth").rglob("*") if p.is_file() and p.name != "lock")
        victim = rng.choice(files)
        how = _damage(victim, rng)
        trial = {"kind": "damaged_state", "file": str(victim.relative_to(out)), "how": how}
        result = _resumed(out, root / f"tmp-state-{k}", reference)
        if victim.name == "config.json" and result["resume_exit"] == 2:
            result["identical"] = "config.json is damaged" in result["resume_error"]  # refused, as it must be
        trials.append(trial | result)
    return trials


def hostile_validate(root: Path, timeout_s: float = 8.0, device: str = "cpu") -> dict:
    """Every hostile task, then the honest ones, through one `validate` on `device`: the verdicts, what each
    should be, and what escaped (a secret found, a file left in the working folder, a process left running)."""
    tasks, found, tmp = root / "hostile", root / "secret-found.txt", root / "tmp-hostile"
    tasks.mkdir(parents=True)
    cases = {**HOSTILE, "secrets": (secrets_probe(str(found)), "keep"), **HONEST}
    names = [f"{i:02d}_{name}.py" for i, name in enumerate(cases)]
    for file, (source, _) in zip(names, cases.values(), strict=True):
        (tasks / file).write_text(source)
    report = root / "hostile.jsonl"
    argv = ["validate", str(tasks), "--device", device, "--workers", "2", "--timeout-s", f"{timeout_s:g}",
            "--no-compile-check", "--runtime-window-ms", "0,1000", "--report", str(report),
            "--exit-zero"]  # fmt: skip
    done = _opsynth(argv, tmp, cwd=root)
    lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    verdicts = {line["task"]: line["verdict"] for line in lines}
    return {
        "exit": done.returncode,
        "stdout": done.stdout,
        "tasks": names,
        "verdicts": [verdicts.get(name) for name in names],
        "expected": [expected for _, expected in cases.values()],
        "secret_reached_task": found.exists() and SECRET in found.read_text(),
        "files_left_in_working_folder": (root / SECRET_FILE).exists() or (tasks / SECRET_FILE).exists(),
        "leftover_processes": _settled(tmp),
    }


def verdicts_hold(result: dict) -> bool:
    """Every hostile task got the verdict it must (`not keep`: any but keep), every honest one its own."""
    return all(
        got != "keep" if want == "not keep" else got == want
        for got, want in zip(result["verdicts"], result["expected"], strict=True)
    )


def run_faults(n: int, seed: int = 0, root: Path | None = None) -> dict:
    """`n` kill trials, `n` damaged-state trials, n // 4 full-disk trials (where a tmpfs can be mounted), and the
    hostile tasks through validate; a summary of each."""
    root = root or Path(tempfile.mkdtemp(prefix="opsynth-faults-"))
    started = time.monotonic()
    reference, wall_s = reference_run(root)
    trials = kill_trials(n, seed, root, reference, wall_s) + state_trials(n, seed, root, reference)
    disk = can_mount_tmpfs()
    if disk:
        trials += disk_trials(max(1, n // 4), seed, root, reference)
    hostile = hostile_validate(root)
    summary = {}
    for kind in sorted({t["kind"] for t in trials}):
        mine = [t for t in trials if t["kind"] == kind]
        summary[kind] = {"trials": len(mine), "identical": sum(t["identical"] for t in mine),
                         "leftover_processes": sum(t.get("leftover_processes", 0) for t in mine)}  # fmt: skip
    hostile_summary = {k: v for k, v in hostile.items() if k != "stdout"} | {"verdicts_hold": verdicts_hold(hostile)}
    return {
        "stage": "faults (kills, damaged state, full disk, hostile tasks through validate)",
        "reference_wall_s": round(wall_s, 1),
        "full_disk": "tmpfs in a user and mount namespace" if disk else "not run: no tmpfs can be mounted here",
        "summary": summary,
        "hostile": hostile_summary,
        "trials": trials,
        "wall_s": round(time.monotonic() - started, 1),
    }
