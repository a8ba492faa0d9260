"""The fault suite, bounded: a tiny run starved of disk resumes to the uninterrupted dataset and leaves no process
behind. The whole suite is `opsynth bench faults`; kills and damaged state files are tested in
tests/pipeline/test_resume.py and test_damaged_state.py."""

from pathlib import Path

import pytest

from opsynth.bench.faults import can_mount_tmpfs, disk_trials

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the leftover-process checks read /proc (Linux)")


def _all_hold(trials: list[dict]) -> None:
    for trial in trials:
        assert trial["identical"] and trial.get("leftover_processes", 0) == 0, trial


@pytest.mark.skipif(not can_mount_tmpfs(), reason="no tmpfs can be mounted in a user namespace here (unshare)")
def test_a_full_disk_fails_in_one_line_and_the_run_resumes_to_the_uninterrupted_dataset(tiny_reference, tmp_path):
    (trial,) = disk_trials(1, seed=1, root=tmp_path, reference=tiny_reference)
    _all_hold([trial])
    if trial["first_exit"]:
        assert trial["first_error"].startswith("opsynth: error: no space left on device; free some, then run")
