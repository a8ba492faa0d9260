from collections import Counter
from pathlib import Path

from opsynth.bench.gpu_series import main, read_series, report, stretches
from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.pipeline.run import write_gpu_series
from opsynth.pipeline.sessions import GPU_SERIES_SUFFIX, SessionClock


def test_a_runs_series_tells_its_idle_stretches_and_who_held_the_gpu_then(tmp_path, capsys):
    monitor = GpuBusyMonitor()
    monitor.devices = [0]
    busy = [0.9, 0.0, 0.05, 0.0, 1.0, 0.0, 0.95]
    monitor.samples = [(10.0 + i / 2, (b,)) for i, b in enumerate(busy)]
    stall = Counter({(0, "waiting_to_time"): 2, (0, "sharing:first_forward"): 1, (0, "compile"): 5})
    work = Counter({(0, "alone:eager_timing"): 1, (0, "compile"): 7})
    monitor.state_samples = [(t, stall if b < 0.1 else work) for t, (b,) in monitor.samples]
    session = SessionClock(str(tmp_path), t0=10.0)
    with session:
        write_gpu_series(monitor, session)
    path = session.companion(GPU_SERIES_SUFFIX)
    samples = read_series(Path(path))
    runs = stretches(samples, 0, 0.1)
    assert [[s["t"] for s in run] for run in runs] == [[0.5, 1.0, 1.5], [2.5]]  # longest first
    lines = report(samples, 0.1, 1)
    assert lines[0] == "GPU 0: 7 samples, mean busy 0.414"
    stalled = "{'compile': 5.0, 'waiting_to_time': 2.0, 'sharing:first_forward': 1.0}"
    assert lines[1] == f"  under 0.1 busy (4 samples): {stalled}"
    assert lines[2] == "  over 0.9 busy (2 samples): {'compile': 7.0, 'alone:eager_timing': 1.0}"
    assert lines[3].startswith("  idle seconds by cause: {'timings wait for a first forward': 1.98")
    assert lines[4].startswith("  workers compiling at a sample: mean 5.86, variance 0.98")
    assert lines[5].startswith("  0.5-1.5 s (3 samples): {'compile': 5.0") and len(lines) == 6
    main([path, "--stalls", "2"])
    assert "2.5-2.5 s (1 samples)" in capsys.readouterr().out


def test_the_idle_seconds_of_a_runs_execution_are_put_down_to_where_its_workers_were():
    from opsynth.bench.gpu_series import idle_causes

    def sample(t, busy, **states):
        return {"t": t, "busy": [busy], "workers": [states]}

    samples = [
        sample(0.0, 0.0, starting=4),  # before the first execution: not counted
        sample(0.5, 1.0, **{"sharing:eager_checks": 1, "compile": 3}),
        sample(1.0, 0.0, **{"sharing:first_forward": 1, "sharing:eager_checks": 1, "waiting_to_time": 2}),
        sample(1.5, 0.5, **{"sharing:compiled_first_run": 1, "waiting_to_time": 1, "compile": 2}),
        sample(2.0, 0.0, waiting_to_time=1, release=1, compile=2),
        sample(2.5, 0.0, compile=3, task=1),
        sample(3.0, 0.0, no_task=2, handing_back=1, compile=1),
        sample(3.5, 0.8, **{"alone:eager_timing": 1, "compile": 2}),
        sample(4.0, 0.0, no_task=3, compile=1),  # after the last execution: not counted
    ]
    assert idle_causes(samples, 0) == {
        "timings wait for a first forward": 0.5,
        "timings wait, no task sharing": 0.5,
        "most workers compiling": 0.5,
        "between rounds or at the end": 0.5,
        "timings wait for other steps": 0.25,
        "other": 0.1,
    }


