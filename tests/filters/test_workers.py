"""The worker pool's care of its workers: replaced when they break the protocol, retired after many tasks, and
contained (what the first worker reports of its containment)."""

import logging

import pytest

from opsynth.filters.containment import Limits, host_memory_share
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.workers import Job, WorkerPool
from opsynth.reasons import CRASH, KEEP
from tests import fixtures

CPU = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1000.0), timeout_s=20.0, compile_check=False, workers=1)
# A task that writes a message of its own on every socket it can find: the worker's line to the pool among them.
JUNK_ON_SOCKETS = fixtures.task(
    "import os, stat\n"
    "for fd in map(int, os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
    "            os.write(fd, b'\\xff\\xff\\xff\\x7f' + b'junk' * 8)\n"
    "    except OSError:\n"
    "        pass\n"
    "return x * 2"
)


def test_a_worker_that_breaks_the_protocol_costs_its_task_only():
    with WorkerPool(CPU) as pool:
        junk, good = pool.run([Job("junk", JUNK_ON_SOCKETS, 1), Job("good", fixtures.GOOD, 1)])
        assert (junk.reason, junk.detail) == (CRASH, "the worker sent an unreadable message")
        assert good.reason == KEEP and pool.replaced == 1


# A task that prints, to both of its process's outputs and through Python, a control sequence among its text.
LOUD = fixtures.task(
    "import os\nos.write(1, b'LOUD out \\x1b[2J\\n')\nos.write(2, b'LOUD err\\n')\nprint('LOUD print')\nreturn x * 2"
)


def test_what_tasks_print_stays_off_the_users_terminal(capfd):
    with WorkerPool(CPU) as pool:
        (verdict,) = pool.run([Job("loud", LOUD, 1)])
    assert verdict.reason == KEEP
    out, err = capfd.readouterr()
    assert "LOUD" not in out + err


# A task that prints 1.5 MiB once, as its module is executed: under a 2 MiB file size limit, not under two of it.
CHATTY = fixtures.at_import("import os\nos.write(1, b'x' * (3 << 19))")
ONE_LINE = fixtures.task("print('one line', flush=True)\nreturn x * 2")


def test_what_a_task_printed_never_fails_the_next_tasks_prints():
    limits = Limits(file_size_bytes=2 << 20, address_space_bytes=host_memory_share(1))
    with WorkerPool(CPU, limits) as pool:
        verdicts = pool.run([Job("chatty", CHATTY, 1), Job("again", CHATTY, 1), Job("one line", ONE_LINE, 1)])
        assert [v.reason for v in verdicts] == [KEEP] * 3 and pool.replaced == 0


def test_a_worker_that_fails_to_start_says_what_it_printed(monkeypatch):
    """A setting that torch refuses as it is imported (the driver imported it before): each worker exits with
    torch's traceback, and the pool's error ends with its last exception."""
    monkeypatch.setenv("TORCH_LOGS", "not_a_log_setting")
    refused = r"failed to start \(worker exited with code 1; it printed: ValueError: "
    with pytest.raises(RuntimeError, match=refused), WorkerPool(CPU) as pool:
        pool.wait_ready()


