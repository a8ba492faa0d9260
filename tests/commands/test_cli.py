"""Careless input: exit 2, one line that says how to fix it, no traceback, nothing written."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.commands.cli import main
from tests import fixtures


def _run(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


GEN = ["generate", "--device", "cpu", "--workload", "tiny"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--num-samples", "0"], "--num-samples"),
        (["--num-samples", "-3"], "--num-samples"),
        (["--num-samples", "abc"], "invalid int"),
        (["--mixture", "torch1=50,torch7=50"], "--mixture"),
        (["--mixture", "torch2=ten"], "--mixture"),
        (["--preset", "ops7k"], "--preset"),
        (["--runtime-window-ms", "100,1"], "--runtime-window-ms"),
        (["--workload", "huge"], "--workload"),
        (["--workers", "0"], "--workers"),
        (["--kernelbench", "/nonexistent/kb.parquet"], "--kernelbench"),
        (["--jaccard-threshold", "1.5"], "--jaccard-threshold"),
        (["--num-sample", "20"], "unknown option --num-sample"),
        (["--seed", "abc"], "invalid int"),
        (["--num-samples", "1e3"], "invalid int"),
        (["--batch-size", "0"], "--batch-size"),
        (["--timeout-s", "-5"], "--timeout-s"),
        (["--runtime-window-ms", "1-100"], "--runtime-window-ms"),
        (["--mixture", "torch2=100%"], "--mixture"),
        (["--dtypes", "float64"], "--dtypes"),
        (["--similarity-threshold", "-0.1"], "--similarity-threshold"),
        (["--runner", "DataflowRunner"], "--workers"),  # a distributed runner needs the per-worker processes
    ],
)
def test_bad_generate_options_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    code, _, stderr = _run(capsys, [*GEN, "--out", str(out), *extra])
    assert code == 2
    assert needle in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert not out.exists()


def test_an_object_store_out_is_refused_with_the_work_dir_hint(capsys):
    code, _, stderr = _run(capsys, [*GEN, "--out", "gs://bucket/ops6k", "--num-samples", "2"])
    assert code == 2 and "--work-dir" in stderr and len(stderr.strip().splitlines()) == 1


def test_missing_out_and_missing_command_are_usage_errors(capsys):
    assert main(["generate", "--num-samples", "5"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main([]) == 2


def test_unwritable_out_is_refused(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    code, _, stderr = _run(capsys, [*GEN, "--out", str(a_file / "run"), "--num-samples", "2"])
    assert code == 2 and "writable" in stderr and len(stderr.strip().splitlines()) == 1


def test_cuda_requested_without_cuda(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, stderr = _run(capsys, ["generate", "--out", str(tmp_path / "o"), "--device", "cuda"])
    assert code == 2 and "--device cpu" in stderr


def test_out_that_is_a_file_or_a_foreign_folder_is_refused(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, _, stderr = _run(capsys, [*GEN, "--out", str(a_file), "--num-samples", "2"])
    assert code == 2 and "is a file" in stderr
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_text("meow")
    code, _, stderr = _run(capsys, [*GEN, "--out", str(foreign), "--num-samples", "2"])
    assert code == 2 and "not empty" in stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["cat.jpg"]


def test_wrong_schema_kernelbench_file_is_refused(tmp_path, capsys):
    bad = tmp_path / "kb.parquet"
    pq.write_table(pa.table({"text": ["hello"]}), bad)
    code, _, stderr = _run(capsys, [*GEN, "--out", str(tmp_path / "o"), "--kernelbench", str(bad)])
    assert code == 2 and "`code`" in stderr


@pytest.mark.parametrize("kind", ["missing", "no_code_column", "empty_folder", "wrong_suffix"])
def test_bad_validate_inputs(tmp_path, capsys, kind):
    path = tmp_path / "input"
    if kind == "no_code_column":
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"ops": ["[]"]}), path)
    elif kind == "empty_folder":
        path.mkdir()
    elif kind == "wrong_suffix":
        path = tmp_path / "t.txt"
        path.write_text("x")
    code, _, stderr = _run(capsys, ["validate", str(path), "--device", "cpu"])
    assert code == 2 and len(stderr.strip().splitlines()) == 1


def test_validate_reports_one_line_per_task_with_the_first_reason(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    cases = {"good.py": fixtures.GOOD, "const.py": fixtures.CONSTANT, "bad_shapes.py": fixtures.SHAPE_MISMATCH,
             "broken.py": fixtures.UNLOADABLE, "random.py": fixtures.STOCHASTIC}  # fmt: skip
    for name, source in cases.items():
        (tasks / name).write_text(source)
    report = tmp_path / "report.jsonl"
    argv = ["validate", str(tasks), "--device", "cpu", "--runtime-window-ms", "0,100", "--timeout-s", "20",
            "--no-compile-check", "--workers", "2", "--report", str(report)]  # fmt: skip
    code, stdout, _ = _run(capsys, argv)
    assert code == 1  # some tasks fail
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    verdicts = {line["task"]: line["verdict"] for line in lines}
    assert verdicts == {
        "bad_shapes.py": "shape_error",
        "broken.py": "load_error",
        "const.py": "indistinguishable_outputs",
        "good.py": "keep",
        "random.py": "not_deterministic",
    }
    good = next(line for line in lines if line["task"] == "good.py")
    assert good["eager_ms"] > 0 and good["kb_nearest"].startswith("level")
    assert "5 tasks: 1 keep" in stdout
    assert _run(capsys, [*argv, "--exit-zero"])[0] == 0  # the old behaviour, asked for
    (tasks / "good.py").rename(tmp_path / "good.py")
    assert _run(capsys, ["validate", str(tmp_path / "good.py"), *argv[2:-2]])[0] == 0  # every task keeps


def test_validate_runs_a_task_out_of_memory_beside_others_again_once_they_are_done(tmp_path, capsys):
    """A task that ran out of memory (here: once, as if others held the memory) keeps its verdict run again
    after the others; one out of memory every time stays so."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    marker = tmp_path / "ran-out-once"
    once = (
        f"import os\nif x.device.type != 'meta' and not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')\nreturn x * 2"
    )
    (tasks / "once.py").write_text(fixtures.task(once))
    always = "if x.device.type != 'meta':\n    raise torch.OutOfMemoryError('CUDA out of memory')\nreturn x * 2"
    (tasks / "always.py").write_text(fixtures.task(always))
    (tasks / "good.py").write_text(fixtures.GOOD)
    report = tmp_path / "report.jsonl"
    argv = ["validate", str(tasks), "--device", "cpu", "--runtime-window-ms", "0,100", "--timeout-s", "20",
            "--no-compile-check", "--workers", "2", "--report", str(report), "--exit-zero"]  # fmt: skip
    code, _, err = _run(capsys, argv)
    assert code == 0, err  # the error line, where it fails
    verdicts = {line["task"]: line["verdict"] for line in map(json.loads, report.read_text().splitlines())}
    assert marker.exists()  # it did run out the first time
    assert verdicts == {"once.py": "keep", "always.py": "out_of_memory", "good.py": "keep"}


