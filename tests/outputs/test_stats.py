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


def test_the_monitor_averages_only_the_samples_inside_a_span():
    monitor = GpuBusyMonitor()
    monitor.devices = [0, 1]
    monitor.samples = [(1.0, (0.0, 0.0)), (2.0, (1.0, 0.5)), (3.0, (0.5, 0.5)), (9.0, (0.0, 0.0))]
    assert monitor.busy(1.5, 3.5) == [0.75, 0.5]
    assert monitor.busy(4.0, 5.0) is None


def test_without_a_gpu_the_monitor_says_why_and_samples_nothing():
    with GpuBusyMonitor(period_s=0.01) as monitor:
        pass
    assert monitor.unavailable and monitor.samples == []


def test_a_spread_of_twenty_values_or_more_names_its_5th_and_95th_percentiles():
    assert spread([1.0, 2.0, 3.0]) == "median 2"
    assert "percentile" not in spread([float(v) for v in range(1, 20)])
    text = spread([float(v) for v in range(1, 101)])
    assert text.startswith("median 50.5 (quartiles 25.2 - 75.8; 5th-95th percentile 5.05 - 96; 1 - 100)")