def test_workers_retire_after_many_tasks(monkeypatch):
    import opsynth.filters.workers

    monkeypatch.setattr(opsynth.filters.workers, "RECYCLE_JOBS", 2)
    with WorkerPool(CPU) as pool:
        verdicts = pool.run([Job(str(i), fixtures.GOOD, i) for i in range(5)])
        assert all(v.kept for v in verdicts) and pool.replaced == 2
        # What the run's stats read of the pool: when its workers were up, its first execution began and its
        # last ended. The workers said when they were up, before the pool looked.
        assert pool.ready_at <= pool.first_handed < pool.last_done


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="Linux only")
def test_a_retired_pool_s_workers_exit_by_themselves_before_it_is_closed():
    import time
    from pathlib import Path

    def exited(pid: int) -> bool:  # gone, or a zombie its parent has not waited for yet
        stat = Path(f"/proc/{pid}/stat")
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    with WorkerPool(CPU) as pool:
        assert pool.run([Job("good", fixtures.GOOD, 1)])[0].kept
        pids = pool.worker_pids()
        assert pids and not any(exited(pid) for pid in pids)
        pool.retire()
        deadline = time.monotonic() + 120
        while not all(exited(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(exited(pid) for pid in pids)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="Linux only")
def test_the_pool_knows_what_its_workers_enforce():
    with WorkerPool(CPU) as pool:
        pool.wait_ready()
        containment = pool.containment
    assert {"open files", "file size", "address space"} <= set(containment["limits"])
    assert isinstance(containment["pids_cgroup"], bool) and isinstance(containment["namespaces"], list)


def test_a_time_a_worker_reports_is_kept_within_what_the_pool_saw():
    from opsynth.filters.worker_handle import reported_time as reported

    assert reported(5.0, 1.0, 9.0) == 5.0
    assert reported(-1e9, 1.0, 9.0) == 1.0 and reported(1e9, 1.0, 9.0) == 9.0
    assert reported("soon", 1.0, 9.0) == 9.0 and reported(float("nan"), 1.0, 9.0) == 9.0


def test_a_job_decided_before_it_is_handed_out_does_not_run():
    from opsynth.reasons import NOT_NEEDED
    from opsynth.reasons import Verdict as V

    finals = []
    with WorkerPool(CPU) as pool:
        verdicts = pool.run(
            [Job(str(i), fixtures.GOOD if i % 2 == 0 else fixtures.SEGFAULT, i) for i in range(4)],
            on_final=lambda i, v: finals.append((i, v.reason)),
            skip=lambda i: V(NOT_NEEDED, "enough") if i % 2 else None,
        )
        assert [v.reason for v in verdicts] == [KEEP, NOT_NEEDED, KEEP, NOT_NEEDED]
        assert sorted(finals) == [(0, KEEP), (1, NOT_NEEDED), (2, KEEP), (3, NOT_NEEDED)]
        assert pool.replaced == 0, "the segfaulting tasks never ran"


def test_a_run_does_not_wait_for_a_job_that_the_verdicts_since_it_was_handed_out_make_not_needed():
    """Place 1 (a task whose model takes a minute to build) is needed until place 0's verdict comes in: the run
    then decides it without waiting for it, its worker still on it, and the next run takes the other worker."""
    from opsynth.reasons import NOT_NEEDED
    from opsynth.reasons import Verdict as V

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e6), timeout_s=300.0, compile_check=False, workers=2)
    sleeper = Job("sleeper", fixtures.task("return x * 2", "import time\ntime.sleep(60)"), 1)
    finals = []
    with WorkerPool(cfg) as pool:
        pool.wait_ready()
        verdicts = pool.run(
            [Job("fast", fixtures.GOOD, 0), sleeper],
            on_final=lambda i, v: finals.append((i, v.reason)),
            skip=lambda i: V(NOT_NEEDED, "enough") if i == 1 and finals else None,
        )
        assert [v.reason for v in verdicts] == [KEEP, NOT_NEEDED] and finals == [(0, KEEP), (1, NOT_NEEDED)]
        assert pool.handed == 2, "the sleeper was handed out before it was found not needed"
        assert sorted(state != "no_task" for _, state in pool.worker_states()) == [False, True]  # still on it
        assert [v.reason for v in pool.run([Job("next", fixtures.GOOD, 2)])] == [KEEP]
        assert pool.replaced == 0


def test_workers_keep_transformers_notice_about_standalone_attention_from_the_user():
    """Each worker that runs a transformers attention module would print it once: what those tasks are. The
    records are collected by a handler of the test's own, whatever other tests did to the library's logging."""
    import transformers.modeling_utils  # noqa: F401  (its logger, as transformers sets it up)

    from opsynth.filters.worker_setup import quiet_library_notices

    quiet_library_notices()
    logger = logging.getLogger("transformers.modeling_utils")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        logger.warning("You tried to access the `AttentionInterface` with a `config._attn_implementation` set to None")
        logger.warning("another notice")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [record.getMessage() for record in seen] == ["another notice"]


NICENESS = fixtures.task(
    "import os\nif os.getpriority(os.PRIO_PROCESS, 0) not in EXPECTED:\n"
    "    raise RuntimeError(os.getpriority(os.PRIO_PROCESS, 0))\nreturn x * 2"
)


