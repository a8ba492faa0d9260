"""The fault suite, bounded (the whole of it is `opsynth bench faults`, kills at random moments included; a kill is
tested in tests/pipeline/test_resume.py): a tiny run starved of disk, or with a state file damaged at random,
resumes to the uninterrupted dataset and leaves no process behind."""

from pathlib import Path

import pytest

from bench.faults import can_mount_tmpfs, disk_trials, state_trials

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the leftover-process checks read /proc (Linux)")


def _all_hold(trials: list[dict]) -> None:
    for trial in trials:
        assert trial["identical"] and trial.get("leftover_processes", 0) == 0, trial


def test_a_state_file_damaged_at_random_resumes_to_the_uninterrupted_dataset(tiny_reference, tmp_path):
    _all_hold(state_trials(2, seed=1, root=tmp_path, reference=tiny_reference[0]))


@pytest.mark.skipif(not can_mount_tmpfs(), reason="no tmpfs can be mounted in a user namespace here (unshare)")
def test_a_full_disk_fails_in_one_line_and_the_run_resumes_to_the_uninterrupted_dataset(tiny_reference, tmp_path):
    (trial,) = disk_trials(1, seed=1, root=tmp_path, reference=tiny_reference[0])
    _all_hold([trial])
    if trial["first_exit"]:
        assert trial["first_error"].startswith("opsynth: error: no space left on device; free some, then run")