def test_validate_re_measures_a_sample_of_a_generated_set(tmp_path, capsys):
    """A dataset folder is an input too: its rows are named by `id`, `--sample` draws some of them, and the
    eager times the set recorded are compared with those measured now."""
    (tmp_path / "set" / "data").mkdir(parents=True)
    rows = {"id": ["torch#1/0", "torch#1/1", "torch#1/2"], "code": [fixtures.GOOD, fixtures.CONSTANT, fixtures.GOOD],
            "eager_ms": [0.5, 0.5, 1e6]}  # fmt: skip
    pq.write_table(pa.table(rows), tmp_path / "set" / "data" / "train-00000-of-00001.parquet")
    report = tmp_path / "report.jsonl"
    argv = ["validate", str(tmp_path / "set"), "--device", "cpu", "--runtime-window-ms", "0,100", "--timeout-s",
            "20", "--no-compile-check", "--workers", "1", "--report", str(report)]  # fmt: skip
    code, stdout, _ = _run(capsys, argv)
    assert code == 1  # the constant task fails
    verdicts = {line["task"]: line["verdict"] for line in map(json.loads, report.read_text().splitlines())}
    assert verdicts == {"torch#1/0": "keep", "torch#1/1": "indistinguishable_outputs", "torch#1/2": "keep"}
    # Timed both ways: the two that keep (the constant one is decided before its timing).
    assert "measured now / recorded, over 2 tasks" in stdout and "2 of the 3 recorded tasks keep" in stdout

    code, stdout, _ = _run(capsys, [*argv, "--sample", "2", "--sample-seed", "1"])
    drawn = [json.loads(line)["task"] for line in report.read_text().splitlines()]
    assert len(drawn) == 2 and drawn == sorted(drawn)  # in the set's order
    code, _, _ = _run(capsys, [*argv, "--sample", "2", "--sample-seed", "1"])
    assert [json.loads(line)["task"] for line in report.read_text().splitlines()] == drawn  # the same draw
    code, _, stderr = _run(capsys, [*argv, "--sample", "0"])
    assert code == 2 and "--sample 0" in stderr