@pytest.mark.skipif(not hasattr(__import__("os"), "getpriority"), reason="POSIX only")
def test_workers_started_ahead_give_their_priority_back_once_up_where_they_may():
    import os

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    # Root may raise a priority again; another user's worker may stay at the lowered one.
    expected = (mine,) if os.geteuid() == 0 else (mine, min(19, mine + 10))
    with WorkerPool(CPU, start_nice=10) as pool:
        (verdict,) = pool.run([Job("nice", NICENESS.replace("EXPECTED", repr(expected)), 1)])
    assert verdict.reason == KEEP, verdict.detail


NO_GPU_SEEN = fixtures.task(
    "import os\nif os.environ.get('CUDA_VISIBLE_DEVICES') != '':\n"
    "    raise RuntimeError(os.environ.get('CUDA_VISIBLE_DEVICES'))\nreturn x * 2"
)


def test_a_cpu_worker_sees_no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what the user's shell may say: a CPU worker hides it
    with WorkerPool(CPU) as pool:
        (verdict,) = pool.run([Job("no-gpu", NO_GPU_SEEN, 1)])
    assert verdict.reason == KEEP, verdict.detail


PRELOADED = fixtures.task(
    "import sys\nif 'xml.dom.minidom' not in sys.modules:\n    raise RuntimeError('not imported')\nreturn x * 2"
)


def test_workers_import_what_they_are_asked_to_preload_before_they_are_up():
    with WorkerPool(CPU, preload=("xml.dom.minidom", "no_such_module_anywhere")) as pool:
        (preloaded,) = pool.run([Job("preloaded", PRELOADED, 1)])
    with WorkerPool(CPU) as pool:
        (plain,) = pool.run([Job("plain", PRELOADED, 1)])
    assert preloaded.reason == KEEP, preloaded.detail
    assert plain.reason != KEEP and "not imported" in plain.detail  # nothing else imported it


SPIN = fixtures.task("while True:\n    pass\nreturn x")


def test_a_task_that_computes_past_its_limit_is_stopped_by_its_cpu_time_and_a_hung_one_by_the_clock():
    from opsynth.reasons import TIMEOUT

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1000.0), timeout_s=1.0, compile_check=False,
                          workers=2)  # fmt: skip
    with WorkerPool(cfg) as pool:
        spin, hang = pool.run([Job("spin", SPIN, 1), Job("hang", fixtures.HANG, 1)])
    assert spin.reason == TIMEOUT and spin.detail.startswith("computed for more than 1 s (CPU time"), spin
    assert (hang.reason, hang.detail) == (TIMEOUT, "no verdict within 1 s")


def test_the_cpu_time_of_a_process_is_read_from_outside_it_and_a_process_found_by_its_parent():
    import subprocess
    import sys

    from opsynth.filters.process_time import cpu_seconds, only_child

    # A parent starts a child and says its pid; the child computes for 0.3 s of its own CPU time, says so, sleeps.
    child = "import time\nwhile time.process_time() < 0.3:\n    pass\nprint('done', flush=True)\ntime.sleep(60)\n"
    parent = (
        f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print(p.pid, flush=True)\np.wait()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(process.stdout.readline())
        assert process.stdout.readline() == "done\n"
        assert 0.25 <= cpu_seconds(pid) < 5.0  # counted in clock ticks
        assert only_child(process.pid) == pid
    finally:
        process.kill()
        process.wait()
    assert cpu_seconds(process.pid) is None  # gone


def test_a_job_started_ahead_runs_once_and_its_verdict_goes_to_the_run_that_asks_for_it():
    """A worker left idle at the end of a run starts a job of the next run, which the next run takes (done or
    still running) instead of running it again; the run that started it does not wait for it."""
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e5), timeout_s=20.0, compile_check=False, workers=2)
    later = [Job(f"later{i}", fixtures.GOOD, 10 + i) for i in range(3)]
    offered = list(later[:2])
    # The other worker is idle while this one runs (seconds of sleep, next to a fast task's milliseconds).
    slow = Job("slow", fixtures.task("import time\ntime.sleep(0.5)\nreturn x * 2"), 1)
    with WorkerPool(cfg) as pool:
        pool.wait_ready()
        first = pool.run([slow, Job("fast", fixtures.GOOD, 2)], ahead=lambda: offered.pop(0) if offered else None)
        assert [v.reason for v in first] == [KEEP, KEEP] and pool.handed >= 3
        second = pool.run(later)
        assert all(v.kept for v in second)
        # each job ran once in all: those started ahead (in the first run or after it) were not run again
        assert not offered and pool.handed == 2 + 3


