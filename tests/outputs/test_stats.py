import json
import os
from collections import Counter
from pathlib import Path

from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.outputs.stats import gpu_busy, spread


def test_gpu_busy_is_weighted_by_each_sessions_span_of_execution():
    sessions = [
        {"wall_s": 100.0, "gpu": {"executing_s": 30.0, "busy_fraction": [0.9, 0.5], "first_execution_s": 20.0}},
        {"wall_s": 80.0, "gpu": {"executing_s": 10.0, "busy_fraction": [0.5, 0.9], "first_execution_s": 5.5}},
        {"wall_s": 5.0},  # a session that executed nothing
    ]
    busy = gpu_busy(sessions)
    assert busy["per_gpu"] == [0.8, 0.6] and busy["mean"] == 0.7 and busy["executing_s"] == 40.0
    assert busy["before_first_execution_s"] == 25.5
    assert gpu_busy([{"wall_s": 1.0}]) is None
    assert gpu_busy([{"wall_s": 1.0, "gpu": {"unavailable": "no GPU"}}]) == {"unavailable": "no GPU"}


def test_the_hosts_cores_are_read_from_proc_stat_and_weighted_like_the_gpus(tmp_path):
    from opsynth.filters.gpu_busy import host_ticks

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is counted within user already
    stat.write_text("cpu  100 0 50 800 40 5 5 0 30 0\ncpu0 50 0 25 400 20 2 3 0 15 0\n")
    assert host_ticks(str(stat)) == (160, 1000)
    stat.write_text("intr 1 2 3\n")
    assert host_ticks(str(stat)) is None
    assert host_ticks(str(tmp_path / "absent")) is None
    if os.path.exists("/proc/stat"):
        busy, total = host_ticks()
        assert 0 <= busy <= total

    sessions = [
        {"wall_s": 50.0, "gpu": {"executing_s": 30.0, "busy_fraction": [0.9], "host_busy_fraction": 0.8}},
        {"wall_s": 50.0, "gpu": {"executing_s": 10.0, "busy_fraction": [0.5], "host_busy_fraction": 0.4}},
        {"wall_s": 50.0, "gpu": {"executing_s": 10.0, "busy_fraction": [0.5], "host_busy_fraction": None}},
    ]
    assert gpu_busy(sessions)["host_cores"] == 0.7
    assert "host_cores" not in gpu_busy(sessions[2:])  # older code, or a host without /proc/stat


def test_the_monitor_averages_only_the_samples_inside_a_span():
    monitor = GpuBusyMonitor()
    monitor.devices = [0, 1]
    monitor.samples = [(1.0, (0.0, 0.0)), (2.0, (1.0, 0.5)), (3.0, (0.5, 0.5)), (9.0, (0.0, 0.0))]
    assert monitor.busy(1.5, 3.5) == [0.75, 0.5]
    assert monitor.busy(4.0, 5.0) is None
    monitor.host_samples = [(1.0, (0, 0)), (2.0, (10, 100)), (3.0, (70, 200)), (9.0, (70, 300))]
    assert monitor.host_busy(1.5, 3.5) == 0.6  # from the sample at 2.0 to the one at 3.0
    assert monitor.host_busy(2.5, 3.5) is None  # one sample: no span


def test_where_the_workers_were_is_weighted_by_their_gpus_idle_or_busy_share():
    monitor = GpuBusyMonitor(period_s=1.0)
    monitor.devices = [0, 1]
    monitor.samples = [(1.0, (1.0, 0.0)), (2.0, (0.5, 1.0)), (9.0, (0.0, 0.0))]
    monitor.state_samples = [
        (1.0, Counter({(0, "compile"): 3, (1, "waiting_to_time"): 2, (1, "sharing:first_forward"): 1})),
        (2.0, Counter({(0, "compile"): 1, (0, "no_task"): 2, (1, "compile"): 5})),
        (9.0, Counter({(0, "no_task"): 9})),  # outside the span
    ]
    idle = monitor.workers_while(0.5, 3.0)
    # idle: GPU 1 all of the first sample, GPU 0 half of the second: 1.5 s
    assert idle["seconds"] == 1.5
    assert idle["workers"] == {"waiting_to_time": 1.33, "no_task": 0.67, "sharing:first_forward": 0.67, "compile": 0.33}
    busy = monitor.workers_while(0.5, 3.0, busy=True)
    # busy: GPU 0 all of the first sample and half of the second, GPU 1 all of the second: 2.5 s
    assert busy["seconds"] == 2.5
    assert busy["workers"] == {"compile": 3.4, "no_task": 0.4}
    assert monitor.workers_while(3.0, 4.0) is None


def test_the_monitors_series_says_when_each_gpu_idled_and_where_its_workers_were_then(tmp_path):
    from opsynth.pipeline.run import write_gpu_series
    from opsynth.pipeline.sessions import GPU_SERIES_SUFFIX, SessionClock, read_sessions

    monitor = GpuBusyMonitor()
    monitor.devices = [0, 1]
    monitor.samples = [(11.0, (1.0, 0.0)), (11.5, (0.25, 0.5))]
    monitor.state_samples = [(11.0, Counter({(0, "compile"): 3, (1, "waiting_to_time"): 2, (1, "no_task"): 1}))]
    monitor.host_samples = [(11.0, (100, 1000)), (11.5, (175, 1100))]
    session = SessionClock(str(tmp_path), t0=10.0)
    with session:
        write_gpu_series(monitor, session)
    path = session.companion(GPU_SERIES_SUFFIX)
    assert path.endswith(GPU_SERIES_SUFFIX) and path.startswith(session.path.removesuffix(".json"))
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert lines == [
        {"t": 1.0, "busy": [1.0, 0.0], "workers": [{"compile": 3}, {"no_task": 1, "waiting_to_time": 2}]},
        {"t": 1.5, "busy": [0.25, 0.5], "host": 0.75},  # no states sampled with it; the host's since the last
    ]
    assert len(read_sessions(str(tmp_path))) == 1  # the series is not read as a session's record