def test_the_gpus_busy_share_in_each_state_of_its_lock_is_fitted_over_the_samples():
    from opsynth.bench.gpu_series import lock_activity

    truth = {"timing": 0.75, "draining": 0.25, "shared_2": 1.0, "free": 0.0}
    mixes = [
        {"timing": 0.5, "shared_2": 0.5},
        {"draining": 0.2, "shared_2": 0.8},
        {"timing": 1.0},
        {"free": 0.4, "draining": 0.6},
        {"shared_2": 0.3, "free": 0.1, "timing": 0.6},
    ]
    samples = [{"t": 0.0, "busy": [0.0], "workers": [{"sharing:load": 1}]}]
    for k, mix in enumerate(mixes, start=1):
        busy = sum(truth[state] * share for state, share in mix.items())
        samples.append({"t": k / 2, "busy": [busy], "workers": [{"alone:eager_timing": 1}], "lock": [mix]})
    fit = lock_activity(samples, 0)
    assert fit["samples"] == 5 and fit["rms"] < 1e-6
    assert list(fit["states"]) == ["timing", "draining", "shared_2", "free"]  # LOCK_STATES' order
    assert {state: v["busy"] for state, v in fit["states"].items()} == truth
    assert fit["states"]["timing"]["seconds"] == 1.1 and fit["states"]["timing"]["idle_s"] == 0.3
    assert lock_activity(samples, 0, "lock_recent") is None
    assert any(line.startswith("  lock states (whole period of 5 samples") for line in report(samples, 0.1, 0))


def test_the_hosts_cores_are_told_beside_the_gpus_idle_and_busy_samples():
    samples = [
        {"t": 0.5, "busy": [0.0], "host": 0.9},
        {"t": 1.0, "busy": [0.0], "host": 0.7},
        {"t": 1.5, "busy": [1.0], "host": 0.5},
        {"t": 2.0, "busy": [0.5]},  # its host not read
    ]
    for sample in samples:
        sample["workers"] = [{"compile": 3, "alone:eager_timing": 1}]
    line = [line for line in report(samples, 0.1, 0) if "host cores" in line]
    assert line == ["  host cores busy: 0.70 (3) over all samples, 0.80 (2) over those under 0.1 busy, 0.50 (1) over "
                    "those over 0.9"]  # fmt: skip
    assert not any("host cores" in line for line in report([{"t": 0.5, "busy": [0.0]}], 0.1, 0))


def test_workers_compiling_together_read_as_more_variance_than_independent_ones():
    from opsynth.bench.gpu_series import compile_bunching

    def sample(t, compiling):  # 4 workers and one timing: those not compiling wait to share the GPU
        return {"t": t, "busy": [0.5], "workers": [{"compile": compiling, "waiting_to_share": 4 - compiling,
                                                    "alone:eager_timing": 1}]}  # fmt: skip

    together = [sample(t / 2, 4 if t % 2 else 0) for t in range(8)]  # four or none of five: 2 / 5 of them on average
    assert compile_bunching(together, 0) == {"mean": 2.0, "variance": 4.0, "ratio": 3.33}  # against 5 * 0.4 * 0.6
    steady = [sample(t / 2, 2) for t in range(8)]
    assert compile_bunching(steady, 0) == {"mean": 2.0, "variance": 0.0, "ratio": 0.0}
    assert compile_bunching(steady[:1], 0) is None
    lines = report(together, 0.1, 0)
    assert "  workers compiling at a sample: mean 2.0, variance 4.0, 3.33 times that of independent workers" in lines


def test_compiles_begun_together_read_as_more_variance_than_their_mean():
    from opsynth.bench.gpu_series import compile_entries

    def sample(t, began):
        return {"t": t, "busy": [0.5], "workers": [{"compile": 2, "alone:eager_timing": 1}],
                "into_compile": [{"alone:eager_timing": began, "sharing:compiled_first_run": 1}]}  # fmt: skip

    samples = [sample(t / 2, 5 if t % 4 == 0 else 0) for t in range(8)]  # 1 every sample, 5 more every fourth
    entries = compile_entries(samples, 0)
    assert entries["entries"] == 18
    assert entries["from"] == {"alone:eager_timing": 0.56, "sharing:compiled_first_run": 0.44}
    assert entries["dispersion"] == 2.08  # variance 4.6875 over a mean of 2.25
    assert compile_entries([{k: v for k, v in s.items() if k != "into_compile"} for s in samples], 0) is None
    lines = report(samples, 0.1, 0)
    assert any(line.startswith("  compiles begun: 18, per sample variance / mean 2.08") for line in lines)