def test_catalog_json_lists_typed_entries(capsys):
    code, stdout, _ = _run(capsys, ["catalog", "--json"])
    entries = json.loads(stdout)["entries"]
    assert code == 0 and len(entries) >= 60
    assert {"name", "kind", "family", "excluded"} <= set(entries[0])
    assert {e["kind"] for e in entries} <= {"torch", "transformers"}


def test_python_dash_m_pipeline_is_the_same_cli():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "opsynth", "catalog", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "opsynth catalog check" in done.stdout


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ({"name": ["1_Conv", "2_Gemm"], "level": [1, 1], "code": [fixtures.GOOD, None]}, "level1/2_Gemm has no code"),
        ({"name": ["3_Relu"], "level": [1], "code": ["import torch\n"]}, "level1/3_Relu defines no `class Model`"),
    ],
)
def test_a_kernelbench_row_without_a_model_is_named_in_one_line(tmp_path, capsys, rows, needle):
    bad = tmp_path / "kb.parquet"
    pq.write_table(pa.table(rows), bad)
    code, _, stderr = _run(capsys, [*GEN, "--out", str(tmp_path / "o"), "--kernelbench", str(bad)])
    assert code == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_validate_names_a_row_without_code_and_refuses_a_code_column_that_is_not_text(tmp_path, capsys):
    tasks = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"code": [fixtures.GOOD, None]}), tasks)
    argv = ["validate", str(tasks), "--device", "cpu", "--runtime-window-ms", "0,100", "--no-compile-check",
            "--workers", "1"]  # fmt: skip
    code, stdout, _ = _run(capsys, argv)
    assert code == 1 and "0: keep" in stdout and "1: load_error  (is empty: there is no code)" in stdout
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"code": [1, 2]}), numbers)
    code, _, stderr = _run(capsys, ["validate", str(numbers), "--device", "cpu"])
    assert code == 2 and "`code` column holds int64, not text" in stderr and len(stderr.strip().splitlines()) == 1