def test_sessions_where_the_workers_were_add_up_by_their_seconds_of_it():
    span = {"executing_s": 10.0, "busy_fraction": [0.5]}
    sessions = [
        {"wall_s": 20.0, "gpu": {**span, "while_idle": {"seconds": 3.0, "workers": {"compile": 4.0, "no_task": 1.0}}}},
        {"wall_s": 20.0, "gpu": {**span, "while_idle": {"seconds": 1.0, "workers": {"compile": 8.0}}}},
        {"wall_s": 20.0, "gpu": span},  # a session of older code
    ]
    busy = gpu_busy(sessions)
    assert busy["while_idle"]["seconds"] == 4.0 and busy["while_idle"]["workers"] == {"compile": 5.0, "no_task": 0.75}
    assert "while_busy" not in busy


def test_without_a_gpu_the_monitor_says_why_and_samples_nothing():
    with GpuBusyMonitor(period_s=0.01) as monitor:
        pass
    assert monitor.unavailable and monitor.samples == []


def test_a_spread_of_twenty_values_or_more_names_its_5th_and_95th_percentiles():
    assert spread([1.0, 2.0, 3.0]) == "median 2"
    assert "percentile" not in spread([float(v) for v in range(1, 20)])
    text = spread([float(v) for v in range(1, 101)])
    assert text.startswith("median 50.5 (quartiles 25.2 - 75.8; 5th-95th percentile 5.05 - 96; 1 - 100)")


def test_a_gpus_lock_state_is_read_from_where_its_workers_are():
    from opsynth.filters.gpu_busy import lock_state

    assert lock_state({"alone:eager_timing": 1, "waiting_to_time": 2, "compile": 5}) == "timing"
    assert lock_state({"waiting_for_clearing": 1, "waiting_to_time": 1, "compile": 5}) == "clearing"
    assert lock_state({"waiting_to_time": 1, "sharing:eager_checks": 2}) == "draining"
    assert lock_state({"waiting_to_time": 1, "waiting_to_share": 3, "compile": 2}) == "timing_waits"
    assert lock_state({"sharing:first_forward": 1, "sharing:eager_checks": 1, "waiting_to_share": 1}) == "shared_2"
    assert lock_state({"sharing:compiled_first_run": 3}) == "shared_3+"
    assert lock_state({"waiting_to_share": 1, "compile": 3}) == "waiting_to_share"
    assert lock_state({"compile": 3, "no_task": 1}) == "free"


def test_the_monitor_reads_its_gpus_lock_between_samples_and_keeps_each_samples_shares(tmp_path):
    import time

    class Monitor(GpuBusyMonitor):
        def _devices(self):
            return [0, 1]

        def _sample(self):
            return (0.5, 0.25)

    def states():
        return [(0, "alone:eager_timing"), (0, "waiting_to_share"), (1, "compile")]

    with Monitor(period_s=0.05, states=states) as monitor:
        for _ in range(6000):  # polled, not timed: however slow the machine, it samples until stopped
            if len(monitor.lock_samples) >= 3:
                break
            time.sleep(0.05)
    for _, whole, recent in monitor.lock_samples:
        assert whole == recent == [{"timing": 1.0}, {"free": 1.0}]
    record = monitor.series(0.0)[0]
    assert record["lock"] == record["lock_recent"] == [{"timing": 1.0}, {"free": 1.0}]
    if os.path.exists("/proc/stat"):  # the host's cores read with each sample
        assert len(monitor.host_samples) == len(monitor.samples)
    assert monitor.compile_entries and not any(counts for _, counts in monitor.compile_entries)  # none began
    assert record["workers"] == [{"alone:eager_timing": 1, "waiting_to_share": 1}, {"compile": 1}]


def test_the_monitor_counts_the_workers_that_began_to_compile_by_the_state_they_left():
    monitor = GpuBusyMonitor()
    monitor.devices = [0, 1]
    monitor._note_entries([(0, "alone:eager_timing"), (0, "compile"), (1, "waiting_to_share")])  # the first read
    monitor._note_entries([(0, "compile"), (0, "compile"), (1, "compile")])
    monitor._note_entries([(0, "compile"), (0, "load"), (1, "compile")])
    monitor._note_entries([(0, "compile"), (0, "compile"), (1, "compile"), (1, "starting")])  # a worker added
    assert monitor._entries == Counter({(0, "alone:eager_timing"): 1, (1, "waiting_to_share"): 1})
    monitor.samples = [(1.0, (0.5, 0.5)), (1.5, (1.0, 0.0))]
    monitor.compile_entries = [(1.0, monitor._entries), (1.5, Counter())]
    records = monitor.series(0.0)
    assert records[0]["into_compile"] == [{"alone:eager_timing": 1}, {"waiting_to_share": 1}]
    assert "into_compile" not in records[1]  # none began
