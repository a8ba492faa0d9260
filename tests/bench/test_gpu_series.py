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
    assert lines[3].startswith("  0.5-1.5 s (3 samples): {'compile': 5.0") and len(lines) == 4
    main([path, "--stalls", "2"])
    assert "2.5-2.5 s (1 samples)" in capsys.readouterr().out
