"""How `opsynth generate`'s pipelines run: the same dataset in this process and on the PortableRunner with an
external worker pool, the worker pools started once per run, the CPU stages on helper processes and beside the
round before's execution. The local runner's multi-processing mode: test_runner_processes.py."""

import json
import os
import re

import pytest
from datasets import load_dataset

from opsynth.commands.cli import main
from tests import fixtures

TINY = fixtures.TINY_RUN


@pytest.fixture
def beam_worker_pool(tmp_path):
    """An external pool of Beam SDK workers, as a portable runner's machines run them: its address. The pool
    starts each worker as `python` from its PATH, so that name leads to this interpreter (where a virtual
    environment is not activated, another Python without Beam would start, fail, and leave the job waiting)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    interpreter = tmp_path / "interpreter"
    interpreter.mkdir()
    launcher = interpreter / "python"  # not a link: a virtual environment's Python finds it by the path it runs as
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    launcher.chmod(0o755)
    env = {**os.environ, "PATH": f"{interpreter}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"]
    pool = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(600):  # up once it listens
            with socket.socket() as s:
                if s.connect_ex(("localhost", port)) == 0:
                    break
            assert pool.poll() is None, "the worker pool exited"
            time.sleep(0.1)
        yield f"localhost:{port}"
    finally:
        pool.kill()
        pool.wait()


def test_same_seed_same_dataset_on_the_portable_runner_and_resume_after_losing_the_outputs(
    tmp_path, capsys, beam_worker_pool, monkeypatch
):
    import opsynth.pipeline.planning
    import opsynth.pipeline.round_pipelines

    # A pilot of 4 candidates: several rounds, the next one's CPU stages made during each execution. A window no
    # task can leave: timing noise at a window's edge may legitimately change a verdict.
    monkeypatch.setattr(opsynth.pipeline.planning, "PILOT_CANDIDATES", 4)
    jobs = []
    one_pipeline = opsynth.pipeline.round_pipelines.run_pipeline
    monkeypatch.setattr(
        opsynth.pipeline.round_pipelines, "run_pipeline", lambda *a: jobs.append(a[0]) or one_pipeline(*a)
    )
    argv = ["--num-samples", "10", "--seed", "11", *TINY, "--no-compile-check", "--runtime-window-ms", "0,10000"]
    assert main(["generate", "--out", str(tmp_path / "a"), *argv]) == 0
    shown = capsys.readouterr()
    assert "round 0:" in shown.err and shown.out.startswith("wrote 10 rows to ")
    rounds = len(json.loads((tmp_path / "a" / "stats.json").read_text())["rounds"])
    assert rounds >= 2 and len(jobs) >= 2 * rounds  # in this process: its CPU stages and its execution apart
    # The portable runner, with its SDK workers in an external pool, rounds and checkpoints in a separate work
    # folder (an object store on a distributed runner); its progress reaches this terminal from the checkpoints.
    portable = ["--runner", "PortableRunner", "--job_endpoint", "embed", "--environment_type", "EXTERNAL",
                "--environment_config", beam_worker_pool]  # fmt: skip
    jobs.clear()
    assert main(["generate", "--out", str(tmp_path / "d"), "--work-dir", str(tmp_path / "work"), *argv, *portable]) == 0
    shown = capsys.readouterr()
    # One job per round on a distributed runner (its execution and the next round's CPU stages), and round 0's
    # CPU stages; no other round is prepared apart (a round planned ahead but not needed may add one job).
    assert "prepared in the round before's job" in shown.err
    assert rounds + 1 <= len(jobs) <= rounds + 2
    assert re.search(r"\n  executed \d+ of at most \d+ candidates, kept \d+ of the \d+ needed", shown.err), shown.err
    assert sorted(p.name for p in (tmp_path / "d" / ".opsynth").iterdir()) == ["config.json", "lock"]
    assert (tmp_path / "work" / "round-00000" / "_SUCCESS").exists()
    ids = [load_dataset(str(tmp_path / d), split="train")["id"] for d in "ad"]
    assert ids[0] == ids[1]  # in-process and portable runs: the same dataset
    capsys.readouterr()  # what loading them printed (datasets' own progress bars)
    # A run killed after its rounds but before its final files resumes from the finished rounds; asked for
    # JSON, it says so in one line on stdout, and nothing else anywhere.
    for name in ("stats.json", "README.md"):
        (tmp_path / "a" / name).unlink()
    assert main(["generate", "--out", str(tmp_path / "a"), *argv, "--json"]) == 0
    shown = capsys.readouterr()
    summary = json.loads(shown.out)
    assert (
        summary["rows"] == 10
        and summary["folder"] == str(tmp_path / "a")
        and sum(summary["rows_per_data_source"].values()) == 10
    )
    assert summary["funnel"]["select"] == 10 and summary["funnel"]["compose"] >= 10 and not shown.err
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert all(r["resumed"] for r in stats["rounds"])
    assert load_dataset(str(tmp_path / "a"), split="train")["id"] == ids[0]


def test_a_large_rounds_cpu_stages_use_several_processes_unless_the_user_chose(monkeypatch):
    import opsynth.pipeline.round_pipelines
    from opsynth.pipeline.round_pipelines import prepare_args

    monkeypatch.setattr(opsynth.pipeline.round_pipelines.os, "cpu_count", lambda: 16)
    assert prepare_args([], 4096) == ["--direct_num_workers", "8", "--direct_running_mode", "multi_processing",
                                       "--default_sdk_harness_log_level", "WARNING"]  # fmt: skip
    assert prepare_args([], 500) == []  # a small round: starting processes costs more than it saves
    chosen = ["--direct_num_workers", "2"]
    assert prepare_args(chosen, 4096) == chosen
    assert prepare_args(["--runner", "DataflowRunner"], 4096) == ["--runner", "DataflowRunner"]
    monkeypatch.setattr(opsynth.pipeline.round_pipelines.os, "cpu_count", lambda: 2)
    assert prepare_args([], 4096) == []


def test_workers_start_early_only_where_the_pipelines_run_in_this_process():
    from opsynth.pipeline.engines import runs_in_this_process

    assert runs_in_this_process([])
    assert runs_in_this_process(["--direct_running_mode", "multi_threading", "--direct_num_workers", "2"])
    assert not runs_in_this_process(["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    assert not runs_in_this_process(["--runner", "DataflowRunner"])


@pytest.mark.parametrize("args", [[], ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]])
def test_beams_local_runner_runs_a_pipeline_itself_never_handing_it_to_a_downloaded_engine(monkeypatch, args):
    """Left to itself, Beam's local runner gives a pipeline to Prism, a binary it downloads: where the network
    allows it a run would take another engine, and where it does not, each round waits for the download to fail
    (and leaves a folder behind). Other runners are Beam's to make."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability import prism_runner

    from opsynth.pipeline.engines import local_engine
    from opsynth.pipeline.round_pipelines import run_pipeline

    tried = []

    def prism(self, *_):
        tried.append(self)
        raise RuntimeError("no Prism here")  # Beam would fall back to its in-process engine

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", prism)
    assert run_pipeline(args, lambda p: p | beam.Create(range(5)) | beam.Map(abs)) is not None
    assert tried == []
    assert local_engine(PipelineOptions(["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner"]))
    assert local_engine(PipelineOptions(["--runner", "PortableRunner"])) is None


