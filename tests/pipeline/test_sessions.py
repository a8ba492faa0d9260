"""Each process's wall time on a run, recorded as it goes, so a process killed outright still counts."""

import json
import time
from pathlib import Path

from opsynth.pipeline.sessions import SessionClock, read_sessions


def test_a_process_records_its_time_as_it_goes_and_when_it_ends(tmp_path):
    with SessionClock(str(tmp_path), tick_s=0.05) as clock:
        (record,) = read_sessions(str(tmp_path))
        assert record["finished"] is False and record["wall_s"] < 1  # written at the start
        time.sleep(0.3)
        assert json.loads(Path(clock.path).read_text())["wall_s"] >= 0.1  # the background tick keeps it current
    (record,) = read_sessions(str(tmp_path))
    assert record["finished"] is True and record["wall_s"] >= 0.3


def test_a_process_that_fails_is_recorded_as_unfinished(tmp_path):
    try:
        with SessionClock(str(tmp_path)):
            raise RuntimeError("a stage failed")
    except RuntimeError:
        pass
    assert [r["finished"] for r in read_sessions(str(tmp_path))] == [False]
    assert read_sessions(str(tmp_path / "elsewhere")) == []
