"""Folders that always resume: a second run into a folder is refused, files being written are never read as
state, a damaged or edited checkpoint is named and run again (never trusted), and a round whose records do not
account for its candidates runs again: each resumed run ends with the dataset of an uninterrupted one."""

import json
import os
import shutil
from pathlib import Path

import pytest
from datasets import load_dataset

from pipeline.cli import main
from pipeline.folder_lock import FolderLock

# A window no task can leave, so that timing noise cannot make two runs differ; small batches, many checkpoints.
ARGS = ["--num-samples", "12", "--seed", "5", "--device", "cpu", "--workload", "tiny", "--workers", "2",
        "--no-compile-check", "--runtime-window-ms", "0,10000", "--batch-size", "2"]  # fmt: skip


def _generate(out: Path) -> int:
    return main(["generate", "--out", str(out), *ARGS])


def _rows(out: Path) -> list[tuple[str, str]]:
    ds = load_dataset(str(out), split="train")
    return list(zip(ds["id"], ds["code"], strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "out"
    assert _generate(out) == 0
    return out


def _unfinished_copy(reference: Path, dest: Path) -> Path:
    """The reference run as if killed during round 0's execution: its CPU stages done, its checkpoints written."""
    shutil.copytree(reference, dest)
    for path in [dest / "stats.json", dest / "README.md", *dest.glob("data/*"), *dest.glob("rejected/*")]:
        path.unlink()
    for round_dir in (dest / ".opsynth").glob("round-*"):
        if round_dir.name == "round-00000":
            for name in ("_SUCCESS", "accepted-*", "rejected-execute-*", "stage_work_s.json", "selected.jsonl"):
                for path in round_dir.glob(name):
                    path.unlink()
        else:
            shutil.rmtree(round_dir)
    return dest


def test_damaged_checkpoints_are_named_and_run_again_never_trusted(reference, tmp_path, capsys):
    out = _unfinished_copy(reference, tmp_path / "out")
    state = out / ".opsynth"
    checkpoints = sorted((state / "progress").glob("batch-*.jsonl"))
    assert len(checkpoints) >= 3
    edited, cut = checkpoints[0], checkpoints[1]
    lines = edited.read_text().splitlines()
    record = json.loads(lines[0])
    record["candidate"]["code"] = "# never executed\n" + record["candidate"]["code"]  # still valid JSON
    edited.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    cut.write_text(cut.read_text()[: len(cut.read_text()) // 2])  # cut mid-line
    (state / "progress" / "batch-garbled.jsonl").write_bytes(b"\x00{not json\n")
    # What a full disk leaves: empty files under temporary names, where a `*.json` lookup would find them.
    (state / "progress" / ".tmp-batch-0.jsonl").write_text("")
    (state / "sessions" / ".tmp-20260101T000000-1.json").write_text("")
    (state / "sessions" / "20260101T000000-2.json").write_text('{"wall_s": ')
    capsys.readouterr()

    assert _generate(out) == 0
    err = capsys.readouterr().err
    for path in (edited, cut, state / "progress" / "batch-garbled.jsonl"):
        assert f"checkpoint {path}: " in err and "damaged record(s) ignored; their candidates run again" in err
    assert _rows(out) == _rows(reference)
    assert all("never executed" not in code for _, code in _rows(out))


def test_a_round_whose_records_miss_candidates_runs_again(reference, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    (out / "stats.json").unlink()
    (accepted,) = (out / ".opsynth" / "round-00000").glob("accepted-*.jsonl")
    accepted.write_text("".join(accepted.read_text().splitlines(keepends=True)[1:]))  # a record lost
    capsys.readouterr()

    assert _generate(out) == 0
    assert "round 0: its records do not account for its" in capsys.readouterr().out
    assert _rows(out) == _rows(reference)


def test_a_second_run_into_a_folder_is_refused_naming_the_first(reference, tmp_path, capsys):
    out = _unfinished_copy(reference, tmp_path / "out")
    before = sorted(p.name for p in (out / ".opsynth" / "sessions").iterdir())
    with FolderLock(out / ".opsynth", out):  # as a run in another process holds it
        assert _generate(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"in use by another opsynth run (process {os.getpid()})" in err
    assert sorted(p.name for p in (out / ".opsynth" / "sessions").iterdir()) == before, "it wrote nothing"
    assert _generate(out) == 0  # the first run gone, the folder resumes
    assert _rows(out) == _rows(reference)


def test_a_damaged_config_is_named_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".opsynth").mkdir(parents=True)
    (out / ".opsynth" / "config.json").write_text('{"seed": 5, ')
    assert _generate(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json is damaged" in err


def test_a_damaged_stats_file_is_written_again(reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    (out / "stats.json").write_text("{")
    assert _generate(out) == 0
    assert json.loads((out / "stats.json").read_text())["counts"]["rows"] == 12
    assert _rows(out) == _rows(reference)