def test_a_run_in_this_process_starts_its_two_pools_once(pools_made, tmp_path, capsys):
    """The execution's workers and the shape check's, each started once for all the rounds' pipelines (Beam's
    Shared alone would keep only the last one acquired alive, and the other would start again each pipeline)."""
    made = pools_made
    argv = ["generate", "--out", str(tmp_path / "o"), "--num-samples", "6", "--seed", "4", *TINY, "--no-compile-check",
            "--runtime-window-ms", "0,10000"]  # fmt: skip
    assert main(argv) == 0
    assert sorted(pool.cfg.device for pool in made) == ["cpu", "cpu"] and len({pool.cfg for pool in made}) == 2
    assert not any(pool._finalizer.alive for pool in made)
    # Round 1, prepared beside round 0 with the same pools, is not needed (no task leaves this window): said so.
    err = capsys.readouterr().err
    assert "round 1: 25 candidates, prepared beside the round before" in err
    assert "round 1: not run, every data source has its rows" in err and "round 1: 25 candidates (" not in err


def test_both_pools_import_what_the_run_preloads_as_their_workers_start(pools_made):
    from opsynth.filters.execution import ExecutionConfig
    from opsynth.pipeline.run import run_pools

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 20.0), timeout_s=10.0, compile_check=False, workers=1)
    with run_pools(cfg, True, ("json",)) as workers:
        assert workers.execution_pool.preload == workers.shape_pool.preload == ("json",)
        assert workers.execution_pool.start_nice > 0 == workers.shape_pool.start_nice  # the execution's start yields
    assert len(pools_made) == 2