def test_similarity_reports_a_task_nested_too_deeply_to_compare_and_goes_on(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "a_deep.py").write_text(fixtures.HOSTILE["nested_too_deep"][0])
    (tasks / "b_good.py").write_text(fixtures.GOOD)
    # A Gemm, a bias add and a ReLU, spelled as nn.Linear then torch.relu: what KernelBench's level2/76 computes.
    (tasks / "c_gemm_relu.py").write_text(
        fixtures.task("return torch.relu(self.linear(x))", "self.linear = nn.Linear(32, 16)")
    )
    code, stdout, _ = _run(capsys, ["similarity", str(tasks)])
    deep, good, copy = (json.loads(line) for line in stdout.splitlines())
    assert code == 0 and deep == {"task": "a_deep.py", "error": "nested too deeply to be compared with KernelBench"}
    assert (
        good["task"] == "b_good.py" and 0 <= good["kb_ast_similarity"] <= 1 and not good["kernelbench_near_duplicate"]
    )
    assert copy["kernelbench_near_duplicate"] and copy["kb_graph_similarity"] == 1.0
    assert copy["kb_nearest_graph"] == "level2/76_Gemm_Add_ReLU" and copy["kb_graph_shared_operators"] == [
        "add",
        "matmul",
        "relu",
    ]
    assert copy["reason"].startswith("computes what level2/76_Gemm_Add_ReLU does")


def test_the_checks_share_a_gpu_by_default_and_exclusive_checks_turn_that_off():
    from opsynth.commands.cli import build_parser

    parser = build_parser()
    for command in (["generate", "--out", "o"], ["validate", "t.py"], ["bench", "execute"]):
        assert parser.parse_args(command).shared_checks is True
        assert parser.parse_args([*command, "--exclusive-checks"]).shared_checks is False
        assert parser.parse_args([*command, "--shared-checks"]).shared_checks is True  # the old opt-in still runs


def test_debug_adds_the_traceback_and_keeps_the_exit_code(tmp_path, capsys):
    code, _, stderr = _run(capsys, ["generate", "--out", str(tmp_path / "o"), "--num-samples", "0", "--debug"])
    assert code == 2 and "Traceback" in stderr and stderr.strip().splitlines()[-1].startswith("opsynth: error:")


def test_mixture_shares_must_add_up_to_100(tmp_path, capsys):
    argv = ["generate", "--out", str(tmp_path / "o"), "--mixture", "torch1=20,torch2=60"]
    code, _, stderr = _run(capsys, argv)
    assert code == 2 and "add up to 80, not 100" in stderr and not (tmp_path / "o").exists()


def test_version_names_opsynth_its_catalog_torch_and_beam(capsys, tmp_path, monkeypatch):
    import apache_beam

    from opsynth.config import VERSION
    from opsynth.operator_catalog import catalog_version

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def version() -> str:
        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code == 0
        return capsys.readouterr().out

    out = version()
    assert out.startswith(f"opsynth {VERSION} (catalog {catalog_version()}; torch ")
    assert f"apache-beam {apache_beam.__version__}" in out
    # The catalog's hash is kept (it takes importing torch and the catalog); the next --version reads it.
    (cached,) = (tmp_path / "opsynth").glob("catalog-version-*")
    cached.write_text("380-cafecafe")
    assert "(catalog 380-cafecafe; torch " in version()


def test_a_negative_value_is_judged_as_a_value(tmp_path, capsys):
    """`--runtime-window-ms -1,5` is a bad window, not a missing one."""
    code, _, stderr = _run(capsys, [*GEN, "--out", str(tmp_path / "o"), "--runtime-window-ms", "-1,5"])
    assert code == 2 and "need 0 <= LO < HI, got '-1,5'" in stderr and not (tmp_path / "o").exists()
    code, _, stderr = _run(capsys, [*GEN, "--out", str(tmp_path / "o"), "--num-samples", "-3"])
    assert code == 2 and "--num-samples" in stderr and "expected one argument" not in stderr


def _signal_here(signum: int) -> None:
    """`signum` to this thread (not to whichever thread of the process), its handler run before this returns."""
    import signal

    signal.raise_signal(signum)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler to run at