def test_between_two_runs_the_idle_workers_go_on_starting_jobs_ahead_and_the_next_run_takes_their_verdicts():
    """The caller passes from one run to the next (a round's records, the next round's pipeline) while the
    workers go on: jobs that `ahead` gives only once the run is over start then, and are not run again."""
    import time

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e5), timeout_s=20.0, compile_check=False, workers=2)
    later = [Job(f"later{i}", fixtures.GOOD, 10 + i) for i in range(2)]
    offered, available = list(later), []

    def ahead():
        return offered.pop(0) if offered and available else None

    with WorkerPool(cfg) as pool:
        pool.wait_ready()
        assert [v.reason for v in pool.run([Job("first", fixtures.GOOD, 1)], ahead=ahead)] == [KEEP]
        handed = pool.handed
        available.append(True)  # the next run's jobs are known only now
        deadline = time.monotonic() + 60
        while (offered or any(w.working() for w in pool._workers)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not offered and pool.handed == handed + 2, "both started between the runs"
        second = pool.run(later)
        assert all(v.kept for v in second) and pool.handed == handed + 2, "their verdicts taken, not run again"


def test_task_code_sees_a_scratch_home_but_the_compile_caches_where_the_user_has_them(tmp_path):
    from opsynth.filters.containment import task_environment

    user = {"HOME": "/home/u", "PATH": "/bin", "HF_TOKEN": "x", "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind"}
    env = task_environment(user, str(tmp_path), ["/pkg"])
    assert env["HOME"] == str(tmp_path) and "HF_TOKEN" not in env and env["PYTHONPATH"] == "/pkg"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/ind"
    assert env["TRITON_CACHE_DIR"] == "/home/u/.triton/cache"
    assert env["CUDA_CACHE_PATH"] == "/home/u/.nv/ComputeCache"
    assert env["PYTORCH_KERNEL_CACHE_PATH"] == "/home/u/.cache/torch/kernels"
    xdg = task_environment({**user, "XDG_CACHE_HOME": "/c"}, str(tmp_path), [])
    assert xdg["PYTORCH_KERNEL_CACHE_PATH"] == "/c/torch/kernels" and "XDG_CACHE_HOME" not in xdg


def test_a_closing_pool_kills_its_busy_workers_at_once_and_gives_the_idle_ones_one_grace_together(
    tmp_path, monkeypatch
):
    import subprocess
    import time

    import opsynth.filters.worker_handle as handle

    monkeypatch.setattr(handle, "EXIT_GRACE_S", 0.2)
    events = []

    class Process:  # one that never exits by itself
        def wait(self, timeout):
            events.append(("wait", self.name, timeout))
            time.sleep(timeout)
            raise subprocess.TimeoutExpired("worker", timeout)

    class Conn:
        def send(self, message):
            events.append(("asked", self.name))

    class Worker:
        def __init__(self, name, busy):
            self.busy, self.process, self.conn = busy, Process(), Conn()
            self.process.name = self.conn.name = self.name = name

        def working(self):
            return self.busy

        def send_kill(self):
            events.append(("signal", self.name))

        def kill(self):
            events.append(("killed", self.name))

    workers = [Worker(f"idle{i}", False) for i in range(4)] + [Worker("busy", True)]
    handle.shut_down(workers, str(tmp_path / "root"))
    assert events[0] == ("signal", "busy")  # before anything is waited for
    assert ("asked", "busy") not in events and not any(e[:2] == ("wait", "busy") for e in events)
    assert {e[1] for e in events if e[0] == "asked"} == {f"idle{i}" for i in range(4)}
    assert sum(e[2] for e in events if e[0] == "wait") <= 0.2  # one grace for all four, not 0.2 s each
    assert {e[1] for e in events if e[0] == "killed"} == {w.name for w in workers}


def test_a_worker_s_state_is_read_from_its_watch_and_a_value_it_could_not_write_reads_as_its_task():
    from types import SimpleNamespace

    from opsynth.filters.device_lock import ALONE, CLEARING, HOLD_MODE, PHASE, SHARING, WAIT_MODE, WATCH_FIELDS
    from opsynth.filters.execution import PHASES
    from opsynth.filters.worker_handle import worker_state

    def worker(ready=True, working=True, **fields):
        watch = [0.0] * WATCH_FIELDS
        for field, value in fields.items():
            watch[{"hold": HOLD_MODE, "wait": WAIT_MODE, "phase": PHASE}[field]] = value
        return SimpleNamespace(ready=ready, working=lambda: working, watch=watch)

    compile_code = PHASES.index("compile") + 1
    first_forward = PHASES.index("first_forward") + 1
    assert worker_state(worker(ready=False)) == "starting"
    assert worker_state(worker(working=False)) == "no_task"
    assert worker_state(worker(phase=compile_code)) == "compile"
    assert worker_state(worker(phase=first_forward, hold=SHARING)) == "sharing:first_forward"
    assert worker_state(worker(phase=first_forward, hold=ALONE)) == "alone:first_forward"
    assert worker_state(worker(wait=ALONE, phase=compile_code)) == "waiting_to_time"
    assert worker_state(worker(wait=SHARING)) == "waiting_to_share"
    assert worker_state(worker(wait=CLEARING, phase=compile_code)) == "waiting_for_clearing"
    assert worker_state(worker()) == "task"
    assert worker_state(worker(phase=1e9)) == worker_state(worker(phase=2.5)) == "task"


def test_an_error_between_two_runs_is_raised_by_the_next_run_and_not_by_closing_the_pool():
    import time

    import pytest

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e5), timeout_s=20.0, compile_check=False, workers=1)
    over, asked = [], []

    def ahead():
        if over:
            asked.append(True)
            raise ValueError("the next round's candidates could not be read")
        return None

    with WorkerPool(cfg) as pool:
        pool.wait_ready()
        pool.run([Job("first", fixtures.GOOD, 1)], ahead=ahead)
        over.append(True)
        deadline = time.monotonic() + 60
        while not asked and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ValueError, match="could not be read"):
            pool.run([Job("second", fixtures.GOOD, 2)])
        pool.run([Job("first", fixtures.GOOD, 1)], ahead=ahead)  # the bridge fails again: closing says nothing