def test_a_round_is_one_batch_where_the_pipelines_run_in_this_process():
    from opsynth.commands.generate import default_batch_size
    from opsynth.config import MAX_ROUND_CANDIDATES

    assert default_batch_size(14, []) > MAX_ROUND_CANDIDATES + 100  # a round's plan may pass the cap a little
    assert default_batch_size(14, ["--direct_running_mode", "multi_processing"]) == 64 * 14
    assert default_batch_size(2, ["--runner", "DataflowRunner"]) == 128


def test_cpu_stages_fall_back_to_this_process_when_several_processes_fail(monkeypatch, tmp_path, capsys):
    import opsynth.pipeline.round_pipelines

    monkeypatch.setattr(
        opsynth.pipeline.round_pipelines, "prepare_args", lambda args, n: [*args, "--runner", "NoSuchRunner"]
    )
    argv = ["generate", "--out", str(tmp_path / "o"), "--num-samples", "4", "--seed", "2", *TINY, "--no-compile-check"]
    assert main(argv) == 0
    assert "the CPU stages on several processes failed" in capsys.readouterr().err
    assert len(load_dataset(str(tmp_path / "o"), split="train")) == 4


def test_the_next_rounds_cpu_stages_run_beside_this_ones_execution_and_make_the_same_dataset(
    tmp_path, monkeypatch, capsys
):
    """A pilot of 4 candidates for 12 rows: round 1 is planned and prepared while round 0 executes. A run that
    prepares it only once round 0 is done (as a resumed one may) makes the same dataset."""
    import opsynth.pipeline.planning
    import opsynth.pipeline.round_pipelines

    monkeypatch.setattr(opsynth.pipeline.planning, "PILOT_CANDIDATES", 4)
    argv = ["--num-samples", "12", "--mixture", "torch2=100", "--seed", "5", *TINY, "--no-compile-check",
            "--runtime-window-ms", "0,10000"]  # fmt: skip
    assert main(["generate", "--out", str(tmp_path / "beside"), *argv]) == 0
    err = capsys.readouterr().err
    assert "round 1: 47 candidates, prepared beside the round before" in err
    assert "resuming" not in err  # a round prepared beside in this session is not one resumed
    monkeypatch.setattr(opsynth.pipeline.round_pipelines.Beside, "start", lambda self, prepare, log: None)
    assert main(["generate", "--out", str(tmp_path / "after"), *argv]) == 0
    assert "prepared beside" not in capsys.readouterr().err
    beside, after = (load_dataset(str(tmp_path / d), split="train")["id"] for d in ("beside", "after"))
    assert beside == after and len(beside) == 12
    plans = [
        json.loads((tmp_path / "beside" / ".opsynth" / f"round-{r:05d}" / "plan.json").read_text()) for r in (0, 1)
    ]
    assert plans == [{"torch#2": 4}, {"torch#2": 47}]


_EXIT_MID_PIPELINE = """
import os, sys, threading, time
import apache_beam as beam
from opsynth.pipeline.round_pipelines import run_pipeline

def wait(x):
    open(os.path.join(sys.argv[1], "started"), "w").close()
    time.sleep(600)
    return x

threading.Thread(target=run_pipeline, args=([], lambda p: p | beam.Create([1]) | beam.Map(wait)), daemon=True).start()
while not os.path.exists(os.path.join(sys.argv[1], "started")):
    time.sleep(0.05)
sys.exit(0)  # as a run stopped by a signal exits, its next round's CPU stages still running beside
"""


def test_no_pipeline_folder_is_left_by_a_build_that_fails_or_a_process_that_exits_mid_pipeline(tmp_path):
    """Beam removes a pipeline's local folder when `run` returns; the run removes it also where building fails
    and where it exits with a pipeline still running on a thread."""
    import subprocess
    import sys

    temp, marks = tmp_path / "temp", tmp_path / "marks"
    temp.mkdir(), marks.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    done = subprocess.run([sys.executable, "-c", _EXIT_MID_PIPELINE, str(marks)], env=env, timeout=300)
    assert done.returncode == 0 and (marks / "started").exists()
    assert not [p for p in temp.iterdir() if p.name.startswith("beam-pipeline-temp")]

    failing = (
        "import sys\nfrom opsynth.pipeline.round_pipelines import run_pipeline\n"
        "def build(p): raise ValueError('no')\n"
        "try:\n    run_pipeline([], build)\nexcept ValueError:\n    pass\n"
        "import os, tempfile; print(sorted(os.listdir(tempfile.gettempdir())))\n"
    )
    listed = subprocess.run([sys.executable, "-c", failing], env=env, capture_output=True, text=True, timeout=300)
    assert "beam-pipeline-temp" not in listed.stdout and listed.returncode == 0, listed.stderr