def test_ctrl_c_inside_a_beam_stage_says_how_to_resume_and_prints_no_traceback(monkeypatch, capsys, caplog):
    """Beam logs a KeyboardInterrupt raised in a stage with its traceback and re-raises it as a RuntimeError."""
    import logging
    import signal

    import opsynth.commands.cli

    def a_stage_interrupted(argv):
        try:
            _signal_here(signal.SIGINT)
            raise AssertionError("SIGINT did not interrupt")
        except KeyboardInterrupt as e:
            logging.getLogger("apache_beam.runners.common").error(
                "KeyboardInterrupt [while running 'Stage']", exc_info=e
            )
            raise RuntimeError("KeyboardInterrupt [while running 'Stage']") from e

    monkeypatch.setattr(opsynth.commands.cli, "run", a_stage_interrupted)
    # As in a terminal: a shell starts a background job (the suite run with `&`) with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["generate", "--out", "o"]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert err == "opsynth: interrupted; run the same command again to resume\n"
    assert not caplog.records, "the stage's traceback is not logged"
    assert logging.getLogger().isEnabledFor(logging.ERROR), "logging is back for whatever runs next"


def test_help_and_usage_errors_import_neither_torch_nor_beam():
    """The front door answers before the heavy libraries load: `--help` and a mistyped value."""
    probe = (
        "import sys\n"
        "from opsynth.commands.cli import main\n"
        "assert main(['generate', '--out', 'x', '--num-samples', '0']) == 2\n"
        "assert main(['validate', 'x.py', '--timeout-s', '-1']) == 2\n"
        "try:\n"
        "    main(['generate', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('torch', 'apache_beam', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_beam_workers_log_errors_only_unless_a_level_is_given():
    from opsynth.commands.generate import quiet_workers

    mode = ["--direct_running_mode", "multi_processing"]
    assert quiet_workers(mode) == [*mode, "--default_sdk_harness_log_level=ERROR"]
    assert quiet_workers(["--default_sdk_harness_log_level=DEBUG"]) == ["--default_sdk_harness_log_level=DEBUG"]
    assert quiet_workers(["--default_sdk_harness_log_level", "INFO"]) == ["--default_sdk_harness_log_level", "INFO"]


DATAFLOW = "apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"


@pytest.mark.parametrize(
    "beam_args, remote",
    [([], None), (["--runner", "DataflowRunner"], "DataflowRunner"),
     (["--runner=FlinkRunner", "--job_endpoint", "embed"], "FlinkRunner"), (["--runner", "direct"], None),
     (["--runner", "SparkRunner", "--runner", "DirectRunner"], None), (["--direct_num_workers", "2"], None),
     (["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner"], None),
     (["--runner", "PrismRunner"], None), (["--runner", DATAFLOW], DATAFLOW)],
)  # fmt: skip
def test_the_runner_is_read_as_beam_reads_it_before_beam_is_imported(beam_args, remote):
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    from opsynth.commands.generate import distributed_runner

    assert distributed_runner(beam_args) == remote
    if remote is not None:  # as Beam reads it
        assert PipelineOptions(beam_args).view_as(StandardOptions).runner == remote


def test_the_libraries_say_only_errors_while_a_run_lasts_unless_verbose():
    import logging

    from opsynth.commands.generate import LIBRARY_LOGGERS, quiet_libraries

    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    before = [logger.level for logger in loggers]
    with quiet_libraries(verbose=False):
        assert all(logger.level == logging.ERROR for logger in loggers)
    assert [logger.level for logger in loggers] == before, "given back for whatever runs next in the process"
    with quiet_libraries(verbose=True):
        assert [logger.level for logger in loggers] == before


def test_sigterm_stops_a_command_as_ctrl_c_does_unless_the_caller_handles_it(monkeypatch, capsys):
    """A scheduler's or `timeout`'s stop: the interrupt's message, the shell's 143, SIGTERM's default handler back
    afterwards; a caller's own SIGTERM handler is left in place and runs."""
    import signal

    import opsynth.commands.cli

    def terminated(argv):
        _signal_here(signal.SIGTERM)
        return 0

    monkeypatch.setattr(opsynth.commands.cli, "run", terminated)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    caught = []
    try:
        assert main(["generate", "--out", "o"]) == 143
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert capsys.readouterr().err == "opsynth: interrupted; run the same command again to resume\n"
        signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
        assert main(["generate", "--out", "o"]) == 0
        assert caught == [signal.SIGTERM] and capsys.readouterr().err == ""
    finally:
        signal.signal(signal.SIGTERM, previous)


ENDED_BESIDE_TORCH = """
import atexit, os, shutil, signal, sys, tempfile, threading, time
import torch
from opsynth.commands import cli
from opsynth.errors import OpsynthError

# Ctrl-C's handler, as a terminal's process has it: one started in the background of a shell ignores SIGINT
signal.signal(signal.SIGINT, signal.default_int_handler)
folder = tempfile.mkdtemp()

def ended_beside_torch(argv):
    atexit.register(shutil.rmtree, folder)  # as a run leaves its pipelines' folders to the exit handlers
    def compute():  # as a round's CPU stages on the thread beside the execution
        x = torch.randn(256, 256)
        while True:
            x @ x
    threading.Thread(target=compute, daemon=True).start()
    time.sleep(0.5)
    if how == "interrupted":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    raise OpsynthError("it broke")

cli.run = ended_beside_torch
how = sys.argv[-1]
sys.argv = ["opsynth", "generate", "--out", "o"]
print(folder, flush=True)
cli.entry()
"""


@pytest.mark.parametrize(
    "how, code, last_line",
    [("interrupted", 130, "opsynth: interrupted; run the same command again to resume"),
     ("failed", 1, "opsynth: error: it broke")],
)  # fmt: skip
def test_a_program_ending_with_a_thread_inside_torch_ends_with_its_status_not_an_abort(how, code, last_line):
    """torch's C++ teardown aborts a process that ends with a thread inside it (exit status 134, "terminate called
    without an active exception" after the command's last line): the program runs its exit handlers and ends
    without that teardown, interrupted or failed."""
    import os
    import subprocess
    import sys

    script = [sys.executable, "-c", ENDED_BESIDE_TORCH, how]
    done = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, done.stderr[-500:]
    assert done.stderr.endswith(last_line + "\n")
    assert not os.path.exists(done.stdout.split()[0]), "the exit handlers ran"


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_an_error_is_the_last_line_and_the_logging_level_is_left_as_it_was(monkeypatch, capsys, sigint):
    """Also after an interrupted call in the same process, and where SIGINT is ignored (a suite run in the
    background): that call's interrupt is not this one's."""
    import logging
    import signal

    import opsynth.commands.cli
    from opsynth.commands import catalog
    from opsynth.errors import OpsynthError

    def interrupted(argv):
        _signal_here(signal.SIGINT)
        raise AssertionError("SIGINT did not interrupt")

    def fail(args):
        raise OpsynthError("it broke")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(opsynth.commands.cli, "run", interrupted)
            assert main(["generate", "--out", "o"]) == 130
        capsys.readouterr()
        signal.signal(signal.SIGINT, signal.default_int_handler if sigint == "default" else signal.SIG_IGN)
        monkeypatch.setattr(catalog, "run", fail)
        before = logging.root.manager.disable
        assert main(["catalog"]) == 1
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.strip().splitlines()[-1] == "opsynth: error: it broke"
    assert logging.root.manager.disable == before


def test_a_command_that_starts_workers_compiles_missing_bytecode_first_and_a_plan_does_not(monkeypatch):
    from opsynth import bytecode
    from opsynth.commands.arguments import execution_settings
    from opsynth.commands.cli import build_parser

    started = []
    monkeypatch.setattr(bytecode, "compile_ahead", lambda: started.append(True) or [])
    parser = build_parser()
    execution_settings(parser.parse_args(["generate", "--out", "o", "--plan", "--device", "cpu"]), plan=True)
    assert started == []
    execution_settings(parser.parse_args(["validate", "t.py", "--device", "cpu"]))
    assert started == [True]