# A task that says how many processes its worker has started: fails unless it is EXPECTED.
CHILDREN = fixtures.task(
    "import glob\nchildren = set()\nfor path in glob.glob('/proc/self/task/*/children'):\n"
    "    with open(path) as f:\n        children.update(f.read().split())\n"
    "if len(children) != EXPECTED:\n    raise RuntimeError(f'{len(children)} child processes')\nreturn x * 2"
)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc")
@pytest.mark.parametrize(("compile_check", "children"), [(True, 2), (False, 0)])
def test_a_worker_compiles_in_processes_of_its_own_started_before_its_tasks_and_kept_across_them(
    compile_check, children
):
    import dataclasses

    cfg = dataclasses.replace(CPU, compile_check=compile_check, compile_processes=2)
    task = CHILDREN.replace("EXPECTED", str(children))
    with WorkerPool(cfg) as pool:
        verdicts = pool.run([Job("first", task, 1), Job("second", task, 2)])
    # Neither the pool's processes nor the threads inductor runs beside them read as a task's (tampering).
    assert [v.reason for v in verdicts] == [KEEP, KEEP], [v.detail for v in verdicts]
    assert pool.compiling_in_process == 0, "its compile processes started as asked"


KILLS_A_CHILD = fixtures.task(
    "import glob, os, signal\nfor path in glob.glob('/proc/self/task/*/children'):\n"
    "    with open(path) as f:\n        for pid in f.read().split():\n            os.kill(int(pid), signal.SIGKILL)\n"
    "return x * 2"
)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc")
def test_a_task_that_ends_its_worker_s_compile_processes_is_rejected_and_the_next_task_gets_a_whole_pool():
    import dataclasses

    from opsynth.reasons import TAMPERING

    cfg = dataclasses.replace(CPU, compile_check=True, compile_processes=2)
    with WorkerPool(cfg) as pool:
        killer, after = pool.run([Job("killer", KILLS_A_CHILD, 1), Job("after", CHILDREN.replace("EXPECTED", "2"), 2)])
    assert killer.reason == TAMPERING and "child processes" in killer.detail, killer.detail
    assert after.reason == KEEP, after.detail
